"""scikit-learn tree models: decision trees, forests, gradient boosting, isolation forests.

Each converter folds its model's arithmetic into the leaf vectors of a normalized
:class:`~compiler.trees.Ensemble` (forest averaging, learning rates, per-class trees, isolation
path lengths) and lets :func:`~compiler.trees.leaf_sum` pick the tree strategy.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
from sklearn._loss.link import IdentityLink, LogLink
from sklearn._loss.loss import HalfBinomialLoss, HalfMultinomialLoss
from sklearn.dummy import DummyClassifier, DummyRegressor
from sklearn.ensemble import (
    ExtraTreesClassifier,
    ExtraTreesRegressor,
    GradientBoostingClassifier,
    GradientBoostingRegressor,
    HistGradientBoostingClassifier,
    HistGradientBoostingRegressor,
    IsolationForest,
    RandomForestClassifier,
    RandomForestRegressor,
)
from sklearn.ensemble._iforest import _average_path_length
from sklearn.tree import (
    DecisionTreeClassifier,
    DecisionTreeRegressor,
    ExtraTreeClassifier,
    ExtraTreeRegressor,
)
from sklearn.utils._missing import is_scalar_nan

import lazy as lz

from ..blocks import binary_proba, decision_heads
from ..context import Context
from ..errors import UnsupportedError
from ..explain import Explanation
from ..features import Features, Heads
from ..registry import register, unsupported_param
from ..trees import Ensemble, Tree, from_hist_predictor, from_sklearn_tree, single_leaf
from ..trees.folding import FLOAT32_SPLITS, FLOAT64_SPLITS, explained_leaf_sum_on

_SINGLE = (DecisionTreeClassifier, DecisionTreeRegressor, ExtraTreeClassifier, ExtraTreeRegressor)


def _members(est: Any) -> list[Any]:
    return [est] if isinstance(est, _SINGLE) else list(est.estimators_)


def _squeeze(out: lz.LazyTensor) -> lz.LazyTensor:
    return lz.reshape(out, (lz.B,)) if out.shape[1] == 1 else out


def _explained(explanation: Explanation | None) -> dict[str, object]:
    """Heads' ``extra`` carrying an explanation of the raw output, where one was traced."""
    return {} if explanation is None else {"explanation": explanation}


# --- decision trees and forests -----------------------------------------------------------------


#: How the forests' averages match scikit-learn's (:func:`_averaged`).
_AVERAGED = (
    "the trees' leaf values summed, then divided by the number of trees, as scikit-learn "
    "averages: in any order where every such sum is exact in the graph's dtype (vote counts, "
    "halves), else one tree after another in float64 in a float64 graph (bit-identical means)"
)
_AVERAGED_CLASSES = (
    f"{_AVERAGED}, and in a float32 graph too, where predict decides on those sums (tied "
    "votes); a single tree's float32 leaves serve where their rounding keeps each leaf's first "
    "largest class"
)


def _averaged(
    trees: tuple[Tree, ...], features: Features, ctx: Context, *, decides: bool
) -> tuple[lz.LazyTensor, lz.LazyTensor, dict[str, object]]:
    """A forest's mean of its trees' leaf vectors (B, K) in the graph's dtype, the values a
    classifier's ``predict`` takes the first largest of, and the heads' ``extra`` explaining
    the mean (where traced).

    scikit-learn adds the trees' values to zeros in float64 one after another, then divides by
    their number. Where every such sum is exact in the graph's dtype, any order gives it, and
    its first largest class is the mean's. Otherwise a float64 graph adds the trees in order,
    and so does a float32 graph where ``predict`` ``decides`` on the sums (tied votes are
    common on repeated rows; a float32 sum may break them either way), in float64; a single
    tree's float32 leaves serve where their rounding keeps each leaf's first largest class."""
    count = len(trees)
    ensemble = Ensemble(trees, features.width, float32_inputs=True)
    exact = ensemble.sums_exactly(ctx.dtype)
    if count == 1 and decides and not exact:
        exact = _first_largest_kept(trees[0].value[trees[0].is_leaf], ctx.dtype)
    float64 = not exact and (decides or ctx.dtype == "float64")
    if float64:
        ensemble = dataclasses.replace(ensemble, in_order=count > 1, sums_in="float64")
    if float64 and ctx.dtype != "float64":
        ctx.note("leaf values summed in float64, as scikit-learn sums them (predict decides)")
    total, explanation = explained_leaf_sum_on(ensemble, features, ctx)
    extra = _explained(explanation and explanation.scaled(1.0 / count))
    mean = total if count == 1 else total / float(count)
    # The float64 mean is scikit-learn's own; an exact sum orders the classes as the mean does,
    # without the division's rounding.
    decided = mean if float64 or ctx.dtype == "float64" else total
    return _narrowed(mean, ctx), decided, extra


