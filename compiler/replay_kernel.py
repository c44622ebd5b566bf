"""The host's replay of stacked steps (:mod:`compiler.replayed_columns`) as one native pass.

numpy replays a group of columns in a pass per step over a transposed copy, each with its
temporaries (docs/exactness.md has what that costs). This kernel works a block of rows at a
time, a column at a time: it copies the block's values of the column into a scratch vector,
applies the steps one loop each (vectorized by LLVM, the step's kind dispatched once per block
and column) and writes the float32 results into the column of the output: the same operations,
in the same order and precision, so every value is the numpy replay's bit for bit. Each loop
indexes views by its own counter only, so that LLVM proves the indices in bounds and
vectorizes; a block of the table and of the output stays in L1 across the columns.

Steps are opcodes (:func:`opcodes`): a fill, an arithmetic op in float64 rounded to the table's
dtype or in the table's dtype itself (scikit-learn's float32 StandardScaler), and a clip.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from lazy import native

from .features import Arithmetic, Clip, Fill

# Opcodes. Arithmetic in float64, rounded to the table's dtype after each op:
_SUBTRACT, _DIVIDE, _MULTIPLY, _ADD = 1, 2, 3, 4
# ... and in the table's own dtype (the parameter rounded first): these plus _IN_DTYPE.
_IN_DTYPE = 4
_FILL, _CLIP = 0, 9
_ARITHMETIC = {np.subtract: _SUBTRACT, np.divide: _DIVIDE, np.multiply: _MULTIPLY, np.add: _ADD}
#: Rows per block: a block of the table and of the output stay in L1.
BLOCK = 256


def opcodes(steps: Sequence[Any]) -> np.ndarray | None:
    """The kernel's opcodes for ``steps`` (None: a step it does not know)."""
    codes = []
    for step in steps:
        if isinstance(step, Fill):
            codes.append(_FILL)
        elif isinstance(step, Clip):
            codes.append(_CLIP)
        elif isinstance(step, Arithmetic) and step.op in _ARITHMETIC:
            codes.append(_ARITHMETIC[step.op] + (_IN_DTYPE if step.in_input_dtype else 0))
        else:
            return None
    return np.asarray(codes, np.int64)


def _apply64_loops(code: int, p: float, q: float, v: Any, n: int) -> None:
    if code == _FILL:  # a select, not a branch: it vectorizes
        for i in range(n):
            w = v[i]
            v[i] = p if np.isnan(w) else w
    elif code == _SUBTRACT or code == _SUBTRACT + _IN_DTYPE:
        for i in range(n):
            v[i] = v[i] - p
    elif code == _DIVIDE or code == _DIVIDE + _IN_DTYPE:
        for i in range(n):
            v[i] = v[i] / p
    elif code == _MULTIPLY or code == _MULTIPLY + _IN_DTYPE:
        for i in range(n):
            v[i] = v[i] * p
    elif code == _ADD or code == _ADD + _IN_DTYPE:
        for i in range(n):
            v[i] = v[i] + p
    else:  # np.clip: the upper bound last; NaN stays NaN
        for i in range(n):
            w = v[i]
            w = p if w < p else w
            v[i] = q if w > q else w


def _apply32_loops(code: int, p: float, q: float, v: Any, n: int) -> None:
    p32, q32 = np.float32(p), np.float32(q)
    if code == _FILL:
        for i in range(n):
            w = v[i]
            v[i] = p32 if np.isnan(w) else w
    elif code == _SUBTRACT:  # in float64, rounded after the op
        for i in range(n):
            v[i] = np.float32(np.float64(v[i]) - p)
    elif code == _DIVIDE:
        for i in range(n):
            v[i] = np.float32(np.float64(v[i]) / p)
    elif code == _MULTIPLY:
        for i in range(n):
            v[i] = np.float32(np.float64(v[i]) * p)
    elif code == _ADD:
        for i in range(n):
            v[i] = np.float32(np.float64(v[i]) + p)
    elif code == _SUBTRACT + _IN_DTYPE:  # in float32 throughout
        for i in range(n):
            v[i] = v[i] - p32
    elif code == _DIVIDE + _IN_DTYPE:
        for i in range(n):
            v[i] = v[i] / p32
    elif code == _MULTIPLY + _IN_DTYPE:
        for i in range(n):
            v[i] = v[i] * p32
    elif code == _ADD + _IN_DTYPE:
        for i in range(n):
            v[i] = v[i] + p32
    else:
        for i in range(n):
            w = v[i]
            w = p32 if w < p32 else w
            v[i] = q32 if w > q32 else w


