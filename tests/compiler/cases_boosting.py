"""Conformance cases: LightGBM and XGBoost (scikit-learn wrappers and Boosters)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import lightgbm
import numpy as np
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
        est = self.make()
        est.fit(data.x, data.y, **self.fit_params)
        return (self.booster(est) if self.booster else est), data.x, data


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
    ],
}

_RANKER_FIT = "its fit needs query groups, which an Unsupported spec cannot pass"
_BOOSTER = (
    "none: a Booster is not built by fit(X, y); its rejections (linear trees, categorical "
    "splits, objectives) share the wrappers' parser and are unit-tested in "
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