def _narrowed(value: lz.LazyTensor, ctx: Context) -> lz.LazyTensor:
    """``value`` in the graph's dtype (a float64 sum or score in a float32 graph)."""
    return value if value.dtype == ctx.dtype else lz.cast(value, ctx.dtype)


def _first_largest_kept(value: np.ndarray, dtype: str) -> bool:
    """Whether rounding each leaf's values (L, K) to ``dtype`` keeps its first largest class."""
    return bool(np.all(np.argmax(value.astype(dtype), axis=1) == np.argmax(value, axis=1)))


@register(
    DecisionTreeClassifier,
    ExtraTreeClassifier,
    RandomForestClassifier,
    ExtraTreesClassifier,
    methods=("predict", "predict_proba"),
    exactness=f"{FLOAT32_SPLITS}; {_AVERAGED_CLASSES}",
    limits="single-output; NaN follows the fitted missing-value direction; with n_jobs > 1 "
    "scikit-learn sums the trees in the order its threads finish them, here in their order",
)
def forest_classifier(est: Any, features: Features, ctx: Context) -> Heads:
    if est.n_outputs_ != 1:
        raise UnsupportedError(
            f"{type(est).__name__}: multi-output classification ({est.n_outputs_} outputs) is "
            "not supported; supported: single-output classification"
        )
    # predict_proba: the mean over trees of each tree's leaf class fractions (``tree_.value``).
    trees = tuple(from_sklearn_tree(m.tree_, m.tree_.value[:, 0, :]) for m in _members(est))
    proba, decided, extra = _averaged(trees, features, ctx, decides=True)
    return Heads(
        {"predict_proba": proba, "predict": lz.argmax(decided, axis=1)},
        classes=est.classes_,
        extra=extra,
    )


@register(
    DecisionTreeRegressor,
    ExtraTreeRegressor,
    RandomForestRegressor,
    ExtraTreesRegressor,
    methods=("predict",),
    exactness=f"{FLOAT32_SPLITS}; {_AVERAGED}",
    limits="multi-output; NaN follows the fitted missing-value direction",
)
def forest_regressor(est: Any, features: Features, ctx: Context) -> Heads:
    trees = tuple(from_sklearn_tree(m.tree_, m.tree_.value[:, :, 0]) for m in _members(est))
    out, _, extra = _averaged(trees, features, ctx, decides=False)
    return Heads({"predict": _squeeze(out)}, extra=extra)


# --- gradient boosting --------------------------------------------------------------------------


#: How the boosted models' leaf sums match scikit-learn's (:func:`_boosted`).
_IN_ORDER = (
    "in a float64 graph the trees are added to the init one after another, as scikit-learn "
    "adds them (raw predictions bit-identical)"
)


def _constant_init(est: Any) -> np.ndarray:
    """The init estimator's raw prediction (K,): zero, or a constant Dummy estimator's."""
    init = est.init_
    constant = (
        (isinstance(init, str) and init == "zero")
        or (isinstance(init, DummyClassifier) and init.strategy in ("prior", "most_frequent"))
        or isinstance(init, DummyRegressor)
    )
    if not constant:
        raise unsupported_param(
            est, "init", est.init, "None (the prior / mean / quantile DummyEstimator) or 'zero'"
        )
    # A Dummy estimator ignores X: its raw prediction for one probe row is the constant.
    probe = np.zeros((1, est.n_features_in_), np.float32)
    return np.asarray(est._raw_predict_init(probe), np.float64)[0]


