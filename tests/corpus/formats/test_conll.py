from __future__ import annotations

from pathlib import Path

import pytest

from privasr.corpus.formats.conll import read_conll, write_conll
from privasr.corpus.records import Span, Transcript
from privasr.errors import InputError

from ._helpers import expect_error


def test_fixture_iob1(test_data: Path) -> None:
    a, b, c = read_conll(test_data / "formats" / "small.conll")
    assert (a.utt_id, a.client, a.order) == ("doc0000_s0000", "doc0000", 0)
    assert a.entities == (Span(0, 1, "MISC"), Span(3, 6, "ORG"))
    assert b.utt_id == "doc0000_s0001" and b.words[1] == "B-PER"
    assert b.entities == (Span(0, 1, "PER"), Span(1, 2, "PER"), Span(2, 3, "PER"))
    assert (c.client, c.order, c.entities) == ("doc0001", 0, (Span(0, 1, "LOC"),))


def test_round_trip_iob2(tmp_path: Path, test_data: Path) -> None:
    recs = read_conll(test_data / "formats" / "small.conll")
    assert write_conll(tmp_path / "o.conll", recs) == 3
    assert "B-ORG" in (tmp_path / "o.conll").read_text()
    assert read_conll(tmp_path / "o.conll") == recs


def test_extra_columns_kept(tmp_path: Path) -> None:
    p = tmp_path / "c.conll"
    p.write_text("-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP O\n")
    (t,) = read_conll(p)
    assert t.meta["columns"] == (("NNP", "B-NP"), ("VBZ", "B-VP")) and t.entities == (Span(0, 1, "ORG"),)
    write_conll(tmp_path / "o.conll", [t])
    assert read_conll(tmp_path / "o.conll") == [t]


def test_writer_rejects_overlap(tmp_path: Path) -> None:
    t = Transcript("s", ("a", "b"), entities=(Span(0, 2, "X"), Span(1, 2, "Y")))
    with pytest.raises(InputError, match="overlapping"):
        write_conll(tmp_path / "o.conll", [t])


@pytest.mark.parametrize(("text", "line", "needle"), [("a O\nb\n", 2, "1 field"), ("a O\nb Q-PER\n", 2, "IOB"),
                                                       ("a O\n\nb I-\n", 3, "IOB")])
def test_malformed(tmp_path: Path, text: str, line: int, needle: str) -> None:
    p = tmp_path / "b.conll"
    p.write_text(text)
    expect_error(read_conll, p, line, needle)


@pytest.mark.shared
def test_real_wikigold(shared_data: Path, tmp_path: Path) -> None:
    recs = read_conll(shared_data / "ner-wikigold" / "wikigold.conll.txt")
    # SOURCE.txt says 1,841 sentences: that is the number of blank lines (1,696 sentence ends + 145 after
    # -DOCSTART-); the file holds 1,696 sentences.
    assert len(recs) == 1696
    assert sum(len(r) for r in recs) == 39007
    assert len({r.client for r in recs}) == 145
    write_conll(tmp_path / "w.conll", recs)
    assert read_conll(tmp_path / "w.conll") == recs
