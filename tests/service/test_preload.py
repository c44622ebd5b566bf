"""``KESTREL_PRELOAD``: a model file on disk served at start, as KServe's runtime contract needs.

KServe's storage initializer leaves the model under ``/mnt/models`` and the runtime's templated
environment names it; these tests play that part with a directory and real server processes.
"""

from __future__ import annotations

import io
import subprocess
import sys
import time
from pathlib import Path

import httpx
import joblib
import numpy as np
import pandas as pd
import pytest

from service.demo_model import COLUMNS, demo_artifact, demo_pipeline
from service.preload import Preloader, PreloadError, find_model_file
from tests.service.live import ROOT, LiveServer

FAST = {"KESTREL_MAX_BATCH": "8"}  # few buckets to compile: the tests are about start-up


@pytest.fixture(scope="module")
def iris_skops() -> bytes:
    return demo_artifact()[0]


def kserve_dir(root: Path, files: dict[str, bytes]) -> Path:
    """A stand-in for /mnt/models as the storage initializer leaves it."""
    mnt = root / "mnt" / "models"
    mnt.mkdir(parents=True)
    for name, data in files.items():
        (mnt / name).write_bytes(data)
    return mnt


def wait_for_readiness_status(
    live: LiveServer, status: str, timeout: float = 120
) -> httpx.Response:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert live.proc is not None and live.proc.poll() is None, live.logs()
        try:
            r = live.client.get("/readyz")
            if r.json().get("status") == status:
                return r
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"/readyz never said {status!r}:\n{live.logs()}")


# -- resolving the path (no server) ---------------------------------------------------------------
def test_a_directory_yields_its_single_model_file(tmp_path: Path) -> None:
    mnt = kserve_dir(tmp_path, {"model.skops": b"PK", "README.md": b"notes", ".meta.json": b"{}"})
    (mnt / "sub.json").mkdir()  # a directory with a model-like name is not a file
    assert find_model_file(mnt) == mnt / "model.skops"
    assert find_model_file(mnt / "model.skops") == mnt / "model.skops"


def test_bad_paths_are_refused_naming_the_problem(tmp_path: Path) -> None:
    with pytest.raises(PreloadError, match="does not exist"):
        find_model_file(tmp_path / "absent")
    empty = kserve_dir(tmp_path / "a", {"README.md": b"notes"})
    with pytest.raises(PreloadError, match=r"no model file in .*README\.md.*skops"):
        find_model_file(empty)
    two = kserve_dir(tmp_path / "b", {"a.skops": b"PK", "b.txt": b"tree"})
    with pytest.raises(PreloadError, match=r"2 model files .*'a\.skops', 'b\.txt'"):
        find_model_file(two)


def test_the_name_defaults_to_the_directory_or_file_stem(tmp_path: Path) -> None:
    mnt = kserve_dir(tmp_path, {"churn.txt": b"tree"})
    assert Preloader.resolve(mnt, None).name == "models"
    assert Preloader.resolve(mnt / "churn.txt", None).name == "churn"
    assert Preloader.resolve(mnt, "given").name == "given"
    with pytest.raises(PreloadError, match="invalid preloaded model name 'no way'"):
        Preloader.resolve(mnt, "no way")
    odd = kserve_dir(tmp_path / "x", {"my model.skops": b"PK"})
    with pytest.raises(PreloadError, match="set KESTREL_PRELOAD_NAME"):
        Preloader.resolve(odd / "my model.skops", None)


# -- real server processes ------------------------------------------------------------------------
def test_preloaded_model_is_ready_before_readyz_and_not_added_twice(
    tmp_path: Path, iris_skops: bytes
) -> None:
    mnt = kserve_dir(tmp_path, {"model.skops": iris_skops})
    env = {"KESTREL_PRELOAD": str(mnt), "KESTREL_PRELOAD_NAME": "flowers", **FAST}
    live = LiveServer(tmp_path, **env).start()  # returns once /readyz answers 200
    try:
        assert live.client.get("/v2/health/ready").status_code == 200
        assert live.client.get("/v2/models/flowers/ready").status_code == 200
        pipeline, _ = demo_pipeline()
        x = np.array([[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3]])
        body = {
            "inputs": [
                {
                    "name": "input",
                    "shape": list(x.shape),
                    "datatype": "FP64",
                    "data": x.ravel().tolist(),
                }
            ],
            "outputs": [{"name": "predict"}],
        }
        r = live.client.post("/v2/models/flowers/infer", json=body)
        assert r.status_code == 200, r.text
        (out,) = r.json()["outputs"]
        assert out["data"] == pipeline.predict(pd.DataFrame(x, columns=COLUMNS)).tolist()
    finally:
        live.stop()

    again = LiveServer(tmp_path, **env).start()  # same store: a pod's container restarting
    try:
        versions = again.client.get("/models/flowers", headers=again.admin).json()["versions"]
        assert [(v["version"], v["state"]) for v in versions] == [("1", "READY")]
    finally:
        again.stop()


def test_a_model_that_cannot_load_keeps_readiness_failed_with_the_reason(tmp_path: Path) -> None:
    # KServe's sklearn convention is model.joblib: a pickle, refused unless the operator allows it.
    pipeline, _ = demo_pipeline()
    buffer = io.BytesIO()
    joblib.dump(pipeline, buffer)
    mnt = kserve_dir(tmp_path, {"model.joblib": buffer.getvalue()})
    live = LiveServer(tmp_path, KESTREL_PRELOAD=str(mnt), **FAST)
    live.proc = subprocess.Popen(  # LiveServer.start would wait for a readiness that never comes
        [sys.executable, "-m", "service.cli", "serve", "--port", str(live.port)],
        cwd=ROOT,
        env=live.env,
        stdout=live.log_path.open("ab"),
        stderr=subprocess.STDOUT,
    )
    try:
        r = wait_for_readiness_status(live, "failed")
        assert r.status_code == 503, live.logs()
        error = r.json()["error"]
        assert "model.joblib" in error and "KESTREL_ALLOW_PICKLE=true" in error
        assert live.client.get("/healthz").status_code == 200  # alive: no restart loop
        assert live.client.get("/v2/health/ready").status_code == 503
    finally:
        live.stop()


def test_serve_exits_at_once_when_the_path_holds_no_model(tmp_path: Path) -> None:
    mnt = kserve_dir(tmp_path, {"config.yaml": b"x: 1"})
    env = LiveServer(tmp_path).env
    done = subprocess.run(
        [sys.executable, "-m", "service.cli", "serve", "--preload", str(mnt)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert f"cannot preload a model: no model file in '{mnt}'" in done.stderr
