"""Scoring tables on existing distributed engines, with the answers the service gives.

:class:`ScoreBatches` is a callable class for Ray Data's ``map_batches``: each worker (an actor)
loads the model once, from the store by ``name[@version]`` (or a model file), compiled as a
replica loads it (:func:`service.score.load_model`: its options, sample, stored execution plan
and compile cache), and scores Arrow batches, appending the heads as columns::

    import ray
    from service.distributed import ScoreBatches

    scored = ray.data.read_parquet("s3://bucket/customers/").map_batches(
        ScoreBatches,
        fn_constructor_kwargs={"model": "churn@3", "store": "s3://bucket/kestrel-store"},
        batch_format="pyarrow",
        batch_size=1024,
        concurrency=8,
    )

Ray schedules the workers; nothing here does. Each batch is scored as ``kestrel score`` scores a
unit (:func:`service.score.score_unit`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from service.score import Loaded, default_heads, load_model, score_unit
from service.settings import Settings


class ScoreBatches:
    """Scores Arrow batches with a stored model version (or a model file), loaded once.

    ``store`` and ``cache_dir`` default to the worker's ``KESTREL_STORE_URL`` and
    ``KESTREL_CACHE_DIR``; ``heads`` to ``predict`` and ``predict_proba``."""

    def __init__(
        self,
        model: str,
        store: str | None = None,
        cache_dir: str | None = None,
        heads: Sequence[str] | None = None,
        store_options: Mapping[str, Any] | None = None,
    ) -> None:
        overrides: dict[str, Any] = {"store_url": store, "cache_dir": cache_dir}
        overrides["store_options"] = dict(store_options) if store_options else None
        settings = Settings(**{k: v for k, v in overrides.items() if v is not None})
        self.loaded: Loaded = load_model(model, settings)
        self.heads = list(heads or default_heads(self.loaded.model))

    def __call__(self, batch: pa.Table | Any) -> pa.Table:
        """``batch`` (an Arrow table, or a pandas DataFrame) with the heads appended."""
        table = batch if isinstance(batch, pa.Table) else pa.Table.from_pandas(batch)
        return score_unit(self.loaded.model, self.heads, table)
