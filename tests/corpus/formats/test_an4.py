from __future__ import annotations

from pathlib import Path

import pytest

from privasr.corpus.formats.an4 import read_an4

from ._helpers import expect_error


def test_fixture(test_data: Path) -> None:
    recs = read_an4(test_data / "formats" / "an4_test.transcription")
    assert [(r.utt_id, r.words, r.speaker, r.client, r.order) for r in recs] == [
        ("an407-fcaw-b", ("ERASE", "C", "Q"), "fcaw", "fcaw", 1),
        ("an251-fash-b", ("YES",), "fash", "fash", 2),
        ("an253-fash-b", ("GO",), "fash", "fash", 3),
    ]


def test_malformed(tmp_path: Path) -> None:
    p = tmp_path / "x.transcription"
    p.write_text("A (an1-x-b)\nB (an1-x-b)\n")
    expect_error(read_an4, p, 2, "duplicate")
    p.write_text("A (an1-x-b)\nB (a b)\n")
    expect_error(read_an4, p, 2, "invalid utterance id")


@pytest.mark.shared
def test_real(shared_data: Path) -> None:
    train = read_an4(shared_data / "an4" / "etc" / "an4_train.transcription")
    test = read_an4(shared_data / "an4" / "etc" / "an4_test.transcription")
    assert len(train) == 948 and len({r.speaker for r in train}) == 74
    assert len(test) == 130 and len({r.speaker for r in test}) == 10
