"""XGBoost: ``XGBClassifier``, ``XGBRegressor``, ``XGBRanker`` and ``xgboost.Booster``.

The model is read from ``Booster.save_raw("json")`` with its floats kept as text, so thresholds
and the base score are read as the exact float32 values XGBoost holds. XGBoost compares
``float32(x) < split_condition`` in float32, NaN taking the node's ``missing`` (default) child:
in the normalized ``x <= t`` form that is ``t = nextafter(split_condition, -inf)`` in float32,
exact for every input. The margin is ``base_score`` (stored in output space: a probability for
logistic objectives, a mean for log-link ones) mapped to margin space, plus the trees' leaves.
Categorical splits (partitions and one-hot) read derived membership columns: see
:mod:`._xgb_categorical`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import xgboost
from sklearn.exceptions import NotFittedError

import lazy as lz

from ..blocks import binary_proba
from ..context import Context
from ..errors import UnsupportedError
from ..features import Features, Heads
from ..registry import register, unsupported_param
from ..trees import Ensemble, Tree
from ..trees.folding import FLOAT32_SPLITS, explained_leaf_sum_on
from ._gbdt import TreeBuilder, float32_from_text
from ._xgb_categorical import category_values, membership, trained_categories, vocabulary

_IDENTITY = {
    "reg:squarederror",
    "reg:absoluteerror",
    "reg:pseudohubererror",
    "binary:logitraw",
    "rank:pairwise",
    "rank:ndcg",
    "rank:map",
}
_LOGISTIC = {"binary:logistic", "reg:logistic"}
_EXP = {"count:poisson", "reg:gamma", "reg:tweedie"}
_SOFTMAX = {"multi:softprob", "multi:softmax"}
OBJECTIVES = sorted([*_IDENTITY, *_LOGISTIC, *_EXP, *_SOFTMAX])
_EXACTNESS = (
    f"{FLOAT32_SPLITS}; leaves summed as XGBoost sums them, in float32 one tree after another "
    "from the base margin (margins bit-identical)"
)


def _margin(base: np.ndarray, objective: str) -> np.ndarray:
    """``base_score`` (output space) → margin space, as the objective's ProbToMargin does."""
    wide = base.astype(np.float64)
    if objective in _LOGISTIC:
        return -np.log(1.0 / wide - 1.0)
    if objective in _EXP:
        return np.log(wide)
    return wide  # identity objectives, binary:logitraw and softmax keep it as stored


def _base_margin(margin: np.ndarray) -> list[Tree]:
    """One single-leaf tree per output holding its margin (and 0 in the other outputs)."""
    stumps = []
    for k, value in enumerate(margin.tolist()):
        builder = TreeBuilder(len(margin))
        builder.leaf(0, k, value)
        stumps.append(builder.build())
    return stumps


@dataclass(frozen=True)
class _Parsed:
    trees: tuple[Tree, ...]
    #: The derived membership columns after the inputs, in order: (feature, category set).
    categorical: tuple[tuple[int, tuple[int, ...]], ...]


def _categories(tree: dict[str, Any]) -> dict[int, tuple[int, ...]]:
    """Node → its category set (those go right), from ``categories_nodes`` and the segments."""
    values = [int(c) for c in tree["categories"]]
    return {
        int(node): tuple(sorted(values[int(start) : int(start) + int(size)]))
        for node, start, size in zip(
            tree["categories_nodes"],
            tree["categories_segments"],
            tree["categories_sizes"],
            strict=True,
        )
    }


