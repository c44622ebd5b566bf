"""What flows between converters: feature matrices with provenance, and output heads."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import numpy as np

import lazy as lz

#: One step of a :class:`ColumnMap`: float64 values → float64 values, as the source computes them.
Step = Callable[[np.ndarray], np.ndarray]
T = TypeVar("T")


@dataclass(frozen=True)
class ColumnMap:
    """A computed column as a non-decreasing function of one raw input column.

    ``steps`` replay, in the source's own order of operations, what the fitted steps did to raw
    column ``source`` (a scaler's ``(x - mean) / scale``, an imputer's fill), each non-decreasing
    on non-NaN values. Each step keeps its input's dtype and computes as the source computes on
    input of that dtype: float64, or float32 (where scikit-learn's transformers keep float32 and
    round after every operation; see :mod:`compiler.float32_inputs`). A decision the source
    makes on the computed value, such as a tree's ``v <= t``, is then a decision ``x <= t'`` on
    the raw value, with ``t'`` found once at compile time (:mod:`compiler.trees.folding`): exact,
    and the steps cost nothing per row.
    """

    source: int
    steps: tuple[Step, ...] = ()
    #: Every step leaves non-NaN values as they are (imputers): the column is then the raw
    #: column's value or a fill, which a float32 graph rounds as the source rounds it.
    fills_only: bool = True
    #: The value a raw NaN becomes before any other step sees it (an imputer on the raw column),
    #: None where a NaN reaches a step as NaN. A decision may then read the raw column with its
    #: NaN so filled, which no NaN reaches: every later step sees that value in the source too.
    fill: float | None = None

    def then(self, *steps: Step) -> ColumnMap:
        """This map followed by non-decreasing ``steps`` that may change non-NaN values."""
        return ColumnMap(self.source, (*self.steps, *steps), False, self.fill)

    def imputed(self, value: float) -> ColumnMap:
        """This map followed by an imputer's fill of NaN with ``value``."""
        step = Fill(float(value))
        fill = float(value) if not self.steps else self.fill  # a later fill never sees NaN
        return ColumnMap(self.source, (*self.steps, step), self.fills_only, fill)

    def __call__(self, raw: np.ndarray, dtype: Any = np.float64) -> np.ndarray:
        """The source's values for raw values ``raw`` arriving as ``dtype``, as float64."""
        return self.source_values(raw, dtype).astype(np.float64)

    def source_values(self, raw: np.ndarray, dtype: Any = np.float64) -> np.ndarray:
        """The source's values for raw values ``raw`` arriving as ``dtype``, in ``dtype``."""
        v = np.asarray(raw).astype(dtype)
        for step in self.steps:
            v = step(v)
            if v.dtype != dtype:  # a step computing in another precision is not the source's
                raise TypeError(f"a column map step turned {np.dtype(dtype)} into {v.dtype}")
        return v


@dataclass(frozen=True)
class Fill:
    """A :data:`Step`: NaN replaced by ``value``. scikit-learn writes the fill into the input's
    own array, so float32 input rounds it.

    Like :class:`Arithmetic` and :class:`Clip`, a step of one kind (:attr:`kind`) applies to
    many columns at once with its :attr:`params` stacked per column, each element computed as
    the column's own step computes it (see :mod:`compiler.replayed_columns`)."""

    value: float

    @property
    def kind(self) -> tuple[Any, ...]:
        return (Fill,)

    @property
    def params(self) -> tuple[float, ...]:
        return (self.value,)

    def __call__(self, v: np.ndarray) -> np.ndarray:
        return self.apply(v, np.float64(self.value))

    @staticmethod
    def apply(v: np.ndarray, value: Any) -> np.ndarray:
        return np.where(np.isnan(v), np.asarray(value).astype(v.dtype), v)


@dataclass(frozen=True)
class Arithmetic:
    """A :data:`Step`: ``v op param`` as scikit-learn computes it, in place on the input's
    array: in float64 and rounded to ``v``'s dtype, or where ``in_input_dtype`` with ``param``
    first cast to ``v``'s dtype (StandardScaler on float32 input)."""

    op: np.ufunc
    param: float
    in_input_dtype: bool = False

    @property
    def kind(self) -> tuple[Any, ...]:
        return (Arithmetic, self.op, self.in_input_dtype)

    @property
    def params(self) -> tuple[float, ...]:
        return (self.param,)

    def __call__(self, v: np.ndarray) -> np.ndarray:
        return self.apply(v, np.float64(self.param))

    def apply(self, v: np.ndarray, param: Any) -> np.ndarray:
        if self.in_input_dtype:
            return self.op(v, np.asarray(param).astype(v.dtype))
        return self.op(v.astype(np.float64, copy=False), param).astype(v.dtype, copy=False)


