"""LightGBM: ``LGBMClassifier``, ``LGBMRegressor``, ``LGBMRanker`` and ``lightgbm.Booster``.

The model is read from ``Booster.dump_model()`` (the iterations ``predict`` uses: the best one
when early stopping recorded it). LightGBM predicting from a dense matrix decides as follows:

- a value with ``|x| <= kZeroThreshold`` (``float32(1e-35)``) reaches the trees as 0.0 (only
  "non-zero" values are copied into the prediction buffer);
- numerical split ``x <= threshold`` in float64; missing type ``NaN``: NaN takes the default
  direction; ``None``: NaN is read as 0.0; ``Zero``: 0 and NaN take the default direction;
- categorical split (``==``): NaN or ``int(x) < 0`` (truncation) goes right; otherwise left iff
  ``int(x)`` is in the node's category set.

A model fitted on a DataFrame with pandas ``category`` columns records their categories
(``pandas_categorical``); ``predict`` on a frame re-codes each such column into those categories
(``cat.set_categories``): a category's position is its value, a missing or unseen one NaN. The
compiled model reads these columns through a host vocabulary of the same categories, so they are
sent as their category values (strings, say), and the trees read the codes as LightGBM does.

Folded into the normalized ensemble: ``None`` nodes send NaN where 0.0 goes; ``Zero`` nodes read a
derived copy of their column with zeros (and NaN) as NaN; a categorical node reads a derived
column that is 0 inside its category set and 1 outside, split at 0.5. Decisions compare float64
like HistGradientBoosting: on the raw float64 columns (:mod:`compiler.trees.folding`), exact
for every float64 input in float32 graphs too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import lightgbm
import numpy as np

import lazy as lz

from ..blocks import binary_proba
from ..context import Context
from ..errors import UnsupportedError
from ..features import Features, Heads
from ..precision import Precision
from ..registry import register
from ..schema import Vocabulary
from ..trees import Ensemble
from ..trees.folding import FLOAT64_SPLITS, explained_leaf_sum_on, record_thresholds
from ._gbdt import TreeBuilder

#: LightGBM's kZeroThreshold: a float literal (1e-35f) held in a double.
ZERO = float(np.float32(1e-35))
#: A categorical node's membership table may hold at most this many entries.
MAX_CATEGORY_TABLE = 1 << 22

_IDENTITY = {
    "regression",
    "regression_l1",
    "huber",
    "fair",
    "quantile",
    "mape",
    "lambdarank",
    "rank_xendcg",
}
_EXP = {"poisson", "gamma", "tweedie"}
_SQRT_CAPABLE = {"regression", "regression_l1", "huber", "fair", "quantile", "mape"}
OBJECTIVES = sorted([*_IDENTITY, *_EXP, "binary", "cross_entropy", "multiclass", "multiclassova"])


@dataclass(frozen=True)
class Objective:
    """``dump_model()['objective']``: a name, then ``key:value`` parameters and flags."""

    name: str
    params: dict[str, str]
    flags: frozenset[str]

    @classmethod
    def parse(cls, text: str) -> Objective:
        name, *tokens = text.split()
        params = dict(t.split(":", 1) for t in tokens if ":" in t)
        return cls(name, params, frozenset(t for t in tokens if ":" not in t))


@dataclass(frozen=True)
class _Parsed:
    ensemble: Ensemble
    zero: tuple[int, ...]  # features whose derived column reads zero as missing
    categories: tuple[tuple[int, tuple[int, ...]], ...]  # derived membership columns
    rounds_zero: bool  # some threshold lies in the zero band: inputs must be rounded to 0


def _parse(dump: dict[str, Any], width: int) -> _Parsed:
    k = int(dump["num_tree_per_iteration"])
    infos = dump["tree_info"]
    if not infos:
        raise UnsupportedError("the LightGBM model has no trees")
    scale = k / len(infos) if dump.get("average_output") else 1.0  # rf: the mean of iterations
    derived: dict[tuple[Any, ...], int] = {}  # ("zero", f) or ("cat", f, set) → provisional id
    rounds_zero = False
    builders = []
    for i, info in enumerate(infos):
        builder = TreeBuilder(k)
        stack = [(info["tree_structure"], 0)]
        while stack:
            node, nid = stack.pop()
            count = node.get("leaf_count", node.get("internal_count"))
            if count is not None:
                builder.cover(nid, float(count))
            if "leaf_value" in node:
                if "leaf_coeff" in node:
                    raise UnsupportedError(
                        "LightGBM linear trees (linear_tree=True) are not supported; supported: "
                        "constant leaves"
                    )
                builder.leaf(nid, i % k, float(node["leaf_value"]) * scale)
                continue
            f = int(node["split_feature"])
            kind = node["decision_type"]
            if kind == "==":
                cats = tuple(sorted({int(c) for c in str(node["threshold"]).split("||")}))
                column = width + derived.setdefault(("cat", f, cats), len(derived))
                left, right = builder.split(nid, column, 0.5, False)
            elif kind == "<=":
                t = float(node["threshold"])
                missing = node["missing_type"]
                if missing == "Zero":
                    column = width + derived.setdefault(("zero", f), len(derived))
                    left, right = builder.split(nid, column, t, bool(node["default_left"]))
                elif missing in ("NaN", "None"):
                    rounds_zero |= -ZERO <= t < ZERO
                    # None: NaN is read as 0.0, so it goes where 0.0 goes.
                    nan_left = bool(node["default_left"]) if missing == "NaN" else t >= 0.0
                    left, right = builder.split(nid, f, t, nan_left)
                else:
                    raise UnsupportedError(f"LightGBM missing_type {missing!r} is not supported")
            else:
                raise UnsupportedError(f"LightGBM decision_type {kind!r} is not supported")
            stack += [(node["right_child"], right), (node["left_child"], left)]
        builders.append(builder)
    # Final columns: inputs, then zero-as-missing copies, then membership columns by feature.
    keys = sorted(derived, key=lambda key: (key[0] != "zero", key[1:]))
    columns = np.arange(width + len(derived))
    for position, key in enumerate(keys):
        columns[width + derived[key]] = width + position
    trees = tuple(b.build(columns) for b in builders)
    players = (*range(width), *(key[1] for key in keys))
    return _Parsed(
        # LightGBM adds each tree's leaf to a float64 score in turn, from 0.
        Ensemble(trees, width + len(derived), float32_inputs=False, in_order=True, players=players),
        tuple(key[1] for key in keys if key[0] == "zero"),
        tuple((key[1], key[2]) for key in keys if key[0] == "cat"),
        rounds_zero,
    )


def _membership(x: lz.LazyTensor, f: int, sets: list[tuple[int, ...]], ctx: Context) -> Any:
    """(B, len(sets)): 0 where ``int(x[:, f])`` is in the set, else 1 (NaN, negative, unseen)."""
    sentinel = max(max(s) for s in sets) + 1
    if (sentinel + 1) * len(sets) > MAX_CATEGORY_TABLE:
        raise UnsupportedError(
            f"LightGBM categorical splits on feature {f} reach category {sentinel - 1}: the "
            f"membership table would exceed {MAX_CATEGORY_TABLE} entries"
        )
    table = np.ones((sentinel + 1, len(sets)))
    for j, s in enumerate(sets):
        table[list(s), j] = 0.0
    v = x[:, f]
    valid = v > -1.0  # int(x) >= 0 (truncation toward zero); False for NaN
    clipped = lz.minimum(lz.maximum(lz.where(valid, v, float(sentinel)), 0.0), float(sentinel))
    code = lz.cast(lz.floor(clipped), "int32")
    return lz.take(ctx.param(table, f"category_table_{f}"), code, axis=0)


def _decision_columns(x: lz.LazyTensor, parsed: _Parsed, ctx: Context) -> lz.LazyTensor:
    """The inputs as LightGBM's trees read them, with the derived columns appended."""
    if parsed.rounds_zero:
        x = lz.where(abs(x) <= ZERO, 0.0, x)
    parts = [x]
    if parsed.zero:
        z = lz.take(x, ctx.param(np.asarray(parsed.zero), "zero_missing_features"), axis=1)
        parts.append(lz.where(lz.isnan(z) | (abs(z) <= ZERO), float("nan"), z))
    by_feature: dict[int, list[tuple[int, ...]]] = {}
    for f, cats in parsed.categories:
        by_feature.setdefault(f, []).append(cats)
    parts += [_membership(x, f, sets, ctx) for f, sets in by_feature.items()]
    return lz.concat(parts, axis=1) if len(parts) > 1 else x


