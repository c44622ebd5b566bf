"""``python -m compiler.docs``: the operator reference (docs/operators.md), from the registry."""

from __future__ import annotations

import sys
from collections import defaultdict

from .registry import Registration, supported

_HEADER = """# Supported operators

Generated from the converter registry by `python -m compiler.docs > docs/operators.md`; a test
fails when this file is stale. Every class listed here is enrolled in the conformance suite
(`tests/compiler/test_conformance.py`): parity with the source estimator on every method, on the
numpy interpreter and on JAX. Anything not listed raises `UnsupportedError` at compile time, as
does any hyper-parameter a converter cannot reproduce exactly.
"""


def _family(reg: Registration) -> str:
    parts = reg.cls.__module__.split(".")
    return ".".join(p for p in parts[:2] if not p.startswith("_"))


def render() -> str:
    groups: dict[str, list[Registration]] = defaultdict(list)
    for reg in supported():
        groups[_family(reg)].append(reg)
    lines = [_HEADER]
    for family in sorted(groups):
        lines += [f"## `{family}`", "", "| class | methods | limits |", "|---|---|---|"]
        for reg in groups[family]:
            methods = ", ".join(f"`{m}`" for m in reg.methods)
            lines.append(f"| `{reg.name}` | {methods} | {reg.limits or '—'} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(render())
