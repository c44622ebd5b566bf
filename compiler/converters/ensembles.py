"""Ensembles of arbitrary child estimators: voting, stacking and bagging.

Each child is converted through :meth:`Context.convert`, so a child may be any registered class
(a pipeline included); the combination follows scikit-learn's arithmetic and tie-breaking.
Classifier ensembles fit their children on integer-encoded targets, so a child's class values
are codes into the ensemble's ``classes_``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from sklearn.ensemble import (
    BaggingClassifier,
    BaggingRegressor,
    StackingClassifier,
    StackingRegressor,
    VotingClassifier,
    VotingRegressor,
)

import lazy as lz

from ..context import Context
from ..errors import UnsupportedError
from ..features import Features, Heads
from ..precision import Precision
from ..registry import register, unsupported_param
from ..trees import leaf_sums_exact
from ._children import class_codes, class_values, columns, head, one_hot


def _fitted(est: Any) -> list[tuple[str, Any]]:
    """(name, fitted child) for each estimator that is not ``'drop'``."""
    names = [name for name, child in est.estimators if not _dropped(child)]
    return list(zip(names, est.estimators_, strict=True))


def _dropped(child: Any) -> bool:
    return isinstance(child, str) and child == "drop"


def _weights(est: Any) -> list[float] | None:
    """The weights of the children that are not dropped (``_weights_not_none``)."""
    if est.weights is None:
        return None
    weights = [
        float(w)
        for (_, child), w in zip(est.estimators, est.weights, strict=True)
        if not _dropped(child)
    ]
    if any(w < 0 for w in weights):
        raise unsupported_param(est, "weights", est.weights, "non-negative weights")
    return weights


def _average(values: list[lz.LazyTensor], weights: list[float] | None) -> lz.LazyTensor:
    """``np.average(values, axis=0, weights=weights)``."""
    if weights is None:
        return _total(values) / float(len(values))
    return _total([v * w for v, w in zip(values, weights, strict=True)]) / float(np.sum(weights))


def _total(values: list[lz.LazyTensor]) -> lz.LazyTensor:
    out = values[0]
    for v in values[1:]:
        out = out + v
    return out


def _require_codes(child: Any, n: int, ctx: Context) -> None:
    """A child's probability columns line up with the ensemble's classes only if it saw them all."""
    if not np.array_equal(np.asarray(child.classes_), np.arange(n)):
        raise UnsupportedError(
            f"{ctx.path}: {type(child).__name__} was fitted on classes {child.classes_!r}, not "
            f"all {n} of the ensemble's"
        )


# --- voting ---------------------------------------------------------------------------------


#: Averaged children's probabilities decide predict: scikit-learn averages them in float64.
_AVERAGED_PROBABILITIES = Precision(
    "predict is the first largest of the children's probabilities averaged, which scikit-learn "
    "sums in float64 one child after another: ties (trees voting on repeated rows) are decided "
    "on those sums",
    inputs=False,
)


@register(
    VotingClassifier,
    methods=("predict", "predict_proba", "transform"),
    limits="hard and soft voting, non-negative weights, `'drop'`; transform needs "
    "flatten_transform=True with soft voting; hard-voting ties break like scikit-learn "
    "(first class), on weighted counts summed as np.bincount sums them (float64 where the "
    "weights' sums are not exact in float32)",
    precision=dataclasses.replace(
        _AVERAGED_PROBABILITIES, when="soft voting", applies=lambda est: est.voting == "soft"
    ),
)
def voting_classifier(est: Any, features: Features, ctx: Context) -> Heads:
    children = [(child, ctx.convert(child, features, name)) for name, child in _fitted(est)]
    n = len(est.classes_)
    weights = _weights(est)
    if est.voting == "soft":
        probas = []
        for child, heads in children:
            _require_codes(child, n, ctx)
            probas.append(head(heads, "predict_proba", child, ctx))
        proba = _average(probas, weights)
        outputs = {"predict": lz.argmax(proba, axis=1), "predict_proba": proba}
        if est.flatten_transform:
            outputs["transform"] = lz.concat(probas, axis=1)
        return Heads(outputs, classes=est.classes_)
    if weights is not None and min(weights) < 0:
        # bincount's columns past the largest code are zeros, which could beat negative counts
        raise unsupported_param(est, "weights", est.weights, "non-negative weights (hard voting)")
    codes = [class_codes(heads, child, ctx) for child, heads in children]
    # np.bincount(codes, weights) then the first argmax. bincount adds the weights in float64
    # one vote after another: the graph's dtype serves where every such sum is exact in it.
    exact = weights is None or leaf_sums_exact([np.array([w]) for w in weights], ctx.dtype)
    votes = [one_hot(c, n, ctx, None if exact else "float64") for c in codes]
    counts = _total(
        votes if weights is None else [v * w for v, w in zip(votes, weights, strict=True)]
    )
    transform = lz.concat([lz.reshape(c, (lz.B, 1)) for c in codes], axis=1)
    return Heads(
        {"predict": lz.argmax(counts, axis=1), "transform": transform}, classes=est.classes_
    )


@register(VotingRegressor, methods=("predict", "transform"), limits="weights, `'drop'`")
def voting_regressor(est: Any, features: Features, ctx: Context) -> Heads:
    predictions = []
    for name, child in _fitted(est):
        out = head(ctx.convert(child, features, name), "predict", child, ctx)
        if out.ndim != 1:
            raise UnsupportedError(f"{ctx.path}: {name} predicts {out.ndim}-D values, not 1-D")
        predictions.append(out)
    transform = lz.concat([columns(p) for p in predictions], axis=1)
    return Heads({"predict": _average(predictions, _weights(est)), "transform": transform})


# --- stacking -------------------------------------------------------------------------------


def _stacked(est: Any, features: Features, ctx: Context) -> Features:
    """``StackingX.transform``: the children's outputs side by side (+ the input if passthrough)."""
    parts = []
    for (name, child), method in zip(_fitted(est), est.stack_method_, strict=True):
        heads = ctx.convert(child, features, name)
        if method == "predict":
            out = (
                class_values(heads, child, ctx)
                if heads.classes is not None
                else head(heads, "predict", child, ctx)
            )
        else:
            out = head(heads, method, child, ctx)
            if method == "predict_proba" and len(est.classes_) == 2:
                out = out[:, 1:]  # the two columns are collinear: sklearn keeps the second
        parts.append(Features.derived(columns(out)))
    if est.passthrough:
        parts.append(features)
    return Features.concat(parts)


