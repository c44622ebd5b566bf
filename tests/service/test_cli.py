from pathlib import Path

import pytest

from service.cli import main


def test_demo_compiles_scores_and_checks_parity(tmp_path: Path, capsys) -> None:
    assert main(["demo", "--max-batch", "16", "--cache-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    # Buckets 1..16, and 32..256 for larger calls: the iris graph's rows are cheap (call_rows).
    assert "buckets: [1, 2, 4, 8, 16, 32, 64, 128, 256]" in out
    assert "9 compiled" in out and "labels agree: True" in out
    assert main(["demo", "--max-batch", "16", "--cache-dir", str(tmp_path)]) == 0
    assert "0 compiled" in capsys.readouterr().out  # the second run loads every bucket


def test_unknown_command_exits_with_usage() -> None:
    with pytest.raises(SystemExit) as info:
        main(["nope"])
    assert info.value.code == 2


def test_compile_times_every_bucket_and_checks_parity(tmp_path: Path, capsys) -> None:
    import numpy as np
    import skops.io as sio
    from sklearn.ensemble import RandomForestRegressor

    x = np.random.default_rng(0).normal(size=(60, 3))
    path = tmp_path / "forest.skops"
    path.write_bytes(sio.dumps(RandomForestRegressor(n_estimators=3, max_depth=3).fit(x, x[:, 0])))
    assert main(["compile", str(path), "--max-batch", "8", "--cache-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert (
        "RandomForestRegressor" in out and "parity with the source on 64 synthetic rows and " in out
    )
    # Buckets 1..8, and 16..128 for larger calls (a 3-tree forest's rows are cheap: call_rows).
    assert "8 compiled" in out
    assert main(["compile", str(path), "--max-batch", "8", "--cache-dir", str(tmp_path)]) == 0
    assert "0 compiled, 8 loaded from disk" in capsys.readouterr().out


def test_compile_refuses_a_pickle_unless_told(tmp_path: Path, capsys) -> None:
    import pickle

    from sklearn.preprocessing import StandardScaler

    path = tmp_path / "m.pkl"
    path.write_bytes(pickle.dumps(StandardScaler().fit([[1.0], [2.0]])))
    assert main(["compile", str(path)]) == 1
    assert "pickle" in capsys.readouterr().out.lower()
    assert main(["compile", str(path), "--max-batch", "2", "--allow-pickle"]) == 0


def test_register_uploads_to_a_running_server(tmp_path: Path, capsys) -> None:
    import numpy as np
    import orjson
    import skops.io as sio
    from sklearn.linear_model import LinearRegression

    from tests.service.live import ADMIN_TOKEN, LiveServer

    x = np.random.default_rng(0).normal(size=(30, 2))
    path = tmp_path / "lin.skops"
    path.write_bytes(sio.dumps(LinearRegression().fit(x, x.sum(axis=1))))
    live = LiveServer(tmp_path).start()
    try:
        args = [
            "register",
            str(path),
            "--name",
            "lin",
            "--url",
            live.url,
            "--options",
            '{"max_batch": 4}',
        ]
        assert main([*args, "--token", "wrong"]) == 1
        capsys.readouterr()
        assert main([*args, "--token", ADMIN_TOKEN]) == 0
        doc = orjson.loads(capsys.readouterr().out)
        assert doc["state"] == "READY" and doc["version"] == "1"
    finally:
        live.stop()


def _host_step_skops(tmp_path: Path) -> Path:
    """A skops pipeline whose FunctionTransformer and custom class live in a module of the
    operator's (``tests.service.host_step_functions``)."""
    import numpy as np
    import skops.io as sio
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import FunctionTransformer, StandardScaler

    from tests.service import host_step_functions as trusted

    x = np.round(np.random.default_rng(3).normal(size=(120, 3)), 1)
    y = np.where(x[:, 0] - x[:, 2] > 0, "up", "down")
    steps = (StandardScaler(), trusted.Clipper(), FunctionTransformer(trusted.with_ranks))
    path = tmp_path / "ranks.skops"
    path.write_bytes(sio.dumps(make_pipeline(*steps, LogisticRegression()).fit(x, y)))
    return path


def test_compile_runs_host_steps_of_the_modules_the_setting_trusts(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    """``kestrel compile`` honours KESTREL_HOST_STEP_MODULES as the service does: the trusted
    module's function and class load and run as host steps."""
    path = _host_step_skops(tmp_path)
    monkeypatch.setenv("KESTREL_HOST_STEP_MODULES", "tests.service.host_step_functions")
    assert main(["compile", str(path), "--max-batch", "4"]) == 0
    out = capsys.readouterr().out
    rows = {
        line.split("│")[2].strip(): line.split("│")[3].strip()
        for line in out.splitlines()
        if line.count("│") >= 5
    }
    assert rows["Clipper"] == "host" and rows["FunctionTransformer"] == "host"
    assert rows["StandardScaler"] == "device" and rows["LogisticRegression"] == "device"
    assert "parity with the source on" in out and ": ok" in out


@pytest.mark.parametrize("modules", [None, "json"], ids=["unset", "another module"])
def test_compile_refuses_host_steps_of_untrusted_modules_naming_the_setting(
    tmp_path: Path, capsys, monkeypatch, modules: str | None
) -> None:
    path = _host_step_skops(tmp_path)
    if modules is None:
        monkeypatch.delenv("KESTREL_HOST_STEP_MODULES", raising=False)
    else:
        monkeypatch.setenv("KESTREL_HOST_STEP_MODULES", modules)
    assert main(["compile", str(path), "--max-batch", "4"]) == 1
    out = " ".join(capsys.readouterr().out.split())  # unwrapped
    assert "tests.service.host_step_functions.with_ranks" in out
    assert "KESTREL_HOST_STEP_MODULES" in out


def test_compile_of_a_pickle_names_the_setting_when_a_step_needs_the_host(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    """A pickle loads (--allow-pickle), but host steps stay off without trusted modules, as in
    the service: the refusal says which setting turns them on."""
    import pickle

    import numpy as np
    from sklearn.linear_model import LinearRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import FunctionTransformer

    from tests.service import host_step_functions as trusted

    x = np.random.default_rng(0).normal(size=(40, 2))
    model = make_pipeline(FunctionTransformer(trusted.with_ranks), LinearRegression())
    path = tmp_path / "ranks.pkl"
    path.write_bytes(pickle.dumps(model.fit(x, x[:, 0])))
    monkeypatch.delenv("KESTREL_HOST_STEP_MODULES", raising=False)
    assert main(["compile", str(path), "--allow-pickle", "--max-batch", "2"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "FunctionTransformer" in out and "KESTREL_HOST_STEP_MODULES" in out
    monkeypatch.setenv("KESTREL_HOST_STEP_MODULES", "tests.service.host_step_functions")
    assert main(["compile", str(path), "--allow-pickle", "--max-batch", "2"]) == 0
