"""Naive Bayes classifiers: a joint log-likelihood (B, n_classes), then argmax and softmax."""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.naive_bayes import BernoulliNB, CategoricalNB, ComplementNB, GaussianNB, MultinomialNB

import lazy as lz

from ..context import Context
from ..features import Features, Heads
from ..precision import Precision
from ..registry import register

_METHODS = ("predict", "predict_proba")
_PRECISION = Precision(
    "its probabilities are exp of differences of joint log-likelihoods summed over every "
    "feature, whose float32 rounding grows with the features' number and size"
)


def _heads(jll: lz.LazyTensor, classes: np.ndarray) -> Heads:
    """``predict`` (first argmax) and ``predict_proba`` (exp(jll - logsumexp(jll)))."""
    return Heads(
        {"predict": lz.argmax(jll, axis=1), "predict_proba": lz.softmax(jll, axis=1)},
        classes=classes,
    )


@register(GaussianNB, methods=_METHODS, precision=_PRECISION)
def gaussian_nb(est: Any, features: Features, ctx: Context) -> Heads:
    var = np.asarray(est.var_, dtype=np.float64)
    # (x - theta)^2 / var per class and feature, not the expanded quadratic: no cancellation
    diff = lz.expand_dims(features.values, 1) - ctx.param(est.theta_, "theta_")  # (B, C, F)
    z = diff * diff / ctx.param(var, "var_")
    bias = np.log(est.class_prior_) - 0.5 * np.log(2.0 * np.pi * var).sum(axis=1)
    jll = ctx.param(bias, "log_prior_norm") - 0.5 * lz.sum(z, axis=2)
    return _heads(jll, est.classes_)


def _linear_jll(x: lz.LazyTensor, weights: np.ndarray, bias: np.ndarray | None, ctx: Context):
    out = x @ ctx.param(np.asarray(weights).T, "feature_log_prob_T")
    return out if bias is None else out + ctx.param(bias, "class_bias")


@register(MultinomialNB, methods=_METHODS, precision=_PRECISION)
def multinomial_nb(est: Any, features: Features, ctx: Context) -> Heads:
    jll = _linear_jll(features.values, est.feature_log_prob_, est.class_log_prior_, ctx)
    return _heads(jll, est.classes_)


@register(ComplementNB, methods=_METHODS, precision=_PRECISION)
def complement_nb(est: Any, features: Features, ctx: Context) -> Heads:
    bias = est.class_log_prior_ if len(est.classes_) == 1 else None
    return _heads(_linear_jll(features.values, est.feature_log_prob_, bias, ctx), est.classes_)


@register(BernoulliNB, methods=_METHODS, limits="binarize threshold or None", precision=_PRECISION)
def bernoulli_nb(est: Any, features: Features, ctx: Context) -> Heads:
    x = features.values
    if est.binarize is not None:  # sklearn.preprocessing.binarize: 1 where x > threshold
        x = lz.cast(x > float(est.binarize), x.dtype)
    log_p = np.asarray(est.feature_log_prob_, dtype=np.float64)
    neg = np.log(1 - np.exp(log_p))
    jll = _linear_jll(x, log_p - neg, est.class_log_prior_ + neg.sum(axis=1), ctx)
    return _heads(jll, est.classes_)


@register(
    CategoricalNB,
    methods=_METHODS,
    limits="non-negative integer-valued categories seen in fit (or below min_categories); "
    "fractional values truncate like scikit-learn's int conversion; an unseen category "
    "contributes nothing, where scikit-learn raises IndexError",
    precision=_PRECISION,
)
def categorical_nb(est: Any, features: Features, ctx: Context) -> Heads:
    # one-hot of every feature's integer category, then one matmul against the stacked tables
    codes = lz.floor(features.values)  # int conversion of non-negative values truncates
    blocks, tables = [], []
    for i, n_cat in enumerate(est.n_categories_):
        levels = ctx.const(np.arange(int(n_cat), dtype=np.float64))
        blocks.append(lz.cast(codes[:, i : i + 1] == levels, codes.dtype))
        tables.append(np.asarray(est.feature_log_prob_[i]).T)  # (n_cat, n_classes)
    onehot = lz.concat(blocks, axis=1)
    jll = onehot @ ctx.param(np.concatenate(tables), "feature_log_prob_") + ctx.param(
        est.class_log_prior_, "class_log_prior_"
    )
    return _heads(jll, est.classes_)
