"""The input schema: which columns a model reads, of what kind, and how rows become arrays.

Rows arrive as numpy arrays, pandas DataFrames, lists of dict rows or dicts of columns. The host
turns them into the device graph's inputs: ``x``, a float matrix of every column (non-numeric
values as NaN), and for each categorical column an int32 code vector from its vocabulary
(``code:<column>``), so strings never reach the device.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from .errors import SchemaError

Kind = Literal["numeric", "categorical", "boolean"]


def _is_missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


@dataclass(frozen=True)
class Vocabulary:
    """Category → code (its index). ``unknown``: the code of values not in ``categories``
    (None: such a value is an error, as with ``handle_unknown='error'``); missing values (None,
    NaN) are a category only if ``categories`` contains one. ``missing``: the code of missing
    values, overriding the above (an imputer before the encoder filled them in)."""

    categories: tuple[Any, ...]
    unknown: int | None = None
    missing: int | None = None
    _index: dict[Any, int] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        for i, c in enumerate(self.categories):
            key = _key(c)
            if key not in self._index:
                self._index[key] = i

    def encode(self, column: str, values: np.ndarray) -> np.ndarray:
        index, unknown = self._index, self.unknown
        codes = np.empty(len(values), np.int32)
        for row, value in enumerate(values.tolist()):
            key = _key(value)
            code = self.missing if key is _MISSING and self.missing is not None else index.get(key)
            if code is None:
                if unknown is None:
                    raise SchemaError(
                        f"column {column!r}, row {row}: unknown category {value!r} "
                        f"(known: {list(self.categories)[:10]}{'…' if len(self.categories) > 10 else ''})"
                    )
                code = unknown
            codes[row] = code
        return codes


_MISSING = ("<missing>",)


def _key(value: Any) -> Any:
    if _is_missing(value):
        return _MISSING
    if isinstance(value, (np.generic,)):
        value = value.item()
    if isinstance(value, float) and value.is_integer():
        return int(value)  # 1.0 and 1 are one category, as numpy's equality says
    return value


@dataclass(frozen=True)
class Column:
    name: str
    kind: Kind = "numeric"


@dataclass
class InputSchema:
    columns: tuple[Column, ...]
    named: bool  # columns have real names (fitted on a DataFrame): dict rows / frames by name
    vocabularies: dict[int, Vocabulary] = field(default_factory=dict)
    #: Columns where the source estimator raises on a missing value; so must the compiled model.
    rejects_nan: frozenset[int] = frozenset()

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    def code_input(self, column: int) -> str:
        return f"code:{self.columns[column].name}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "columns": [
                {
                    "name": c.name,
                    "kind": c.kind,
                    **(
                        {"categories": [_jsonable(v) for v in self.vocabularies[i].categories]}
                        if i in self.vocabularies
                        else {}
                    ),
                }
                for i, c in enumerate(self.columns)
            ]
        }

    # -- rows → arrays -----------------------------------------------------------------------
    def to_feed(self, data: Any, dtype: Any = np.float64) -> tuple[dict[str, np.ndarray], int]:
        """The graph inputs for ``data`` (``x`` in ``dtype``) and its number of rows."""
        x = self._numeric_matrix(data, dtype)
        if x is not None:  # the common case: one conversion, no per-column Python
            feed: dict[str, np.ndarray] = {"x": x}
        else:
            columns = self._columns(data)
            x = np.empty((len(columns[0]) if columns else 0, len(self.columns)), dtype)
            feed = {"x": x}
            for j, (col, values) in enumerate(zip(self.columns, columns, strict=True)):
                vocab = self.vocabularies.get(j)
                if vocab is not None:
                    feed[self.code_input(j)] = vocab.encode(col.name, values)
                    x[:, j] = _to_float(values, col.name, strict=False)
                else:
                    x[:, j] = _to_float(values, col.name, strict=True)
        self._check_missing(x)
        return feed, x.shape[0]

    def _numeric_matrix(self, data: Any, dtype: Any) -> np.ndarray | None:
        """``data`` as the ``x`` matrix if it is an all-numeric table needing no codes."""
        if self.vocabularies:
            return None
        if isinstance(data, np.ndarray) and data.dtype.kind in "fiub":
            if data.ndim != 2 or data.shape[1] != len(self.columns):
                return None  # the general path names the problem
            return np.asarray(data, dtype=dtype)
        is_frame = hasattr(data, "columns") and hasattr(data, "iloc")
        if is_frame and self.named and all(c in data.columns for c in self.names):
            frame = data[self.names]
            if all(d.kind in "fiub" for d in frame.dtypes):
                return frame.to_numpy(dtype=dtype)
        return None

    def _check_missing(self, x: np.ndarray) -> None:
        columns = sorted(self.rejects_nan - self.vocabularies.keys())
        if not columns or not x.size:
            return
        # One reduction first (fast on the common clean batch); locate only on failure.
        if len(columns) == x.shape[1]:
            # The method, not np.sum: on a single-row request np.sum's dispatch costs more than
            # the sum, and this runs once per scoring request.
            if not math.isnan(x.sum()):
                return
            missing = np.isnan(x)
        else:
            missing = np.isnan(x[:, columns])
        if missing.any():
            row, k = np.argwhere(missing)[0]
            raise SchemaError(
                f"column {self.columns[columns[k]].name!r}, row {int(row)}: missing value (NaN), "
                "which this model does not accept"
            )

    def _columns(self, data: Any) -> list[np.ndarray]:
        n = len(self.columns)
        if hasattr(data, "columns") and hasattr(data, "iloc"):  # a pandas DataFrame
            if self.named:
                missing = [c for c in self.names if c not in data.columns]
                if missing:
                    raise SchemaError(f"missing columns {missing}; expected {self.names}")
                return [data[c].to_numpy() for c in self.names]
            data = data.to_numpy()
        if isinstance(data, Mapping):  # columnar: {column: values}
            missing = [c for c in self.names if c not in data]
            if missing:
                raise SchemaError(f"missing columns {missing}; expected {self.names}")
            columns = [
                np.asarray(data[c], dtype=object if _has_str(data[c]) else None) for c in self.names
            ]
            lengths = {len(c) for c in columns}
            if len(lengths) > 1:
                raise SchemaError(f"columns have different lengths: {sorted(lengths)}")
            return columns
        if isinstance(data, Sequence) and data and isinstance(data[0], Mapping):  # dict rows
            out = []
            for name in self.names:
                try:
                    out.append(np.asarray([row[name] for row in data], dtype=object))
                except KeyError:
                    bad = next(i for i, row in enumerate(data) if name not in row)
                    raise SchemaError(f"row {bad} has no column {name!r}") from None
            return out
        array = np.asarray(data, dtype=object if _has_str(data) else None)
        if array.ndim != 2:
            raise SchemaError(
                f"expected a 2-D table of rows × {n} columns, got an array of shape {array.shape}"
            )
        if array.shape[1] != n:
            raise SchemaError(f"expected {n} columns ({self.names}), got {array.shape[1]}")
        return [array[:, j] for j in range(n)]


def _has_str(data: Any) -> bool:
    try:
        flat = np.asarray(data, dtype=object).ravel()
    except ValueError:
        return True
    return any(isinstance(v, str) for v in flat[:1000])


def _to_float(values: np.ndarray, column: str, strict: bool) -> np.ndarray:
    if values.dtype.kind in "fiub":
        return values.astype(np.float64)
    out = np.empty(len(values), np.float64)
    for row, value in enumerate(values.tolist()):
        if _is_missing(value):
            out[row] = np.nan
            continue
        try:
            out[row] = float(value)
        except (TypeError, ValueError):
            if strict:
                raise SchemaError(
                    f"column {column!r}, row {row}: {value!r} is not a number"
                ) from None
            out[row] = np.nan
    return out


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def _booster_width(estimator: Any) -> int | None:
    """The input width a LightGBM (``num_feature()``) or XGBoost (``num_features()``) Booster
    records; None for anything else."""
    for name in ("num_feature", "num_features"):
        method = getattr(estimator, name, None)
        if callable(method):
            try:
                return int(method())
            except ValueError:  # XGBoostError: an untrained Booster
                return None
    return None


def schema_for(estimator: Any, sample: Any = None) -> InputSchema:
    """Columns from the fitted estimator (``feature_names_in_``, ``n_features_in_``) and kinds from
    an optional sample (a DataFrame's dtypes)."""
    names = getattr(estimator, "feature_names_in_", None)
    if names is not None:
        cols = [str(n) for n in names]
        named = True
    else:
        n = getattr(estimator, "n_features_in_", None)
        if n is None:
            n = _booster_width(estimator)
        if n is None and sample is not None:
            n = np.asarray(sample).shape[1]
        if n is None:
            raise SchemaError(
                f"{type(estimator).__name__} does not record its input width; pass a sample"
            )
        cols = [f"x{i}" for i in range(int(n))]
        named = False
    kinds: dict[str, Kind] = {}
    if sample is not None and hasattr(sample, "dtypes"):
        for name, dtype in sample.dtypes.items():
            kind = getattr(dtype, "kind", "O")
            kinds[str(name)] = (
                "boolean" if kind == "b" else "numeric" if kind in "fiu" else "categorical"
            )
    return InputSchema(tuple(Column(c, kinds.get(c, "numeric")) for c in cols), named)
