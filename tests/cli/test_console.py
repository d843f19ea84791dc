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


def test_tables_off_a_terminal_print_one_fact_per_line(tmp_path: Path, capsys) -> None:
    ref, hyp = tmp_path / "ref.trn", tmp_path / "hyp.trn"
    ref.write_text("a b c d (s1_1)\nb c (s1_2)\n")
    hyp.write_text("a x c d (s1_1)\nb c e (s1_2)\n")
    assert main(["score", "wer", str(ref), str(hyp)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "reference words count: 6" in lines
    assert "substitutions count: 1" in lines and "substitutions % of ref words: 16.67%" in lines
    assert "WER % of ref words: 33.33%" in lines
    assert not any(ch in "".join(lines) for ch in "│┃━─")  # no box drawing in a pipe
    assert main(["score", "compare", str(ref), str(hyp), str(ref)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert any(line.startswith("bootstrap 95% CI of WER(A) - WER(B)") and line.endswith("points") for line in out)
    assert "WER A: 33.33%  (2 / 6)" in out
