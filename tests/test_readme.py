"""The README's examples must run as written: here those that need no server; the ones that
talk to `make run`'s server (the curl line, the gRPC client) run against a live one in
tests/service/test_readme_curl.py."""

import re
from pathlib import Path

#: A python block that connects to the demo server on its default gRPC port.
SERVER_EXAMPLE = "127.0.0.1:8081"


def python_blocks() -> list[str]:
    text = (Path(__file__).parents[1] / "README.md").read_text()
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_readme_python_example_runs() -> None:
    blocks = [b for b in python_blocks() if SERVER_EXAMPLE not in b]
    assert blocks, "the README lost its example"
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {})
