"""The input schema: which columns a model reads, of what kind, and how rows become arrays.

Rows arrive as numpy arrays, pandas DataFrames, lists of dict rows or dicts of columns. The host
turns them into the device graph's inputs: ``x``, a float matrix of every column (non-numeric
values as NaN), and for each categorical column an int32 code vector from its vocabulary
(``code:<column>``), so strings never reach the device.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, Literal, NoReturn

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
        """Int32 codes of a 1-D column (``column`` names it in errors)."""
        groups = _group_or_none(values)
        if groups is None:
            return self._encode_each(column, values)
        return self._encode_groups(column, groups)

    def index_of(self, values: np.ndarray) -> np.ndarray:
        """Each value's index in :attr:`categories`, -1 for a value that is none of them and -2
        for a missing one (``unknown`` and ``missing`` aside: what the data holds, not how the
        model reads it)."""
        groups = _group_or_none(values)
        if groups is None:
            return np.fromiter(map(self._index_of, values.tolist()), np.int64, len(values))
        looked_up = np.asarray([self._index_of(u) for u in groups.uniques], np.int64)
        return looked_up[groups.inverse] if looked_up.size else np.zeros(0, np.int64)

    def _index_of(self, value: Any) -> int:
        key = _key(value)
        return -2 if key is _MISSING else self._index.get(key, -1)

    def _code(self, value: Any) -> int | None:
        """The code of one value; None: unknown, and unknown values are refused."""
        key = _key(value)
        if key is _MISSING and self.missing is not None:
            return self.missing
        code = self._index.get(key)
        return self.unknown if code is None else code

    def _encode_groups(self, column: str, groups: _Groups) -> np.ndarray:
        # One dictionary look-up per distinct value, then one gather for every row.
        looked_up = [self._code(u) for u in groups.uniques]
        refused = [i for i, code in enumerate(looked_up) if code is None]
        if refused:
            row = int(np.flatnonzero(np.isin(groups.inverse, refused))[0])
            self._refuse(column, row, groups.uniques[groups.inverse[row]])
        return np.asarray(looked_up, np.int32)[groups.inverse]

    def _encode_each(self, column: str, values: np.ndarray) -> np.ndarray:
        """Value by value: inputs :func:`_group` does not take (other dtypes, unhashable values)."""
        codes = np.empty(len(values), np.int32)
        for row, value in enumerate(values.tolist()):
            code = self._code(value)
            if code is None:
                self._refuse(column, row, value)
            codes[row] = code
        return codes

    def _refuse(self, column: str, row: int, value: Any) -> NoReturn:
        more = "…" if len(self.categories) > 10 else ""
        raise SchemaError(
            f"column {column!r}, row {row}: unknown category {value!r} "
            f"(known: {list(self.categories)[:10]}{more})"
        )


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
class _Groups:
    """A column's rows grouped so that every row of a group encodes like ``uniques[group]``: equal
    values (``==`` and hash, as a dict look-up sees them) share a group, missing values (None,
    NaN) share one, and nothing else does. ``inverse``: each row's group."""

    uniques: list[Any]
    inverse: np.ndarray


