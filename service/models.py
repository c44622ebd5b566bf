"""Model versions in memory: load → compile → warm → parity → READY, hot swap, restart recovery.

A version becomes current only once READY, and only then is it committed to the store's manifest:
a failed registration leaves the store and the serving version untouched (its uploaded blobs are
unreferenced and collected later) and gives its version number back, which the next upload gets.
Every READY version has its own batcher and device thread.
"""

from __future__ import annotations

import asyncio
import difflib
import enum
import logging
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

import compiler
import lazy as lz
from compiler.options import TreeStrategy
from service import artifacts, codecs, gcpolicy, parity, scoring
from service.admission import ScoringLoad
from service.batcher import Batcher, BatcherClosedError, BatchInfo
from service.errors import (
    Conflict,
    ModelRejected,
    NotFound,
    NotReady,
    VersionFailed,
    VersionRetired,
    http_error_for,
    some_of,
)
from service.metrics import Metrics
from service.queue_delay import QueueDelay
from service.settings import Settings
from service.store import Manifest, ModelStore, VersionRecord, validate_name

log = logging.getLogger("kestrel.models")


class State(enum.StrEnum):
    LOADING = "LOADING"
    READY = "READY"
    FAILED = "FAILED"
    RETIRED = "RETIRED"  # stored but not loaded: replaced by a newer version


class Phase(enum.StrEnum):
    """What a LOADING version is doing now."""

    QUEUED = "queued"  # waiting for the loader thread, which runs one load at a time
    COMPILING = "compiling"  # compile (or load from the cache) and warm up each bucket
    PARITY = "parity"  # check the compiled model against the source model
    STORING = "storing"  # write the upload to the store and commit it


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
    batcher: Batcher | None = None
    delay: QueueDelay | None = None  # its queue's standing delay, for load shedding
    framework: dict[str, str] = field(default_factory=dict)
    parity: dict[str, Any] | None = None
    load_seconds: float | None = None
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
        return out


@dataclass
class Prediction:
    version: ModelVersion
    outputs: dict[str, np.ndarray]
    rows: int
    decode_s: float  # host decode of the outputs; the route adds its rendering and records it
    ignored: tuple[str, ...] = ()  # the request's columns the model does not read


