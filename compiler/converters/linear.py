"""Linear models: regressors, GLMs, and classifiers with their decision and probability heads."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
from sklearn.linear_model import (
    ARDRegression,
    BayesianRidge,
    ElasticNet,
    ElasticNetCV,
    GammaRegressor,
    HuberRegressor,
    Lars,
    LarsCV,
    Lasso,
    LassoCV,
    LassoLars,
    LassoLarsCV,
    LassoLarsIC,
    LinearRegression,
    LogisticRegression,
    LogisticRegressionCV,
    MultiTaskElasticNet,
    MultiTaskElasticNetCV,
    MultiTaskLasso,
    MultiTaskLassoCV,
    OrthogonalMatchingPursuit,
    OrthogonalMatchingPursuitCV,
    PassiveAggressiveClassifier,
    PassiveAggressiveRegressor,
    Perceptron,
    PoissonRegressor,
    QuantileRegressor,
    Ridge,
    RidgeClassifier,
    RidgeClassifierCV,
    RidgeCV,
    SGDClassifier,
    SGDOneClassSVM,
    SGDRegressor,
    TheilSenRegressor,
    TweedieRegressor,
)
from sklearn.svm import LinearSVC, LinearSVR

import lazy as lz

from ..blocks import affine, binary_proba, decision_heads
from ..context import Context
from ..errors import UnsupportedError
from ..explain import additive
from ..features import Features, Heads
from ..registry import register


@register(
    LinearRegression,
    Ridge,
    RidgeCV,
    Lasso,
    LassoCV,
    ElasticNet,
    ElasticNetCV,
    MultiTaskLasso,
    MultiTaskLassoCV,
    MultiTaskElasticNet,
    MultiTaskElasticNetCV,
    Lars,
    LarsCV,
    LassoLars,
    LassoLarsCV,
    LassoLarsIC,
    OrthogonalMatchingPursuit,
    OrthogonalMatchingPursuitCV,
    BayesianRidge,
    ARDRegression,
    HuberRegressor,
    QuantileRegressor,
    TheilSenRegressor,
    SGDRegressor,
    PassiveAggressiveRegressor,
    LinearSVR,
    methods=("predict",),
    limits="predict (BayesianRidge / ARDRegression: the mean, without return_std)",
)
def linear_regressor(est: Any, features: Features, ctx: Context) -> Heads:
    heads = Heads({"predict": affine(features.values, est.coef_, est.intercept_, ctx)})
    return explained(heads, features, est.coef_, est.intercept_, ctx)


def explained(heads: Heads, features: Features, coef: Any, intercept: Any, ctx: Context) -> Heads:
    """``heads`` with, where the options ask for explanations, the raw outputs ``features @
    coef.T + intercept`` explained as an additive model (:func:`~compiler.explain.additive`)."""
    if not ctx.options.explain:
        return heads
    explanation = additive(
        features.values,
        coef,
        intercept,
        ctx.path,
        lambda value, name: ctx.param(value, name, dtype="float64"),
        features.means,
    )
    ctx.note(
        "contributions: against the sample's rows"
        if explanation.background
        else "contributions: against the training rows (the means its scalers record)"
    )
    return replace(heads, extra={**heads.extra, "explanation": explanation})


@register(
    TweedieRegressor,
    PoissonRegressor,
    GammaRegressor,
    methods=("predict",),
    limits="identity and log links",
)
def glm_regressor(est: Any, features: Features, ctx: Context) -> Heads:
    raw = affine(features.values, est.coef_, est.intercept_, ctx)
    link = type(est._base_loss.link).__name__  # what GLM.predict inverts
    if link == "IdentityLink":
        heads = Heads({"predict": raw})
    elif link == "LogLink":
        heads = Heads({"predict": lz.exp(raw)})
    else:
        raise UnsupportedError(f"{type(est).__name__} with a {link} is not supported")
    # The linear predictor is explained (the log of the mean, under a log link), as shap does.
    return explained(heads, features, est.coef_, est.intercept_, ctx)


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
    heads = decision_heads(decision, est.classes_, predict_proba=proba)
    return explained(heads, features, est.coef_, est.intercept_, ctx)


def _linear_decision(est: Any, features: Features, ctx: Context) -> lz.LazyTensor:
    """``decision_function`` of a LinearClassifierMixin: (B,) when binary, else (B, n_classes)."""
    decision = affine(features.values, est.coef_, est.intercept_, ctx)
    if decision.ndim == 2 and decision.shape[1] == 1:
        decision = lz.reshape(decision, (lz.B,))
    return decision


@register(
    Perceptron,
    PassiveAggressiveClassifier,
    LinearSVC,
    RidgeClassifier,
    RidgeClassifierCV,
    methods=("predict", "decision_function"),
    limits="single-label targets (RidgeClassifier: not multilabel)",
)
def linear_classifier(est: Any, features: Features, ctx: Context) -> Heads:
    binarizer = getattr(est, "_label_binarizer", None)
    if binarizer is not None and str(binarizer.y_type_).startswith("multilabel"):
        raise UnsupportedError(
            f"{type(est).__name__} fitted on multilabel targets is not supported; "
            "supported: binary and multiclass targets"
        )
    heads = decision_heads(_linear_decision(est, features, ctx), est.classes_)
    return explained(heads, features, est.coef_, est.intercept_, ctx)


@register(
    SGDClassifier,
    methods=("predict", "predict_proba", "decision_function"),
    limits="every loss; predict_proba for loss='log_loss' (one-vs-rest normalised sigmoid) "
    "and 'modified_huber', as scikit-learn computes them",
)
def sgd_classifier(est: Any, features: Features, ctx: Context) -> Heads:
    decision = _linear_decision(est, features, ctx)
    extra = {}
    if est.loss == "log_loss":
        extra["predict_proba"] = _ovr_normalised(lz.sigmoid(decision))
    elif est.loss == "modified_huber":
        extra["predict_proba"] = _modified_huber_proba(decision)
    heads = decision_heads(decision, est.classes_, **extra)
    return explained(heads, features, est.coef_, est.intercept_, ctx)


def _ovr_normalised(prob: lz.LazyTensor) -> lz.LazyTensor:
    """``LinearClassifierMixin._predict_proba_lr`` after the sigmoid."""
    if prob.ndim == 1:
        return binary_proba(prob)
    return prob / lz.sum(prob, axis=1, keepdims=True)


def _modified_huber_proba(decision: lz.LazyTensor) -> lz.LazyTensor:
    prob = (lz.minimum(lz.maximum(decision, -1.0), 1.0) + 1.0) / 2.0
    if prob.ndim == 1:
        return binary_proba(prob)
    total = lz.sum(prob, axis=1, keepdims=True)
    # every class clipped to zero: scikit-learn answers uniform probabilities
    return lz.where(total == 0.0, 1.0 / prob.shape[1], prob / total)


@register(
    SGDOneClassSVM,
    methods=("predict", "decision_function", "score_samples"),
    limits="dense input",
)
def sgd_one_class_svm(est: Any, features: Features, ctx: Context) -> Heads:
    score = affine(features.values, np.ravel(est.coef_), 0.0, ctx)
    decision = score - ctx.param(np.ravel(est.offset_), "offset_")[0]
    predict = lz.where(decision >= 0.0, lz.const(np.int32(1)), lz.const(np.int32(-1)))
    heads = Heads({"predict": predict, "decision_function": decision, "score_samples": score})
    return explained(heads, features, np.ravel(est.coef_), 0.0, ctx)
