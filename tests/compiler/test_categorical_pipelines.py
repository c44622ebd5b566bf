"""Categorical pipelines as users deploy them, compiled exactly.

- HistGradientBoosting with ``categorical_features`` behind an OrdinalEncoder in a
  ColumnTransformer with pandas output: the recipe of scikit-learn's "Categorical Feature Support
  in Gradient Boosting" example. The trees' categorical splits read the encoder's codes (composed
  with HistGradientBoosting's own encoder at compile time); unseen categories become NaN and take
  the missing-value branch.
- LightGBM fitted on a DataFrame with pandas ``category`` columns (the scikit-learn API and a raw
  Booster saved as text): rows carry the category values, read through ``pandas_categorical`` as
  LightGBM reads them; unseen and missing categories go LightGBM's missing way.

Rows are realistic: string columns with repeated values, missing values, categories never seen in
training, and the training rows themselves (whose values are the split thresholds).
"""

from __future__ import annotations

import lightgbm as lgb
import numpy as np
import pandas as pd
import pytest
from sklearn.base import clone
from sklearn.compose import ColumnTransformer, make_column_selector
from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import KBinsDiscretizer, OneHotEncoder, OrdinalEncoder

import compiler
from compiler.errors import SchemaError, UnsupportedError

CITIES = ["Lyon", "Paris", "Nice", "Lille", "Brest", "Metz", "Caen", "Dijon"]
PLANS = ["basic", "plus", "pro"]
DEVICES = ["ios", "android", "web"]
CATEGORICAL = ["city", "plan", "device"]
NUMERIC = ["age", "spend", "visits"]
RTOL = 1e-5


def customers(n: int, seed: int) -> pd.DataFrame:
    """Strings with repeated (skewed) values and missing ones, and numbers with a few decimals
    (many of them split thresholds) and missing values."""
    rng = np.random.default_rng(seed)
    weights = np.arange(len(CITIES), 0, -1) / np.arange(len(CITIES), 0, -1).sum()
    device = rng.choice(np.array([*DEVICES, None], dtype=object), n, p=[0.4, 0.3, 0.2, 0.1])
    age = np.round(rng.normal(40, 12, n), 0)
    age[rng.random(n) < 0.05] = np.nan
    return pd.DataFrame(
        {
            "city": rng.choice(np.array(CITIES, dtype=object), n, p=weights),
            "age": age,
            "plan": rng.choice(np.array(PLANS, dtype=object), n),
            "spend": np.round(rng.gamma(2.0, 30.0, n), 2),
            "device": device,
            "visits": rng.poisson(4, n).astype(np.int64),
        }
    )


def target(frame: pd.DataFrame, kind: str) -> np.ndarray:
    score = (
        frame["city"].isin(["Paris", "Nice", "Metz"]).to_numpy() * 1.5
        + (frame["plan"] == "pro").to_numpy() * 1.0
        - (frame["device"] == "web").to_numpy() * 0.8
        + np.nan_to_num(frame["age"].to_numpy(), nan=40.0) / 20.0
        + frame["spend"].to_numpy() / 60.0
        - 3.5
    )
    if kind == "regression":
        return score
    if kind == "multiclass":
        return np.digitize(score, [-0.5, 0.5])
    return np.where(score > 0, "churn", "stay")


def scoring_rows(seed: int = 1) -> pd.DataFrame:
    """Training-like rows, then rows with unseen categories and missing values."""
    frame = customers(300, seed)
    frame.loc[:19, "city"] = "Atlantis"  # never seen in training
    frame.loc[20:34, "plan"] = "enterprise"
    frame.loc[35:49, "city"] = None
    frame.loc[50:64, "plan"] = np.nan  # no plan was missing in training
    frame.loc[65:79, "device"] = "fridge"
    return frame


def as_inputs(frame: pd.DataFrame, numeric_dtype: str) -> pd.DataFrame:
    """The frame with its numeric columns in ``numeric_dtype`` (float32 clients)."""
    out = frame.copy()
    for column in NUMERIC:
        out[column] = out[column].astype(numeric_dtype)
    return out


