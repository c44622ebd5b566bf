"""What live parity, drift metrics, a shadow version and payload capture cost over HTTP,
measured round by round.

Four Kestrel servers run at once, all pinned to the same core, each with the same models:
``quiet`` (live parity and drift metrics off), ``default`` (both at their default shares),
``shadow`` (the defaults, and a stored copy of each model as version 2, with
``--shadow-share`` of the requests mirrored to it) and ``capture`` (the defaults, and 10 % of
the requests captured to Parquet in the store). ``wrk`` on another core loads them in turns, round by round, the order rotated every round.
A shared machine's drift then hits every server alike: the ratios are medians of the per-round
ratios against ``quiet``, with their range over the rounds. Single-row native requests, as
bench/load.py sends them. Prints a table; never asserts.

With ``--rate R`` each turn is an open loop instead (tests/service/loadgen.py: R arrivals per
second, latency counted from each arrival's due time, wrk2's way) over ``--concurrency``
connections: below saturation, what a client waits is then compared, not what a core can do.

Usage: python bench/rollouts.py [--models lr,rf] [--concurrency 16,64] [--rounds 5]
                                [--duration 5] [--shadow-share 0.1] [--rate 2000]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from load import (  # a script: its directory is not a package
    Target,
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
    shadow_everything,
    write_artifacts,
)

#: Each server: bench/load.py's server kind whose environment it takes.
SERVERS = {
    "quiet": "kestrel-quiet",
    "default": "kestrel",
    "shadow": "kestrel-shadow",
    "capture": "kestrel-capture",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="lr,rf")
    parser.add_argument("--concurrency", default="16,64")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per turn")
    parser.add_argument("--shadow-share", type=float, default=0.1)
    parser.add_argument(
        "--rate", type=float, default=None, help="open loop at this many requests/s per turn"
    )
    args = parser.parse_args()
    models, x = build_models(args.models.split(","))
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    server_cpu, client_cpu = default_cpus()
    wrk = require_wrk()
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        workdir = Path(tmp)
        write_artifacts(models, workdir / "models")
        urls = {}
        for label, kind in SERVERS.items():
            port = free_port()
            argv, env = server_command(
                kind, port, workdir / "models", workdir / label, dict(os.environ)
            )
            url, _ = stack.enter_context(
                server_process(
                    label, pinned(server_cpu, argv), port, workdir / f"{label}.log", env, 300
                )
            )
            register_kestrel(url, workdir / "models", models, x, 1024)
            if label == "shadow":
                register_kestrel(url, workdir / "models", models, x, 1024, promote=False)
                shadow_everything(url, models, args.shadow_share)
            urls[label] = url
        mode = "closed loop (wrk)" if args.rate is None else f"open loop at {args.rate:.0f}/s"
        print(
            f"shadow share {args.shadow_share}; {args.rounds} rounds of {args.duration:.0f} s; "
            f"{mode}"
        )
        print(
            "model  conc.  server    req/s (median)  p99 ms (median)  req/s vs quiet  p99 vs quiet"
        )
        for model in models:
            targets = {s: make_target("kestrel", u, model, x[:1]) for s, u in urls.items()}
            for target in targets.values():
                check_answer(target, models[model].predict_proba(x[:1]))
            for c in concurrencies:
                rps: dict[str, list[float]] = {s: [] for s in urls}
                p99: dict[str, list[float]] = {s: [] for s in urls}
                order = list(urls)
                for r in range(args.rounds):
                    for s in order[r % len(order) :] + order[: r % len(order)]:
                        if args.rate is None:
                            result = run_wrk(
                                wrk, targets[s], connections=c, duration_s=args.duration,
                                cpu=client_cpu, workdir=workdir,
                            )  # fmt: skip
                            rps[s].append(result.rps)
                            p99[s].append(result.p99_us / 1e3)
                        else:
                            answered, latency = open_loop(targets[s], args.rate, c, args.duration)
                            rps[s].append(answered)
                            p99[s].append(latency)
                for s in urls:
                    ratio_r = [a / b for a, b in zip(rps[s], rps["quiet"], strict=True)]
                    ratio_p = [a / b for a, b in zip(p99[s], p99["quiet"], strict=True)]
                    print(
                        f"{model:<6} {c:<6} {s:<9} {statistics.median(rps[s]):>14,.0f}  "
                        f"{statistics.median(p99[s]):>15.2f}  "
                        f"{statistics.median(ratio_r):>6.2f}x ({min(ratio_r):.2f}-{max(ratio_r):.2f})"
                        f"  {statistics.median(ratio_p):>5.2f}x ({min(ratio_p):.2f}-{max(ratio_p):.2f})",
                        flush=True,
                    )


def open_loop(
    target: Target, rate: float, connections: int, duration_s: float
) -> tuple[float, float]:
    """One open-loop turn: answers per second (200s only) and their p99 in ms."""
    from tests.service.loadgen import run_process

    parts = urlsplit(target.url)
    summary = run_process(
        f"{parts.scheme}://{parts.netloc}",
        parts.path,
        target.body.decode(),
        *("--rate", str(rate), "--connections", str(connections), "--duration", str(duration_s)),
    )
    ok = summary["by_status"].get("200")
    if ok is None or summary["errors"]:
        raise SystemExit(f"{target.server} answered no 200s: {summary}")
    return summary["ok_per_s"], ok["p99_ms"]


if __name__ == "__main__":
    main()
