"""Spark scoring (service.spark.score_dataframe) on a local Spark session of two cores: every
row gets what ``kestrel score`` gives it, in the types it writes, and each Python worker process
loads the model once for all the partitions it scores."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import skops.io as sio
from pyspark.sql import SparkSession
from sklearn.base import clone

from service import score
from service.settings import Settings
from service.spark import ScorePartitions, score_dataframe
from service.terminal import CommandError
from tests.service.test_distributed import stored  # noqa: F401 (a fixture)
from tests.service.test_score import UNIT, _frame, churn  # noqa: F401 (a fixture)

pytestmark = [
    # A JVM and a local[2] Spark session: about a minute, so make test-slow runs it.
    pytest.mark.slow,
    # PySpark 4.3 warns on every conversion that pandas 3 is not yet fully supported; Kestrel
    # hands Spark Arrow batches only, never pandas frames.
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas"),
]


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    with pytest.MonkeyPatch.context() as env:
        # The workers run this interpreter (Spark's default is whatever `python3` is first on
        # PATH), and bind the loopback address rather than guess one.
        env.setenv("PYSPARK_PYTHON", sys.executable)
        env.setenv("SPARK_LOCAL_IP", "127.0.0.1")
        session = (
            SparkSession.builder.master("local[2]")
            .appName("kestrel-tests")
            .config("spark.driver.memory", "512m")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
            # Several Arrow batches per partition: the model must outlive a batch.
            .config("spark.sql.execution.arrow.maxRecordsPerBatch", str(UNIT))
            .getOrCreate()
        )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def _rows(path: Path, n: int, seed: int) -> Path:
    """``n`` rows of the churn frame, numbered by an ``id`` column, in a Parquet file."""
    frame = _frame(n, seed)
    frame.insert(0, "id", np.arange(n))
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path, row_group_size=UNIT)
    return path


def _kestrel_score(model: str, source: Path, out: Path, settings: Settings) -> pa.Table:
    loaded = score.load_model(model, settings)
    score.score(loaded, score.open_source(str(source)), str(out))
    return pq.read_table(out)


def _assert_scored_alike(got: pa.Table, want: pa.Table, heads: list[str]) -> None:
    """Every row's heads equal, bit for bit and in type, and the input rows unchanged."""
    assert got.column_names == want.column_names
    for name in want.column_names:
        if name in heads:
            assert got.schema.field(name).type == want.schema.field(name).type, name
            assert got.column(name).equals(want.column(name)), name
        else:
            assert got.column(name).to_pylist() == want.column(name).to_pylist(), name


def test_spark_scores_as_kestrel_score_does(tmp_path: Path, stored: Path, spark: Any) -> None:  # noqa: F811
    source = _rows(tmp_path / "rows.parquet", 7 * UNIT + 9, 7)
    store, cache = str(stored / "store"), str(stored / "cache")
    # More partitions than cores, in shuffled order: each worker scores several.
    frame = spark.read.parquet(str(source)).repartition(5)
    scored = score_dataframe(frame, "churn@1", store=store, cache_dir=cache)
    got = scored.orderBy("id").toArrow()
    settings = Settings(store_url=store, cache_dir=cache)
    want = _kestrel_score("churn@1", source, tmp_path / "scored.parquet", settings)
    heads = ["predict", "predict_proba_0", "predict_proba_1"]
    _assert_scored_alike(got, want, heads)
    assert want.schema.field("predict_proba_1").type == pa.float32()
    assert np.array_equal(got.column("id").to_numpy(), np.arange(got.num_rows))


def test_string_labels_keep_their_type(
    tmp_path: Path,
    churn: Any,  # noqa: F811
    spark: Any,
) -> None:
    """A model file whose classes are strings (an object array, as pandas labels give them)."""
    training = _frame(2000, 0)
    labels = pd.Series(np.where(training.amount.fillna(50) > 50, "stays", "leaves"), dtype=object)
    model = clone(churn).fit(training, labels)
    assert model.classes_.dtype == object
    path = tmp_path / "labels.skops"
    path.write_bytes(sio.dumps(model))
    source = _rows(tmp_path / "rows.parquet", 3 * UNIT, 9)
    cache = str(tmp_path / "cache")
    heads = ["predict", "decision_function"]
    frame = spark.read.parquet(str(source))
    scored = score_dataframe(frame, str(path), cache_dir=cache, heads=heads)
    got = scored.orderBy("id").toArrow()
    loaded = score.load_model(str(path), Settings(cache_dir=cache))
    out = tmp_path / "scored.parquet"
    score.score(loaded, score.open_source(str(source)), str(out), heads)
    want = pq.read_table(out)
    _assert_scored_alike(got, want, heads)
    assert got.schema.field("predict").type == pa.string()
    assert set(got.column("predict").to_pylist()) == {"stays", "leaves"}


def test_each_worker_process_loads_the_model_once(stored: Path, spark: Any) -> None:  # noqa: F811
    """Many partitions of several batches each on two cores: every batch a process scores sees
    the same count of models loaded in it, so none was loaded after its first batch."""
    partitions = ScorePartitions(
        "churn@1", str(stored / "store"), str(stored / "cache"), heads=("predict",)
    )

    def score_and_report(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from service.spark import process_loads

        for batch in partitions(batches):
            n = batch.num_rows
            pid, loads = pa.array([os.getpid()] * n), pa.array([process_loads()] * n)
            yield pa.RecordBatch.from_arrays([pid, loads], names=["pid", "loads"])

    frame = spark.range(20 * UNIT, numPartitions=8).selectExpr(
        "cast(id % 60 + 18 as double) as age",
        "cast(id % 97 as double) as amount",
        "element_at(array('basic', 'pro', 'team'), cast(id % 3 + 1 as int)) as plan",
    )
    report = frame.mapInArrow(score_and_report, "pid long, loads long").toArrow().to_pandas()
    assert len(report) == 20 * UNIT
    per_process = report.groupby("pid")["loads"].agg(["min", "max"])
    assert 1 <= len(per_process) <= 2, per_process  # local[2]: Spark reuses its two workers
    assert (per_process["min"] == per_process["max"]).all(), per_process


def test_what_cannot_be_scored_is_named_before_spark_runs(stored: Path, spark: Any) -> None:  # noqa: F811
    frame = spark.createDataFrame([(30.0, 12.5, "pro")], "age double, amount double, plan string")
    store = str(stored / "store")
    with pytest.raises(CommandError, match=r"churn@7: .*no such model version"):
        score_dataframe(frame, "churn@7", store=store)
    with pytest.raises(CommandError, match=r"unknown heads \['transform'\]"):
        score_dataframe(frame, "churn@1", store=store, heads=["transform"])
    taken = frame.withColumnRenamed("plan", "predict")
    with pytest.raises(CommandError, match=r"already has columns \['predict'\]"):
        score_dataframe(taken, "churn@1", store=store)