def assert_parity(compiled: compiler.CompiledModel, source, rows, source_rows=None) -> None:
    source_rows = rows if source_rows is None else source_rows
    for method in ("predict_proba", "decision_function"):
        if hasattr(source, method) and method in compiled.methods:
            np.testing.assert_allclose(
                getattr(compiled, method)(rows),
                getattr(source, method)(source_rows),
                rtol=RTOL,
                atol=1e-6,
                err_msg=method,
            )
    got, want = compiled.predict(rows), source.predict(source_rows)
    if want.dtype.kind in "fc":  # a regressor
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=1e-6)
    else:  # labels identical
        assert np.array_equal(got, want)


def options(dtype: str) -> compiler.CompileOptions:
    return compiler.CompileOptions(dtype=dtype, max_batch=512, warmup=False)  # type: ignore[arg-type]


# --- HistGradientBoosting behind an OrdinalEncoder -----------------------------------------------


def ordinal_front(**encoder: object) -> ColumnTransformer:
    params = {"handle_unknown": "use_encoded_value", "unknown_value": np.nan, **encoder}
    return ColumnTransformer(
        [("cat", OrdinalEncoder(**params), CATEGORICAL)],
        remainder="passthrough",
        verbose_feature_names_out=False,
    ).set_output(transform="pandas")


# The categorical columns lead the ColumnTransformer's output: indices 0..2, or a mask.
CATEGORICAL_FEATURES = {
    "by-name": CATEGORICAL,
    "by-index": [0, 1, 2],
    "by-mask": [True, True, True, False, False, False],
    "from-dtype": "from_dtype",  # the encoder's output is float: every feature numerical
}


@pytest.fixture(scope="module")
def training() -> pd.DataFrame:
    return customers(1500, 0)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("spec", list(CATEGORICAL_FEATURES), ids=list(CATEGORICAL_FEATURES))
def test_histgb_classifier_behind_an_ordinal_encoder(training, spec, dtype) -> None:
    model = make_pipeline(
        ordinal_front(),
        HistGradientBoostingClassifier(
            categorical_features=CATEGORICAL_FEATURES[spec], max_iter=30, random_state=0
        ),
    ).fit(training, target(training, "binary"))
    hgb = model[-1]
    assert (hgb.is_categorical_ is not None) == (spec != "from-dtype")
    compiled = compiler.compile(model, sample=training, options=options(dtype))
    report = {s.path: s.where for s in compiled.traced.report.steps}
    assert set(report.values()) == {"device"}
    for rows in (training.iloc[:400], scoring_rows()):
        for numeric_dtype in ("float64", "float32"):
            assert_parity(compiled, model, as_inputs(rows, numeric_dtype))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_histgb_multiclass_and_regressor_behind_an_ordinal_encoder(training, dtype) -> None:
    rows = scoring_rows(2)
    for estimator, kind in (
        (
            HistGradientBoostingClassifier(max_iter=15, max_leaf_nodes=15, random_state=0),
            "multiclass",
        ),
        (HistGradientBoostingRegressor(max_iter=30, random_state=0), "regression"),
    ):
        estimator.set_params(categorical_features=CATEGORICAL)
        model = make_pipeline(ordinal_front(), estimator).fit(training, target(training, kind))
        compiled = compiler.compile(model, sample=training, options=options(dtype))
        assert_parity(compiled, model, rows)
        assert_parity(compiled, model, training.iloc[:300])


@pytest.mark.parametrize(
    "encoder",
    [
        {"encoded_missing_value": -1},  # missing: a category of its own
        {"encoded_missing_value": -1, "unknown_value": -2},  # unknown: a value never trained on
        {"encoded_missing_value": 99, "unknown_value": 100},
    ],
    ids=["missing=-1", "missing=-1,unknown=-2", "missing=99,unknown=100"],
)
def test_histgb_behind_an_ordinal_encoder_with_encoded_missing_values(training, encoder) -> None:
    model = make_pipeline(
        ordinal_front(**encoder),
        HistGradientBoostingClassifier(
            categorical_features=CATEGORICAL, max_iter=30, random_state=0
        ),
    ).fit(training, target(training, "binary"))
    compiled = compiler.compile(model, sample=training, options=options("float32"))
    assert_parity(compiled, model, scoring_rows(3))
    assert_parity(compiled, model, training.iloc[:300])