def _trees(model: dict[str, Any], k: int, rounds: int | None, width: int) -> _Parsed:
    """Every tree (the first ``rounds`` iterations' only, when given) with leaves in output
    ``tree_info[i]``; a categorical node splits its (feature, set) membership column at 0.5."""
    trees, info = model["trees"], model["tree_info"]
    if rounds is not None:
        end = int(model["iteration_indptr"][rounds])
        trees, info = trees[:end], info[:end]
    derived: dict[tuple[int, tuple[int, ...]], int] = {}  # (feature, set) → provisional id
    builders = []
    for tree, k_tree in zip(trees, info, strict=True):
        if int(tree["tree_param"].get("size_leaf_vector", "1")) > 1:
            raise UnsupportedError(
                "XGBoost vector-leaf trees (multi_strategy='multi_output_tree') are not "
                "supported; supported: one output per tree"
            )
        left = [int(v) for v in tree["left_children"]]
        right = [int(v) for v in tree["right_children"]]
        feature = [int(v) for v in tree["split_indices"]]
        default_left = [bool(int(v)) for v in tree["default_left"]]
        categorical = [int(v) == 1 for v in tree["split_type"]]
        sets = _categories(tree) if any(categorical) else {}
        condition = float32_from_text(tree["split_conditions"])
        hessians = [float(v) for v in tree.get("sum_hessian", ())]
        # x < c ⟺ x <= the float32 just below c (inputs are float32 too).
        below = np.nextafter(condition, np.float32(-np.inf))
        builder = TreeBuilder(k)
        stack = [(0, 0)]  # (source node, built node)
        while stack:
            node, nid = stack.pop()
            if hessians:
                builder.cover(nid, hessians[node])
            if left[node] < 0:
                builder.leaf(nid, int(k_tree), float(condition[node]))
                continue
            if categorical[node]:  # membership is 1 inside the set, which goes right
                # a node without recorded categories has an empty set: XGBoost sends all left
                key = (feature[node], sets.get(node, ()))
                column = width + derived.setdefault(key, len(derived))
                a, b = builder.split(nid, column, 0.5, default_left[node])
            else:
                a, b = builder.split(nid, feature[node], float(below[node]), default_left[node])
            stack += [(right[node], b), (left[node], a)]
        builders.append(builder)
    # Final columns: the inputs, then the membership columns by feature.
    keys = sorted(derived)
    columns = np.arange(width + len(derived))
    for position, key in enumerate(keys):
        columns[width + derived[key]] = width + position
    return _Parsed(tuple(b.build(columns) for b in builders), tuple(keys))


def _decision_columns(
    features: Features, parsed: _Parsed, categories: dict[int, tuple[Any, ...]], ctx: Context
) -> tuple[lz.LazyTensor, list[int]]:
    """The inputs with the membership columns of the categorical splits appended, and the input
    feature each membership column tests."""
    by_feature: dict[int, list[tuple[int, ...]]] = {}
    for f, cats in parsed.categorical:
        by_feature.setdefault(f, []).append(cats)
    parts = [features.values]
    for f, sets in by_feature.items():
        values = category_values(features, f, categories.get(f), ctx)
        parts.append(membership(values, sets, ctx, f"feature_{f}"))
    # Columns XGBoost re-codes are read through their vocabulary even where no split uses them,
    # so their category values are accepted (and unknown ones refused) like the others'.
    for f in sorted(categories.keys() - by_feature.keys()):
        ctx.codes(features, f, vocabulary(categories[f]))
    tested = [f for f, sets in by_feature.items() for _ in sets]
    return (lz.concat(parts, axis=1) if len(parts) > 1 else features.values), tested


def _learner(booster: Any) -> dict[str, Any]:
    """The saved model's ``learner``, floats kept as their text."""
    try:
        raw = booster.save_raw("json")
    except xgboost.core.XGBoostError as exc:  # an untrained Booster() fails every call
        first = str(exc).splitlines()[0]
        raise NotFittedError(f"the XGBoost Booster cannot be read (not trained?): {first}") from exc
    return json.loads(raw, parse_float=str)["learner"]


def _booster_output(
    learner: dict[str, Any], features: Features, ctx: Context, rounds: int | None
) -> tuple[lz.LazyTensor, dict[str, object]]:
    """(B, K): the objective's transform of base margin + leaves, as ``predict`` gives it; and
    the heads' ``extra`` explaining the margin (where traced)."""
    booster_kind = learner["gradient_booster"]["name"]
    if booster_kind != "gbtree":
        raise UnsupportedError(
            f"XGBoost booster={booster_kind!r} is not supported; supported: 'gbtree'"
        )
    model = learner["gradient_booster"]["model"]
    if not model["trees"]:
        raise NotFittedError("the XGBoost booster has no trees: it is not trained")
    objective = learner["objective"]["name"]
    param = learner["learner_model_param"]
    k = max(int(param["num_class"]), int(param.get("num_target", "1")), 1)
    parsed = _trees(model, k, rounds, features.width)
    categories = trained_categories(model)
    if categories and max(categories) >= features.width:
        raise UnsupportedError(
            f"the XGBoost model has categorical feature {max(categories)} but reads only "
            f"{features.width} columns"
        )
    x, read = _decision_columns(features, parsed, categories, ctx)
    # XGBoost adds each tree's leaf to its float32 prediction in turn, from the base margin: a
    # first single-leaf tree per output, then the trees, summed in order in float32.
    base = float32_from_text(str(param["base_score"]).strip("[]").split(","))
    margin = np.broadcast_to(_margin(base, objective), (k,)).astype(np.float32)
    ensemble = Ensemble(
        (*_base_margin(margin), *parsed.trees),
        int(x.shape[1]),
        float32_inputs=True,
        in_order=True,
        sums_in="float32",
        players=(*range(features.width), *read),
    )
    # The input columns keep their maps (computed features fold onto raw float64 columns). A
    # membership column tests float32 of its input as XGBoost stores it, or a category code:
    # exact for codes, exact values and raw columns (the host's float32 rounding is XGBoost's),
    # but not for a column the graph computes (a scaler's output).
    given = features.exact or (False,) * features.width
    exact = given + tuple(
        given[f] or features.sources[f] is not None or f in categories for f in read
    )
    decision = Features(
        x,
        features.sources + (None,) * len(read),
        features.column_maps() + (None,) * len(read),
        exact=exact,
    )
    ctx.note(f"objective: {objective}")
    raw, explanation = explained_leaf_sum_on(ensemble, decision, ctx)
    extra: dict[str, object] = {} if explanation is None else {"explanation": explanation}
    if objective in _IDENTITY:
        return raw, extra
    if objective in _LOGISTIC:
        return lz.sigmoid(raw), extra
    if objective in _EXP:
        return lz.exp(raw), extra
    if objective == "multi:softprob":
        return lz.softmax(raw, axis=1), extra
    if objective == "multi:softmax":  # the class index, as a float
        return lz.reshape(lz.cast(lz.argmax(raw, axis=1), ctx.dtype), (lz.B, 1)), extra
    raise UnsupportedError(
        f"XGBoost objective {objective!r} is not supported; supported: {', '.join(OBJECTIVES)}"
    )