def _replay_loop(
    x: Any,
    by_rows: bool,
    sources: Any,
    codes: Any,
    params: Any,
    float32_table: bool,
    out: Any,
    columns: Any,
    block: int,
) -> None:
    rows, k = out.shape[0], sources.shape[0]
    v64 = np.empty(block, np.float64)
    v32 = np.empty(block, np.float32)
    for start in range(0, rows, block):
        n = min(block, rows - start)
        done = out[start : start + n]
        for c in range(k):
            source, column = sources[c], columns[c]
            # A row of the (F, B) matrix, contiguous, or a column of the (B, F) table, strided.
            if by_rows:
                row = x[source, start : start + n]
                for i in range(n):
                    v64[i] = row[i]
            else:
                column_ = x[start : start + n, source]
                for i in range(n):
                    v64[i] = column_[i]
            if float32_table:  # the values are float32's (exact in float64)
                for i in range(n):
                    v32[i] = np.float32(v64[i])
                for s in range(codes.shape[0]):
                    _apply32(codes[s], params[s, c, 0], params[s, c, 1], v32, n)
                for i in range(n):
                    done[i, column] = v32[i]
            else:
                for s in range(codes.shape[0]):
                    _apply64(codes[s], params[s, c, 0], params[s, c, 1], v64, n)
                for i in range(n):
                    done[i, column] = np.float32(v64[i])


_kernel: Any = None
# The step loops, compiled to be inlined into the kernel (so LLVM sees and vectorizes each),
# bound when the kernel is built: numba reads them as globals.
_apply64: Any = None
_apply32: Any = None


def _built() -> Any:
    global _kernel, _apply64, _apply32
    if _kernel is None:
        from numba import njit

        _apply64 = njit(inline="always")(_apply64_loops)
        _apply32 = njit(inline="always")(_apply32_loops)
        _kernel = native.compile_kernel(_replay_loop)
    return _kernel


def replay(
    x: np.ndarray,
    sources: np.ndarray,
    codes: np.ndarray,
    params: np.ndarray,
    float32_table: bool,
    out: np.ndarray,
    columns: np.ndarray,
    *,
    by_rows: bool = False,
) -> None:
    """Columns ``sources`` of the (B, F) float64 table ``x`` through the steps ``codes`` with
    ``params`` (steps, k, 2) float64, written as float32 into columns ``columns`` of the
    (B, K) ``out``. ``float32_table``: the values are float32 (exact in ``x``), replayed in
    float32 as scikit-learn keeps them. ``by_rows``: ``x`` is (F, B), each raw column a
    contiguous row (a table that arrived column by column), and ``sources`` are rows."""
    # Row-major, so that the kernel has one layout (a client's Fortran-ordered or strided
    # array is copied): each layout would be a build of its own, seconds on a cold cache.
    x = np.ascontiguousarray(x)
    _built()(x, by_rows, sources, codes, params, float32_table, out, columns, BLOCK)


def build() -> float:
    """Build (or load from numba's cache) the kernel for every table :func:`replay` passes it;
    the seconds it took (0 without numba: numpy replays)."""
    index = np.zeros(1, np.int64)
    params, out = np.zeros((1, 1, 2)), np.zeros((1, 1), np.float32)
    return native.build_on_tables(
        lambda table: replay(table, index, index, params, False, out, index)
    )
