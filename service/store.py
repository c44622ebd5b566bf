"""Durable storage of model artifacts and the manifest that names them, over fsspec.

Layout under the store's root URL (a local directory or any fsspec URL such as ``s3://b/p``)::

    blobs/sha256/<aa>/<digest>   content-addressed bytes (artifacts, samples)
    executables/<entry>.xc       compiled executables shared by replicas (service.shared_cache)
    manifest.json                models → versions → VersionRecord, current version, generation
    manifest.prev.json           the manifest before the last write, for recovery

Blobs are immutable and named by their sha256, so writing one twice is a no-op and a reader can
always verify what it got. The manifest is the only mutable object; it is replaced whole and
atomically (local: temp file + fsync + ``os.replace``; object stores: one PUT, atomic per object).
Every write bumps ``generation`` so replicas can poll for change cheaply.

Concurrency: mutations within one process are serialized by a process-wide lock, and across the
worker processes of one ``kestrel serve`` by the lock they share (``writers_lock``). Writers on
different replicas are *last-writer-wins* on the manifest (object stores have no portable
compare-and-swap); run one writer, or accept that concurrent uploads on two replicas may lose one
manifest entry (never a blob, never a corrupt manifest). ``generation`` lets readers detect change.

This module knows nothing about HTTP, settings or compilation.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import logging
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import fsspec.core
from fsspec import AbstractFileSystem
from fsspec.implementations.local import LocalFileSystem

from service.shadow_rule import InvalidRule, Shadow, ShadowRule

__all__ = [
    "BlobNotFound",
    "CurrentChange",
    "InvalidDigest",
    "InvalidName",
    "InvalidRecord",
    "Manifest",
    "ModelEntry",
    "ModelNotFound",
    "ModelStore",
    "NoPreviousVersion",
    "StoreCorruptionError",
    "StoreError",
    "VersionConflict",
    "VersionRecord",
    "check_share",
    "check_weights",
    "validate_alias",
    "validate_digest",
    "validate_name",
]

logger = logging.getLogger(__name__)

MANIFEST_FILE = "manifest.json"
PREV_MANIFEST_FILE = "manifest.prev.json"
MANIFEST_KIND = "kestrel-manifest"
MANIFEST_SCHEMA = 1
_BLOB_DIR = "blobs/sha256"
_EXECUTABLE_DIR = "executables"  # written only by servers: loading one runs its code
_EXECUTABLE_RE = re.compile(r"(?P<prefix>[0-9a-f]{64}-)[0-9a-f]{16}\.xc")
_CAPTURE_DIR = "capture"  # captured requests and answers (service.capture), apart from blobs
# Temp files live beside their target (same filesystem, so os.replace is atomic); the prefix lets
# loaders ignore them and gc remove the ones a crash left behind.
_TMP_PREFIX = ".tmp-"

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_DIGEST_RE = re.compile(r"[0-9a-f]{64}")

# One lock for every store in the process: mutations are rare, and two ModelStore objects on the
# same URL must not interleave their read-modify-write of the manifest.
_MUTATION_LOCK = threading.Lock()


# --------------------------------------------------------------------------- errors


class StoreError(Exception):
    """Base class of every model-store error."""


class StoreCorruptionError(StoreError):
    """Stored bytes are not what they claim to be (blob hash mismatch, unreadable manifest)."""


class BlobNotFound(StoreError, LookupError):
    """No blob with the requested digest exists in the store."""


class ModelNotFound(StoreError, LookupError):
    """The manifest has no model (or no version of it) with the requested name."""


class VersionConflict(StoreError):
    """A version with that name already exists: versions are immutable once committed."""


class InvalidName(StoreError, ValueError):
    """A model name or version does not match ``[A-Za-z0-9][A-Za-z0-9._-]{0,127}``."""


class InvalidDigest(StoreError, ValueError):
    """A blob digest is not 64 lowercase hexadecimal characters."""


class InvalidRecord(StoreError, ValueError):
    """A version record has a field of the wrong type or a value JSON can not hold."""


class NoPreviousVersion(StoreError):
    """A rollback has no earlier current version to go back to."""


def validate_name(value: object, what: str = "model name") -> str:
    """Return ``value`` if it is a safe model name / version, else raise :class:`InvalidName`.

    The pattern keeps names usable as path segments, URL segments and metric labels.
    """
    if not isinstance(value, str) or not _NAME_RE.fullmatch(value):
        raise InvalidName(
            f"invalid {what} {value!r}: expected 1-128 characters from [A-Za-z0-9._-], "
            "starting with a letter or digit"
        )
    return value


def validate_alias(value: object) -> str:
    """Return ``value`` if it can name a version: a safe name that is not a number (numbers are
    the versions' own names), else raise :class:`InvalidName`."""
    alias = validate_name(value, "alias")
    if alias.isdecimal():
        raise InvalidName(f"invalid alias {alias!r}: numbers name versions; use a word")
    return alias


def validate_digest(value: object) -> str:
    """Return ``value`` if it is a sha256 hex digest, else raise :class:`InvalidDigest`.

    Digests become path segments, so anything else (``..``, ``/``, upper case) is refused.
    """
    if not isinstance(value, str) or not _DIGEST_RE.fullmatch(value):
        raise InvalidDigest(
            f"invalid blob digest {value!r}: expected 64 lowercase hexadecimal characters"
        )
    return value


# --------------------------------------------------------------------------- records


def _json_copy(value: object, what: str) -> Any:
    """A deep, JSON-normalized copy (tuples become lists), so records round-trip exactly and
    a caller mutating its dict afterwards can not change a record."""
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise InvalidRecord(f"{what} must be JSON-serializable: {exc}") from None


@dataclass(frozen=True)
class VersionRecord:
    """One stored version of a model: which blobs hold it and how to load it.

    ``options`` (compile options) and ``metadata`` (framework versions, parity, report summary)
    are opaque to the store but must be JSON-serializable; they are copied on construction.
    ``plan`` is the execution plan the registering server decided (``lazy.ExecutionPlan``, as a
    dict; also opaque here): every replica and restart that loads the version follows it.
    """

    name: str
    version: str
    artifact: str  # sha256 of the uploaded model file
    format: str  # e.g. "skops", "lightgbm", "xgboost-json", "xgboost-ubj", "pickle"
    filename: str
    options: dict[str, Any] = field(default_factory=dict)
    sample: str | None = None  # sha256 of a stored sample blob
    created: float = field(default_factory=time.time)
    metadata: dict[str, Any] = field(default_factory=dict)
    plan: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        validate_name(self.name, "model name")
        validate_name(self.version, "version")
        validate_digest(self.artifact)
        if self.sample is not None:
            validate_digest(self.sample)
        for attr in ("format", "filename"):
            if not isinstance(getattr(self, attr), str):
                raise InvalidRecord(
                    f"{attr} must be a string, got {type(getattr(self, attr)).__name__}"
                )
        if not self.format:
            raise InvalidRecord("format must be a non-empty string")
        created = self.created
        if isinstance(created, bool) or not isinstance(created, int | float):
            raise InvalidRecord(f"created must be an epoch number, got {created!r}")
        object.__setattr__(self, "created", float(created))
        for attr in ("options", "metadata"):
            value = getattr(self, attr)
            if not isinstance(value, Mapping):
                raise InvalidRecord(f"{attr} must be a dict, got {type(value).__name__}")
            object.__setattr__(self, attr, _json_copy(dict(value), attr))
        if self.plan is not None:
            if not isinstance(self.plan, Mapping):
                raise InvalidRecord(f"plan must be a dict, got {type(self.plan).__name__}")
            object.__setattr__(self, "plan", _json_copy(dict(self.plan), "plan"))

    def to_json(self) -> dict[str, Any]:
        """A JSON-compatible dict; ``VersionRecord.from_json(r.to_json()) == r``."""
        return {
            "name": self.name,
            "version": self.version,
            "artifact": self.artifact,
            "format": self.format,
            "filename": self.filename,
            "options": _json_copy(self.options, "options"),
            "sample": self.sample,
            "created": self.created,
            "metadata": _json_copy(self.metadata, "metadata"),
            "plan": None if self.plan is None else _json_copy(self.plan, "plan"),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> VersionRecord:
        """Rebuild a record from :meth:`to_json` output; raises :class:`InvalidRecord`."""
        if not isinstance(data, Mapping):
            raise InvalidRecord(f"version record must be a JSON object, got {type(data).__name__}")
        required = ("name", "version", "artifact", "format", "filename", "created")
        missing = [key for key in required if key not in data]
        if missing:
            raise InvalidRecord(f"version record is missing {', '.join(missing)}")
        return cls(
            name=data["name"],
            version=data["version"],
            artifact=data["artifact"],
            format=data["format"],
            filename=data["filename"],
            options=data.get("options", {}),
            sample=data.get("sample"),
            created=data["created"],
            metadata=data.get("metadata", {}),
            plan=data.get("plan"),
        )

    def blobs(self) -> list[str]:
        """Digests of every blob this version needs."""
        return [self.artifact] if self.sample is None else [self.artifact, self.sample]


def _version_number(version: str) -> int | None:
    return int(version) if version.isdecimal() else None


def _newest(records: Mapping[str, VersionRecord]) -> str:
    """The newest version: latest ``created``, then the highest number, then the name."""

    def key(record: VersionRecord) -> tuple[float, int, str]:
        number = _version_number(record.version)
        return (record.created, -1 if number is None else number, record.version)

    return max(records.values(), key=key).version


#: Changes of a model's current version kept in its history (the oldest go first).
HISTORY_LIMIT = 200


@dataclass(frozen=True)
class CurrentChange:
    """One change of a model's current version: ``action`` is ``register`` (a new version
    became current), ``promote``, ``rollback``, or ``delete`` (the current version was deleted
    and the newest remaining one took its place); ``previous`` is None for a model's first."""

    action: str
    previous: str | None
    current: str
    by: str
    at: float

    ACTIONS = ("register", "promote", "rollback", "delete")

    def to_json(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "from": self.previous,
            "to": self.current,
            "by": self.by,
            "at": self.at,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CurrentChange:
        action, previous, current = data["action"], data["from"], data["to"]
        if action not in cls.ACTIONS:
            raise StoreCorruptionError(f"unknown history action {action!r}")
        if previous is not None:
            validate_name(previous, "version")
        at = data["at"]
        if isinstance(at, bool) or not isinstance(at, int | float):
            raise StoreCorruptionError(f"history time must be an epoch number, got {at!r}")
        by = data.get("by", "")
        if not isinstance(by, str):
            raise StoreCorruptionError(f"history 'by' must be a string, got {by!r}")
        return cls(action, previous, validate_name(current, "version"), by, float(at))


@dataclass
class ModelEntry:
    """A model in the manifest: its versions, which one serves, the next number to assign, and
    the history of its current version (newest last, at most :data:`HISTORY_LIMIT`)."""

    current: str | None
    versions: dict[str, VersionRecord] = field(default_factory=dict)
    next_version: int = 1
    history: list[CurrentChange] = field(default_factory=list)
    #: Other names of versions (``stable``, ``canary``, …): alias → version.
    aliases: dict[str, str] = field(default_factory=dict)
    #: A split of the model's unversioned requests: version → weight (empty: all to current).
    traffic: dict[str, float] = field(default_factory=dict)
    #: The version that live requests are mirrored to, the share mirrored, and the rule that
    #: may promote it (None: none).
    shadow: Shadow | None = None

    def named(self) -> set[str]:
        """The versions an alias names, traffic goes to or requests are mirrored to (they serve
        beside the current one)."""
        split = {v for v, w in self.traffic.items() if w > 0}
        return set(self.aliases.values()) | split | ({self.shadow[0]} if self.shadow else set())

    def resolve(self, version: str) -> str:
        """A version name, or the version an alias names (a version name wins)."""
        return version if version in self.versions else self.aliases.get(version, version)

    def make_current(self, version: str, action: str, by: str) -> None:
        """Make ``version`` current and record the change (none if it already is current)."""
        self.traffic = {}  # a split is over once one version is made current
        if version == self.current:
            return
        self.history.append(CurrentChange(action, self.current, version, by, time.time()))
        del self.history[:-HISTORY_LIMIT]
        self.current = version

    def previous(self) -> CurrentChange | None:
        """The change that made the current version current and that a rollback undoes: the
        newest change not already undone by a later rollback (rollbacks undo in turn, like an
        undo stack); None if there is none."""
        undone = 0
        for change in reversed(self.history):
            if change.action == "rollback":
                undone += 1
            elif undone:
                undone -= 1
            else:
                return change
        return None


@dataclass
class Manifest:
    """Snapshot of the store's catalogue.

    ``retired`` remembers the next version number of names without an entry (deleted models, and
    numbers reserved for uploads still compiling) so that a name never reuses a number (caches
    and replicas key on ``(name, version)``).
    """

    generation: int = 0
    models: dict[str, ModelEntry] = field(default_factory=dict)
    retired: dict[str, int] = field(default_factory=dict)

    def current(self, name: str) -> VersionRecord | None:
        """The current version of ``name``, or None if the model is unknown or has none."""
        entry = self.models.get(name)
        if entry is None or entry.current is None:
            return None
        return entry.versions[entry.current]

    def records(self) -> list[VersionRecord]:
        """The current version of every model that has one, sorted by model name."""
        return [rec for name in sorted(self.models) if (rec := self.current(name)) is not None]

    def record(self, name: str, version: str) -> VersionRecord:
        """One version of one model; raises :class:`ModelNotFound` naming what is missing."""
        entry = self.models.get(name)
        if entry is None:
            raise ModelNotFound(f"model {name!r} not found")
        try:
            return entry.versions[version]
        except KeyError:
            raise ModelNotFound(f"model {name!r} has no version {version!r}") from None

    def referenced_blobs(self) -> set[str]:
        """Digests of every blob any version (current or not) needs."""
        return {
            digest
            for entry in self.models.values()
            for record in entry.versions.values()
            for digest in record.blobs()
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": MANIFEST_KIND,
            "schema": MANIFEST_SCHEMA,
            "generation": self.generation,
            "models": {
                name: {
                    "current": entry.current,
                    "next_version": entry.next_version,
                    "versions": {v: rec.to_json() for v, rec in sorted(entry.versions.items())},
                    "history": [change.to_json() for change in entry.history],
                    "aliases": dict(sorted(entry.aliases.items())),
                    "traffic": dict(sorted(entry.traffic.items())),
                    "shadow": None if entry.shadow is None else entry.shadow.to_json(),
                }
                for name, entry in sorted(self.models.items())
            },
            "retired": dict(sorted(self.retired.items())),
        }

    def to_bytes(self) -> bytes:
        return json.dumps(self.to_json(), indent=1, allow_nan=False).encode() + b"\n"

    @classmethod
    def from_json(cls, data: object) -> Manifest:
        """Parse and check a manifest document; structural problems raise
        :class:`StoreCorruptionError`, a newer schema raises :class:`StoreError`."""
        try:
            return cls._parse(data)
        except (StoreCorruptionError, _SchemaTooNew):
            raise
        except (StoreError, KeyError, TypeError, ValueError, AttributeError) as exc:
            raise StoreCorruptionError(f"malformed manifest: {exc}") from exc

    @classmethod
    def _parse(cls, data: object) -> Manifest:
        if not isinstance(data, dict) or data.get("kind") != MANIFEST_KIND:
            raise StoreCorruptionError("not a Kestrel manifest (missing kind)")
        schema = data.get("schema")
        if not isinstance(schema, int):
            raise StoreCorruptionError(f"manifest schema must be an integer, got {schema!r}")
        if schema > MANIFEST_SCHEMA:
            raise _SchemaTooNew(
                f"manifest schema {schema} is newer than this Kestrel supports "
                f"({MANIFEST_SCHEMA}); upgrade before serving from this store"
            )
        generation = _nonnegative_int(data["generation"], "generation")
        models: dict[str, ModelEntry] = {}
        for name, raw in data["models"].items():
            validate_name(name)
            versions = {}
            for version, raw_record in raw["versions"].items():
                record = VersionRecord.from_json(raw_record)
                if (record.name, record.version) != (name, version):
                    raise StoreCorruptionError(
                        f"record {record.name}/{record.version} is filed under {name}/{version}"
                    )
                versions[version] = record
            current = raw["current"]
            if current is not None and current not in versions:
                raise StoreCorruptionError(f"model {name!r}: current version {current!r} missing")
            models[name] = ModelEntry(
                current=current,
                versions=versions,
                next_version=_nonnegative_int(raw["next_version"], f"{name}.next_version"),
                # Manifests written before histories and aliases existed have none.
                history=[CurrentChange.from_json(c) for c in raw.get("history", [])],
                aliases=_aliases(raw.get("aliases", {}), versions, name),
                traffic=_traffic(raw.get("traffic", {}), versions, name),
                shadow=_shadow(raw.get("shadow"), versions, name),
            )
        retired = {
            validate_name(name): _nonnegative_int(number, f"retired.{name}")
            for name, number in data.get("retired", {}).items()
        }
        return cls(generation=generation, models=models, retired=retired)


def _aliases(raw: object, versions: Mapping[str, VersionRecord], name: str) -> dict[str, str]:
    if not isinstance(raw, dict):
        raise StoreCorruptionError(f"model {name!r}: aliases must be an object")
    for alias, version in raw.items():
        validate_alias(alias)
        if version not in versions:
            raise StoreCorruptionError(f"model {name!r}: alias {alias!r} names no version")
    return dict(raw)


def _traffic(raw: object, versions: Mapping[str, VersionRecord], name: str) -> dict[str, float]:
    if not isinstance(raw, dict):
        raise StoreCorruptionError(f"model {name!r}: traffic must be an object")
    if not raw:
        return {}
    try:
        return check_weights(raw, versions)
    except (InvalidRecord, ModelNotFound) as exc:
        raise StoreCorruptionError(f"model {name!r}: {exc}") from None


def _shadow(raw: object, versions: Mapping[str, VersionRecord], name: str) -> Shadow | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or raw.get("version") not in versions:
        raise StoreCorruptionError(f"model {name!r}: shadow names no version")
    try:
        rule = raw.get("rule")
        return Shadow(
            raw["version"],
            check_share(raw.get("share")),
            None if rule is None else ShadowRule.from_json(rule),
        )
    except (InvalidRecord, InvalidRule) as exc:
        raise StoreCorruptionError(f"model {name!r}: {exc}") from None


def check_share(share: object) -> float:
    """A share of requests: a number in (0, 1]; else :class:`InvalidRecord`."""
    if isinstance(share, bool) or not isinstance(share, int | float) or not 0 < share <= 1:
        raise InvalidRecord(f"the share mirrored must be a number in (0, 1], got {share!r}")
    return float(share)


def check_weights(
    weights: Mapping[str, object], versions: Mapping[str, object]
) -> dict[str, float]:
    """``weights`` (version → a non-negative number, some positive) as floats; else
    :class:`InvalidRecord`, or :class:`ModelNotFound` for a version ``versions`` lacks."""
    out: dict[str, float] = {}
    for version, weight in weights.items():
        if version not in versions:
            raise ModelNotFound(f"no version {version!r} to send traffic to")
        if isinstance(weight, bool) or not isinstance(weight, int | float):
            raise InvalidRecord(f"the weight of version {version!r} must be a number")
        if not (0 <= weight < float("inf")):
            raise InvalidRecord(f"the weight of version {version!r} must be at least 0")
        out[version] = float(weight)
    if not any(w > 0 for w in out.values()):
        raise InvalidRecord("traffic needs some version with a positive weight")
    return out


class _SchemaTooNew(StoreError):
    """A manifest written by a newer Kestrel: never fall back past it (that would drop models)."""


def _nonnegative_int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise StoreCorruptionError(f"{what} must be a non-negative integer, got {value!r}")
    return value


# --------------------------------------------------------------------------- local I/O helpers


def _fsync_dir(directory: str) -> None:
    """Persist a rename: the directory entry must reach the disk, not just the file data."""
    with contextlib.suppress(OSError):  # not supported on every platform / filesystem
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _atomic_write_local(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the new one, never a mix."""
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=_TMP_PREFIX)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; other service users must read artifacts
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(directory)


def _modified(info: Mapping[str, Any]) -> float | None:
    """Modification time (epoch seconds) from an fsspec info dict, whatever the backend calls it."""
    for key in ("mtime", "LastModified", "last_modified", "updated", "created"):
        value = info.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, dt.datetime):
            if value.tzinfo is None:
                value = value.replace(tzinfo=dt.UTC)
            return value.timestamp()
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    return None


# --------------------------------------------------------------------------- the store


class ModelStore:
    """Content-addressed blobs plus an atomically replaced manifest under one fsspec URL.

    ``url`` is a plain path or ``file://`` URL (a local directory, created if missing) or any
    fsspec URL (``s3://bucket/prefix`` needs s3fs); ``storage_options`` go to the filesystem
    (e.g. endpoint, credentials, ``skip_instance_cache``).
    """

    def __init__(
        self,
        url: str,
        storage_options: Mapping[str, Any] | None = None,
        *,
        writers_lock: Callable[[], contextlib.AbstractContextManager[object]] | None = None,
    ) -> None:
        """``writers_lock``: a lock the processes writing together take around each mutation
        too (the workers of one ``kestrel serve``), so none of them loses another's write."""
        if not isinstance(url, str) or not url.strip():
            raise StoreError(f"model store URL must be a non-empty string, got {url!r}")
        try:
            fs, root = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
        except ImportError as exc:
            raise StoreError(
                f"model store URL {url!r} needs a filesystem package that is not installed: {exc}"
            ) from exc
        except ValueError as exc:
            raise StoreError(f"unsupported model store URL {url!r}: {exc}") from exc
        self.url = url
        self._fs: AbstractFileSystem = fs
        self._root = root.rstrip("/") or "/"
        self._local = isinstance(fs, LocalFileSystem)
        if self._local:
            os.makedirs(self._root, exist_ok=True)
        # Numbers handed out by next_version() but not yet committed, so two uploads in flight in
        # this process never get the same number.
        self._reserved: dict[str, int] = {}
        self._writers_lock = writers_lock or contextlib.nullcontext

    @contextlib.contextmanager
    def _mutating(self) -> Iterator[None]:
        with _MUTATION_LOCK, self._writers_lock():
            yield

    def __repr__(self) -> str:
        return f"ModelStore({self.url!r})"

    # ---------------------------------------------------------------- paths and raw I/O

    def _path(self, relative: str) -> str:
        return f"{self._root}/{relative}"

    def _blob_path(self, digest: str) -> str:
        return self._path(f"{_BLOB_DIR}/{digest[:2]}/{digest}")

    def _exists(self, path: str) -> bool:
        # Object-store filesystems cache listings; another replica may have written since.
        self._fs.invalidate_cache(path)
        return bool(self._fs.exists(path))

    def _write(self, path: str, data: bytes) -> None:
        if self._local:
            _atomic_write_local(path, data)
        else:
            self._fs.pipe_file(path, data)  # one PUT: atomic per object
            self._fs.invalidate_cache(path)

    def _read(self, path: str) -> bytes | None:
        """The bytes at ``path``, or None if there is no such file."""
        self._fs.invalidate_cache(path)
        try:
            return bytes(self._fs.cat_file(path))
        except FileNotFoundError:
            return None

    # ---------------------------------------------------------------- captured payloads

    def put_capture(self, model: str, version: str, hour: str, name: str, data: bytes) -> None:
        """Write one file of captured requests (service.capture) under
        ``capture/model=M/version=V/hour=H/`` (the Hive layout pyarrow and Spark read)."""
        for value, what in ((model, "model name"), (version, "version"), (name, "file name")):
            validate_name(value, what)
        if not re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d", hour):
            raise InvalidName(f"invalid capture hour {hour!r}: expected YYYY-MM-DDTHH")
        path = self._path(f"{_CAPTURE_DIR}/model={model}/version={version}/hour={hour}/{name}")
        if self._local:
            os.makedirs(os.path.dirname(path), exist_ok=True)
        self._write(path, data)

    def capture_hours(self) -> list[tuple[str, str, str]]:
        """Every (model, version, hour) partition of captured requests."""
        pattern = self._path(f"{_CAPTURE_DIR}/model=*/version=*/hour=*")
        self._fs.invalidate_cache(self._path(_CAPTURE_DIR))
        out = []
        for path in self._fs.glob(pattern):
            model, version, hour = (part.split("=", 1)[1] for part in path.split("/")[-3:])
            out.append((model, version, hour))
        return sorted(out)

    def drop_capture(self, model: str, version: str, hour: str) -> None:
        """Remove one partition of captured requests (retention)."""
        path = self._path(f"{_CAPTURE_DIR}/model={model}/version={version}/hour={hour}")
        with contextlib.suppress(FileNotFoundError):
            self._fs.rm(path, recursive=True)

    # ---------------------------------------------------------------- compiled executables

    def read_executable(self, name: str) -> bytes | None:
        """A shared executable's bytes (verified by the reader, lazy.cache_tiers), or None."""
        return self._read(self._executable_path(name))

    def write_executable(self, name: str, data: bytes) -> None:
        path = self._executable_path(name)
        if self._local:
            os.makedirs(os.path.dirname(path), exist_ok=True)
        self._write(path, data)

    def executable_names(self, prefix: str) -> list[str]:
        """The names of shared executables that start with ``prefix`` (one listing)."""
        if not re.fullmatch(r"[0-9a-f-]{0,65}", prefix):  # never a glob pattern, nor a path
            raise InvalidName(f"invalid executable name prefix {prefix!r}")
        root = self._path(_EXECUTABLE_DIR)
        self._fs.invalidate_cache(root)
        return sorted(path.rsplit("/", 1)[-1] for path in self._fs.glob(f"{root}/{prefix}*.xc"))

    def _executable_path(self, name: str) -> str:
        if not _EXECUTABLE_RE.fullmatch(name):
            raise InvalidName(f"invalid executable name {name!r}")
        return self._path(f"{_EXECUTABLE_DIR}/{name}")

    # ---------------------------------------------------------------- blobs

    def put_blob(self, data: bytes) -> str:
        """Store ``data`` under its sha256 and return the hex digest (a no-op if present)."""
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(f"blob data must be bytes, got {type(data).__name__}")
        data = bytes(data)
        digest = hashlib.sha256(data).hexdigest()
        path = self._blob_path(digest)
        if self._exists(path):
            if self._local:
                # Refresh the age gc() measures: an unreferenced old blob being re-uploaded is in
                # flight again and must survive the grace period like a new one.
                with contextlib.suppress(OSError):
                    os.utime(path)
            return digest
        self._write(path, data)
        return digest

    def has_blob(self, digest: str) -> bool:
        """Whether a blob with this digest is stored (its content is not verified)."""
        return self._exists(self._blob_path(validate_digest(digest)))

    def get_blob(self, digest: str) -> bytes:
        """The blob's bytes, verified against ``digest``.

        Raises :class:`BlobNotFound` if absent and :class:`StoreCorruptionError` if the stored
        bytes no longer hash to ``digest``.
        """
        data = self._read(self._blob_path(validate_digest(digest)))
        if data is None:
            raise BlobNotFound(f"blob {digest} not found in {self.url}")
        actual = hashlib.sha256(data).hexdigest()
        if actual != digest:
            raise StoreCorruptionError(
                f"blob {digest} in {self.url} is corrupt: its content hashes to {actual}"
            )
        return data

    # ---------------------------------------------------------------- manifest

    def load_manifest(self) -> Manifest:
        """The current manifest (an empty one for a new store).

        A missing or unreadable ``manifest.json`` falls back to ``manifest.prev.json`` with a
        warning; if neither is readable this raises :class:`StoreCorruptionError` rather than
        pretend the store is empty.
        """
        main_path, prev_path = self._path(MANIFEST_FILE), self._path(PREV_MANIFEST_FILE)
        raw = self._read(main_path)
        if raw is not None:
            try:
                return self._decode(raw, main_path)
            except _SchemaTooNew:
                raise
            except StoreCorruptionError as exc:
                problem = str(exc)
        else:
            problem = f"{main_path} is missing"
        raw_prev = self._read(prev_path)
        if raw_prev is None:
            if raw is None:
                return Manifest()  # a new, empty store
            raise StoreCorruptionError(f"{problem}, and there is no {prev_path} to recover from")
        try:
            recovered = self._decode(raw_prev, prev_path)
        except StoreCorruptionError as exc:
            raise StoreCorruptionError(f"{problem}; the fallback is unusable too: {exc}") from exc
        # The lost manifest had generation <= prev + 1 (prev is written just before it). Report
        # prev + 2 so a replica that already saw the lost generation still sees a change and
        # reloads, and every later write keeps generations strictly increasing.
        recovered.generation += 2
        logger.warning(
            "model store %s: %s; recovered %d model(s) from %s (generation now %d)",
            self.url,
            problem,
            len(recovered.models),
            prev_path,
            recovered.generation,
        )
        return recovered

    @staticmethod
    def _decode(raw: bytes, path: str) -> Manifest:
        try:
            document = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise StoreCorruptionError(f"{path} is not valid JSON: {exc}") from exc
        try:
            return Manifest.from_json(document)
        except StoreCorruptionError as exc:
            raise StoreCorruptionError(f"{path}: {exc}") from exc

    def _mutate(self, change: Callable[[Manifest], bool | None]) -> Manifest:
        """Load, apply ``change``, bump the generation and write — under the process lock.
        A ``change`` that returns False changed nothing: nothing is written.

        ``manifest.prev.json`` gets the manifest as loaded (re-serialized, so a corrupt file is
        never copied), then ``manifest.json`` the new one; each write is atomic, so a crash at
        any point leaves at least one readable, consistent manifest.
        """
        with self._mutating():
            manifest = self.load_manifest()
            before = manifest.to_bytes()
            if change(manifest) is False:
                return manifest
            manifest.generation += 1
            self._write(self._path(PREV_MANIFEST_FILE), before)
            self._write(self._path(MANIFEST_FILE), manifest.to_bytes())
            return manifest

    # ---------------------------------------------------------------- mutations

    def next_version(self, name: str) -> str:
        """Reserve the next version number of ``name``: "1", "2", … never reused, even after
        versions or the whole model were deleted, or the process crashed before committing. An
        upload that fails before its commit gives its number back (:meth:`release_version`).

        The reservation is written to the manifest (one manifest write), because the number is
        promised to the client at once (202) while the version compiles: a restart must not hand
        the same number to another upload.
        """
        validate_name(name)
        reserved: list[int] = []

        def change(manifest: Manifest) -> None:
            entry = manifest.models.get(name)
            candidates = [manifest.retired.get(name, 1), self._reserved.get(name, 0) + 1]
            if entry is not None:
                candidates.append(entry.next_version)
                numbers = (_version_number(v) for v in entry.versions)
                candidates.extend(n + 1 for n in numbers if n is not None)
            number = max(candidates)
            if entry is not None:
                entry.next_version = number + 1
            else:
                manifest.retired[name] = number + 1
            self._reserved[name] = number  # change() runs under _MUTATION_LOCK
            reserved.append(number)

        self._mutate(change)
        return str(reserved[0])

    def release_version(self, name: str, version: str) -> Manifest | None:
        """Give back a number :meth:`next_version` reserved for an upload that failed before it
        was committed, so that the next upload gets it: a failed registration uses no number.

        Only while it is still the last number handed out (no later reservation, by this process
        or another replica, and nothing committed under it): numbers stay increasing and are
        never reused by anything a cache or replica has seen. Returns the manifest written, or
        None where the number stays taken (then nothing is written).
        """
        validate_name(name)
        number = _version_number(validate_name(version, "version"))
        if number is None:
            return None
        released: list[bool] = []

        def change(manifest: Manifest) -> bool:
            entry = manifest.models.get(name)
            if entry is not None:
                if version in entry.versions or entry.next_version != number + 1:
                    return False
                entry.next_version = number
            elif manifest.retired.get(name) == number + 1:
                if number > 1:
                    manifest.retired[name] = number
                else:  # 1 is every new name's first number
                    del manifest.retired[name]
            else:
                return False
            if self._reserved.get(name) == number:  # change() runs under _MUTATION_LOCK
                self._reserved[name] = number - 1
            released.append(True)
            return True

        manifest = self._mutate(change)
        return manifest if released else None

    def commit(self, record: VersionRecord, make_current: bool = True, by: str = "") -> Manifest:
        """Add ``record`` to the manifest (optionally as current, recorded in the history as
        registered ``by`` someone) and return the new manifest.

        Its blobs must already be stored (:meth:`put_blob`), else :class:`StoreError`; an
        existing version is never overwritten (:class:`VersionConflict`).
        """
        if not isinstance(record, VersionRecord):
            raise TypeError(f"commit() takes a VersionRecord, got {type(record).__name__}")
        missing = [digest for digest in record.blobs() if not self.has_blob(digest)]
        if missing:
            raise StoreError(
                f"cannot commit {record.name}/{record.version}: blob(s) {', '.join(missing)} "
                "are not in the store (put_blob them first)"
            )

        def change(manifest: Manifest) -> None:
            entry = manifest.models.get(record.name)
            if entry is None:
                entry = ModelEntry(current=None, next_version=manifest.retired.pop(record.name, 1))
                manifest.models[record.name] = entry
            if record.version in entry.versions:
                raise VersionConflict(
                    f"model {record.name!r} already has version {record.version!r}"
                )
            if record.version in entry.aliases:
                raise VersionConflict(
                    f"model {record.name!r} has an alias named {record.version!r}"
                )
            entry.versions[record.version] = record
            number = _version_number(record.version)
            if number is not None:
                entry.next_version = max(entry.next_version, number + 1)
            if make_current:
                entry.make_current(record.version, "register", by)

        return self._mutate(change)

    def set_current(self, name: str, version: str, by: str = "") -> Manifest:
        """Make an existing version the one that serves (``promote``), recorded in the history;
        nothing is written if it already serves."""
        validate_name(name)
        validate_name(version, "version")

        def change(manifest: Manifest) -> bool:
            manifest.record(name, version)  # raises ModelNotFound
            entry = manifest.models[name]
            if entry.current == version:
                return False
            entry.make_current(version, "promote", by)
            return True

        return self._mutate(change)

    def rollback(self, name: str, by: str = "") -> Manifest:
        """Make the version that served before the current one current again, undoing the last
        change not yet undone (:meth:`ModelEntry.previous`). :class:`NoPreviousVersion` where
        there is none, or it was deleted since."""
        validate_name(name)

        def change(manifest: Manifest) -> None:
            entry = manifest.models.get(name)
            if entry is None:
                raise ModelNotFound(f"model {name!r} not found")
            last = entry.previous()
            if last is None or last.previous is None:
                raise NoPreviousVersion(
                    f"model {name!r} has no earlier current version to roll back to"
                )
            if last.previous not in entry.versions:
                raise NoPreviousVersion(
                    f"model {name!r}: version {last.previous}, current before {last.current}, "
                    "was deleted; promote a version instead"
                )
            entry.make_current(last.previous, "rollback", by)

        return self._mutate(change)

    def set_alias(self, name: str, alias: str, version: str) -> Manifest:
        """Make ``alias`` name ``version`` (a version or another alias) of ``name``; an alias may
        not be a version's own name. Nothing is written if it already names it."""
        validate_name(name)
        validate_alias(alias)

        def change(manifest: Manifest) -> bool:
            entry = manifest.models.get(name)
            if entry is None:
                raise ModelNotFound(f"model {name!r} not found")
            if alias in entry.versions:
                raise VersionConflict(f"model {name!r} has a version named {alias!r}")
            target = entry.resolve(version)
            manifest.record(name, target)  # raises ModelNotFound naming the version
            if entry.aliases.get(alias) == target:
                return False
            entry.aliases[alias] = target
            return True

        return self._mutate(change)

    def set_traffic(self, name: str, weights: Mapping[str, object]) -> Manifest:
        """Split ``name``'s unversioned requests between versions (or aliases) by ``weights``;
        empty: all to the current version again. Making a version current ends a split."""
        validate_name(name)

        def change(manifest: Manifest) -> None:
            entry = manifest.models.get(name)
            if entry is None:
                raise ModelNotFound(f"model {name!r} not found")
            resolved: dict[str, object] = {}
            for version, weight in weights.items():
                target = entry.resolve(version)
                if target in resolved:
                    raise InvalidRecord(f"version {target!r} is named twice")
                resolved[target] = weight
            checked = check_weights(resolved, entry.versions) if resolved else {}
            entry.traffic = dict(sorted(checked.items()))  # one order: every replica routes alike

        return self._mutate(change)

    def set_shadow(
        self,
        name: str,
        version: str | None,
        share: float = 0.0,
        rule: ShadowRule | None = None,
    ) -> Manifest:
        """Mirror ``share`` of ``name``'s live requests to ``version`` (or an alias), promoted
        by ``rule`` if it has one; None: mirror none."""
        validate_name(name)

        def change(manifest: Manifest) -> None:
            entry = manifest.models.get(name)
            if entry is None:
                raise ModelNotFound(f"model {name!r} not found")
            if version is None:
                entry.shadow = None
                return
            target = entry.resolve(version)
            manifest.record(name, target)  # raises ModelNotFound naming the version
            entry.shadow = Shadow(target, check_share(share), rule)

        return self._mutate(change)

    def decide_shadow(self, name: str, seen: Shadow, promote: bool, by: str = "") -> Manifest:
        """End the shadow ``seen`` of ``name`` by its rule's verdict: promoted to current
        (recorded in the history), or only no longer mirrored to. Nothing is written where the
        shadow is no longer ``seen`` (changed, or another replica decided first)."""
        validate_name(name)

        def change(manifest: Manifest) -> bool:
            entry = manifest.models.get(name)
            if entry is None or entry.shadow != seen:
                return False
            entry.shadow = None
            if promote and entry.current != seen.version:
                entry.make_current(seen.version, "promote", by)
            return True

        return self._mutate(change)

    def delete_alias(self, name: str, alias: str) -> Manifest:
        """Remove ``alias`` of ``name`` (:class:`ModelNotFound` if it has none such)."""
        validate_name(name)

        def change(manifest: Manifest) -> None:
            entry = manifest.models.get(name)
            if entry is None or alias not in entry.aliases:
                raise ModelNotFound(f"model {name!r} has no alias {alias!r}")
            del entry.aliases[alias]

        return self._mutate(change)

    def delete(self, name: str, version: str | None = None, by: str = "") -> Manifest:
        """Delete a whole model, or one version of it.

        Deleting the current version makes the newest remaining version current; deleting the
        last version removes the model. Blobs stay until :meth:`gc`. Unknown model or version →
        :class:`ModelNotFound`.
        """
        validate_name(name)
        if version is not None:
            validate_name(version, "version")

        def change(manifest: Manifest) -> None:
            entry = manifest.models.get(name)
            if entry is None:
                raise ModelNotFound(f"model {name!r} not found")
            if version is not None:
                manifest.record(name, version)  # raises ModelNotFound naming the version
                del entry.versions[version]
                entry.aliases = {a: v for a, v in entry.aliases.items() if v != version}
                entry.traffic.pop(version, None)
                if entry.shadow is not None and entry.shadow[0] == version:
                    entry.shadow = None
                if not any(w > 0 for w in entry.traffic.values()):
                    entry.traffic = {}
                if entry.versions:
                    if entry.current == version:
                        entry.make_current(_newest(entry.versions), "delete", by)
                    return
            del manifest.models[name]
            manifest.retired[name] = entry.next_version

        return self._mutate(change)

    def gc(self, grace_s: float = 3600) -> list[str]:
        """Delete blobs that no version references and that are older than ``grace_s`` seconds.

        The grace period protects an upload whose blob is stored but not yet committed. Blobs
        referenced by ``manifest.prev.json`` are kept too, so recovering from it stays possible.
        Stale temp files left by crashed local writes are removed as well. Returns the digests
        of the deleted blobs. (On object stores an old unreferenced blob that is re-uploaded
        keeps its old age; if gc removes it first, the upload's commit fails loudly.)
        """
        if isinstance(grace_s, bool) or not isinstance(grace_s, int | float) or grace_s < 0:
            raise ValueError(f"grace_s must be a non-negative number of seconds, got {grace_s!r}")
        with self._mutating():
            keep = self.load_manifest().referenced_blobs()
            raw_prev = self._read(self._path(PREV_MANIFEST_FILE))
            if raw_prev is not None:
                with contextlib.suppress(StoreCorruptionError):
                    keep |= self._decode(raw_prev, PREV_MANIFEST_FILE).referenced_blobs()
            cutoff = time.time() - grace_s
            blob_root = self._path(_BLOB_DIR)
            self._fs.invalidate_cache(blob_root)
            try:
                listing = self._fs.find(blob_root, detail=True)
            except FileNotFoundError:
                listing = {}
            deleted = []
            for path, info in sorted(listing.items()):
                basename = path.rsplit("/", 1)[-1]
                modified = _modified(info)
                if modified is None or modified > cutoff:
                    continue  # unknown age counts as fresh: never delete what we can't date
                if basename.startswith(_TMP_PREFIX):
                    self._remove(path)
                elif _DIGEST_RE.fullmatch(basename) and basename not in keep:
                    self._remove(path)
                    deleted.append(basename)
            if self._local:  # manifest temps, and executables' a killed server was writing
                self._remove_stale_temps(self._root, cutoff)
                executables = self._path(_EXECUTABLE_DIR)
                if os.path.isdir(executables):
                    self._remove_stale_temps(executables, cutoff)
            if deleted:
                logger.info("model store %s: gc deleted %d blob(s)", self.url, len(deleted))
            return deleted

    def _remove(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._fs.rm_file(path)

    @staticmethod
    def _remove_stale_temps(directory: str, cutoff: float) -> None:
        """Remove the temp files a crashed writer left in ``directory`` (not its subdirectories)."""
        with os.scandir(directory) as entries:
            for item in entries:
                if item.name.startswith(_TMP_PREFIX) and item.is_file():
                    with contextlib.suppress(FileNotFoundError):
                        if item.stat().st_mtime <= cutoff:
                            os.unlink(item.path)
