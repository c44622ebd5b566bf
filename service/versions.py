"""A process's model versions in memory: what each one is, and which one serves each model.

:class:`ModelVersion` is one uploaded or stored version and its lifecycle state; :class:`Versions`
is the table of them, with the queries every route asks (which version answers a request, and
why one cannot). Changing the table is :mod:`service.models`' job, under its locks.
"""

from __future__ import annotations

import asyncio
import difflib
import enum
import hashlib
import random
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

import compiler
from compiler.options import TreeStrategy
from service.batcher import Batcher
from service.drift_reference import Reference
from service.errors import (
    ModelRejected,
    NotFound,
    NotReady,
    VersionFailed,
    VersionRetired,
    some_of,
)
from service.metrics import served_version
from service.queue_delay import QueueDelay
from service.scoring import Explained
from service.shadow_rule import Shadow
from service.store import CurrentChange, VersionRecord


class State(enum.StrEnum):
    LOADING = "LOADING"
    READY = "READY"
    FAILED = "FAILED"
    RETIRED = "RETIRED"  # stored but not loaded: replaced by a newer version
    # Still current (or named), unloaded to keep within the replica's budget of loaded versions
    # (service.residency): its next request loads it again.
    UNLOADED = "UNLOADED"


#: The states of a version that can answer a request now or after loading it on demand.
SERVABLE = frozenset({State.READY, State.UNLOADED})


class Phase(enum.StrEnum):
    """What a LOADING version is doing now."""

    QUEUED = "queued"  # waiting for the loader thread, which runs one load at a time
    COMPILING = "compiling"  # compile (or load from the cache) and warm up each bucket
    PARITY = "parity"  # check the compiled model against the source model
    STORING = "storing"  # write the upload to the store and commit it
    # Serving in the worker that stored it; the pod's other workers are loading it
    # (kestrel serve --workers: service/pod_sync.py).
    REPLICATING = "replicating"


class LoadPhase(enum.StrEnum):
    """Where a load spends its time, on the loader thread (``ModelVersion.load_phases``)."""

    READ = "read"  # a stored version's blobs, through the trust boundary
    TRACE = "trace"  # convert and trace the pipeline into the IR, place it by the plan
    BUCKETS = "buckets"  # compile (or load from the cache) and run each bucket once
    PARITY = "parity"  # the parity gate against the source model
    STORE = "store"  # an upload's blobs written to the store


@dataclass(frozen=True)
class LoadProgress:
    """How far a load has got: the loader thread replaces it whole, so a reader on the event
    loop always sees one consistent snapshot."""

    phase: Phase
    buckets_done: int = 0
    buckets_total: int | None = None  # None until the graphs are built

    def as_dict(self) -> dict[str, Any]:
        return {
            "phase": self.phase.value,
            "buckets_done": self.buckets_done,
            "buckets_total": self.buckets_total,
        }


class ModelOptions(BaseModel):
    """Per-model compile options a client may set at registration."""

    model_config = ConfigDict(extra="forbid")

    max_batch: int | None = Field(None, ge=1, le=1 << 16)
    tree_strategy: TreeStrategy = "auto"
    dtype: Literal["float32", "float64"] = "float32"
    methods: list[str] | None = None
    split_codes: bool | None = None
    #: Also compile the model's per-column contributions (the ``contributions`` output; tree
    #: ensembles only: any other model is refused at registration).
    explain: bool = False

    @classmethod
    def stored(cls, options: dict[str, Any]) -> ModelOptions:
        """The options of a stored version. A tree strategy since removed becomes ``auto``, so
        the version still loads (and passes the parity gate again, as every load does)."""
        if options.get("tree_strategy") in REMOVED_TREE_STRATEGIES:
            options = {**options, "tree_strategy": "auto"}
        return cls.model_validate(options)

    def compile_options(self, **rest: Any) -> compiler.CompileOptions:
        """The compiler's options for these, with the caller's own (host steps, cache, ...)."""
        methods = tuple(self.methods) if self.methods else None
        return compiler.CompileOptions(
            dtype=self.dtype,
            tree_strategy=self.tree_strategy,
            methods=methods,
            split_codes=self.split_codes,
            explain=self.explain,
            **rest,
        )


