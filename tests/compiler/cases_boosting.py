"""Conformance cases: LightGBM and XGBoost (scikit-learn wrappers and Boosters)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import lightgbm
import numpy as np
import pandas as pd
import xgboost
from conformance_lib import Case, Data, Unsupported, dataset


@dataclass(frozen=True, eq=False)
class BoostingCase(Case):
    """A case whose ``fit`` takes keyword arguments (categorical features, query groups), and
    that may compile the fitted wrapper's Booster (``booster``) instead of the wrapper."""

    fit_params: dict[str, Any] = field(default_factory=dict)
    booster: Callable[[Any], Any] | None = None

    def fitted(self) -> tuple[Any, Any, Data]:
        data = self.data() if callable(self.data) else dataset(self.data)
        table = self.sample() if self.sample else data.x
        est = self.make()
        est.fit(table, data.y, **self.fit_params)
        return (self.booster(est) if self.booster else est), table, data


def _with_missing(kind: str) -> Data:
    """NaN in the training data (missing-value directions learned both ways)."""
    data = dataset(kind)
    x = data.x.copy()
    x[np.random.default_rng(3).random(x.shape) < 0.1] = np.nan
    return Data(x, data.y)


def _binary() -> Data:
    return _with_missing("binary")


def _multiclass() -> Data:
    return _with_missing("multiclass")


def _regression() -> Data:
    return _with_missing("regression")


def _zeros() -> Data:
    """Exact zeros and NaN (LightGBM's zero_as_missing, use_missing=False)."""
    data = _regression()
    x = data.x.copy()
    x[np.random.default_rng(4).random(x.shape) < 0.15] = 0.0
    return Data(x, data.y)


def _categorical(kind: str) -> Data:
    """Column 7 holds integer category codes 0..9 (and NaN); the target depends on a set of them."""
    data = _with_missing(kind)
    x = data.x.copy()
    rng = np.random.default_rng(5)
    codes = rng.integers(0, 10, len(x)).astype(np.float64)
    codes[rng.random(len(x)) < 0.1] = np.nan
    x[:, 7] = codes
    hit = np.isin(codes, [1, 4, 7, 8])
    if kind == "regression":
        return Data(x, data.y + 6.0 * hit)
    labels = np.unique(data.y)
    return Data(x, np.where(hit, labels[-1], data.y))


def _categorical_binary() -> Data:
    return _categorical("binary")


def _categorical_regression() -> Data:
    return _categorical("regression")


@cache
def _categorical_frame(kind: str) -> tuple[pd.DataFrame, np.ndarray]:
    """Five numeric columns with NaN and three pandas category columns: strings in a non-sorted
    category order with missing values, integers (0, 3, …, 33), and three sizes (few enough
    for XGBoost's one-hot splits). The target depends on sets of categories of each."""
    data = _with_missing(kind)
    rng = np.random.default_rng(6)
    n = len(data.x)
    frame = pd.DataFrame(data.x[:, :5], columns=[f"n{i}" for i in range(5)])
    colors = np.array(["red", "green", "blue", "amber", "teal", "plum", "gold", "jade"], object)
    color = colors[rng.integers(0, len(colors), n)]
    color[rng.random(n) < 0.1] = None
    frame["color"] = pd.Categorical(color, categories=colors)
    frame["shop"] = pd.Categorical(rng.integers(0, 12, n) * 3)
    frame["size"] = pd.Categorical(rng.choice(["S", "M", "L"], n))
    hit = frame["color"].isin(["red", "teal", "gold"]).to_numpy()
    bonus = frame["shop"].isin([3, 12, 27]).to_numpy() | (frame["size"] == "L").to_numpy()
    if kind == "regression":
        return frame, data.y + 6.0 * hit + 3.0 * bonus
    labels = np.unique(data.y, return_inverse=True)[1]  # XGBClassifier: labels 0..n-1
    return frame, np.where(hit, labels.max(), np.where(bonus, 0, labels))


def _frame_table(kind: str) -> Callable[[], pd.DataFrame]:
    return lambda: _categorical_frame(kind)[0]


