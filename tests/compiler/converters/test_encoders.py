"""Encoders on string tables: unseen categories, missing values, dict rows, infrequent categories
and an imputer in front — behaviours the generated conformance suite does not reach."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
from sklearn.compose import ColumnTransformer
from sklearn.impute import SimpleImputer
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import LabelEncoder, OneHotEncoder, OrdinalEncoder, StandardScaler

import compiler

FAST = compiler.CompileOptions(backend="interpreter")
JAX = compiler.CompileOptions(max_batch=4)


def _train() -> pd.DataFrame:
    rng = np.random.default_rng(3)
    n = 120
    color = rng.choice(np.array(["red", "green", "blue"], dtype=object), n)
    color[::10] = np.nan
    color[1] = "violet"  # seen once: infrequent with min_frequency=2
    size = rng.choice(np.array(["S", "M", "L"], dtype=object), n)
    a = rng.normal(size=n)
    a[::7] = np.nan
    return pd.DataFrame(
        {
            "a": a,
            "b": rng.normal(size=n),
            "color": pd.Series(color, dtype=object),
            "size": pd.Series(size, dtype=object),
        }
    )


def _labels(frame: pd.DataFrame) -> np.ndarray:
    return np.where((frame["color"] == "red") | (frame["b"] > 0.5), "yes", "no")


# Rows with unseen ("purple", "XL"), infrequent ("violet") and missing (None, NaN) values. The
# compiled model reads None as missing, like NaN; pandas' string columns do the same, so the source
# sees NaN too (scikit-learn on an object array would take None for a category of its own).
_NEW = pd.DataFrame(
    {
        "a": [0.5, np.nan, -1.0, 2.0, np.nan],
        "b": [0.1, 1.2, -0.3, 0.7, 0.0],
        "color": ["red", "purple", None, "violet", np.nan],
        "size": ["S", "XL", "M", "L", "S"],
    }
)


def _quiet(fn, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # unknown-category warnings of the source
        return fn(*args)


def _transform_both(encoder, rows: pd.DataFrame, options=FAST) -> tuple[np.ndarray, np.ndarray]:
    frame = _train()[["color", "size"]]
    encoder.fit(frame)
    model = compiler.compile(encoder, sample=frame, options=options)
    expected = _quiet(encoder.transform, rows[["color", "size"]])
    expected = expected.toarray() if hasattr(expected, "toarray") else expected
    return model.transform(rows[["color", "size"]]), expected


@pytest.mark.parametrize(
    "handle_unknown", ["ignore", "infrequent_if_exist", "warn"], ids=lambda h: h
)
def test_unseen_categories_follow_handle_unknown(handle_unknown: str) -> None:
    encoder = OneHotEncoder(handle_unknown=handle_unknown, min_frequency=2)
    got, expected = _transform_both(encoder, _NEW)
    np.testing.assert_array_equal(got, expected)


def test_unseen_category_with_handle_unknown_error_raises_on_the_host() -> None:
    frame = _train()[["color", "size"]]
    encoder = OneHotEncoder().fit(frame)
    model = compiler.compile(encoder, sample=frame, options=FAST)
    with pytest.raises(ValueError, match="unknown categor"):
        encoder.transform(_NEW[["color", "size"]])
    with pytest.raises(compiler.SchemaError, match="'purple'"):
        model.transform(_NEW[["color", "size"]])
    # known values, missing ones included (NaN is a fitted category of "color"), pass
    known = _NEW.iloc[[0, 2, 3, 4]][["color", "size"]]
    np.testing.assert_array_equal(model.transform(known), encoder.transform(known).toarray())


def test_none_and_nan_are_one_missing_category() -> None:
    encoder = OrdinalEncoder(
        handle_unknown="use_encoded_value", unknown_value=-1, encoded_missing_value=-9
    )
    got, expected = _transform_both(encoder, _NEW.fillna({"color": np.nan}))
    np.testing.assert_array_equal(got, expected)
    frame = _train()[["color", "size"]]
    model = compiler.compile(encoder, sample=frame, options=FAST)
    # None from JSON or a Python list means missing, like NaN
    rows = [{"color": None, "size": "M"}, {"color": float("nan"), "size": "S"}]
    np.testing.assert_array_equal(model.transform(rows)[:, 0], [-9, -9])


def test_infrequent_categories_share_one_column() -> None:
    encoder = OneHotEncoder(handle_unknown="infrequent_if_exist", max_categories=3)
    got, expected = _transform_both(encoder, _NEW, JAX)
    assert encoder.infrequent_categories_[0] is not None
    np.testing.assert_array_equal(got, expected)


def test_imputed_strings_take_the_fill_value_code() -> None:
    pipe = make_pipeline(
        SimpleImputer(strategy="constant", fill_value="green"), OneHotEncoder(sparse_output=False)
    )
    got, expected = _transform_both(pipe, _NEW.iloc[[0, 2, 4]])
    np.testing.assert_array_equal(got, expected)
    assert got[1:, 1].tolist() == [1.0, 1.0]  # missing → "green"


def test_fill_value_that_is_not_a_category_is_unknown() -> None:
    frame = _train()[["color", "size"]].fillna({"color": "red"})
    imputer = SimpleImputer(strategy="constant", fill_value="none").fit(frame)
    pipe = make_pipeline(imputer, OneHotEncoder()).fit(frame)
    model = compiler.compile(pipe, sample=frame, options=FAST)
    rows = _NEW.iloc[[2]][["color", "size"]]
    with pytest.raises(ValueError):
        pipe.transform(rows)
    with pytest.raises(compiler.SchemaError, match="unknown category"):
        model.transform(rows)
    lenient = make_pipeline(
        SimpleImputer(strategy="constant", fill_value="none"),
        OneHotEncoder(handle_unknown="ignore"),
    ).fit(frame)
    model = compiler.compile(lenient, sample=frame, options=FAST)
    np.testing.assert_array_equal(model.transform(rows), lenient.transform(rows).toarray())


def _mixed_pipeline():
    numeric = make_pipeline(SimpleImputer(strategy="mean"), StandardScaler())
    strings = make_pipeline(
        SimpleImputer(strategy="constant", fill_value="missing"),
        OneHotEncoder(handle_unknown="ignore"),
    )
    ct = ColumnTransformer([("num", numeric, ["a", "b"]), ("cat", strings, ["color", "size"])])
    return make_pipeline(ct, LogisticRegression())


def test_column_transformer_pipeline_end_to_end() -> None:
    frame = _train()
    pipe = _mixed_pipeline().fit(frame, _labels(frame))
    model = compiler.compile(pipe, sample=frame, options=JAX)
    for rows in (frame, _NEW):
        np.testing.assert_array_equal(model.predict(rows), _quiet(pipe.predict, rows))
        np.testing.assert_allclose(
            model.predict_proba(rows), _quiet(pipe.predict_proba, rows), rtol=1e-5, atol=1e-6
        )
    kinds = {c.name: c.kind for c in model.schema.columns}
    assert kinds == {"a": "numeric", "b": "numeric", "color": "categorical", "size": "categorical"}


def test_dict_rows() -> None:
    frame = _train()
    pipe = _mixed_pipeline().fit(frame, _labels(frame))
    model = compiler.compile(pipe, sample=frame, options=FAST)
    rows = [
        {"a": 0.3, "b": 1.5, "color": "red", "size": "S"},
        {"a": None, "b": -0.2, "color": None, "size": "XL"},
    ]
    expected = _quiet(pipe.predict_proba, pd.DataFrame(rows).astype({"a": float}))
    np.testing.assert_allclose(model.predict_proba(rows), expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(compiler.SchemaError, match="'size'"):
        model.predict([{"a": 0.3, "b": 1.5, "color": "red"}])


# -- numpy arrays of strings -------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [object, str], ids=["object", "unicode"])
def test_a_numpy_string_array_compiles_with_itself_as_the_sample(dtype) -> None:
    rng = np.random.default_rng(4)
    x = np.column_stack([rng.choice(["red", "green", "blue"], 90), rng.choice(["S", "M"], 90)])
    x = x.astype(dtype)
    y = (x[:, 0] == "red").astype(int)
    pipe = make_pipeline(OneHotEncoder(handle_unknown="ignore"), LogisticRegression()).fit(x, y)
    for sample in (x, x[:5], x.tolist()):
        model = compiler.compile(pipe, sample=sample, options=FAST)
        np.testing.assert_array_equal(model.predict(x), pipe.predict(x))
        np.testing.assert_allclose(model.predict_proba(x), pipe.predict_proba(x), rtol=1e-6)


def test_a_string_array_with_a_numeric_column_keeps_its_missing_value_check() -> None:
    rng = np.random.default_rng(5)
    x = np.column_stack([rng.choice(["a", "b"], 60), rng.integers(0, 3, 60)]).astype(object)
    x[:, 1] = x[:, 1].astype(float)
    y = (x[:, 0] == "a").astype(int)
    ct = ColumnTransformer([("c", OneHotEncoder(), [0]), ("n", "passthrough", [1])])
    pipe = make_pipeline(ct, LogisticRegression()).fit(x, y)
    model = compiler.compile(pipe, sample=x, options=FAST)
    np.testing.assert_array_equal(model.predict(x), pipe.predict(x))
    bad = x[:2].copy()
    bad[1, 1] = np.nan  # LogisticRegression refuses NaN, so must the compiled model
    with pytest.raises(compiler.SchemaError, match="row 1: missing value"):
        model.predict(bad)


# -- LabelEncoder ------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["interpreter", "jax"])
def test_label_encoder_maps_labels_to_their_codes_without_a_sample(backend) -> None:
    labels = np.array(["pear", "apple", "fig", "apple", "pear", "pear"])
    est = LabelEncoder().fit(labels)
    options = compiler.CompileOptions(backend=backend, max_batch=4)
    model = compiler.compile(est, options=options)
    assert model.schema.names == ["y"]
    queries = ["fig", "pear", "apple", "apple", "fig", "pear", "fig"]
    for form in (queries, np.array(queries), np.array(queries, dtype=object), pd.Series(queries)):
        np.testing.assert_array_equal(model.transform(form), est.transform(form))
    with pytest.raises(ValueError, match="unseen labels"):
        est.transform(["kiwi"])
    with pytest.raises(compiler.SchemaError, match="unknown category 'kiwi'"):
        model.transform(["fig", "kiwi"])


def test_label_encoder_of_integers_takes_floats_as_numpy_compares_them() -> None:
    est = LabelEncoder().fit([10, 3, 3, 7, 10, 10])
    model = compiler.compile(est, options=FAST)
    queries = np.array([7.0, 3.0, 10.0, 3.0])
    np.testing.assert_array_equal(model.transform(queries), est.transform(queries))
    np.testing.assert_array_equal(model.transform([[7], [10]]), [1, 2])  # a one-column table
