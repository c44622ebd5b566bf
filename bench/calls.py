"""Calls per request on the event loop, counted, this checkout against older ones.

Over HTTP, two servers of the same commit read several percent apart round by round on a shared
machine, so ``bench/internals.py`` cannot place a change of a few percent. This bench counts
instead: one server per checkout (``bench/kestrel_counting.py``, from that checkout's root), the
same models registered on each, single-row requests at ``--concurrency`` with ``wrk``, and
every Python and C call the event-loop thread makes while it answers them. It prints the calls
per request of each checkout and the functions whose count per request moved the most.

A count is work done, not time: a call into prometheus_client and one into ``len`` count alike,
and the profiler slows the server, so batches (whose calls are shared by their requests) may
form differently. Read it beside a timed run, to say where a difference comes from.

Usage::

    python bench/calls.py [--models lr,rf] [--concurrency 64] [--duration 6]
                          [--before CHECKOUT ...] [--top 25]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from load import (  # a script: its directory is not a package
    ROOT,
    BenchError,
    build_models,
    check_answer,
    default_cpus,
    free_port,
    make_target,
    pinned,
    register_kestrel,
    require_wrk,
    run_wrk,
    server_command,
    server_process,
    write_artifacts,
)

Counts = collections.Counter[tuple[str, str]]


def _wait_for(path: Path, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise BenchError(f"the server wrote no call counts to {path}")
        time.sleep(0.1)


def measure(args: argparse.Namespace) -> dict[tuple[str, str], tuple[Counts, int]]:
    """Per (checkout, model): the calls counted and the requests they answered."""
    wrk = require_wrk()
    server_cpu, client_cpu = default_cpus()
    models, x = build_models(args.models)
    rows = x[:1]
    checkouts = {"this": ROOT, **{p.resolve().name: p.resolve() for p in args.before}}
    if len(checkouts) < len(args.before) + 1:
        raise BenchError("--before: give each checkout a directory of its own name")
    results: dict[tuple[str, str], tuple[Counts, int]] = {}
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        workdir = Path(tmp)
        write_artifacts(models, workdir / "models")
        for name, checkout in checkouts.items():
            home = workdir / name
            home.mkdir()
            port = free_port()
            argv, env = server_command("kestrel", port, workdir / "models", home, dict(os.environ))
            argv = [sys.executable, str(ROOT / "bench" / "kestrel_counting.py"), *argv[3:]]
            out = home / "calls.json"
            env["KESTREL_CALLS_OUT"] = str(out)
            url, pid = stack.enter_context(
                server_process(
                    name, pinned(server_cpu, argv), port, home / "log", env, 300, cwd=checkout
                )
            )
            register_kestrel(url, workdir / "models", models, x, 1024)
            for model in args.models:
                target = make_target("kestrel", url, model, rows)
                check_answer(target, models[model].predict_proba(rows))

                def load(seconds: float, target: object = target) -> Any:
                    return run_wrk(
                        wrk,
                        target,
                        connections=args.concurrency,
                        duration_s=seconds,
                        cpu=client_cpu,
                        workdir=workdir,
                    )

                load(2)  # warm: caches, JIT paths, connection pools
                out.unlink(missing_ok=True)
                os.kill(pid, signal.SIGUSR1)
                result = load(args.duration)
                os.kill(pid, signal.SIGUSR2)
                _wait_for(out)
                counts: Counts = collections.Counter(
                    {(where, fn): n for where, fn, n in json.loads(out.read_text())}
                )
                results[(name, model)] = (counts, result.requests)
                print(
                    f"{name:<16} {model:<4} {sum(counts.values()) / result.requests:8.1f} "
                    f"calls/request over {result.requests} requests",
                    file=sys.stderr,
                    flush=True,
                )
    return results


def report(results: dict[tuple[str, str], tuple[Counts, int]], top: int) -> str:
    lines = ["| checkout | model | calls per request | vs this |", "|---|---|---:|---:|"]
    base = {m: sum(c.values()) / r for (name, m), (c, r) in results.items() if name == "this"}
    for (name, model), (counts, requests) in results.items():
        per = sum(counts.values()) / requests
        lines.append(f"| {name} | {model} | {per:.1f} | {per / base[model]:.3f} |")
    for (name, model), (counts, requests) in results.items():
        if name == "this":
            continue
        this, this_requests = results[("this", model)]
        moved = sorted(
            set(counts) | set(this),
            key=lambda k: -abs(this[k] / this_requests - counts[k] / requests),
        )[:top]
        lines += [
            "",
            f"{model}: calls per request that moved most, {name} → this",
            "",
            f"| {name} | this | function |",
            "|---:|---:|---|",
        ]
        for where, fn in moved:
            lines.append(
                f"| {counts[(where, fn)] / requests:.2f} | {this[(where, fn)] / this_requests:.2f} "
                f"| `{where}:{fn}` |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=lambda s: tuple(s.split(",")), default=("lr", "rf"))
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--duration", type=float, default=6.0, help="seconds counted per model")
    parser.add_argument(
        "--before", type=Path, action="append", default=[], help="an older checkout (repeatable)"
    )
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    try:
        print(report(measure(args), args.top))
    except BenchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
