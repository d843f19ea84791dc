from __future__ import annotations

import json
from pathlib import Path

import pytest

from privasr.corpus.formats.hyporadise import read_hyporadise, write_hyporadise
from privasr.errors import InputError

from ._helpers import expect_error


def test_with_ids(test_data: Path) -> None:
    d = test_data / "formats" / "hyporadise"
    a, b = read_hyporadise(d / "small.json", ids=d / "small.ids.txt")
    assert a.utt_id == "1688-142285-0000" and a.speaker == a.client == "1688"
    assert a.meta["chapter"] == "1688-142285" and a.meta["instruction"].startswith("please")
    assert [h.text for h in a] == ["the cat sat", "the cat sat", "a cat sat"]  # duplicates kept
    assert all(not h.scores for h in a)
    assert a.ref == ("the", "cat", "sat") and b.ref == ("hello", "there")
    assert a.order < b.order


def test_without_ids(test_data: Path) -> None:
    recs = read_hyporadise(test_data / "formats" / "hyporadise" / "small.json")
    assert [r.utt_id for r in recs] == ["small-00000", "small-00001"]
    assert [r.order for r in recs] == [0, 1] and recs[0].speaker is None


def test_round_trip(tmp_path: Path, test_data: Path) -> None:
    d = test_data / "formats" / "hyporadise"
    recs = read_hyporadise(d / "small.json", ids=d / "small.ids.txt")
    assert write_hyporadise(tmp_path / "o.json.xz", recs, ids=tmp_path / "o.ids.txt") == 2
    assert read_hyporadise(tmp_path / "o.json.xz", ids=tmp_path / "o.ids.txt") == recs


def test_count_mismatch(tmp_path: Path, test_data: Path) -> None:
    d = test_data / "formats" / "hyporadise"
    (tmp_path / "ids.txt").write_text("a-1-2\n")
    with pytest.raises(InputError, match="2 items but 1 ids"):
        read_hyporadise(d / "small.json", ids=tmp_path / "ids.txt")


def test_item_errors(tmp_path: Path) -> None:
    p = tmp_path / "h.json"
    p.write_text(json.dumps([{"input": ["a"], "output": "a"}, {"input": ["a"], "output": "a"},
                             {"input": ["a", 3], "output": "a"}]))
    err = expect_error(read_hyporadise, p, 3, "item 3", "1-based item number")
    assert "list of strings" in str(err)
    p.write_text('[{"input": ["a"], "output": "a"},\n {"input": ["a"] "output": "a"}]')
    expect_error(read_hyporadise, p, 2, "invalid JSON")
    p.write_text('{"input": []}')
    expect_error(read_hyporadise, p, None, "JSON list")
    p.write_text('[{"input": ["a"]}]')
    expect_error(read_hyporadise, p, 1, "no 'output'")


@pytest.mark.shared
def test_real_librispeech(shared_data: Path) -> None:
    d = shared_data / "librispeech-whisper-5best"
    recs = read_hyporadise(d / "test_ls_other.json.xz", ids=d / "test_ls_other.ids.txt")
    assert len(recs) == 2939
    assert len({r.speaker for r in recs}) == 33 and len({r.meta["chapter"] for r in recs}) == 90
    assert all(len(r) == 5 for r in recs)
    chapters: dict[str, list[str]] = {}
    for r in recs:
        chapters.setdefault(r.meta["chapter"], []).append(str(r.order))
    assert all(v == sorted(v) for v in chapters.values())  # reading order within each chapter
