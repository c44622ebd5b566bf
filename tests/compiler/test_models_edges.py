"""Edge cases of the model converters the conformance data sets do not reach."""

from __future__ import annotations

import numpy as np
from conformance_lib import dataset
from sklearn.linear_model import SGDClassifier
from sklearn.naive_bayes import CategoricalNB

import compiler

_REFERENCE = compiler.CompileOptions(backend="interpreter", dtype="float64")


def test_sgd_modified_huber_all_clipped_rows_are_uniform() -> None:
    d = dataset("multiclass")
    est = SGDClassifier(loss="modified_huber", max_iter=5, tol=None, random_state=0)
    est.fit(d.x, d.y)
    est.coef_ = np.zeros_like(est.coef_)  # every score is the intercept: -2 clips to 0
    est.intercept_ = np.array([-2.0, -2.0, 0.5])
    rows = d.x[:5]
    expected = est.predict_proba(rows)
    got = compiler.compile(est, options=_REFERENCE).predict_proba(rows)
    np.testing.assert_allclose(got, expected)
    est.intercept_ = np.array([-2.0, -2.0, -3.0])
    np.testing.assert_allclose(
        compiler.compile(est, options=_REFERENCE).predict_proba(rows), np.full((5, 3), 1 / 3)
    )
    np.testing.assert_allclose(est.predict_proba(rows), np.full((5, 3), 1 / 3))


def test_categorical_nb_truncates_fractional_categories_like_int_conversion() -> None:
    d = dataset("positive")
    est = CategoricalNB().fit(d.x, d.y)
    rows = d.x[:20] + 0.7
    rows = np.minimum(rows, est.n_categories_ - 1)  # stay within the fitted categories
    model = compiler.compile(est, options=_REFERENCE)
    np.testing.assert_allclose(model.predict_proba(rows), est.predict_proba(rows), rtol=1e-12)
