"""Containers: pipelines, column transformers, unions and search wrappers.

They only route features between their children (through :meth:`Context.convert`); leaf
converters never see a container.
"""

from __future__ import annotations

from typing import Any

import lazy as lz

from .context import Context
from .features import Features, Heads
from .options import METHODS
from .registry import register, unsupported_param


def _skipped(step: Any) -> bool:
    return step is None or (isinstance(step, str) and step == "passthrough")


def _pipeline(est: Any, features: Features, ctx: Context) -> Heads:
    for name, step in est.steps[:-1]:
        if not _skipped(step):
            features = ctx.convert(step, features, name).features()
    name, last = est.steps[-1]
    if _skipped(last):
        return Heads.transformed(features)
    return ctx.convert(last, features, name)


def _weighted(features: Features, weight: float | None) -> Features:
    if weight is None or weight == 1:
        return features
    return Features(features.values * float(weight), (None,) * features.width)


def _column_transformer(est: Any, features: Features, ctx: Context) -> Heads:
    indices = est._transformer_to_input_indices  # resolves names, slices, masks, callables
    weights = est.transformer_weights or {}
    parts = []
    for name, transformer, _ in est.transformers_:
        columns = indices.get(name, [])
        if (isinstance(transformer, str) and transformer == "drop") or not len(columns):
            continue
        selected = features.select(columns)
        if isinstance(transformer, str) and transformer == "passthrough":
            out = selected
        else:
            out = ctx.convert(transformer, selected, name).features()
        parts.append(_weighted(out, weights.get(name)))
    if not parts:
        return Heads({"transform": lz.broadcast_to(ctx.const(0.0).reshape(1, 1), (lz.B, 0))})
    return Heads.transformed(Features.concat(parts))


def _feature_union(est: Any, features: Features, ctx: Context) -> Heads:
    weights = est.transformer_weights or {}
    parts = []
    for name, transformer in est.transformer_list:
        if isinstance(transformer, str) and transformer == "drop":
            continue
        out = (
            features
            if _skipped(transformer)
            else ctx.convert(transformer, features, name).features()
        )
        parts.append(_weighted(out, weights.get(name)))
    return Heads.transformed(Features.concat(parts))


def _search(est: Any, features: Features, ctx: Context) -> Heads:
    if not getattr(est, "refit", True) or not hasattr(est, "best_estimator_"):
        raise unsupported_param(est, "refit", getattr(est, "refit", None), "a refitted search")
    return ctx.convert(est.best_estimator_, features, "best_estimator_")


def _register() -> None:
    from sklearn.compose import ColumnTransformer
    from sklearn.model_selection import GridSearchCV, RandomizedSearchCV
    from sklearn.pipeline import FeatureUnion, Pipeline

    register(Pipeline, methods=METHODS, limits="`None` / `'passthrough'` steps")(_pipeline)
    register(
        ColumnTransformer,
        methods=("transform",),
        limits="columns by name, index, slice, mask, callable or selector; remainder; weights; "
        "dense output",
    )(_column_transformer)
    register(FeatureUnion, methods=("transform",), limits="weights; `'drop'` / `'passthrough'`")(
        _feature_union
    )
    searches = [GridSearchCV, RandomizedSearchCV]
    try:
        from sklearn.experimental import enable_halving_search_cv  # noqa: F401
        from sklearn.model_selection import HalvingGridSearchCV, HalvingRandomSearchCV

        searches += [HalvingGridSearchCV, HalvingRandomSearchCV]
    except ImportError:  # pragma: no cover - older scikit-learn
        pass
    register(*searches, methods=METHODS, limits="converts `best_estimator_` (refit=True)")(_search)


_register()
