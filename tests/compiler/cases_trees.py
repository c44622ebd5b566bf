"""Conformance cases: decision trees, forests, gradient boosting, isolation forests."""

from __future__ import annotations

import numpy as np
from conformance_lib import Case, Data, Unsupported, dataset
from sklearn.ensemble import (
    ExtraTreesClassifier,
    ExtraTreesRegressor,
    GradientBoostingClassifier,
    GradientBoostingRegressor,
    HistGradientBoostingClassifier,
    HistGradientBoostingRegressor,
    IsolationForest,
    RandomForestClassifier,
    RandomForestRegressor,
)
from sklearn.linear_model import LinearRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.tree import (
    DecisionTreeClassifier,
    DecisionTreeRegressor,
    ExtraTreeClassifier,
    ExtraTreeRegressor,
)


def _with_missing(kind: str) -> Data:
    """A data set with NaN in the training data: fitted missing-value directions both ways."""
    data = dataset(kind)
    x = data.x.copy()
    rng = np.random.default_rng(3)
    x[rng.random(x.shape) < 0.1] = np.nan
    return Data(x, data.y)


def _binary_missing() -> Data:
    return _with_missing("binary")


def _regression_missing() -> Data:
    return _with_missing("regression")


def _positive_target() -> Data:
    data = dataset("regression")
    return Data(data.x, np.exp(data.y / 10))


def _two_outputs() -> Data:
    data = dataset("multiclass")
    return Data(data.x, np.stack([data.y, data.y[::-1]], axis=1))


CASES = {
    DecisionTreeClassifier: [
        Case("tree-clf-d4", lambda: DecisionTreeClassifier(max_depth=4, random_state=0), nan=True),
        Case(
            "tree-clf-unlimited-multiclass",
            lambda: DecisionTreeClassifier(random_state=0),
            data="multiclass",
            nan=True,
        ),
        Case(
            "tree-clf-missing",
            lambda: DecisionTreeClassifier(max_depth=5, random_state=0),
            data=_binary_missing,
            nan=True,
        ),
    ],
    DecisionTreeRegressor: [
        Case(
            "tree-reg-d5",
            lambda: DecisionTreeRegressor(max_depth=5, random_state=0),
            data="regression",
            nan=True,
        ),
    ],
    ExtraTreeClassifier: [
        Case(
            "extra-tree-clf",
            lambda: ExtraTreeClassifier(max_depth=6, random_state=0),
            data="multiclass",
            nan=True,
        )
    ],
    ExtraTreeRegressor: [
        Case(
            "extra-tree-reg",
            lambda: ExtraTreeRegressor(max_depth=6, random_state=0),
            data="regression",
            nan=True,
        )
    ],
    RandomForestClassifier: [
        Case(
            "forest-clf-d6",
            lambda: RandomForestClassifier(n_estimators=10, max_depth=6, random_state=0),
            nan=True,
        ),
        Case(
            "forest-clf-multiclass-d3",
            lambda: RandomForestClassifier(n_estimators=5, max_depth=3, random_state=0),
            data="multiclass",
            nan=True,
        ),
        Case(
            "forest-clf-unlimited",
            lambda: RandomForestClassifier(n_estimators=4, random_state=0),
            data="multiclass",
            nan=True,
        ),
    ],
    RandomForestRegressor: [
        Case(
            "forest-reg-d6",
            lambda: RandomForestRegressor(n_estimators=8, max_depth=6, random_state=0),
            data="regression",
            nan=True,
        ),
        Case(
            "forest-reg-multioutput",
            lambda: RandomForestRegressor(n_estimators=5, max_depth=4, random_state=0),
            data="multioutput",
            nan=True,
        ),
    ],
    ExtraTreesClassifier: [
        Case(
            "extra-trees-clf",
            lambda: ExtraTreesClassifier(n_estimators=6, max_depth=5, random_state=0),
            data="multiclass",
            nan=True,
        )
    ],
    ExtraTreesRegressor: [
        Case(
            "extra-trees-reg",
            lambda: ExtraTreesRegressor(n_estimators=6, max_depth=5, random_state=0),
            data="regression",
            nan=True,
        )
    ],
    GradientBoostingClassifier: [
        Case(
            "gb-clf-binary",
            lambda: GradientBoostingClassifier(n_estimators=10, max_depth=3, random_state=0),
        ),
        Case(
            "gb-clf-multiclass",
            lambda: GradientBoostingClassifier(
                n_estimators=5, max_depth=4, learning_rate=0.3, random_state=0
            ),
            data="multiclass",
        ),
        Case(
            "gb-clf-exponential",
            lambda: GradientBoostingClassifier(
                loss="exponential", n_estimators=8, max_depth=2, random_state=0
            ),
        ),
        Case(
            "gb-clf-zero-init",
            lambda: GradientBoostingClassifier(n_estimators=6, init="zero", random_state=0),
        ),
    ],
    GradientBoostingRegressor: [
        Case(
            "gb-reg",
            lambda: GradientBoostingRegressor(n_estimators=10, max_depth=3, random_state=0),
            data="regression",
        ),
        Case(
            "gb-reg-huber-subsample",
            lambda: GradientBoostingRegressor(
                loss="huber", n_estimators=8, max_depth=5, subsample=0.7, random_state=0
            ),
            data="regression",
        ),
    ],
    HistGradientBoostingClassifier: [
        Case(
            "hgb-clf-binary",
            lambda: HistGradientBoostingClassifier(max_iter=10, max_depth=4, random_state=0),
            data=_binary_missing,
            nan=True,
        ),
        Case(
            "hgb-clf-multiclass",
            lambda: HistGradientBoostingClassifier(max_iter=5, max_leaf_nodes=8, random_state=0),
            data="multiclass",
            nan=True,
        ),
    ],
    HistGradientBoostingRegressor: [
        Case(
            "hgb-reg",
            lambda: HistGradientBoostingRegressor(max_iter=10, random_state=0),
            data=_regression_missing,
            nan=True,
        ),
        Case(
            "hgb-reg-poisson",
            lambda: HistGradientBoostingRegressor(loss="poisson", max_iter=8, random_state=0),
            data=_positive_target,
            nan=True,
        ),
    ],
    IsolationForest: [
        Case(
            "isolation-forest",
            lambda: IsolationForest(n_estimators=10, random_state=0),
            data=lambda: Data(dataset("binary").x, None),
            nan=True,
        ),
        Case(
            "isolation-forest-subsets",
            lambda: IsolationForest(
                n_estimators=6, max_features=0.5, max_samples=64, random_state=0
            ),
            data=lambda: Data(dataset("regression").x, None),
            nan=True,
        ),
    ],
}

