"""The upload trust boundary: every accepted format round-trips, every hostile file is refused
with an ArtifactError before anything in it runs."""

from __future__ import annotations

import io
import json
import logging
import pathlib
import pickle
import re
import sys
import zipfile
from collections.abc import Callable
from typing import Any

import joblib
import lightgbm
import numpy as np
import pandas as pd
import pytest
import skops.io as sio
import xgboost
from sklearn.cluster import DBSCAN
from sklearn.compose import ColumnTransformer
from sklearn.ensemble import HistGradientBoostingClassifier, RandomForestClassifier
from sklearn.linear_model import LogisticRegression
from sklearn.neighbors import KNeighborsClassifier
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import FunctionTransformer, OneHotEncoder, StandardScaler
from sklearn.tree import DecisionTreeClassifier
from sklearn.tree._tree import Tree

from service.artifacts import (
    FORMATS,
    ArtifactError,
    ArtifactLimits,
    ArtifactTooLargeError,
    PickleNotAllowedError,
    UntrustedTypeError,
    detect_format,
    load_artifact,
    trusted_types,
)

RNG = np.random.default_rng(0)
X = RNG.normal(size=(200, 4))
Y = (X[:, 0] + X[:, 1] > 0).astype(int)
FRAME = pd.DataFrame(
    {"a": X[:, 0], "b": RNG.choice(["x", "y", "z"], 200), "c": X[:, 2]},
)


# --------------------------------------------------------------------------- fitted models


@pytest.fixture(scope="module")
def scaler_lr() -> Pipeline:
    return make_pipeline(StandardScaler(), LogisticRegression()).fit(X, Y)


@pytest.fixture(scope="module")
def onehot_forest() -> Pipeline:
    columns = ColumnTransformer(
        [("onehot", OneHotEncoder(handle_unknown="ignore"), ["b"])], remainder="passthrough"
    )
    return Pipeline(
        [("columns", columns), ("forest", RandomForestClassifier(n_estimators=3, random_state=0))]
    ).fit(FRAME, Y)


@pytest.fixture(scope="module")
def hist_gb() -> HistGradientBoostingClassifier:
    return HistGradientBoostingClassifier(max_iter=5, random_state=0).fit(X, Y)


@pytest.fixture(scope="module")
def lgbm() -> lightgbm.LGBMClassifier:
    return lightgbm.LGBMClassifier(n_estimators=5, verbose=-1).fit(X, Y)


@pytest.fixture(scope="module")
def xgb() -> xgboost.XGBClassifier:
    return xgboost.XGBClassifier(n_estimators=3, max_depth=3).fit(X, Y)


def _predictions(model: Any, data: Any) -> np.ndarray:
    return np.asarray(
        model.predict_proba(data) if hasattr(model, "predict_proba") else model.predict(data)
    )


# --------------------------------------------------------------------------- round trips


@pytest.mark.parametrize(
    ("fixture", "data"),
    [("scaler_lr", X), ("onehot_forest", FRAME), ("hist_gb", X), ("lgbm", X), ("xgb", X)],
)
def test_skops_round_trip(request: pytest.FixtureRequest, fixture: str, data: Any) -> None:
    model = request.getfixturevalue(fixture)
    loaded = load_artifact(sio.dumps(model), filename="model.skops")
    assert loaded.format == "skops"
    assert type(loaded.estimator) is type(model)
    np.testing.assert_array_equal(_predictions(loaded.estimator, data), _predictions(model, data))
    assert {"sklearn", "numpy", "skops"} <= loaded.framework.keys()
    if fixture in ("lgbm", "xgb"):
        assert fixture.replace("lgbm", "lightgbm").replace("xgb", "xgboost") in loaded.framework


@pytest.mark.parametrize("filename", ["model.txt", "model.lgb", ""])
def test_lightgbm_text_round_trip(lgbm: lightgbm.LGBMClassifier, filename: str) -> None:
    text = lgbm.booster_.model_to_string().encode()
    loaded = load_artifact(text, filename=filename)
    assert loaded.format == "lightgbm"
    assert isinstance(loaded.estimator, lightgbm.Booster)
    np.testing.assert_array_equal(loaded.estimator.predict(X), lgbm.booster_.predict(X))
    assert loaded.framework["lightgbm"] == lightgbm.__version__