def _group(values: np.ndarray) -> _Groups | None:
    """The groups of a 1-D column without a Python step per row (None for dtypes and sizes left
    to the per-value path). Cost: one hash per row (pandas' factorize) or one sort (numeric
    dtypes), plus Python work per distinct value."""
    kind = values.dtype.kind
    if values.ndim != 1 or len(values) <= _PER_VALUE_MAX_ROWS:
        return None
    if kind in "fiub":  # numbers compare as the dict look-up does; np.unique makes NaN one group
        uniques, inverse = np.unique(values, return_inverse=True)
        return _Groups(uniques.tolist(), inverse.reshape(-1))
    if kind in "US":
        values = values.astype(object)  # the str / bytes objects tolist() would give
    elif kind != "O":
        return None
    if len(values) <= _DICT_GROUPING_MAX_ROWS:
        return _group_by_dict(values.tolist())
    import pandas as pd  # a core dependency; imported on first use (model loading stays light)

    codes, found = pd.factorize(values)
    uniques: list[Any] = found.tolist()
    # pandas puts every null-like value (None, NaN, pd.NA, NaT, …) in group -1; only None and
    # NaN floats are missing here, so regroup those rows: missing ones into one group, the rest
    # (rare) by plain dict equality.
    nulls = np.flatnonzero(codes < 0)
    if nulls.size:
        codes = codes.astype(np.intp, copy=True)
        missing = _missing_mask(values[nulls])
        codes[nulls[missing]] = len(uniques)
        uniques.append(None)
        others = nulls[~missing]
        if others.size:
            rest = _group_by_dict(values[others].tolist())
            codes[others] = rest.inverse + len(uniques)
            uniques.extend(rest.uniques)
    return _Groups(uniques, codes)


# Up to this many rows the per-value path is the cheaper one: the vectorised path's fixed costs
# per column exceed a per-value loop's on a few rows.
_PER_VALUE_MAX_ROWS = 8
# Below this many rows a plain dict groups an object column faster than pandas' factorize (whose
# fixed cost per call would dominate a single-row request).
_DICT_GROUPING_MAX_ROWS = 512


def _group_by_dict(items: list[Any]) -> _Groups:
    """Groups by dict equality, exactly the look-up's (each NaN object is its own group, which is
    why large columns go through pandas instead)."""
    first = dict.fromkeys(items)
    for i, value in enumerate(first):
        first[value] = i
    inverse = np.fromiter(map(first.__getitem__, items), np.intp, len(items))
    return _Groups(list(first), inverse)


def _arrow_strings(column: Any) -> bool:
    """Whether ``column`` (a DataFrame's column) is pandas' default string dtype (``str`` from
    pandas 3.0): strings held in Arrow, missing values NaN, as ``to_numpy()`` gives them. Other
    Arrow-backed columns (``ArrowDtype``, ``string[pyarrow]``) show pd.NA, not NaN, and keep the
    per-object path, so that their missing values mean what they always did."""
    import pandas as pd

    dtype = getattr(column, "dtype", None)
    return (
        isinstance(dtype, pd.StringDtype)
        and dtype.storage == "pyarrow"
        and isinstance(dtype.na_value, float)
        and math.isnan(dtype.na_value)
        and isinstance(column.array, pd.arrays.ArrowExtensionArray)
    )


def _arrow_groups(column: Any) -> _Groups:
    """The groups of an Arrow string column (:func:`_arrow_strings`) from Arrow's dictionary
    encoding, with no Python object per row: faster than through objects (even at 512 rows).
    Arrow's nulls are the missing group, as NaN (what ``to_numpy()`` shows, so that error
    messages name the same value)."""
    import pyarrow as pa

    arrow = column.array.__arrow_array__()
    if isinstance(arrow, pa.ChunkedArray):
        arrow = arrow.combine_chunks()
    encoded = arrow.dictionary_encode()
    uniques: list[Any] = encoded.dictionary.to_pylist()
    inverse = encoded.indices.fill_null(len(uniques)).to_numpy(zero_copy_only=False)
    if encoded.null_count:
        uniques.append(math.nan)
    return _Groups(uniques, inverse.astype(np.intp, copy=False))


def _group_floats(groups: _Groups) -> np.ndarray:
    """Each row's value as float64 (NaN where missing or not a number), decided per group."""
    floats = [
        float(u) if not _is_missing(u) and _takes_float(u) else math.nan for u in groups.uniques
    ]
    return np.asarray(floats, np.float64)[groups.inverse]


def _group_or_none(values: np.ndarray) -> _Groups | None:
    """:func:`_group`, or None where it fails (say, an unhashable value): the per-value path then
    raises what it should, at the row where it should."""
    try:
        return _group(values)
    except Exception:  # any failure: the per-value path meets it too, and reports it
        return None


