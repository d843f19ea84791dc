from __future__ import annotations

import math
from pathlib import Path

import pytest

from privasr.corpus.formats.nbest_jsonl import (
    iter_nbest,
    read_nbest,
    read_transcripts,
    write_nbest,
    write_transcripts,
)
from privasr.corpus.records import Hypothesis, NBest, Span, Transcript

from ._helpers import expect_error


def test_read_fixture(test_data: Path) -> None:
    recs = read_nbest(test_data / "formats" / "canonical_nbest.jsonl")
    assert [r.utt_id for r in recs] == ["m1_A_0", "m1_B_1", "m2_A_0"]
    a = recs[0]
    assert a.client == "m1" and a.speaker == "m1_A" and a.order == 0 and a.ref == ("hello", "world")
    assert a.hyps[0].confidences == (0.9, 0.75) and a.hyps[0].times == ((0.0, 0.4), (0.4, 0.95))
    assert a.hyps[1].scores["lm"] == -math.inf and a.hyps[1].meta["src"] == "nbest"
    assert a.meta["role"] == "PM"
    assert recs[1].ref == () and len(recs[1]) == 1 and recs[1].best.words == ()
    assert recs[2].order == "0003" and recs[2].best.words == () and recs[2].ref is None


def test_round_trip_exact(tmp_path: Path, test_data: Path) -> None:
    recs = read_nbest(test_data / "formats" / "canonical_nbest.jsonl")
    extra = NBest("x", (Hypothesis(("a",), scores={"total": 0.1 + 0.2, "am": -1e-300, "lm": 123456789.123456789}),),
                  order=2.5)
    for name in ("o.jsonl", "o.jsonl.gz", "o.jsonl.xz"):
        assert write_nbest(tmp_path / name, [*recs, extra]) == 4
        assert read_nbest(tmp_path / name) == [*recs, extra]
    assert list(iter_nbest(tmp_path / "o.jsonl")) == [*recs, extra]


def test_writer_key_order_and_omissions(tmp_path: Path) -> None:
    r = NBest("u", (Hypothesis(("a", "b"), scores={"am": -1.0}),), client="c", speaker="s", order=1, ref=("a",),
              meta={"k": 1})
    write_nbest(tmp_path / "a.jsonl", [r])
    assert (tmp_path / "a.jsonl").read_text() == (
        '{"utt_id": "u", "client": "c", "speaker": "s", "order": 1, "ref": "a", '
        '"hyps": [{"words": "a b", "scores": {"am": -1.0}}], "meta": {"k": 1}}\n'
    )


def test_transcripts_round_trip(tmp_path: Path, test_data: Path) -> None:
    recs = read_transcripts(test_data / "formats" / "canonical_transcripts.jsonl")
    assert recs[0].entities == (Span(1, 3, "PER"),) and recs[0].confidences == (1.0, 0.5, 0.25)
    assert recs[1].words == ()
    more = [*recs, Transcript("s3", ("x",), times=((1.0000001, 2.123456789),), order="b", meta={"a": {"b": None}})]
    assert write_transcripts(tmp_path / "t.jsonl", more) == 3
    assert read_transcripts(tmp_path / "t.jsonl") == more


@pytest.mark.parametrize(
    ("text", "line", "needle"),
    [
        ('{"utt_id": "a", "hyps": [{"words": "x"}]}\n{"utt_id": "b", "hyps": [{"words": "x"}], "extra": 1}\n', 2, "unknown key 'extra'"),
        ('{"utt_id": "a", "hyps": [{"words": "x"}]}\n\n{"utt_id": "a", "hyps": [{"words": "x"}]}\n', 3, "duplicate utterance id"),
        ('{"utt_id": "a", "hyps": [{"words": "x", "scores": {"am": NaN}}]}\n', 1, "NaN"),
        ('{"utt_id": "a", "hyps": [{"words": "x", "scores": {"am": "-Inf"}}]}\n', 1, "score 'am'"),
        ('{"utt_id": "a", "hyps": [{"words": "x", "scores": {"am": 1e999}}]}\n', 1, "out of range"),
        ('{"utt_id": "a", "hyps": [{"words": "x", "confidences": [2.0]}]}\n', 1, "outside [0, 1]"),
        ('{"utt_id": "a", "hyps": [{"words": "x y", "times": [[0, 1]]}]}\n', 1, "word times"),
        ('{"utt_id": "a", "hyps": {"words": "x"}}\n', 1, "'hyps' is dict"),
        ('{"utt_id": "a", "hyps": [{"words": "x"}]}\n{"utt_id": "b", "hyps": []}\n', 2, "'hyps' is empty"),
        ('{"utt_id": 5, "hyps": [{"words": "x"}]}\n', 1, "utterance id"),
        ('{"utt_id": "a", "hyps": [{"words": "x"}], "order": true}\n', 1, "order"),
        ('{"utt_id": "a", "hyps": []', 1, "invalid JSON"),
        ('["utt_id"]\n', 1, "not an object"),
        ('{"utt_id": "a", "utt_id": "b", "hyps": []}\n', 1, "duplicate key"),
        ('{"utt_id": "a", "hyps": [{"words": "x", "confidences": [10000000000000000000000000000000000000000000000'
         '00000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000'
         '00000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000'
         '00000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000'
         ']}]}\n', 1, "out of range"),
    ],
)
def test_malformed(tmp_path: Path, text: str, line: int, needle: str) -> None:
    p = tmp_path / "bad.jsonl"
    p.write_text(text)
    expect_error(read_nbest, p, line, needle)


def test_malformed_transcripts(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text('{"utt_id": "a", "words": "x"}\n{"utt_id": "b", "words": "x", "entities": [[0, 2, "PER"]]}\n')
    expect_error(read_transcripts, p, 2, "past the 1 words")
    p.write_text('{"utt_id": "a", "words": ["x"]}\n')
    expect_error(read_transcripts, p, 1, "string of space-separated words")
    p.write_text('{"utt_id": "a", "words": "x", "hyps": []}\n')
    expect_error(read_transcripts, p, 1, "unknown key 'hyps'", "utt_id, words")


def test_invalid_utf8_and_corrupt_gzip(tmp_path: Path) -> None:
    p = tmp_path / "u.jsonl"
    p.write_bytes(b'{"utt_id": "a", "hyps": [{"words": "x"}]}\n{"utt_id": "\xff", "hyps": [{"words": "x"}]}\n')
    expect_error(read_nbest, p, 2, "UTF-8")
    g = tmp_path / "c.jsonl.gz"
    g.write_bytes(b"\x1f\x8b\x08\x00garbage-garbage-garbage")
    expect_error(read_nbest, g, 1, "cannot read")


def test_list_without_hypotheses_is_written_as_one_empty_hypothesis(tmp_path: Path) -> None:
    write_nbest(tmp_path / "e.jsonl", [NBest("u", (), ref=("a",))])
    assert (tmp_path / "e.jsonl").read_text() == '{"utt_id": "u", "ref": "a", "hyps": [{"words": ""}]}\n'
    (back,) = read_nbest(tmp_path / "e.jsonl")
    assert back.hyps == (Hypothesis(()),) and back.ref == ("a",)


def test_non_finite_meta_never_reaches_the_writer(tmp_path: Path) -> None:
    from privasr.errors import InputError

    # Records refuse meta that strict JSON cannot hold, so nothing unwritable is ever built.
    with pytest.raises(InputError, match="finite numbers only"):
        write_nbest(tmp_path / "x.jsonl", [NBest("u", (), meta={"x": float("nan")})])
    assert not (tmp_path / "x.jsonl").exists()