class ModelManager:
    """Owns every model version of this process and the path from upload to READY."""

    def __init__(
        self,
        settings: Settings,
        store: ModelStore,
        metrics: Metrics,
        cache: lz.ExecutableCache,
        scoring_load: ScoringLoad | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.metrics = metrics
        self.cache = cache
        # Admission's view of the serving versions' queues (service/queue_delay.py).
        self.scoring_load = scoring_load or ScoringLoad(settings.max_in_flight)
        self._versions: dict[str, dict[str, ModelVersion]] = {}
        self._current: dict[str, str] = {}
        self._generation = -1  # the manifest generation sync() last applied
        # The newest generation this process wrote (commit, delete): a manifest read older than
        # that predates our own write, and applying it would undo it (e.g. bring back the version
        # a local registration just replaced), so sync() skips it.
        self._floor = -1
        self._loader = ThreadPoolExecutor(1, thread_name_prefix="kestrel-compile")
        self._tasks: set[asyncio.Task[Any]] = set()
        # _lock: version numbering, store commits and deletes, and removing versions from memory.
        # _sync_lock: one replica sync (or delete / unload) at a time, so none acts on another's
        # half-applied manifest. Order: _sync_lock before _lock, never the reverse.
        self._lock = asyncio.Lock()
        self._sync_lock = asyncio.Lock()
        self.recovered = asyncio.Event()
        metrics.add_model_state_collector(self._states, [s.value for s in State])
        metrics.add_queue_collector(self._queued_rows)

    # -- queries -------------------------------------------------------------------------------
    def _states(self) -> Iterable[str]:
        return [v.state.value for vs in self._versions.values() for v in vs.values()]

    def _queued_rows(self) -> list[tuple[str, int]]:
        out = []
        for name in list(self._current):
            mv = self.current(name)
            if mv is not None and mv.batcher is not None:
                out.append((name, mv.batcher.queued_rows))
        return out

    def knows(self, name: str) -> bool:
        return name in self._versions

    def names(self) -> list[str]:
        return sorted(self._versions)

    def versions(self, name: str) -> list[ModelVersion]:
        if name not in self._versions:
            raise self._no_model(name)
        return sorted(self._versions[name].values(), key=lambda v: _version_key(v.version))

    def current(self, name: str) -> ModelVersion | None:
        version = self._current.get(name)
        return self._versions.get(name, {}).get(version) if version is not None else None

    def lookup(self, name: str, version: str | None = None) -> ModelVersion:
        """The version to describe (any state); the current one when ``version`` is None."""
        versions = self._versions.get(name)
        if versions is None:
            raise self._no_model(name)
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
        shutting down, or retried by a replica sync)."""
        mv = self.answering(name, version)
        if mv.state is State.READY and mv.batcher is not None:
            return mv
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
        if version is None and mv.state is not State.READY:
            mv = next((v for v in self.versions(name) if v.state is State.LOADING), mv)
        return mv

    def not_serving(self, mv: ModelVersion) -> VersionFailed | NotReady:
        """Why ``mv`` cannot score now, as the error to answer."""
        where = f"model {mv.name!r} version {mv.version}"
        if mv.state is State.FAILED:
            if mv.record is not None and self.settings.poll_interval_s > 0:
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

    def _no_model(self, name: str) -> NotFound:
        """No model ``name``: the message lists the models that can serve (and, apart, those
        whose versions all FAILED), and the closest name if ``name`` looks like a typo."""
        names = self.names()
        ready = [n for n in names if self.current(n) is not None]
        failed = [
            n
            for n in names
            if self.current(n) is None
            and any(v.state is State.FAILED for v in self._versions[n].values())
        ]
        close = difflib.get_close_matches(name, names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        message = f"no model named {name!r}{hint}; ready: {some_of(ready)}"
        if failed:
            message += f"; failed, none ready: {some_of(failed)}"
        return NotFound(message)

    def is_ready(self) -> bool:
        return self.recovered.is_set()

    # -- scoring -------------------------------------------------------------------------------
    async def predict(
        self,
        name: str,
        version: str | None,
        data: Any,
        *,
        outputs: tuple[str, ...] | None,
        deadline: float | None,
        strict_columns: bool = False,
    ) -> Prediction:
        """Encode ``data``, batch it with other requests, decode the heads asked for.

        Columns of ``data`` the model does not read are scored past and named in
        :attr:`Prediction.ignored`, or, with ``strict_columns``, refused (422)."""
        mv = self.serving(name, version)
        for attempt in range(3):
            assert mv.model is not None and mv.batcher is not None
            decode_seconds = self.metrics.child(
                self.metrics.codec_seconds, name, mv.version, "decode"
            )
            try:
                scored = await scoring.score(
                    mv.model,
                    mv.batcher,
                    data,
                    outputs=outputs,
                    deadline=deadline,
                    strict_columns=strict_columns,
                    dtype=mv.options.dtype,
                    decode_seconds=decode_seconds,
                )
            except BatcherClosedError:
                # A hot swap closed this version's batcher between lookup and submit: the new
                # current version answers instead (the request is not lost).
                if version is None and attempt < 2:
                    mv = self.serving(name, None)
                    continue
                raise
            return Prediction(mv, scored.outputs, scored.rows, scored.decode_s, scored.ignored)
        raise NotReady(f"model {name!r} is being replaced; retry")

    # -- registration ----------------------------------------------------------------------------
    async def register(self, upload: Upload) -> ModelVersion:
        """Validate the upload now, then compile, warm and check it in the background.

        Returns the LOADING version; its ``done`` event is set when it is READY or FAILED.
        Problems visible without compiling (name, format, trust boundary, unsupported class or
        hyper-parameter) raise here, before anything is stored.
        """
        loop = asyncio.get_running_loop()
        validate_name(upload.name, "model name")
        if upload.version is not None:
            validate_name(upload.version, "version")
        loaded = await loop.run_in_executor(None, self._validate, upload)
        async with self._lock:
            # A registration that failed before its commit holds no version: a new one may take
            # its name (or number) and replaces it here.
            taken = {
                v: mv
                for v, mv in self._versions.get(upload.name, {}).items()
                if mv.record is not None or mv.state is not State.FAILED
            }
            reserved = None
            if upload.version is not None:
                version = upload.version
                if version in taken:
                    raise Conflict(
                        f"model {upload.name!r} already has version {version!r} (leave "
                        "'version' out to number the upload automatically)"
                    )
            else:
                # Versions still LOADING are not in the store yet: number past them too.
                stored = int(await loop.run_in_executor(None, self.store.next_version, upload.name))
                local = max((int(v) for v in taken if v.isdigit()), default=0) + 1
                version = str(max(stored, local))
                reserved = str(stored)
            mv = ModelVersion(upload.name, version, loaded.format, upload.filename, upload.options)
            mv.framework = loaded.framework
            mv.progress = LoadProgress(Phase.QUEUED)
            mv.reserved = reserved
            self._versions.setdefault(upload.name, {})[version] = mv
        work = loop.run_in_executor(self._loader, self._build, mv, loaded.estimator, upload)
        self._spawn(self._finish(mv, work))
        return mv

    def _validate(self, upload: Upload) -> artifacts.LoadedArtifact:
        """Load through the trust boundary and trace (no compile): fails fast on bad uploads."""
        loaded = artifacts.load_artifact(
            upload.data,
            filename=upload.filename,
            format=upload.format,
            allow_pickle=upload.pickle_allowed,
            host_step_modules=self.settings.host_step_modules,
        )
        if loaded.format == "pickle":
            self.metrics.pickle_loads.inc()
            log.warning(
                "unpickled an upload for model %s", upload.name, extra={"model": upload.name}
            )
        compiler.trace(loaded.estimator, options=self._trace_options(upload.options))
        return loaded

    @property
    def _allow_host_steps(self) -> bool:
        """Steps the compiler cannot convert run on the host only where the operator trusts
        modules for them (``host_step_modules``): a server without them compiles everything."""
        return bool(self.settings.host_step_modules)

    def _trace_options(self, options: ModelOptions) -> compiler.CompileOptions:
        return _trace_options(options, allow_host_steps=self._allow_host_steps)

    def _build(self, mv: ModelVersion, estimator: Any, upload: Upload) -> VersionRecord:
        """Compile, warm, check parity, then store the blobs. Blocking; on the loader thread."""
        self._compile(mv, estimator, upload.sample)
        if mv.progress is not None:
            mv.progress = replace(mv.progress, phase=Phase.STORING)
        artifact = self.store.put_blob(upload.data)
        sample = None
        if upload.sample is not None:
            # NaN kept: the sample's missing values mean the same on every reload.
            sample = self.store.put_blob(codecs.dumps_keeping_nan(upload.sample))
        return VersionRecord(
            name=mv.name,
            version=mv.version,
            artifact=artifact,
            format=mv.format,
            filename=mv.filename,
            options=mv.options.model_dump(),
            sample=sample,
            created=mv.created,
            metadata={"framework": mv.framework, "parity": mv.parity},
            plan=_plan_dict(mv.model),
        )

    async def _finish(
        self, mv: ModelVersion, work: asyncio.Future[VersionRecord], *, commit: bool = True
    ) -> None:
        """Await the blocking load, commit a new upload to the manifest, and make the version
        current; or mark it FAILED with the reason. Reloads of stored versions don't commit."""
        t0 = time.perf_counter()
        try:
            record = await work
            # Under the lock a delete can not slip in between this check and the commit (it would
            # remove the model from the store, then our commit would bring it back).
            async with self._lock:
                if self._versions.get(mv.name, {}).get(mv.version) is not mv:
                    raise NotFound(
                        f"model {mv.name!r} version {mv.version} was deleted while loading"
                    )
                if commit:
                    loop = asyncio.get_running_loop()
                    manifest = await loop.run_in_executor(None, self.store.commit, record)
                    self._floor = max(self._floor, manifest.generation)
                    mv.generation = manifest.generation
                mv.record = record
                mv.load_seconds = time.perf_counter() - t0
                mv.failed_loads = 0
                self._activate(mv)
        except Exception as exc:  # every failure becomes the version's visible reason
            mv.state, mv.error = State.FAILED, _reason(exc)
            mv.load_seconds = time.perf_counter() - t0
            self.metrics.model_loads.labels("failed").inc()
            self.metrics.model_load_seconds.labels("failed").observe(mv.load_seconds)
            retry = ""
            if not commit:
                # A stored version passed its checks when it was registered, so failing here is
                # most likely this replica's trouble (store hiccup, memory): retry on a later
                # sync, backing off, and meanwhile keep serving what this replica serves now.
                mv.failed_loads += 1
                delay = self._retry_delay(mv.failed_loads)
                mv.retry_at = time.monotonic() + delay
                retry = f" (failed load {mv.failed_loads}; a sync retries in {delay:.1f} s)"
            log.warning(
                "model %s version %s failed: %s%s",
                mv.name,
                mv.version,
                mv.error,
                retry,
                extra={"model": mv.name, "version": mv.version},
            )
            self._stop_executor(mv)
            if commit and mv.record is None:
                await self._release_number(mv)
            mv.done.set()

    async def _release_number(self, mv: ModelVersion) -> None:
        """Give a failed upload's reserved number back to the store (FAILED first, under the
        lock, so that a registration numbering meanwhile does not count it): the next upload
        gets it, unless a later one reserved a number meanwhile."""
        reserved, mv.reserved = mv.reserved, None
        if reserved is None:
            return
        async with self._lock:
            loop = asyncio.get_running_loop()
            try:
                manifest = await loop.run_in_executor(
                    None, self.store.release_version, mv.name, reserved
                )
            except Exception as exc:  # the number stays used; nothing else is wrong
                log.warning(
                    "model %s: could not give back version number %s: %s",
                    mv.name,
                    reserved,
                    exc,
                    extra={"model": mv.name, "version": mv.version},
                )
                return
            if manifest is not None:
                self._floor = max(self._floor, manifest.generation)

    def _compile(
        self, mv: ModelVersion, estimator: Any, sample: Any, plan: lz.ExecutionPlan | None = None
    ) -> None:
        """Compile every bucket (or load it from the disk cache), run it, check parity. Blocking.
        ``mv.progress`` follows along, for clients polling the version. ``plan``: the stored
        version's execution plan, followed where it still matches this process."""
        mv.progress = LoadProgress(Phase.COMPILING)
        opts = mv.options
        max_batch = opts.max_batch or self.settings.max_batch
        options = compiler.CompileOptions(
            dtype=opts.dtype,
            tree_strategy=opts.tree_strategy,
            methods=tuple(opts.methods) if opts.methods else None,
            max_batch=max_batch,
            # The batcher never hands the model a batch of more rows than max_batch: larger
            # buckets would be compiled at warm-up and never run.
            call_rows=max_batch,
            allow_host_steps=self._allow_host_steps,
            cache=self.cache,
            warmup=False,  # below, bucket by bucket
            plan=plan,
        )
        schema_sample = None
        if sample is not None:
            schema = compiler.trace(estimator, options=self._trace_options(opts)).schema
            schema_sample = parity.source_input(schema, sample)
        model = compiler.compile(estimator, sample=schema_sample, options=options)
        refused = model.compiled.plan_refused
        if plan is not None and refused is not None:
            # Answers may differ in the last float32 bit from replicas that follow the plan.
            log.warning(
                "model %s version %s: not following its stored execution plan (%s); "
                "placing its buckets anew",
                mv.name,
                mv.version,
                refused,
                extra={"model": mv.name, "version": mv.version},
            )
        total = model.compiled.bucket_count
        mv.progress = LoadProgress(Phase.COMPILING, 0, total)

        def warmed(bucket: lz.WarmedBucket) -> None:
            mv.progress = LoadProgress(Phase.COMPILING, bucket.done, total)

        model.compiled.warmup(on_bucket=warmed)
        mv.progress = LoadProgress(Phase.PARITY, total, total)
        result = parity.gate(
            estimator,
            model,
            schema_sample,
            synthetic_rows=self.settings.parity_rows,
            probe_rows=self.settings.parity_probe_rows,
            rtol=self.settings.parity_rtol,
            atol=self.settings.parity_atol,
        )
        mv.parity = result.as_dict()
        if not result.ok:
            raise parity.ParityError(
                f"parity check failed on {result.source} and probe rows: {result.problem}"
            )
        mv.model = model

    def _activate(self, mv: ModelVersion) -> None:
        """READY: give the version a batcher and make it current; retire the previous one.

        A version chosen by an older manifest than the one now current (a slow replica-sync load
        overtaken by a local registration, or two local uploads finishing out of order) does not
        replace it: it is RETIRED at once, as in the store.
        """
        assert mv.model is not None
        previous = self.current(mv.name)
        if previous is not None and previous is not mv and previous.generation > mv.generation:
            mv.state, mv.model = State.RETIRED, None
            log.info(
                "model %s version %s loaded but version %s is newer in the store; not serving it",
                mv.name,
                mv.version,
                previous.version,
                extra={"model": mv.name, "version": mv.version},
            )
            mv.done.set()
            return
        mv.executor = ThreadPoolExecutor(1, thread_name_prefix=f"kestrel-{mv.name}")
        buckets = lz.Buckets(mv.model.options.max_batch)
        name, version = mv.name, mv.version

        def on_batch(info: BatchInfo) -> None:
            if info.queue_s:
                waiting = batcher.queued_rows > 0
                delay.observe(
                    min(info.queue_s), waiting=waiting, rows=info.rows, parts=info.requests
                )
            m = self.metrics
            if info.error is not None:  # its waiters get the error; nothing was computed
                m.rejections.labels(name, "failed_batch").inc(info.requests)
                return
            m.child(m.compute_seconds, name, version).observe(info.compute_s)
            m.child(m.batch_rows, name, version).observe(info.rows)
            m.child(m.rows, name, version).inc(info.rows)
            padded = sum(
                buckets.sizes[buckets.index(stop - start)] - (stop - start)
                for start, stop in buckets.chunks(info.rows)
            )
            m.child(m.padded_rows, name, version).inc(padded)
            queue_seconds = m.child(m.queue_seconds, name, version)
            for q in info.queue_s:
                queue_seconds.observe(q)

        mv.batcher = batcher = Batcher(
            mv.model.run_encoded,
            max_batch_rows=buckets.max_batch,
            max_queue_rows=self.settings.max_queue_rows,
            executor=mv.executor,
            max_wait_s=self.settings.batch_wait_ms / 1e3,
            on_batch=on_batch,
        )
        mv.delay = delay = self.scoring_load.track(
            name,
            target_s=self.settings.queue_delay_target_ms / 1e3,
            interval_s=self.settings.queue_delay_interval_ms / 1e3,
            batch_rows=buckets.max_batch,
        )
        batcher.start()
        gcpolicy.settle()
        mv.state = State.READY
        self._current[mv.name] = mv.version
        self.metrics.model_loads.labels("ready").inc()
        self.metrics.model_load_seconds.labels("ready").observe(mv.load_seconds or 0.0)
        self.metrics.model_info.labels(mv.name, mv.version, mv.state.value, mv.format).set(1)
        log.info(
            "model %s version %s READY in %.2f s",
            mv.name,
            mv.version,
            mv.load_seconds or 0.0,
            extra={"model": mv.name, "version": mv.version},
        )
        mv.done.set()
        if previous is not None and previous is not mv:
            self._spawn(self._retire(previous))

    async def _retire(self, mv: ModelVersion) -> None:
        """Stop serving an old version: finish what it queued, then free it (RETIRED)."""
        # Detach everything first: while the old batcher drains, a delete of the newer version
        # may bring this one back (``_activate`` gives it a new batcher and executor), and those
        # must survive this retirement.
        batcher, executor, state = mv.batcher, mv.executor, mv.state
        if state is State.READY:
            mv.state = State.RETIRED
        if mv.delay is not None:  # a no-op once a newer version of the model is tracked
            self.scoring_load.untrack(mv.name, mv.delay)
        mv.batcher, mv.model, mv.executor, mv.delay = None, None, None, None
        if batcher is not None:
            await batcher.close(drain=True)
        if executor is not None:
            executor.shutdown(wait=False)
        if mv.state is not State.READY:  # not brought back meanwhile
            self.metrics.observe_model_gone(mv.name, mv.version, state.value, mv.format)

    def _stop_executor(self, mv: ModelVersion) -> None:
        if mv.executor is not None:
            mv.executor.shutdown(wait=False)
            mv.executor = None

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- deletion --------------------------------------------------------------------------------
    async def delete(self, name: str, version: str | None = None) -> None:
        """Delete a model, or one version. Deleting the current version first brings back the
        version the store makes current instead (from the executable cache when warm), so
        serving never stops while another version exists."""
        async with self._sync_lock:
            versions = self._versions.get(name)
            if versions is None:
                raise self._no_model(name)
            if version is not None and version not in versions:
                raise NotFound(f"model {name!r} has no version {version!r}")
            manifest = None
            if version is None or versions[version].record is not None:  # committed: in the store
                async with self._lock:
                    manifest = await self._store_delete(name, version)
            if version is not None and self._current.get(name) == version and manifest:
                entry = manifest.models.get(name)
                back = versions.get(entry.current) if entry and entry.current else None
                if back is not None and self._needs_load(back, force=True):
                    await self._load_stored(back, manifest.generation)  # current; old one retired
            async with self._lock:
                versions = self._versions.get(name, {})
                names = [version] if version is not None else list(versions)
                doomed = [versions[v] for v in names if v in versions]
                self._forget(name, doomed)
        for mv in doomed:
            await self._retire(mv)

    async def _store_delete(self, name: str, version: str | None) -> Manifest:
        """Delete from the store; the manifest after it (as it is, if already gone there)."""
        loop = asyncio.get_running_loop()
        try:
            manifest = await loop.run_in_executor(None, self.store.delete, name, version)
        except Exception as exc:
            if not isinstance(http_error_for(exc), NotFound):
                raise
            # Another replica deleted it first: nothing written, the store is already right.
            return await loop.run_in_executor(None, self.store.load_manifest)
        self._floor = max(self._floor, manifest.generation)
        return manifest

    def _forget(self, name: str, doomed: list[ModelVersion]) -> None:
        """Remove versions of ``name`` from memory (the caller holds ``_lock`` and retires them)."""
        versions = self._versions.get(name, {})
        for mv in doomed:
            versions.pop(mv.version, None)
        if not versions:
            self._versions.pop(name, None)
        if self._current.get(name) in {mv.version for mv in doomed}:
            self._current.pop(name, None)

    async def unload(self, name: str) -> None:
        """Stop serving ``name`` in this process; the store keeps it (``sync(force=True)`` reloads,
        and so does any later sync that finds the manifest changed)."""
        async with self._sync_lock, self._lock:
            versions = self._versions.pop(name, None)
            if versions is None:
                raise NotFound(f"no model named {name!r} is loaded; loaded: {self.names()}")
            self._current.pop(name, None)
        for mv in versions.values():
            await self._retire(mv)
            self.metrics.observe_model_gone(mv.name, mv.version, mv.state.value, mv.format)

    # -- restart recovery and replica sync -------------------------------------------------------
    async def recover(self) -> None:
        """Load every current version of the manifest (from the disk cache when warm)."""
        try:
            await self.sync()
        finally:
            self.recovered.set()

    async def sync(self, *, force: bool = False) -> None:
        """Bring memory in line with the store's manifest (another replica may have changed it).

        Learn the manifest's new versions, load each model's current version where this process
        does not serve it (the old one keeps serving until the new one is READY, then is RETIRED),
        and drop versions and models deleted from it. A current version whose load failed here is
        retried once its back-off has passed (``force``: at once). Models this process unloaded
        come back only with ``force`` or a changed manifest.
        """
        async with self._sync_lock:
            loop = asyncio.get_running_loop()
            manifest = await loop.run_in_executor(None, self.store.load_manifest)
            if manifest.generation < self._floor:
                return  # read before our own latest write landed: the next sync sees both
            changed = force or manifest.generation != self._generation
            self._generation = manifest.generation
            loads = []
            for name, entry in manifest.models.items():
                # Unchanged, only models still known here: one unloaded on purpose stays so.
                if changed or name in self._versions:
                    self._adopt(name, entry.versions.values())
                want = self._versions.get(name, {}).get(entry.current or "")
                if want is not None and self._needs_load(want, force=force):
                    loads.append(self._load_stored(want, manifest.generation))
            await asyncio.gather(*loads)
            if changed:
                await self._drop_deleted(manifest)

    def _adopt(self, name: str, records: Iterable[VersionRecord]) -> None:
        """Know every stored version of ``name`` (RETIRED: stored, not loaded)."""
        known = self._versions.setdefault(name, {})
        for record in records:
            mine = known.get(record.version)
            # A local upload still LOADING has no record yet and is left alone: it commits (or
            # fails with a version conflict) by itself. One that FAILED here, e.g. because another
            # replica committed the same version name first, gives way to the stored version.
            if mine is not None and (mine.record is not None or mine.state is not State.FAILED):
                continue
            mv = ModelVersion(
                name,
                record.version,
                record.format,
                record.filename,
                ModelOptions.model_validate(record.options),
                created=record.created,
                record=record,
                state=State.RETIRED,
            )
            mv.framework = dict(record.metadata.get("framework", {}))
            mv.parity = record.metadata.get("parity")
            known[record.version] = mv

    def _needs_load(self, mv: ModelVersion, *, force: bool = False) -> bool:
        """Whether stored version ``mv``, current in the store, must be loaded here now."""
        if mv.record is None:
            return False  # a local upload: it becomes READY through its own registration
        if mv.state is State.RETIRED:
            return True
        return mv.state is State.FAILED and (force or time.monotonic() >= mv.retry_at)

    async def _load_stored(self, mv: ModelVersion, generation: int) -> None:
        """Load a stored version (disk cache when warm) and make it current, as of ``generation``."""
        assert mv.record is not None
        mv.state, mv.error, mv.done = State.LOADING, None, asyncio.Event()
        mv.progress = LoadProgress(Phase.QUEUED)
        mv.generation = generation
        work = asyncio.get_running_loop().run_in_executor(self._loader, self._reload, mv, mv.record)
        await self._finish(mv, work, commit=False)

    async def _drop_deleted(self, manifest: Manifest) -> None:
        """Retire and forget stored versions (and models) that ``manifest`` no longer has."""
        async with self._lock:
            if manifest.generation < self._floor:
                return  # a local commit or delete landed while we were loading: manifest is stale
            dropped: list[ModelVersion] = []
            for name, versions in list(self._versions.items()):
                entry = manifest.models.get(name)
                doomed = [
                    mv
                    for mv in versions.values()
                    # record None: a local upload not committed yet, not a deleted one
                    if mv.record is not None and (entry is None or mv.version not in entry.versions)
                ]
                if doomed:
                    self._forget(name, doomed)
                    dropped.extend(doomed)
        for mv in dropped:
            log.info(
                "model %s version %s was deleted from the store; dropped",
                mv.name,
                mv.version,
                extra={"model": mv.name, "version": mv.version},
            )
            await self._retire(mv)

    def _retry_delay(self, failures: int) -> float:
        """Back-off before a replica sync retries a failed reload: doubling, at most 5 minutes."""
        base = self.settings.poll_interval_s or 1.0
        return min(base * 2 ** (failures - 1), 300.0)

    def _reload(self, mv: ModelVersion, record: VersionRecord) -> VersionRecord:
        data = self.store.get_blob(record.artifact)
        sample = (
            codecs.loads(self.store.get_blob(record.sample), allow_nan=True)
            if record.sample
            else None
        )
        loaded = artifacts.load_artifact(
            data,
            filename=record.filename,
            format=record.format,
            allow_pickle=record.format == "pickle",
            host_step_modules=self.settings.host_step_modules,
        )
        mv.framework = loaded.framework
        self._compile(mv, loaded.estimator, sample, _stored_plan(mv, record))
        return record

    async def wait(self, mv: ModelVersion, timeout: float) -> bool:
        try:
            await asyncio.wait_for(mv.done.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def close(self) -> None:
        """Graceful shutdown: every batcher drains its queue."""
        for versions in list(self._versions.values()):
            for mv in versions.values():
                if mv.batcher is not None:
                    await mv.batcher.close(drain=True)
                self._stop_executor(mv)
        for task in list(self._tasks):
            task.cancel()
        self._loader.shutdown(wait=False, cancel_futures=True)


def _trace_options(
    options: ModelOptions, *, allow_host_steps: bool = False
) -> compiler.CompileOptions:
    """Options to trace only (to check support or read the schema): nothing is compiled."""
    return compiler.CompileOptions(
        dtype=options.dtype,
        tree_strategy=options.tree_strategy,
        methods=tuple(options.methods) if options.methods else None,
        allow_host_steps=allow_host_steps,
        backend="interpreter",
        warmup=False,
    )


def _plan_dict(model: compiler.CompiledModel | None) -> dict[str, Any] | None:
    plan = None if model is None else model.plan
    return None if plan is None else plan.as_dict()


def _stored_plan(mv: ModelVersion, record: VersionRecord) -> lz.ExecutionPlan | None:
    """The record's execution plan; None (with a warning) if it has none or it is unreadable."""
    if record.plan is None:
        return None  # registered before plans were stored: placed anew here
    try:
        return lz.ExecutionPlan.from_dict(record.plan)
    except lz.PlanError as exc:
        log.warning(
            "model %s version %s: its stored execution plan is unreadable (%s); placing anew",
            mv.name,
            mv.version,
            exc,
            extra={"model": mv.name, "version": mv.version},
        )
        return None


def _reason(exc: BaseException) -> str:
    mapped = http_error_for(exc)
    text = mapped.message if mapped is not None else f"{type(exc).__name__}: {exc}"
    return text or type(exc).__name__


def _version_key(version: str) -> tuple[int, str]:
    return (int(version), "") if version.isdigit() else (1 << 62, version)


def failure_error(mv: ModelVersion) -> ModelRejected:
    return ModelRejected(f"model {mv.name!r} version {mv.version} failed: {mv.error}")
