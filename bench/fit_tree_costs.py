"""Fit compiler/trees/cost.py's model to ``bench/tree_strategies.py --json`` measurements.

Each strategy's cost, in ns per row on the largest batch measured, is a linear function of the
ensemble's shape (T trees, depth D, L leaves per tree, I = L - 1 splits per tree, ΣD the sum
of the trees' own depths) with
non-negative coefficients, fitted for relative error. Prints the coefficients, each
measurement against the fit, and how much slower than the fastest strategy the fitted choice
is at every batch size (the regret ``auto`` would have).

Usage: python bench/fit_tree_costs.py docs/tree-costs.json [more.json ...]
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import nnls

from compiler.trees.cost import HYBRID_TOP_SPLITS
from lazy.node_tables import TOP_LEVELS, WORD_BITS

#: Per strategy: the features its cost is linear in, and when it is a candidate.
Features = Callable[[dict[str, Any]], list[float]]
MODELS: dict[str, tuple[tuple[str, ...], Features, Callable[[dict[str, Any]], bool]]] = {
    "traversal": (
        ("1", "T·D"),
        lambda r: [1.0, r["n_trees"] * r["depth"]],
        lambda r: True,
    ),
    "bitvector": (
        ("1", "T·I"),
        lambda r: [1.0, r["n_trees"] * (r["leaves"] - 1)],
        lambda r: r["leaves"] <= WORD_BITS,
    ),
    # Up to 5 levels deep the hybrid is the bit-vector strategy (the same graph).
    "hybrid": (
        ("1", "T·min(I,31)", "T·(D−5)"),
        lambda r: [
            1.0,
            r["n_trees"] * min(r["leaves"] - 1, HYBRID_TOP_SPLITS),
            r["n_trees"] * (r["depth"] - TOP_LEVELS),
        ],
        lambda r: r["depth"] > TOP_LEVELS,
    ),
    # ΣD: the sum of the trees' own depths (measurements before it was recorded lack it).
    "treewise": (
        ("1", "ΣD"),
        lambda r: [1.0, r["levels"]],
        lambda r: "levels" in r,
    ),
}


def fit(records: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    """Per strategy: non-negative coefficients minimizing the relative error in ns per row."""
    top = max(r["batch"] for r in records)
    coefficients = {}
    for name, (_, features, eligible) in MODELS.items():
        rows = [r for r in records if r["batch"] == top and name in r["ms"] and eligible(r)]
        if not rows:
            continue
        y = np.array([r["ms"][name] * 1e6 / top for r in rows])
        a = np.array([features(r) for r in rows])
        coefficients[name], _ = nnls(a / y[:, None], np.ones(len(y)))
    return coefficients


def predict(coefficients: dict[str, np.ndarray], record: dict[str, Any]) -> dict[str, float]:
    return {
        name: float(np.dot(c, MODELS[name][1](record)))
        for name, c in coefficients.items()
        if MODELS[name][2](record)
    }


def main(paths: list[str]) -> int:
    records: list[dict[str, Any]] = []
    for path in paths:  # a bench/tree_strategies.py --json list, or docs/tree-costs.json
        doc = json.loads(Path(path).read_text())
        records += doc["records"] if isinstance(doc, dict) else doc
    coefficients = fit(records)
    for name, c in coefficients.items():
        terms = " + ".join(f"{v:.3g}·{t}" for v, t in zip(c, MODELS[name][0], strict=True))
        print(f"{name:10s} ns/row = {terms}")
    print()
    regrets: dict[int, list[float]] = {}
    for r in records:
        measured = {n: v for n, v in r["ms"].items() if n in MODELS and MODELS[n][2](r)}
        if not measured:
            continue
        estimate = {n: v for n, v in predict(coefficients, r).items() if n in measured}
        pick = min(estimate, key=estimate.__getitem__)
        best = min(measured, key=measured.__getitem__)
        regret = measured[pick] / measured[best]
        regrets.setdefault(r["batch"], []).append(regret)
        print(
            f"{r['family']:4s} T={r['n_trees']:<3d} D={r['depth']:<2d} L={r['leaves']:<4d} "
            f"batch {r['batch']:<6d} best {best:9s} {measured[best]:9.3f} ms, "
            f"fit picks {pick:9s} ({regret:.2f}× best)"
        )
    for batch, values in sorted(regrets.items()):
        print(
            f"batch {batch}: fitted pick within {max(values):.2f}× of the best "
            f"(median {np.median(values):.2f}×, {len(values)} models)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
