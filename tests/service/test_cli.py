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
        "RandomForestRegressor" in out and "parity with the source on 64 synthetic rows: ok" in out
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