def _gradient_boosting(
    est: Any, features: Features, ctx: Context
) -> tuple[lz.LazyTensor, dict[str, object]]:
    """The raw predictions (B, K): init + learning_rate × the sum of the stages' trees; and the
    heads' ``extra`` explaining them (where traced)."""
    stages, k = est.estimators_.shape
    trees = []
    for i in range(stages):
        for j in range(k):
            tree = est.estimators_[i, j].tree_
            value = np.zeros((tree.node_count, k))
            value[:, j] = est.learning_rate * tree.value[:, 0, 0]
            trees.append(from_sklearn_tree(tree, value))
    return _boosted(tuple(trees), _constant_init(est), features, ctx, float32_inputs=True)


def _boosted(
    trees: tuple[Tree, ...],
    init: np.ndarray,
    features: Features,
    ctx: Context,
    *,
    float32_inputs: bool,
) -> tuple[lz.LazyTensor, dict[str, object]]:
    """``init`` (K,) plus the trees' leaf sum: the raw predictions (B, K), and the heads'
    ``extra`` explaining them (where traced). scikit-learn adds the trees to ``init`` one after
    another in float64 (GradientBoosting's ``predict_stages``, HistGradientBoosting's
    ``_predict_iterations``); a float64 graph does the same (``init`` a first single-leaf tree
    of an in-order ensemble), so its raw predictions are scikit-learn's bit for bit. A float32
    graph sums in its strategy's order and adds ``init`` after: its own rounding is the larger."""
    if ctx.dtype == "float64":
        leading = (single_leaf(init), *trees)
        ensemble = Ensemble(leading, features.width, float32_inputs=float32_inputs, in_order=True)
        raw, explanation = explained_leaf_sum_on(ensemble, features, ctx)
        return raw, _explained(explanation)
    ensemble = Ensemble(trees, features.width, float32_inputs=float32_inputs)
    raw, explanation = explained_leaf_sum_on(ensemble, features, ctx)
    extra = _explained(explanation and explanation.shifted(init))
    return (raw + ctx.param(init, "init") if np.any(init != 0) else raw), extra


@register(
    GradientBoostingRegressor,
    methods=("predict",),
    exactness=f"{FLOAT32_SPLITS}; {_IN_ORDER}",
    limits="init: the default Dummy estimator or 'zero'",
)
def gradient_boosting_regressor(est: Any, features: Features, ctx: Context) -> Heads:
    raw, extra = _gradient_boosting(est, features, ctx)
    return Heads({"predict": _squeeze(raw)}, extra=extra)


@register(
    GradientBoostingClassifier,
    methods=("predict", "predict_proba", "decision_function"),
    exactness=f"{FLOAT32_SPLITS}; {_IN_ORDER}",
    limits="log_loss (sigmoid / softmax) and exponential loss; init: the default Dummy "
    "estimator or 'zero'",
)
def gradient_boosting_classifier(est: Any, features: Features, ctx: Context) -> Heads:
    raw, extra = _gradient_boosting(est, features, ctx)
    if raw.shape[1] > 1:
        heads = decision_heads(raw, est.classes_, predict_proba=lz.softmax(raw, axis=1))
        return dataclasses.replace(heads, extra=extra)
    decision = _squeeze(raw)
    # exponential loss: p = expit(2 · raw); binary log_loss: p = expit(raw).
    logit = decision * 2.0 if est.loss == "exponential" else decision
    return Heads(
        {
            "decision_function": decision,
            "predict_proba": binary_proba(lz.sigmoid(logit)),
            "predict": lz.cast(decision >= 0.0, "int32"),  # scikit-learn: raw >= 0 → class 1
        },
        classes=est.classes_,
        extra=extra,
    )


# --- histogram gradient boosting ----------------------------------------------------------------


