from pathlib import Path

from compiler.docs import render


def test_operator_reference_is_up_to_date() -> None:
    path = Path(__file__).parents[2] / "docs" / "operators.md"
    assert path.read_text() == render(), (
        "docs/operators.md is stale: run `python -m compiler.docs > docs/operators.md`"
    )