def _frame_data(kind: str) -> Callable[[], Data]:
    """The frame's target (``x``: its numeric columns; the cases fit on the frame itself)."""

    def data() -> Data:
        frame, y = _categorical_frame(kind)
        return Data(frame.iloc[:, :5].to_numpy(), y)

    return data


def _int_labels(make: Callable[[], Data]) -> Callable[[], Data]:
    """XGBClassifier only accepts labels 0..n-1."""

    def data() -> Data:
        d = make()
        return Data(d.x, np.unique(d.y, return_inverse=True)[1])

    return data


def _relevance() -> Data:
    """Ranking: relevance grades 0..3 in queries of 20 consecutive rows."""
    data = _regression()
    return Data(data.x, np.digitize(data.y, [-3.0, 0.0, 3.0]))


_GROUPS = [20] * 12
_QID = np.repeat(np.arange(12), 20)


def _positive_target() -> Data:
    data = _regression()
    return Data(data.x, np.exp(data.y / 10))


def _lgbm(cls: type, **params: Any) -> Callable[[], Any]:
    base = {"n_estimators": 6, "num_leaves": 6, "min_child_samples": 5, "verbose": -1}
    return lambda: cls(**{**base, **params})


def _xgb(cls: type, **params: Any) -> Callable[[], Any]:
    base = {"n_estimators": 6, "max_depth": 3, "n_jobs": 1}
    return lambda: cls(**{**base, **params})


_CATEGORICAL = {"min_data_per_group": 5, "cat_smooth": 1.0, "cat_l2": 1.0}

CASES = {
    lightgbm.LGBMClassifier: [
        Case("lgbm-clf-binary", _lgbm(lightgbm.LGBMClassifier), data=_binary, nan=True),
        Case(
            "lgbm-clf-multiclass",
            _lgbm(lightgbm.LGBMClassifier, n_estimators=3),
            data=_multiclass,
            nan=True,
        ),
        Case(
            "lgbm-clf-ova",
            _lgbm(lightgbm.LGBMClassifier, n_estimators=3, objective="multiclassova"),
            data=_multiclass,
            nan=True,
        ),
        BoostingCase(
            "lgbm-clf-categorical",
            _lgbm(lightgbm.LGBMClassifier, **_CATEGORICAL),
            data=_categorical_binary,
            nan=True,
            fit_params={"categorical_feature": [7]},
        ),
    ],
    lightgbm.LGBMRegressor: [
        Case("lgbm-reg", _lgbm(lightgbm.LGBMRegressor), data=_regression, nan=True),
        Case(
            "lgbm-reg-zero-as-missing",
            _lgbm(lightgbm.LGBMRegressor, zero_as_missing=True),
            data=_zeros,
            nan=True,
        ),
        Case(
            "lgbm-reg-no-missing",
            _lgbm(lightgbm.LGBMRegressor, use_missing=False),
            data=_zeros,
            nan=True,
        ),
        BoostingCase(
            "lgbm-reg-categorical",
            _lgbm(lightgbm.LGBMRegressor, **_CATEGORICAL, max_cat_to_onehot=2),
            data=_categorical_regression,
            nan=True,
            fit_params={"categorical_feature": [7]},
        ),
        Case(
            "lgbm-reg-rf",
            _lgbm(lightgbm.LGBMRegressor, boosting_type="rf", subsample=0.7, subsample_freq=1),
            data=_regression,
            nan=True,
        ),
    ],
    lightgbm.LGBMRanker: [
        BoostingCase(
            "lgbm-ranker",
            _lgbm(lightgbm.LGBMRanker),
            data=_relevance,
            nan=True,
            fit_params={"group": _GROUPS},
        ),
    ],
    lightgbm.Booster: [
        BoostingCase(
            "lgbm-booster-binary-categorical",
            _lgbm(lightgbm.LGBMClassifier, **_CATEGORICAL),
            data=_categorical_binary,
            nan=True,
            fit_params={"categorical_feature": [7]},
            booster=lambda est: est.booster_,
        ),
    ],
    xgboost.XGBClassifier: [
        Case("xgb-clf-binary", _xgb(xgboost.XGBClassifier), data=_int_labels(_binary), nan=True),
        Case(
            "xgb-clf-multiclass",
            _xgb(xgboost.XGBClassifier, n_estimators=5),
            data=_int_labels(_multiclass),
            nan=True,
        ),
        Case(
            "xgb-clf-logitraw",
            _xgb(xgboost.XGBClassifier, objective="binary:logitraw"),
            data=_int_labels(_binary),
            nan=True,
        ),
        Case(
            "xgb-clf-categorical",
            _xgb(xgboost.XGBClassifier, enable_categorical=True, max_cat_to_onehot=1),
            data=_frame_data("binary"),
            sample=_frame_table("binary"),
            nan=True,
        ),
    ],
    xgboost.XGBRegressor: [
        Case("xgb-reg", _xgb(xgboost.XGBRegressor), data=_regression, nan=True),
        Case(
            "xgb-reg-poisson",
            _xgb(xgboost.XGBRegressor, objective="count:poisson"),
            data=_positive_target,
            nan=True,
        ),
        Case(
            "xgb-reg-gamma-deep",
            _xgb(xgboost.XGBRegressor, objective="reg:gamma", max_depth=5, n_estimators=2),
            data=_positive_target,
            nan=True,
        ),
        Case(  # the default max_cat_to_onehot (4): one-hot splits on size, partitions on others
            "xgb-reg-categorical-onehot",
            _xgb(xgboost.XGBRegressor, enable_categorical=True, max_depth=4),
            data=_frame_data("regression"),
            sample=_frame_table("regression"),
            nan=True,
        ),
    ],
    xgboost.XGBRanker: [
        BoostingCase(
            "xgb-ranker",
            _xgb(xgboost.XGBRanker),
            data=_relevance,
            nan=True,
            fit_params={"qid": _QID},
        ),
    ],
    xgboost.Booster: [
        BoostingCase(
            "xgb-booster-multiclass",
            _xgb(xgboost.XGBClassifier, n_estimators=4),
            data=_int_labels(_multiclass),
            nan=True,
            booster=lambda est: est.get_booster(),
            # Booster.predict takes a DMatrix (missing values: NaN).
            extra={"source": lambda est, method: lambda x: est.predict(xgboost.DMatrix(x))},
        ),
        BoostingCase(
            "xgb-booster-multiclass-categorical",
            _xgb(xgboost.XGBClassifier, n_estimators=3, enable_categorical=True),
            data=_frame_data("multiclass"),
            sample=_frame_table("multiclass"),
            nan=True,
            booster=lambda est: est.get_booster(),
            extra={
                "source": lambda est, method: (
                    lambda x: est.predict(xgboost.DMatrix(x, enable_categorical=True))
                )
            },
        ),
    ],
}