@dataclass(frozen=True)
class Clip:
    """A :data:`Step`: ``np.clip(v, low, high)``, the bounds in ``v``'s dtype."""

    low: float
    high: float

    @property
    def kind(self) -> tuple[Any, ...]:
        return (Clip,)

    @property
    def params(self) -> tuple[float, ...]:
        return (self.low, self.high)

    def __call__(self, v: np.ndarray) -> np.ndarray:
        return self.apply(v, np.float64(self.low), np.float64(self.high))

    @staticmethod
    def apply(v: np.ndarray, low: Any, high: Any) -> np.ndarray:
        return np.clip(v, np.asarray(low).astype(v.dtype), np.asarray(high).astype(v.dtype))


@dataclass(frozen=True, eq=False)
class CodeTable:
    """A computed column as a table look-up of a raw column's host-made category codes.

    Row r's value is ``table[code[r]]`` (float64, as the source computes it), as an
    OrdinalEncoder's output is; codes where ``reachable`` is False never occur (an unknown value
    the host refuses). An encoder reading such a column composes its own look-up with the table
    at compile time (HistGradientBoosting's categorical features behind an OrdinalEncoder), so
    no category is found by comparing floats on the device.
    """

    code: lz.LazyTensor  # (B,) int32
    table: np.ndarray  # (n_codes,) float64
    reachable: np.ndarray  # (n_codes,) bool


@dataclass(frozen=True)
class Features:
    """A (B, k) float matrix a step consumes.

    ``sources[j]`` is the index of the input-table column that column j is verbatim, or None if it
    was computed. Categorical encoders use it to read the host-made integer codes of a raw column.
    ``maps[j]`` (optional, empty: none known) describes a computed column j exactly as a
    :class:`ColumnMap` of one raw column; see :meth:`column_map`. ``codes[j]`` (optional, empty:
    none known) describes a computed column j as a :class:`CodeTable` look-up of a raw column's
    category codes. ``exact[j]`` (optional, empty: none known) says that computed column j holds
    exactly the source's values in any float dtype (category codes, 0/1 flags), so a decision on
    it needs neither a map nor float64; see :meth:`decided_exactly`. ``means[j]`` (optional,
    empty or None: not known) is column j's mean over the training rows where a fitted step
    records it (a StandardScaler's output: 0; a mean imputer's: its fill), which a linear
    model's explanation is centred on (:func:`compiler.explain.additive`).
    """

    values: lz.LazyTensor
    sources: tuple[int | None, ...]
    maps: tuple[ColumnMap | None, ...] = ()
    codes: tuple[CodeTable | None, ...] = ()
    exact: tuple[bool, ...] = ()
    means: tuple[float | None, ...] = ()

    def __post_init__(self) -> None:
        if self.values.ndim != 2 or self.values.shape[1] != len(self.sources):
            raise ValueError(f"features {self.values.shape} vs {len(self.sources)} sources")
        if self.maps and len(self.maps) != len(self.sources):
            raise ValueError(f"features of {len(self.sources)} columns vs {len(self.maps)} maps")
        if self.codes and len(self.codes) != len(self.sources):
            raise ValueError(f"features of {len(self.sources)} columns vs {len(self.codes)} codes")
        if self.means and len(self.means) != len(self.sources):
            raise ValueError(f"features of {len(self.sources)} columns vs {len(self.means)} means")
        if self.exact and len(self.exact) != len(self.sources):
            raise ValueError(f"features of {len(self.sources)} columns vs {len(self.exact)} flags")

    def code_table(self, j: int) -> CodeTable | None:
        """Column j as a look-up of a raw column's category codes, if it is known to be one."""
        return self.codes[j] if self.codes else None

    def column_map(self, j: int) -> ColumnMap | None:
        """Column j as a map of a raw column: its own map, or the identity of (or an imputer's
        fill of) the raw column it is verbatim; None where it is computed some other way."""
        if self.maps and self.maps[j] is not None:
            return self.maps[j]
        source = self.sources[j]
        if source is None:
            return None
        fill = getattr(source, "fill", None)  # a provenance.Filled source
        raw = ColumnMap(int(source))
        return raw if fill is None else raw.imputed(float(fill))

    def column_maps(self) -> tuple[ColumnMap | None, ...]:
        return tuple(self.column_map(j) for j in range(self.width))

    def decided_exactly(self, j: int) -> bool:
        """Whether a decision on column j can be made as the source makes it on float64 inputs
        without computing the column in float64: a map folds it onto a raw column, or its values
        are exact (``exact[j]``)."""
        return bool(self.exact and self.exact[j]) or self.column_map(j) is not None

    def exactly(self) -> Features:
        """These features, every column marked as holding exactly the source's values."""
        return replace(self, exact=(True,) * self.width)

    def mapped(
        self, values: lz.LazyTensor, step: Callable[[int], Step | tuple[Step, ...] | None]
    ) -> Features:
        """``values``, computed from these features column by column by non-decreasing steps
        (``step(j)``: column j's replay, None where it has none)."""
        maps = []
        for j, m in enumerate(self.column_maps()):
            s = None if m is None else step(j)
            maps.append(None if s is None else m.then(*(s if isinstance(s, tuple) else (s,))))
        return Features(values, (None,) * self.width, tuple(maps))

    @property
    def width(self) -> int:
        return len(self.sources)

    @classmethod
    def derived(cls, values: lz.LazyTensor) -> Features:
        return cls(values, (None,) * int(values.shape[1]))

    def select(self, indices: Sequence[int]) -> Features:
        """Columns ``indices`` in that order (a slice when contiguous, else a gather)."""
        idx = [int(i) for i in indices]
        if idx == list(range(self.width)):
            return self
        sources = tuple(self.sources[i] for i in idx)
        maps = tuple(self.maps[i] for i in idx) if self.maps else ()
        codes = tuple(self.codes[i] for i in idx) if self.codes else ()
        exact = tuple(self.exact[i] for i in idx) if self.exact else ()
        means = tuple(self.means[i] for i in idx) if self.means else ()
        if idx and idx == list(range(idx[0], idx[0] + len(idx))):
            values = lz.slice_axis(self.values, 1, idx[0], idx[0] + len(idx))
        else:
            values = lz.take(self.values, lz.const(np.asarray(idx, np.int32)), axis=1)
        return Features(values, sources, maps, codes, exact, means)

    @staticmethod
    def concat(parts: Sequence[Features]) -> Features:
        parts = [p for p in parts if p.width]
        if len(parts) == 1:
            return parts[0]
        values = lz.concat([p.values for p in parts], axis=1)
        maps = _joined([p.maps for p in parts], [p.width for p in parts], None)
        codes = _joined([p.codes for p in parts], [p.width for p in parts], None)
        exact = _joined([p.exact for p in parts], [p.width for p in parts], False)
        means = _joined([p.means for p in parts], [p.width for p in parts], None)
        sources = tuple(s for p in parts for s in p.sources)
        return Features(values, sources, maps, codes, exact, means)


