"""Counters as plain data. The service exports them; this layer never imports a metrics library."""

from __future__ import annotations

import enum
import threading
from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from typing import Any


class CompileCause(enum.Enum):
    WARMUP = "warmup"  # compiling every bucket before a graph is reported ready
    ON_DEMAND = "on_demand"  # first use of a bucket that was not warmed up
    AFTER_READY = "after_ready"  # a compile after warm-up: an anomaly the service counts


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    # Persistent tiers (lazy.cache_tiers): totals over every tier, then by tier name.
    disk_hits: int = 0
    disk_writes: int = 0
    disk_errors: int = 0
    tier_loads: Counter[str] = field(default_factory=Counter)
    tier_writes: Counter[str] = field(default_factory=Counter)
    tier_errors: Counter[str] = field(default_factory=Counter)
    tier_foreign: Counter[str] = field(default_factory=Counter)  # held for another backend
    evictions: int = 0
    compiles: Counter[str] = field(default_factory=Counter)  # device executables, by cause
    # Host plans built (numpy code generated from a graph), by cause: not
    # compiles of device code, so never counted as one (a restart that loads every executable
    # from disk still builds its host plans).
    host_builds: Counter[str] = field(default_factory=Counter)
    trace_s: float = 0.0
    lower_s: float = 0.0
    compile_s: float = 0.0
    disk_load_s: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def total_compiles(self) -> int:
        return sum(self.compiles.values())

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "_lock"}
        data["compiles"] = dict(data["compiles"])
        for name in ("host_builds", "tier_loads", "tier_writes", "tier_errors", "tier_foreign"):
            data[name] = dict(data[name])
        data["total_compiles"] = sum(data["compiles"].values())
        return data


@dataclass
class RunStats:
    calls: int = 0
    rows: int = 0
    padded_rows: int = 0
    chunks: int = 0
    subnormal_rows: int = 0  # rows recomputed on the host: the device flushes their subnormals

    def snapshot(self) -> dict[str, Any]:
        return asdict(self)
