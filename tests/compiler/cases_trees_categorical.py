"""Conformance cases: HistGradientBoosting with native categorical features."""

from __future__ import annotations

import numpy as np
import pandas as pd
from cases_preprocessing import _mixed
from conformance_lib import Case
from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor


def _categories() -> pd.DataFrame:
    """String categories (with NaN and a rare one), a pandas category column and numbers."""
    frame = _mixed()
    many = np.array([f"c{i}" for i in range(12)], dtype=object)
    frame["shop"] = pd.Categorical(many[(np.abs(frame["b"].fillna(0)) * 7).astype(int) % 12])
    return frame


def _numbers_and_category() -> pd.DataFrame:
    """Only the pandas category column is categorical by dtype; the rest are numbers."""
    return _categories()[["a", "b", "c", "n", "shop"]]


_CATEGORICAL = ["color", "size", "shop"]

CASES = {
    HistGradientBoostingClassifier: [
        Case(
            "hgb-clf-categorical",
            lambda: HistGradientBoostingClassifier(
                max_iter=8, max_depth=4, categorical_features=_CATEGORICAL, random_state=0
            ),
            sample=_categories,
            nan=True,
        ),
        Case(
            "hgb-clf-categorical-multiclass",
            lambda: HistGradientBoostingClassifier(
                max_iter=4, max_leaf_nodes=8, categorical_features="from_dtype", random_state=0
            ),
            data="multiclass",
            sample=_numbers_and_category,
            nan=True,
        ),
    ],
    HistGradientBoostingRegressor: [
        Case(
            "hgb-reg-categorical",
            lambda: HistGradientBoostingRegressor(
                max_iter=8, categorical_features=[3, 4, 5, 6], random_state=0
            ),
            data="regression",
            sample=_categories,
            nan=True,
        ),
    ],
}

UNSUPPORTED: dict = {}
