"""Missing values found through the output: heads whose output row is NaN whenever a refused NaN
is in its input row skip the scan of the whole input, and still refuse that row by name."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from sklearn.datasets import make_classification
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.neural_network import MLPClassifier
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

import compiler

MESSAGE = "column 'x2', row 37: missing value \\(NaN\\), which this model does not accept"


@pytest.fixture(scope="module")
def data() -> tuple[np.ndarray, np.ndarray]:
    x, y = make_classification(200, 5, n_informative=3, n_redundant=0, random_state=0)
    return x.astype(np.float32), y


@pytest.fixture(scope="module")
def linear(data) -> object:
    return make_pipeline(StandardScaler(), LogisticRegression()).fit(*data)


def _compile(estimator, backend: str = "jax") -> compiler.CompiledModel:
    return compiler.compile(
        estimator, options=compiler.CompileOptions(backend=backend, max_batch=64, warmup=False)
    )


def _with_nan(x: np.ndarray) -> np.ndarray:
    x = np.repeat(x, 2, axis=0)[:300].copy()  # more rows than max_batch: chunked
    x[37, 2] = np.nan
    x[250, 0] = np.nan  # a later one: the first is named
    return x


@pytest.mark.parametrize("backend", ["jax", "interpreter"])
def test_linear_heads_find_a_nan_on_their_output_and_name_it(linear, data, backend) -> None:
    model = _compile(linear, backend)
    assert model.nan_checked_on_output == {"predict_proba", "decision_function"}
    bad = _with_nan(data[0])
    for method in ("predict_proba", "decision_function", "predict"):  # predict: argmax drops NaN
        with pytest.raises(compiler.SchemaError, match=MESSAGE):
            getattr(model, method)(bad)
    for form in (bad.astype(np.float64), bad.tolist()):  # converted inputs, the general path
        with pytest.raises(compiler.SchemaError, match=MESSAGE):
            model.predict_proba(form)
    with pytest.raises(compiler.SchemaError, match=MESSAGE):
        model.encode(bad)  # the server's encode phase still checks the input itself


def test_clean_rows_give_the_source_answer(linear, data) -> None:
    model = _compile(linear)
    x = data[0]
    np.testing.assert_allclose(model.predict_proba(x), linear.predict_proba(x), atol=1e-6)


def test_inf_minus_inf_inside_the_model_is_no_error_and_no_warning(linear, data) -> None:
    model = _compile(linear)
    x = data[0][:4].copy()
    sign = np.sign(linear[-1].coef_[0, :2])  # scaled, weighted and summed: inf - inf, NaN
    x[1, 0], x[1, 1] = sign[0] * np.inf, -sign[1] * np.inf
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = model.predict_proba(x)
    assert np.isnan(out[1]).all() and not np.isnan(out[[0, 2, 3]]).any()


def test_a_head_that_may_drop_a_nan_checks_the_input_first(data) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        mlp = make_pipeline(StandardScaler(), MLPClassifier((4,), max_iter=5, random_state=0))
        mlp.fit(*data)
    model = _compile(mlp)  # relu (a maximum) may turn NaN into 0 on some backend
    assert model.schema.rejects_nan and model.nan_checked_on_output == frozenset()
    with pytest.raises(compiler.SchemaError, match=MESSAGE):
        model.predict_proba(_with_nan(data[0]))