def _squeeze(out: lz.LazyTensor) -> lz.LazyTensor:
    return lz.reshape(out, (lz.B,)) if out.shape[1] == 1 else out


def _wrapped(
    est: Any, learner: dict[str, Any], features: Features, ctx: Context
) -> tuple[lz.LazyTensor, dict[str, object]]:
    """A scikit-learn wrapper's output: its booster up to the best iteration, if recorded (and
    the heads' ``extra``, as :func:`_booster_output`)."""
    if callable(est.objective):
        raise unsupported_param(est, "objective", est.objective, "a built-in objective")
    if not (isinstance(est.missing, float) and np.isnan(est.missing)):
        raise unsupported_param(est, "missing", est.missing, "nan")
    best = est.get_booster().attr("best_iteration")  # the wrappers predict with the best one
    return _booster_output(learner, features, ctx, None if best is None else int(best) + 1)


_LIMITS = (
    "gbtree; objectives: " + ", ".join(OBJECTIVES) + "; numerical and categorical splits "
    "(pandas category columns by value, unknown categories refused; or numeric codes); missing "
    "values as NaN"
)


@register(xgboost.Booster, methods=("predict",), limits=_LIMITS, exactness=_EXACTNESS)
def xgboost_booster(booster: Any, features: Features, ctx: Context) -> Heads:
    # Booster.predict takes a DMatrix; its `missing` is the DMatrix's (NaN by default).
    out, extra = _booster_output(_learner(booster), features, ctx, None)
    return Heads({"predict": _squeeze(out)}, extra={**extra, "accepts_nan": True})


@register(
    xgboost.XGBRegressor,
    xgboost.XGBRanker,
    methods=("predict",),
    limits=_LIMITS,
    exactness=_EXACTNESS,
)
def xgboost_regressor(est: Any, features: Features, ctx: Context) -> Heads:
    learner = _learner(est.get_booster())
    out, extra = _wrapped(est, learner, features, ctx)
    return Heads({"predict": _squeeze(out)}, extra=extra)


@register(
    xgboost.XGBClassifier,
    methods=("predict", "predict_proba"),
    limits=_LIMITS,
    exactness=_EXACTNESS,
)
def xgboost_classifier(est: Any, features: Features, ctx: Context) -> Heads:
    learner = _learner(est.get_booster())
    if learner["objective"]["name"] == "multi:softmax":  # its predict_proba raises
        raise unsupported_param(est, "objective", "multi:softmax", "multi:softprob")
    out, extra = _wrapped(est, learner, features, ctx)
    if out.shape[1] == 1:
        p = _squeeze(out)
        # XGBClassifier.predict: class 1 where the (transformed) output exceeds 0.5.
        heads = {"predict_proba": binary_proba(p), "predict": lz.cast(p > 0.5, "int32")}
    elif out.shape[1] == len(est.classes_) > 2:
        heads = {"predict_proba": out, "predict": lz.argmax(out, axis=1)}
    else:
        raise UnsupportedError(
            f"XGBClassifier: {out.shape[1]} outputs for {len(est.classes_)} classes is not "
            "supported; supported: one output (binary) or one per class (3 or more classes)"
        )
    return Heads(heads, classes=est.classes_, extra=extra)
