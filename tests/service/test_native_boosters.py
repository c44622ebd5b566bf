"""Native booster uploads over HTTP (a real ``kestrel serve``): XGBoost JSON / UBJSON boosters
pass the parity gate through a DMatrix and become READY without a sample; LightGBM text and
XGBoost boosters keep their own feature names; a failed registration uses up no version number.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import lightgbm
import numpy as np
import pandas as pd
import pytest
import xgboost

from service.cli import main
from service.store import ModelStore
from tests.service.live import LiveServer

OPTIONS = '{"max_batch": 8}'
NAMES = ["age", "is_member", "visits", "score"]


def _table(n: int = 400, seed: int = 0) -> pd.DataFrame:
    """Real shapes: an integer column, a binary one, small counts with many repeats, and a
    rounded float with missing values."""
    rng = np.random.default_rng(seed)
    score = rng.normal(size=n).round(1)
    score[rng.random(n) < 0.15] = np.nan
    return pd.DataFrame(
        {
            "age": rng.integers(18, 80, n).astype(float),
            "is_member": rng.integers(0, 2, n).astype(float),
            "visits": rng.poisson(2.0, n).astype(float),
            "score": score,
        }
    )


def _probe(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows to score: training rows, split values ± their neighbours, and NaN everywhere."""
    probe = frame.iloc[:40].copy()
    probe.loc[len(probe)] = [np.nan] * len(NAMES)
    probe.loc[len(probe)] = [40.0, 1.0, np.nan, 0.0]
    probe.loc[len(probe)] = [np.nan, 0.0, 3.0, -0.3]
    return probe.reset_index(drop=True)


def _rows(frame: pd.DataFrame) -> list[dict[str, float | None]]:
    """JSON dict rows by column name; NaN as null."""
    return [
        {k: None if isinstance(v, float) and np.isnan(v) else v for k, v in row.items()}
        for row in frame.to_dict(orient="records")
    ]


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    server = LiveServer(tmp_path_factory.mktemp("native")).start()
    try:
        yield server
    finally:
        server.stop()


def _xgb_booster(objective: str, *, named: bool) -> tuple[xgboost.Booster, pd.DataFrame]:
    frame = _table()
    if objective == "binary:logistic":
        label = ((frame["age"] > 45) ^ (frame["is_member"] == 1)).astype(int)
    elif objective == "multi:softprob":
        label = (frame["visits"].clip(0, 2)).astype(int)
    else:
        label = frame["age"] * 0.1 + frame["visits"] + frame["score"].fillna(0)
    params = {"objective": objective, "max_depth": 4, "eta": 0.3}
    if objective == "multi:softprob":
        params["num_class"] = 3
    names = NAMES if named else None
    train = xgboost.DMatrix(frame.to_numpy(), label=label, feature_names=names, missing=np.nan)
    return xgboost.train(params, train, 6), frame


def _xgb_expected(booster: xgboost.Booster, rows: pd.DataFrame) -> np.ndarray:
    matrix = xgboost.DMatrix(rows.to_numpy(), feature_names=booster.feature_names, missing=np.nan)
    return booster.predict(matrix)


@pytest.mark.parametrize("raw", ["json", "ubj"])
@pytest.mark.parametrize("objective", ["binary:logistic", "reg:squarederror", "multi:softprob"])
def test_an_xgboost_upload_without_a_sample_becomes_ready_and_scores_as_its_booster(
    live: LiveServer, raw: str, objective: str
) -> None:
    booster, frame = _xgb_booster(objective, named=True)
    name = f"xgb-{raw}-{objective.split(':')[1]}"
    r = live.register(name, bytes(booster.save_raw(raw)), filename=f"m.{raw}", options=OPTIONS)
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["state"] == "READY" and body["format"] == f"xgboost-{raw}"
    assert body["parity"]["ok"] and body["parity"]["source"] == "synthetic"
    assert body["parity"]["probes"] > 0  # rows on and around the booster's split thresholds
    assert [c["name"] for c in body["schema"]["columns"]] == NAMES  # the booster's names

    probe = _probe(frame)
    expected = _xgb_expected(booster, probe)
    by_name = live.client.post(f"/models/{name}/predict", json=_rows(probe))
    assert by_name.status_code == 200, by_name.text
    got = np.asarray(by_name.json()["outputs"]["predict"], dtype=np.float64)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    # The same rows as arrays (by position), NaN as null, give the same answers.
    arrays = [[None if np.isnan(v) else v for v in row] for row in probe.to_numpy().tolist()]
    by_position = live.client.post(f"/models/{name}/predict", json=arrays)
    assert by_position.status_code == 200, by_position.text
    assert by_position.json()["outputs"]["predict"] == by_name.json()["outputs"]["predict"]


