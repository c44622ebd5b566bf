"""What exact decisions cost: this checkout's compiled pipelines against a baseline revision's.

Each pipeline is fitted on the same mixed frame (integer, binary and rounded continuous columns
with NaN, a string column) and compiled by both checkouts, each in a long-lived worker process
on the same core, one thread. The two are timed on ``predict_proba`` in alternating rounds of a
few calls, the order switched every round, so that a shared machine's drift hits both alike;
the ratio is the median of the per-round ratios, and its range over the rounds is printed
beside it. Each worker also reports how many labels differ from scikit-learn's on probe rows
(``_probe_rows``), and the largest probability difference.

The baseline is a git revision, checked out into a temporary worktree (``--baseline``, default
``HEAD``: the last commit, against the working tree), or a directory holding one
(``--baseline-dir``, for a machine without the repository's history: a lent accelerator's copy
of the working tree, with ``make device-baseline``'s ``.gpu/baseline``; see bench/device.sh).
Prints a table; never asserts.

``--pipelines`` also takes ``bench/scoring.py``'s pipelines by letter (``a``–``j``, fitted as a
full run of that bench fits them): this checkout against an older one on the benchmark's own
models, scored on its held-out rows.

``--options``: CompileOptions for this checkout's compiles only, as JSON (``'{"split_codes":
true}'`` against ``--baseline HEAD``: one option on against off, same code).

``--lowering``: ``auto`` times what warm-up places (host kernels or XLA per bucket, by timing, so
two runs of one checkout may differ); ``xla`` and ``host`` pin every bucket to one, so that the
two checkouts are compared like for like.

Usage: python bench/exactness.py [--baseline REV | --baseline-dir DIR] [--batches 1,10000] [--rounds R]
       [--lowering auto|xla|host] [--pipelines a,b] [--options JSON]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PIPELINES = ("hgb_raw", "ct_hgb", "scaled_rf", "scaled_gbc", "lgbm_raw", "scaled_lr")
ONE_THREAD = {
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "NUMBA_NUM_THREADS": "1",
    "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
}


def _frame(n: int, seed: int) -> Any:
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(seed)
    df = pd.DataFrame(
        {
            "count": rng.integers(0, 7, n).astype(float),
            "flag": rng.integers(0, 2, n).astype(float),
            "amount": np.round(rng.lognormal(2.0, 1.0, n), 2),
            "score": np.round(rng.normal(size=n), 3) * 7.3,
            **{f"v{i}": np.round(rng.normal(size=n), 4) for i in range(6)},
            "plan": rng.choice(["free", "pro", "team"], n),
        }
    )
    for column in ("count", "amount", "score", "v0"):
        df.loc[rng.random(n) < 0.1, column] = np.nan
    return df


def _fit(name: str) -> tuple[Any, Any]:
    """(fitted pipeline, rows to score: its training frame, or a scoring pipeline's pool)."""
    from scoring_pipelines import PIPELINES as SCORING
    from scoring_pipelines import Scale, fit, make_data

    if name in SCORING:
        pipeline = SCORING[name]
        data = make_data(pipeline.frame, Scale.full().train_rows, 20_000)
        return fit(pipeline, Scale.full(), data), data.pool
    import numpy as np
    from sklearn.compose import ColumnTransformer
    from sklearn.ensemble import (
        GradientBoostingClassifier,
        HistGradientBoostingClassifier,
        RandomForestClassifier,
    )
    from sklearn.impute import SimpleImputer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    df = _frame(20_000, 0)
    s = df["score"].fillna(0.0)
    y = ((df["count"].fillna(3) > 2) ^ (df["plan"] == "pro") ^ (np.sin(s * 3) > 0)).to_numpy(int)
    numeric = [c for c in df.columns if c != "plan"]
    ct = ColumnTransformer(
        [
            ("num", make_pipeline(SimpleImputer(), StandardScaler()), numeric),
            ("cat", OneHotEncoder(handle_unknown="ignore"), ["plan"]),
        ]
    )
    raw = df[numeric]
    models = {
        "hgb_raw": lambda: (HistGradientBoostingClassifier(max_iter=100, random_state=0), raw),
        "ct_hgb": lambda: (
            make_pipeline(ct, HistGradientBoostingClassifier(max_iter=100, random_state=0)),
            df,
        ),
        "scaled_rf": lambda: (
            make_pipeline(ct, RandomForestClassifier(100, max_depth=8, random_state=0)),
            df,
        ),
        "scaled_gbc": lambda: (
            make_pipeline(ct, GradientBoostingClassifier(n_estimators=50, random_state=0)),
            df,
        ),
        "lgbm_raw": lambda: (
            _lightgbm().LGBMClassifier(n_estimators=100, verbose=-1, random_state=0),
            raw,
        ),
        "scaled_lr": lambda: (make_pipeline(ct, LogisticRegression(max_iter=500)), df),
    }
    model, frame = models[name]()
    return model.fit(frame, y), frame


def _lightgbm() -> Any:
    import lightgbm  # only its pipeline needs it (an accelerator's image may lack it)

    return lightgbm


def _probe_rows(frame: Any, n: int) -> Any:
    """Fresh rows, and the same rows with every numeric value moved one float64 step up and
    down (where a float32 graph rounds across a threshold sitting on a data value)."""
    import numpy as np
    import pandas as pd

    rows = _sample(frame, n, seed=1)
    if not hasattr(rows, "columns"):  # a float matrix
        return np.concatenate([rows, np.nextafter(rows, np.inf), np.nextafter(rows, -np.inf)])
    numeric = [c for c in rows.columns if rows[c].dtype.kind == "f"]
    up, down = rows.copy(), rows.copy()
    up[numeric] = np.nextafter(rows[numeric].to_numpy(), np.inf)
    down[numeric] = np.nextafter(rows[numeric].to_numpy(), -np.inf)
    return pd.concat([rows, up, down], ignore_index=True)


def _sample(rows: Any, n: int, seed: int) -> Any:
    """``n`` rows drawn with replacement from a DataFrame or a matrix."""
    import numpy as np

    index = np.random.default_rng(seed).integers(0, len(rows), n)
    if hasattr(rows, "iloc"):
        return rows.iloc[index].reset_index(drop=True)
    return np.ascontiguousarray(rows[index])


#: CompileOptions per ``--lowering``.
LOWERINGS: dict[str, dict[str, Any]] = {
    "auto": {},
    "xla": {"host_rows": 0},
    "host": {"backend": "numpy"},
}


def serve(
    name: str, batches: list[int], lowering: str = "auto", extra: dict[str, Any] | None = None
) -> None:
    """Runs inside a checkout: fit, compile and check one pipeline, print that as a JSON line,
    then answer each ``<batch> <calls>`` line on stdin with the seconds of each call (JSON)."""
    import numpy as np

    import compiler

    model, frame = _fit(name)
    t0 = time.perf_counter()
    options = compiler.CompileOptions(max_batch=1024, **LOWERINGS[lowering], **(extra or {}))
    compiled = compiler.compile(model, options=options)
    compile_s = time.perf_counter() - t0
    probe = _probe_rows(frame, 5000)
    labels = int(np.sum(compiled.predict(probe) != model.predict(probe)))
    dp = float(np.max(np.abs(compiled.predict_proba(probe) - model.predict_proba(probe))))
    feeds = {}
    for batch in batches:
        feeds[batch] = _sample(frame, batch, seed=2)
        compiled.predict_proba(feeds[batch])
    print(json.dumps({"labels": labels, "max_dp": dp, "compile_s": compile_s}), flush=True)
    for line in sys.stdin:
        batch, calls = map(int, line.split())
        samples = []
        for _ in range(calls):
            t = time.perf_counter()
            compiled.predict_proba(feeds[batch])
            samples.append(time.perf_counter() - t)
        print(json.dumps(samples), flush=True)


class _Worker:
    """One checkout's :func:`serve` in a process on core 0 (both checkouts share it)."""

    def __init__(
        self,
        checkout: Path,
        name: str,
        batches: list[int],
        lowering: str,
        extra: dict[str, Any] | None = None,
    ) -> None:
        # The checkout first, before whatever else the path holds (an image's own packages).
        path = os.pathsep.join(filter(None, [str(checkout), os.environ.get("PYTHONPATH")]))
        env = {**os.environ, **ONE_THREAD, "PYTHONPATH": path}
        code = (
            f"import sys; sys.path.insert(0, {str(ROOT / 'bench')!r}); import exactness; "
            f"exactness.serve({name!r}, {batches!r}, {lowering!r}, {extra!r})"
        )
        self.process = subprocess.Popen(
            ["taskset", "-c", "0", sys.executable, "-c", code],
            cwd=checkout,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.checked = self._answer()

    def _answer(self) -> Any:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"worker exited with {self.process.wait()}")
        return json.loads(line)

    def time(self, batch: int, calls: int) -> list[float]:
        assert self.process.stdin is not None
        self.process.stdin.write(f"{batch} {calls}\n")
        self.process.stdin.flush()
        return list(self._answer())

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait()


def _paired(
    checkouts: dict[str, Path],
    name: str,
    batches: list[int],
    rounds: int,
    lowering: str,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Both checkouts' pipeline timed in alternating rounds of a few calls, the order switched
    each round, so that drift of a shared machine hits both alike: per batch the medians and
    the median of the per-round ratios (exact / baseline)."""
    workers: dict[str, _Worker] = {}
    try:
        for label, checkout in checkouts.items():  # one by one: a failed start stops the others
            options = extra if label == "exact" else None
            workers[label] = _Worker(checkout, name, batches, lowering, options)
        times: dict[str, dict[int, list[float]]] = {k: {b: [] for b in batches} for k in workers}
        ratios: dict[int, list[float]] = {b: [] for b in batches}
        order = list(workers)
        for r in range(rounds):
            for batch in batches:
                calls = 5 if batch > 1 else 50
                medians = {}
                for label in order if r % 2 == 0 else order[::-1]:
                    samples = workers[label].time(batch, calls)
                    times[label][batch] += samples
                    medians[label] = statistics.median(samples)
                ratios[batch].append(medians["exact"] / medians["baseline"])
        return {
            "checked": {k: w.checked for k, w in workers.items()},
            "median": {
                k: {b: statistics.median(v) for b, v in t.items()} for k, t in times.items()
            },
            "ratio": {b: statistics.median(v) for b, v in ratios.items()},
            "spread": {b: (min(v), max(v)) for b, v in ratios.items()},
        }
    finally:
        for w in workers.values():
            w.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", default="HEAD", help="git revision to compare against")
    parser.add_argument(
        "--baseline-dir", type=Path, help="a checkout of the baseline (instead of --baseline)"
    )
    parser.add_argument("--batches", default="1,10000", help="comma-separated batch sizes")
    parser.add_argument("--rounds", type=int, default=40, help="paired rounds per batch")
    parser.add_argument("--pipelines", default=",".join(PIPELINES))
    parser.add_argument("--lowering", default="auto", choices=sorted(LOWERINGS))
    parser.add_argument(
        "--options", default="{}", help="CompileOptions of this checkout only, as JSON"
    )
    args = parser.parse_args()
    extra = json.loads(args.options)
    batches = [int(b) for b in args.batches.split(",")]
    with _baseline(args.baseline, args.baseline_dir) as base:
        checkouts = {"baseline": base, "exact": ROOT}
        for name in args.pipelines.split(","):
            try:
                result = _paired(checkouts, name, batches, args.rounds, args.lowering, extra)
            except RuntimeError as exc:
                print(f"{name} | error: {exc}", flush=True)
                continue
            _print_row(name, result, batches)


@contextlib.contextmanager
def _baseline(revision: str, directory: Path | None) -> Iterator[Path]:
    """The baseline checkout: ``directory`` as it is, else ``revision`` in a temporary git
    worktree, removed afterwards."""
    if directory is not None:
        if not (directory / "compiler").is_dir():
            raise SystemExit(f"--baseline-dir {directory}: no checkout there (no compiler/)")
        yield directory.resolve()
        return
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "baseline"
        subprocess.run(
            ["git", "worktree", "add", "--detach", "-q", str(base), revision], cwd=ROOT, check=True
        )
        try:
            yield base
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT)


def _print_row(name: str, result: dict[str, Any], batches: list[int]) -> None:
    cells = [name]
    for label in ("baseline", "exact"):
        checked = result["checked"][label]
        cells.append(f"{label}: labels≠ {checked['labels']}, max|Δp| {checked['max_dp']:.1e}")
    for batch in batches:
        base, exact = (result["median"][k][batch] * 1e3 for k in ("baseline", "exact"))
        low, high = result["spread"][batch]
        cells.append(
            f"b{batch}: {base:.3f} → {exact:.3f} ms ({result['ratio'][batch]:.2f}x; rounds "
            f"{low:.2f}-{high:.2f})"
        )
    print(" | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
