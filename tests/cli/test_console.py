"""Printed paths survive pipes: no line of the command line's output is wrapped (rich wraps at 80 columns when
stdout is not a terminal)."""

from __future__ import annotations

from pathlib import Path

from privasr.cli import main
from privasr.cli._console import PIPE_WIDTH, make_console


def test_a_long_path_is_printed_whole(tmp_path: Path, capsys) -> None:
    deep = tmp_path / ("a-folder-with-a-rather-long-name-" * 3) / "models"
    deep.mkdir(parents=True)
    text = deep / "t.txt"
    text.write_text("a b c\nb c a\nc a b\na c b\n")
    arpa = deep / "model-with-a-long-name.arpa"
    assert len(str(arpa)) > 100
    assert main(["lm", "train-ngram", "--text", str(text), "-o", "2", "--arpa", str(arpa), "--discount-fallback"]) == 0
    err = capsys.readouterr().err
    assert any(str(arpa) in line for line in err.splitlines()), err


def test_consoles_off_a_terminal_are_wide_and_never_wrap() -> None:
    c = make_console()  # under pytest stdout is not a terminal
    assert c.soft_wrap and c.width == PIPE_WIDTH