def test_histgb_behind_an_ordinal_encoder_selecting_columns_by_dtype(training) -> None:
    """scikit-learn's example selects the columns with ``make_column_selector``."""
    front = ColumnTransformer(
        [
            (
                "cat",
                OrdinalEncoder(handle_unknown="use_encoded_value", unknown_value=np.nan),
                make_column_selector(dtype_exclude="number"),
            )
        ],
        remainder="passthrough",
        verbose_feature_names_out=False,
    ).set_output(transform="pandas")
    model = make_pipeline(
        front,
        HistGradientBoostingRegressor(categorical_features=CATEGORICAL, random_state=0),
    ).fit(training, target(training, "regression"))
    compiled = compiler.compile(model, sample=training, options=options("float32"))
    assert_parity(compiled, model, scoring_rows(4))


def test_histgb_behind_an_encoder_refusing_unknown_categories(training) -> None:
    model = make_pipeline(
        ordinal_front(handle_unknown="error", unknown_value=None),
        HistGradientBoostingClassifier(categorical_features=CATEGORICAL, random_state=0),
    ).fit(training, target(training, "binary"))
    compiled = compiler.compile(model, sample=training, options=options("float32"))
    assert_parity(compiled, model, training.iloc[:300])
    unseen = training.iloc[:5].copy()
    unseen.loc[unseen.index[2], "city"] = "Atlantis"
    with pytest.raises(ValueError, match="unknown categor"):
        model.predict(unseen)
    with pytest.raises(SchemaError, match="'city', row 2: unknown category 'Atlantis'"):
        compiled.predict(unseen)


def test_histgb_categorical_features_computed_otherwise_are_refused_naming_them(training) -> None:
    """A categorical feature made by another step (here binned ages) has no codes to compose:
    refused with the step and the feature named."""
    front = ColumnTransformer(
        [("bins", KBinsDiscretizer(n_bins=5, encode="ordinal"), ["age"])],
        remainder="drop",
        verbose_feature_names_out=False,
    ).set_output(transform="pandas")
    frame = training.assign(age=training["age"].fillna(40.0))
    model = make_pipeline(
        front, HistGradientBoostingRegressor(categorical_features=["age"], max_iter=5)
    ).fit(frame, target(frame, "regression"))
    with pytest.raises(UnsupportedError) as info:
        compiler.trace(model, sample=frame)
    message = str(info.value)
    assert "histgradientboostingregressor" in message and "['age']" in message
    assert "OrdinalEncoder" in message


def test_encoders_behind_an_ordinal_encoder_compose_its_codes(training) -> None:
    """Any encoder reading an OrdinalEncoder's output composes the codes at compile time; one
    that would raise on a value the first encoder makes (its unknown_value) is refused."""
    columns = ["city", "plan", "age"]
    frame, rows = training[columns], scoring_rows(7)[columns]
    front = ColumnTransformer(
        [("cat", OrdinalEncoder(handle_unknown="use_encoded_value", unknown_value=-1), [0, 1])],
        remainder="passthrough",
    )
    one_hot = ColumnTransformer(
        [("onehot", OneHotEncoder(handle_unknown="ignore", sparse_output=False), [0, 1])],
        remainder="passthrough",
    )
    model = make_pipeline(front, one_hot).fit(frame)
    interpreter = compiler.CompileOptions(backend="interpreter")
    compiled = compiler.compile(model, sample=frame, options=interpreter)
    np.testing.assert_array_equal(compiled.transform(rows), model.transform(rows))
    strict = make_pipeline(clone(front), OrdinalEncoder()).fit(frame[["city", "plan"]])
    with pytest.raises(UnsupportedError, match=r"values \[-1.0\].*'use_encoded_value'"):
        compiler.compile(strict, sample=frame[["city", "plan"]], options=interpreter)