def _hist_inputs(est: Any, features: Features, ctx: Context) -> tuple[Features, int]:
    """The matrix the trees read and its number of category codes: with categorical features,
    ``_preprocessor``'s output — the categorical columns first, as OrdinalEncoder codes (NaN for
    missing and unknown categories), then the numeric columns."""
    mask = est.is_categorical_
    if mask is None or not np.any(mask):
        return features, 0
    computed = [
        int(j)
        for j in np.flatnonzero(mask)
        if features.sources[j] is None and features.code_table(j) is None
    ]
    if computed:
        names = getattr(est, "feature_names_in_", None)
        shown = [str(names[j]) if names is not None else f"column {j}" for j in computed]
        raise UnsupportedError(
            f"{ctx.path}: {type(est).__name__} reads categorical features {shown}, computed by "
            "an earlier step other than an OrdinalEncoder; supported: categorical features that "
            "are raw input columns (numbers or strings, or after a SimpleImputer) or an "
            "OrdinalEncoder's output"
        )
    encoder = est._preprocessor.named_transformers_["encoder"]
    codes = ctx.convert(encoder, features.select(np.flatnonzero(mask)), "_preprocessor")
    numeric = features.select(np.flatnonzero(~mask))
    values = Features.concat([codes.features(), numeric])
    # codes 0..n-1 are the known categories; a fitted missing-value category (last) is NaN
    known = [len(c) - int(len(c) > 0 and is_scalar_nan(c[-1])) for c in encoder.categories_]
    return values, max(max(known), 1)


def _hist_gradient_boosting(
    est: Any, features: Features, ctx: Context
) -> tuple[lz.LazyTensor, dict[str, object]]:
    """The raw predictions (B, K): baseline + the sum of every iteration's trees; and the
    heads' ``extra`` explaining them (where traced)."""
    x, n_categories = _hist_inputs(est, features, ctx)
    k = est.n_trees_per_iteration_
    trees = tuple(
        from_hist_predictor(
            predictor.nodes,
            j,
            k,
            predictor.raw_left_cat_bitsets if n_categories else None,
            n_categories,
        )
        for iteration in est._predictors
        for j, predictor in enumerate(iteration)
    )
    if not trees:  # stopped before the first iteration: the baseline alone
        raise UnsupportedError(f"{type(est).__name__} has no trees (n_iter_ == 0)")
    # HistGradientBoosting compares float64 values: no float32 rounding of the thresholds.
    baseline = np.asarray(est._baseline_prediction, np.float64).reshape(-1)
    return _boosted(trees, baseline, x, ctx, float32_inputs=False)


@register(
    HistGradientBoostingRegressor,
    methods=("predict",),
    exactness=f"{FLOAT64_SPLITS}; {_IN_ORDER}",
    limits=(
        "categorical features, raw or an OrdinalEncoder's output (unknown categories go the "
        "missing-value way); identity or log link"
    ),
)
def hist_gradient_boosting_regressor(est: Any, features: Features, ctx: Context) -> Heads:
    link = est._loss.link
    if not isinstance(link, IdentityLink | LogLink):
        raise unsupported_param(est, "loss", est.loss, "a loss with identity or log link")
    raw, extra = _hist_gradient_boosting(est, features, ctx)
    raw = _squeeze(raw)
    return Heads({"predict": lz.exp(raw) if isinstance(link, LogLink) else raw}, extra=extra)


@register(
    HistGradientBoostingClassifier,
    methods=("predict", "predict_proba", "decision_function"),
    exactness=f"{FLOAT64_SPLITS}; {_IN_ORDER}",
    limits=(
        "categorical features, raw or an OrdinalEncoder's output (unknown categories go the "
        "missing-value way); binary sigmoid, multiclass softmax"
    ),
)
def hist_gradient_boosting_classifier(est: Any, features: Features, ctx: Context) -> Heads:
    if not isinstance(est._loss, HalfBinomialLoss | HalfMultinomialLoss):
        raise unsupported_param(est, "loss", est.loss, "log_loss")
    raw, extra = _hist_gradient_boosting(est, features, ctx)
    if raw.shape[1] == 1:
        decision = _squeeze(raw)
        proba = binary_proba(lz.sigmoid(decision))
    else:
        decision, proba = raw, lz.softmax(raw, axis=1)
    # scikit-learn: binary raw > 0 → class 1, multiclass first argmax: as decision_heads.
    heads = decision_heads(decision, est.classes_, predict_proba=proba)
    return dataclasses.replace(heads, extra=extra)


# --- isolation forest ---------------------------------------------------------------------------