@register(
    StackingClassifier,
    methods=("predict", "predict_proba", "decision_function", "transform"),
    limits="stack_method auto / predict_proba / decision_function / predict; passthrough; "
    "single-output targets",
)
def stacking_classifier(est: Any, features: Features, ctx: Context) -> Heads:
    if isinstance(est.classes_, list):
        raise UnsupportedError(f"{ctx.path}: StackingClassifier on multilabel targets")
    meta = _stacked(est, features, ctx)
    final = est.final_estimator_
    heads = ctx.convert(final, meta, "final_estimator_")
    outputs = {"predict": class_codes(heads, final, ctx), "transform": meta.values}
    for method in ("predict_proba", "decision_function"):
        if method in heads.outputs and hasattr(final, method):
            outputs[method] = heads.outputs[method]
    return Heads(outputs, classes=est.classes_)


@register(StackingRegressor, methods=("predict", "transform"), limits="passthrough")
def stacking_regressor(est: Any, features: Features, ctx: Context) -> Heads:
    meta = _stacked(est, features, ctx)
    final = est.final_estimator_
    predict = head(ctx.convert(final, meta, "final_estimator_"), "predict", final, ctx)
    return Heads({"predict": predict, "transform": meta.values})


# --- bagging --------------------------------------------------------------------------------


def _bagged(est: Any, features: Features, ctx: Context) -> list[tuple[Any, Heads]]:
    """Each child on its feature subset (``estimators_features_``)."""
    return [
        (child, ctx.convert(child, features.select(cols), f"estimators_[{i}]"))
        for i, (child, cols) in enumerate(
            zip(est.estimators_, est.estimators_features_, strict=True)
        )
    ]


def _bagged_proba(child: Any, heads: Heads, n: int, ctx: Context) -> lz.LazyTensor:
    """One child's contribution to ``_parallel_predict_proba``: its probabilities in the
    ensemble's class columns (zeros for classes it never saw), or a one-hot vote."""
    codes = np.asarray(child.classes_)
    if not hasattr(child, "predict_proba"):
        return one_hot(class_codes(heads, child, ctx), n, ctx)
    proba = head(heads, "predict_proba", child, ctx)
    if len(codes) == n:
        return proba
    zero = lz.broadcast_to(ctx.const(0.0).reshape(1, 1), (lz.B, 1))
    padded = lz.concat([proba, zero], axis=1)
    where = np.full(n, len(codes), np.int32)  # column k of padded is zero
    where[codes] = np.arange(len(codes))
    return lz.take(padded, ctx.param(where, "class_columns"), axis=1)


@register(
    BaggingClassifier,
    methods=("predict", "predict_proba", "decision_function"),
    limits="feature subsets (estimators_features_); children without predict_proba vote",
    precision=dataclasses.replace(
        _AVERAGED_PROBABILITIES,
        when="children with predict_proba",
        applies=lambda est: hasattr(est.estimators_[0], "predict_proba"),
    ),
)
def bagging_classifier(est: Any, features: Features, ctx: Context) -> Heads:
    n = int(est.n_classes_)
    children = _bagged(est, features, ctx)
    proba = _total([_bagged_proba(c, h, n, ctx) for c, h in children]) / float(est.n_estimators)
    outputs = {"predict": lz.argmax(proba, axis=1), "predict_proba": proba}
    if hasattr(est, "decision_function"):
        decisions = [head(h, "decision_function", c, ctx) for c, h in children]
        if len({d.shape for d in decisions}) == 1:
            outputs["decision_function"] = _total(decisions) / float(est.n_estimators)
        else:  # scikit-learn fails too: the children's decisions cannot be summed
            ctx.note("no decision_function: some children never saw every class")
    return Heads(outputs, classes=est.classes_)


@register(BaggingRegressor, methods=("predict",), limits="feature subsets (estimators_features_)")
def bagging_regressor(est: Any, features: Features, ctx: Context) -> Heads:
    predictions = [head(h, "predict", c, ctx) for c, h in _bagged(est, features, ctx)]
    return Heads({"predict": _total(predictions) / float(est.n_estimators)})
