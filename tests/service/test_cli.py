from __future__ import annotations

import argparse
import re
import socket
import subprocess
import time
import typing
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from service.cli import build_parser, main
from tests.service.live import ADMIN_TOKEN, LiveServer, free_port


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """One real ``kestrel serve`` for every registration test of this module."""
    live = LiveServer(tmp_path_factory.mktemp("cli-server")).start()
    try:
        yield live
    finally:
        live.stop()


def _forest(path: Path, seed: int = 0) -> Path:
    """A small forest regressor as .skops; ``seed``: a different model (nothing cached)."""
    import numpy as np
    import skops.io as sio
    from sklearn.ensemble import RandomForestRegressor

    x = np.random.default_rng(seed).normal(size=(60, 3))
    model = RandomForestRegressor(n_estimators=3, max_depth=3, random_state=seed)
    path.write_bytes(sio.dumps(model.fit(x, x[:, 0])))
    return path


def _shop_model(tmp_path: Path) -> tuple[Path, Path]:
    """A DataFrame pipeline with a categorical column (.skops), and a sample of its rows."""
    import pandas as pd
    import skops.io as sio
    from sklearn.compose import make_column_transformer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder

    frame = pd.DataFrame(
        {"colour": ["red", "blue", "green", "blue"] * 10, "size": [float(i % 7) for i in range(40)]}
    )
    y = (frame["size"] > 3).astype(int)
    encode = make_column_transformer((OneHotEncoder(), ["colour"]), remainder="passthrough")
    model = make_pipeline(encode, LogisticRegression()).fit(frame, y)
    path = tmp_path / "shop.skops"
    path.write_bytes(sio.dumps(model))
    sample = tmp_path / "sample.json"
    sample.write_bytes(orjson.dumps(frame.head(5).to_dict(orient="records")))
    return path, sample


def _one_error_line(captured: pytest.CaptureResult[str]) -> str:
    """The command failed the way a user should see: one line on stderr, nothing on stdout."""
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert "Traceback" not in captured.out + captured.err
    assert captured.out == "", captured.out
    error = [line for line in lines if line.startswith("kestrel ")]
    assert len(error) == 1, lines
    return error[0]