_RANKER_FIT = "its fit needs query groups, which an Unsupported spec cannot pass"
_BOOSTER = (
    "none: a Booster is not built by fit(X, y); its rejections (linear trees, LightGBM pandas "
    "categorical columns, objectives) share the wrappers' parser and are unit-tested in "
    "tests/compiler/converters/test_boosting.py"
)

UNSUPPORTED = {
    lightgbm.LGBMClassifier: Unsupported(
        _lgbm(lightgbm.LGBMClassifier, n_estimators=2, linear_tree=True),
        data="binary",
        match="linear trees",
    ),
    lightgbm.LGBMRegressor: Unsupported(
        _lgbm(lightgbm.LGBMRegressor, n_estimators=2, objective="cross_entropy_lambda"),
        data=lambda: Data(dataset("regression").x, np.linspace(0, 1, 240)),
        match="cross_entropy_lambda",
    ),
    lightgbm.LGBMRanker: f"none: {_RANKER_FIT}; it shares LGBMRegressor's converter",
    lightgbm.Booster: _BOOSTER,
    xgboost.XGBClassifier: Unsupported(
        _xgb(xgboost.XGBClassifier, n_estimators=2, booster="gblinear"),
        data=_int_labels(lambda: dataset("binary")),
        match="gblinear",
    ),
    xgboost.XGBRegressor: Unsupported(
        _xgb(xgboost.XGBRegressor, n_estimators=2, missing=0.0),
        data="regression",
        match="missing",
    ),
    xgboost.XGBRanker: f"none: {_RANKER_FIT}; it shares XGBRegressor's converter",
    xgboost.Booster: _BOOSTER,
}
