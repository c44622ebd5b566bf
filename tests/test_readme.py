"""The README's example must run as written."""

import re
from pathlib import Path


def test_readme_python_example_runs() -> None:
    text = (Path(__file__).parents[1] / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "the README lost its example"
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {})