# -- demo and compile ----------------------------------------------------------------------------
def test_demo_compiles_scores_and_checks_parity(tmp_path: Path, capsys) -> None:
    assert main(["demo", "--max-batch", "16", "--cache-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    # --max-batch is the largest bucket, and the counts say where each runs and what compiled.
    assert "buckets: [1, 2, 4, 8, 16]" in out
    found = re.search(r"compile \+ warm 5 buckets .* (\d) on the host, (\d) compiled", out)
    assert found, out
    on_host, compiled = map(int, found.groups())
    assert on_host <= 5 and compiled >= 5 - on_host  # every device bucket was compiled
    assert "labels agree: True" in out
    assert main(["demo", "--max-batch", "16", "--cache-dir", str(tmp_path)]) == 0
    assert "0 compiled" in capsys.readouterr().out  # the second run loads every bucket


def test_unknown_command_exits_with_one_line_of_usage(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["nope"])
    assert info.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "invalid choice: 'nope'" in line and "kestrel -h" in line


def test_every_option_of_every_command_has_help() -> None:
    def actions(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.Action]]:
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            yield parser.prog, action
            if isinstance(action, argparse._SubParsersAction):
                for command in action._choices_actions:  # each command's one-line help
                    yield parser.prog, command
                for sub in action.choices.values():
                    yield from actions(sub)

    found = list(actions(build_parser()))
    missing = [f"{prog} {a.option_strings or a.dest}" for prog, a in found if not a.help]
    assert not missing
    assert {p for p, _ in found} >= {f"kestrel {c}" for c in ("serve", "register", "compile")}


def test_compile_max_batch_is_the_largest_bucket_and_a_rerun_loads_them(
    tmp_path: Path, capsys
) -> None:
    path = _forest(tmp_path / "forest.skops")
    args = ["compile", str(path), "--max-batch", "64", "--cache-dir", str(tmp_path / "cache")]
    assert main(args) == 0
    captured = capsys.readouterr()
    assert "RandomForestRegressor" in captured.out
    assert "parity with the source on 64 synthetic rows and " in captured.out
    found = re.search(
        r"7 buckets: (\d) on the host, (\d) compiled, 0 loaded from disk", captured.out
    )
    assert found, captured.out
    on_host, compiled = map(int, found.groups())
    assert compiled >= 7 - on_host  # every device bucket was compiled
    # Progress went to stderr, one plain line a phase (stderr is not a terminal here).
    assert captured.err.splitlines() == ["compile + warm-up: 7 buckets", "parity check"]

    assert main([*args, "--json"]) == 0
    report = orjson.loads(capsys.readouterr().out)
    assert [b["bucket"] for b in report["buckets"]] == [1, 2, 4, 8, 16, 32, 64]
    on_device = [b for b in report["buckets"] if b["runs_on"] == "device"]
    assert report["on_host"] == 7 - len(on_device)
    assert all(b["reason"] for b in report["buckets"])
    # The rerun measured again, from executables on disk: nothing compiled.
    assert report["compiled"] == 0 and report["loaded_from_disk"] >= len(on_device)
    assert report["estimator"] == "RandomForestRegressor" and report["parity"]["ok"]


def test_compile_takes_a_sample_with_missing_values(tmp_path: Path, capsys) -> None:
    """Real rows have NaN: --sample reads them as the server's ``sample`` field does."""
    import numpy as np
    import skops.io as sio
    from sklearn.impute import SimpleImputer
    from sklearn.linear_model import LinearRegression
    from sklearn.pipeline import make_pipeline

    x = np.random.default_rng(0).normal(size=(50, 2))
    model = make_pipeline(SimpleImputer(), LinearRegression()).fit(x, x[:, 0])
    (path := tmp_path / "imputed.skops").write_bytes(sio.dumps(model))
    (sample := tmp_path / "sample.json").write_text("[[NaN, 1.5], [0.25, NaN], [1, 2]]")
    args = ["compile", str(path), "--sample", str(sample), "--max-batch", "4", "--json"]
    assert main([*args, "--cache-dir", str(tmp_path / "cache")]) == 0
    assert orjson.loads(capsys.readouterr().out)["parity"]["ok"]


def test_compile_refuses_a_pickle_unless_told(tmp_path: Path, capsys) -> None:
    import pickle

    from sklearn.preprocessing import StandardScaler

    path = tmp_path / "m.pkl"
    path.write_bytes(pickle.dumps(StandardScaler().fit([[1.0], [2.0]])))
    assert main(["compile", str(path)]) == 1
    assert "pickle" in _one_error_line(capsys.readouterr()).lower()
    assert main(["compile", str(path), "--max-batch", "2", "--allow-pickle"]) == 0


def test_compile_of_an_unsupported_model_is_one_line(tmp_path: Path, capsys) -> None:
    import numpy as np
    import skops.io as sio
    from sklearn.dummy import DummyRegressor

    path = tmp_path / "dummy.skops"
    path.write_bytes(sio.dumps(DummyRegressor().fit(np.zeros((3, 2)), [1.0, 2.0, 3.0])))
    assert main(["compile", str(path)]) == 1
    line = _one_error_line(capsys.readouterr())
    assert "unsupported model type sklearn.dummy.DummyRegressor" in line


def test_compile_input_errors_are_one_line_naming_the_file_or_option(
    tmp_path: Path, capsys
) -> None:
    model = _forest(tmp_path / "forest.skops")
    assert main(["compile", str(tmp_path / "missing.skops")]) == 1
    assert "missing.skops: No such file or directory" in _one_error_line(capsys.readouterr())
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["compile", str(model), "--sample", str(bad)]) == 1
    assert f"--sample {bad} is not valid JSON" in _one_error_line(capsys.readouterr())
    with pytest.raises(SystemExit) as info:
        main(["compile", str(model), "--max-batch", "0"])
    assert info.value.code == 2
    assert "--max-batch: must be a positive integer" in capsys.readouterr().err


