"""The README's examples that talk to a server, the curl line and the gRPC client, run as written
against ``kestrel serve --demo`` (what make run starts)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import orjson

from tests.service.live import ROOT, LiveServer
from tests.test_readme import SERVER_EXAMPLE, python_blocks


def readme_curl() -> str:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```sh\n(.*?)```", text, flags=re.S)
    curls = [b for b in blocks if b.lstrip().startswith("curl")]
    assert len(curls) == 1, "the README shows one curl example"
    return curls[0]


def test_make_run_uses_the_demo_server() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert "kestrel serve --demo" in makefile


def test_readme_server_examples_work_as_written(tmp_path: Path) -> None:
    assert shutil.which("curl"), "the README's example needs curl on the PATH"
    live = LiveServer(tmp_path, grpc=True, KESTREL_DEMO_MODEL="true")
    live.start()
    try:
        for _ in range(600):  # the demo registers after recovery; READY within seconds
            if live.client.get("/v2/models/iris/ready").status_code == 200:
                break
            import time

            time.sleep(0.1)
        command = readme_curl().replace("127.0.0.1:8000", f"127.0.0.1:{live.port}")
        done = subprocess.run(["bash", "-c", command], capture_output=True, timeout=60)
        assert done.returncode == 0, done.stderr
        answer = orjson.loads(done.stdout)
        assert answer["model"] == "iris" and answer["outputs"]["predict"] == ["setosa"]
        assert abs(sum(answer["outputs"]["predict_proba"][0]) - 1) < 1e-5
        # The gRPC example, on this server's gRPC port.
        (example,) = [b for b in python_blocks() if SERVER_EXAMPLE in b]
        assert live.grpc_address is not None
        exec(compile(example.replace(SERVER_EXAMPLE, live.grpc_address), "README.md", "exec"), {})
    finally:
        live.stop()
