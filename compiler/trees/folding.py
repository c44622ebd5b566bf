"""Tree splits decided on the raw input columns, exactly as the source decides them.

A split compares the value the source computed for its feature — ``v <= t`` (HistGradientBoosting,
LightGBM: float64 ``v``) or ``float32(v) <= t`` (scikit-learn's ``tree_``, XGBoost) — where ``v``
may be a scaler's or an imputer's output. A float32 graph that recomputes ``v`` rounds it
differently from the source, and a threshold sitting on a data value (they often do) then sends
rows the other way. But where ``v = g(x)`` for one raw column ``x`` and a non-decreasing ``g``
(a :class:`~compiler.features.ColumnMap`: the steps replayed in float64 as the source computes
them), ``{x : P(g(x))}`` is a down-set of the float64 line, so the split is ``x <= t'`` with
``t'`` its largest member, found at compile time by bisection over the float64 values in order.
The split then reads the raw float64 column, and a NaN goes where ``g(NaN)`` (an imputer's fill)
goes, or where the source sends missing values. Exact for every float64 input, and the folded
steps cost nothing per row.

A source comparing ``float32(v)`` reads mapped features as the host's float32 replay of the
steps instead (:mod:`compiler.replayed_columns`): its thresholds stand, and the graph compares
float32. A column no map describes is compared as computed: exact where its values are (one-hot
flags, category codes), else computed in float64 by the steps feeding it
(:func:`~compiler.monotone.computed_as_source`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

import lazy as lz

from ..context import Context
from ..explain import Explanation
from ..features import ColumnMap, Features
from ..monotone import Test, answers_differ, computed_as_source, fold, raw_matrix
from .cost import replay_pays, split_codes_pay
from .model import Ensemble, Tree
from .shap import tree_contributions
from .strategies import leaf_sum

#: docs/operators.md's exactness notes of the tree families (``register(..., exactness=...)``).
FLOAT64_SPLITS = (
    "splits compare float64, on the raw float64 columns (float64 input); scalers and imputers "
    "before them are folded into the thresholds; a float32 table of the raw columns is read as "
    "it is where no step precedes them and no split codes encode them, compared in float32 "
    "with the thresholds rounded down (the same decisions)"
)
FLOAT32_SPLITS = (
    "splits compare float32(x) as the source does (float32 input on raw columns); behind "
    "scalers and imputers, scikit-learn's trees read float32(v) that the host replays as the "
    "source computes it where that pays, and otherwise the splits fold onto the raw float64 "
    "columns"
)


def _comparison(float32_inputs: bool) -> Test:
    """The source's split test ``goes left`` on its computed values ``v``."""
    if float32_inputs:
        return lambda v, t: v.astype(np.float32).astype(np.float64) <= t
    return lambda v, t: v <= t


def _fold_splits(
    mapping: ColumnMap, thresholds: np.ndarray, float32_inputs: bool, dtype: Any = np.float64
) -> tuple[np.ndarray, np.ndarray | None]:
    """(raw thresholds ``t'`` with ``P(g(x))`` iff ``x <= t'``; where a NaN goes: True left,
    False right, None as the source's missing direction), for raw values arriving as
    ``dtype``."""
    return fold(mapping, thresholds, _comparison(float32_inputs), dtype)


