"""docs/architecture.md stays true: every module it names exists, and every module of the three
layers is named there (a file, or the package directory that holds it). docs/design-figures.md
names only modules that exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
FIGURES = ROOT / "docs" / "design-figures.md"
LAYERS = ("lazy", "compiler", "service")


def _named(doc: Path = DOC) -> set[str]:
    return set(re.findall(r"`((?:lazy|compiler|service)/[\w/]*(?:\.py|/))`", doc.read_text()))


def test_every_module_named_exists() -> None:
    for doc in (DOC, FIGURES):
        missing = sorted(path for path in _named(doc) if not (ROOT / path).exists())
        assert not missing, f"{doc.name} names modules that do not exist: {missing}"


def test_every_module_of_the_layers_is_named() -> None:
    named = _named()
    unnamed = []
    for layer in LAYERS:
        for path in sorted((ROOT / layer).iterdir()):
            relative = path.relative_to(ROOT).as_posix()
            if path.is_dir() and (path / "__init__.py").exists():
                if f"{relative}/" not in named:
                    unnamed.append(f"{relative}/")
            elif path.suffix == ".py" and path.name != "__init__.py" and relative not in named:
                unnamed.append(relative)
    assert not unnamed, f"docs/architecture.md does not say where these live: {unnamed}"
