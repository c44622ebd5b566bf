"""``kestrel serve --workers N``: N worker processes serving one port, as one pod.

uvicorn's multiprocess supervisor does the process work: it binds the port once and hands the
listening socket to every worker, so a worker still starting (or a replacement recovering its
models) accepts nothing, and the kernel gives each connection to a worker that is waiting for
one — an idle one, not one chosen by a hash of the client's address as with ``SO_REUSEPORT``.
It restarts a worker that dies (logging ``Child process [pid] died``; the pod's metrics count
restarts), and on SIGTERM or SIGINT sends SIGTERM to every worker, each of which stops
accepting, finishes the requests it holds, drains its batchers and exits; then the supervisor
exits 0.

The workers build their application by name (:func:`service.pod.create_worker_app`), with the
settings of this command passed through the environment as ``KESTREL_*`` variables.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

import uvicorn
from uvicorn.config import STARTUP_FAILURE
from uvicorn.supervisors import Multiprocess

from service import pod
from service.settings import Settings

log = logging.getLogger("kestrel.supervisor")

#: Seconds a worker gives the requests it holds to finish after SIGTERM.
GRACEFUL_S = 30


def serve_workers(settings: Settings, workers: int, environment: Mapping[str, str]) -> int:
    """Serve with ``workers`` processes until SIGTERM / SIGINT; the exit status.

    ``environment``: the ``KESTREL_*`` variables that give the workers this command's settings.
    """
    root = Path(tempfile.mkdtemp(prefix="kestrel-pod-"))
    try:
        pod.prepare(root, workers)
        # The workers inherit this environment: their settings, and where their pod lives.
        os.environ.update(environment)
        os.environ[pod.POD_DIR_ENV] = str(root)
        config = uvicorn.Config(
            "service.pod:create_worker_app",
            factory=True,
            host=settings.host,
            port=settings.port,
            workers=workers,
            loop="uvloop",
            # The load-shedding protocol (service/shedding.py), by name: it is imported in the
            # worker, where the application it decides for lives.
            http="service.pod:WorkerHttpProtocol",
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=GRACEFUL_S,
        )
        log.info("serving on %s:%d with %d worker processes", settings.host, settings.port, workers)
        supervisor = Multiprocess(config, sockets=[config.bind_socket()])
        supervisor.run()
        failed = [p.pid for p in supervisor.processes if p.exitcode == STARTUP_FAILURE]
        if failed:
            log.error("worker %s could not start; see its log above", failed[0])
            return 1
        return 0
    finally:
        shutil.rmtree(root, ignore_errors=True)
