"""What a model version's data looked like at registration, for data-quality and drift metrics
(:mod:`service.drift`): per input column its range, missing-value ratio and a histogram, and per
output head a histogram of the answers.

Two sources, per column:

- the registration sample: range, missing-value ratio and histogram of every column, and the
  answers' histograms;
- the fitted pipeline's own statistics (:mod:`compiler.statistics`: its fitted attributes,
  read, never refitted): a ``MinMaxScaler``, ``QuantileTransformer`` or
  ``KBinsDiscretizer`` gives the range of the training values of the raw column it reads, and
  a ``QuantileTransformer`` their distribution too (a histogram); the schema's categories
  (encoders' ``categories_``) let unknown values be counted. A centre and scale
  (``StandardScaler``, ``RobustScaler``) give neither, and nothing in a fitted pipeline gives a
  missing-value ratio: those stay unknown (no out-of-range counts, no PSI, no reference missing
  ratio) unless a sample was given.

With both, the range is the union of the two (a value the model was trained on or the sample
holds is in range) and the histogram and missing ratio are the sample's, the fitted histogram
standing in only for a column the sample has no numbers in.

Histograms bin numeric values at the sample's deciles (values the sample holds, so an integer or
binary column gets one bin per value it takes), or at the fitted quantiles' (quantiles of
repeated values are those values), categorical ones by category plus one bin for values that are
none. Missing values are left out, except in a fitted histogram of a step behind an imputer,
which saw them as the fill and counts them in its bin. The drift score is the population
stability index (PSI) of a window's counts against the reference proportions, both smoothed by
half a count per bin so that an empty bin scores finitely (a fitted histogram's proportions count
as ``n_quantiles_ - 1`` values).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from compiler.schema import InputSchema
from compiler.statistics import LEVELS, ColumnStatistics, widest

#: Output heads with more columns than this have their first ones binned (say, a transform).
MAX_OUTPUT_COLUMNS = 32
#: Rows of the registration sample read, at most (its first).
MAX_REFERENCE_ROWS = 100_000


@dataclass(frozen=True)
class Histogram:
    """Bins of one column: numeric at inner ``edges`` (a value on an edge goes to the bin above),
    or categorical over ``categories`` indices plus a last bin for values that are none;
    ``expected``: the reference's smoothed proportion per bin; ``missing_bin``: the bin missing
    values count in (None: left out)."""

    expected: np.ndarray
    edges: np.ndarray | None = None
    categories: int = 0
    missing_bin: int | None = None

    @property
    def bins(self) -> int:
        return len(self.expected)

    def bin_of(self, values: np.ndarray) -> np.ndarray:
        """The bin of each value: numbers for a numeric histogram (no NaN), category indices
        (-1: none of them) for a categorical one."""
        if self.edges is not None:
            return np.searchsorted(self.edges, values, side="right")
        return np.where(values < 0, self.categories, values)

    @classmethod
    def numeric(cls, values: np.ndarray) -> Histogram | None:
        """The deciles of ``values`` (finite, no NaN), or None for none."""
        if not len(values):
            return None
        # deciles: ten bins for a continuous column, fewer where the sample repeats values
        edges = np.unique(np.quantile(values, LEVELS, method="inverted_cdf"))
        counts = np.bincount(np.searchsorted(edges, values, side="right"), minlength=len(edges) + 1)
        return cls(smoothed(counts), edges=edges)

    @classmethod
    def categorical(cls, indices: np.ndarray, categories: int) -> Histogram | None:
        """Category indices (-1: none of them; missing ones left out), or None for none."""
        if not len(indices):
            return None
        counts = np.bincount(np.where(indices < 0, categories, indices), minlength=categories + 1)
        return cls(smoothed(counts), categories=categories)

    @classmethod
    def fitted(cls, stats: ColumnStatistics) -> Histogram | None:
        """The histogram a fitted step recorded (None: none), its shares counting as
        ``resolution`` values."""
        if stats.edges is None or stats.shares is None or stats.resolution < 1:
            return None
        expected = smoothed(stats.shares * stats.resolution)
        return cls(expected, edges=stats.edges, missing_bin=stats.missing_bin)


def smoothed(counts: np.ndarray) -> np.ndarray:
    """Proportions with half a count added to every bin."""
    counts = np.asarray(counts, np.float64) + 0.5
    return counts / counts.sum()


def psi(counts: np.ndarray, expected: np.ndarray) -> float:
    """The population stability index of ``counts`` against the proportions ``expected``."""
    actual = smoothed(counts)
    return float(np.sum((actual - expected) * np.log(actual / expected)))


@dataclass(frozen=True)
class ColumnReference:
    name: str
    categorical: bool
    #: The numeric values' range: the sample's, widened to the fitted statistics' (None: no
    #: bound known on that side).
    low: float | None = None
    high: float | None = None
    missing_ratio: float | None = None
    histogram: Histogram | None = None
    #: The fitted steps whose statistics the range or histogram come from (path and class).
    fitted: tuple[str, ...] = ()


@dataclass(frozen=True)
class OutputReference:
    """One output head: a histogram per output column (labels: one over the classes)."""

    histograms: tuple[Histogram, ...]
    #: A classifier's ``predict``: labels binned by class.
    classes: Mapping[Any, int] | None = None

    def bins_of(self, answer: np.ndarray) -> list[np.ndarray] | None:
        """Per histogram, the bins of the rows of ``answer`` (NaN left out); None where the
        answer's shape is not the reference's."""
        if self.classes is not None:
            if answer.ndim != 1:
                return None
            index = np.fromiter(
                (self.classes.get(_label_key(v), -1) for v in answer.tolist()),
                np.int64,
                len(answer),
            )
            return [self.histograms[0].bin_of(index)]
        columns = _output_columns(answer)
        if columns is None or len(columns) < len(self.histograms):
            return None
        return [h.bin_of(c[~np.isnan(c)]) for h, c in zip(self.histograms, columns, strict=False)]


@dataclass(frozen=True)
class Reference:
    """A version's registration reference: ``rows`` sample rows (0: none was given)."""

    rows: int
    columns: tuple[ColumnReference, ...]
    outputs: Mapping[str, OutputReference]

    def describe(self) -> dict[str, Any]:
        """What the version's monitoring compares against (for its description)."""
        return {
            "sample_rows": self.rows,
            "columns_with_histograms": sum(c.histogram is not None for c in self.columns),
            "columns_with_ranges": sum(
                c.low is not None or c.high is not None for c in self.columns
            ),
            "columns_from_fitted_statistics": sum(bool(c.fitted) for c in self.columns),
            "outputs": sorted(self.outputs),
        }


