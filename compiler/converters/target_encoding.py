"""TargetEncoder: ``transform`` (not ``fit_transform``'s cross-fitting) looks each category's
fitted encoding up by host-made codes; unknown categories get the target mean."""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.preprocessing import TargetEncoder

import lazy as lz

from ..context import Context
from ..features import Features, Heads
from ..registry import register
from .encoders import _codes


@register(
    TargetEncoder,
    methods=("transform",),
    limits="binary, multiclass and continuous targets; unknown categories encode as the target "
    "mean; raw input columns (or after a SimpleImputer)",
)
def target_encoder(est: Any, features: Features, ctx: Context) -> Heads:
    codes = _codes(est, features, ctx, unknown_is_error=False)  # unknown: len(categories_[j])
    n_classes = len(est.classes_) if est.target_type_ == "multiclass" else 1
    means = np.asarray(est.target_mean_, np.float64).reshape(n_classes)
    parts = []
    for j, code in enumerate(codes):
        # encodings_ holds, per feature, one array per class (class-minor); rows: codes
        encodings = est.encodings_[j * n_classes : (j + 1) * n_classes]
        table = np.vstack([np.column_stack(encodings), means])  # (n_categories + 1, n_classes)
        parts.append(lz.take(ctx.param(table, f"encodings_{j}"), code, axis=0))
    return Heads({"transform": lz.concat(parts, axis=1) if len(parts) > 1 else parts[0]})