def _missing_mask(values: np.ndarray) -> np.ndarray:
    """:func:`_is_missing` of each value of an object array (types looked at once per type)."""
    types = list(map(type, values.tolist()))
    is_none = {t: t is type(None) for t in set(types)}
    is_float = {t: issubclass(t, float) for t in is_none}
    mask = np.fromiter(map(is_none.__getitem__, types), bool, len(types))
    floats = np.fromiter(map(is_float.__getitem__, types), bool, len(types))
    if floats.any():
        mask[floats] = np.isnan(values[floats].astype(np.float64))
    return mask


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
    #: The source takes a 1-D array (LabelEncoder's labels): a 1-D input is its one column.
    vector: bool = False
    #: The source took column names with spaces turned into ``_`` (LightGBM records them
    #: so; its predict reads a frame by position): a client's ``sepal length (cm)`` is then the
    #: column ``sepal_length_(cm)``.
    spaces_as_underscores: bool = False
    #: Columns the compiled model never reads (a ColumnTransformer drops them): rows must still
    #: have them, as the source's do, but their values are not parsed (a dropped text column).
    #: Their place in ``x`` holds 0, not NaN: a NaN there would mark every row as missing a
    #: value to whoever reads ``x`` for that (the service's overflow check).
    unread: frozenset[int] = frozenset()

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
    def to_feed(
        self, data: Any, dtype: Any = np.float64, *, check_nan: bool = True
    ) -> tuple[dict[str, np.ndarray], int]:
        """The graph inputs for ``data`` (``x`` in ``dtype``) and its number of rows.

        ``check_nan=False`` skips the scan for missing values in :attr:`rejects_nan` columns: the
        caller then owes :meth:`check_missing` of ``x`` (say, only when the graph's output shows a
        NaN that such a value would certainly have caused; see :mod:`lazy.nan`)."""
        feed, rows, _ = self.to_feed_with_columns(data, dtype, check_nan=check_nan)
        return feed, rows

    def to_feed_with_columns(
        self,
        data: Any,
        dtype: Any = np.float64,
        *,
        check_nan: bool = True,
        columns: Sequence[int] = (),
        omitted: frozenset[int] = frozenset(),
    ) -> tuple[dict[str, np.ndarray], int, np.ndarray | None]:
        """:meth:`to_feed`, and the numeric ``columns`` as the rows of one (k, B) float64 matrix
        where the table's columns arrive apart (a DataFrame, dict rows or columns; None for a
        matrix: read them from ``x``). A host encoder that reads whole columns (the replay,
        :mod:`compiler.replayed_columns`) then reads each contiguously, not strided through
        ``x``. ``omitted`` of them (only that encoder reads them) hold 0 in ``x`` then, as
        :attr:`unread` columns do: they are not written twice."""
        # Fast path, once per request: a float matrix of the right width for an all-numeric
        # model needs no per-column work. When every column rejects NaN, x·x (one BLAS dot;
        # squares are >= 0, so no inf - inf) is NaN exactly when some value is.
        if (
            type(data) is np.ndarray
            and data.ndim == 2
            and data.dtype.kind == "f"
            and data.shape[1] == len(self.columns)
            and not self.vocabularies
        ):
            x = data if data.dtype is dtype else data.astype(dtype, copy=False)
            if (
                check_nan
                and self.rejects_nan
                and (len(self.rejects_nan) != x.shape[1] or math.isnan(np.vdot(x, x)))
            ):
                self.check_missing(x)  # names the column and row
            return {"x": x}, x.shape[0], None
        apart: np.ndarray | None = None
        x = self._numeric_matrix(data, dtype)
        if x is not None:  # the common case: one conversion, no per-column Python
            feed: dict[str, np.ndarray] = {"x": x}
        else:
            values_of = self._columns(data)
            rows = len(values_of[0]) if values_of else 0
            # Omitted columns hold 0: zeroed memory costs less than a strided write.
            x = (np.zeros if omitted else np.empty)((rows, len(self.columns)), dtype)
            feed = {"x": x}
            row_of = {j: r for r, j in enumerate(columns)}
            if columns:
                apart = np.empty((len(columns), rows), np.float64)
            for j, (col, values) in enumerate(zip(self.columns, values_of, strict=True)):
                if j in row_of:  # numeric, by the caller's word
                    assert apart is not None
                    r = row_of[j]
                    if values.dtype.kind in "fiub":
                        apart[r] = values
                    else:
                        apart[r] = _to_float(values, col.name, strict=True)
                    if j not in omitted:
                        x[:, j] = apart[r]
                    continue
                vocab = self.vocabularies.get(j)
                if vocab is not None and not isinstance(values, np.ndarray):
                    groups = _arrow_groups(values)  # an Arrow string column (see _columns)
                    feed[self.code_input(j)] = vocab._encode_groups(col.name, groups)
                    x[:, j] = _group_floats(groups)
                elif vocab is not None:
                    groups = _group_or_none(values)  # shared by the codes and the x column
                    if groups is None:
                        feed[self.code_input(j)] = vocab._encode_each(col.name, values)
                    else:
                        feed[self.code_input(j)] = vocab._encode_groups(col.name, groups)
                    x[:, j] = _to_float(values, col.name, strict=False, groups=groups)
                elif j in self.unread:
                    x[:, j] = 0.0
                elif values.dtype.kind in "fiub":  # cast by the assignment, no float64 copy
                    x[:, j] = values
                else:
                    x[:, j] = _to_float(values, col.name, strict=True)
        if check_nan:
            self.check_missing(x)
        return feed, x.shape[0], apart

    def observed(self, data: Any) -> tuple[np.ndarray, dict[int, np.ndarray]]:
        """``data`` as data-quality monitoring reads it: every column as float64 (NaN where
        missing or not a number), and of each categorical column every value's
        :meth:`Vocabulary.index_of`. Unlike :meth:`to_feed` it refuses no value a model would
        (an unknown category, a NaN), so it also describes rows a model turns away."""
        x = self._numeric_matrix(data, np.float64)
        if x is not None:
            return x, {}
        columns = self._columns(data)
        x = np.empty((len(columns[0]) if columns else 0, len(self.columns)), np.float64)
        indices: dict[int, np.ndarray] = {}
        for j, (col, values) in enumerate(zip(self.columns, columns, strict=True)):
            values = values if isinstance(values, np.ndarray) else values.to_numpy()
            if j in self.unread:
                x[:, j] = np.nan
                continue
            x[:, j] = _to_float(values, col.name, strict=False)
            if j in self.vocabularies:
                indices[j] = self.vocabularies[j].index_of(values)
        return x, indices

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

    def check_missing(self, x: np.ndarray) -> None:
        """Raise :class:`SchemaError` naming the first row and column of ``x`` (the encoded
        matrix) with a NaN in a column that rejects missing values; nothing if there is none."""
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

    def _keys(self, given: list[Any]) -> list[Any]:
        """Per schema column, the key of ``given`` (a table's column names) holding it, or
        None: the name itself, else (:attr:`spaces_as_underscores`) the one name that reads as
        it with spaces turned into ``_``."""
        present = set(given)
        keys: list[Any] = [c if c in present else None for c in self.names]
        if self.spaces_as_underscores and None in keys:
            renamed: dict[str, list[Any]] = {}
            for key in given:
                renamed.setdefault(str(key).replace(" ", "_"), []).append(key)
            keys = [
                k if k is not None or len(renamed.get(c, ())) != 1 else renamed[c][0]
                for c, k in zip(self.names, keys, strict=True)
            ]
        return keys

    def extra_columns(self, data: Any, *, every_row: bool = False) -> tuple[str, ...]:
        """The keys of a table ``data`` (dict rows, ``{column: values}``, a DataFrame) that name
        no column of the schema: :meth:`to_feed` ignores them. Call it on data that
        :meth:`to_feed` took (every column present); arrays have no keys, hence none.

        Of dict rows only the first is looked at, unless ``every_row``: then each row's length
        (in C) shows which hold extras. Either way a well-formed table costs a length check or
        two, never a look at each key."""
        if type(data) is np.ndarray:
            return ()
        n = len(self.columns)
        if _is_dict_rows(data):
            # Every row holds every column (to_feed raised otherwise): longer rows hold extras.
            if len(data[0]) == n and (not every_row or max(map(len, data)) == n):
                return ()
            used = set(self._keys(list(data[0])))
            rows = [r for r in data if len(r) > n] if every_row else data[:1]
            return tuple(str(k) for k in dict.fromkeys(k for r in rows for k in r if k not in used))
        if isinstance(data, Mapping):
            given = data
        elif hasattr(data, "columns") and hasattr(data, "iloc"):  # a pandas DataFrame
            given = data.columns
        else:
            return ()
        if len(given) == n:
            return ()
        given = list(given)
        used = set(self._keys(given))
        return tuple(str(k) for k in given if k not in used)

    def column_mismatch(self, given: Iterable[Any]) -> str:
        """What names ``given`` (a table's column names, or a row's keys) lack and have too many,
        for an error message: ``unknown column 'petal_widht' (did you mean 'petal_width'?);
        missing column 'petal_width'``. Each unknown name is matched against the missing
        columns (:func:`difflib.get_close_matches`): a misspelling names its fix."""
        given = list(given)
        keys = self._keys(given)
        missing = [c for c, k in zip(self.names, keys, strict=True) if k is None]
        used = set(keys)
        return describe_mismatch(missing, [g for g in given if g not in used])

    def _columns(self, data: Any) -> list[Any]:
        """``data``'s columns as 1-D numpy arrays, except a DataFrame's categorical columns of
        Arrow strings, which stay pandas columns (:func:`_arrow_groups` encodes them)."""
        n = len(self.columns)
        if hasattr(data, "columns") and hasattr(data, "iloc"):  # a pandas DataFrame
            if self.named:
                keys = self._keys(list(data.columns))
                if None in keys:
                    raise SchemaError(self.column_mismatch(data.columns))
                columns = [data[k] for k in keys]
                arrow = len(data) > _DICT_GROUPING_MAX_ROWS  # below, Arrow's fixed costs lose
                return [
                    c if arrow and j in self.vocabularies and _arrow_strings(c) else c.to_numpy()
                    for j, c in enumerate(columns)
                ]
            data = data.to_numpy()
        if isinstance(data, Mapping):  # columnar: {column: values}
            keys = self._keys(list(data))
            if None in keys:
                raise SchemaError(self.column_mismatch(data))
            columns = [
                np.asarray(data[k], dtype=object if _has_str(data[k]) else None) for k in keys
            ]
            lengths = {len(c) for c in columns}
            if len(lengths) > 1:
                raise SchemaError(f"columns have different lengths: {sorted(lengths)}")
            return columns
        if isinstance(data, Sequence) and data and isinstance(data[0], Mapping):  # dict rows
            out = []
            keys = self._keys(list(data[0]))
            for name, key in zip(self.names, keys, strict=True):
                try:
                    out.append(np.asarray(list(map(itemgetter(key or name), data)), dtype=object))
                except KeyError:
                    raise SchemaError(self._row_mismatch(data, keys)) from None
            return out
        array = np.asarray(data, dtype=object if _has_str(data) else None)
        if self.vector and array.ndim == 1:
            return [array]
        if array.ndim != 2:
            raise SchemaError(
                f"expected a 2-D table of rows × {n} columns, got an array of shape {array.shape}"
            )
        if array.shape[1] != n:
            raise SchemaError(f"expected {n} columns ({self.names}), got {array.shape[1]}")
        return [array[:, j] for j in range(n)]

    def _row_mismatch(self, rows: Sequence[Mapping[Any, Any]], keys: list[Any]) -> str:
        """The error of the first dict row lacking a column (``keys``: each column's key, as
        read from row 0), naming its unknown keys too: a misspelled key is the usual cause."""
        wanted = [k if k is not None else c for c, k in zip(self.names, keys, strict=True)]
        bad = next(i for i, row in enumerate(rows) if not all(k in row for k in wanted))
        row = rows[bad]
        missing = [c for c, k in zip(self.names, wanted, strict=True) if k not in row]
        used = set(wanted)
        return f"row {bad}: " + describe_mismatch(missing, [k for k in row if k not in used])


