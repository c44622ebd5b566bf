"""The executable cache: an in-memory LRU over optional persistent tiers.

Keys are explicit (:class:`CacheKey`); a hit never compiles. Device executables and host plans
(numpy code generated from a graph) both go through it, each keyed by its own backend's
fingerprint; only backends that serialize their executables use the tiers (a host plan is
rebuilt from its graph faster than it would be read back).

Tiers (:mod:`lazy.cache_tiers`) are tried in order on a miss — typically a local directory,
then a store shared by replicas. A hit in a later tier is copied into the earlier writable ones;
a compile is written to every writable tier. Tiers hold serialized executables, and loading one
runs code: **only trusted processes may write them**. Every entry is checked against its key and
a sha256 (or, with a signing key, an HMAC) of its bytes; one that does not match is counted,
ignored and replaced. A tier that fails to read or write costs a compile, never a request.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import NamedTuple

from . import cache_tiers as tiers_
from .backends.base import Backend, CompileTimes, Executable
from .cache_tiers import DirectoryTier, EntryError, ExecutableTier
from .stats import CacheStats, CompileCause

log = logging.getLogger("kestrel.lazy.cache")


class CacheKey(NamedTuple):
    graph_digest: str
    bucket: int
    dtype_policy: str
    param_mode: str
    backend: str  # the backend fingerprint: backend and versions, device kind, x64, XLA flags

    def filename(self) -> str:
        """The file of this key's executable sealed by a sha256 (no signing key)."""
        return tiers_.filename(self)


Compile = Callable[[], tuple[Executable, CompileTimes]]


class ExecutableCache:
    """Thread-safe; concurrent requests for one key compile it once."""

    def __init__(
        self,
        capacity: int = 512,
        disk_dir: str | os.PathLike[str] | None = None,
        tiers: Sequence[ExecutableTier] = (),
        signing_key: bytes | None = None,
    ):
        """``disk_dir``: a local directory tier, tried first; ``tiers``: further tiers, in
        order; ``signing_key``: entries are sealed with an HMAC under it, and unsigned ones
        refused (None: a sha256 checksum)."""
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        local = [DirectoryTier(disk_dir)] if disk_dir is not None else []
        self.tiers: tuple[ExecutableTier, ...] = (*local, *tiers)
        self._signing_key = signing_key
        self._seal = tiers_.seal_id(signing_key)
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

    # -- persistent tiers --------------------------------------------------------------------
    def _load(self, key: CacheKey, backend: Backend) -> Executable | None:
        """The executable from the first tier that holds a sound entry for ``key``."""
        name = tiers_.filename(key, self._seal)
        for depth, tier in enumerate(self.tiers):
            t0 = time.perf_counter()
            try:
                data = tier.read(name)
                if data is None:
                    continue
                exe = backend.deserialize(tiers_.decode(key, data, self._signing_key))
            except Exception as exc:  # damaged, foreign or unreadable: compile and replace it
                self._count_error(tier)
                log.warning(
                    "not using the cached executable %s in %s tier: %s",
                    name,
                    tier.name,
                    exc if isinstance(exc, EntryError) else f"{type(exc).__name__}: {exc}",
                    extra={"tier": tier.name, "graph": key.graph_digest[:12]},
                )
                continue
            with self.stats._lock:
                self.stats.disk_hits += 1
                self.stats.tier_loads[tier.name] += 1
                self.stats.disk_load_s += time.perf_counter() - t0
            for earlier in self.tiers[:depth]:
                self._write(earlier, name, data)
            return exe
        self._explain_miss(key)
        return None

    def _store(self, key: CacheKey, backend: Backend, exe: Executable) -> None:
        if not any(tier.writable for tier in self.tiers):
            return
        payload = backend.serialize(exe)
        if payload is None:
            return
        data = tiers_.encode(key, payload, self._signing_key)
        for tier in self.tiers:
            self._write(tier, tiers_.filename(key, self._seal), data)

    def _write(self, tier: ExecutableTier, name: str, data: bytes) -> None:
        if not tier.writable:
            return
        try:
            tier.write(name, data)
        except Exception as exc:
            self._count_error(tier)
            log.warning("could not write %s to %s tier: %s", name, tier.name, exc)
            return
        with self.stats._lock:
            self.stats.disk_writes += 1
            self.stats.tier_writes[tier.name] += 1

    def _explain_miss(self, key: CacheKey) -> None:
        """Log why no tier had ``key`` where one holds it for another backend or seal."""
        ours = tiers_.filename(key, self._seal)
        for tier in self.tiers:
            try:
                others = [n for n in tier.names(tiers_.entry_prefix(key)) if n != ours]
                data = tier.read(others[0]) if others else None
                if data is None:
                    continue
                backend, seal = tiers_.stored_backend(data)
            except Exception:  # only an explanation: never worth failing a compile
                continue
            if backend != key.backend:
                why = "for another backend: " + tiers_.fingerprint_difference(backend, key.backend)
            elif seal == "sha256":
                why = "unsigned, and this process seals with a signing key"
            else:
                why = "sealed with a signing key this process does not hold"
            with self.stats._lock:
                self.stats.tier_foreign[tier.name] += 1
            log.info(
                "%s tier holds %s bucket %d %s; compiling here",
                tier.name,
                key.graph_digest[:12],
                key.bucket,
                why,
                extra={"tier": tier.name, "graph": key.graph_digest[:12]},
            )
            return

    def _count_error(self, tier: ExecutableTier) -> None:
        with self.stats._lock:
            self.stats.disk_errors += 1
            self.stats.tier_errors[tier.name] += 1
