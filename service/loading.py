"""The blocking half of a version's load: trust boundary, compile, warm-up, parity, blobs.

Everything here runs off the event loop. Compiles run one at a time on the loader's own thread
(:meth:`Loader.submit`), so two uploads do not fight over the cores and a client polling the
version sees its :class:`~service.versions.LoadProgress` advance; validation runs on the default
executor, so a bad upload is refused at once even while another model compiles.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, TypeVar

import compiler
import lazy as lz
from service import artifacts, codecs, parity, runtime
from service.codecs import head
from service.drift_reference import MAX_REFERENCE_ROWS, Reference, build_reference
from service.metrics import Metrics
from service.settings import Settings
from service.store import ModelStore, VersionRecord
from service.versions import (
    LoadPhase,
    LoadProgress,
    ModelOptions,
    ModelVersion,
    Phase,
    Upload,
)

log = logging.getLogger("kestrel.models")

T = TypeVar("T")


class Loader:
    """Turns an upload, or a stored record, into a checked compiled model."""

    def __init__(
        self, settings: Settings, store: ModelStore, metrics: Metrics, cache: lz.ExecutableCache
    ) -> None:
        self.settings = settings
        self.store = store
        self.metrics = metrics
        self.cache = cache
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="kestrel-compile")

    def submit(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Run ``fn(*args)`` on the loader thread, after the loads queued before it."""
        return asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    def prepare_runtime(self) -> asyncio.Future[None]:
        """The process's one-time work (:mod:`service.runtime`), queued before any load."""
        return self.submit(runtime.prepare_logged)

    def shutdown(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)

    @property
    def allow_host_steps(self) -> bool:
        """Steps the compiler cannot convert run on the host only where the operator trusts
        modules for them (``host_step_modules``): a server without them compiles everything."""
        return bool(self.settings.host_step_modules)

    def _trace_options(self, options: ModelOptions) -> compiler.CompileOptions:
        """Options to trace only (to check support or read the schema): nothing is compiled."""
        return options.compile_options(
            allow_host_steps=self.allow_host_steps, backend="interpreter", warmup=False
        )

    def validate(self, upload: Upload) -> artifacts.LoadedArtifact:
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
        # An explanation may need the sample's rows (a linear model's background): checked here
        # with them. Otherwise a bad sample fails the version's load, which reports it.
        sample = None
        if upload.options.explain and upload.sample is not None:
            schema = compiler.schema_for(loaded.estimator)
            sample = parity.source_input(schema, upload.sample)
        options = self._trace_options(upload.options)
        compiler.trace(loaded.estimator, sample=sample, options=options)
        return loaded

    @contextmanager
    def _phase(self, mv: ModelVersion, phase: LoadPhase) -> Iterator[None]:
        """Time one phase of ``mv``'s load: into the version's ``load_phases`` and the
        phase histogram, so an operator sees where a slow load spends its time."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            seconds = time.perf_counter() - t0
            # Replaced whole, as progress is: a reader on the event loop iterates it.
            mv.load_phases = {**mv.load_phases, phase: mv.load_phases.get(phase, 0.0) + seconds}
            self.metrics.model_load_phase_seconds.labels(phase.value).observe(seconds)

    def build(self, mv: ModelVersion, estimator: Any, upload: Upload) -> VersionRecord:
        """Compile, warm, check parity, then store the blobs: the record to commit."""
        self.compile(mv, estimator, upload.sample)
        if mv.progress is not None:
            mv.progress = replace(mv.progress, phase=Phase.STORING)
        with self._phase(mv, LoadPhase.STORE):
            artifact = self.store.put_blob(upload.data)
            sample = None
            if upload.sample is not None:
                # NaN kept: the sample's missing values mean the same on every reload.
                sample = self.store.put_blob(codecs.dumps_keeping_nan(upload.sample))
        model = mv.model  # read once: a delete while loading may clear it meanwhile
        plan = None if model is None or model.plan is None else model.plan.as_dict()
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
            plan=plan,
        )

    def reload(self, mv: ModelVersion, record: VersionRecord) -> VersionRecord:
        """Load a stored version again, following its stored execution plan."""
        with self._phase(mv, LoadPhase.READ):
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
        self.compile(mv, loaded.estimator, sample, stored_plan(record))
        return record

    def revive(self, mv: ModelVersion) -> VersionRecord:
        """Load an UNLOADED version again from what it kept (its source estimator and sample)
        and the executable cache, following its stored plan (service.residency). Without the
        parity gate: this process gated this version, plan and executables when it first loaded
        it, and its answers come from the same executables (keys, checksums)."""
        assert mv.record is not None
        if mv.source is None:  # unloaded without its estimator (none kept): read it again
            return self.reload(mv, mv.record)
        self.compile(mv, mv.source, mv.sample, stored_plan(mv.record), gate=False)
        return mv.record

    def compile(
        self,
        mv: ModelVersion,
        estimator: Any,
        sample: Any,
        plan: lz.ExecutionPlan | None = None,
        *,
        gate: bool = True,
    ) -> None:
        """Compile every bucket (or load it from the disk cache), run it, check parity (unless
        ``gate`` is off); sets ``mv.model``. ``mv.progress`` follows along, for clients polling
        the version. ``plan``: the stored version's execution plan, followed where it still
        matches this process."""
        mv.progress = LoadProgress(Phase.COMPILING)
        opts = mv.options
        max_batch = opts.max_batch or self.settings.max_batch
        options = opts.compile_options(
            max_batch=max_batch,
            # The batcher never hands the model a batch of more rows than max_batch: larger
            # buckets would be compiled at warm-up and never run.
            call_rows=max_batch,
            allow_host_steps=self.allow_host_steps,
            cache=self.cache,
            warmup=False,  # below, bucket by bucket
            plan=plan,
            **({} if self.settings.host_rows is None else {"host_rows": self.settings.host_rows}),
        )
        # The columns alone put the sample in the source's form: no trace needed before the
        # compile's own.
        with self._phase(mv, LoadPhase.TRACE):
            schema_sample = (
                None
                if sample is None
                else parity.source_input(compiler.schema_for(estimator), sample)
            )
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

        with self._phase(mv, LoadPhase.BUCKETS):
            model.compiled.warmup(on_bucket=warmed)
            if model.explains:  # a READY version never compiles for a request
                model.warm_explanation()
        mv.sample = sample
        if not gate:
            mv.model, mv.source = model, estimator
            return
        mv.progress = LoadProgress(Phase.PARITY, total, total)
        with self._phase(mv, LoadPhase.PARITY):
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
        mv.reference = _reference(model, schema_sample)
        mv.model = model
        mv.source = estimator  # live parity rescores sampled rows with it (service.live_parity)


def _reference(model: compiler.CompiledModel, sample: Any) -> Reference:
    """The drift reference of ``model`` from its registration sample (None: none was given)
    and its fitted steps' statistics."""
    try:
        fitted = model.statistics
    except Exception as exc:  # monitoring is no reason to refuse a model that passed parity
        log.warning("fitted statistics for the drift reference failed (%s); using none", exc)
        fitted = ()
    if sample is not None:
        cut = head(sample, MAX_REFERENCE_ROWS)
        sample = sample if cut is None else cut
        try:
            answers = model.outputs(sample)
            return build_reference(model.schema, sample, answers, model.classes_, fitted)
        except Exception as exc:  # monitoring is no reason to refuse a model that passed parity
            log.warning(
                "drift reference from the sample failed (%s); using the fitted statistics", exc
            )
    return build_reference(model.schema, None, None, None, fitted)


def stored_plan(record: VersionRecord) -> lz.ExecutionPlan | None:
    """The record's execution plan; None (with a warning) if it has none or it is unreadable
    (the version is then placed anew)."""
    if record.plan is None:
        return None  # registered before plans were stored: placed anew here
    try:
        return lz.ExecutionPlan.from_dict(record.plan)
    except lz.PlanError as exc:
        log.warning(
            "model %s version %s: its stored execution plan is unreadable (%s); placing anew",
            record.name,
            record.version,
            exc,
            extra={"model": record.name, "version": record.version},
        )
        return None