# --- LightGBM on pandas category columns -----------------------------------------------------


def category_frame(frame: pd.DataFrame, categories: dict[str, list[str]] | None = None):
    """``frame`` with its string columns as pandas categories (the training ones, if given:
    values outside them become missing, as ``cat.set_categories`` makes them)."""
    out = frame.copy()
    for column in CATEGORICAL:
        out[column] = out[column].astype("category")
        if categories is not None:
            out[column] = out[column].cat.set_categories(categories[column])
    return out


def lightgbm_scoring(train: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(rows as clients send them: strings, unseen and missing ones; the same rows as the
    category frame LightGBM predicts on)."""
    rows = scoring_rows(5)
    categories = {c: list(train[c].cat.categories) for c in CATEGORICAL}
    return rows, category_frame(rows, categories)


@pytest.fixture(scope="module")
def category_training() -> pd.DataFrame:
    return category_frame(customers(1500, 0))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("kind", ["binary", "multiclass", "regression"])
def test_lightgbm_sklearn_api_on_category_columns(category_training, kind, dtype) -> None:
    params = {"n_estimators": 25, "min_child_samples": 5, "verbose": -1, "random_state": 0}
    cls = lgb.LGBMRegressor if kind == "regression" else lgb.LGBMClassifier
    model = cls(**params).fit(category_training, target(category_training, kind))
    compiled = compiler.compile(model, options=options(dtype))
    schema = compiled.schema.as_dict()["columns"]
    assert {c["name"]: c["kind"] for c in schema}["city"] == "categorical"
    strings, categories = lightgbm_scoring(category_training)
    for numeric_dtype in ("float64", "float32"):
        strings, categories = (
            as_inputs(strings, numeric_dtype),
            as_inputs(categories, numeric_dtype),
        )
        assert_parity(compiled, model, strings, categories)  # strings in, as LightGBM reads them
        assert_parity(compiled, model, categories)  # a category frame too
    assert_parity(compiled, model, category_training.iloc[:300])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_lightgbm_booster_saved_as_text_with_pandas_categories(category_training, dtype) -> None:
    data = lgb.Dataset(category_training, target(category_training, "regression"))
    trained = lgb.train(
        {"objective": "regression", "min_data_in_leaf": 5, "verbose": -1, "seed": 0},
        data,
        num_boost_round=25,
    )
    booster = lgb.Booster(model_str=trained.model_to_string())
    assert booster.pandas_categorical  # the text keeps the categories
    compiled = compiler.compile(booster, options=options(dtype))
    strings, categories = lightgbm_scoring(category_training)
    np.testing.assert_allclose(
        compiled.predict(strings), booster.predict(categories), rtol=RTOL, atol=1e-6
    )
    np.testing.assert_allclose(
        compiled.predict(category_training),
        booster.predict(category_training),
        rtol=RTOL,
        atol=1e-6,
    )


def test_lightgbm_with_an_ordered_category_column_needs_a_sample(category_training) -> None:
    """An ordered category is coded but numerical (not a categorical feature): which features
    were category columns is then not in the model; a sample frame shows them."""
    frame = category_training.copy()
    frame["plan"] = pd.Categorical(frame["plan"], categories=PLANS, ordered=True)
    y = target(frame, "binary")
    model = lgb.LGBMClassifier(n_estimators=20, min_child_samples=5, verbose=-1).fit(frame, y)
    with pytest.raises(UnsupportedError, match=r"pandas category columns.*sample DataFrame"):
        compiler.trace(model)
    compiled = compiler.compile(model, sample=frame, options=options("float32"))
    strings = scoring_rows(6)
    categories = category_frame(strings, {c: list(frame[c].cat.categories) for c in CATEGORICAL})
    categories["plan"] = strings["plan"].astype("category").cat.set_categories(PLANS, ordered=True)
    assert_parity(compiled, model, strings, categories)
