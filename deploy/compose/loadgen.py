"""A small, bounded load generator for the demo model, so the Grafana dashboards show traffic.

Several threads post batches of iris flowers drawn at random, of varying size (so batching, padding and the
batch-rows heatmap have something to show) and, at a low rate, requests that must fail — a row
missing a column (400) and an unknown model (404) — so the error and rejection panels do too.
It stops by itself after ``--seconds`` and prints how many answers it got per status code.

Usage: ``python loadgen.py [--url URL] [--model iris] [--seconds 600] [--concurrency 4]
[--shift 1.6]``;
``KESTREL_SCORING_TOKEN`` is sent when the server requires one.
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import sys
import threading
import time
from collections.abc import Sequence

import httpx

ROW_COUNTS = (1, 1, 1, 2, 3, 5, 8, 16, 32, 64)  # mostly single rows, as online traffic is


def iris_flowers() -> list[dict[str, float]]:
    """The iris data set's rows, by the demo model's column names: traffic drawn from them looks
    like the registration sample, so the drift panels stay quiet until ``--shift``."""
    from sklearn.datasets import load_iris

    data = load_iris()
    names = ["sepal_length", "sepal_width", "petal_length", "petal_width"]
    return [dict(zip(names, map(float, row), strict=True)) for row in data.data]


def iris_rows(
    rng: random.Random, flowers: Sequence[dict[str, float]], n: int, shift: float = 1.0
) -> list[dict[str, float]]:
    """``n`` flowers drawn at random, their petals ``shift`` times as long."""
    rows = [dict(rng.choice(flowers)) for _ in range(n)]
    if shift != 1.0:
        for row in rows:
            row["petal_length"] = round(row["petal_length"] * shift, 2)
    return rows


class LoadGenerator:
    """Threads that score ``model`` until a deadline; ``bad_fraction`` of requests must fail."""

    def __init__(
        self,
        url: str,
        model: str,
        *,
        seconds: float,
        concurrency: int,
        bad_fraction: float,
        token: str | None = None,
        seed: int = 0,
        shift: float = 1.0,
    ) -> None:
        if seconds <= 0:
            raise ValueError(f"seconds must be positive, got {seconds}")
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        if not 0.0 <= bad_fraction <= 1.0:
            raise ValueError(f"bad_fraction must be within [0, 1], got {bad_fraction}")
        if not shift > 0:
            raise ValueError(f"shift must be positive, got {shift}")
        self.url, self.model = url.rstrip("/"), model
        self.seconds, self.concurrency, self.bad_fraction = seconds, concurrency, bad_fraction
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.seed, self.shift = seed, shift
        self.flowers = iris_flowers()
        self.statuses: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()

    def run(self) -> collections.Counter[str]:
        """Send traffic for ``seconds``; the count of answers per status (or transport error)."""
        deadline = time.monotonic() + self.seconds
        threads = [
            threading.Thread(target=self._worker, args=(deadline, self.seed + i), daemon=True)
            for i in range(self.concurrency)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return self.statuses

    def _worker(self, deadline: float, seed: int) -> None:
        rng = random.Random(seed)
        with httpx.Client(base_url=self.url, timeout=30, headers=self.headers) as client:
            while time.monotonic() < deadline:
                path, body = self._request(rng)
                try:
                    status = str(client.post(path, json=body).status_code)
                except httpx.TransportError as exc:
                    status = type(exc).__name__
                    time.sleep(0.5)  # the server is restarting or gone: do not spin
                with self._lock:
                    self.statuses[status] += 1

    def _request(self, rng: random.Random) -> tuple[str, list[dict[str, float]]]:
        rows = iris_rows(rng, self.flowers, rng.choice(ROW_COUNTS), self.shift)
        if rng.random() >= self.bad_fraction:
            return f"/models/{self.model}/predict", rows
        if rng.random() < 0.5:
            rows[0].pop("petal_width")  # 400: names the missing column
            return f"/models/{self.model}/predict", rows
        return f"/models/{self.model}-does-not-exist/predict", rows  # 404


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("KESTREL_URL", "http://kestrel:8000"))
    parser.add_argument("--model", default="iris")
    parser.add_argument(
        "--seconds", type=float, default=float(os.environ.get("LOADGEN_SECONDS", "600"))
    )
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--bad-fraction", type=float, default=0.02)
    parser.add_argument(
        "--shift",
        type=float,
        default=1.0,
        help="petal lengths this many times the real ones: drift for the drift panels",
    )
    args = parser.parse_args(argv)
    try:
        generator = LoadGenerator(
            args.url,
            args.model,
            seconds=args.seconds,
            concurrency=args.concurrency,
            bad_fraction=args.bad_fraction,
            shift=args.shift,
            token=os.environ.get("KESTREL_SCORING_TOKEN") or None,
        )
    except ValueError as exc:
        parser.error(str(exc))
    statuses = generator.run()
    total = sum(statuses.values())
    summary = ", ".join(f"{k}: {v}" for k, v in sorted(statuses.items()))
    print(f"{total} requests in {args.seconds:.0f} s ({summary})")
    return 0 if any(k.startswith("2") for k in statuses) else 1


if __name__ == "__main__":
    sys.exit(main())
