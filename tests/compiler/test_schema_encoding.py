"""The host encoding of rows (``InputSchema.to_feed``, ``Vocabulary.encode``) against a per-value
reference: the value-by-value rules the vectorised encoder must reproduce exactly, codes, floats
(signed zeros included) and errors (type, message, row) alike."""

from __future__ import annotations

import math
import random
from decimal import Decimal
from typing import Any

import numpy as np
import pandas as pd
import pytest

from compiler import Column, InputSchema, SchemaError, Vocabulary
from compiler import schema as schema_module


# -- the per-value reference ------------------------------------------------------------------
def _ref_missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


_REF_MISSING = ("<ref missing>",)


def _ref_key(value: Any) -> Any:
    if _ref_missing(value):
        return _REF_MISSING
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def ref_encode(vocab: Vocabulary, column: str, values: np.ndarray) -> np.ndarray:
    index: dict[Any, int] = {}
    for i, c in enumerate(vocab.categories):
        index.setdefault(_ref_key(c), i)
    codes = np.empty(len(values), np.int32)
    for row, value in enumerate(values.tolist()):
        key = _ref_key(value)
        code = (
            vocab.missing if key is _REF_MISSING and vocab.missing is not None else index.get(key)
        )
        if code is None:
            if vocab.unknown is None:
                cats = list(vocab.categories)
                raise SchemaError(
                    f"column {column!r}, row {row}: unknown category {value!r} "
                    f"(known: {cats[:10]}{'…' if len(cats) > 10 else ''})"
                )
            code = vocab.unknown
        codes[row] = code
    return codes


def ref_to_float(values: np.ndarray, column: str, strict: bool) -> np.ndarray:
    if values.dtype.kind in "fiub":
        return values.astype(np.float64)
    out = np.empty(len(values), np.float64)
    for row, value in enumerate(values.tolist()):
        if _ref_missing(value):
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


def _outcome(fn: Any, *args: Any) -> Any:
    """What ``fn`` returns, or the type and message of what it raises."""
    try:
        return fn(*args)
    except Exception as exc:
        return (type(exc), str(exc))


def _assert_same(got: Any, want: Any) -> None:
    if isinstance(want, tuple):
        assert got == want
        return
    assert isinstance(got, np.ndarray), got
    assert got.dtype == want.dtype and got.shape == want.shape
    # Bitwise, so NaN matches NaN and -0.0 differs from 0.0.
    assert got.tobytes() == want.tobytes(), (got, want)


# -- random mixed inputs ----------------------------------------------------------------------
def _pool() -> list[Any]:
    """Values of every kind the encoder treats differently (fresh NaN objects on each call)."""
    return [
        "a", "b", "1", "1.5", " 2 ", "nan", "", np.str_("a"), b"1",
        0, 1, 2, 7, -3, 10**30, np.int64(1), np.int32(2), np.uint8(7),
        0.0, -0.0, 1.0, 1.5, 2.0, float("inf"), float("nan"), np.nan, np.float64(2.0),
        np.float64("nan"), np.float32(1.5), np.float32("nan"), np.float32(1.0),
        True, False, np.bool_(True),
        None, pd.NA, Decimal("1"), Decimal("2.5"),
    ]  # fmt: skip


def _vocabularies(rng: random.Random) -> list[Vocabulary]:
    cat_pool = ["a", "b", "1", 1, 2, 1.5, 0, None, float("nan"), True, 7.0, "nan", -3]
    out = []
    for _ in range(6):
        cats = tuple(rng.sample(cat_pool, rng.randint(1, 7)))
        unknown = rng.choice([None, len(cats)])
        missing = rng.choice([None, None, 0, len(cats)])
        out.append(Vocabulary(cats, unknown=unknown, missing=missing))
    return out


def _columns(rng: random.Random) -> list[np.ndarray]:
    """Object columns mixing a few kinds, plus numeric, bool and str-dtype columns."""
    out = []
    for _ in range(40):
        kinds = rng.sample(_pool(), rng.randint(1, 5))
        n = rng.choice([0, 1, 3, 50, 700])
        column = np.empty(n, object)
        column[:] = [rng.choice(kinds) for _ in range(n)]
        if n and rng.random() < 0.5:  # one fresh NaN object per row, as frames give them
            rows = [i for i in range(n) if rng.random() < 0.3]
            column[rows] = [float("nan") for _ in rows]
        out.append(column)
    out += [
        np.array([1, 2, 7, 2, 1]),
        np.array([1.0, np.nan, -0.0, 0.0, 1.5, 2.0]),
        np.array([True, False, True]),
        np.array([0, 1, 255], np.uint8),
        np.array(["a", "b", "1", "a"]),
        np.array([b"1", b"x"]),
        np.array([1.0, 2.0], np.float32),
    ]
    return out


