"""Reading a child estimator's heads the way a meta-estimator consumes them.

Meta-estimators (voting, stacking, bagging, chains, calibration) call their children's methods and
combine the results. These helpers fetch a child's head, turn a child classifier's ``predict``
(int32 indices into its ``classes_``) into the class values themselves, and build one-hot votes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import lazy as lz

from ..context import Context
from ..errors import UnsupportedError
from ..features import Heads


def head(heads: Heads, method: str, child: Any, ctx: Context) -> lz.LazyTensor:
    """The child's compiled ``method`` output, or an error naming what is missing."""
    out = heads.outputs.get(method)
    if out is None or not hasattr(child, method):
        raise UnsupportedError(
            f"{ctx.path}: {type(child).__name__} has no compiled {method!r} "
            f"(compiled: {sorted(heads.outputs)})"
        )
    return out


def columns(values: lz.LazyTensor) -> lz.LazyTensor:
    """(B,) → (B, 1); (B, k) unchanged."""
    return lz.reshape(values, (lz.B, 1)) if values.ndim == 1 else values


def class_codes(heads: Heads, child: Any, ctx: Context) -> lz.LazyTensor:
    """``predict`` of a child classifier fitted on integer-encoded targets: its predicted class
    values (the codes), int32 (B,)."""
    index = head(heads, "predict", child, ctx)
    classes = np.asarray(child.classes_)
    if classes.dtype.kind not in "iu":
        raise UnsupportedError(
            f"{ctx.path}: {type(child).__name__} should predict integer class codes, "
            f"has classes {classes[:5]!r}"
        )
    if np.array_equal(classes, np.arange(len(classes))):
        return index
    return lz.take(ctx.param(classes.astype(np.int32), "classes_"), index, axis=0)


def class_values(heads: Heads, child: Any, ctx: Context) -> lz.LazyTensor:
    """``predict`` of a child classifier with numeric classes, as float label values (B,)."""
    index = head(heads, "predict", child, ctx)
    classes = np.asarray(child.classes_)
    if classes.dtype.kind not in "iufb":
        raise UnsupportedError(
            f"{ctx.path}: {type(child).__name__}'s predictions feed a later model, so its "
            f"classes must be numeric, got {classes[:5]!r}"
        )
    return lz.take(ctx.param(classes.astype(np.float64), "classes_"), index, axis=0)


def one_hot(codes: lz.LazyTensor, n: int, ctx: Context, dtype: str | None = None) -> lz.LazyTensor:
    """int32 codes (B,) → (B, n) float indicator rows (``dtype``, default the graph's)."""
    hit = lz.reshape(codes, (lz.B, 1)) == ctx.const(np.arange(n), "int32")
    return lz.cast(hit, dtype or ctx.dtype)


def binary_response(heads: Heads, method: str, child: Any, ctx: Context) -> lz.LazyTensor:
    """What scikit-learn's ``_get_response_values`` returns for a classifier: for two classes the
    positive (last) class's probability, or the decision; otherwise the full output."""
    if method == "predict":
        return class_values(heads, child, ctx)
    if method == "predict_log_proba":
        out = lz.log(head(heads, "predict_proba", child, ctx))
    else:
        out = head(heads, method, child, ctx)
    if len(child.classes_) == 2 and method in ("predict_proba", "predict_log_proba"):
        return out[:, 1]
    return out
