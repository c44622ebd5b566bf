"""Linear models: regressors, and classifiers with their decision and probability heads."""

from __future__ import annotations

from typing import Any

from sklearn.linear_model import (
    ElasticNet,
    Lasso,
    LinearRegression,
    LogisticRegression,
    LogisticRegressionCV,
    Ridge,
)

import lazy as lz

from ..blocks import affine, binary_proba, decision_heads
from ..context import Context
from ..features import Features, Heads
from ..registry import register


@register(LinearRegression, Ridge, Lasso, ElasticNet, methods=("predict",))
def linear_regressor(est: Any, features: Features, ctx: Context) -> Heads:
    return Heads({"predict": affine(features.values, est.coef_, est.intercept_, ctx)})


@register(
    LogisticRegression,
    LogisticRegressionCV,
    methods=("predict", "predict_proba", "decision_function"),
    limits="binary: sigmoid; multiclass: softmax",
)
def logistic_regression(est: Any, features: Features, ctx: Context) -> Heads:
    decision = affine(features.values, est.coef_, est.intercept_, ctx)
    if len(est.classes_) <= 2:
        decision = lz.reshape(decision, (lz.B,)) if decision.ndim == 2 else decision
        proba = binary_proba(lz.sigmoid(decision))
    else:
        proba = lz.softmax(decision, axis=1)
    return decision_heads(decision, est.classes_, predict_proba=proba)