@pytest.mark.parametrize(("raw", "fmt"), [("json", "xgboost-json"), ("ubj", "xgboost-ubj")])
def test_xgboost_round_trip(xgb: xgboost.XGBClassifier, raw: str, fmt: str) -> None:
    booster = xgb.get_booster()
    loaded = load_artifact(bytes(booster.save_raw(raw)), filename=f"model.{raw}")
    assert loaded.format == fmt
    matrix = xgboost.DMatrix(X)
    np.testing.assert_array_equal(loaded.estimator.predict(matrix), booster.predict(matrix))
    assert loaded.framework["xgboost"] == xgboost.__version__


def test_xgboost_categorical_dataframe_model_round_trips() -> None:
    frame = pd.DataFrame({"a": X[:, 0], "c": pd.Categorical(RNG.choice(["x", "y", "z"], 200))})
    target = ((frame["c"] == "x") ^ (frame["a"] > 0)).astype(int)
    booster = (
        xgboost.XGBClassifier(n_estimators=3, enable_categorical=True, max_cat_to_onehot=1)
        .fit(frame, target)
        .get_booster()
    )
    loaded = load_artifact(bytes(booster.save_raw("ubj")), filename="model.ubj")
    matrix = xgboost.DMatrix(frame, enable_categorical=True)
    np.testing.assert_array_equal(loaded.estimator.predict(matrix), booster.predict(matrix))


def test_categorical_models_round_trip() -> None:
    """LightGBM categorical splits (num_cat > 0) and HistGB categorical features (its
    preprocessor's functools.partial) pass the structural checks."""
    codes = RNG.integers(0, 12, 600)
    frame = pd.DataFrame({"a": RNG.normal(size=600), "c": pd.Categorical(codes)})
    target = np.isin(codes, [1, 3, 5, 7]).astype(int)
    booster = (
        lightgbm.LGBMClassifier(
            n_estimators=3, min_child_samples=5, min_data_per_group=5, cat_smooth=1, verbose=-1
        )
        .fit(frame, target)
        .booster_
    )
    text = booster.model_to_string()
    assert re.search(r"num_cat=[1-9]", text)
    loaded = load_artifact(text.encode())
    np.testing.assert_array_equal(loaded.estimator.predict(frame), booster.predict(frame))

    hist = HistGradientBoostingClassifier(max_iter=3, categorical_features="from_dtype")
    hist.fit(frame, target)
    loaded = load_artifact(sio.dumps(hist))
    np.testing.assert_array_equal(loaded.estimator.predict_proba(frame), hist.predict_proba(frame))


def _joblib_bytes(obj: Any) -> bytes:
    buffer = io.BytesIO()
    joblib.dump(obj, buffer)
    return buffer.getvalue()


def test_pickle_loads_only_when_allowed(
    scaler_lr: Pipeline, caplog: pytest.LogCaptureFixture
) -> None:
    data = _joblib_bytes(scaler_lr)
    with pytest.raises(PickleNotAllowedError, match="disabled"):
        load_artifact(data, filename="model.joblib")
    with caplog.at_level(logging.WARNING, logger="service.artifacts"):
        loaded = load_artifact(data, filename="model.joblib", allow_pickle=True)
    assert loaded.format == "pickle"
    np.testing.assert_array_equal(loaded.estimator.predict(X), scaler_lr.predict(X))
    import hashlib

    assert hashlib.sha256(data).hexdigest() in caplog.text


# --------------------------------------------------------------------------- format detection


@pytest.mark.parametrize(
    ("data", "filename", "expected"),
    [
        (b"PK\x03\x04rest", "model.bin", "skops"),
        (b"tree\nversion=v4\nnum_class=1\n", "", "lightgbm"),
        (b'  {"learner": {}, "version": [3, 2, 0]}', "", "xgboost-json"),
        (b"{L\x00\x00\x00\x00\x00\x00\x00\x07learner{}}", "", "xgboost-ubj"),
        (b"\x80\x04\x95", "model.skops", "pickle"),  # content wins over the extension
        (b"\x78\x9c compressed joblib", "model.joblib", "pickle"),  # extension as the hint
        (b"anything", "MODEL.TXT", "lightgbm"),
        (b"{}", "model.json", "xgboost-ubj"),  # "{}" is a valid (empty) UBJSON object too
    ],
)
def test_detect_format(data: bytes, filename: str, expected: str) -> None:
    assert detect_format(filename, data) == expected


def test_detect_format_names_the_accepted_formats() -> None:
    with pytest.raises(ArtifactError) as info:
        detect_format("model.bin", b"\x00\x01garbage")
    assert all(fmt in str(info.value) for fmt in FORMATS)


# --------------------------------------------------------------------------- hostile pickles


