"""KBinsDiscretizer: bin indices from the fitted edges, as ordinals or one-hot columns.

scikit-learn 1.9 bins with ``np.searchsorted(bin_edges_[j][1:-1], x, side="right")`` — the
number of inner edges ``e <= x``, compared in float64 (or in float32 where ``dtype=np.float32``
makes it cast ``x`` first); no clipping and no tolerance: the outer edges never matter. Edges sit
on data values (quantiles of repeated values, integer midpoints, ...), so rows exactly on an edge
are common. A float32 graph cannot decide them from the host's float32 rounding of a float64 row
(0.1 rounds up to 0.10000000149: every row equal to an edge 0.1 rounded up would be one bin too
high, and no float32 threshold fixes that without breaking the rows just above), so the decisions
are made by :class:`ExactTests`: exact for every float64 input (the graph then takes its input
table in float64), including behind scalers and imputers, in a float32 graph as in a float64 one.

Limits: a column no map describes (a projection's output) is computed in float64 and compared as
the graph computed it (exact up to float64 rounding of the steps computing it); subnormal inputs
are flushed to zero by XLA (``-5e-324`` bins as 0 does).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.preprocessing import KBinsDiscretizer

import lazy as lz

from ..context import Context
from ..features import ColumnMap, Features, Heads
from ..monotone import Test, answers_differ, computed_as_source, fold, raw_in_column_order
from ..registry import register, unsupported_param
from ..trees import float32_floor
from ._sorted import padded

# The tests here (``Test``) are true on an up-set of ``v`` for every ``e`` (``v >= e``,
# ``v > e``, ``float32(v) >= e``, ...); NaN ``v`` may go either way.


def at_least(v: np.ndarray, e: np.ndarray) -> np.ndarray:
    return v >= e


def above(v: np.ndarray, e: np.ndarray) -> np.ndarray:
    return v > e


def float32_at_least(v: np.ndarray, e: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return v.astype(np.float32).astype(np.float64) >= e


class ExactTests:
    """The tests a source makes on ``features``' values against fitted per-column values,
    decided as the source decides them for every float64 input row.

    Where a column is a known non-decreasing map ``v = g(x)`` of one raw input column (the raw
    column itself, a scaler's output, an imputer's fill: :meth:`Features.column_map`), a test
    ``T(g(x), e)`` holds on an up-set of the float64 line, so it is ``x > t`` with ``t`` the
    largest raw value failing it, found at compile time (:func:`compiler.monotone.fold`), and the
    graph compares the raw float64 column (:meth:`Context.raw_float64`): exact, whatever the
    host's float32 rounding or the graph's arithmetic would have made of ``v``. A raw NaN takes
    the source's answer for ``g(NaN)`` (an imputer's fill). Other columns (a projection's output)
    are compared as computed, as ``x >= s`` with ``s`` the smallest value of their dtype above
    ``t`` (:func:`_smallest_passing`), and computed in float64 where their values are not exact
    (:func:`compiler.monotone.computed_as_source`).

    ``float32_source``: the source tests ``float32(v)``; a raw column it reads verbatim then
    needs nothing but the host's own float32 rounding.
    """

    def __init__(self, features: Features, ctx: Context, *, float32_source: bool = False) -> None:
        self.ctx, self.width = ctx, features.width
        maps = features.column_maps()
        raw = [m is not None and not (float32_source and not m.steps) for m in maps]
        #: Per column: the map from the compared column to the source's ``v`` (None: identity).
        self.maps: tuple[ColumnMap | None, ...] = tuple(
            m if r and m.steps else None  # type: ignore[union-attr]
            for m, r in zip(maps, raw, strict=True)
        )
        #: Per column: the raw input column the source's ``v`` is a map of (None: computed).
        self.sources = tuple(None if m is None else m.source for m in maps)
        computed_as_source(features, range(self.width), ctx)
        self.reads_raw = any(raw)
        if not self.reads_raw:
            self.x = features.values
            return
        # The raw float64 columns the maps read, and the other columns as computed.
        self.x = raw_in_column_order(features, ctx, raw)

    def source_values(self, values: lz.LazyTensor) -> lz.LazyTensor:
        """(B, F): the source's ``v`` as precisely as the graph has it, given ``values`` (the
        computed columns): the compared columns where they are ``v`` itself, else ``values``
        (float64 where the compared columns are)."""
        if not self.reads_raw:
            return values
        computed = [m is not None for m in self.maps]
        if not any(computed):
            return self.x
        mask = self.ctx.const(np.asarray(computed), "bool")
        return lz.where(mask, lz.cast(values, "float64"), self.x)

    def thresholds(
        self, values: np.ndarray, test: Test
    ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray, np.ndarray]:
        """For (F, E) fitted ``values`` (NaN: no test, never true): the (F, E) float64 ``t``
        with ``test(v, e)`` iff ``x > t``, and (F, E) answers for NaN ``x`` where a map gives
        NaN a value (None where none does); then the same ``t`` for raw values arriving as
        float32, and per column whether such a NaN is answered otherwise
        (:mod:`compiler.float32_inputs`)."""
        values = np.asarray(values, np.float64)
        t = np.full(values.shape, np.nan)
        t32 = np.full(values.shape, np.nan)
        nan_differs = np.zeros(values.shape[0], bool)
        nan_answer = np.zeros(values.shape, bool)
        some_nan_value = False

        def fails(v: np.ndarray, e: np.ndarray) -> np.ndarray:
            return ~np.asarray(test(v, e))

        groups: list[tuple[list[int], ColumnMap | None]] = [
            ([j for j in range(self.width) if self.maps[j] is None], None)
        ]
        groups += [([j], m) for j, m in enumerate(self.maps) if m is not None]
        for columns, mapping in groups:
            e = values[columns]
            real = ~np.isnan(e)
            if not real.any():
                continue
            block = np.full(e.shape, np.nan)
            block[real], nan_fails = fold(mapping, e[real], fails)
            t[columns] = block
            if mapping is None:  # raw columns: float32 values are tested as their float64
                t32[columns] = block
            else:
                block[real], nan_fails32 = fold(mapping, e[real], fails, np.float32)
                t32[columns] = block
                nan_differs[columns] = answers_differ(nan_fails, nan_fails32)
            if nan_fails is not None:
                some_nan_value = True
                row = np.zeros(e.shape, bool)
                row[real] = ~nan_fails
                nan_answer[columns] = row
        return t, (nan_answer if some_nan_value else None), t32, nan_differs

    def passes(self, values: np.ndarray, test: Test, name: str) -> lz.LazyTensor:
        """(B, F, E) bool: ``test(v[:, f], values[f, e])`` as the source decides it."""
        t, nan_answer, t32, nan_differs = self.thresholds(values, test)
        self._record(t, name, t32, nan_differs)
        x = lz.expand_dims(self.x, 2)
        passed = x >= self.ctx.param(_smallest_passing(t, self.x.dtype), name, dtype=self.x.dtype)
        if nan_answer is not None:
            constant = self.ctx.param(nan_answer, f"{name}_nan", dtype="bool")
            passed = lz.where(lz.isnan(x), constant, passed)
        return passed

    def _record(self, t: np.ndarray, name: str, t32: np.ndarray, nan_differs: np.ndarray) -> None:
        """Record where the tests flip on each raw column: ``t`` is the source's own boundary
        on the raw float64 line (its test replayed through the column's map), ``t32`` the same
        for raw values arriving as float32."""
        for j, source in enumerate(self.sources):
            if source is not None:
                self.ctx.decides_at(
                    source,
                    t[j],
                    f"{name} test",
                    float32_values=t32[j],
                    float32_nan_differs=bool(nan_differs[j]),
                )

    def count(self, values: np.ndarray, test: Test, name: str) -> lz.LazyTensor:
        """(B, F) int32: how many of each column's ``values`` pass ``test``."""
        return lz.sum(lz.cast(self.passes(values, test, name), "int32"), axis=2)

    def holds(self, values: np.ndarray, test: Test, name: str) -> lz.LazyTensor:
        """(B, F) bool: whether ``test(v[:, f], values[f])`` holds, for (F,) ``values``."""
        values = np.asarray(values, np.float64).reshape(self.width, 1)
        passed = self.passes(values, test, name)
        return lz.reshape(passed, (lz.B, self.width))


def _smallest_passing(t: np.ndarray, dtype: str) -> np.ndarray:
    """For thresholds ``t`` (``x > t`` passes): ``s`` in ``dtype`` with ``x >= s`` iff ``x > t``
    for every zero and normal ``x`` of ``dtype`` and every float64 ``x`` that is. ``s`` is never
    subnormal: XLA flushes subnormals to zero (``x > -5e-324`` would fail ``x = 0``), so those
    of ``s`` go to the nearest zero or normal value on the far side of every zero or normal value
    they do not separate. NaN (no test) stays NaN: never passes; so does ``t = +inf``."""
    t = np.asarray(t, np.float64)
    with np.errstate(invalid="ignore"):
        s = np.where(t == np.inf, np.nan, np.nextafter(t, np.inf))
    if dtype == "float32":
        s = -float32_floor(-s)  # the smallest float32 >= s: x >= s iff x >= it for float32 x
    tiny = np.finfo(dtype).tiny
    with np.errstate(invalid="ignore"):
        s = np.where((s > 0) & (s < tiny), tiny, s)
        s = np.where((s < 0) & (s > -tiny), -0.0, s)
    return np.asarray(s, dtype)


@register(
    KBinsDiscretizer,
    methods=("transform",),
    limits="every strategy; encode 'ordinal', 'onehot-dense', and 'onehot' (compiled as dense "
    "output); bin edges exact for every float32 input",
)
def kbins_discretizer(est: Any, features: Features, ctx: Context) -> Heads:
    if est.encode not in ("ordinal", "onehot", "onehot-dense"):
        raise unsupported_param(est, "encode", est.encode, "'ordinal', 'onehot', 'onehot-dense'")
    # searchsorted(bin_edges[1:-1], x, side='right'): the outer edges never matter
    inner = padded([np.asarray(e, np.float64)[1:-1] for e in est.bin_edges_])
    float32_source = est.dtype is not None and np.dtype(est.dtype) == np.float32
    tests = ExactTests(features, ctx, float32_source=float32_source)
    test = float32_at_least if float32_source else at_least
    bins = tests.count(inner, test, "bin_edges_")  # (B, F) int32
    if est.encode == "ordinal":
        return Heads({"transform": lz.cast(bins, ctx.dtype)}, exact=(True,) * features.width)
    # one-hot over categories arange(n_bins_[j]) per column: output column o is
    # ``bins[:, column[o]] == value[o]``
    n_bins = np.asarray(est.n_bins_, np.int64)
    column = np.repeat(np.arange(len(n_bins)), n_bins)
    value = np.concatenate([np.arange(n) for n in n_bins])
    picked = lz.take(bins, ctx.param(column, "onehot_column", dtype="int32"), axis=1)
    hot = picked == ctx.param(value, "onehot_value", dtype="int32")
    return Heads({"transform": lz.cast(hot, ctx.dtype)}, exact=(True,) * len(value))