#: Strategies older versions may have stored; see compiler/trees/strategies.py.
REMOVED_TREE_STRATEGIES = frozenset({"gemm", "perfect"})


@dataclass
class Upload:
    name: str
    data: bytes
    filename: str = ""
    version: str | None = None
    format: str | None = None
    sample: Any = None  # decoded JSON rows (list of objects / arrays, or {column: values})
    options: ModelOptions = field(default_factory=ModelOptions)
    pickle_allowed: bool = False  # the caller checked the operator's switch and the admin token
    actor: str = ""  # who registered it (the version history records it)
    promote: bool = True  # current once READY; False: stored only (a model's first still serves)


@dataclass
class ModelVersion:
    name: str
    version: str
    format: str
    filename: str
    options: ModelOptions
    state: State = State.LOADING
    created: float = field(default_factory=time.time)
    error: str | None = None
    model: compiler.CompiledModel | None = None
    source: Any = None  # the source estimator, while READY (service.live_parity)
    reference: Reference | None = None  # the registration data, for drift (service.drift)
    batcher: Batcher | None = None
    # Its contributions' batcher (service.serving), while READY, where the model explains.
    explainer: Batcher | None = None
    delay: QueueDelay | None = None  # its queue's standing delay, for load shedding
    framework: dict[str, str] = field(default_factory=dict)
    parity: dict[str, Any] | None = None
    load_seconds: float | None = None
    # Seconds of each phase on the loader thread; load_seconds also counts the wait for it.
    load_phases: dict[LoadPhase, float] = field(default_factory=dict)
    record: VersionRecord | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)
    executor: ThreadPoolExecutor | None = None
    # The manifest generation that made this version current (its own commit, or the manifest a
    # replica sync read): of two loads racing to become current, the one from the newer manifest
    # wins, whichever finishes last.
    generation: int = -1
    failed_loads: int = 0  # consecutive failed reloads of a stored version
    # The number the store reserved for this upload (ModelStore.next_version): given back if the
    # registration fails before its commit, so a failed try uses up no version number.
    reserved: str | None = None
    retry_at: float = 0.0  # time.monotonic() after which a replica sync may retry the reload
    progress: LoadProgress | None = None  # while LOADING: the load's phase and buckets warmed
    sample: Any = None  # the registration sample in its source form, as the compile took it
    last_used: float = 0.0  # time.monotonic() of its last request (service.residency)
    revival: asyncio.Task[None] | None = None  # loading it again after it was UNLOADED
    waiting: int = 0  # requests waiting for that load

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "version": self.version,
            "state": self.state.value,
            "format": self.format,
            "filename": self.filename,
            "created": self.created,
            "options": self.options.model_dump(),
            "framework": self.framework,
            "parity": self.parity,
            "load_seconds": self.load_seconds,
            "load_phases": {phase.value: s for phase, s in self.load_phases.items()},
        }
        if self.error:
            out["error"] = self.error
        if self.failed_loads:
            out["failed_loads"] = self.failed_loads
        if self.state is State.LOADING and self.progress is not None:
            out["progress"] = self.progress.as_dict()
        if self.model is not None:
            out["schema"] = self.model.schema.as_dict()
            out["report"] = self.model.report.as_dict()
            out["methods"] = list(self.model.methods)
            graphs = getattr(getattr(self.model, "compiled", None), "graphs", [])
            out["buckets"] = sorted({size for g in graphs for size in g.buckets.sizes})
            # Small buckets warm-up found faster as numpy on the host than as a device call.
            out["host_buckets"] = sorted(
                {p.bucket for g in graphs for p in g.placements.values() if p.runs_on == "host"}
            )
            plan = self.model.plan
            if plan is not None:  # where each bucket runs and why, as every replica runs it
                out["plan"] = [[p.as_dict() for p in g.placements] for g in plan.graphs]
            if self.model.classes_ is not None:
                out["classes"] = np.asarray(self.model.classes_).tolist()
        if self.reference is not None:
            out["drift_reference"] = self.reference.describe()
        return out


@dataclass
class Prediction:
    version: ModelVersion
    outputs: dict[str, np.ndarray]
    rows: int
    decode_s: float  # host decode of the outputs; the route adds its rendering and records it
    ignored: tuple[str, ...] = ()  # the request's columns the model does not read
    explained: Explained | None = None  # the axes of a ``contributions`` answer, if any


