"""Multi-output wrappers: one child per target, side by side or chained."""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.multioutput import (
    ClassifierChain,
    MultiOutputClassifier,
    MultiOutputRegressor,
    RegressorChain,
)

import lazy as lz

from ..context import Context
from ..errors import UnsupportedError
from ..features import Features, Heads
from ..registry import register
from ._children import binary_response, columns, head


def _side_by_side(values: list[lz.LazyTensor]) -> lz.LazyTensor:
    return lz.concat([columns(v) for v in values], axis=1)


@register(MultiOutputRegressor, methods=("predict",))
def multi_output_regressor(est: Any, features: Features, ctx: Context) -> Heads:
    predictions = [
        head(ctx.convert(child, features, f"estimators_[{i}]"), "predict", child, ctx)
        for i, child in enumerate(est.estimators_)
    ]
    return Heads({"predict": _side_by_side(predictions)})


@register(
    MultiOutputClassifier,
    methods=("predict", "predict_proba"),
    limits="predict_proba is a list of per-target arrays, as scikit-learn's; every target's "
    "classes of one kind (all strings or all numbers)",
)
def multi_output_classifier(est: Any, features: Features, ctx: Context) -> Heads:
    # One label table for every target: each target's indices are remapped into the union of
    # the targets' classes, so the host maps the (B, n_targets) indices back to labels at once.
    tables = [np.asarray(child.classes_) for child in est.estimators_]
    if len({t.dtype.kind for t in tables}) != 1:
        raise UnsupportedError(f"{ctx.path}: targets with classes of different kinds")
    union = np.unique(np.concatenate(tables))
    # scikit-learn has predict_proba only if every target's estimator has it
    with_proba = hasattr(est, "predict_proba")
    indices, probas = [], []
    for i, (child, table) in enumerate(zip(est.estimators_, tables, strict=True)):
        heads = ctx.convert(child, features, f"estimators_[{i}]")
        index = head(heads, "predict", child, ctx)
        where = np.searchsorted(union, table).astype(np.int32)
        if not np.array_equal(where, np.arange(len(union))):
            index = lz.take(ctx.param(where, "class_index"), index, axis=0)
        indices.append(lz.reshape(index, (lz.B, 1)))
        if with_proba:
            probas.append(columns(head(heads, "predict_proba", child, ctx)))
    outputs = {"predict": lz.concat(indices, axis=1)}
    splits = {}
    if with_proba:  # (B, sum of n_classes) side by side; the host splits it into the list
        outputs["predict_proba"] = lz.concat(probas, axis=1)
        splits["predict_proba"] = tuple(int(p.shape[1]) for p in probas)
    return Heads(outputs, classes=union, splits=splits)


def _chain(
    est: Any, features: Features, ctx: Context, feed: str, outputs: tuple[str, ...]
) -> dict[str, lz.LazyTensor]:
    """``_BaseChain._get_predictions``: each child sees the input plus the previous children's
    ``feed`` responses; returns each output method's (B, n_targets) values in target order."""
    chained = features
    results: dict[str, list[lz.LazyTensor]] = {m: [] for m in outputs}
    for i, child in enumerate(est.estimators_):
        heads = ctx.convert(child, chained, f"estimators_[{i}]")
        response = _response(heads, feed, child, ctx)
        for method in outputs:
            results[method].append(
                response if method == feed else _response(heads, method, child, ctx)
            )
        chained = Features.concat([chained, Features.derived(columns(response))])
    inverse = np.empty_like(np.asarray(est.order_))
    inverse[np.asarray(est.order_)] = np.arange(len(est.order_))
    return {m: _side_by_side([v[j] for j in inverse]) for m, v in results.items()}


def _response(heads: Heads, method: str, child: Any, ctx: Context) -> lz.LazyTensor:
    if not hasattr(child, "classes_"):
        return head(heads, method, child, ctx)
    out = binary_response(heads, method, child, ctx)
    if out.ndim != 1:
        raise UnsupportedError(f"{ctx.path}: chained classifiers must be binary")
    return out


@register(RegressorChain, methods=("predict",), limits="any order")
def regressor_chain(est: Any, features: Features, ctx: Context) -> Heads:
    return Heads(_chain(est, features, ctx, "predict", ("predict",)))


@register(
    ClassifierChain,
    methods=("predict", "predict_proba", "decision_function"),
    limits="binary targets with numeric labels; any order and chain_method; predict returns the "
    "label values (floats), as scikit-learn does",
)
def classifier_chain(est: Any, features: Features, ctx: Context) -> Heads:
    child = est.estimators_[0]
    methods = ("predict", *(m for m in ("predict_proba", "decision_function") if hasattr(child, m)))
    return Heads(_chain(est, features, ctx, est.chain_method_, methods))
