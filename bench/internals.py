"""What each mechanism built on a library's internals buys, over HTTP, side by side.

Two mechanisms reach into a library's private parts: the scoring fast path
(``service/fastpath.py``, past Starlette's router) and load shedding inside uvicorn's HTTP
protocol (``service/shedding.py``). Each stays only where it buys at least 10 % requests/s, server CPU per request (what sets the
requests/s one core answers) or p99 latency. This bench starts one Kestrel process with all of
them and one with each switched off (``bench/kestrel_without.py``), all pinned to the same core
with the same in-flight cap (``--max-in-flight``), registers the same models on each, and loads
them with ``wrk`` in turns, round by round (so drift on a shared machine hits every variant
alike): single-row requests at the cap, and at a multiple of it, where the excess is refused 429
(the path shedding makes cheap). Medians over the rounds.

``--before CHECKOUT`` (repeatable) adds a variant ``before:<directory name>`` per checkout: an
older commit's own ``kestrel serve``, loaded in the same rounds, so one run says what the commits
since cost or bought over HTTP, and several candidates of a bisection meet the same machine
state. ``--variants`` measures only some of them (e.g. ``all,before:old``).

Usage::

    python bench/internals.py [--models lr,rf] [--concurrency 64,512] [--max-in-flight 64]
                              [--rounds 3] [--duration 8] [--before CHECKOUT ...]
                              [--variants all,before:NAME] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from kestrel_without import MECHANISMS  # a script: its directory is not a package
from load import (
    ROOT,
    Measurement,
    build_models,
    check_answer,
    cpu_seconds,
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

#: A mechanism keeps its place where switching it off costs at least this share of requests/s or
#: of p99 latency in some cell.
MIN_GAIN = 0.10
VARIANTS = ("all", *(f"no-{m}" for m in MECHANISMS))


@dataclass(frozen=True)
class Cell:
    variant: str
    model: str
    concurrency: int
    rps: float  # answered requests/s, 429s included
    ok_rps: float  # 2xx requests/s
    p50_ms: float
    p99_ms: float
    cpu_us_per_request: float
    non_2xx_share: float


def _median_cell(variant: str, model: str, concurrency: int, runs: list[Measurement]) -> Cell:
    def med(values: list[float]) -> float:
        return statistics.median(values)

    return Cell(
        variant,
        model,
        concurrency,
        med([m.rps for m in runs]),
        med([m.rps * (1 - m.non_2xx / max(m.requests, 1)) for m in runs]),
        med([m.p50_ms for m in runs]),
        med([m.p99_ms for m in runs]),
        med([m.cpu_us_per_request for m in runs]),
        med([m.non_2xx / max(m.requests, 1) for m in runs]),
    )


def measure(args: argparse.Namespace) -> list[Cell]:
    wrk = require_wrk()
    server_cpu, client_cpu = default_cpus()
    models, x = build_models(args.models)
    rows = x[:1]
    runs: dict[tuple[str, str, int], list[Measurement]] = {}
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        workdir = Path(tmp)
        write_artifacts(models, workdir / "models")
        servers: dict[str, tuple[str, int]] = {}
        for variant in args.variants:
            port = free_port()
            home = workdir / variant.replace(":", "-")
            home.mkdir()
            argv, env = server_command("kestrel", port, workdir / "models", home, dict(os.environ))
            env["KESTREL_MAX_IN_FLIGHT"] = str(args.max_in_flight)
            cwd = ROOT
            if variant in args.checkouts:  # an older checkout's own server, as it ships
                cwd = args.checkouts[variant]
            else:
                off = "none" if variant == "all" else variant.removeprefix("no-")
                argv = [sys.executable, str(ROOT / "bench" / "kestrel_without.py"), off, *argv[3:]]
            print(f"starting {variant} on port {port} ...", file=sys.stderr, flush=True)
            servers[variant] = stack.enter_context(
                server_process(
                    variant, pinned(server_cpu, argv), port, home / "log", env, 300, cwd=cwd
                )
            )
            register_kestrel(servers[variant][0], workdir / "models", models, x, 1024)
        for model in args.models:
            for url, _ in servers.values():
                target = make_target("kestrel", url, model, rows)
                check_answer(target, models[model].predict_proba(rows))
                run_wrk(  # warm: caches, JIT paths, connection pools
                    wrk,
                    target,
                    connections=max(args.concurrency),
                    duration_s=2,
                    cpu=client_cpu,
                    workdir=workdir,
                )
        for round_ in range(args.rounds):
            for model in args.models:
                for concurrency in args.concurrency:
                    for variant, (url, pid) in servers.items():
                        target = make_target("kestrel", url, model, rows)
                        cpu0 = cpu_seconds(pid)
                        result = run_wrk(
                            wrk,
                            target,
                            connections=concurrency,
                            duration_s=args.duration,
                            cpu=client_cpu,
                            workdir=workdir,
                        )
                        m = Measurement.of(target, concurrency, result, cpu_seconds(pid) - cpu0)
                        runs.setdefault((variant, model, concurrency), []).append(m)
                        print(
                            f"round {round_ + 1} {variant:<22} {model:<4} c {concurrency:<4} "
                            f"{m.rps:8.0f} req/s  p99 {m.p99_ms:7.2f} ms  "
                            f"CPU {m.cpu_us_per_request:6.0f} µs/req  non-2xx {m.non_2xx}",
                            file=sys.stderr,
                            flush=True,
                        )
    return [_median_cell(*key, value) for key, value in runs.items()]


def report(cells: list[Cell]) -> str:
    """The table, each variant's figures beside ``all``'s in the same cell, and the verdicts."""
    base = {(c.model, c.concurrency): c for c in cells if c.variant == "all"}
    lines = [
        "| model | concurrency | variant | 2xx req/s | vs all | p99 ms | vs all | CPU µs/req "
        "| vs all | non-2xx |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    gains: dict[str, list[float]] = {}
    order = [*VARIANTS, *sorted({c.variant for c in cells} - set(VARIANTS))]
    for c in sorted(cells, key=lambda c: (c.model, c.concurrency, order.index(c.variant))):
        b = base[(c.model, c.concurrency)]
        rps_ratio = c.ok_rps / b.ok_rps if b.ok_rps else float("nan")
        p99_ratio = c.p99_ms / b.p99_ms if b.p99_ms else float("nan")
        cpu_ratio = c.cpu_us_per_request / b.cpu_us_per_request
        lines.append(
            f"| {c.model} | {c.concurrency} | {c.variant} | {c.ok_rps:.0f} | {rps_ratio:.2f} "
            f"| {c.p99_ms:.2f} | {p99_ratio:.2f} | {c.cpu_us_per_request:.0f} "
            f"| {cpu_ratio:.2f} | {c.non_2xx_share:.0%} |"
        )
        if c.variant in VARIANTS[1:]:  # a mechanism switched off, not another checkout
            # What the mechanism buys: requests/s lost, p99 and CPU per request added when off.
            gains.setdefault(c.variant, []).extend(
                [1 / rps_ratio - 1, p99_ratio - 1, cpu_ratio - 1]
            )
    lines.append("")
    for variant, values in gains.items():
        best = max(values)
        verdict = "keeps its place" if best >= MIN_GAIN else "does not earn its place"
        lines.append(
            f"- {variant.removeprefix('no-')}: at best {best:+.0%} (requests/s, p99 or CPU) "
            f"→ {verdict} (threshold {MIN_GAIN:.0%})"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=lambda s: tuple(s.split(",")), default=("lr", "rf"))
    parser.add_argument(
        "--concurrency", type=lambda s: tuple(int(v) for v in s.split(",")), default=(64, 512)
    )
    parser.add_argument("--max-in-flight", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument(
        "--before", type=Path, action="append", default=[], help="an older checkout (repeatable)"
    )
    parser.add_argument("--variants", type=lambda s: tuple(s.split(",")))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    args.checkouts = {f"before:{path.resolve().name}": path.resolve() for path in args.before}
    if len(args.checkouts) < len(args.before):
        parser.error("--before: give each checkout a directory of its own name")
    known = (*VARIANTS, *args.checkouts)
    args.variants = args.variants or known
    unknown = [v for v in args.variants if v not in known]
    if unknown or "all" not in args.variants:
        parser.error(f"--variants: {unknown or 'all is the reference'}; choose from {list(known)}")
    cells = measure(args)
    print(report(cells))
    if args.json:
        args.json.write_text(json.dumps([asdict(c) for c in cells], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