def test_an_xgboost_booster_without_feature_names_reads_columns_by_position(
    live: LiveServer,
) -> None:
    booster, frame = _xgb_booster("binary:logistic", named=False)
    r = live.register("xgb-unnamed", bytes(booster.save_raw("json")), filename="m.json",
                      options=OPTIONS)  # fmt: skip
    assert r.status_code == 201, r.text
    assert [c["name"] for c in r.json()["schema"]["columns"]] == ["x0", "x1", "x2", "x3"]
    probe = _probe(frame)
    arrays = [[None if np.isnan(v) else v for v in row] for row in probe.to_numpy().tolist()]
    got = live.client.post("/models/xgb-unnamed/predict", json=arrays).json()["outputs"]["predict"]
    np.testing.assert_allclose(got, _xgb_expected(booster, probe), rtol=1e-5, atol=1e-6)


def test_a_lightgbm_text_upload_scores_rows_by_its_own_column_names(live: LiveServer) -> None:
    frame = _table(seed=1)
    label = ((frame["age"] > 50) | (frame["visits"] >= 3)).astype(int)
    model = lightgbm.LGBMClassifier(n_estimators=8, min_child_samples=5, verbose=-1)
    booster = model.fit(frame, label).booster_
    text = booster.model_to_string()
    assert "feature_names=age is_member visits score" in text
    r = live.register("lgb-named", text.encode(), filename="model.txt", options=OPTIONS)
    assert r.status_code == 201, r.text
    assert [c["name"] for c in r.json()["schema"]["columns"]] == booster.feature_name()

    probe = _probe(frame)
    expected = booster.predict(probe.to_numpy())
    by_name = live.client.post("/models/lgb-named/predict", json=_rows(probe))
    assert by_name.status_code == 200, by_name.text
    np.testing.assert_allclose(by_name.json()["outputs"]["predict"], expected, rtol=1e-5, atol=1e-6)
    columnar = {c: [None if np.isnan(v) else v for v in probe[c]] for c in NAMES}
    by_column = live.client.post("/models/lgb-named/predict", json={"columns": columnar})
    assert by_column.status_code == 200, by_column.text
    assert by_column.json()["outputs"]["predict"] == by_name.json()["outputs"]["predict"]
    # A row missing one of the model's columns is refused, naming it.
    bad = live.client.post("/models/lgb-named/predict", json=[{"age": 30, "visits": 1}])
    assert bad.status_code == 422 and "is_member" in bad.text


def test_a_lightgbm_text_fitted_on_an_array_takes_its_default_column_names(
    live: LiveServer,
) -> None:
    frame = _table(seed=2)
    x = frame.to_numpy()
    booster = lightgbm.train(
        {"objective": "regression", "min_data_in_leaf": 5, "verbose": -1},
        lightgbm.Dataset(x, label=frame["age"] + 3 * frame["visits"]),
        num_boost_round=6,
    )
    names = [f"Column_{i}" for i in range(4)]
    assert booster.feature_name() == names
    r = live.register("lgb-columns", booster.model_to_string().encode(), filename="model.txt",
                      options=OPTIONS)  # fmt: skip
    assert r.status_code == 201, r.text
    assert [c["name"] for c in r.json()["schema"]["columns"]] == names
    probe = _probe(frame)
    rows = [
        {n: None if np.isnan(v) else v for n, v in zip(names, row, strict=True)}
        for row in probe.to_numpy().tolist()
    ]
    got = live.client.post("/models/lgb-columns/predict", json=rows)
    assert got.status_code == 200, got.text
    expected = booster.predict(probe.to_numpy())
    np.testing.assert_allclose(got.json()["outputs"]["predict"], expected, rtol=1e-5, atol=1e-5)


