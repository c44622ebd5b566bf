"""The README's two commands, run as a newcomer runs them: in a fresh clone of this repository,
with a new virtual environment and a scratch HOME (no pip cache, no configuration of ours).

``make run`` must install what serving needs and serve the demo model, and the README's curl
must get the first answer from it. ``make test`` must then install everything its tests need
(Python packages and system tools, through the project's own scripts) and pass; here it runs
one test file of the suite (``PYTEST_ARGS``): CI's own ``.ci/run`` is the whole suite from a
clean clone. Minutes (downloads), so marked slow.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import httpx
import orjson
import pytest

from tests.service.live import free_port
from tests.service.test_readme_curl import readme_curl

ROOT = Path(__file__).resolve().parents[1]
INSTALL_S = 1200  # a fresh venv from an empty pip cache

pytestmark = pytest.mark.slow


def quick_start() -> list[str]:
    """The commands of the README's quick start, without their comments."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quick start", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, flags=re.S)
    assert block, "the README's quick start lost its commands"
    return [line.split("#", 1)[0].strip() for line in block.group(1).splitlines() if line.strip()]


def newcomer_env(home: Path, port: int) -> dict[str, str]:
    """The environment of a new shell: a scratch HOME, no virtual environment of ours."""
    keep = ("PATH", "LANG", "LC_ALL", "TERM", "TMPDIR")
    env = {k: v for k, v in os.environ.items() if k in keep}
    venv_bin = str(Path(os.environ.get("VIRTUAL_ENV", ROOT / ".venv")) / "bin")
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if p != venv_bin)
    env.update(HOME=str(home), KESTREL_PORT=str(port), PYTHONDONTWRITEBYTECODE="1")
    return env


def test_the_readme_commands_work_from_a_fresh_clone(tmp_path: Path) -> None:
    assert quick_start() == ["make run", "make test"]
    clone, home = tmp_path / "kestrel", tmp_path / "home"
    home.mkdir()
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=120)
    port = free_port()
    env = newcomer_env(home, port)

    log = (tmp_path / "make-run.log").open("wb")
    server = subprocess.Popen(
        ["make", "run"], cwd=clone, env=env, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + INSTALL_S
        while True:
            assert server.poll() is None, (tmp_path / "make-run.log").read_text()[-5000:]
            assert time.monotonic() < deadline, "make run served nothing in time"
            try:
                if httpx.get(f"{url}/v2/models/iris/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(1)
        installed = (clone / ".venv/bin/python").exists() and not (
            clone / ".venv/bin/pytest"
        ).exists()
        assert installed, "make run installed the test tools too"
        command = readme_curl().replace("127.0.0.1:8000", f"127.0.0.1:{port}")
        done = subprocess.run(["bash", "-c", command], capture_output=True, timeout=60)
        assert done.returncode == 0, done.stderr
        answer = orjson.loads(done.stdout)
        assert answer["model"] == "iris" and answer["outputs"]["predict"] == ["setosa"]
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(60)
        log.close()

    tests = subprocess.run(
        ["make", "test", "PYTEST_ARGS=tests/service/test_readme_curl.py"],
        cwd=clone, env=env, capture_output=True, text=True, timeout=INSTALL_S,
    )  # fmt: skip
    assert tests.returncode == 0, (tests.stdout + tests.stderr)[-5000:]
    assert re.search(r"\b2 passed\b", tests.stdout), tests.stdout[-2000:]