def exact_splits(
    ensemble: Ensemble, features: Features, ctx: Context
) -> tuple[Ensemble, lz.LazyTensor]:
    """``ensemble`` over ``features`` → an equivalent ensemble and the matrix its splits read,
    deciding exactly as the source on float64 inputs where maps allow (see the module doc).

    Unchanged where nothing would gain: a float32-comparing source reading raw columns as they
    are (the host's float32 rounding is the source's own), or no split reading a mapped column.
    """
    maps = features.column_maps()
    # A float32-comparing source reading a raw column, or its imputed copy, decides on the
    # float32 of the raw value or of the fill: the host's rounding gives that already.
    mapped = [m is not None and not (ensemble.float32_inputs and m.fills_only) for m in maps]
    as_read = [None if m is None else m.source for m in maps]
    read, categorical = set(), set()
    for tree in ensemble.trees:
        read.update(tree.feature[~tree.is_leaf].tolist())
        if tree.has_categorical:  # category codes are read as computed, never folded
            categorical.update(tree.feature[~tree.is_leaf & tree.is_categorical].tolist())  # type: ignore[operator]
    for f in categorical:
        mapped[f] = False
        as_read[f] = None
    computed_as_source(features, sorted(read - categorical), ctx)
    if not any(mapped[f] for f in read):
        record_thresholds(ensemble, as_read, ctx)
        return ensemble, features.values
    order = sorted(read)
    codes = ctx.options.split_codes
    if codes is None:  # where the kernel's compares outweigh the encoding (or the replay)
        encoded = frozenset(f for f in order if mapped[f])
        if ensemble.float32_inputs and replay_pays(ensemble, encoded):
            replay = [mapped[f] for f in order]
            return _replayed(ensemble, features, maps, replay, order, as_read, ctx)
        columns = len({(maps[f].source, maps[f].fill) for f in encoded})  # type: ignore[union-attr]
        codes = split_codes_pay(ensemble, encoded, columns)
    # The new matrix: the raw columns the maps read (float64, or float32 split codes deciding
    # alike), then the other columns read as computed.
    x, column = raw_matrix(features, ctx, order, [mapped[f] for f in order], splits=codes)
    trees = _fold_trees(ensemble, maps, mapped, column, ctx)
    folded = sum(1 for f in read if mapped[f] and maps[f].steps)  # type: ignore[union-attr]
    result = Ensemble(trees, int(x.shape[1]), float32_inputs=False, **ensemble.summing)
    how = "in float64" if x.dtype == "float64" else "as float32 split codes"
    ctx.note(
        f"splits exact {how} on {len({column[f] for f in order if mapped[f]})} raw columns"
        + (f" ({folded} computed features folded into thresholds)" if folded else "")
    )
    return result, x


def _replayed(
    ensemble: Ensemble,
    features: Features,
    maps: tuple[ColumnMap | None, ...],
    mapped: list[bool],
    order: list[int],
    as_read: list[int | None],
    ctx: Context,
) -> tuple[Ensemble, lz.LazyTensor]:
    """A float32-comparing ensemble over the features it reads (``order``), the mapped ones
    replayed by the host as the source computes them (:mod:`compiler.replayed_columns`): its
    thresholds stand, and the splits compare float32. Each replayed feature's thresholds are
    still folded onto its raw column, for the gate's probes and float32 tables' moves."""
    # The replayed features as one block, then the others read as computed.
    replayed_order = [f for f, replay in zip(order, mapped, strict=True) if replay]
    others = [f for f, replay in zip(order, mapped, strict=True) if not replay]
    block = tuple(maps[f] for f in replayed_order)
    columns = [ctx.replayed_block(block)]  # type: ignore[arg-type]
    if others:
        value = features.select(others).values  # float32(v) is the source's own rounding
        columns.append(value if value.dtype == "float32" else lz.cast(value, "float32"))
    x = columns[0] if len(columns) == 1 else lz.concat(columns, axis=1)
    column = {f: i for i, f in enumerate(replayed_order + others)}
    trees = _fold_trees(ensemble, maps, [False] * len(maps), column, ctx)
    replayed = set(f for f, replay in zip(order, mapped, strict=True) if replay)
    record_thresholds(ensemble, [None if f in replayed else c for f, c in enumerate(as_read)], ctx)
    for f, replay in zip(order, mapped, strict=True):
        mapping = maps[f]
        if replay and mapping is not None:
            t = np.concatenate(
                [tree.threshold[~tree.is_leaf & (tree.feature == f)] for tree in ensemble.trees]
            )
            folded, nan_left = _fold_splits(mapping, t, True)
            t32, nan_left32 = _fold_splits(mapping, t, True, np.float32)
            _decides(mapping.source, folded, nan_left, t32, nan_left32, ctx)
    result = Ensemble(trees, len(order), float32_inputs=True, **ensemble.summing)
    ctx.note(f"splits exact on {sum(mapped)} computed features the host replays in float32")
    return result, x


def _decides(
    source: int,
    folded: np.ndarray,
    nan_left: np.ndarray | None,
    t32: np.ndarray,
    nan_left32: np.ndarray | None,
    ctx: Context,
) -> None:
    ctx.decides_at(
        source,
        folded,
        "split threshold",
        float32_values=t32,
        float32_nan_differs=answers_differ(nan_left, nan_left32),
    )