def test_a_failed_registration_uses_up_no_version_number(live: LiveServer) -> None:
    booster, frame = _xgb_booster("reg:squarederror", named=True)
    data = bytes(booster.save_raw("json"))
    wrong_width = json.dumps([[1.0, 2.0]])  # the sample must have the model's 4 columns
    not_numbers = json.dumps([["a", "b", "c", "d"]])
    for sample in (wrong_width, not_numbers):
        r = live.register("numbered", data, filename="m.json", sample=sample, options=OPTIONS)
        assert r.status_code == 422, r.text
        assert "version 1 failed" in r.json()["error"]["message"]
    r = live.register("numbered", data, filename="m.json", options=OPTIONS)
    assert r.status_code == 201, r.text
    assert r.json()["version"] == "1" and r.headers["location"] == "/models/numbered/versions/1"
    r = live.register("numbered", data, filename="m.json", sample=wrong_width, options=OPTIONS)
    assert r.status_code == 422 and "version 2 failed" in r.text
    sample = json.dumps(_rows(frame.iloc[:20]))
    r = live.register("numbered", data, filename="m.json", sample=sample, options=OPTIONS)
    assert r.status_code == 201, r.text
    assert r.json()["version"] == "2" and r.json()["parity"]["source"] == "sample"
    listing = live.client.get("/models/numbered", headers=live.admin).json()
    assert listing["current"] == "2"
    assert [(v["version"], v["state"]) for v in listing["versions"]] == [
        ("1", "RETIRED"),
        ("2", "READY"),
    ]
    manifest = ModelStore(str(live.workdir / "store")).load_manifest()
    assert manifest.models["numbered"].next_version == 3  # what a restart numbers from
    # An explicit version name that failed may be tried again.
    r = live.register("numbered", data, filename="m.json", sample=wrong_width, version="rc1")
    assert r.status_code == 422, r.text
    r = live.register("numbered", data, filename="m.json", version="rc1", options=OPTIONS)
    assert r.status_code == 201 and r.json()["version"] == "rc1", r.text


def test_cli_compiles_an_xgboost_json_and_reports_a_parity_failure_on_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from service import parity

    booster, _ = _xgb_booster("binary:logistic", named=True)
    path = tmp_path / "model.json"
    booster.save_model(path)
    args = ["compile", str(path), "--max-batch", "4"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "parity with the source on 64 synthetic rows and " in out and "probe rows: ok" in out

    source_method = parity.source_method

    def off_by_a_bit(estimator: object, method: str):  # the source now answers differently
        return lambda rows: source_method(estimator, method)(rows) + 0.01

    monkeypatch.setattr(parity, "source_method", off_by_a_bit)
    assert main(args) == 1
    captured = capsys.readouterr()
    failure = [line for line in captured.err.splitlines() if "parity check failed" in line]
    assert len(failure) == 1 and "predict: " in failure[0] and " rows differ" in failure[0]
    assert "first: synthetic row 0" in failure[0]
    assert "Traceback" not in captured.out + captured.err

    def refuses(estimator: object, method: str):
        def predict(rows: object) -> None:
            raise ValueError("feature_names mismatch\n  native stack frame 1\n  frame 2")

        return predict

    monkeypatch.setattr(parity, "source_method", refuses)
    assert main(args) == 1
    captured = capsys.readouterr()
    failure = [line for line in captured.err.splitlines() if "parity check failed" in line]
    assert failure == [
        "kestrel compile: parity check failed: ParityError: could not synthesise rows the source "
        "model accepts; upload a 'sample' of real rows"
    ]
    assert "Traceback" not in captured.out + captured.err
