"""CalibratedClassifierCV: each (classifier, calibrators) pair's one-vs-rest calibrated
probabilities, averaged over the pairs."""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.calibration import CalibratedClassifierCV
from sklearn.isotonic import IsotonicRegression

import lazy as lz

from ..context import Context
from ..errors import UnsupportedError
from ..features import Features, Heads
from ..registry import register, unsupported_param
from ._children import columns, head


def _sigmoid(calibrator: Any, t: lz.LazyTensor, ctx: Context) -> lz.LazyTensor:
    """``_SigmoidCalibration.predict``: expit(-(a t + b))."""
    return lz.sigmoid(-(t * float(calibrator.a_) + float(calibrator.b_)))


def _isotonic(calibrator: Any, t: lz.LazyTensor, ctx: Context) -> lz.LazyTensor:
    """``IsotonicRegression.predict`` with out_of_bounds='clip': clip to the fitted range, then
    linear interpolation between the fitted thresholds (scipy's interp1d: the segment is found by
    a left-sided searchsorted, clipped to the first and last segments)."""
    if calibrator.out_of_bounds != "clip":
        raise unsupported_param(calibrator, "out_of_bounds", calibrator.out_of_bounds, "'clip'")
    x = np.asarray(calibrator.X_thresholds_, np.float64)
    y = np.asarray(calibrator.y_thresholds_, np.float64)
    if len(y) == 1:
        return t * 0.0 + float(y[0])
    t = lz.minimum(lz.maximum(t, float(calibrator.X_min_)), float(calibrator.X_max_))
    # searchsorted(x, t, 'left') = #{x_j < t}; clipped to [1, n - 1] it is the segment's end
    inner = ctx.param(x[1:-1], "X_thresholds_")
    segment = lz.sum(lz.cast(lz.reshape(t, (lz.B, 1)) > inner, "int32"), axis=1)  # in [0, n-2]
    slope = np.diff(y) / np.diff(x)
    lo_x = lz.take(ctx.param(x[:-1], "segment_x"), segment, axis=0)
    lo_y = lz.take(ctx.param(y[:-1], "segment_y"), segment, axis=0)
    rate = lz.take(ctx.param(slope, "segment_slope"), segment, axis=0)
    return rate * (t - lo_x) + lo_y


_CALIBRATORS = {"sigmoid": _sigmoid, "isotonic": _isotonic}


def _calibrated_proba(
    pair: Any, features: Features, n: int, name: str, ctx: Context
) -> lz.LazyTensor:
    """``_CalibratedClassifier.predict_proba`` (sigmoid / isotonic, one-vs-rest)."""
    child = pair.estimator
    heads = ctx.convert(child, features, name)
    method = "decision_function" if hasattr(child, "decision_function") else "predict_proba"
    predictions = head(heads, method, child, ctx)
    if method == "predict_proba" and len(child.classes_) == 2:
        predictions = predictions[:, 1]  # the positive class, as _get_response_values returns
    predictions = columns(predictions)
    codes = np.searchsorted(pair.classes, child.classes_)
    calibrate = _CALIBRATORS[pair.method]
    per_class: dict[int, lz.LazyTensor] = {}
    for j, (code, calibrator) in enumerate(zip(codes, pair.calibrators, strict=False)):
        with lz.scope(f"calibrators[{j}]"):
            per_class[int(code) + (1 if n == 2 else 0)] = calibrate(
                calibrator, predictions[:, j], ctx
            )
    if n == 2:
        p = per_class[1]
        proba = lz.concat([columns(1.0 - p), columns(p)], axis=1)
    else:
        zero = per_class[next(iter(per_class))] * 0.0
        proba = lz.concat([columns(per_class.get(c, zero)) for c in range(n)], axis=1)
        total = lz.sum(proba, axis=1, keepdims=True)
        # a row whose calibrated probabilities are all zero becomes uniform
        proba = lz.where(total != 0.0, proba / lz.where(total != 0.0, total, 1.0), 1.0 / n)
    # probabilities that exceed 1 by rounding only are clipped to 1
    return lz.where((proba > 1.0) & (proba <= 1.0 + 1e-5), 1.0, proba)


@register(
    CalibratedClassifierCV,
    methods=("predict", "predict_proba"),
    limits="method 'sigmoid' or 'isotonic' (exact piecewise-linear interpolation); ensemble "
    "True or False",
)
def calibrated_classifier(est: Any, features: Features, ctx: Context) -> Heads:
    n = len(est.classes_)
    pairs = est.calibrated_classifiers_
    for pair in pairs:
        if pair.method not in _CALIBRATORS:
            raise unsupported_param(est, "method", pair.method, "'sigmoid' or 'isotonic'")
        for calibrator in pair.calibrators:
            if pair.method == "isotonic" and not isinstance(calibrator, IsotonicRegression):
                raise UnsupportedError(f"{ctx.path}: unexpected calibrator {calibrator!r}")
    probas = [
        _calibrated_proba(pair, features, n, f"calibrated_classifiers_[{i}]", ctx)
        for i, pair in enumerate(pairs)
    ]
    total = probas[0]
    for p in probas[1:]:
        total = total + p
    proba = total / float(len(pairs))
    return Heads(
        {"predict": lz.argmax(proba, axis=1), "predict_proba": proba}, classes=est.classes_
    )