def _transform(raw: lz.LazyTensor, objective: Objective) -> lz.LazyTensor:
    """The objective's output transform on raw scores (B, K), as ``Booster.predict`` applies."""
    name = objective.name
    if "sqrt" in objective.flags:
        if name not in _SQRT_CAPABLE:
            raise UnsupportedError(f"LightGBM objective {name!r} with reg_sqrt is not supported")
        squared = raw * raw
        raw = lz.where(raw < 0.0, -squared, squared)  # sign(x) · x²
    if name in _IDENTITY:
        return raw
    if name in _EXP:
        return lz.exp(raw)
    if name in ("binary", "multiclassova"):
        return lz.sigmoid(raw * float(objective.params.get("sigmoid", "1")))
    if name == "cross_entropy":
        return lz.sigmoid(raw)
    if name == "multiclass":
        return lz.softmax(raw, axis=1)
    raise UnsupportedError(
        f"LightGBM objective {name!r} is not supported; supported: {', '.join(OBJECTIVES)}"
    )


def _pandas_columns(dump: dict[str, Any], features: Features, ctx: Context) -> list[int]:
    """The features that were pandas ``category`` columns, in frame order (the order of
    ``pandas_categorical``). The model does not record them: they are the sample's non-numeric
    columns where there are as many, else the model's categorical features (the default
    ``categorical_feature='auto'`` makes every unordered category column one)."""
    pandas = dump["pandas_categorical"]
    kinds = [
        None if s is None else ctx.schema.columns[s].kind for s in features.sources
    ]  # a DataFrame sample's dtypes ("categorical": neither number nor boolean)
    from_sample = [f for f, kind in enumerate(kinds) if kind == "categorical"]
    if len(from_sample) == len(pandas):
        return from_sample
    names = dump.get("feature_names") or []
    infos = dump.get("feature_infos") or {}
    categorical = [
        f for f, name in enumerate(names) if (infos.get(name) or {}).get("values")
    ]  # LightGBM lists a categorical feature's values, a numerical one's range only
    if len(categorical) == len(pandas):
        return categorical
    raise UnsupportedError(
        f"LightGBM model fitted on {len(pandas)} pandas category columns, but it has "
        f"{len(categorical)} categorical features (ordered categories, or an explicit "
        "categorical_feature), so which columns they were is not recorded; compile with a "
        "sample DataFrame (its category columns show them)"
    )


