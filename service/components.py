"""The parts one Kestrel application is built from, made once per :func:`service.app.create_app`
and handed to each group of routes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry

import lazy as lz
from service.access import Auth
from service.admission import ScoringLoad
from service.metrics import Metrics
from service.models import ModelManager
from service.pod import PodWorker, store_lock
from service.pod_board import Board, PodScoringLoad
from service.preload import Preloader
from service.settings import Settings
from service.shared_cache import executable_cache
from service.store import ModelStore


@dataclass(frozen=True)
class Components:
    settings: Settings
    metrics: Metrics
    cache: lz.ExecutableCache
    store: ModelStore
    manager: ModelManager
    auth: Auth
    preloader: Preloader | None  # the model file to serve at start (KServe runtime), if any
    pod: PodWorker | None = None  # in a worker of `kestrel serve --workers N` (service/pod.py)

    @classmethod
    def build(
        cls,
        settings: Settings,
        registry: CollectorRegistry | None = None,
        pod_dir: Path | None = None,
    ) -> Components:
        # Claimed first: a sibling's write is waited for by this worker from now on.
        board = Board(pod_dir / "board") if pod_dir is not None else None
        metrics = Metrics(registry)
        store = ModelStore(
            settings.store_url,
            dict(settings.store_options) or None,
            writers_lock=store_lock(pod_dir) if pod_dir is not None else None,
        )
        cache = executable_cache(settings, store, writes_store=True)
        metrics.add_cache_collector(cache)
        # In a pod the in-flight cap is the pod's: every worker counts against one total.
        scoring = (
            ScoringLoad(settings.max_in_flight)
            if board is None
            else PodScoringLoad(settings.max_in_flight, board)
        )
        auth = Auth(
            settings.admin_token.get_secret_value() if settings.admin_token else None,
            settings.scoring_token.get_secret_value() if settings.scoring_token else None,
        )
        # Resolved now: a preload path naming no (or several) model files stops `serve` at once.
        preloader = (
            Preloader.resolve(
                settings.preload, settings.preload_name, allow_pickle=settings.allow_pickle
            )
            if settings.preload is not None
            else None
        )
        manager = ModelManager(settings, store, metrics, cache, scoring)
        pod = None
        if pod_dir is not None and board is not None:
            pod = PodWorker.join(pod_dir, board, manager, metrics, settings.register_wait_s)
        return cls(settings, metrics, cache, store, manager, auth, preloader, pod)

    def is_ready(self) -> bool:
        """Stored models recovered, and the preloaded one (if any) READY: /readyz, /v2 ready."""
        return self.manager.is_ready() and (self.preloader is None or self.preloader.ready)