@pytest.fixture(params=["dict", "pandas"])
def grouping(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Group object columns of every size with a dict, or with pandas' factorize."""
    limit = 10**9 if request.param == "dict" else -1
    monkeypatch.setattr(schema_module, "_DICT_GROUPING_MAX_ROWS", limit)
    return str(request.param)


def test_encode_and_to_float_equal_the_per_value_reference_on_random_mixed_columns(
    grouping: str,
) -> None:
    rng = random.Random(0)
    vocabularies = _vocabularies(rng)
    for values in _columns(rng):
        for vocab in vocabularies:
            _assert_same(
                _outcome(vocab.encode, "c", values), _outcome(ref_encode, vocab, "c", values)
            )
        for strict in (False, True):
            schema = InputSchema((Column("c"),), named=True)
            got = _outcome(_schema_x, schema, {"c": values}, strict)
            _assert_same(got, _outcome(ref_to_float, values, "c", strict))


def _schema_x(schema: InputSchema, data: Any, strict: bool) -> np.ndarray:
    """Column ``c`` of ``x``: numeric (strict) or categorical (a vocabulary taking anything)."""
    if not strict:
        schema.vocabularies[0] = Vocabulary((), unknown=0)
    feed, _ = schema.to_feed(data, np.float64)
    return feed["x"][:, 0]


@pytest.mark.parametrize("form", ["frame", "columns", "dict rows", "object array"])
def test_to_feed_equals_the_reference_per_column_in_every_input_form(
    form: str, grouping: str
) -> None:
    rng = np.random.default_rng(1)
    n = 200
    strings = np.array(["red", "green", "blue", "teal"], object)[rng.integers(0, 4, n)]
    strings[rng.random(n) < 0.1] = None
    strings[rng.random(n) < 0.1] = np.nan
    mixed = np.empty(n, object)
    mixed[:] = [[1, "1", 2.0, True, "x", None][i] for i in rng.integers(0, 6, n)]
    numbers = rng.normal(size=n)
    numbers[rng.random(n) < 0.1] = np.nan
    numbers[:2] = [0.0, -0.0]
    table = {"s": strings, "m": mixed, "n": numbers}
    vocabs = {
        0: Vocabulary(("blue", "green", "red"), unknown=3),
        1: Vocabulary((1, "1", "x", None), unknown=4),
    }
    schema = InputSchema((Column("s"), Column("m"), Column("n")), named=True, vocabularies=vocabs)
    frame = pd.DataFrame(table)
    data: Any = {
        "frame": frame,
        "columns": {k: v.tolist() for k, v in table.items()},
        "dict rows": frame.astype(object).to_dict(orient="records"),
        "object array": frame.to_numpy(dtype=object),
    }[form]
    feed, rows = schema.to_feed(data, np.float64)
    assert rows == n
    for j, name in enumerate(schema.names):
        # The column as the encoder sees it: pandas' own values for a frame, else the table's.
        values = frame[name].to_numpy() if form == "frame" else table[name]
        if j in vocabs:
            _assert_same(feed[f"code:{name}"], ref_encode(vocabs[j], name, values))
        want = ref_to_float(values.astype(object), name, strict=j not in vocabs)
        np.testing.assert_array_equal(feed["x"][:, j], want)
        assert np.array_equal(np.signbit(feed["x"][:, j]), np.signbit(want))


def test_ints_floats_and_bools_share_a_category_as_dict_keys_do() -> None:
    vocab = Vocabulary((1, "a", 2.5, "1"), unknown=4)
    values = np.array([1.0, True, "a", 2.5, np.int64(1), "1", 2, False], object)
    assert vocab.encode("c", values).tolist() == [0, 0, 1, 2, 0, 3, 4, 4]
    assert Vocabulary((False, True)).encode("c", np.array([True, False])).tolist() == [1, 0]
    assert Vocabulary((0, 1)).encode("c", np.array([True, False, True])).tolist() == [1, 0, 1]


def test_missing_values_and_pd_na() -> None:
    values = np.array(["a", None, np.nan, pd.NA, np.float32("nan")], object)
    # None and NaN floats are missing; pd.NA and a float32 NaN are values like any other.
    assert Vocabulary(("a", None), unknown=2).encode("c", values).tolist() == [0, 1, 1, 2, 2]
    assert Vocabulary(("a",), unknown=1, missing=0).encode("c", values).tolist() == [0, 0, 0, 1, 1]
    with pytest.raises(SchemaError, match=r"^column 'c', row 3: unknown category <NA> "):
        Vocabulary(("a", None)).encode("c", values)
    schema = InputSchema((Column("n"),), named=True)
    with pytest.raises(SchemaError, match=r"^column 'n', row 2: <NA> is not a number$"):
        schema.to_feed({"n": [1.0, None, pd.NA]})


def test_unknown_category_error_names_the_first_bad_row_and_its_python_value() -> None:
    vocab = Vocabulary(tuple(range(12)))
    with pytest.raises(SchemaError) as info:
        vocab.encode("color", np.array([3, 5, 40, 41], np.int64))
    assert str(info.value) == (
        "column 'color', row 2: unknown category 40 (known: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]…)"
    )
    with pytest.raises(SchemaError, match=r"^column 'c', row 1: unknown category 'olive' "):
        Vocabulary(("red",)).encode("c", np.array(["red", "olive", 7], object))


def test_unusual_values_take_the_per_value_path_with_its_errors() -> None:
    vocab = Vocabulary(("a",), unknown=1)
    with pytest.raises(TypeError, match="unhashable"):
        vocab.encode("c", np.array(["a", ["b"]], object))
    days = np.array(["2020-01-01", "NaT"], "datetime64[D]")
    assert vocab.encode("c", days).tolist() == ref_encode(vocab, "c", days).tolist()
    schema = InputSchema((Column("n"),), named=True)
    with pytest.raises(SchemaError, match=r"^column 'n', row 1: 'x' is not a number$"):
        schema.to_feed({"n": np.array(["1.5", "x"])})


def test_arrow_string_columns_encode_as_their_objects_do() -> None:
    # Above _DICT_GROUPING_MAX_ROWS rows a frame's column of pandas' default string dtype is
    # grouped by Arrow's dictionary encoding, never turned into objects: codes, floats and errors
    # must be those of its objects.
    rng = np.random.default_rng(2)
    n = schema_module._DICT_GROUPING_MAX_ROWS + 300
    values = np.array(["red", "green", "1.5", "teal", "-0"], object)[rng.integers(0, 5, n)]
    values[rng.random(n) < 0.1] = None
    halves = [values[: n // 2], values[n // 2 :]]  # concat: a column of two Arrow chunks
    frame = pd.concat([pd.DataFrame({"s": pd.Series(h, dtype="str")}) for h in halves])
    assert schema_module._arrow_strings(frame["s"])
    objects = frame["s"].to_numpy()  # NaN where missing
    vocab = Vocabulary(("green", "red", "1.5"), unknown=3)
    schema = InputSchema((Column("s"),), named=True, vocabularies={0: vocab})
    feed, rows = schema.to_feed(frame, np.float64)
    assert rows == n
    _assert_same(feed["code:s"], ref_encode(vocab, "s", objects))
    _assert_same(feed["x"][:, 0], ref_to_float(objects, "s", strict=False))
    for known, bad in (
        (("green", "red", "1.5", "-0", None), "'teal'"),
        (("green", "red", "1.5", "teal", "-0"), "nan"),
    ):
        strict = InputSchema((Column("s"),), named=True, vocabularies={0: Vocabulary(known)})
        row = next(i for i, v in enumerate(objects.tolist()) if repr(v) == bad)
        with pytest.raises(SchemaError, match=rf"^column 's', row {row}: unknown category {bad} "):
            strict.to_feed(frame, np.float64)


def test_other_arrow_string_columns_keep_the_object_path() -> None:
    # ArrowDtype strings show a missing value as pd.NA, a value like any other to the encoder.
    import pyarrow as pa

    column = pd.Series(["a", None] * 600, dtype=pd.ArrowDtype(pa.string()))
    assert not schema_module._arrow_strings(column)
    assert not schema_module._arrow_strings(pd.Series(["a", None] * 600, dtype="string[python]"))
