"""Architecture checks: import direction and where backend libraries may be imported."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BACKEND_LIBRARIES = frozenset({"jax", "jaxlib", "torch"})
# The only place jax / torch may be imported from.
BACKENDS_DIR = ROOT / "lazy" / "backends"


def test_import_contracts_hold() -> None:
    lint_imports = Path(sys.executable).parent / "lint-imports"
    result = subprocess.run(
        [str(lint_imports)], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _imported_top_levels(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
    return found


def test_backend_libraries_only_imported_in_lazy_backends() -> None:
    offenders = []
    for package in ("compiler", "lazy"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.is_relative_to(BACKENDS_DIR):
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            offenders += [
                f"{path.relative_to(ROOT)}:{lineno}: imports {name}"
                for lineno, name in _imported_top_levels(tree)
                if name in BACKEND_LIBRARIES
            ]
    assert not offenders, "jax/torch imported outside lazy/backends/:\n" + "\n".join(offenders)
