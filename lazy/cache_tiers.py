"""Where serialized executables persist beyond one process: the tiers under the in-memory cache.

A tier is a flat namespace of files: a local directory (:class:`DirectoryTier`) or anything else
that can read, write and list names by prefix — the service puts one in its model store, so
every replica and restart shares what one compiled. Loading an executable runs code: a tier must
be a location only trusted processes write. Each entry is self-describing and verified before
use (:func:`decode`):

- its name is ``<entry>-<backend>.xc``: ``entry`` hashes the key without the backend
  fingerprint, so the executables of one graph and bucket for other backends (another jaxlib,
  device or XLA flags) or another seal sit beside it, and a miss can say which parts of the
  fingerprint differ;
- its header is the full key, checked on read (a file copied over another is refused);
- a sha256 of header and payload, or, where the operator sets a signing key, an HMAC-SHA256 of
  them: an entry written without the key (or with another) is then refused.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .cache import CacheKey

MAGIC = b"kestrel-lazy-executable/2\n"
SUFFIX = ".xc"


class EntryError(ValueError):
    """A stored entry that must not be used; the message says why."""


class ExecutableTier(Protocol):
    """A persistent namespace of executable files; ``name`` labels its metrics and logs.

    A read-only tier (``writable`` false) serves what others wrote and never writes."""

    name: str
    writable: bool

    def read(self, filename: str) -> bytes | None:
        """The file's bytes, or None when there is no such file."""
        ...

    def write(self, filename: str, data: bytes) -> None:
        """Replace the file whole (a reader never sees part of it)."""
        ...

    def names(self, prefix: str) -> Sequence[str]:
        """The file names that start with ``prefix``."""
        ...


def entry_prefix(key: CacheKey) -> str:
    """The part of a file name shared by one key's executables for every backend."""
    return hashlib.sha256(json.dumps(list(key[:-1])).encode()).hexdigest() + "-"


def seal_id(signing_key: bytes | None) -> str:
    """Names how entries are sealed without revealing the key: processes sealing differently
    (during a key rotation, say) then write side by side instead of over each other."""
    if signing_key is None:
        return "sha256"
    return "hmac-" + hmac.new(signing_key, b"kestrel executable seal", "sha256").hexdigest()[:16]


def filename(key: CacheKey, seal: str = "sha256") -> str:
    """``key``'s file for processes sealing as ``seal`` (:func:`seal_id`)."""
    backend = hashlib.sha256(f"{key.backend}|{seal}".encode()).hexdigest()[:16]
    return entry_prefix(key) + backend + SUFFIX


def encode(key: CacheKey, payload: bytes, signing_key: bytes | None) -> bytes:
    header = json.dumps(list(key)).encode()
    return b"".join([MAGIC, header, b"\n", _seal(header, payload, signing_key), b"\n", payload])


def decode(key: CacheKey, data: bytes, signing_key: bytes | None) -> bytes:
    """The payload of an entry stored for ``key``; :class:`EntryError` when it must not be used."""
    header, seal, payload = _split(data)
    if header != json.dumps(list(key)).encode():
        raise EntryError("it holds another key")
    scheme = seal.split(b"=", 1)[0]
    if signing_key is not None and scheme != b"hmac-sha256":
        raise EntryError("it is not signed, and this process requires a signature")
    if signing_key is None and scheme != b"sha256":
        raise EntryError("it is signed, and this process has no signing key to check it")
    if not hmac.compare_digest(seal, _seal(header, payload, signing_key)):
        raise EntryError(
            "its signature does not match" if signing_key else "its checksum does not match"
        )
    return payload


def stored_backend(data: bytes) -> tuple[str, str]:
    """The backend fingerprint an entry was compiled for (its header's last field), and how it
    is sealed (``sha256`` or ``hmac-sha256``)."""
    header, seal, _ = _split(data)
    return str(json.loads(header)[-1]), seal.split(b"=", 1)[0].decode()


def fingerprint_difference(theirs: str, ours: str) -> str:
    """The fingerprint parts (``name=value;...``) in which two backends differ, for a log line."""
    mine = dict(_parts(ours))
    other = dict(_parts(theirs))
    changed = [
        f"{name} {other.get(name, '(unset)')} (here {mine.get(name, '(unset)')})"
        for name in sorted(set(mine) | set(other))
        if mine.get(name) != other.get(name)
    ]
    return "; ".join(changed) or "no part differs"


class DirectoryTier:
    """Executables as files in a local directory the operator trusts (atomic replace)."""

    writable = True

    def __init__(self, directory: str | os.PathLike[str], name: str = "disk") -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.name = name

    def __repr__(self) -> str:
        return f"DirectoryTier({str(self.directory)!r})"

    def read(self, filename: str) -> bytes | None:
        try:
            return (self.directory / filename).read_bytes()
        except FileNotFoundError:
            return None

    def write(self, filename: str, data: bytes) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".tmp-", suffix=SUFFIX)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.directory / filename)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def names(self, prefix: str) -> list[str]:
        return sorted(p.name for p in self.directory.glob(f"{prefix}*{SUFFIX}"))


def _seal(header: bytes, payload: bytes, signing_key: bytes | None) -> bytes:
    digest = hashlib.sha256() if signing_key is None else hmac.new(signing_key, None, "sha256")
    for part in (header, b"\n", payload):  # no copy of a payload of megabytes
        digest.update(part)
    scheme = b"sha256=" if signing_key is None else b"hmac-sha256="
    return scheme + digest.hexdigest().encode()


def _split(data: bytes) -> tuple[bytes, bytes, bytes]:
    if not data.startswith(MAGIC):
        raise EntryError("it is not a cached executable of this format")
    parts = data[len(MAGIC) :].split(b"\n", 2)
    if len(parts) != 3:
        raise EntryError("it is truncated")
    return parts[0], parts[1], parts[2]


def _parts(fingerprint: str) -> list[tuple[str, str]]:
    out = []
    for part in fingerprint.split(";"):
        name, _, value = part.partition("=")
        out.append((name, value))
    return out