_MULTI_OUTPUT = "multi-output classification"
_NO_PARAMS = "none: every hyper-parameter only affects fitting"
UNSUPPORTED = {
    DecisionTreeClassifier: Unsupported(
        lambda: DecisionTreeClassifier(max_depth=2), data=_two_outputs, match=_MULTI_OUTPUT
    ),
    ExtraTreeClassifier: Unsupported(
        lambda: ExtraTreeClassifier(max_depth=2), data=_two_outputs, match=_MULTI_OUTPUT
    ),
    RandomForestClassifier: Unsupported(
        lambda: RandomForestClassifier(n_estimators=2, max_depth=2),
        data=_two_outputs,
        match=_MULTI_OUTPUT,
    ),
    ExtraTreesClassifier: Unsupported(
        lambda: ExtraTreesClassifier(n_estimators=2, max_depth=2),
        data=_two_outputs,
        match=_MULTI_OUTPUT,
    ),
    DecisionTreeRegressor: _NO_PARAMS,
    ExtraTreeRegressor: _NO_PARAMS,
    RandomForestRegressor: _NO_PARAMS,
    ExtraTreesRegressor: _NO_PARAMS,
    IsolationForest: _NO_PARAMS,
    GradientBoostingRegressor: Unsupported(
        lambda: GradientBoostingRegressor(n_estimators=2, init=LinearRegression()),
        data="regression",
        match="init",
    ),
    GradientBoostingClassifier: Unsupported(
        lambda: GradientBoostingClassifier(
            n_estimators=2, init=DecisionTreeClassifier(max_depth=1)
        ),
        match="init",
    ),
    # categorical features are coded on the host, so they must be raw input columns
    HistGradientBoostingClassifier: Unsupported(
        lambda: make_pipeline(
            StandardScaler(), HistGradientBoostingClassifier(max_iter=2, categorical_features=[0])
        ),
        match="computed by an earlier step",
    ),
    HistGradientBoostingRegressor: Unsupported(
        lambda: make_pipeline(
            StandardScaler(), HistGradientBoostingRegressor(max_iter=2, categorical_features=[0])
        ),
        data="regression",
        match="computed by an earlier step",
    ),
}
