"""Seconds from upload to READY, and from restart to READY, per benchmark pipeline.

For each checkout given (this one by default; ``--compare PATH`` adds another, e.g. a worktree
of an older commit, measured in the same run, alternating with this one), a real ``kestrel
serve`` process on a fresh store and executable cache registers each pipeline of
``bench/load.py`` (``POST /models?wait=true`` with a 64-row sample: compile, warm-up, parity),
timed by the client. The server is then restarted on the same store and cache and the time to
``/readyz`` (every stored version loaded) is taken, with the loads' share of it and the
compiles the restart made. The versions load on the one loader thread, after the process's
one-time work (``service/runtime.py``), which the first load's seconds include: the next is
another model of the same kind, and the last (the second's artifact once more, under a third
name) is what each further model adds to a restart.

The first registration of a fresh process may wait for one-time work (imports, the native
kernels: ``service/runtime.py``), so a second model of the same kind, fitted on another seed
(nothing of it in any cache), is then registered on the running server: what a registration
costs once the server is up.

Usage::

    python bench/ready.py [--models lr,rf,hgb,mlp] [--max-batch 1024] [--compare PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from load import (  # a script: its directory is not a package
    ADMIN_TOKEN,
    MODELS,
    ROOT,
    build_models,
    free_port,
    server_process,
    write_artifacts,
)


@dataclass(frozen=True)
class Ready:
    checkout: str
    model: str
    register_s: float  # upload to READY (the client's clock), the process's first
    running_s: float  # the same for a model fitted on another seed, on the running server
    restart_s: float  # process start to /readyz with the version loaded
    reload_s: float  # of which the first of the two versions' loads (the server's load_seconds)
    # The other version's load, after the first on the one loader thread: what one more model
    # adds to a restart once the process's one-time work is done.
    next_reload_s: float
    # A third version (the second's artifact under another name), loaded last: what one more
    # model of a kind already loaded adds.
    last_reload_s: float
    # Each restart load's seconds by phase on the loader thread (the server's load_phases, in
    # load order; empty for a checkout that does not report them).
    restart_phases: list[dict[str, float]]
    restart_compiles: float
    device_buckets: int  # buckets the version's plan runs on the device (-1: no plan)
    buckets: int


def _env(workdir: Path) -> dict[str, str]:
    return {
        **os.environ,
        "KESTREL_STORE_URL": str(workdir / "store"),
        "KESTREL_CACHE_DIR": str(workdir / "cache"),
        "KESTREL_ADMIN_TOKEN": ADMIN_TOKEN,
        "KESTREL_POLL_INTERVAL_S": "0",
        "KESTREL_LOG_LEVEL": "warning",
        "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false",
        # HTTP is measured: no gRPC server (nor a clash with one on its default port).
        "KESTREL_GRPC_PORT": "0",
        # One process, as these figures have always been (bench/workers.py measures more).
        "KESTREL_WORKERS": "1",
    }


def _metric(url: str, name: str) -> float:
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", timeout=30).text
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    )


def _version(url: str, model: str) -> dict[str, Any]:
    import httpx

    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    (version,) = httpx.get(f"{url}/models/{model}", headers=headers, timeout=30).json()["versions"]
    return version


def _register(url: str, name: str, artifact: Path, sample: str, max_batch: int) -> float:
    """Seconds from upload to READY (``wait=true``)."""
    import httpx

    with artifact.open("rb") as fh:
        t0 = time.perf_counter()
        r = httpx.post(
            f"{url}/models",
            params={"wait": "true"},
            data={"name": name, "sample": sample, "options": json.dumps({"max_batch": max_batch})},
            files={"file": (artifact.name, fh)},
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
            timeout=900,
        )
        seconds = time.perf_counter() - t0
    if r.status_code != 201:
        raise SystemExit(f"registering {name}: {r.status_code} {r.text}")
    return seconds


def measure(checkout: Path, model: str, artifacts: Path, sample: str, max_batch: int) -> Ready:
    import httpx

    with tempfile.TemporaryDirectory(prefix="kestrel-ready-") as tmp:
        workdir = Path(tmp)
        env = _env(workdir)
        argv = [sys.executable, "-m", "service.cli", "serve"]
        port = free_port()
        log = workdir / "server.log"
        with server_process(
            "kestrel", [*argv, "--port", str(port)], port, log, env, 300, cwd=checkout
        ) as (url, _):
            register_s = _register(url, model, artifacts / f"{model}.skops", sample, max_batch)
            other = artifacts / "other" / f"{model}.skops"
            running_s = _register(url, f"{model}-other", other, sample, max_batch)
            _register(url, f"{model}-third", other, sample, max_batch)
            version = _version(url, model)
        port = free_port()
        t0 = time.perf_counter()
        with server_process(
            "kestrel", [*argv, "--port", str(port)], port, log, env, 300, cwd=checkout
        ) as (url, _):
            while httpx.get(f"{url}/readyz", timeout=30).status_code != 200:
                time.sleep(0.02)
            restart_s = time.perf_counter() - t0
            compiles = _metric(url, "kestrel_compiles_total")
            names = (model, f"{model}-other", f"{model}-third")
            versions = sorted((_version(url, m) for m in names), key=lambda v: v["load_seconds"])
            loads = [v["load_seconds"] for v in versions]
            phases = [v.get("load_phases", {}) for v in versions]
    plan = version.get("plan")
    device = -1 if plan is None else sum(p["runs_on"] == "device" for g in plan for p in g)
    return Ready(
        str(checkout),
        model,
        register_s,
        running_s,
        restart_s,
        loads[0],
        # All were queued at once, so each later one waited for those before it.
        loads[1] - loads[0],
        loads[2] - loads[1],
        phases,
        compiles,
        device,
        len(version["buckets"]),
    )


def _print_phases(results: list[Ready]) -> None:
    """Where each restart load spent its time on the loader thread."""
    phases = sorted({p for r in results for load in r.restart_phases for p in load})
    if not phases:
        return
    print("\nrestart loads by phase on the loader thread, seconds (first, next, last)\n")
    print(f"| checkout | model | {' | '.join(phases)} | sum |")
    print("|---|---|" + "---|" * (len(phases) + 1))
    for r in (r for r in results if any(r.restart_phases)):
        cells = [", ".join(f"{load.get(p, 0.0):.2f}" for load in r.restart_phases) for p in phases]
        sums = ", ".join(f"{sum(load.values()):.2f}" for load in r.restart_phases)
        print(f"| {Path(r.checkout).name} | {r.model} | {' | '.join(cells)} | {sums} |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--max-batch", type=int, default=1024)
    parser.add_argument("--compare", type=Path, help="another checkout, measured alongside")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args(argv)
    names = [m for m in args.models.split(",") if m]
    checkouts = [ROOT] + ([args.compare.resolve()] if args.compare else [])
    models, x = build_models(names)
    results: list[Ready] = []
    with tempfile.TemporaryDirectory(prefix="kestrel-ready-artifacts-") as tmp:
        artifacts = Path(tmp)
        write_artifacts(models, artifacts)
        write_artifacts(build_models(names, seed=1)[0], artifacts / "other")
        sample = json.dumps(x[:64].tolist())
        for name in names:
            for checkout in checkouts:  # alternating: both see the same machine state
                print(f"{checkout.name}: {name} ...", file=sys.stderr, flush=True)
                results.append(measure(checkout, name, artifacts, sample, args.max_batch))
    print(f"\nmax_batch {args.max_batch}; seconds (restart: to /readyz with the model loaded)\n")
    print(
        "| checkout | model | register → READY, first | on the running server | "
        "restart → ready | of which: first load, next, last | restart compiles | "
        "device buckets / buckets |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        device = "no plan" if r.device_buckets < 0 else f"{r.device_buckets} / {r.buckets}"
        print(
            f"| {Path(r.checkout).name} | {r.model} | {r.register_s:.2f} | {r.running_s:.2f} | "
            f"{r.restart_s:.2f} | {r.reload_s:.2f}, {r.next_reload_s:.2f}, {r.last_reload_s:.2f} | "
            f"{r.restart_compiles:.0f} | {device} |"
        )
    _print_phases(results)
    if args.out:
        args.out.write_text(json.dumps([r.__dict__ for r in results], indent=1))


if __name__ == "__main__":
    main()
