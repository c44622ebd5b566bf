"""Every accepted upload format × the model families it carries, against one real server.

Each model is registered over HTTP without a sample (the parity gate synthesises its rows from
the fitted model), scored over HTTP as JSON dict rows keyed by the model's own column names
(nulls for missing values, an unseen category), and must answer as the source library's own
predict does on the same rows: labels identical, numbers within float32 tolerance. Pickle is
accepted because the server runs with ``KESTREL_ALLOW_PICKLE=true`` (service/settings.py,
``allow_pickle``), and then only with the admin token, which :class:`LiveServer` sends.

A refused upload (a broken file of any format) must not use up a version number.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

import lightgbm
import numpy as np
import pandas as pd
import pytest
import skops.io as sio
import xgboost
from sklearn.compose import ColumnTransformer
from sklearn.ensemble import RandomForestClassifier
from sklearn.impute import SimpleImputer
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import OneHotEncoder, StandardScaler

from service.store import ModelStore
from tests.compiler.conformance_lib import RTOL32
from tests.service.live import LiveServer

OPTIONS = '{"max_batch": 8}'
NUMERIC = ["age", "is_member", "amount", "ratio", "visits"]
STRINGS = ["region", "plan"]


# -- data ---------------------------------------------------------------------------------------
def _table(n: int, seed: int) -> pd.DataFrame:
    """A customer table: an integer column with repeats, a binary one, amounts rounded to 2
    decimals, a ratio to 1, small counts, NaN in three numeric columns, two string columns."""
    rng = np.random.default_rng(seed)
    amount = rng.lognormal(3.0, 1.0, n).round(2)
    ratio = rng.normal(0.0, 1.5, n).round(1)
    visits = rng.poisson(3.0, n).astype(np.float64)
    amount[rng.random(n) < 0.1] = np.nan
    ratio[rng.random(n) < 0.1] = np.nan
    visits[rng.random(n) < 0.05] = np.nan
    return pd.DataFrame(
        {
            "age": rng.integers(18, 90, n).astype(np.float64),
            "is_member": rng.integers(0, 2, n).astype(np.float64),
            "amount": amount,
            "ratio": ratio,
            "visits": visits,
            "region": rng.choice(["north", "south", "east", "west"], n),
            "plan": rng.choice(["basic", "plus", "pro"], n),
        }
    )


@cache
def train() -> pd.DataFrame:
    return _table(500, seed=3)


@cache
def held_out() -> pd.DataFrame:
    """Rows never trained on, with an unseen region and rows entirely missing their numbers."""
    rows = _table(40, seed=4)
    rows.loc[::7, "region"] = "atlantis"
    rows.loc[len(rows)] = [np.nan] * len(NUMERIC) + ["north", "pro"]
    rows.loc[len(rows)] = [40.0, 1.0, np.nan, 0.0, np.nan, "atlantis", "basic"]
    return rows


def _score(frame: pd.DataFrame) -> np.ndarray:
    return (
        0.03 * (frame["age"] - 50)
        + 0.8 * frame["is_member"]
        + 0.4 * frame["ratio"].fillna(0)
        + 0.01 * frame["amount"].fillna(20)
        + 0.2 * frame["visits"].fillna(3)
        + 0.3 * (frame["plan"] == "pro")
        - 0.5 * (frame["region"] == "east")
    ).to_numpy()


def _labels() -> np.ndarray:
    return np.where(_score(train()) > 0.8, "churn", "stay")


def _binary() -> np.ndarray:
    return (_score(train()) > 0.8).astype(int)


def _numbers() -> pd.DataFrame:
    return train()[NUMERIC]


def _rows(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """JSON dict rows by column name, NaN as null."""
    return [
        {k: None if isinstance(v, float) and np.isnan(v) else v for k, v in row.items()}
        for row in frame.to_dict(orient="records")
    ]


# -- the families -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Family:
    """A fitted model, its upload encodings by format, and how its source predicts."""

    model: Any
    columns: list[str]
    files: dict[str, tuple[str, Callable[[Any], bytes]]]  # format → (filename, encode)
    source: Callable[[Any, str, pd.DataFrame], Any]  # (model, head, rows) → expected


def _sklearn(model: Any, head: str, rows: pd.DataFrame) -> Any:
    return getattr(model, head)(rows)


def _lgbm_booster(model: Any, head: str, rows: pd.DataFrame) -> Any:
    assert head == "predict", head
    return model.predict(rows.to_numpy(dtype=np.float64))


def _xgb_booster(model: Any, head: str, rows: pd.DataFrame) -> Any:
    assert head == "predict", head
    matrix = xgboost.DMatrix(
        rows.to_numpy(dtype=np.float64), feature_names=model.feature_names, missing=np.nan
    )
    return model.predict(matrix)


PICKLE = ("model.pkl", pickle.dumps)
SKOPS = ("model.skops", sio.dumps)


@cache
def family(name: str) -> Family:
    frame = train()
    if name == "pipeline":  # scaled numbers (imputed) + one-hot strings → string labels
        pre = ColumnTransformer(
            [
                ("num", make_pipeline(SimpleImputer(), StandardScaler()), NUMERIC),
                ("cat", OneHotEncoder(handle_unknown="ignore"), STRINGS),
            ]
        )
        model = make_pipeline(pre, LogisticRegression(max_iter=1000)).fit(frame, _labels())
        return Family(model, NUMERIC + STRINGS, {"skops": SKOPS, "pickle": PICKLE}, _sklearn)
    if name == "forest":  # scikit-learn's own NaN handling in the splits
        model = RandomForestClassifier(20, max_depth=6, random_state=0)
        model.fit(_numbers(), _labels())
        return Family(model, NUMERIC, {"skops": SKOPS, "pickle": PICKLE}, _sklearn)
    if name in ("lgbm-classifier", "lgbm-regressor"):
        params = {"objective": "binary" if name == "lgbm-classifier" else "regression"}
        label = _binary() if name == "lgbm-classifier" else _score(frame)
        data = lightgbm.Dataset(_numbers(), label=label, free_raw_data=False)
        booster = lightgbm.train(
            {**params, "min_data_in_leaf": 5, "num_threads": 1, "verbose": -1}, data, 20
        )
        text = ("model.txt", lambda b: b.model_to_string().encode())
        return Family(booster, NUMERIC, {"lightgbm": text, "pickle": PICKLE}, _lgbm_booster)
    if name in ("xgb-classifier", "xgb-regressor"):
        objective = "binary:logistic" if name == "xgb-classifier" else "reg:squarederror"
        label = _binary() if name == "xgb-classifier" else _score(frame)
        matrix = xgboost.DMatrix(
            _numbers().to_numpy(), label=label, feature_names=NUMERIC, missing=np.nan
        )
        params = {"objective": objective, "max_depth": 4, "eta": 0.3, "nthread": 1}
        booster = xgboost.train(params, matrix, 20)
        files = {
            "xgboost-json": ("model.json", lambda b: bytes(b.save_raw("json"))),
            "xgboost-ubj": ("model.ubj", lambda b: bytes(b.save_raw("ubj"))),
            "pickle": PICKLE,
        }
        return Family(booster, NUMERIC, files, _xgb_booster)
    if name == "lgbm-wrapper":  # the scikit-learn wrapper, only as a pickle (not in skops)
        model = lightgbm.LGBMClassifier(n_estimators=20, n_jobs=1, verbose=-1)
        model.fit(_numbers(), _labels())
        return Family(model, NUMERIC, {"pickle": PICKLE}, _sklearn)
    if name == "xgb-wrapper":
        model = xgboost.XGBClassifier(n_estimators=20, max_depth=4, n_jobs=1)
        model.fit(_numbers(), _binary())
        return Family(model, NUMERIC, {"pickle": PICKLE}, _sklearn)
    raise ValueError(name)


FAMILIES = (
    "pipeline",
    "forest",
    "lgbm-classifier",
    "lgbm-regressor",
    "xgb-classifier",
    "xgb-regressor",
    "lgbm-wrapper",
    "xgb-wrapper",
)
MATRIX = [
    ("skops", "pipeline"),
    ("skops", "forest"),
    ("lightgbm", "lgbm-classifier"),
    ("lightgbm", "lgbm-regressor"),
    ("xgboost-json", "xgb-classifier"),
    ("xgboost-json", "xgb-regressor"),
    ("xgboost-ubj", "xgb-classifier"),
    ("xgboost-ubj", "xgb-regressor"),
    *(("pickle", f) for f in FAMILIES),
]


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    server = LiveServer(tmp_path_factory.mktemp("matrix"), KESTREL_ALLOW_PICKLE="true").start()
    try:
        yield server
    finally:
        server.stop()


def test_the_matrix_covers_every_accepted_format() -> None:
    from service.artifacts import FORMATS

    assert {fmt for fmt, _ in MATRIX} == set(FORMATS)
    for fmt, name in MATRIX:  # each pairing is one the family really ships in
        assert fmt in family(name).files, (fmt, name)
    assert {n for _, n in SKLEARN_API} == {n for n in FAMILIES if family(n).source is _sklearn}


def _assert_same(head: str, got: Any, expected: Any) -> None:
    expected = np.asarray(expected)
    if expected.dtype.kind in "fc":
        got = np.asarray(got, dtype=np.float64)
        assert got.shape == expected.shape, (head, got.shape, expected.shape)
        scale = max(1.0, float(np.nanmax(np.abs(expected), initial=0.0)))
        np.testing.assert_allclose(got, expected, rtol=RTOL32, atol=RTOL32 * scale, err_msg=head)
    else:
        np.testing.assert_array_equal(np.asarray(got), expected, err_msg=head)


_REGISTERED: dict[tuple[int, str, str], dict[str, Any]] = {}


def _register(live: LiveServer, fmt: str, name: str) -> tuple[str, dict[str, Any]]:
    """Register ``name`` in ``fmt`` once per server, without a sample; (model name, answer)."""
    model_name = f"{name}-{fmt}"
    key = (live.port, fmt, name)
    if key not in _REGISTERED:
        fam = family(name)
        filename, encode = fam.files[fmt]
        r = live.register(model_name, encode(fam.model), filename=filename, options=OPTIONS)
        assert r.status_code == 201, r.text
        _REGISTERED[key] = r.json()
    return model_name, _REGISTERED[key]


def _served(live: LiveServer, model_name: str, rows: pd.DataFrame) -> dict[str, Any]:
    answer = live.client.post(f"/models/{model_name}/predict", json=_rows(rows))
    assert answer.status_code == 200, answer.text
    return answer.json()["outputs"]


@pytest.mark.parametrize(("fmt", "name"), MATRIX, ids=[f"{f}-{n}" for f, n in MATRIX])
def test_an_upload_without_a_sample_scores_as_its_source(
    live: LiveServer, fmt: str, name: str
) -> None:
    fam = family(name)
    model_name, body = _register(live, fmt, name)
    assert body["state"] == "READY" and body["format"] == fmt, body
    assert body["parity"]["ok"] and body["parity"]["source"] == "synthetic", body["parity"]
    assert [c["name"] for c in body["schema"]["columns"]] == fam.columns

    rows = held_out()[fam.columns]
    outputs = _served(live, model_name, rows)
    assert "predict" in outputs, outputs.keys()
    for head, got in outputs.items():
        _assert_same(head, got, fam.source(fam.model, head, rows))


SKLEARN_API = [
    (f, n) for f, n in MATRIX if n in ("pipeline", "forest", "lgbm-wrapper", "xgb-wrapper")
]


@pytest.mark.parametrize(
    ("fmt", "name"), [pytest.param(f, n, id=f"{f}-{n}") for f, n in SKLEARN_API]
)
def test_every_head_of_a_scikit_learn_api_model_is_served(
    live: LiveServer, fmt: str, name: str
) -> None:
    fam = family(name)
    model_name, _ = _register(live, fmt, name)
    outputs = _served(live, model_name, held_out()[fam.columns].iloc[:3])
    heads = ("predict", "predict_proba", "decision_function", "transform", "score_samples")
    assert {h for h in heads if hasattr(fam.model, h)} <= set(outputs), sorted(outputs)


BROKEN: dict[str, tuple[str, Callable[[], bytes]]] = {
    "skops": ("model.skops", lambda: sio.dumps(family("forest").model)[:300]),
    "lightgbm": (
        "model.txt",
        lambda: family("lgbm-classifier").model.model_to_string().encode()[:2000],
    ),
    "xgboost-json": (
        "model.json",
        lambda: bytes(family("xgb-regressor").model.save_raw("json"))[:1500],
    ),
    "xgboost-ubj": (
        "model.ubj",
        lambda: bytes(family("xgb-regressor").model.save_raw("ubj"))[:1500],
    ),
    "pickle": ("model.pkl", lambda: pickle.dumps(family("forest").model)[:500]),
    "unsupported": ("model.pkl", lambda: pickle.dumps({"not": "a model"})),
}


def test_a_refused_upload_uses_up_no_version_number(live: LiveServer) -> None:
    good = sio.dumps(family("forest").model)
    expected = 0
    for label, (filename, broken) in BROKEN.items():
        r = live.register("versions", broken(), filename=filename, options=OPTIONS)
        assert r.status_code == 422, (label, r.status_code, r.text)
        r = live.register("versions", good, filename="model.skops", options=OPTIONS)
        assert r.status_code == 201, (label, r.text)
        expected += 1
        assert r.json()["version"] == str(expected), (label, r.json()["version"])
        assert r.headers["location"] == f"/models/versions/versions/{expected}"
    # A file that loads but whose version then fails (its sample holds a word where the model
    # reads a number) gives its number back too.
    sample = json.dumps([{**dict.fromkeys(NUMERIC, 1.0), "age": "old"}])
    r = live.register("versions", good, filename="model.skops", sample=sample, options=OPTIONS)
    assert r.status_code == 422 and f"version {expected + 1} failed" in r.text, r.text
    r = live.register("versions", good, filename="model.skops", options=OPTIONS)
    assert r.status_code == 201 and r.json()["version"] == str(expected + 1), r.text
    expected += 1
    listing = live.client.get("/models/versions", headers=live.admin).json()
    assert listing["current"] == str(expected)
    numbers = [v["version"] for v in listing["versions"]]
    assert numbers == [str(v) for v in range(1, expected + 1)], numbers
    manifest = ModelStore(str(live.workdir / "store")).load_manifest()
    assert manifest.models["versions"].next_version == expected + 1


def test_a_sample_row_missing_a_column_is_refused_like_a_scoring_row(live: LiveServer) -> None:
    served, _ = _register(live, "skops", "forest")
    scoring = live.client.post(f"/models/{served}/predict", json=[{"age": 40.0}])
    assert scoring.status_code == 422 and "is_member" in scoring.text, scoring.text
    good = sio.dumps(family("forest").model)
    r = live.register("sparse-sample", good, sample='[{"age": 40.0}]', options=OPTIONS)
    assert r.status_code in (400, 422), r.text
    assert "is_member" in r.text