#: How IsolationForest's scores and predict match scikit-learn's (:func:`isolation_forest`).
_ISOLATION = (
    "path lengths summed one tree after another in float64, as scikit-learn sums them (in any "
    "order where every such sum is exact); predict compares that sum with the largest sum "
    "scikit-learn calls an outlier, found once at compile time with its own arithmetic"
)


@register(
    IsolationForest,
    methods=("predict", "decision_function", "score_samples"),
    exactness=f"{FLOAT32_SPLITS}; {_ISOLATION}",
    limits="NaN follows the fitted missing-value direction",
)
def isolation_forest(est: Any, features: Features, ctx: Context) -> Heads:
    """scikit-learn adds each tree's path length (the leaf's depth plus the expected depth of
    its unsplit samples, − 1) to a float64 sum d in turn, scores ``-2 ** -(d / c)`` and calls
    a row an outlier where the score is below ``offset_``: rows repeating a training row sit
    exactly on that edge when ``offset_`` is a percentile of the training scores. So the sum
    is scikit-learn's own, in float64, and ``predict`` compares it with the largest sum whose
    score is an outlier's (:func:`_outlier_depths`), not the score (``**`` on XLA is not
    numpy's to the last bit)."""
    subsampled = est._max_features != features.width
    trees = []
    for i, (member, columns) in enumerate(
        zip(est.estimators_, est.estimators_features_, strict=True)
    ):
        leaf = est._decision_path_lengths[i] + est._average_path_length_per_tree[i] - 1.0
        trees.append(
            from_sklearn_tree(member.tree_, leaf[:, None], columns if subsampled else None)
        )
    ensemble = Ensemble(tuple(trees), features.width, float32_inputs=True, sums_in="float64")
    ensemble = dataclasses.replace(ensemble, in_order=not ensemble.sums_exactly("float64"))
    total, explanation = explained_leaf_sum_on(ensemble, features, ctx)
    depths = _squeeze(total)
    # Explained: the mean path length E[h(x)] (score_samples is -2 ** (-E[h(x)] / c)).
    extra = _explained(explanation and explanation.scaled(1.0 / len(est.estimators_)))
    denominator = _isolation_denominator(est)
    # scikit-learn divides where the denominator is not 0 and takes 1 there (one-sample trees).
    exponent = -(depths / denominator) if denominator != 0 else depths * 0.0 - 1.0
    score_samples = -(2.0**exponent)
    decision = score_samples - float(est.offset_)
    inlier = depths > _outlier_depths(est, denominator)
    return Heads(
        {
            "score_samples": _narrowed(score_samples, ctx),
            "decision_function": _narrowed(decision, ctx),
            "predict": lz.cast(inlier, "int32"),  # class codes of [-1, 1]
        },
        classes=np.array([-1, 1]),
        extra=extra,
    )


def _isolation_denominator(est: Any) -> float:
    """scikit-learn's ``len(estimators_) * _average_path_length([max_samples])``."""
    return float((len(est.estimators_) * _average_path_length([est._max_samples]))[0])


def _isolation_outlier(est: Any, depths: np.ndarray, denominator: float) -> np.ndarray:
    """scikit-learn's ``predict(X) == -1`` for rows whose path lengths sum to ``depths``."""
    out = np.ones_like(depths)
    exponent = -np.divide(depths, denominator, out=out, where=denominator != 0)
    return (-(2**exponent) - est.offset_) < 0


def _outlier_depths(est: Any, denominator: float) -> float:
    """The largest float64 path-length sum scikit-learn calls an outlier (the score rises with
    the sum: the shortest paths are the outliers): -inf where none is, +inf where every one is.
    Bisection over the non-negative float64 values' bits (ordered as the values) with
    scikit-learn's own arithmetic."""

    def outlier(bits: int) -> bool:
        return bool(_isolation_outlier(est, np.array([bits]).view(np.float64), denominator)[0])

    low, high = 0, int(np.array([np.finfo(np.float64).max]).view(np.int64)[0])
    if not outlier(low):
        return -math.inf
    if outlier(high):
        return math.inf
    while high - low > 1:  # outlier(low), not outlier(high)
        middle = (low + high) // 2
        low, high = (middle, high) if outlier(middle) else (low, middle)
    return float(np.array([low]).view(np.float64)[0])
