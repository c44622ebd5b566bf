from pathlib import Path

import pytest

from service.cli import main


def test_demo_compiles_scores_and_checks_parity(tmp_path: Path, capsys) -> None:
    assert main(["demo", "--max-batch", "16", "--cache-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "5 compiled" in out and "labels agree: True" in out
    assert main(["demo", "--max-batch", "16", "--cache-dir", str(tmp_path)]) == 0
    assert "0 compiled" in capsys.readouterr().out  # the second run loads every bucket


def test_unknown_command_exits_with_usage() -> None:
    with pytest.raises(SystemExit) as info:
        main(["nope"])
    assert info.value.code == 2