# Names listed in a column-mismatch message at most (a hostile row may have thousands of keys).
_LISTED = 10


def describe_mismatch(missing: list[str], unknown: list[Any], noun: str = "column") -> str:
    """``unknown column 'x' (did you mean 'y'?); missing column 'y'``: the names a table lacks
    (``missing``) and those it has that name no column (``unknown``), each unknown one with the
    missing column it most resembles (:func:`difflib.get_close_matches`); either part may be
    absent."""
    parts = []
    if unknown:
        named = []
        for key in unknown[:_LISTED]:
            close = difflib.get_close_matches(str(key), missing, n=1, cutoff=0.6)
            named.append(f"{str(key)!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        parts.append(f"unknown {_plural(noun, unknown)} {_listing(named, len(unknown))}")
    if missing:
        listed = _listing([repr(c) for c in missing[:_LISTED]], len(missing))
        parts.append(f"missing {_plural(noun, missing)} {listed}")
    return "; ".join(parts)


def _plural(noun: str, items: Sequence[Any]) -> str:
    return noun if len(items) == 1 else f"{noun}s"


def _listing(named: list[str], total: int) -> str:
    more = f" and {total - len(named)} more" if total > len(named) else ""
    return ", ".join(named) + more


def _is_dict_rows(data: Any) -> bool:
    if type(data) is list and data and type(data[0]) is dict:  # a JSON body's rows: no ABC checks
        return True
    return isinstance(data, Sequence) and bool(data) and isinstance(data[0], Mapping)


def _has_str(data: Any) -> bool:
    try:
        flat = np.asarray(data, dtype=object).ravel()
    except ValueError:
        return True
    # isinstance once per distinct type, not per value.
    return any(issubclass(t, str) for t in set(map(type, flat[:1000].tolist())))


def _to_float(
    values: np.ndarray, column: str, strict: bool, groups: _Groups | None = None
) -> np.ndarray:
    """A 1-D column as float64: missing values (None, NaN) NaN; other values ``float(value)``,
    and where that fails an error naming the value (``strict``) or NaN. ``groups``: the column's
    :func:`_group`, if already made."""
    kind = values.dtype.kind
    if kind in "fiub":
        return values.astype(np.float64)
    if kind in "OUS" and values.ndim == 1 and len(values) > _PER_VALUE_MAX_ROWS:
        try:
            return _to_float_fast(values.astype(object, copy=False), strict, groups)
        except Exception:  # a bad value: the per-value path names it (or raises what it raised)
            pass
    return _to_float_each(values, column, strict)


def _to_float_fast(values: np.ndarray, strict: bool, groups: _Groups | None) -> np.ndarray:
    # numpy's object → float64 cast is float(value) per value, None as NaN: the per-value rule.
    try:
        return values.astype(np.float64)
    except (TypeError, ValueError):
        if strict:
            raise
    # Not all numbers (say, category names): whether float() takes a value is decided once per
    # group; the values it takes are then cast together (exactly, signed zeros included).
    groups = groups if groups is not None else _group(values)
    assert groups is not None  # a 1-D object column always has groups
    takes = np.fromiter(map(_takes_float, groups.uniques), bool, len(groups.uniques))
    rows = takes[groups.inverse]
    out = np.full(len(values), np.nan)
    out[rows] = values[rows].astype(np.float64)
    return out


def _takes_float(value: Any) -> bool:
    if _is_missing(value):
        return True
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


def _to_float_each(values: np.ndarray, column: str, strict: bool) -> np.ndarray:
    """Value by value: the error path (it names the first bad row) and unusual dtypes."""
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


def _booster_names(estimator: Any) -> tuple[list[str], bool] | None:
    """The column names a native booster records, and whether they are real names (a frame's
    columns) rather than the library's defaults; None where it records none.

    LightGBM (``Booster.feature_name()``, also under an ``LGBMModel``) always has names: a
    DataFrame's columns, else ``Column_0``, ``Column_1``, … (defaults: rows are still read by
    position). XGBoost (``Booster.feature_names``) has them only when it was trained on named
    data."""
    module = type(estimator).__module__.split(".")[0]
    try:
        if module == "lightgbm":
            booster = estimator if hasattr(estimator, "feature_name") else estimator.booster_
            names = [str(n) for n in booster.feature_name()]
            default = names == [f"Column_{i}" for i in range(len(names))]
            return (names, not default) if names else None
        if module == "xgboost" and hasattr(estimator, "feature_names"):  # an xgboost.Booster
            found = estimator.feature_names
            return ([str(n) for n in found], True) if found else None
    except Exception:  # not fitted: the width check below reports it
        return None
    return None


def _sample_width(estimator: Any, sample: Any) -> int:
    """The number of columns of a sample table (rows: arrays, lists or dicts)."""
    if isinstance(sample, Mapping):  # columnar
        return len(sample)
    if isinstance(sample, Sequence) and sample and isinstance(sample[0], Mapping):  # dict rows
        return len(sample[0])
    shape = np.shape(np.asarray(sample, dtype=object))
    if len(shape) != 2 or shape[1] == 0:
        raise SchemaError(
            f"{type(estimator).__name__} does not record its input width, and the sample (shape "
            f"{shape}) is not a table of rows × columns to read it from"
        )
    return int(shape[1])


def schema_for(estimator: Any, sample: Any = None) -> InputSchema:
    """Columns from the fitted estimator (``feature_names_in_``, ``n_features_in_``) and kinds from
    an optional sample (a DataFrame's dtypes)."""
    from sklearn.preprocessing import LabelEncoder

    if isinstance(estimator, LabelEncoder):  # transform(y): one column of labels, 1-D
        return InputSchema((Column("y", "categorical"),), named=False, vector=True)
    names = getattr(estimator, "feature_names_in_", None)
    booster_names = _booster_names(estimator) if names is None else None
    if names is not None:
        cols = [str(n) for n in names]
        named = True
    elif booster_names is not None:
        cols, named = booster_names
    else:
        n = getattr(estimator, "n_features_in_", None)
        if n is None:
            n = _booster_width(estimator)
        if n is None and sample is not None:
            n = _sample_width(estimator, sample)
        if n is None:
            unfitted = " (it was never fitted)" if hasattr(estimator, "fit") else ""
            raise SchemaError(
                f"{type(estimator).__name__} does not record its input width{unfitted}; fit it, "
                "or pass a sample of the table"
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
    columns = tuple(Column(c, kinds.get(c, kinds.get(_spaced(c, kinds), "numeric"))) for c in cols)
    lightgbm = type(estimator).__module__.split(".")[0] == "lightgbm"
    return InputSchema(columns, named, spaces_as_underscores=lightgbm and named)


def _spaced(name: str, names: Mapping[str, Any]) -> str:
    """The one name of ``names`` that reads as ``name`` with spaces turned into ``_``."""
    found = [n for n in names if n.replace(" ", "_") == name]
    return found[0] if len(found) == 1 else name