# -- register ------------------------------------------------------------------------------------
def test_register_follows_the_load_and_prints_a_curl_that_scores(
    server: LiveServer, tmp_path: Path, capsys
) -> None:
    path, sample = _shop_model(tmp_path)
    args = ["register", str(path), "--name", "shop", "--url", server.url, "--sample", str(sample)]
    args += ["--options", '{"max_batch": 4}']
    assert main([*args, "--token", "wrong"]) == 1
    assert "answered 403 Forbidden" in _one_error_line(capsys.readouterr())

    assert main([*args, "--token", ADMIN_TOKEN]) == 0
    captured = capsys.readouterr()
    assert captured.err.splitlines()[0].startswith("upload: ")  # plain progress lines
    # The compile phase shows with its bucket count (after the fact where the load outran the
    # polls).
    assert any(line.startswith("compile + warm-up") for line in captured.err.splitlines())
    lines = captured.out.splitlines()
    assert lines[0].startswith("model 'shop' version 1 is READY")
    described = server.client.get("/models/shop/versions/1", headers=server.admin).json()
    buckets = described["buckets"]
    assert f"  buckets: {len(buckets)} ({', '.join(map(str, buckets))} rows)" in lines
    assert any(line.startswith("  parity:  ok on 5 sample rows and ") for line in lines)
    assert lines[-2] == "score it:"
    curl = lines[-1].strip()
    assert curl.startswith(f"curl -sS {server.url}/models/shop/predict ")
    done = subprocess.run(["bash", "-c", curl], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    answer = orjson.loads(done.stdout)
    assert answer["model"] == "shop" and answer["rows"] == 1 and len(answer["outputs"]["predict"])


def test_register_json_prints_the_version_description(
    server: LiveServer, tmp_path: Path, capsys
) -> None:
    path = _forest(tmp_path / "forest.skops", seed=1)
    args = ["register", str(path), "--name", "lin", "--url", server.url, "--token", ADMIN_TOKEN]
    assert main([*args, "--options", '{"max_batch": 4}', "--json"]) == 0
    captured = capsys.readouterr()
    doc = orjson.loads(captured.out)
    assert doc["name"] == "lin" and doc["version"] == "1" and doc["state"] == "READY"
    assert doc["buckets"] == [1, 2, 4] and doc["parity"]["ok"]  # max_batch is the top bucket
    assert [c["name"] for c in doc["schema"]["columns"]] == ["x0", "x1", "x2"]
    assert "progress" not in doc  # only while LOADING
    assert "{" not in captured.err  # the document went to stdout only

    assert main([*args, "--no-wait", "--json"]) == 0
    accepted = orjson.loads(capsys.readouterr().out)
    assert accepted["version"] == "2" and accepted["state"] == "LOADING"
    assert accepted["progress"]["phase"] in ("queued", "compiling")


def test_a_loading_version_reports_its_progress(server: LiveServer, tmp_path: Path) -> None:
    """GET of a LOADING version says what it does: queued, then each bucket compiled and
    warmed up (done of total), parity, storing; the CLI's progress display follows this."""
    from service import openapi
    from service.versions import Phase

    assert typing.get_args(openapi.LoadProgress.model_fields["phase"].annotation) == tuple(Phase)
    data = _forest(tmp_path / "forest.skops", seed=2).read_bytes()
    accepted = server.register("watched", data, options='{"max_batch": 256}', wait=False)
    assert accepted.status_code == 202, accepted.text
    location = accepted.headers["Location"]
    seen = [accepted.json()["progress"]]
    while (doc := server.client.get(location, headers=server.admin).json())["state"] == "LOADING":
        seen.append(doc["progress"])
        time.sleep(0.02)
    assert doc["state"] == "READY" and "progress" not in doc
    assert seen[0]["phase"] in ("queued", "compiling")  # the loader may have started already
    order = [p.value for p in Phase]
    assert [order.index(p["phase"]) for p in seen] == sorted(order.index(p["phase"]) for p in seen)
    compiling = [p for p in seen if p["phase"] == "compiling" and p["buckets_total"] is not None]
    assert compiling, seen  # compiling a fresh model's buckets takes many polls
    assert {p["buckets_total"] for p in compiling} == {len(doc["buckets"])}
    done = [p["buckets_done"] for p in compiling]
    assert done == sorted(done) and all(0 <= d <= len(doc["buckets"]) for d in done)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["{missing}"], ["missing.skops: No such file or directory"]),
        (["{model}", "--options", "{max_batch: 4}"], ["--options is not valid JSON"]),
        (["{model}", "--sample", "{bad_json}"], ["--sample", "bad.json is not valid JSON"]),
        (["{model}", "--sample", "{missing}"], ["--sample: cannot read", "missing.skops"]),
        (["{model}", "--url", "localhost:8000"], ["must start with http:// or https://"]),
        (  # the server's message, which names the field
            ["{model}", "--url", "{server}", "--options", '{"max_batch": 0}'],
            ["answered 422 Unprocessable Entity: ", "'options'"],
        ),
        (["{model}", "--url", "{server}", "--format", "onnx"], ["answered 4", "onnx"]),
    ],
    ids=[
        "missing file",
        "bad options",
        "bad sample",
        "missing sample",
        "url without scheme",
        "bad option value",
        "unknown format",
    ],
)
def test_register_errors_are_one_line(
    server: LiveServer, tmp_path: Path, capsys, argv: list[str], expected: list[str]
) -> None:
    names = {
        "missing": tmp_path / "missing.skops",
        "model": _forest(tmp_path / "forest.skops"),
        "bad_json": tmp_path / "bad.json",
        "server": server.url,
    }
    names["bad_json"].write_text("[{oops")
    args = [str(names.get(arg.strip("{}"), arg)) for arg in argv]
    assert main(["register", *args, "--name", "err", "--token", ADMIN_TOKEN]) == 1
    line = _one_error_line(capsys.readouterr())
    assert all(part in line for part in expected), line


