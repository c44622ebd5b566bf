"""Multi-layer perceptrons: scikit-learn's ``_forward_pass_fast`` as matmuls and activations."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sklearn.neural_network import MLPClassifier, MLPRegressor

import lazy as lz

from ..blocks import binary_proba
from ..context import Context
from ..errors import UnsupportedError
from ..features import Features, Heads
from ..registry import register, unsupported_param

_ACTIVATIONS: dict[str, Callable[[lz.LazyTensor], lz.LazyTensor]] = {
    "identity": lambda x: x,
    "logistic": lz.sigmoid,
    "tanh": lz.tanh,
    "relu": lambda x: lz.maximum(x, 0.0),
    "softmax": lambda x: lz.softmax(x, axis=1),
}


def _activation(est: Any, name: str, attribute: str) -> Callable[[lz.LazyTensor], lz.LazyTensor]:
    if name not in _ACTIVATIONS:
        raise unsupported_param(est, attribute, name, ", ".join(sorted(_ACTIVATIONS)))
    return _ACTIVATIONS[name]


def forward(est: Any, x: lz.LazyTensor, ctx: Context) -> lz.LazyTensor:
    """The output layer's activation (B, n_outputs), layer by layer as sklearn computes it."""
    hidden = _activation(est, est.activation, "activation")
    output = _activation(est, est.out_activation_, "out_activation_")
    last = len(est.coefs_) - 1
    for i, (w, b) in enumerate(zip(est.coefs_, est.intercepts_, strict=True)):
        x = x @ ctx.param(w, f"coefs_[{i}]") + ctx.param(b, f"intercepts_[{i}]")
        x = output(x) if i == last else hidden(x)
    return x


@register(
    MLPClassifier,
    methods=("predict", "predict_proba"),
    limits="binary and multiclass targets (not multilabel); every activation",
)
def mlp_classifier(est: Any, features: Features, ctx: Context) -> Heads:
    if est._label_binarizer.y_type_ not in ("binary", "multiclass"):
        raise UnsupportedError(
            f"MLPClassifier fitted on {est._label_binarizer.y_type_} targets is not supported; "
            "supported: binary and multiclass"
        )
    out = forward(est, features.values, ctx)
    if est.n_outputs_ == 1:
        positive = lz.reshape(out, (lz.B,))
        # LabelBinarizer.inverse_transform thresholds at (pos_label + neg_label) / 2
        return Heads(
            {"predict": lz.cast(positive > 0.5, "int32"), "predict_proba": binary_proba(positive)},
            classes=est.classes_,
        )
    return Heads({"predict": lz.argmax(out, axis=1), "predict_proba": out}, classes=est.classes_)


@register(MLPRegressor, methods=("predict",), limits="every activation; multi-output")
def mlp_regressor(est: Any, features: Features, ctx: Context) -> Heads:
    out = forward(est, features.values, ctx)
    return Heads({"predict": lz.reshape(out, (lz.B,)) if out.shape[1] == 1 else out})
