"""Model versions' lifecycle: upload → LOADING → READY, hot swap, delete, restart recovery and
replica sync.

A version becomes current only once READY, and only then is it committed to the store's manifest:
a failed registration leaves the store and the serving version untouched (its uploaded blobs are
unreferenced and collected later) and gives its version number back, which the next upload gets.
Every READY version has its own batcher and device thread (:mod:`service.serving`). The blocking
work of a load is :mod:`service.loading`'s; the table of versions and its queries are
:mod:`service.versions`'.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from functools import partial
from typing import Any

import lazy as lz
from service import gcpolicy, scoring
from service.admission import ScoringLoad
from service.batcher import BatcherClosedError
from service.capture import Capture
from service.drift import DriftMonitor
from service.errors import Conflict, NotFound, NotReady, http_error_for
from service.live_parity import LiveParity
from service.loading import Loader
from service.metrics import Metrics
from service.residency import Residency
from service.serving import Serving
from service.settings import Settings
from service.shadow import Divergence, Mirror
from service.shadow_rule import Shadow, ShadowRule, Tally, Verdict
from service.store import Manifest, ModelStore, VersionRecord, validate_name
from service.versions import (
    SERVABLE,
    LoadProgress,
    ModelOptions,
    ModelVersion,
    Phase,
    Prediction,
    State,
    Upload,
    Versions,
)

log = logging.getLogger("kestrel.models")

#: Who the version history says promoted a shadow by its rule.
RULE_ACTOR = "shadow-rule"


class ModelManager(Versions):
    """Owns every model version of this process and moves them through their lifecycle; the
    queries (which version answers a request) are :class:`~service.versions.Versions`'."""

    def __init__(
        self,
        settings: Settings,
        store: ModelStore,
        metrics: Metrics,
        cache: lz.ExecutableCache,
        scoring_load: ScoringLoad | None = None,
    ) -> None:
        super().__init__(settings.poll_interval_s)
        self.settings = settings
        self.store = store
        self.metrics = metrics
        # Admission's view of the serving versions' queues (service/queue_delay.py).
        self.scoring_load = scoring_load or ScoringLoad(settings.max_in_flight)
        self.loader = Loader(settings, store, metrics, cache)
        self._serving = Serving(settings, metrics, self.scoring_load)
        self.residency = Residency(settings.max_loaded_models, frozenset(settings.pinned_models))
        self.mirror = Mirror(metrics)
        # What this replica's mirrors compared, per shadow setting with a rule.
        self._tallies: dict[tuple[str, Shadow], Tally] = {}
        self.live_parity = LiveParity(settings, metrics)
        self.drift = DriftMonitor(settings, metrics)
        self.capture = Capture(settings, store, metrics)
        self._generation = -1  # the manifest generation sync() last applied
        self._synced = -1  # the same, once that sync's loads and drops were over
        # The newest generation this process wrote (commit, delete): a manifest read older than
        # that predates our own write, and applying it would undo it (e.g. bring back the version
        # a local registration just replaced), so sync() skips it.
        self._floor = -1
        self._tasks: set[asyncio.Task[Any]] = set()
        # _lock: version numbering, store commits and deletes, and removing versions from memory.
        # _sync_lock: one replica sync (or delete / unload) at a time, so none acts on another's
        # half-applied manifest. Order: _sync_lock before _lock, never the reverse.
        self._lock = asyncio.Lock()
        self._sync_lock = asyncio.Lock()
        self.recovered = asyncio.Event()
        metrics.add_model_state_collector(self.states, [s.value for s in State])
        metrics.add_queue_collector(self.queued_rows)

    def is_ready(self) -> bool:
        return self.recovered.is_set()

    @property
    def written_generation(self) -> int:
        """The newest manifest generation this process wrote (-1: none)."""
        return self._floor

    @property
    def synced_generation(self) -> int:
        """The manifest generation the last completed sync applied, its loads over (-1: none
        yet)."""
        return self._synced

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
        route_key: str | None = None,
    ) -> Prediction:
        """Encode ``data``, batch it with other requests, decode the heads asked for; an
        unversioned request of a model whose traffic is split goes where :meth:`route` sends
        ``route_key``.

        Columns of ``data`` the model does not read are scored past and named in
        :attr:`Prediction.ignored`, or, with ``strict_columns``, refused (422)."""
        mv = await self.ensure_loaded(name, self.route(name, version, route_key))
        for attempt in range(3):
            assert mv.model is not None and mv.batcher is not None
            decode_seconds = self.metrics.child(
                self.metrics.codec_seconds, mv.name, mv.version, "decode"
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
                    explainer=mv.explainer,
                )
            except BatcherClosedError:
                # A hot swap closed this version's batcher between lookup and submit: the new
                # current version answers instead (the request is not lost). Or the budget
                # unloaded it meanwhile: it is loaded again.
                unloaded = mv.state is State.UNLOADED
                if (version is None or unloaded) and attempt < 2:
                    route = self.route(name, None, route_key) if version is None else version
                    mv = await self.ensure_loaded(name, route)
                    continue
                raise
            answer, asked = scored.outputs, outputs
            if scoring.CONTRIBUTIONS in answer:  # a shadow compares the methods' answers alone
                answer = {k: v for k, v in answer.items() if k != scoring.CONTRIBUTIONS}
                asked = tuple(answer)
            if answer:
                self._mirror(mv, data, asked, answer, scored.rows)
            if self.residency.short:  # versions left loaded over the budget, busy then
                self._keep_within_budget()
            self.live_parity.offer(mv, data, scored.outputs, scored.rows)
            self.drift.offer(mv, data, scored.outputs, scored.rows)
            self.capture.offer(mv, data, scored.outputs, scored.rows)
            return Prediction(
                mv, scored.outputs, scored.rows, scored.decode_s, scored.ignored, scored.explained
            )
        raise NotReady(f"model {name!r} is being replaced; retry")

    async def ensure_loaded(self, name: str, version: str | None = None) -> ModelVersion:
        """The READY version that answers (:meth:`serving`), loaded again first where the budget
        unloaded it (service.residency): concurrent requests share one load."""
        for _ in range(3):  # other loads may unload it again before this request resumes
            mv = self.answering(name, version)
            if mv.state is not State.UNLOADED and mv.revival is None:
                break
            if mv.revival is None:
                mv.revival = asyncio.get_running_loop().create_task(self._revive(mv))
            mv.waiting += 1  # not unloaded while requests wait for it
            try:
                await asyncio.shield(mv.revival)
            finally:
                mv.waiting -= 1
        mv = self.serving(name, version)
        self.residency.touch(mv)
        return mv

    async def _revive(self, mv: ModelVersion) -> None:
        t0 = time.perf_counter()
        try:
            current = self.current_version.get(mv.name) == mv.version
            _begin_load(mv)
            work = self.loader.submit(self.loader.revive, mv)
            await self._finish(mv, work, commit=False, current=current, settle=False)
        finally:
            mv.revival = None
        if mv.state is State.READY:
            self.metrics.model_reload_seconds.observe(time.perf_counter() - t0)

    def _keep_within_budget(self) -> None:
        """Unload the versions idle the longest while more are loaded than the budget allows."""
        everything = (mv for versions in self.by_name.values() for mv in versions.values())
        # A shadow is mirrored to only while READY: unloaded, nothing would load it again.
        shadows = {(name, shadow.version) for name, shadow in self.shadows.items()}
        for mv in self.residency.over_budget(everything, shadows):
            log.info(
                "model %s version %s unloaded: over the budget of %d loaded versions",
                mv.name,
                mv.version,
                self.residency.max_loaded,
                extra={"model": mv.name, "version": mv.version},
            )
            self.metrics.model_unloads.inc()
            self._spawn(self._serving.unload(mv))

    def _mirror(
        self,
        mv: ModelVersion,
        data: Any,
        outputs: tuple[str, ...] | None,
        answer: dict[str, Any],
        rows: int,
    ) -> None:
        """Mirror a scored request to the model's shadow version, where it has one and this
        request falls in its share (:mod:`service.shadow`); the answer is already final."""
        shadow = self.shadows.get(mv.name)
        if shadow is None or shadow[0] == mv.version or not self.mirror.wants(shadow[1]):
            return
        target = self.by_name.get(mv.name, {}).get(shadow.version)
        if target is not None and self.mirror.admit(mv, target):
            mirrored = self.mirror.run(mv, target, data, outputs, answer, rows)
            self._spawn(
                mirrored if shadow.rule is None else self._judged(mv.name, shadow, mirrored)
            )

    async def _judged(
        self, name: str, shadow: Shadow, mirrored: Awaitable[Divergence | None]
    ) -> None:
        """Run one mirror of a shadow with a rule, tally it, and carry out the rule's verdict
        once it has one (:mod:`service.shadow_rule`)."""
        found = await mirrored
        if found is None or shadow.rule is None or self.shadows.get(name) != shadow:
            return
        tally = self._tallies.setdefault((name, shadow), Tally())
        tally.add(found)
        verdict = None if tally.decided else tally.verdict(shadow.rule)
        if verdict is None:
            return
        tally.decided = True
        async with self._sync_lock:
            if self.shadows.get(name) != shadow:
                return  # changed, or decided by a replica whose manifest this one read
            promote = verdict is Verdict.PROMOTE
            manifest = await self._write(
                self.store.decide_shadow, name, shadow, promote, RULE_ACTOR
            )
            m = self.metrics
            m.child(m.shadow_decisions, name, shadow.version, verdict.value).inc()
            log.warning(
                "model %s: the shadow rule %s version %s after %d rows (%d labels differed, "
                "largest |diff| %g)",
                name,
                "promoted" if promote else "stopped mirroring to",
                shadow.version,
                tally.rows,
                tally.label_disagreements,
                tally.max_abs_diff,
                extra={"model": name, "version": shadow.version},
            )
            entry = manifest.models.get(name)
            if promote and entry is not None and entry.current == shadow.version:
                await self._serve_current(name, manifest, RULE_ACTOR)
            await self._retire_unnamed()

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
        loaded = await loop.run_in_executor(None, self.loader.validate, upload)
        async with self._lock:
            # A registration that failed before its commit holds no version: a new one may take
            # its name (or number) and replaces it here.
            taken = {
                v: mv
                for v, mv in self.by_name.get(upload.name, {}).items()
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
            self.add(mv)
        work = self.loader.submit(self.loader.build, mv, loaded.estimator, upload)
        self._spawn(self._finish(mv, work, actor=upload.actor, current=upload.promote))
        return mv

    async def _finish(
        self,
        mv: ModelVersion,
        work: asyncio.Future[VersionRecord],
        *,
        commit: bool = True,
        actor: str = "",
        current: bool = True,
        settle: bool = True,
    ) -> None:
        """Await the blocking load, commit a new upload to the manifest, and make the version
        current; or mark it FAILED with the reason. Reloads of stored versions don't commit.
        ``settle`` False: no full collection after it (see :meth:`_activate`)."""
        t0 = time.perf_counter()
        try:
            record = await work
            # Under the lock a delete can not slip in between this check and the commit (it would
            # remove the model from the store, then our commit would bring it back).
            async with self._lock:
                if not self.is_known(mv):
                    raise NotFound(
                        f"model {mv.name!r} version {mv.version} was deleted while loading"
                    )
                if commit:
                    loop = asyncio.get_running_loop()
                    # A model's first version serves, whatever it was registered as.
                    current = current or self.current(mv.name) is None
                    manifest = await loop.run_in_executor(
                        None, lambda: self.store.commit(record, current, by=actor)
                    )
                    self._wrote(manifest)
                    mv.generation = manifest.generation
                    current = manifest.models[mv.name].current == mv.version
                mv.record = record
                mv.load_seconds = time.perf_counter() - t0
                mv.failed_loads = 0
                if current or mv.version in self.pinned(mv.name):
                    self._activate(mv, current=current, settle=settle)
                else:  # registered to be stored only: it serves once something names it
                    mv.state, mv.model, mv.source = State.RETIRED, None, None
                    Serving.stop_executor(mv)
                    mv.done.set()
        except Exception as exc:  # every failure becomes the version's visible reason
            mv.state, mv.error = State.FAILED, _reason(exc)
            self._settle_heap()  # the last load of a burst may be the one that failed
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
            Serving.stop_executor(mv)
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
                self._wrote(manifest)

    def _wrote(self, manifest: Manifest) -> None:
        """Note a manifest this process wrote: syncs skip older reads (see ``_floor``)."""
        self._floor = max(self._floor, manifest.generation)
        self._saw(manifest)

    def _saw(self, manifest: Manifest) -> None:
        """Keep what a manifest read or written says beside the versions: histories, aliases,
        traffic splits and shadows."""
        models = manifest.models
        self.histories = {name: list(e.history) for name, e in models.items()}
        self.aliases = {name: dict(e.aliases) for name, e in models.items() if e.aliases}
        self.traffic = {
            name: dict(sorted(e.traffic.items())) for name, e in models.items() if e.traffic
        }
        self.shadows = {name: e.shadow for name, e in models.items() if e.shadow is not None}
        self._tallies = {k: t for k, t in self._tallies.items() if self.shadows.get(k[0]) == k[1]}

    def _activate(self, mv: ModelVersion, *, current: bool = True, settle: bool = True) -> None:
        """READY: give the version a batcher and make it current; retire the previous one unless
        an alias names it. ``current`` False: a version an alias names, serving beside it.
        ``settle`` False (a version loaded again after the budget unloaded it: little garbage,
        and requests wait on it): no full collection of the heap (:mod:`service.gcpolicy`).

        A version chosen by an older manifest than the one now current (a slow replica-sync load
        overtaken by a local registration, or two local uploads finishing out of order) does not
        replace it: it is RETIRED at once, as in the store.
        """
        assert mv.model is not None
        previous = self.current(mv.name) if current else None
        if previous is not None and previous is not mv and previous.generation > mv.generation:
            mv.state, mv.model, mv.source = State.RETIRED, None, None
            log.info(
                "model %s version %s loaded but version %s is newer in the store; not serving it",
                mv.name,
                mv.version,
                previous.version,
                extra={"model": mv.name, "version": mv.version},
            )
            mv.done.set()
            return
        self._serving.start(mv)
        mv.state = State.READY
        self.residency.touch(mv)  # just loaded: the last to unload
        if settle:
            self._settle_heap()
        if current:
            self.current_version[mv.name] = mv.version
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
        if (
            previous is not None
            and previous is not mv
            and previous.version not in self.pinned(mv.name)
        ):
            self._spawn(self._serving.stop(previous))
        self._keep_within_budget()

    def _settle_heap(self) -> None:
        """:func:`gcpolicy.settle` once the loads under way are over: each settle walks the
        whole heap, so a restart that loads many stored versions pays it once, not per model."""
        if State.LOADING.value not in self.states():
            gcpolicy.settle()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- promotion, rollback, aliases, traffic splits and shadows --------------------------------
    async def promote(self, name: str, version: str, actor: str = "") -> ModelVersion:
        """Make stored ``version`` of ``name`` current: in the store at once (every replica's
        sync follows within its poll interval), here once it is loaded (from the executable
        cache when warm); the version serving now keeps serving until then. A version this
        replica cannot load is not left current: the store goes back and the error is raised."""
        async with self._sync_lock:
            mv = self._stored(name, version, "promoted")
            if self.current_version.get(mv.name) == mv.version:
                return mv
            manifest = await self._write(self.store.set_current, mv.name, mv.version, actor)
            return await self._serve_current(mv.name, manifest, actor)

    async def rollback(self, name: str, actor: str = "") -> ModelVersion:
        """Make the version that was current before the current one current again (undoing the
        last change not yet undone), as :meth:`promote` does."""
        async with self._sync_lock:
            name = self.lookup(name).name  # NotFound naming the models there are
            manifest = await self._write(self.store.rollback, name, actor)
            return await self._serve_current(name, manifest, actor)

    async def set_alias(self, name: str, alias: str, version: str) -> ModelVersion:
        """Make ``alias`` name stored ``version`` of ``name`` and serve that version beside the
        current one (:meth:`_name_versions`)."""
        async with self._sync_lock:
            mv = self._stored(name, version, "named by an alias")
            before = self.aliases.get(mv.name, {}).get(alias)
            back = (
                partial(self.store.delete_alias, mv.name, alias)
                if before is None
                else partial(self.store.set_alias, mv.name, alias, before)
            )
            await self._name_versions(
                mv.name, partial(self.store.set_alias, mv.name, alias, mv.version), back
            )
            return mv

    async def set_traffic(self, name: str, weights: dict[str, Any]) -> dict[str, float]:
        """Split ``name``'s unversioned requests by ``weights`` (version or alias → weight;
        empty: all to the current version), serving the versions it names beside the current
        one (:meth:`_name_versions`); the split now."""
        async with self._sync_lock:
            name = self.lookup(name).name
            before = dict(self.traffic.get(name, {}))
            manifest = await self._name_versions(
                name,
                partial(self.store.set_traffic, name, weights),
                partial(self.store.set_traffic, name, before),
            )
            return dict(manifest.models[name].traffic)

    async def set_shadow(
        self, name: str, version: str | None, share: float = 0.0, rule: ShadowRule | None = None
    ) -> None:
        """Mirror ``share`` of ``name``'s live requests to stored ``version`` (None: none),
        serving it beside the current one (:meth:`_name_versions`); ``rule`` may promote it."""
        async with self._sync_lock:
            chosen = None if version is None else self._stored(name, version, "a shadow").version
            name = self.lookup(name).name
            before = self.shadows.get(name)
            await self._name_versions(
                name,
                partial(self.store.set_shadow, name, chosen, share, rule),
                partial(self.store.set_shadow, name, *(before or (None,))),
            )

    async def delete_alias(self, name: str, alias: str) -> None:
        """Remove ``alias`` of ``name``; the version it named stops serving here unless it is
        current or something else names it (replicas follow on their next sync)."""
        async with self._sync_lock:
            name = self.lookup(name).name
            await self._write(self.store.delete_alias, name, alias)
            await self._retire_unnamed()

    def _stored(self, name: str, version: str, purpose: str) -> ModelVersion:
        """Version ``version`` of ``name`` (or an alias's), which must be registered (stored)."""
        mv = self.lookup(name, version)
        if mv.record is None:
            raise Conflict(
                f"model {mv.name!r} version {mv.version} is {mv.state.value} and not stored: "
                f"only a registered version can be {purpose}"
            )
        return mv

    async def _write(self, change: Callable[..., Manifest], *args: Any) -> Manifest:
        """One change of the store's manifest (on an executor thread, under the lock)."""
        async with self._lock:
            loop = asyncio.get_running_loop()
            manifest = await loop.run_in_executor(None, partial(change, *args))
            self._wrote(manifest)
            return manifest

    async def _name_versions(
        self, name: str, change: Callable[[], Manifest], back: Callable[[], Manifest]
    ) -> Manifest:
        """Apply ``change`` to the store (an alias, a traffic split or a shadow: replicas follow
        on their next sync) and load here every version of ``name`` that it names beside the
        current one; where one cannot load, apply ``back`` and raise. Then stop the versions
        nothing names any more. The caller holds the sync lock."""
        manifest = await self._write(change)
        entry = manifest.models[name]
        known = self.by_name.get(name, {})
        named = [known[v] for v in sorted(entry.named() - {entry.current}) if v in known]
        loads = [mv for mv in named if self._needs_load(mv, force=True)]
        await asyncio.gather(
            *(self._load_stored(mv, manifest.generation, current=False) for mv in loads)
        )
        failed = [mv for mv in named if mv.state not in SERVABLE]
        if failed:
            await self._write(back)
        await self._retire_unnamed()
        if failed:
            mv = failed[0]
            raise NotReady(f"model {name!r} version {mv.version} could not be loaded: {mv.error}")
        return manifest

    async def _serve_current(self, name: str, manifest: Manifest, actor: str) -> ModelVersion:
        """Load the store's current version of ``name`` here, under the sync lock; where it
        fails, make the version serving here current in the store again and raise."""
        entry = manifest.models[name]
        assert entry.current is not None
        self._adopt(name, entry.versions.values())
        mv = self.by_name[name][entry.current]
        previous = self.current(name)
        if self._needs_load(mv, force=True):
            await self._load_stored(mv, manifest.generation)
        elif self._serves_beside(mv):
            self._switch_current(mv, manifest.generation)
        if mv.state in SERVABLE:
            return mv
        reason = mv.error or mv.state.value
        if previous is not None and previous is not mv:
            back = f"{actor} (back: version {mv.version} failed to load here)".strip()
            restored = await self._write(self.store.set_current, name, previous.version, back)
            previous.generation = restored.generation
        raise NotReady(f"model {name!r} version {mv.version} could not be loaded: {reason}")

    # -- deletion --------------------------------------------------------------------------------
    async def delete(self, name: str, version: str | None = None, actor: str = "") -> None:
        """Delete a model, or one version. Deleting the current version first brings back the
        version the store makes current instead (from the executable cache when warm), so
        serving never stops while another version exists."""
        async with self._sync_lock:
            versions = self.by_name.get(name)
            if versions is None:
                raise self.no_model(name)
            if version is not None and version not in versions:
                raise NotFound(f"model {name!r} has no version {version!r}")
            manifest = None
            if version is None or versions[version].record is not None:  # committed: in the store
                async with self._lock:
                    manifest = await self._store_delete(name, version, actor)
            if version is not None and self.current_version.get(name) == version and manifest:
                entry = manifest.models.get(name)
                back = versions.get(entry.current) if entry and entry.current else None
                if back is not None and self._needs_load(back, force=True):
                    await self._load_stored(back, manifest.generation)  # current; old one retired
            async with self._lock:
                versions = self.by_name.get(name, {})
                names = [version] if version is not None else list(versions)
                doomed = [versions[v] for v in names if v in versions]
                self.forget(name, doomed)
        for mv in doomed:
            await self._serving.stop(mv)

    async def _store_delete(self, name: str, version: str | None, actor: str) -> Manifest:
        """Delete from the store; the manifest after it (as it is, if already gone there)."""
        loop = asyncio.get_running_loop()
        try:
            manifest = await loop.run_in_executor(None, self.store.delete, name, version, actor)
        except Exception as exc:
            if not isinstance(http_error_for(exc), NotFound):
                raise
            # Another replica deleted it first: nothing written, the store is already right.
            return await loop.run_in_executor(None, self.store.load_manifest)
        self._wrote(manifest)
        return manifest

    async def unload(self, name: str) -> None:
        """Stop serving ``name`` in this process; the store keeps it (``sync(force=True)`` reloads,
        and so does any later sync that finds the manifest changed)."""
        async with self._sync_lock, self._lock:
            versions = self.by_name.pop(name, None)
            if versions is None:
                raise NotFound(f"no model named {name!r} is loaded; loaded: {self.names()}")
            self.current_version.pop(name, None)
        for mv in versions.values():
            await self._serving.stop(mv)
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
            self._saw(manifest)
            loads = []
            for name, entry in manifest.models.items():
                # Unchanged, only models still known here: one unloaded on purpose stays so.
                if changed or name in self.by_name:
                    self._adopt(name, entry.versions.values())
                known = self.by_name.get(name, {})
                want = known.get(entry.current or "")
                if want is not None and self._needs_load(want, force=force):
                    loads.append(self._load_stored(want, manifest.generation))
                elif want is not None and self._serves_beside(want):
                    self._switch_current(want, manifest.generation)
                for version in sorted(entry.named() - {entry.current}):
                    pinned = known.get(version)
                    if pinned is not None and self._needs_load(pinned, force=force):
                        loads.append(self._load_stored(pinned, manifest.generation, current=False))
            await asyncio.gather(*loads)
            if changed:
                await self._drop_deleted(manifest)
                await self._retire_unnamed()
            self._synced = manifest.generation

    def _serves_beside(self, mv: ModelVersion) -> bool:
        """Whether stored ``mv`` serves (READY, or UNLOADED for the budget) but is not current
        (an alias names it)."""
        return (
            mv.state in SERVABLE
            and mv.record is not None
            and self.current_version.get(mv.name) != mv.version
        )

    def _switch_current(self, mv: ModelVersion, generation: int) -> None:
        """Make ``mv``, READY beside the current version, current as of ``generation``; the
        previous one stops unless an alias names it."""
        previous = self.current(mv.name)
        mv.generation = generation
        self.current_version[mv.name] = mv.version
        if (
            previous is not None
            and previous is not mv
            and previous.version not in self.pinned(mv.name)
        ):
            self._spawn(self._serving.stop(previous))

    async def _retire_unnamed(self) -> None:
        """Stop serving the versions that are neither current nor named by an alias any more."""
        doomed = [
            mv
            for name, versions in self.by_name.items()
            for mv in versions.values()
            if mv.state in SERVABLE
            and mv.record is not None
            and mv.version != self.current_version.get(name)
            and mv.version not in self.pinned(name)
        ]
        for mv in doomed:
            await self._serving.stop(mv)

    def _adopt(self, name: str, records: Iterable[VersionRecord]) -> None:
        """Know every stored version of ``name`` (RETIRED: stored, not loaded)."""
        known = self.by_name.setdefault(name, {})
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
                ModelOptions.stored(record.options),
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
        # UNLOADED (for the budget) is loaded by its next request, not by a sync.
        return mv.state is State.FAILED and (force or time.monotonic() >= mv.retry_at)

    async def _load_stored(
        self, mv: ModelVersion, generation: int, *, current: bool = True
    ) -> None:
        """Load a stored version (disk cache when warm) and make it current, as of
        ``generation`` (``current`` False: serving beside the current one, for an alias)."""
        assert mv.record is not None
        _begin_load(mv)
        if current:
            mv.generation = generation
        work = self.loader.submit(self.loader.reload, mv, mv.record)
        await self._finish(mv, work, commit=False, current=current)

    async def _drop_deleted(self, manifest: Manifest) -> None:
        """Retire and forget stored versions (and models) that ``manifest`` no longer has."""
        async with self._lock:
            if manifest.generation < self._floor:
                return  # a local commit or delete landed while we were loading: manifest is stale
            dropped: list[ModelVersion] = []
            for name, versions in list(self.by_name.items()):
                entry = manifest.models.get(name)
                doomed = [
                    mv
                    for mv in versions.values()
                    # record None: a local upload not committed yet, not a deleted one
                    if mv.record is not None and (entry is None or mv.version not in entry.versions)
                ]
                if doomed:
                    self.forget(name, doomed)
                    dropped.extend(doomed)
        for mv in dropped:
            log.info(
                "model %s version %s was deleted from the store; dropped",
                mv.name,
                mv.version,
                extra={"model": mv.name, "version": mv.version},
            )
            await self._serving.stop(mv)

    def _retry_delay(self, failures: int) -> float:
        """Back-off before a replica sync retries a failed reload: doubling, at most 5 minutes."""
        base = self.settings.poll_interval_s or 1.0
        return min(base * 2 ** (failures - 1), 300.0)

    async def wait(self, mv: ModelVersion, timeout: float) -> bool:
        try:
            await asyncio.wait_for(mv.done.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def close(self) -> None:
        """Graceful shutdown: every batcher drains its queue."""
        for versions in list(self.by_name.values()):
            for mv in versions.values():
                if mv.batcher is not None:
                    await mv.batcher.close(drain=True)
                if mv.explainer is not None:
                    await mv.explainer.close(drain=True)
                Serving.stop_executor(mv)
        for task in list(self._tasks):
            task.cancel()
        self.live_parity.close()
        self.drift.close()
        await asyncio.get_running_loop().run_in_executor(None, self.capture.close)
        self.loader.shutdown()


def _begin_load(mv: ModelVersion) -> None:
    """LOADING again (a stored version's reload): queued, no error, a fresh ``done``."""
    mv.state, mv.error, mv.done = State.LOADING, None, asyncio.Event()
    mv.progress, mv.load_phases = LoadProgress(Phase.QUEUED), {}


def _reason(exc: BaseException) -> str:
    mapped = http_error_for(exc)
    text = mapped.message if mapped is not None else f"{type(exc).__name__}: {exc}"
    return text or type(exc).__name__
