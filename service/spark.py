"""Scoring a Spark DataFrame with the answers the service gives (``pip install 'kestrel[spark]'``).

:func:`score_dataframe` appends the chosen heads to a DataFrame through ``DataFrame.mapInArrow``.
Each Python worker process loads the model once (from the store by ``name[@version]``, compiled
as a replica loads it, or a model file: :class:`service.distributed.ScoreBatches`) and keeps it
for every partition it is given; each Arrow batch is scored as ``kestrel score`` scores a unit
(:func:`service.score.score_unit`)::

    from service.spark import score_dataframe

    customers = spark.read.parquet("s3://bucket/customers/")
    scored = score_dataframe(customers, "churn@3", store="s3://bucket/kestrel-store")
    scored.write.parquet("s3://bucket/scored/")

Spark needs the output schema before it runs anything, so the driver loads the model too, once:
a model that cannot be loaded fails there, naming it, and the heads' columns are declared with
the types ``kestrel score`` writes (float32 probabilities stay float32, labels keep their type).
The workers' Python (``PYSPARK_PYTHON``) must have Kestrel installed and reach the store and the
compile cache under the same URLs; ``spark.python.worker.reuse`` (on by default) is what lets a
process keep its model from one task to the next.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from service.distributed import ScoreBatches
from service.score import chosen_heads, head_types
from service.terminal import CommandError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

#: This process's scorers, one per distinct arguments: a Python worker serves many tasks.
_SCORERS: dict[str, ScoreBatches] = {}


@dataclass(frozen=True)
class ScorePartitions:
    """The function ``mapInArrow`` runs on a partition: its Arrow batches, each with the heads
    appended. Small and picklable; the model it names is loaded on first use in each process.
    ``heads`` empty: the model's default heads."""

    model: str
    store: str | None = None
    cache_dir: str | None = None
    heads: tuple[str, ...] = ()
    store_options: Mapping[str, Any] | None = None

    def scorer(self) -> ScoreBatches:
        """This process's scorer for these arguments, loaded on the first call."""
        key = json.dumps(
            [self.model, self.store, self.cache_dir, self.heads, self.store_options],
            sort_keys=True,
            default=str,
        )
        if key not in _SCORERS:  # a Python worker runs one task at a time: no lock needed
            _SCORERS[key] = ScoreBatches(
                self.model, self.store, self.cache_dir, self.heads or None, self.store_options
            )
        return _SCORERS[key]

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        scorer = self.scorer()
        for batch in batches:
            yield from scorer(pa.Table.from_batches([batch])).to_batches()


def process_loads() -> int:
    """How many models this process has loaded for Spark (one per distinct arguments)."""
    return len(_SCORERS)


def score_dataframe(
    frame: DataFrame,
    model: str,
    *,
    store: str | None = None,
    cache_dir: str | None = None,
    heads: Sequence[str] | None = None,
    store_options: Mapping[str, Any] | None = None,
) -> DataFrame:
    """``frame`` with the heads appended as columns (``predict``, ``predict_proba_<class>``, …),
    scored by the stored version ``model`` (``name[@version]``) or a model file.

    ``store`` and ``cache_dir`` default to each process's ``KESTREL_STORE_URL`` and
    ``KESTREL_CACHE_DIR``; ``heads`` to ``predict`` and ``predict_proba``. Rows keep their
    partition and their order within it."""
    from pyspark.sql.pandas.types import from_arrow_type
    from pyspark.sql.types import StructField, StructType

    options = dict(store_options) if store_options else None
    on_driver = ScorePartitions(model, store, cache_dir, store_options=options)
    compiled = on_driver.scorer().loaded.model
    chosen = chosen_heads(compiled, heads)
    types = head_types(compiled, chosen)
    clash = [name for name in types if name in frame.columns]
    if clash:
        raise CommandError(f"the input already has columns {clash}, which the heads would add")
    schema = StructType(
        [*frame.schema.fields, *(StructField(n, from_arrow_type(t)) for n, t in types.items())]
    )
    # The workers are told the heads chosen here, so that they append what the schema says.
    return frame.mapInArrow(replace(on_driver, heads=tuple(chosen)), schema)