def build_reference(
    schema: InputSchema,
    sample: Any,
    answers: Mapping[str, Any] | None,
    classes: Sequence[Any] | None,
    fitted: Sequence[ColumnStatistics] = (),
) -> Reference:
    """The reference of a model with input ``schema`` from its registration ``sample`` (in the
    source's form, or None), the compiled model's ``answers`` on it (per head) and what its
    fitted steps recorded of its raw columns (``fitted``: the compiled model's
    ``statistics``)."""
    by_column = {
        s.column: s
        for s in fitted
        if s.column not in schema.vocabularies and s.column not in schema.unread
    }
    if sample is None:
        columns = tuple(
            _with_fitted(ColumnReference(c.name, j in schema.vocabularies), by_column.get(j))
            for j, c in enumerate(schema.columns)
        )
        return Reference(0, columns, {})
    x, indices = schema.observed(sample)
    refs = []
    for j, column in enumerate(schema.columns):
        present, missing = present_values(x, indices, j)
        low = high = None
        if j in indices:  # a category is known or not, never out of range
            histogram = Histogram.categorical(present, len(schema.vocabularies[j].categories))
        else:
            histogram = Histogram.numeric(present)
            if len(present):
                low, high = float(present.min()), float(present.max())
        if j in schema.unread:
            histogram, low, high = None, None, None
        ratio = float(missing.mean()) if len(missing) else None
        ref = ColumnReference(column.name, j in indices, low, high, ratio, histogram)
        refs.append(_with_fitted(ref, by_column.get(j)))
    outputs = {}
    for method, answer in (answers or {}).items():
        ref = _output_reference(method, answer, classes)
        if ref is not None:
            outputs[method] = ref
    return Reference(len(x), tuple(refs), outputs)


def _with_fitted(ref: ColumnReference, stats: ColumnStatistics | None) -> ColumnReference:
    """``ref`` complemented by a numeric column's fitted statistics: its range widened to
    theirs, their histogram where it has none."""
    if stats is None or ref.categorical:
        return ref
    low = widest(min, ref.low, stats.low)
    high = widest(max, ref.high, stats.high)
    histogram = ref.histogram if ref.histogram is not None else Histogram.fitted(stats)
    return replace(ref, low=low, high=high, histogram=histogram, fitted=stats.steps)


def present_values(
    x: np.ndarray, indices: Mapping[int, np.ndarray], column: int
) -> tuple[np.ndarray, np.ndarray]:
    """Column ``column`` of an :meth:`~compiler.schema.InputSchema.observed` batch: its values
    that are not missing (category indices for a categorical column, else numbers), and which
    rows are missing."""
    if column in indices:
        missing = indices[column] == -2
        return indices[column][~missing], missing
    missing = np.isnan(x[:, column])
    return x[:, column][~missing], missing


def _output_reference(
    method: str, answer: Any, classes: Sequence[Any] | None
) -> OutputReference | None:
    if not isinstance(answer, np.ndarray):
        return None  # a multi-output head (a list of arrays): not monitored
    if method == "predict" and classes is not None and answer.ndim == 1:
        index = {_label_key(c): i for i, c in enumerate(classes)}
        codes = np.fromiter((index.get(_label_key(v), -1) for v in answer.tolist()), np.int64)
        histogram = Histogram.categorical(codes, len(index))
        return None if histogram is None else OutputReference((histogram,), index)
    columns = _output_columns(answer)
    if columns is None:
        return None
    histograms = [Histogram.numeric(c[~np.isnan(c)]) for c in columns[:MAX_OUTPUT_COLUMNS]]
    if any(h is None for h in histograms) or not histograms:
        return None
    return OutputReference(tuple(h for h in histograms if h is not None))


def _output_columns(answer: np.ndarray) -> list[np.ndarray] | None:
    """A numeric answer's columns as float64 (None: not numeric, or more than 2-D)."""
    if answer.dtype.kind not in "fiub" or answer.ndim not in (1, 2):
        return None
    matrix = answer.astype(np.float64, copy=False).reshape(len(answer), -1)
    return [matrix[:, k] for k in range(min(matrix.shape[1], MAX_OUTPUT_COLUMNS))]


def _label_key(value: Any) -> Any:
    """A label as a dict key: numpy scalars as Python ones, integral floats as ints."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return value