def test_register_with_no_server_names_the_url_and_kestrel_serve(tmp_path: Path, capsys) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    path = _forest(tmp_path / "forest.skops")
    assert main(["register", str(path), "--name", "m", "--url", url]) == 1
    line = _one_error_line(capsys.readouterr())
    assert f"cannot reach a Kestrel server at {url}" in line and "kestrel serve" in line


def test_register_gives_up_at_the_timeout(tmp_path: Path, capsys) -> None:
    """A server that takes the connection but never answers: --timeout ends the wait."""
    path = _forest(tmp_path / "forest.skops")
    with socket.create_server(("127.0.0.1", 0)) as silent:  # listens, never accepts
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        assert main(["register", str(path), "--name", "m", "--url", url, "--timeout", "0.5"]) == 1
    line = _one_error_line(capsys.readouterr())
    assert f"{url} did not answer within 0.5 s (--timeout)" in line


# -- host steps ----------------------------------------------------------------------------------
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
    line = _one_error_line(capsys.readouterr())
    assert "tests.service.host_step_functions.with_ranks" in line
    assert "KESTREL_HOST_STEP_MODULES" in line


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
    line = _one_error_line(capsys.readouterr())
    assert "FunctionTransformer" in line and "KESTREL_HOST_STEP_MODULES" in line
    monkeypatch.setenv("KESTREL_HOST_STEP_MODULES", "tests.service.host_step_functions")
    assert main(["compile", str(path), "--allow-pickle", "--max-batch", "2"]) == 0


def test_promote_and_rollback_move_what_serves(server: LiveServer, tmp_path: Path, capsys) -> None:
    token = ["--url", server.url, "--token", ADMIN_TOKEN]
    for seed in (1, 2):
        path = _forest(tmp_path / f"forest-{seed}.skops", seed=100 + seed)
        assert main(["register", str(path), "--name", "moved", *token, "--json"]) == 0
    capsys.readouterr()
    assert main(["promote", "moved", "1", *token, "--actor", "ci"]) == 0
    assert capsys.readouterr().out == "model 'moved': version 1 serves now (was 2)\n"
    assert main(["promote", "moved", "1", *token]) == 0
    assert "serves already" in capsys.readouterr().out
    assert main(["rollback", "moved", *token]) == 0
    assert capsys.readouterr().out == "model 'moved': version 2 serves now (was 1)\n"
    history = server.client.get("/models/moved", headers=server.admin).json()["history"]
    assert [(c["action"], c["by"]) for c in history][-2:] == [
        ("promote", "ci"),
        ("rollback", "client 127.0.0.1"),
    ]
    assert main(["promote", "moved", "9", *token]) == 1
    assert "404 Not Found: model 'moved' has no version '9'" in _one_error_line(capsys.readouterr())
