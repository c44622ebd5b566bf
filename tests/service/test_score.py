"""``kestrel score``: a table scored offline unit by unit, with exactly the answers a running
server gives, resumable where a run stopped, in Parquet, CSV and Arrow."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest
import skops.io as sio
from sklearn.compose import ColumnTransformer
from sklearn.ensemble import GradientBoostingClassifier
from sklearn.impute import SimpleImputer
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import OneHotEncoder, StandardScaler

from service import score
from service.settings import Settings
from service.terminal import CommandError
from tests.service.live import LiveServer

ROOT = Path(__file__).resolve().parents[2]
UNIT = 64  # rows per Parquet row group, and the served version's max_batch


def _frame(n: int, seed: int) -> pd.DataFrame:
    """Integer and decimal columns with missing values, and a string column."""
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame(
        {
            "age": rng.integers(18, 80, n).astype(np.float64),
            "amount": rng.normal(50, 20, n).round(2),
            "plan": rng.choice(["basic", "pro", "team"], n),
        }
    )
    frame.loc[rng.random(n) < 0.1, "amount"] = np.nan
    return frame


@pytest.fixture(scope="module")
def churn() -> Any:
    frame = _frame(2000, 0)
    label = (frame.amount.fillna(50) + 12 * (frame.plan == "pro") - frame.age / 5 > 42).astype(int)
    pre = ColumnTransformer(
        [
            ("num", make_pipeline(SimpleImputer(), StandardScaler()), ["age", "amount"]),
            ("cat", OneHotEncoder(handle_unknown="ignore"), ["plan"]),
        ]
    )
    return make_pipeline(pre, GradientBoostingClassifier(n_estimators=15, random_state=0)).fit(
        frame, label
    )


def _parquet(path: Path, frame: pd.DataFrame) -> Path:
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path, row_group_size=UNIT)
    return path


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "service.cli", "score", *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow  # a live server and the CLI over a large table: half a minute
def test_a_stored_version_scores_offline_as_it_does_online(tmp_path: Path, churn: Any) -> None:
    """The store's version, compiled with its options, plan and cache: every answer is the
    server's, bit for bit, row order kept."""
    (tmp_path / "server").mkdir()
    live = LiveServer(tmp_path / "server").start()
    try:
        sample = _frame(8, 1).to_json(orient="records")
        r = live.register(
            "churn", sio.dumps(churn), sample=sample, options=f'{{"max_batch": {UNIT}}}'
        )
        assert r.status_code == 201, r.text
        rows = _frame(5 * UNIT + 17, 2)
        online: dict[str, list[Any]] = {"predict": [], "predict_proba": []}
        for start in range(0, len(rows), UNIT):
            chunk = orjson.loads(rows.iloc[start : start + UNIT].to_json(orient="records"))
            body = {"rows": chunk, "outputs": ["predict", "predict_proba"]}
            r = live.client.post("/models/churn/predict", json=body)
            assert r.status_code == 200, r.text
            for head in online:
                online[head] += r.json()["outputs"][head]
    finally:
        live.stop()
    source = _parquet(tmp_path / "rows.parquet", rows)
    output = tmp_path / "scored.parquet"
    store, cache = tmp_path / "server" / "store", tmp_path / "server" / "cache"
    done = _cli(
        "churn@1",
        *("--input", str(source), "--output", str(output)),
        *("--store", str(store), "--cache-dir", str(cache), "--quiet"),
    )
    assert done.returncode == 0, done.stderr
    assert f"scored {len(rows)} rows in 6 units" in done.stderr
    scored = pq.read_table(output).to_pandas()
    pd.testing.assert_frame_equal(scored[rows.columns], rows)  # the input, in order
    assert scored["predict"].tolist() == online["predict"]
    proba = np.asarray(online["predict_proba"])
    for k, label in enumerate(churn.classes_):
        got = scored[f"predict_proba_{label}"].to_numpy()
        # JSON carries a float32 answer as its shortest decimal, which reads back as that float32
        assert np.array_equal(got, proba[:, k].astype(got.dtype)), label
    # The current version by name alone; an unknown one is named.
    again = _cli("churn", "--input", str(source), "--output", str(tmp_path / "again.parquet"),
                 "--store", str(store), "--cache-dir", str(cache), "--quiet")  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert pq.read_table(tmp_path / "again.parquet").equals(pq.read_table(output))
    missing = _cli("churn@7", "--input", str(source), "--output", str(tmp_path / "x.parquet"),
                   "--store", str(store), "--quiet")  # fmt: skip
    assert missing.returncode == 1 and "churn@7" in missing.stderr and "version" in missing.stderr


@pytest.fixture
def model_file(tmp_path: Path, churn: Any) -> Path:
    path = tmp_path / "churn.skops"
    path.write_bytes(sio.dumps(churn))
    return path


