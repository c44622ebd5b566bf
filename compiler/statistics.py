"""What a fitted pipeline itself knows of its training data, per raw input column: the range of
its values and, where a step kept it, their distribution. Drift monitoring compares served rows
against it where no registration sample was given, and widens a sample's range with it
(``service.drift_reference``).

Read-only on public fitted attributes: nothing is refitted, no private attribute is read. A
step's statistics count only for the input columns that are a known non-decreasing map of one
raw column (:meth:`compiler.features.Features.column_map`: the raw column itself, behind
imputers, scalers and the other steps the decisions fold through). A bound or bin edge ``e`` on
the step's input line becomes the smallest raw value ``x`` whose mapped value ``g(x)`` reaches
it, found by the bisection the decisions use (:func:`compiler.monotone.fold`): a raw value is
then below it exactly where the step saw a value below ``e``.

==========================  ========================  ==========================================
step                        fitted attributes         gives
==========================  ========================  ==========================================
``MinMaxScaler``            ``data_min_, data_max_``  the range: its input's minimum and maximum
                                                      (NaN ignored), exactly
``QuantileTransformer``     ``quantiles_,             the range (first and last quantile), and
                            references_``             a histogram: bins at its deciles, each
                                                      with the share of the training values in
                                                      it (known to 1 / (n_quantiles_ - 1))
``KBinsDiscretizer``        ``bin_edges_``            the range (first and last edge; none for a
                                                      constant column, whose edges are ±inf)
``OneHotEncoder``,          ``categories_``           the categories, so unknown ones are
``OrdinalEncoder``, ...                               counted (the schema's vocabularies,
                                                      :mod:`compiler.schema`, not this module)
==========================  ========================  ==========================================

Not read: a ``StandardScaler``'s or ``RobustScaler``'s centre and scale bound nothing, and a
histogram from them would assume a shape (normal) the data need not have; an imputer's fill
values say nothing of how many values were missing, so the missing share stays unknown rather
than 0; HistGradientBoosting's bin thresholds are private. Columns several steps read get the
union of their ranges and the histogram of the finest quantiles.

A step behind an imputer saw each missing value as the fill: its histogram then counts them in
the fill's bin (:attr:`ColumnStatistics.missing_bin`), and so must the rows compared with it; a
constant fill outside the data (``fill_value=-1``) widens the step's range to it.

``QuantileTransformer`` and ``KBinsDiscretizer`` fit large data on a random subsample
(``subsample``: 10 000 and 200 000 rows by default), so their range is the subsample's: a
training value lies outside it with probability about 2 / (subsample + 1), as it lies outside a
sample's range.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from sklearn.preprocessing import KBinsDiscretizer, MinMaxScaler, QuantileTransformer

from .features import ColumnMap, Features
from .monotone import fold

#: The shares a histogram is cut at: deciles, for fitted quantiles and a registration sample
#: alike (:mod:`service.drift_reference`).
LEVELS = np.linspace(0.1, 0.9, 9)


@dataclass(frozen=True)
class ColumnStatistics:
    """What fitted steps (``steps``, by path and class) recorded of raw input column
    ``column``: its training values' range (None: no bound known on that side); where a step
    kept their distribution, a histogram with inner ``edges`` on the raw line (a value on an
    edge belongs to the bin above) and the training values' ``shares`` per bin (one more than
    edges), known to about 1 / ``resolution``; ``missing_bin``: the bin the step counted a
    missing value in (the bin of an imputer's fill; None: it left them out)."""

    column: int
    steps: tuple[str, ...]
    low: float | None = None
    high: float | None = None
    edges: np.ndarray | None = None
    shares: np.ndarray | None = None
    resolution: int = 0
    missing_bin: int | None = None


@dataclass(frozen=True)
class _Fitted:
    """One step's statistics of one of its input columns, on its input line."""

    low: float
    high: float
    quantiles: np.ndarray | None = None
    references: np.ndarray | None = None


@dataclass(frozen=True)
class Recorded:
    """What one fitted step recorded of the raw columns its input columns map (``step``: its
    path and class), still on its input line: :func:`resolve` moves it onto the raw line."""

    step: str
    columns: tuple[tuple[ColumnMap, _Fitted], ...]


def recorded(steps: Iterable[tuple[str, Any, Features]]) -> tuple[Recorded, ...]:
    """What the converted ``steps`` (path, fitted estimator, its input features) recorded: a
    cheap read of their fitted attributes, done with every trace."""
    out = []
    for path, estimator, features in steps:
        fitted = _of_step(estimator)
        if fitted is None or len(fitted) != features.width:
            continue
        columns = []
        for j, f in enumerate(fitted):
            mapping = None if f is None else features.column_map(j)
            if f is not None and mapping is not None:
                columns.append((mapping, f))
        if columns:
            out.append(Recorded(f"{path} ({type(estimator).__name__})", tuple(columns)))
    return tuple(out)


def resolve(
    steps: Iterable[Recorded], categorical: Iterable[int] = ()
) -> tuple[ColumnStatistics, ...]:
    """The statistics of each raw column (by index) that ``steps`` recorded, moved onto the raw
    line (one bisection per column a map changes: done when asked for); ``categorical`` columns
    left out."""
    skip = set(categorical)
    by_column: dict[int, ColumnStatistics] = {}
    for recorded_step in steps:
        for mapping, f in recorded_step.columns:
            if mapping.source in skip:
                continue
            stats = _on_raw_line(mapping, f, recorded_step.step)
            known = by_column.get(stats.column)
            by_column[stats.column] = stats if known is None else _merged(known, stats)
    return tuple(by_column[c] for c in sorted(by_column))


def quantile_bins(quantiles: np.ndarray, references: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Inner bin edges at the deciles of fitted ``quantiles`` (at ``references``, both sorted)
    and the share of the values in each bin: the share below an edge is the reference where the
    quantiles first reach it. Edges are quantiles, so a column of repeated values (integers, a
    flag) gets edges on the values it takes."""
    q, r = np.asarray(quantiles, np.float64), np.asarray(references, np.float64)
    at = np.minimum(np.searchsorted(r, LEVELS, side="left"), len(q) - 1)
    edges = np.unique(q[at])
    below = r[np.searchsorted(q, edges, side="left")]
    shares = np.diff(np.concatenate([[0.0], below, [1.0]]))
    return edges, np.maximum(shares, 0.0)


def _of_step(estimator: Any) -> list[_Fitted | None] | None:
    """Per input column of a fitted step, what it recorded (None: nothing); None for a step
    that records nothing."""
    if isinstance(estimator, MinMaxScaler):
        lows, highs = _vector(estimator, "data_min_"), _vector(estimator, "data_max_")
        if lows is None or highs is None or len(lows) != len(highs):
            return None
        return [_range(lo, hi) for lo, hi in zip(lows, highs, strict=True)]
    if isinstance(estimator, QuantileTransformer):
        q = getattr(estimator, "quantiles_", None)
        r = _vector(estimator, "references_")
        if not isinstance(q, np.ndarray) or q.ndim != 2 or r is None or len(r) != len(q):
            return None
        q = q.astype(np.float64)
        out: list[_Fitted | None] = []
        for j in range(q.shape[1]):
            column = q[:, j]
            usable = len(column) > 1 and np.isfinite(column).all() and (np.diff(column) >= 0).all()
            out.append(_Fitted(column[0], column[-1], column, r) if usable else None)
        return out
    if isinstance(estimator, KBinsDiscretizer):
        edges = getattr(estimator, "bin_edges_", None)
        if edges is None:
            return None
        return [_range(e[0], e[-1]) if len(e) > 1 else None for e in edges]
    return None


def _vector(estimator: Any, name: str) -> np.ndarray | None:
    value = getattr(estimator, name, None)
    if not isinstance(value, np.ndarray) or value.ndim != 1 or value.dtype.kind not in "fiu":
        return None
    return value.astype(np.float64)


def _range(low: float, high: float) -> _Fitted | None:
    low, high = float(low), float(high)
    if not (np.isfinite(low) and np.isfinite(high) and low <= high):
        return None  # an all-NaN column, a constant one binned on ±inf
    return _Fitted(low, high)


def _on_raw_line(mapping: ColumnMap, fitted: _Fitted, step: str) -> ColumnStatistics:
    """``fitted`` (on the step's input line) on the raw line of ``mapping``'s column."""
    edges, shares, resolution = None, None, 0
    if fitted.quantiles is not None and fitted.references is not None:
        edges, shares = quantile_bins(fitted.quantiles, fitted.references)
        resolution = len(fitted.quantiles) - 1
    reached = np.concatenate([[fitted.low], [] if edges is None else edges])
    raw, high = _raw(mapping, reached, fitted.high)
    low = float(raw[0])
    stats = ColumnStatistics(
        mapping.source,
        (step,),
        low if np.isfinite(low) else None,
        high if np.isfinite(high) else None,
    )
    if edges is None or shares is None:
        return stats
    raw_edges = raw[1:]
    if not (np.isfinite(raw_edges).all() and (np.diff(raw_edges) > 0).all()):
        return stats  # the map folds two edges into one (clipping): no histogram
    with np.errstate(all="ignore"):
        fill = mapping(np.array([np.nan]))[0]  # what the step saw for a missing value
    missing_bin = None if np.isnan(fill) else int(np.searchsorted(edges, fill, side="right"))
    return replace(
        stats, edges=raw_edges, shares=shares, resolution=resolution, missing_bin=missing_bin
    )


def _raw(mapping: ColumnMap, reached: np.ndarray, high: float) -> tuple[np.ndarray, float]:
    """Per value ``e`` of ``reached``, the smallest raw ``x`` with ``g(x) >= e`` (+inf: none;
    -inf: every raw value), and the largest raw ``x`` with ``g(x) <= high`` (-inf: none; +inf:
    every raw value): one bisection for all of them."""
    if mapping.fills_only:  # g leaves numbers as they are
        return reached + 0.0, float(high) + 0.0  # -0.0 as 0.0
    values = np.concatenate([reached, [high]])
    strict = np.arange(len(values)) < len(reached)  # g(x) < e, then g(x) <= high

    def holds(v: np.ndarray, e: np.ndarray) -> np.ndarray:
        return np.where(strict, v < e, v <= e)

    largest, _ = fold(mapping, values, holds)
    below = largest[:-1]
    with np.errstate(invalid="ignore"):
        least = np.where(below == -np.inf, -np.inf, np.nextafter(below, np.inf))
    return least + 0.0, float(largest[-1]) + 0.0


def _merged(a: ColumnStatistics, b: ColumnStatistics) -> ColumnStatistics:
    """Two steps' statistics of one column: the union of their ranges, the finer histogram."""
    finer = b if b.resolution > a.resolution else a
    return ColumnStatistics(
        a.column,
        a.steps + b.steps,
        widest(min, a.low, b.low),
        widest(max, a.high, b.high),
        finer.edges,
        finer.shares,
        finer.resolution,
        finer.missing_bin,
    )


def widest(pick: Any, a: float | None, b: float | None) -> float | None:
    """The union's bound on one side (``pick``: ``min`` below, ``max`` above) of two ranges
    whose bounds may be unknown (None): the known ones' widest."""
    known: Sequence[float] = [float(v) for v in (a, b) if v is not None]
    return pick(known) if known else None