def _pandas_codes(dump: dict[str, Any], features: Features, ctx: Context) -> Features:
    """``features`` with each pandas category column replaced by its code as LightGBM reads it:
    the category's position in ``pandas_categorical``, NaN for a missing or unseen category."""
    pandas = [list(categories) for categories in dump["pandas_categorical"]]
    columns = _pandas_columns(dump, features, ctx)
    names = dump.get("feature_names") or [f"Column_{f}" for f in range(features.width)]
    used = _category_codes_used(dump)
    codes = []
    for f, categories in zip(columns, pandas, strict=True):
        if used.get(f, -1) >= len(categories):
            raise UnsupportedError(
                f"LightGBM splits feature {names[f]!r} on category code {used[f]}, but its "
                f"pandas categories are {len(categories)}: they do not match"
            )
        if features.sources[f] is None:
            raise UnsupportedError(
                f"{ctx.path}: LightGBM reads feature {names[f]!r} as a pandas category column, "
                "but an earlier step computes it; supported: category columns passed through "
                "from the input table"
            )
        n = len(categories)
        code = ctx.codes(features, f, Vocabulary(tuple(categories), unknown=n, missing=n))
        value = lz.where(code == n, float("nan"), lz.cast(code, features.values.dtype))
        codes.append(lz.reshape(value, (lz.B, 1)))
    ctx.note(f"{len(columns)} pandas category columns read through their categories")
    derived = Features.derived(lz.concat(codes, axis=1) if len(codes) > 1 else codes[0]).exactly()
    order = list(range(features.width))
    for i, f in enumerate(columns):
        order[f] = features.width + i
    return Features.concat([features, derived]).select(order)


def _category_codes_used(dump: dict[str, Any]) -> dict[int, int]:
    """Feature → the largest category code a categorical split of the model tests."""
    used: dict[int, int] = {}
    for info in dump["tree_info"]:
        stack = [info["tree_structure"]]
        while stack:
            node = stack.pop()
            if "leaf_value" in node:
                continue
            if node["decision_type"] == "==":
                f = int(node["split_feature"])
                top = max(int(c) for c in str(node["threshold"]).split("||"))
                used[f] = max(used.get(f, -1), top)
            stack += [node["left_child"], node["right_child"]]
    return used


def _booster_output(
    booster: Any, features: Features, ctx: Context
) -> tuple[lz.LazyTensor, dict[str, object]]:
    """``booster.predict``'s values (B, K): transformed raw scores; and the heads' ``extra``
    explaining the raw scores (where traced)."""
    raw, objective, extra = _raw_scores(booster, features, ctx)
    return _transform(raw, objective), extra


