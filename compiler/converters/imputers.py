"""Imputers and missing-value indicators."""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.impute import MissingIndicator, SimpleImputer
from sklearn.utils._missing import is_scalar_nan

import lazy as lz

from ..context import Context
from ..errors import UnsupportedError
from ..features import ColumnMap, Features, Heads
from ..registry import register, unsupported_param
from .discretization import ExactTests, above, at_least
from .provenance import filled


def _numeric_marker(est: Any) -> float:
    """``missing_values`` as a float (NaN or a number); other markers cannot reach the device."""
    value = est.missing_values
    if is_scalar_nan(value):
        return float("nan")
    if isinstance(value, (int, float, np.number)) and not isinstance(value, (bool, np.bool_)):
        return float(value)
    raise unsupported_param(est, "missing_values", value, "NaN or a number")


#: docs/operators.md's exactness note of a numeric ``missing_values``.
NUMERIC_MARKER = "a numeric marker is matched on the raw float64 value (through scalers before it)"


def missing_mask(est: Any, features: Features, ctx: Context) -> lz.LazyTensor:
    """(B, k) bool: where ``features`` hold ``est.missing_values`` (``_get_mask``)."""
    raw = [s for s in features.sources if s is not None]
    if any(ctx.schema.columns[s].kind == "categorical" for s in raw):
        raise UnsupportedError(
            f"{ctx.path}: {type(est).__name__} on non-numeric columns is not supported (their "
            "values do not reach the device)"
        )
    marker = _numeric_marker(est)
    if np.isnan(marker):
        return lz.isnan(features.values)
    # ``x == marker`` as the source decides it on float64 rows (a float32 graph would flag a
    # value one float64 step away): ``x >= marker`` and not ``x > marker``, each an exact test.
    tests = ExactTests(features, ctx)
    markers = np.full(features.width, marker)
    return tests.holds(markers, at_least, "marker_from") & ~tests.holds(markers, above, "marker")


def indicator(est: Any, mask: lz.LazyTensor, ctx: Context) -> lz.LazyTensor:
    """A fitted MissingIndicator's output (float 0/1) from the full missing mask."""
    if est.features == "missing-only" and len(est.features_) < mask.shape[1]:
        if est.error_on_new and not np.isnan(_numeric_marker(est)):
            # NaN in a column not seen missing in fit raises in the source: the input schema's NaN
            # probe makes the host raise too. Another marker would need a value check on the host.
            raise unsupported_param(
                est, "error_on_new", True, "False, or missing_values=NaN, or features='all'"
            )
        mask = Features.derived(mask).select(est.features_).values
    return lz.cast(mask, ctx.dtype)


@register(
    MissingIndicator,
    methods=("transform",),
    limits="numeric columns; `missing_values` NaN or a number; `features` 'missing-only' / 'all'",
    exactness=NUMERIC_MARKER,
)
def missing_indicator(est: Any, features: Features, ctx: Context) -> Heads:
    return Heads.transformed(_flags(est, features, ctx))


def _training_means(est: Any, fills: np.ndarray) -> tuple[float | None, ...]:
    """The output columns' means over the training rows: a mean imputer fills with the mean of
    the observed values, which the filled column keeps (unless the fill was truncated to an
    integer dtype); unknown otherwise."""
    if est.strategy != "mean" or est._fill_dtype.kind != "f":
        return ()
    return tuple(None if np.isnan(f) else float(f) for f in fills)


@register(
    SimpleImputer,
    methods=("transform",),
    exactness="a NaN fill is folded into the decisions that read it (they see the raw column); "
    + NUMERIC_MARKER,
    limits="every strategy; `add_indicator`, `keep_empty_features`; non-numeric (string) columns "
    "with missing_values=NaN only feed a following encoder, which codes missing values as the "
    "fill value on the host",
)
def simple_imputer(est: Any, features: Features, ctx: Context) -> Heads:
    statistics = est.statistics_
    keep = (
        np.arange(features.width)
        if est.keep_empty_features
        else np.flatnonzero([not is_scalar_nan(s) for s in statistics])
    )
    if est._fit_dtype.kind == "O":
        out = _fill_on_host(est, features, ctx)
    else:
        mask = missing_mask(est, features, ctx)
        # the fill is cast to the fitted dtype first (an int column's mean is truncated)
        fills = statistics.astype(est._fill_dtype).astype(np.float64)
        values = lz.where(mask, ctx.param(fills, "statistics_"), features.values)
        sources, maps = features.sources, ()
        if np.isnan(_numeric_marker(est)):
            sources = tuple(filled(s, f) for s, f in zip(sources, fills.tolist(), strict=True))
            maps = _filled_maps(features, fills)
        out = Features(values, sources, maps, means=_training_means(est, fills))
    out = out.select(keep)
    if est.add_indicator:
        if est._fit_dtype.kind == "O":
            raise unsupported_param(est, "add_indicator", True, "False on non-numeric columns")
        out = Features.concat([out, _flags(est.indicator_, features, ctx)])
    return Heads.transformed(out)


def _flags(est: Any, features: Features, ctx: Context) -> Features:
    """A fitted MissingIndicator's flags of ``features``: exact values (the mask is decided as
    the source decides it), and with a NaN marker a map of the column they flag (constant on
    the non-NaN line)."""
    flags = indicator(est, missing_mask(est, features, ctx), ctx)
    if not np.isnan(_numeric_marker(est)):
        return Features.derived(flags).exactly()
    flagged = [features.column_map(int(j)) for j in est.features_]
    maps = tuple(None if m is None else m.then(_is_missing) for m in flagged)
    return Features(flags, (None,) * len(maps), maps, exact=(True,) * len(maps))


def _is_missing(v: np.ndarray) -> np.ndarray:
    return np.isnan(v).astype(v.dtype)


def _filled_maps(features: Features, fills: np.ndarray) -> tuple[ColumnMap | None, ...]:
    """The exact maps of computed columns after their NaN become ``fills`` (verbatim columns
    carry the fill in their :class:`~.provenance.Filled` source instead)."""
    if not features.maps:
        return ()
    return tuple(
        None if m is None else m.imputed(f)
        for m, f in zip(features.maps, fills.tolist(), strict=True)
    )


def _fill_on_host(est: Any, features: Features, ctx: Context) -> Features:
    """Object-dtype (string) columns: the values pass through, the fill rides on provenance."""
    if not is_scalar_nan(est.missing_values):
        raise unsupported_param(est, "missing_values", est.missing_values, "NaN on string columns")
    if any(s is None for s in features.sources):
        raise UnsupportedError(
            f"{ctx.path}: SimpleImputer of non-numeric data needs raw input columns, but some of "
            "its columns are computed by an earlier step"
        )
    fills = est.statistics_.tolist()
    return Features(
        features.values, tuple(filled(s, f) for s, f in zip(features.sources, fills, strict=True))
    )