def test_a_run_that_stops_resumes_at_its_first_missing_unit(
    tmp_path: Path, model_file: Path, churn: Any
) -> None:
    settings = Settings(cache_dir=tmp_path / "cache", max_batch=UNIT)
    loaded = score.load_model(str(model_file), settings)
    rows = _frame(5 * UNIT, 3)
    source = score.open_source(str(_parquet(tmp_path / "rows.parquet", rows)))
    output = tmp_path / "scored.parquet"

    def stop_after_two(unit: int) -> None:
        if unit == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        score.score(loaded, source, str(output), on_unit=stop_after_two)
    parts = tmp_path / "scored.parquet.parts"
    assert not output.exists()
    assert sorted(p.name for p in parts.glob("part-*")) == [
        "part-00000000.parquet",
        "part-00000001.parquet",
    ]
    # A part being written when the run was killed is not a part.
    (parts / "part-00000002.parquet.partial").write_bytes(b"half")
    # Another run's parts are not taken for this one's.
    with pytest.raises(CommandError, match="parts of another run"):
        score.score(loaded, source, str(output), ["predict"])
    done = score.score(loaded, source, str(output))
    assert (done.resumed_at, done.units, done.rows) == (2, 5, len(rows))
    assert not parts.exists()
    scored = pq.read_table(output).to_pandas()
    assert scored["predict"].tolist() == churn.predict(rows).tolist()
    np.testing.assert_allclose(
        scored[["predict_proba_0", "predict_proba_1"]].to_numpy(), churn.predict_proba(rows),
        atol=1e-6,
    )  # fmt: skip


def test_csv_and_arrow_in_and_out(tmp_path: Path, model_file: Path, churn: Any) -> None:
    rows = _frame(300, 4)
    rows.to_csv(tmp_path / "rows.csv", index=False)
    done = _cli(
        str(model_file),
        *("--input", str(tmp_path / "rows.csv"), "--output", str(tmp_path / "scored.arrow")),
        *("--heads", "predict", "--cache-dir", str(tmp_path / "cache")),
    )
    assert done.returncode == 0, done.stderr
    assert "rows/s" in done.stderr  # the summary (and the progress bar's own figures)
    scored = feather.read_table(tmp_path / "scored.arrow").to_pandas()
    assert scored.columns.tolist() == [*rows.columns, "predict"]
    assert scored["predict"].tolist() == churn.predict(rows).tolist()
    done = _cli(
        str(model_file),
        *("--input", str(tmp_path / "scored.arrow"), "--output", str(tmp_path / "again.csv")),
        *("--heads", "predict_proba", "--cache-dir", str(tmp_path / "cache"), "--quiet"),
    )
    assert done.returncode == 0, done.stderr
    again = pd.read_csv(tmp_path / "again.csv")
    assert again.columns.tolist()[-2:] == ["predict_proba_0", "predict_proba_1"]
    np.testing.assert_allclose(again.iloc[:, -2:], churn.predict_proba(rows), atol=1e-6)


def test_bad_inputs_are_named(tmp_path: Path, model_file: Path) -> None:
    settings = Settings(cache_dir=tmp_path / "cache")
    loaded = score.load_model(str(model_file), settings)
    wrong = _parquet(tmp_path / "wrong.parquet", _frame(10, 5).drop(columns="plan"))
    with pytest.raises(CommandError, match="plan"):
        score.score(loaded, score.open_source(str(wrong)), str(tmp_path / "out.parquet"))
    with pytest.raises(CommandError, match=r"unknown table format '\.xlsx'"):
        score.open_source(str(tmp_path / "rows.xlsx"))
    with pytest.raises(CommandError, match="no such input"):
        score.open_source(str(tmp_path / "absent.parquet"))
    source = score.open_source(str(_parquet(tmp_path / "ok.parquet", _frame(10, 6))))
    with pytest.raises(CommandError, match=r"unknown heads \['transform'\]"):
        score.score(loaded, source, str(tmp_path / "out.parquet"), ["transform"])


def test_head_types_are_the_types_scored_columns_get(tmp_path: Path, model_file: Path) -> None:
    """What an engine declares before scoring (Spark's output schema) is what scoring gives."""
    model = score.load_model(str(model_file), Settings(cache_dir=tmp_path / "cache")).model
    heads = list(model.methods)
    table = pa.Table.from_pandas(_frame(20, 10), preserve_index=False)
    scored = score.score_unit(model, heads, table)
    types = score.head_types(model, heads)
    assert list(types) == scored.column_names[table.num_columns :]
    assert types == {name: scored.schema.field(name).type for name in types}
    assert types["predict_proba_1"] == pa.float32()
