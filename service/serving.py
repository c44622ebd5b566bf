"""A READY version's serving machinery: its batcher, device thread and queue-delay tracking,
the per-batch metrics, and the orderly stop when the version is replaced or deleted.

A version registered with ``explain`` has a second batcher, for its contributions, on the same
device thread: explanations batch across requests as predictions do, but apart from them, so a
prediction never waits in a batch for an explanation's far costlier compute."""

from __future__ import annotations

from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import lazy as lz
from service.admission import ScoringLoad
from service.batcher import Batcher, BatchInfo
from service.metrics import Metrics
from service.settings import Settings
from service.versions import SERVABLE, ModelVersion, State


class Serving:
    """Starts and stops the machinery that lets a version answer requests."""

    def __init__(self, settings: Settings, metrics: Metrics, scoring_load: ScoringLoad) -> None:
        self.settings = settings
        self.metrics = metrics
        self.scoring_load = scoring_load

    def start(self, mv: ModelVersion) -> None:
        """Give ``mv`` (compiled and checked) a device thread and a started batcher."""
        assert mv.model is not None
        mv.executor = ThreadPoolExecutor(1, thread_name_prefix=f"kestrel-{mv.name}")
        buckets = lz.Buckets(mv.model.options.max_batch)
        name, version, m = mv.name, mv.version, self.metrics

        def on_batch(info: BatchInfo) -> None:
            if info.queue_s:
                waiting = batcher.queued_rows > 0
                delay.observe(
                    min(info.queue_s), waiting=waiting, rows=info.rows, parts=info.requests
                )
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
        mv.explainer = self._explainer(mv) if mv.model.explains else None

    def _explainer(self, mv: ModelVersion) -> Batcher:
        """A started batcher of ``mv``'s contributions, on its device thread, in batches of at
        most the explanation program's largest bucket (warmed at load: service.loading)."""
        assert mv.model is not None and mv.executor is not None
        name, version, m = mv.name, mv.version, self.metrics

        def on_batch(info: BatchInfo) -> None:
            if info.error is not None:
                m.rejections.labels(name, "failed_batch").inc(info.requests)
                return
            m.child(m.explain_compute_seconds, name, version).observe(info.compute_s)
            m.child(m.explain_batch_rows, name, version).observe(info.rows)

        explainer = Batcher(
            mv.model.explain_encoded,
            max_batch_rows=mv.model.explanation_rows,
            max_queue_rows=self.settings.max_queue_rows,
            executor=mv.executor,
            max_wait_s=self.settings.batch_wait_ms / 1e3,
            on_batch=on_batch,
        )
        explainer.start()
        return explainer

    async def stop(self, mv: ModelVersion) -> None:
        """Stop serving ``mv``: finish what it queued, then free it (RETIRED if it was READY or
        UNLOADED)."""
        state = mv.state
        if state in SERVABLE:
            mv.state = State.RETIRED
        await self._free(mv, state)

    def unload(self, mv: ModelVersion) -> Coroutine[Any, Any, None]:
        """UNLOADED now: then (awaited) free ``mv``'s compiled model, batcher and executor once
        what it queued is done, keeping its source estimator to load it again
        (service.residency)."""
        state, mv.state = mv.state, State.UNLOADED
        return self._free(mv, state, keep_source=True)

    async def _free(self, mv: ModelVersion, state: State, *, keep_source: bool = False) -> None:
        # Detach everything first: while the old batcher drains, a delete of the newer version
        # may bring this one back (``start`` gives it a new batcher and executor), and those
        # must survive this stop.
        batcher, explainer, executor = mv.batcher, mv.explainer, mv.executor
        if mv.delay is not None:  # a no-op once a newer version of the model is tracked
            self.scoring_load.untrack(mv.name, mv.delay)
        mv.batcher, mv.model, mv.executor, mv.delay = None, None, None, None
        mv.explainer = None
        if not keep_source:
            mv.source = None
        if batcher is not None:
            await batcher.close(drain=True)
        if explainer is not None:
            await explainer.close(drain=True)
        if executor is not None:
            executor.shutdown(wait=False)
        if mv.state is not State.READY:  # not brought back meanwhile
            self.metrics.observe_model_gone(mv.name, mv.version, state.value, mv.format)

    @staticmethod
    def stop_executor(mv: ModelVersion) -> None:
        if mv.executor is not None:
            mv.executor.shutdown(wait=False)
            mv.executor = None