class _TouchOnUnpickle:
    """Unpickling this runs ``Path.touch`` on the sentinel: what a malicious pickle does."""

    def __init__(self, path: pathlib.Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        return (pathlib.Path.touch, (self.path,))


@pytest.mark.parametrize("filename", ["model.pkl", "model.skops", "model.json", ""])
def test_hostile_pickle_is_refused_without_unpickling(
    tmp_path: pathlib.Path, filename: str
) -> None:
    sentinel = tmp_path / "pwned"
    data = pickle.dumps(_TouchOnUnpickle(sentinel), protocol=4)
    with pytest.raises(PickleNotAllowedError):
        load_artifact(data, filename=filename)
    with pytest.raises(PickleNotAllowedError):
        load_artifact(data, filename=filename, format="pickle")
    assert not sentinel.exists()


def test_allowed_pickle_really_runs_code(tmp_path: pathlib.Path) -> None:
    """Why pickle is off by default: with it on, the payload runs before any type check."""
    sentinel = tmp_path / "pwned"
    data = pickle.dumps(_TouchOnUnpickle(sentinel), protocol=4)
    with pytest.raises(ArtifactError, match=r"unsupported model type builtins\.NoneType"):
        load_artifact(data, allow_pickle=True)
    assert sentinel.exists()


# --------------------------------------------------------------------------- hostile skops

_EVIL_MODULE = """
import pathlib
pathlib.Path({imported!r}).touch()

class Evil:
    def __setstate__(self, state):
        pathlib.Path({constructed!r}).touch()
"""


def test_skops_custom_class_is_untrusted_and_never_imported(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    imported, constructed = tmp_path / "imported", tmp_path / "constructed"
    (tmp_path / "kestrel_evil_mod.py").write_text(
        _EVIL_MODULE.format(imported=str(imported), constructed=str(constructed))
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import kestrel_evil_mod

    evil = kestrel_evil_mod.Evil()
    evil.payload = 1
    data = sio.dumps(Pipeline([("evil", evil), ("model", LogisticRegression())]))
    monkeypatch.delitem(sys.modules, "kestrel_evil_mod")
    imported.unlink()  # the dump imported it; loading must not import it again

    with pytest.raises(UntrustedTypeError) as info:
        load_artifact(data, filename="model.skops")
    assert "kestrel_evil_mod.Evil" in str(info.value)
    assert not imported.exists() and not constructed.exists()
    assert "kestrel_evil_mod" not in sys.modules


def test_skops_function_transformer_with_os_system_is_untrusted() -> None:
    import os

    model = make_pipeline(FunctionTransformer(func=os.system), LogisticRegression())
    with pytest.raises(UntrustedTypeError, match=r"\.system"):
        load_artifact(sio.dumps(model), filename="model.skops")


def test_skops_kd_tree_is_refused_with_advice() -> None:
    model = KNeighborsClassifier(algorithm="kd_tree").fit(X, Y)
    with pytest.raises(UntrustedTypeError, match="algorithm='brute'") as info:
        load_artifact(sio.dumps(model))
    assert "sklearn.neighbors._kd_tree.KDTree" in info.value.types
    brute = KNeighborsClassifier(algorithm="brute").fit(X, Y)
    assert isinstance(load_artifact(sio.dumps(brute)).estimator, KNeighborsClassifier)


def test_unregistered_estimator_is_an_unsupported_model_type() -> None:
    with pytest.raises(ArtifactError, match=r"unsupported model type .*DBSCAN; supported: "):
        load_artifact(sio.dumps(DBSCAN().fit(X)), filename="model.skops")


def _zip_with(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
        for name, payload in members.items():
            archive.writestr(name, payload)
    return buffer.getvalue()


def _rewrite_member(data: bytes, name: str, edit: Callable[[bytes], bytes]) -> bytes:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        members = {info.filename: archive.read(info.filename) for info in archive.infolist()}
    members[name] = edit(members[name])
    return _zip_with(members)


@pytest.fixture(scope="module")
def zip_bomb(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A skops-shaped zip with a 1 GiB member of zeros (written streaming, about 4.5 MB)."""
    path = tmp_path_factory.mktemp("bomb") / "bomb.skops"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        archive.writestr("schema.json", b"{}")
        with archive.open("bomb.npy", "w", force_zip64=True) as member:
            chunk = bytes(1 << 20)
            for _ in range(1024):
                member.write(chunk)
    return path.read_bytes()


def test_zip_bomb_is_refused_before_decompressing(zip_bomb: bytes) -> None:
    assert len(zip_bomb) < 16 << 20
    with pytest.raises(ArtifactTooLargeError, match="uncompressed size"):
        load_artifact(zip_bomb, filename="model.skops")


@pytest.mark.parametrize(
    ("members", "limits", "match"),
    [
        ({"schema.json": b"{}", "zeros.npy": bytes(16 << 20)}, ArtifactLimits(), "ratio"),
        (
            {"schema.json": b"{}", **{f"{i}.npy": b"x" for i in range(20)}},
            ArtifactLimits(max_members=10),
            "member count",
        ),
    ],
)
def test_zip_limits(members: dict[str, bytes], limits: ArtifactLimits, match: str) -> None:
    with pytest.raises(ArtifactTooLargeError, match=match):
        load_artifact(_zip_with(members), limits=limits)


def test_skops_tree_with_out_of_range_child_is_refused() -> None:
    """Trusting sklearn's Tree is safe only with its node links checked: predict would follow
    this child index past the node array."""
    model = DecisionTreeClassifier(max_depth=3, random_state=0).fit(X, Y)
    state = model.tree_.__getstate__()
    state["nodes"] = state["nodes"].copy()
    state["nodes"]["left_child"][0] = 10**6
    tree = Tree(model.n_features_in_, np.array([2], dtype=np.intp), 1)
    tree.__setstate__(state)
    model.tree_ = tree
    with pytest.raises(ArtifactError, match="child index 1000000 is out of range"):
        load_artifact(sio.dumps(model))


def test_skops_hist_gradient_boosting_with_bad_feature_is_refused(
    hist_gb: HistGradientBoostingClassifier,
) -> None:
    data = sio.dumps(hist_gb)
    crafted = sio.loads(data, trusted=trusted_types())
    nodes = crafted._predictors[0][0].nodes
    nodes["feature_idx"][~nodes["is_leaf"].astype(bool)] = 4096
    with pytest.raises(ArtifactError, match="split feature 4096 is out of range"):
        load_artifact(sio.dumps(crafted))


def test_skops_embedded_lightgbm_model_is_checked_before_lightgbm_parses_it(
    lgbm: lightgbm.LGBMClassifier,
) -> None:
    data = sio.dumps(lgbm)
    crafted = _rewrite_member(
        data,
        "schema.json",
        lambda schema: re.sub(rb"left_child=\d+", b"left_child=999", schema, count=1),
    )
    with pytest.raises(ArtifactError, match="LightGBM tree 0: a child index is out of range"):
        load_artifact(crafted)


def test_skops_booster_built_from_file_arguments_is_refused(lgbm: lightgbm.LGBMClassifier) -> None:
    def as_constructor_call(schema: bytes) -> bytes:
        doc = json.loads(schema)
        booster = doc["content"]["content"]["_Booster"]
        assert booster["__class__"] == "Booster"
        booster["__loader__"] = "ConstructorFromReduceNode"
        return json.dumps(doc).encode()

    crafted = _rewrite_member(sio.dumps(lgbm), "schema.json", as_constructor_call)
    with pytest.raises(ArtifactError, match="ConstructorFromReduceNode"):
        load_artifact(crafted)


# --------------------------------------------------------------------------- truncated / garbage


def _truncations(data: bytes) -> list[bytes]:
    return [data[: len(data) * k // 10] for k in (1, 5, 9)] + [data[:-7]]


@pytest.fixture(scope="module")
def intact_files(
    scaler_lr: Pipeline, lgbm: lightgbm.LGBMClassifier, xgb: xgboost.XGBClassifier
) -> dict[str, bytes]:
    booster = xgb.get_booster()
    return {
        "model.skops": sio.dumps(scaler_lr),
        "model.txt": lgbm.booster_.model_to_string().encode(),
        "model.json": bytes(booster.save_raw("json")),
        "model.ubj": bytes(booster.save_raw("ubj")),
    }


@pytest.mark.parametrize("filename", ["model.skops", "model.txt", "model.json", "model.ubj"])
def test_truncated_files_are_refused(intact_files: dict[str, bytes], filename: str) -> None:
    for data in _truncations(intact_files[filename]):
        with pytest.raises(ArtifactError):
            load_artifact(data, filename=filename)


@pytest.mark.parametrize("filename", ["model.skops", "model.txt", "model.json", "model.ubj", ""])
def test_random_garbage_is_refused(filename: str) -> None:
    garbage = np.random.default_rng(7).bytes(4096)
    with pytest.raises(ArtifactError):
        load_artifact(garbage, filename=filename)
    with pytest.raises(ArtifactError):
        load_artifact(b"tree\nversion=v4\n" + garbage, filename=filename)


def test_malformed_xgboost_json_names_the_position() -> None:
    with pytest.raises(ArtifactError, match=r"malformed XGBoost JSON at line 1, column \d+"):
        load_artifact(b'{"learner": {"gradient_booster": [1, 2,,]}}')


# --------------------------------------------------------------------------- declared sizes


def test_lightgbm_absurd_num_leaves_is_too_large(lgbm: lightgbm.LGBMClassifier) -> None:
    text = re.sub(
        r"num_leaves=\d+", "num_leaves=99999999999", lgbm.booster_.model_to_string(), count=1
    )
    with pytest.raises(ArtifactTooLargeError, match="num_leaves is 99,999,999,999"):
        load_artifact(text.encode())


def test_lightgbm_absurd_feature_count_is_too_large(lgbm: lightgbm.LGBMClassifier) -> None:
    text = re.sub(
        r"max_feature_idx=\d+", "max_feature_idx=2000000000", lgbm.booster_.model_to_string()
    )
    with pytest.raises(ArtifactTooLargeError, match="max_features"):
        load_artifact(text.encode())


def test_lightgbm_out_of_range_child_is_refused(lgbm: lightgbm.LGBMClassifier) -> None:
    text = re.sub(r"left_child=\d+", "left_child=999", lgbm.booster_.model_to_string(), count=1)
    with pytest.raises(ArtifactError, match="child index is out of range"):
        load_artifact(text.encode())


def _xgboost_json(xgb: xgboost.XGBClassifier, edit: Callable[[dict[str, Any]], None]) -> bytes:
    doc = json.loads(bytes(xgb.get_booster().save_raw("json")))
    edit(doc["learner"]["gradient_booster"]["model"])
    return json.dumps(doc).encode()


def test_xgboost_absurd_num_trees_is_too_large(xgb: xgboost.XGBClassifier) -> None:
    data = _xgboost_json(
        xgb, lambda model: model["gbtree_model_param"].update(num_trees="1000000000")
    )
    with pytest.raises(ArtifactTooLargeError, match="num_trees is 1,000,000,000"):
        load_artifact(data)


def test_xgboost_absurd_num_nodes_is_too_large(xgb: xgboost.XGBClassifier) -> None:
    data = _xgboost_json(
        xgb, lambda model: model["trees"][0]["tree_param"].update(num_nodes="99999999999")
    )
    with pytest.raises(ArtifactTooLargeError, match="num_nodes"):
        load_artifact(data, filename="model.json")


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda tree: tree["left_children"].__setitem__(0, 100000), "out of range"),
        (lambda tree: tree["split_indices"].__setitem__(0, 100000), "split feature 100000"),
        (lambda tree: tree.update(id=5), "does not carry id 0"),
    ],
)
def test_xgboost_crafted_tree_is_refused(
    xgb: xgboost.XGBClassifier, edit: Callable[[dict[str, Any]], None], match: str
) -> None:
    """XGBoost itself loads these and then crashes in predict."""
    data = _xgboost_json(xgb, lambda model: edit(model["trees"][0]))
    with pytest.raises(ArtifactError, match=match):
        load_artifact(data, filename="model.json")


def test_upload_over_the_size_limit_is_too_large(scaler_lr: Pipeline) -> None:
    data = sio.dumps(scaler_lr)
    with pytest.raises(ArtifactTooLargeError, match="model file size"):
        load_artifact(data, limits=ArtifactLimits(max_uncompressed_bytes=len(data) - 1))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"data": b""}, "empty model file"),
        ({"data": b"tree\n", "format": "onnx"}, "unknown model format 'onnx'"),
        ({"data": "tree\n"}, "must be bytes"),
    ],
)
def test_bad_arguments(kwargs: dict[str, Any], match: str) -> None:
    data = kwargs.pop("data")
    with pytest.raises(ArtifactError, match=match):
        load_artifact(data, **kwargs)


# --------------------------------------------------------------------------- the allow-list


def test_trusted_types_cover_the_registry_and_nothing_dangerous() -> None:
    import compiler

    trusted = set(trusted_types())
    for registration in compiler.supported():
        assert f"{registration.cls.__module__}.{registration.cls.__name__}" in trusted
    assert {"sklearn.tree._tree.Tree", "sklearn.utils._bunch.Bunch", "numpy.dtype"} <= trusted
    for dangerous in (
        "builtins.eval",
        "builtins.exec",
        "posix.system",
        "subprocess.Popen",
        "sklearn.neighbors._kd_tree.KDTree",
        "builtins.getattr",
    ):
        assert dangerous not in trusted
