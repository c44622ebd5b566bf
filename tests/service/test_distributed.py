"""Ray Data scoring (service.distributed.ScoreBatches) on a local Ray cluster of two workers:
each worker loads the stored version in its constructor, and every row gets what ``kestrel
score`` gives it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray
import skops.io as sio

from service import score
from service.distributed import ScoreBatches
from service.settings import Settings
from tests.service.live import LiveServer
from tests.service.test_score import UNIT, _frame, _parquet, churn  # noqa: F401 (a fixture)

# A local Ray cluster of two workers: about a minute, so make test-slow runs it.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory, churn: Any) -> Path:  # noqa: F811
    """A store holding churn version 1, registered on a live server (then stopped)."""
    workdir = tmp_path_factory.mktemp("server")
    live = LiveServer(workdir).start()
    try:
        sample = _frame(8, 1).to_json(orient="records")
        options = f'{{"max_batch": {UNIT}}}'
        r = live.register("churn", sio.dumps(churn), sample=sample, options=options)
        assert r.status_code == 201, r.text
    finally:
        live.stop()
    return workdir


@pytest.fixture(scope="module")
def cluster() -> Any:
    # Logical CPUs beyond the two cores: the two actors hold one each, the reads run beside.
    ray.init(num_cpus=4, include_dashboard=False, object_store_memory=200 << 20)
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield ray
    ray.shutdown()


def test_ray_workers_score_as_kestrel_score_does(
    tmp_path: Path, stored: Path, cluster: Any
) -> None:
    rows = _frame(6 * UNIT + 5, 7)
    source = _parquet(tmp_path / "rows.parquet", rows)
    store, cache = str(stored / "store"), str(stored / "cache")
    dataset = cluster.data.read_parquet(str(source)).map_batches(
        ScoreBatches,
        fn_constructor_kwargs={"model": "churn@1", "store": store, "cache_dir": cache},
        batch_format="pyarrow",
        batch_size=UNIT,
        concurrency=2,
    )
    scored = pa.concat_tables(cluster.get(dataset.to_arrow_refs()))
    loaded = score.load_model("churn@1", Settings(store_url=store, cache_dir=cache))
    out = tmp_path / "scored.parquet"
    score.score(loaded, score.open_source(str(source)), str(out))
    want = pq.read_table(out)
    assert scored.num_rows == len(rows)
    # Ray need not keep the rows' order (preserve_order is off): compare them sorted alike.
    keys = ["age", "amount", "plan"]
    got = scored.to_pandas().sort_values(keys, kind="stable").reset_index(drop=True)
    expected = want.to_pandas().sort_values(keys, kind="stable").reset_index(drop=True)
    assert got.columns.tolist() == expected.columns.tolist()
    assert got.equals(expected)


def test_a_pandas_batch_is_scored_too(stored: Path) -> None:
    scorer = ScoreBatches("churn", store=str(stored / "store"), cache_dir=str(stored / "cache"))
    frame = _frame(10, 8)
    out = scorer(frame)
    assert out.column_names == [*frame.columns, "predict", "predict_proba_0", "predict_proba_1"]
