"""Feature selectors: a fitted support mask is a column selection (provenance kept)."""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.feature_selection import (
    RFE,
    RFECV,
    SelectFromModel,
    SelectKBest,
    SelectPercentile,
    VarianceThreshold,
)

from ..context import Context
from ..features import Features, Heads
from ..options import METHODS
from ..registry import register


def _selected(est: Any, features: Features) -> Features:
    return features.select(np.flatnonzero(est.get_support()))


@register(
    VarianceThreshold,
    SelectKBest,
    SelectPercentile,
    SelectFromModel,
    methods=("transform",),
    limits="any fitted support mask",
)
def selector(est: Any, features: Features, ctx: Context) -> Heads:
    return Heads.transformed(_selected(est, features))


@register(
    RFE,
    RFECV,
    methods=METHODS,
    limits="transform, and the fitted `estimator_`'s heads on the selected features",
)
def recursive_elimination(est: Any, features: Features, ctx: Context) -> Heads:
    selected = _selected(est, features)
    heads = ctx.convert(est.estimator_, selected, "estimator_")
    return Heads.transformed(
        selected, outputs=heads.outputs, classes=heads.classes, extra=heads.extra
    )
