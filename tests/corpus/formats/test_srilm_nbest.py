from __future__ import annotations

import math
from pathlib import Path

import pytest

from privasr.corpus.formats.srilm_nbest import (
    BYTELOG_TO_LN,
    LOG10_TO_LN,
    read_srilm_file,
    read_srilm_nbest,
    write_srilm_nbest,
)
from privasr.corpus.records import Hypothesis, NBest
from privasr.errors import InputError

from ._helpers import expect_error


def test_format1(test_data: Path) -> None:
    nb = read_srilm_file(test_data / "formats" / "srilm" / "utt1")
    assert nb.utt_id == "utt1" and [h.text for h in nb] == ["hello world", "hello word"]
    assert nb.best.scores["total"] == pytest.approx(-1024 * 1024 * math.log(1.0001))
    assert nb.meta["srilm_format"] == 1


def test_format2_skips_subword_units(test_data: Path) -> None:
    nb = read_srilm_file(test_data / "formats" / "srilm" / "utt2")
    h = nb.best
    assert h.words == ("hello", "world") and h.times == ((0.0, 0.4), (0.41, 0.9))
    assert h.scores["lm"] == pytest.approx(-30 * BYTELOG_TO_LN) and h.scores["am"] == pytest.approx(-110 * BYTELOG_TO_LN)
    assert h.scores["total"] == pytest.approx(-100 * BYTELOG_TO_LN)


def test_format3(test_data: Path) -> None:
    nb = read_srilm_file(test_data / "formats" / "srilm" / "utt3")
    assert nb.best.scores["am"] == pytest.approx(-100.5 * LOG10_TO_LN)
    assert nb.hyps[1].scores["lm"] == -math.inf and nb.hyps[2].words == ()


def test_folder_and_list(test_data: Path) -> None:
    d = test_data / "formats"
    assert [nb.utt_id for nb in read_srilm_nbest(d / "srilm")] == ["utt1", "utt2", "utt3"]
    assert [nb.utt_id for nb in read_srilm_nbest(d / "srilm.list")] == ["utt1", "utt3"]


def test_round_trip_format3(tmp_path: Path, test_data: Path) -> None:
    recs = [read_srilm_file(test_data / "formats" / "srilm" / "utt3"),
            NBest("u9", (Hypothesis(("a",), scores={"am": -1 / 3, "lm": -2.0}),))]
    assert write_srilm_nbest(tmp_path, recs, suffix=".gz") == 2
    back = sorted(read_srilm_nbest(tmp_path), key=lambda b: b.utt_id != "utt3")
    assert [b.utt_id for b in back] == ["utt3", "u9"]
    for r, b in zip(recs, back, strict=True):
        assert [h.words for h in r] == [h.words for h in b]
        for hr, hb in zip(r, b, strict=True):
            assert hb.scores["am"] == pytest.approx(hr.scores["am"], rel=1e-15)
            assert hb.scores["lm"] == pytest.approx(hr.scores["lm"], rel=1e-15)


def test_writer_needs_scores(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="lacks an 'am' or 'lm'"):
        write_srilm_nbest(tmp_path, [NBest("u", (Hypothesis(("a",)),))])


@pytest.mark.parametrize(
    ("text", "line", "needle"),
    [
        ("-1 -2 2 a\n", 1, "nwords"),
        ("-1 -2 1 a\n-1 x 1 a\n", 2, "LM score"),
        ("NBestList1.0\n-5 a b\n", 2, "parentheses"),
        ("NBestList2.0\n(-5) a ( st: 0 et: 1 g: 0 a: 0\n", 2, "11 fields"),
        ("NBestList2.0\n(-5) a ( st: 0 et: 1 g: 0 b: 0 )\n", 2, "malformed"),
        ("-1 -2 1 a\n-1 nan 1 a\n", 2, "LM score"),
    ],
)
def test_malformed(tmp_path: Path, text: str, line: int, needle: str) -> None:
    p = tmp_path / "u"
    p.write_text(text)
    expect_error(read_srilm_file, p, line, needle)


def test_list_with_missing_file(tmp_path: Path) -> None:
    p = tmp_path / "list"
    p.write_text("nothere\n")
    expect_error(read_srilm_nbest, p, 1, "neither")
