"""The native host kernels built before a model needs them.

numba compiles FOREST_SUM's two kernels (:mod:`lazy.forest`, :mod:`lazy.forest_bits`) and
COUPLE's (:mod:`lazy.coupling`) once per combination of argument types, and caches the machine
code on disk. On a cold cache each compile takes seconds, which the first tree or SVC model would
otherwise spend between its upload and READY. :func:`warm_kernels` builds every combination the
graphs use, through the numpy backend as a model's plan runs them (so the types are the ones a
model's tables have), on a throwaway one-tree forest and a two-class coupling; with a warm cache
it only loads them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import numpy as np

from . import coupling, native
from .dtypes import DTypePolicy
from .executor import Options, compile
from .forest import BIT_ROWS
from .graph import Graph
from .program import Builder
from .tensor import forest_sum

#: (feature dtype, leaf value dtype) of the FOREST_SUMs models compile to, the common ones
#: first: float32 trees; float64 thresholds with float32 leaves (scikit-learn's exact
#: comparisons in a float32 model); float64 boosters; float64 leaves on float32 rows.
DTYPE_PAIRS: tuple[tuple[str, str], ...] = (
    ("float32", "float32"),
    ("float64", "float32"),
    ("float64", "float64"),
    ("float32", "float64"),
)

_built: set[tuple[str, str]] = set()  # pairs this process has built: numba keeps them loaded
_coupled: set[str] = set()  # float dtypes COUPLE's kernel is built for
_lock = threading.Lock()


def warm_kernels(pairs: Sequence[tuple[str, str]] = DTYPE_PAIRS) -> float:
    """Build (or load from numba's cache) FOREST_SUM's kernels for each (feature dtype, value
    dtype) in ``pairs``: the row-by-row walk and the batch kernel. Returns the seconds it took;
    0 where numba is missing (the numpy backend then walks in whole-array numpy) or the pairs
    are already built in this process."""
    if not native.AVAILABLE:
        return 0.0
    t0 = time.perf_counter()
    # Buckets up to BIT_ROWS: the smaller ones walk row by row, the last runs the batch kernel.
    options = Options(
        backend="numpy", max_batch=BIT_ROWS, call_rows=BIT_ROWS, dtype_policy=DTypePolicy.X64
    )
    with _lock:
        for pair in pairs:
            if pair not in _built:
                compile(_one_tree(*pair), options, warmup=True)
                _built.add(pair)
        for dtype in sorted({d for pair in pairs for d in pair} - _coupled):
            coupling.native(2)(np.full((1, 1), 0.5, dtype))
            _coupled.add(dtype)
    return time.perf_counter() - t0


def _one_tree(features: str, values: str) -> Graph:
    """A graph of one FOREST_SUM over a depth-1 tree: x[:, 0] > 0.5 picks leaf 1 or 2."""
    b = Builder()
    x = b.input("x", (1,), features)
    tables = [
        b.param(np.zeros(3, np.int64), "feature"),
        b.param(np.array([0.5, 0.0, 0.0], features), "threshold"),
        b.param(np.zeros(3, bool), "nan_right"),
        b.param(np.array([1, 1, 2], np.int64), "left"),
        b.param(np.array([[0.0], [1.0], [2.0]], values), "value"),
    ]
    return b.graph({"y": forest_sum(x, *tables, trees=1, depth=1)})