def _raw_scores(
    booster: Any, features: Features, ctx: Context
) -> tuple[lz.LazyTensor, Objective, dict[str, object]]:
    """``booster.predict(raw_score=True)``'s values (B, K), the objective transforming them,
    and the heads' ``extra`` explaining them (where traced)."""
    dump = booster.dump_model()
    if dump.get("pandas_categorical"):
        features = _pandas_codes(dump, features, ctx)
    objective = Objective.parse(str(dump.get("objective", "custom")))
    parsed = _parse(dump, features.width)
    x = _decision_columns(features.values, parsed, ctx)
    ctx.note(f"objective: {objective.name}")
    # LightGBM compares doubles: the input columns' splits fold onto the raw float64 columns
    # (through the zero band where a threshold lies in it); derived columns are read as computed.
    maps = features.column_maps()
    if parsed.rounds_zero:
        maps = tuple(None if m is None else m.then(_zero_band) for m in maps)
    # The zero-as-missing copies and category tests are computed from the graph's values of
    # the input column (no map folds them): exact only where those values are, else the splits
    # on them ask for float64 inputs (``exact_splits``), as LightGBM reads doubles.
    read = [f for f in parsed.zero] + [f for f, _ in parsed.categories]
    given = features.exact or (False,) * features.width
    exact = given + tuple(given[f] for f in read)
    decision = Features(x, (None,) * int(x.shape[1]), maps + (None,) * len(read), exact=exact)
    # A zero-as-missing copy of a raw column decides where that column does (the gate's probes).
    copies = [features.sources[f] for f in parsed.zero]
    record_thresholds(parsed.ensemble, [None] * features.width + copies, ctx)
    raw, explanation = explained_leaf_sum_on(parsed.ensemble, decision, ctx)
    return raw, objective, ({} if explanation is None else {"explanation": explanation})


def _zero_band(v: np.ndarray) -> np.ndarray:
    """LightGBM's reading of a dense value: ``|x| <= kZeroThreshold`` is 0.0 (non-decreasing)."""
    # LightGBM reads float32 input as doubles: the band is tested in float64 either way.
    return np.where(np.abs(v).astype(np.float64) <= ZERO, v.dtype.type(0), v)


def _squeeze(out: lz.LazyTensor) -> lz.LazyTensor:
    return lz.reshape(out, (lz.B,)) if out.shape[1] == 1 else out


_LIMITS = (
    "objectives: " + ", ".join(OBJECTIVES) + " (reg_sqrt too); numerical and categorical "
    "splits (integer codes, or pandas category columns read by their categories: unseen and "
    "missing ones as NaN); NaN, zero-as-missing and no-missing semantics; not linear trees"
)


#: LightGBM sums leaves in float64; its decisions are exact in any graph, so only the step's own
#: arithmetic (leaf values, their sums, the objective's transform) needs float64.
_PRECISION = Precision(
    "LightGBM sums the leaf values of every tree in float64, one tree after another, and so "
    "does every strategy (raw scores bit-identical); a float32 sum of many trees drifts past "
    "the tolerance, most where an exp or softmax transform follows",
    inputs=False,
)


@register(
    lightgbm.Booster,
    methods=("predict",),
    limits=_LIMITS,
    exactness=FLOAT64_SPLITS,
    precision=_PRECISION,
)
def lightgbm_booster(booster: Any, features: Features, ctx: Context) -> Heads:
    out, extra = _booster_output(booster, features, ctx)
    return Heads({"predict": _squeeze(out)}, extra=extra)


@register(
    lightgbm.LGBMRegressor,
    lightgbm.LGBMRanker,
    methods=("predict",),
    limits=_LIMITS,
    exactness=FLOAT64_SPLITS,
    precision=_PRECISION,
)
def lightgbm_regressor(est: Any, features: Features, ctx: Context) -> Heads:
    return lightgbm_booster(est.booster_, features, ctx)


@register(
    lightgbm.LGBMClassifier,
    methods=("predict", "predict_proba", "decision_function"),
    limits=_LIMITS,
    exactness=FLOAT64_SPLITS,
    precision=_PRECISION,
)
def lightgbm_classifier(est: Any, features: Features, ctx: Context) -> Heads:
    raw, objective, extra = _raw_scores(est.booster_, features, ctx)
    out = _transform(raw, objective)
    if out.shape[1] == 1:
        proba = binary_proba(_squeeze(out))
    elif len(est.classes_) == out.shape[1] > 2:
        proba = out
    else:
        raise UnsupportedError(
            f"LGBMClassifier: {out.shape[1]} outputs for {len(est.classes_)} classes is not "
            "supported; supported: one output (binary) or one per class (3 or more classes)"
        )
    # LGBMClassifier.predict: the first argmax of predict_proba.
    # LGBMClassifier.decision_function (LightGBM >= 4.7): the raw scores, (B,) when binary.
    heads = {"predict_proba": proba, "predict": lz.argmax(proba, axis=1)}
    if hasattr(est, "decision_function"):
        heads["decision_function"] = _squeeze(raw)
    return Heads(heads, classes=est.classes_, extra=extra)
