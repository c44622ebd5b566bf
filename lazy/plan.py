"""Execution plans: which lowering runs each bucket of a graph, and why.

Every bucket of a graph can run on two lowerings that compute the same operations in the same
dtypes but do not round alike: the graph's backend (XLA: ``"device"``) and straight-line numpy
(:mod:`lazy.backends.numpy_backend`: ``"host"``). Which is faster depends on the graph and the
machine, so it is measured — once, when a model version is first compiled. From then on the
choice is data: an :class:`ExecutionPlan`, persisted with the version and given to every later
compile of it (another replica, a restart), which runs each bucket where the plan says, compiles
nothing else and times nothing. The lowering, and so every output bit, is a property of the
version, never of which process answers or of how busy the machine was during a warm-up.

A plan is bound to what it was decided for: the graph's digest, its buckets and both backends'
fingerprints (versions, device kind, lowering revisions). A compile that finds any of them
changed decides again (:meth:`GraphPlan.matches` says why), because a plan for other code or
other hardware says nothing about this one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import LazyError

HOST = "host"
DEVICE = "device"
LOWERINGS = (HOST, DEVICE)


class PlanError(LazyError, ValueError):
    """A stored plan that cannot be read (malformed, or written by a newer version)."""


@dataclass(frozen=True)
class Placement:
    """Where bucket ``bucket`` runs (:data:`HOST` or :data:`DEVICE`) and why: ``reason`` in
    words, with the warm-up timings (µs per call, median of interleaved rounds) where the
    placement was measured."""

    bucket: int
    runs_on: str
    reason: str
    host_us: float | None = None
    device_us: float | None = None

    def __post_init__(self) -> None:
        if self.runs_on not in LOWERINGS:
            raise PlanError(f"a bucket runs on one of {LOWERINGS}, not {self.runs_on!r}")

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"bucket": self.bucket, "runs_on": self.runs_on}
        out["reason"] = self.reason
        if self.host_us is not None:
            out["host_us"] = self.host_us
        if self.device_us is not None:
            out["device_us"] = self.device_us
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Placement:
        bucket, runs_on, reason = data.get("bucket"), data.get("runs_on"), data.get("reason")
        if isinstance(bucket, bool) or not isinstance(bucket, int) or bucket < 1:
            raise PlanError(f"a placement's bucket must be a positive integer, got {bucket!r}")
        if not isinstance(runs_on, str) or not isinstance(reason, str):
            raise PlanError(f"a placement needs runs_on and reason strings, got {dict(data)!r}")
        timings = [data.get("host_us"), data.get("device_us")]
        if any(t is not None and not isinstance(t, int | float) for t in timings):
            raise PlanError(f"a placement's timings must be numbers, got {timings!r}")
        return cls(bucket, runs_on, reason, *timings)


@dataclass(frozen=True)
class GraphPlan:
    """The placements of one graph's buckets, smallest bucket first, and what they were
    decided for: the graph ``digest`` and the ``backends``' fingerprints."""

    digest: str
    backends: str
    placements: tuple[Placement, ...]

    def runs_on(self, bucket: int) -> str:
        for placement in self.placements:
            if placement.bucket == bucket:
                return placement.runs_on
        raise KeyError(bucket)

    def matches(self, digest: str, backends: str, buckets: Sequence[int]) -> str | None:
        """None if this plan was decided for this graph, backends and buckets; else why not."""
        if digest != self.digest:
            return f"it was decided for graph {self.digest[:12]}, this is {digest[:12]}"
        if backends != self.backends:
            return f"it was decided on {self.backends!r}, this process runs {backends!r}"
        planned = [p.bucket for p in self.placements]
        if planned != list(buckets):
            return f"it places buckets {planned}, this graph has {list(buckets)}"
        return None

    def as_dict(self) -> dict[str, Any]:
        return {
            "digest": self.digest,
            "backends": self.backends,
            "placements": [p.as_dict() for p in self.placements],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GraphPlan:
        digest, backends, placements = (
            data.get("digest"),
            data.get("backends"),
            data.get("placements"),
        )
        if not isinstance(digest, str) or not isinstance(backends, str):
            raise PlanError("a graph plan needs digest and backends strings")
        if not isinstance(placements, list) or not all(isinstance(p, Mapping) for p in placements):
            raise PlanError("a graph plan's placements must be a list of objects")
        return cls(digest, backends, tuple(Placement.from_dict(p) for p in placements))


PLAN_FORMAT = 1


@dataclass(frozen=True)
class ExecutionPlan:
    """The plans of a program's graphs, in program order."""

    graphs: tuple[GraphPlan, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"format": PLAN_FORMAT, "graphs": [g.as_dict() for g in self.graphs]}

    @classmethod
    def from_dict(cls, data: object) -> ExecutionPlan:
        if not isinstance(data, Mapping):
            raise PlanError(f"an execution plan must be an object, got {type(data).__name__}")
        if data.get("format") != PLAN_FORMAT:
            raise PlanError(f"execution plan format {data.get('format')!r} is not {PLAN_FORMAT}")
        graphs = data.get("graphs")
        if not isinstance(graphs, list) or not all(isinstance(g, Mapping) for g in graphs):
            raise PlanError("an execution plan's graphs must be a list of objects")
        return cls(tuple(GraphPlan.from_dict(g) for g in graphs))
