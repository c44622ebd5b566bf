"""The executable cache: an in-memory LRU over an optional on-disk layer.

Keys are explicit (:class:`CacheKey`); a hit never compiles. Device executables and host plans
(numpy code generated from a graph) both go through it, each keyed by its own backend's
fingerprint; only backends that serialize their executables use the disk layer (a host plan is
rebuilt from its graph faster than it would be read back). The disk layer keeps serialized
executables in a directory **the operator trusts** — loading one runs code, so never point it at a
location others can write. Files are written atomically and carry their key and a sha256 of the
payload; a file that does not match is counted, ignored and replaced.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from .backends.base import Backend, CompileTimes, Executable
from .stats import CacheStats, CompileCause

_MAGIC = b"kestrel-lazy-executable/1\n"
log = logging.getLogger("kestrel.lazy.cache")


class CacheKey(NamedTuple):
    graph_digest: str
    bucket: int
    dtype_policy: str
    param_mode: str
    backend: str  # the backend fingerprint: backend and versions, device kind, x64, XLA flags

    def filename(self) -> str:
        return hashlib.sha256(json.dumps(list(self)).encode()).hexdigest() + ".xc"


Compile = Callable[[], tuple[Executable, CompileTimes]]


class ExecutableCache:
    """Thread-safe; concurrent requests for one key compile it once."""

    def __init__(self, capacity: int = 512, disk_dir: str | os.PathLike[str] | None = None):
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self.disk_dir = Path(disk_dir) if disk_dir is not None else None
        if self.disk_dir is not None:
            self.disk_dir.mkdir(parents=True, exist_ok=True)
        self.stats = CacheStats()
        self._entries: OrderedDict[CacheKey, Executable] = OrderedDict()
        self._lock = threading.Lock()
        self._key_locks: dict[CacheKey, threading.Lock] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: CacheKey) -> bool:
        return key in self._entries

    def get(
        self, key: CacheKey, backend: Backend, compile: Compile, cause: CompileCause
    ) -> Executable:
        """The executable for ``key``: from memory, else from disk, else compiled (``cause``)."""
        found = self._lookup(key)
        if found is not None:
            return found
        with self._lock:
            key_lock = self._key_locks.setdefault(key, threading.Lock())
        with key_lock:
            found = self._lookup(key, count=False)
            if found is not None:
                return found
            with self.stats._lock:
                self.stats.misses += 1
            exe = self._load(key, backend)
            if exe is None:
                exe, times = compile()
                built = backend.target == "host"
                with self.stats._lock:
                    if built:
                        self.stats.host_builds[cause.value] += 1
                    else:
                        self.stats.compiles[cause.value] += 1
                        self.stats.trace_s += times.trace_s
                        self.stats.lower_s += times.lower_s
                        self.stats.compile_s += times.compile_s
                if built:
                    level = logging.DEBUG
                else:
                    level = logging.WARNING if cause is CompileCause.AFTER_READY else logging.INFO
                log.log(
                    level,
                    "%s %s bucket %d (%s) in %.3f s",
                    "built the host plan of" if built else "compiled",
                    key.graph_digest[:12],
                    key.bucket,
                    cause.value,
                    times.trace_s + times.lower_s + times.compile_s,
                    extra={
                        "cause": cause.value,
                        "bucket": key.bucket,
                        "graph": key.graph_digest[:12],
                    },
                )
                self._store(key, backend, exe)
            self._insert(key, exe)
        with self._lock:
            self._key_locks.pop(key, None)
        return exe

    def _lookup(self, key: CacheKey, count: bool = True) -> Executable | None:
        with self._lock:
            exe = self._entries.get(key)
            if exe is not None:
                self._entries.move_to_end(key)
        if exe is not None and count:
            with self.stats._lock:
                self.stats.hits += 1
        return exe

    def _insert(self, key: CacheKey, exe: Executable) -> None:
        with self._lock:
            self._entries[key] = exe
            self._entries.move_to_end(key)
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)
                with self.stats._lock:
                    self.stats.evictions += 1

    # -- disk layer ----------------------------------------------------------------------------
    def _path(self, key: CacheKey) -> Path | None:
        return None if self.disk_dir is None else self.disk_dir / key.filename()

    def _load(self, key: CacheKey, backend: Backend) -> Executable | None:
        path = self._path(key)
        if path is None or not path.exists():
            return None
        t0 = time.perf_counter()
        try:
            data = path.read_bytes()
            header, digest, payload = _split(data)
            if (
                header != json.dumps(list(key)).encode()
                or hashlib.sha256(payload).hexdigest() != digest
            ):
                raise ValueError("key or checksum mismatch")
            exe = backend.deserialize(payload)
        except Exception:  # a damaged or foreign file: recompile and overwrite it
            with self.stats._lock:
                self.stats.disk_errors += 1
            return None
        with self.stats._lock:
            self.stats.disk_hits += 1
            self.stats.disk_load_s += time.perf_counter() - t0
        return exe

    def _store(self, key: CacheKey, backend: Backend, exe: Executable) -> None:
        path = self._path(key)
        if path is None:
            return
        payload = backend.serialize(exe)
        if payload is None:
            return
        header = json.dumps(list(key)).encode()
        digest = hashlib.sha256(payload).hexdigest().encode()
        blob = b"".join([_MAGIC, header, b"\n", digest, b"\n", payload])
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".xc")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        with self.stats._lock:
            self.stats.disk_writes += 1


def _split(data: bytes) -> tuple[bytes, str, bytes]:
    if not data.startswith(_MAGIC):
        raise ValueError("not a cached executable")
    header, digest, payload = data[len(_MAGIC) :].split(b"\n", 2)
    return header, digest.decode(), payload
