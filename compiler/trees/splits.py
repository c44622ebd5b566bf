"""Splits decided by one comparison, missing values included.

A split sends ``x`` right iff ``x > t``, and a NaN right iff its missing direction says so. The
strategies compare ``v > t`` on a widened copy of the features instead, where the column picks
the NaN direction, so a step needs one gather of ``v`` and no NaN test or direction table:

- block 0, ``x`` itself: a NaN compares false, so it goes left;
- block 1, ``x`` with NaN as +inf: a NaN goes right of every threshold below +inf;
- block 2 (only if some NaN-right split has threshold +inf, where block 1 cannot tell NaN from a
  real +inf): ``isnan(x)`` as 0/1, compared with 0.5 — every non-NaN goes left of +inf.

Column ``f + F * block`` of the widened features is feature f's block. Leaves and padding use
threshold +inf in block 0: nothing goes right of them.

Where the graph proves no NaN reaches the splits (``lz.may_be_nan``: features out of an imputer,
an encoder, a scaler), block 0 alone serves every split, and the strategies' copies of the
features (the hybrid strategy's column-major one, say) are half as wide. Splits folded onto raw
columns (:mod:`.folding`) read columns that may hold NaN, so they take the blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import lazy as lz

from ..context import Context
from ..float32_inputs import float32_floor
from .model import Ensemble


@dataclass(frozen=True)
class SplitColumns:
    """The widened features (B, F * blocks) and how to address them."""

    x: lz.LazyTensor
    dtype: str  # the precision the source compares in
    width: int  # F, the features per block
    nan_blocks: bool = True  # False: x alone (no NaN can reach the splits)

    def thresholds(self, t: np.ndarray) -> np.ndarray:
        """``t`` in the comparison's precision (float32: the largest float32 not above t)."""
        return thresholds_in(self.dtype, t)

    def encode(
        self, feature: np.ndarray, threshold: np.ndarray, nan_right: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per split: (column of the widened features, threshold) so that ``v > t`` goes right."""
        t = self.thresholds(threshold)
        if not self.nan_blocks:  # no NaN to steer: every split compares x itself
            return np.asarray(feature, np.int64), t
        nan_right = np.asarray(nan_right, bool)
        infinite = nan_right & (t == np.inf)
        block = np.where(infinite, 2, nan_right.astype(np.int64))
        return np.asarray(feature, np.int64) + self.width * block, np.where(infinite, 0.5, t)


def thresholds_in(dtype: str, t: np.ndarray) -> np.ndarray:
    """Thresholds ``t`` for comparing ``dtype`` features: for float32, the largest float32 not
    above each (``x <= t`` iff ``x <= t32`` for every float32 x)."""
    return float32_floor(t) if dtype == "float32" else np.asarray(t, np.float64)


def compare_dtype(ensemble: Ensemble, x: lz.LazyTensor, ctx: Context) -> str:
    """The precision ``ensemble``'s splits compare in (see :func:`split_columns`): float32 for
    sources comparing ``float32(x)``, and for float32 features (split codes, say) in a float64
    step too: for float32 ``v``, ``v <= t`` iff ``v <= floor32(t)``, so comparing in float32
    decides as float64 does at half the width; float64 where the features are float64 (raw
    float64 columns, :mod:`.folding`), or the graph is."""
    if ensemble.float32_inputs or x.dtype == "float32":
        return "float32"
    return "float64" if "float64" in (ctx.dtype, x.dtype) else "float32"


def _needs_isnan_block(ensemble: Ensemble, dtype: str) -> bool:
    for tree in ensemble.trees:
        split = ~tree.is_leaf & ~tree.missing_left
        t = tree.threshold[split]
        if np.any((float32_floor(t) if dtype == "float32" else t) == np.inf):
            return True
    return False


def split_columns(ensemble: Ensemble, x: lz.LazyTensor, ctx: Context) -> SplitColumns:
    """The widened features of ``x`` (B, F) for ``ensemble``'s splits.

    scikit-learn's ``tree_`` compares ``float32(x) <= t`` (t float64), which equals
    ``float32(x) <= t32`` with ``t32`` the largest float32 not above t; HistGradientBoosting
    compares float64, exact in a float64 graph and, in a float32 graph, for every float32 input.
    """
    dtype = compare_dtype(ensemble, x, ctx)
    x = x if x.dtype == dtype else lz.cast(x, dtype)
    if not ctx.may_be_nan(x):
        return SplitColumns(x, dtype, int(x.shape[1]), nan_blocks=False)
    missing = lz.isnan(x)
    blocks = [x, lz.where(missing, np.inf, x)]
    if _needs_isnan_block(ensemble, dtype):
        blocks.append(lz.cast(missing, dtype))
    return SplitColumns(lz.concat(blocks, axis=1), dtype, int(x.shape[1]))
