"""``k @ w`` for bounded ``k``, accurate where float32 sums cancel: kernel machines' dual sums.

A kernel machine's decision sums thousands of terms ``K(x, sv_i) * w_i`` of both signs: with C = 1
and overlapping classes most dual coefficients sit at ±C, so ``Σ|K w|`` runs to hundreds while the
decision is about 1. A float32 matmul rounds every partial sum, so it loses ``Σ|K w| / |decision|``
(here ~500×) of float32's precision, about 1e-4 on the decision; libsvm sums in float64.

The fix is an Ozaki-style split into a part whose float32 sum is exact and a part small enough
that its rounding no longer matters:

* ``k1`` is ``k`` rounded to a fixed grid of ``2^-a`` (``k`` is bounded by 1), ``k2 = k - k1``;
* ``w1`` is each column of ``w`` rounded to ``b`` bits below its largest power of two,
  ``w2 = w - w1``; the dual coefficients at ±C need one bit, so they land in ``w1`` whole, and
  ``b`` is chosen per model to leave the least behind.

Every product ``k1 * w1`` is an integer multiple of the same unit with at most ``a + b`` bits, so
with ``a + b + ceil(log2 n) <= 24`` every partial sum of ``k1 @ w1`` is exact, in any order and on
any matmul kernel. What is left, ``k1 @ w2 + k2 @ w``, is ~``2^-a``-``2^-b`` of the original size.

Cost: two matmuls, ``k1 @ [w1 | w2]`` and ``k2 @ w``. XLA:CPU materialises ``k`` once and feeds
each from its own elementwise pass over it; concatenating ``[k1 | k2]`` into ONE matmul instead
wrote the (B, 2n) concatenation as an extra copy and ran a wider product, slower than the two
matmuls.
"""

from __future__ import annotations

import math

import numpy as np

import lazy as lz

from ..context import Context

_MANTISSA = {"float32": 24}  # float64 sums as libsvm does: the plain matmul is already faithful


def _column_split(w: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """``w = w1 + w2`` with each column of ``w1`` on a grid ``bits`` bits below its magnitude."""
    top = np.abs(w).max(axis=0)
    exponent = np.ceil(np.log2(np.where(top > 0, top, 1.0)))
    unit = np.exp2(exponent - bits)
    w1 = np.round(w / unit) * unit
    return w1, w - w1


def _weight_bits(w: np.ndarray, budget: int) -> int:
    """The bits of ``w1`` (the rest go to ``k1``) that leave the smallest inexact part, estimated
    as ``Σ|w2| E|k| + Σ|w| 2^-(k_bits + 2)`` with ``E|k|`` taken as 1/2: dual coefficients at ±C
    need one bit, which leaves every other bit to ``k``."""

    def left(bits: int) -> float:
        return float(
            np.abs(_column_split(w, bits)[1]).sum() / 2 + np.abs(w).sum() / 2 ** (budget - bits + 2)
        )

    return min(range(1, budget), key=left)


def bounded_matmul(k: lz.LazyTensor, w: np.ndarray, ctx: Context, name: str) -> lz.LazyTensor:
    """``k @ w`` for a (B, n) ``k`` with ``|k| <= 1`` and fitted (n, m) weights ``w``, summed
    with float32 rounding relative to the result's terms rather than to their running sums."""
    w = np.asarray(w, np.float64)
    mantissa = _MANTISSA.get(ctx.dtype)
    if mantissa is None:
        return k @ ctx.param(w, name)
    n, m = w.shape
    # bits left for one product once n of them are summed; one spare for rounding to nearest
    budget = mantissa - max(1, math.ceil(math.log2(n))) - 1
    if budget < 4:  # too many terms for an exact part worth having
        return k @ ctx.param(w, name)
    w_bits = _weight_bits(w, budget)
    k_bits = budget - w_bits
    w1, w2 = _column_split(w, w_bits)
    grid = float(2**k_bits)  # powers of two: scaling by them is exact
    k1 = lz.floor(k * grid + 0.5) * (1.0 / grid)
    # one product for k1's two parts (its exact sum and its share of the rest), one for k2's
    by_k1 = k1 @ ctx.param(np.concatenate([w1, w2], axis=1), name)
    by_k2 = (k - k1) @ ctx.param(w, f"{name}_rest")
    exact = by_k1[:, :m]
    return exact + (by_k1[:, m:] + by_k2)  # the small parts first: one rounding on the result