def record_thresholds(ensemble: Ensemble, raw: Sequence[int | None], ctx: Context) -> None:
    """Record the thresholds of splits on raw input columns (``raw[f]``: the column feature
    ``f`` reads, None where it is computed) as the points where the ensemble decides."""
    for f, column in enumerate(raw):
        if column is None:
            continue
        t = [tree.threshold[~tree.is_leaf & (tree.feature == f)] for tree in ensemble.trees]
        if any(len(v) for v in t):
            ctx.decides_at(column, np.concatenate(t), "split threshold")


def _fold_trees(
    ensemble: Ensemble,
    maps: tuple[ColumnMap | None, ...],
    mapped: list[bool],
    column: dict[int, int],
    ctx: Context,
) -> tuple[Tree, ...]:
    """Every tree reading matrix columns ``column[f]``, its splits on mapped features folded:
    one bisection per feature over the thresholds of all trees, and one more for raw values
    arriving as float32; each mapped feature's thresholds recorded on its raw column."""
    trees = ensemble.trees
    splits = [~t.is_leaf for t in trees]
    feature = [t.feature.copy() for t in trees]
    threshold = [t.threshold.copy() for t in trees]
    missing_left = [t.missing_left.copy() for t in trees]
    for f in sorted(column):
        nodes = [np.flatnonzero(s & (t.feature == f)) for s, t in zip(splits, trees, strict=True)]
        for i, n in enumerate(nodes):
            feature[i][n] = column[f]
        # A column compared as computed keeps its thresholds: its values are the graph's own,
        # and ``v <= t`` in float64 is the float32 comparison for float32-valued ``v``.
        mapping = maps[f]
        if not mapped[f] or mapping is None:
            continue
        t = np.concatenate([tree.threshold[n] for tree, n in zip(trees, nodes, strict=True)])
        if mapping.fills_only and not ensemble.float32_inputs:
            # ``v <= t`` on the raw value or a fill: the thresholds stand, NaN goes as the fill
            # (on float32 input, the fill as float32).
            fill, fill32 = (mapping(np.array([np.nan]), d)[0] for d in (np.float64, np.float32))
            folded, nan_left = t, (None if np.isnan(fill) else fill <= t)
            t32, nan_left32 = t, (None if np.isnan(fill32) else fill32 <= t)
        else:
            folded, nan_left = _fold_splits(mapping, t, ensemble.float32_inputs)
            t32, nan_left32 = _fold_splits(mapping, t, ensemble.float32_inputs, np.float32)
        ctx.splits_at(mapping.source, mapping.fill, folded)
        _decides(mapping.source, folded, nan_left, t32, nan_left32, ctx)
        at = np.cumsum([0, *(len(n) for n in nodes)])
        for i, n in enumerate(nodes):
            threshold[i][n] = folded[at[i] : at[i + 1]]
            if nan_left is not None:
                missing_left[i][n] = nan_left[at[i] : at[i + 1]]
    return tuple(
        replace(tree, feature=f, threshold=t, missing_left=m)
        for tree, f, t, m in zip(trees, feature, threshold, missing_left, strict=True)
    )


def leaf_sum_on(ensemble: Ensemble, features: Features, ctx: Context) -> lz.LazyTensor:
    """(B, K): :func:`~.strategies.leaf_sum` of ``ensemble`` over ``features``, its splits made
    exact by :func:`exact_splits` where they can be."""
    return explained_leaf_sum_on(ensemble, features, ctx)[0]


def explained_leaf_sum_on(
    ensemble: Ensemble, features: Features, ctx: Context
) -> tuple[lz.LazyTensor, Explanation | None]:
    """:func:`leaf_sum_on`, and where the options ask for explanations (``explain``), the
    TreeSHAP contributions of the features to it (:mod:`.shap`), decided as it decides."""
    folded, x = exact_splits(ensemble, features, ctx)
    raw = leaf_sum(folded, x, ctx)
    if not ctx.options.explain:
        return raw, None
    contributions, expected = tree_contributions(ensemble, folded, x, ctx)
    return raw, Explanation(contributions, expected, features.values, ctx.path)
