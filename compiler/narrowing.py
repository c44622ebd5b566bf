"""Float64 rows as float32, chosen columns rounded toward -inf.

Trees that compare in float64 (HistGradientBoosting, LightGBM) take float32 rows in Kestrel: a
value rounded *down* to float32 keeps ``x <= threshold`` exactly where the source had it, since
thresholds are float32-floored too (see ``compiler/trees/splits.py``). A request's rows are
narrowed once, before scoring.

Small requests run a native loop (numba, :mod:`lazy.native`): 1.7 µs for a 50-column row where
the numpy formulation's ten calls take 6.6 µs (measured side by side; on an HGB model served
over HTTP that was ~20 % of a single-row request's CPU). Large ones run the numpy formulation in
cache-sized blocks, which vectorizes where the loop's branch does not (100k rows × 50 columns:
10 ms against the loop's 18 ms); so does everything without numba.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from lazy import native

#: Values up to which the native loop runs (numpy's fixed cost ~5 µs, then ~2 ns a value; the
#: loop's ~1 µs, then ~3.5 ns a value).
NATIVE_VALUES = 4096
#: Rows the numpy formulation converts per pass: a block's float64 rows and temporaries stay in
#: cache (100k rows × 50 columns: 13 ms in 4096-row blocks, 36 ms in one pass).
NARROW_BLOCK_ROWS = 4096


def narrow_rounding_down(x: np.ndarray, columns: frozenset[int]) -> np.ndarray:
    """``x`` (float64, 2-D) as float32: ``columns`` rounded toward -inf (the largest float32 not
    above each value; beyond float32's range, its largest finite value), the rest to nearest.
    NaN stays NaN."""
    narrow = np.empty(x.shape, np.float32)
    if native.AVAILABLE and x.size <= NATIVE_VALUES:
        _kernel()(x, _mask(columns, x.shape[1]), narrow, narrow.view(np.int32))
        return narrow
    every = len(columns) == x.shape[1]
    index = slice(None) if every else sorted(columns)
    for start in range(0, x.shape[0], NARROW_BLOCK_ROWS):
        stop = start + NARROW_BLOCK_ROWS
        _narrow_block(x[start:stop], narrow[start:stop], index, every)
    return narrow


def _narrow_block(x: np.ndarray, narrow: np.ndarray, index: Any, every: bool) -> None:
    """:func:`narrow_rounding_down` of rows ``x`` into ``narrow`` (float32, same shape), numpy."""
    with np.errstate(over="ignore"):  # beyond float32's range: inf, then the largest below
        narrow[...] = x
    part = narrow if every else narrow[:, index]
    rounded_up = part > (x if every else x[:, index])  # float32 vs float64: compared exactly
    # One float32 step toward -inf on the bits, elementwise (no per-value nextafter): a
    # positive value's bits minus one, a negative one's (and -0.0's) plus one; +inf becomes
    # the largest finite float32.
    bits = part.view(np.int32)
    bits -= ((bits >> 31) | 1) * rounded_up
    if not every:
        narrow[:, index] = part


@functools.lru_cache(maxsize=256)
def _mask(columns: frozenset[int], width: int) -> np.ndarray:
    """``columns`` of ``width`` as a read-only boolean mask (a model's schema asks for the same
    one on every request)."""
    mask = np.zeros(width, bool)
    mask[sorted(columns)] = True
    mask.flags.writeable = False
    return mask


@functools.cache
def _kernel() -> Callable[..., None]:
    # The numpy formulation element by element: ``bits`` is ``narrow`` viewed as int32.
    def narrow_down(x, down, narrow, bits):  # type: ignore[no-untyped-def]
        for i in range(x.shape[0]):
            for j in range(x.shape[1]):
                value = x[i, j]
                rounded = np.float32(value)  # beyond float32's range: ±inf
                narrow[i, j] = rounded
                if down[j] and rounded > value:  # float32 vs float64: compared exactly
                    step = bits[i, j]
                    bits[i, j] = step - 1 if step >= 0 else step + 1

    return native.compile_kernel(narrow_down)