class Versions:
    """Every version this process knows, by model name, and each model's current version."""

    def __init__(self, poll_interval_s: float) -> None:
        self._poll_interval_s = poll_interval_s  # a replica sync retries failed stored loads
        self.by_name: dict[str, dict[str, ModelVersion]] = {}
        self.current_version: dict[str, str] = {}
        #: Each model's changes of its current version, and its aliases (alias → version), as
        #: of the last manifest read or written.
        self.histories: dict[str, list[CurrentChange]] = {}
        self.aliases: dict[str, dict[str, str]] = {}
        #: Splits of unversioned requests: model → version → weight (see :meth:`route`).
        self.traffic: dict[str, dict[str, float]] = {}
        #: Shadow versions: model → the version mirrored to, the share of requests, its rule.
        self.shadows: dict[str, Shadow] = {}

    def route(self, name: str, version: str | None, key: str | None = None) -> str | None:
        """The version an unversioned request for ``name`` goes to where its traffic is split
        (by weight: the same ``key`` always to the same version, on every replica; no key, at
        random) between the versions READY here; else ``version`` as given (None: the current
        one)."""
        weights = self.traffic.get(name) if version is None else None
        if not weights:
            return version
        # A version of the split this replica has not loaded yet (it follows the store's split
        # as it loads) takes none of its traffic meanwhile: the rest go on as weighted.
        known = self.by_name.get(name, {})
        ready = {
            v: w
            for v, w in weights.items()
            if (mv := known.get(v)) is not None and mv.state in SERVABLE
        }
        if ready != weights:
            if not ready:
                return version
            weights = ready
        total = sum(weights.values())
        if key is None:
            point = random.random() * total
        else:
            digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest()
            point = int.from_bytes(digest, "big") / 2**64 * total
        for chosen, weight in weights.items():
            point -= weight
            if point < 0:
                return chosen
        return max(weights, key=lambda v: weights[v])

    def resolve(self, name: str, version: str | None) -> tuple[str, str | None]:
        """The model and version a request names: ``name@alias`` or an alias as the version
        name the version the alias names (a version's own name wins)."""
        if "@" in name:
            if version is not None:
                # Not a 400: every route that takes a version documents 404 for a name@version
                # pair that does not exist, and this pair cannot.
                raise NotFound(
                    f"no model {name!r} with version {version!r}: a name with '@' names its "
                    "version already; name one or the other"
                )
            name, version = name.split("@", 1)
        if version is not None and version not in self.by_name.get(name, {}):
            version = self.aliases.get(name, {}).get(version, version)
        return name, version

    def pinned(self, name: str) -> set[str]:
        """The versions of ``name`` an alias names, traffic goes to or requests are mirrored to:
        they serve beside the current one."""
        split = {v for v, w in self.traffic.get(name, {}).items() if w > 0}
        shadow = self.shadows.get(name)
        return set(self.aliases.get(name, {}).values()) | split | ({shadow[0]} if shadow else set())

    def states(self) -> Iterable[str]:
        return [v.state.value for vs in self.by_name.values() for v in vs.values()]

    def queued_rows(self) -> list[tuple[str, int]]:
        out = []
        for name in list(self.current_version):
            mv = self.current(name)
            if mv is not None and mv.batcher is not None:
                out.append((name, mv.batcher.queued_rows))
        return out

    def knows(self, name: str) -> bool:
        return name in self.by_name

    def names(self) -> list[str]:
        return sorted(self.by_name)

    def versions(self, name: str) -> list[ModelVersion]:
        if name not in self.by_name:
            raise self.no_model(name)
        return sorted(self.by_name[name].values(), key=lambda v: version_key(v.version))

    def current(self, name: str) -> ModelVersion | None:
        version = self.current_version.get(name)
        return self.by_name.get(name, {}).get(version) if version is not None else None

    def lookup(self, name: str, version: str | None = None) -> ModelVersion:
        """The version to describe (any state); the current one when ``version`` is None
        (``name@alias`` and aliases: see :meth:`resolve`)."""
        name, version = self.resolve(name, version)
        versions = self.by_name.get(name)
        if versions is None:
            raise self.no_model(name)
        if version is None:
            current = self.current(name)
            if current is not None:
                return current
            return self.versions(name)[-1]
        if version not in versions:
            raise NotFound(f"model {name!r} has no version {version!r}; it has {sorted(versions)}")
        return versions[version]

    def serving(self, name: str, version: str | None = None) -> ModelVersion:
        """A READY version that can score now; else NotFound, VersionFailed (it FAILED: retrying
        cannot help), VersionRetired (asked for by number, replaced) or NotReady (loading,
        shutting down, or retried by a replica sync).

        The version returned is the one the scoring request in progress reached: its request
        metrics carry it (:class:`service.metrics.ServedVersion`)."""
        mv = self.answering(name, version)
        if mv.state is State.READY and mv.batcher is not None:
            served = served_version.get()
            if served is not None:
                served.model, served.version = mv.name, mv.version
            return mv
        name, version = self.resolve(name, version)
        if version is not None and mv.state is State.RETIRED:  # asked for by number
            current = self.current(name)
            now = f"version {current.version} serves" if current is not None else "none serves"
            raise VersionRetired(
                f"model {name!r} version {version} is RETIRED: stored, not loaded ({now})"
            )
        raise self.not_serving(mv)

    def answering(self, name: str, version: str | None = None) -> ModelVersion:
        """The version a request about ``name`` (and ``version``) concerns: that version, else
        the current one; with none current, one still loading (it soon serves: 503, not the 409
        of a FAILED newest), else the newest."""
        mv = self.lookup(name, version)
        if self.resolve(name, version)[1] is None and mv.state not in SERVABLE:
            mv = next((v for v in self.versions(mv.name) if v.state is State.LOADING), mv)
        return mv

    def not_serving(self, mv: ModelVersion) -> VersionFailed | NotReady:
        """Why ``mv`` cannot score now, as the error to answer."""
        where = f"model {mv.name!r} version {mv.version}"
        if mv.state is State.FAILED:
            if mv.record is not None and self._poll_interval_s > 0:
                # A stored version that failed to load here: a replica sync retries it.
                wait_s = max(1.0, mv.retry_at - time.monotonic())
                return NotReady(
                    f"{where} FAILED to load on this replica ({mv.error}); it is retried in "
                    f"{wait_s:.0f} s",
                    wait_s,
                )
            return VersionFailed(f"{where} FAILED and cannot serve: {mv.error}")
        detail = f": {mv.error}" if mv.error else ""
        return NotReady(f"{where} is {mv.state.value}{detail}")

    def no_model(self, name: str) -> NotFound:
        """No model ``name``: the message lists the models that can serve (and, apart, those
        whose versions all FAILED), and the closest name if ``name`` looks like a typo."""
        names = self.names()
        ready = [n for n in names if self.current(n) is not None]
        failed = [
            n
            for n in names
            if self.current(n) is None
            and any(v.state is State.FAILED for v in self.by_name[n].values())
        ]
        close = difflib.get_close_matches(name, names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        message = f"no model named {name!r}{hint}; ready: {some_of(ready)}"
        if failed:
            message += f"; failed, none ready: {some_of(failed)}"
        return NotFound(message)

    def add(self, mv: ModelVersion) -> None:
        self.by_name.setdefault(mv.name, {})[mv.version] = mv

    def is_known(self, mv: ModelVersion) -> bool:
        """Whether ``mv`` itself (not a newer object of the same number) is still in the table."""
        return self.by_name.get(mv.name, {}).get(mv.version) is mv

    def forget(self, name: str, doomed: Iterable[ModelVersion]) -> None:
        """Remove versions of ``name`` (the caller retires them)."""
        doomed = list(doomed)
        versions = self.by_name.get(name, {})
        for mv in doomed:
            versions.pop(mv.version, None)
        if not versions:
            self.by_name.pop(name, None)
        if self.current_version.get(name) in {mv.version for mv in doomed}:
            self.current_version.pop(name, None)


def version_key(version: str) -> tuple[int, str]:
    """Sort key: numbered versions in number order, then named ones."""
    return (int(version), "") if version.isdigit() else (1 << 62, version)


def failure_error(mv: ModelVersion) -> ModelRejected:
    return ModelRejected(f"model {mv.name!r} version {mv.version} failed: {mv.error}")