def _joined(columns: Sequence[tuple[T, ...]], widths: Sequence[int], default: T) -> tuple[T, ...]:
    """Per-column annotations of parts side by side (a part without any: ``default``); empty
    where no part has any."""
    if not any(columns):
        return ()
    return tuple(
        c for part, w in zip(columns, widths, strict=True) for c in (part or (default,) * w)
    )


@dataclass(frozen=True)
class Heads:
    """A converter's outputs, by method name (``predict``, ``predict_proba``, ``transform``…).

    For classifiers ``predict`` holds int32 indices into ``classes``; the compiled model maps them
    back to the labels on the host, so labels of any type come back exactly.

    ``splits``: heads the source returns as a list of per-output arrays (MultiOutputClassifier's
    ``predict_proba``) are one (B, sum of widths) output side by side; the compiled model splits
    it into the list on the host.
    """

    outputs: Mapping[str, lz.LazyTensor]
    classes: np.ndarray | None = None
    sources: tuple[int | None, ...] | None = None  # provenance of the transform head's columns
    maps: tuple[ColumnMap | None, ...] = ()  # exact maps of the transform head's columns
    extra: Mapping[str, object] = field(default_factory=dict)
    splits: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    codes: tuple[CodeTable | None, ...] = ()  # code look-ups of the transform head's columns
    exact: tuple[bool, ...] = ()  # which of the transform head's columns are exact values
    means: tuple[float | None, ...] = ()  # the transform head's columns' training means

    def features(self) -> Features:
        values = self.outputs["transform"]
        if values.ndim == 1:
            values = lz.reshape(values, (lz.B, 1))
        sources = self.sources or (None,) * int(values.shape[1])
        return Features(values, sources, self.maps, self.codes, self.exact, self.means)

    @classmethod
    def transformed(cls, features: Features, **heads: Any) -> Heads:
        """``features`` as the transform head (``heads``: more outputs and fields)."""
        outputs = {**heads.pop("outputs", {}), "transform": features.values}
        return cls(
            outputs,
            sources=features.sources,
            maps=features.maps,
            codes=features.codes,
            exact=features.exact,
            means=features.means,
            **heads,
        )
