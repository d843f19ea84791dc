from __future__ import annotations

import time
from pathlib import Path

import pytest

from privasr.corpus.formats.ami_tts import read_ami_tts
from privasr.corpus.formats.nbest_jsonl import read_nbest, write_nbest

from ._helpers import expect_error


def test_fixture_mapping(test_data: Path) -> None:
    a, b = read_ami_tts(test_data / "formats" / "ami_tts" / "dev.jsonl")
    assert (a.utt_id, a.client, a.speaker, a.order) == ("IS1005c_A_0", "IS1005c", "IS1005c_A", 0)
    assert a.ref == ("hello", "this", "meeting")
    assert dict(a.hyps[0].scores) == {"total": -3104.306, "lm": -105.0538, "am": -2083.531}
    assert dict(a.hyps[1].scores) == {"total": -3093.657, "lm": -111.4435, "nbest": -3093.657}
    assert a.hyps[0].meta["score_src"] == "hyp"
    assert a.meta["speaker_letter"] == "A" and a.meta["role"] == "PM" and a.meta["n_nbest_unique"] == 164
    assert a.meta["tts"]["voice"] == "en-us+klatt" and a.meta["onebest_in_nbest"] is False
    assert b.order == 5 and b.meta["timing_sec"]["decode"] == 0.2


def test_canonical_round_trip(tmp_path: Path, test_data: Path) -> None:
    recs = read_ami_tts(test_data / "formats" / "ami_tts" / "dev.jsonl")
    write_nbest(tmp_path / "c.jsonl", recs)
    assert read_nbest(tmp_path / "c.jsonl") == recs


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda s: s.replace('"n_words": 3', '"n_words": 4'), "n_words 4"),
        (lambda s: s.replace('"position": 5', '"position": -5'), "position"),
        (lambda s: s.replace('"meeting": "IS1005c", "speaker": "C"', '"meeting": "IS1005c"'), "no 'speaker'"),
        (lambda s: s.replace('"lm_score": -8.25', '"lm_score": "x"'), "lm_score"),
        (lambda s: s.replace('"ref": "you can start"', '"ref": 3'), "ref is int"),
        (lambda s: s.replace('"audio_sec": 1.5', '"audio_sec": -Infinity'), "-inf"),
    ],
)
def test_malformed(tmp_path: Path, test_data: Path, mutate, needle: str) -> None:  # type: ignore[no-untyped-def]
    text = (test_data / "formats" / "ami_tts" / "dev.jsonl").read_text()
    first, second = text.splitlines()
    p = tmp_path / "bad.jsonl"
    p.write_text(first + "\n" + mutate(second) + "\n")
    expect_error(read_ami_tts, p, 2, needle)


def test_duplicate_id(tmp_path: Path, test_data: Path) -> None:
    first = (test_data / "formats" / "ami_tts" / "dev.jsonl").read_text().splitlines()[0]
    p = tmp_path / "d.jsonl"
    p.write_text(f"{first}\n\n{first}\n")
    expect_error(read_ami_tts, p, 3, "duplicate utterance id")


@pytest.mark.shared
@pytest.mark.parametrize(
    ("folder", "split", "utts", "meetings", "speakers", "words"),
    [
        ("ami-tts-nbest", "dev", 1121, 10, 40, 11727),
        ("ami-tts-nbest", "test", 1954, 16, 64, 21128),
    ],
)
def test_real_counts(shared_data: Path, folder: str, split: str, utts: int, meetings: int, speakers: int,
                     words: int) -> None:
    t0 = time.perf_counter()
    recs = read_ami_tts(shared_data / folder / f"{split}.jsonl.xz")
    assert time.perf_counter() - t0 < 5
    assert len(recs) == utts
    assert len({r.client for r in recs}) == meetings
    assert len({r.speaker for r in recs}) == speakers
    assert sum(len(r.ref or ()) for r in recs) == words
    assert all(len(r) == 10 for r in recs)
    assert all("am" in h.scores and "lm" in h.scores and "total" in h.scores for r in recs for h in r)


@pytest.mark.shared
def test_real_dev_canonical_round_trip(shared_data: Path, tmp_path: Path) -> None:
    recs = read_ami_tts(shared_data / "ami-tts-nbest" / "dev.jsonl.xz")
    write_nbest(tmp_path / "dev.jsonl.gz", recs)
    assert read_nbest(tmp_path / "dev.jsonl.gz") == recs
