"""What exact decisions cost: this checkout's compiled pipelines against a baseline revision's.

Each pipeline is fitted on the same mixed frame (integer, binary and rounded continuous columns
with NaN, a string column), compiled by both checkouts, and timed on ``predict_proba`` at the
given batch sizes, one thread, in worker processes that alternate between the two checkouts
(round-robin, so drift on a shared machine hits both alike); cells are the best of the workers'
medians. Each worker also reports how many labels differ from scikit-learn's on probe rows built
on the trees' own thresholds (``_probe_rows``), and the largest probability difference.

The baseline is a git revision, checked out into a temporary worktree (``--baseline``, default
``HEAD``: the last commit, against the working tree). Prints a table; never asserts.

``--lowering``: ``auto`` times what warm-up places (host kernels or XLA per bucket, by timing, so
two runs of one checkout may differ); ``xla`` and ``host`` pin every bucket to one, so that the
two checkouts are compared like for like.

Usage: python bench/exactness.py [--baseline REV] [--batches 1,10000] [--rounds R] [--workers W]
       [--lowering auto|xla|host]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
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
    """(fitted pipeline, its training frame)."""
    import lightgbm as lgb
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
        "lgbm_raw": lambda: (lgb.LGBMClassifier(n_estimators=100, verbose=-1, random_state=0), raw),
        "scaled_lr": lambda: (make_pipeline(ct, LogisticRegression(max_iter=500)), df),
    }
    model, frame = models[name]()
    return model.fit(frame, y), frame


def _probe_rows(frame: Any, n: int) -> Any:
    """Fresh rows, and the same rows with every numeric value moved one float64 step up and
    down (where a float32 graph rounds across a threshold sitting on a data value)."""
    import numpy as np
    import pandas as pd

    rows = frame.sample(n, replace=True, random_state=1).reset_index(drop=True)
    numeric = [c for c in rows.columns if rows[c].dtype.kind == "f"]
    up, down = rows.copy(), rows.copy()
    up[numeric] = np.nextafter(rows[numeric].to_numpy(), np.inf)
    down[numeric] = np.nextafter(rows[numeric].to_numpy(), -np.inf)
    return pd.concat([rows, up, down], ignore_index=True)


#: CompileOptions per ``--lowering``.
LOWERINGS: dict[str, dict[str, Any]] = {
    "auto": {},
    "xla": {"host_rows": 0},
    "host": {"backend": "numpy"},
}


def worker(name: str, batches: list[int], rounds: int, lowering: str = "auto") -> dict[str, Any]:
    """Runs inside a checkout: fit, compile, check and time one pipeline."""
    import numpy as np

    import compiler

    model, frame = _fit(name)
    t0 = time.perf_counter()
    options = compiler.CompileOptions(max_batch=1024, **LOWERINGS[lowering])
    compiled = compiler.compile(model, options=options)
    compile_s = time.perf_counter() - t0
    probe = _probe_rows(frame, 5000)
    labels = int(np.sum(compiled.predict(probe) != model.predict(probe)))
    dp = float(np.max(np.abs(compiled.predict_proba(probe) - model.predict_proba(probe))))
    times = {}
    for batch in batches:
        rows = frame.sample(batch, replace=True, random_state=2).reset_index(drop=True)
        feed = rows if batch > 1 else rows.iloc[:1]
        compiled.predict_proba(feed)
        samples = []
        for _ in range(rounds):
            t = time.perf_counter()
            compiled.predict_proba(feed)
            samples.append(time.perf_counter() - t)
        times[str(batch)] = statistics.median(samples)
    return {"labels": labels, "max_dp": dp, "compile_s": compile_s, "times": times}


def _run(
    checkout: Path, name: str, batches: list[int], rounds: int, lowering: str
) -> dict[str, Any]:
    env = {**os.environ, **ONE_THREAD, "PYTHONPATH": str(checkout)}
    code = (
        f"import sys, json; sys.path.insert(0, {str(ROOT / 'bench')!r}); import exactness; "
        f"print(json.dumps(exactness.worker({name!r}, {batches!r}, {rounds}, {lowering!r})))"
    )
    done = subprocess.run(
        ["taskset", "-c", "0", sys.executable, "-c", code],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr else "failed"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", default="HEAD", help="git revision to compare against")
    parser.add_argument("--batches", default="1,10000", help="comma-separated batch sizes")
    parser.add_argument("--rounds", type=int, default=30, help="timed calls per worker")
    parser.add_argument("--workers", type=int, default=2, help="workers per checkout")
    parser.add_argument("--pipelines", default=",".join(PIPELINES))
    parser.add_argument("--lowering", default="auto", choices=sorted(LOWERINGS))
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "baseline"
        subprocess.run(
            ["git", "worktree", "add", "--detach", "-q", str(base), args.baseline],
            cwd=ROOT,
            check=True,
        )
        try:
            rows = []
            for name in args.pipelines.split(","):
                results: dict[str, list[dict[str, Any]]] = {"baseline": [], "exact": []}
                for _ in range(args.workers):
                    for label, checkout in (("baseline", base), ("exact", ROOT)):
                        run = _run(checkout, name, batches, args.rounds, args.lowering)
                        results[label].append(run)
                rows.append((name, results))
                _print_row(name, results, batches)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT)


def _print_row(name: str, results: dict[str, list[dict[str, Any]]], batches: list[int]) -> None:
    cells = [name]
    for label in ("baseline", "exact"):
        runs = [r for r in results[label] if "error" not in r]
        if not runs:
            cells.append(f"{label}: error {results[label][0]['error']}")
            continue
        first = runs[0]
        cells.append(f"{label}: labels≠ {first['labels']}, max|Δp| {first['max_dp']:.1e}")
    for batch in batches:
        best = {}
        for label in ("baseline", "exact"):
            runs = [r for r in results[label] if "error" not in r]
            if runs:
                best[label] = min(r["times"][str(batch)] for r in runs)
        if len(best) == 2:
            ratio = best["exact"] / best["baseline"]
            cells.append(
                f"b{batch}: {best['baseline'] * 1e3:.3f} → {best['exact'] * 1e3:.3f} ms "
                f"({ratio:.2f}x)"
            )
    print(" | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
