"""``kestrel serve --workers N`` over HTTP: single-row throughput and latency for each N, one run.

One Kestrel server per worker count (each with its own store and compile cache), all started
before any load and measured in turns — every server once per round, ``--rounds`` rounds — so a
machine shared with other work slows them alike. No process is pinned: a server may use every
core the bench may, as in production, and ``wrk`` (one thread) shares them. Each cell gives the
median round's requests/s with its p50 / p99 latency, the servers' CPU time per request (the
supervisor and its workers together) and the non-2xx answers. A FastAPI hello world (one
process) is measured alongside as the ceiling of one core. Before any load each server's answer
is checked against the estimator's own ``predict_proba``.

Usage::

    python bench/workers.py [--workers 1,2] [--model lr] [--concurrency 64] [--duration 10]
                            [--rounds 3] [--warmup 3] [--no-hello] [--out results.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from load import (  # a script: its directory is not a package
    MODELS,
    BenchError,
    Target,
    build_models,
    check_answer,
    free_port,
    make_target,
    register_kestrel,
    require_wrk,
    run_wrk,
    server_command,
    server_process,
    write_artifacts,
)


@dataclass(frozen=True)
class Cell:
    server: str  # "kestrel, 2 workers", "hello world"
    rps: float
    p50_ms: float
    p99_ms: float
    cpu_us_per_request: float
    non_2xx: int
    socket_errors: int
    rounds_rps: tuple[float, ...]


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process and all its descendants alive now (Linux /proc)."""
    total = 0.0
    pending = [pid]
    while pending:
        p = pending.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            for task in Path(f"/proc/{p}/task").iterdir():
                pending += [int(c) for c in (task / "children").read_text().split()]
        except FileNotFoundError:  # ended meanwhile
            continue
    return total


@contextlib.contextmanager
def servers(
    workers: Sequence[int], hello: bool, model: str, workdir: Path
) -> Iterator[dict[str, tuple[Target, int]]]:
    """Every server started, its model registered and checked: name → (target, pid)."""
    models, x = build_models([model])
    artifacts = workdir / "artifacts"
    write_artifacts(models, artifacts)
    row = x[:1]
    reference = models[model].predict_proba(row)
    with contextlib.ExitStack() as stack:
        started: dict[str, tuple[Target, int]] = {}
        kinds = [("hello world", "hello", 1)] if hello else []
        kinds += [(f"kestrel, {n} worker{'s' if n > 1 else ''}", "kestrel", n) for n in workers]
        for name, kind, n in kinds:
            port = free_port()
            home = workdir / name.replace(", ", "-").replace(" ", "-")
            home.mkdir()
            argv, env = server_command(kind, port, artifacts, home, dict(os.environ))
            env["KESTREL_WORKERS"] = str(n)
            url, pid = stack.enter_context(
                server_process(name, argv, port, home / "server.log", env, timeout=300)
            )
            if kind == "kestrel":
                register_kestrel(url, artifacts, models, x, max_batch=1024)
            target = make_target(kind, url, model, row)
            check_answer(target, reference)
            started[name] = (target, pid)
        yield started


def measure(
    started: dict[str, tuple[Target, int]],
    *,
    concurrency: int,
    duration_s: float,
    rounds: int,
    warmup_s: float,
    workdir: Path,
) -> list[Cell]:
    wrk = require_wrk()
    for target, _ in started.values():  # warm: caches, connection paths, every worker
        run_wrk(
            wrk, target, connections=concurrency, duration_s=warmup_s, cpu=None, workdir=workdir
        )
    runs: dict[str, list[tuple[float, object, float]]] = {name: [] for name in started}
    for r in range(rounds):
        for name, (target, pid) in started.items():
            cpu0 = tree_cpu_seconds(pid)
            result = run_wrk(
                wrk,
                target,
                connections=concurrency,
                duration_s=duration_s,
                cpu=None,
                workdir=workdir,
            )
            cpu = tree_cpu_seconds(pid) - cpu0
            runs[name].append((result.rps, result, cpu))
            print(
                f"round {r + 1} {name:<20} {result.rps:8.0f} req/s  "
                f"p99 {result.p99_us / 1e3:7.2f} ms",
                file=sys.stderr,
                flush=True,
            )
    cells = []
    for name, measured in runs.items():
        ranked = sorted(measured, key=lambda m: m[0])
        rps, result, cpu = ranked[len(ranked) // 2]
        cells.append(
            Cell(
                name,
                round(rps, 1),
                result.p50_us / 1e3,  # type: ignore[attr-defined]
                result.p99_us / 1e3,  # type: ignore[attr-defined]
                round(cpu / max(result.requests, 1) * 1e6, 1),  # type: ignore[attr-defined]
                result.status_errors,  # type: ignore[attr-defined]
                result.socket_errors,  # type: ignore[attr-defined]
                tuple(round(m[0]) for m in measured),
            )
        )
    return cells


def table(cells: Sequence[Cell]) -> str:
    lines = [
        "| server | req/s | p50 ms | p99 ms | server CPU µs/req | non-2xx | req/s by round |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        rounds = " / ".join(f"{r:,}" for r in c.rounds_rps)
        lines.append(
            f"| {c.server} | {c.rps:,.0f} | {c.p50_ms:.2f} | {c.p99_ms:.2f} | "
            f"{c.cpu_us_per_request:.0f} | {c.non_2xx} | {rounds} |"
        )
    return "\n".join(lines)


def _ints(text: str) -> tuple[int, ...]:
    values = tuple(int(v) for v in text.split(",") if v)
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=_ints, default=(1, 2), help="worker counts to compare")
    parser.add_argument("--model", choices=MODELS, default="lr")
    parser.add_argument("--concurrency", type=int, default=64, help="open connections")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds per server, first")
    parser.add_argument("--no-hello", action="store_true", help="no hello-world reference")
    parser.add_argument("--out", type=Path, default=None, help="write the cells as JSON")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kestrel-workers-bench-") as tmp:
        workdir = Path(tmp)
        try:
            with servers(args.workers, not args.no_hello, args.model, workdir) as started:
                cells = measure(
                    started,
                    concurrency=args.concurrency,
                    duration_s=args.duration,
                    rounds=args.rounds,
                    warmup_s=args.warmup,
                    workdir=workdir,
                )
        except BenchError as exc:
            print(f"bench/workers.py: {exc}", file=sys.stderr)
            return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(
        f"model {args.model}, 1 row per request, {args.concurrency} connections, "
        f"{args.duration:g} s per round, median of {args.rounds} rounds; "
        f"{cores} cores ({platform.processor() or platform.machine()})\n"
    )
    print(table(cells))
    if args.out is not None:
        args.out.write_text(json.dumps([asdict(c) for c in cells], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
