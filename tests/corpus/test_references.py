"""References attached to N-best lists by utterance id, reference files, and the 1-best as transcripts."""

from __future__ import annotations

import pytest

from privasr.corpus import attach_references
from privasr.corpus.formats.kaldi_text import write_kaldi_text
from privasr.corpus.formats.nbest_jsonl import write_transcripts
from privasr.corpus.formats.trn import write_trn
from privasr.corpus.records import Hypothesis, NBest, Transcript
from privasr.corpus.references import one_best, read_references
from privasr.errors import InputError


def lists(n: int, ref: bool = False) -> list[NBest]:
    return [NBest(f"utt-{i}", (Hypothesis(("w", str(i))), Hypothesis(("v",))), client="c",
                  ref=("w", str(i)) if ref else None) for i in range(n)]


def test_attach_keeps_order_and_sets_refs():
    refs = [Transcript(f"utt-{i}", ("r", str(i))) for i in reversed(range(3))]
    out = attach_references(lists(3), refs, path="text")
    assert [nb.utt_id for nb in out] == ["utt-0", "utt-1", "utt-2"]
    assert [nb.ref for nb in out] == [("r", "0"), ("r", "1"), ("r", "2")]
    assert out[0].hyps == lists(1)[0].hyps and out[0].client == "c"


def test_missing_on_either_side_counts_and_names():
    with pytest.raises(InputError) as e:
        attach_references(lists(9), [Transcript("utt-0", ())], path="ref.trn")
    msg = str(e.value)
    assert msg.startswith("ref.trn: 8 of 9 N-best lists have no reference: utt-1, utt-2, utt-3, utt-4, utt-5, ...")
    assert "(3 more)" in msg
    with pytest.raises(InputError, match=r"2 of 3 references match no N-best list: extra-1, extra-2"):
        attach_references(lists(1), [Transcript("utt-0", ()), Transcript("extra-1", ()), Transcript("extra-2", ())])


def test_conflicting_reference_and_agreeing_one():
    same = attach_references(lists(2, ref=True), [Transcript("utt-0", ("w", "0")), Transcript("utt-1", ("w", "1"))])
    assert [nb.ref for nb in same] == [("w", "0"), ("w", "1")]
    with pytest.raises(InputError, match=r"text: utterance utt-1 already has the reference 'w 1', the "
                                         r"reference file says 'x'"):
        attach_references(lists(2, ref=True), [Transcript("utt-0", ("w", "0")), Transcript("utt-1", ("x",), order=2)],
                          path="text")


def test_repeated_ids():
    with pytest.raises(InputError, match="two references"):
        attach_references(lists(1), [Transcript("utt-0", ()), Transcript("utt-0", ("a",))])
    twice = attach_references(lists(1) + lists(1), [Transcript("utt-0", ("a",))])  # the same id in two sets
    assert [nb.ref for nb in twice] == [("a",), ("a",)]


@pytest.mark.parametrize("writer, name", [(write_kaldi_text, "text"), (write_trn, "ref.trn"),
                                          (write_transcripts, "ref.jsonl")])
def test_read_references_of_each_format(tmp_path, writer, name):
    ts = [Transcript("utt-1", ("hello", "world")), Transcript("utt-2", ("again",))]
    writer(tmp_path / name, ts)
    assert [(t.utt_id, t.words) for t in read_references(tmp_path / name)] == [(t.utt_id, t.words) for t in ts]


def test_read_references_errors(tmp_path):
    bad = tmp_path / "ref.trn"
    bad.write_text("hello (utt-1)\nagain (utt-1)\n")
    with pytest.raises(InputError, match=r"ref.trn:2: duplicate utterance id"):
        read_references(bad)
    with pytest.raises(InputError, match="no such file"):
        read_references(tmp_path / "nope")


def test_one_best():
    nbs = lists(2) + [NBest("empty", ())]
    ts = one_best(nbs)
    assert [(t.utt_id, t.words, t.client) for t in ts] == [("utt-0", ("w", "0"), "c"), ("utt-1", ("w", "1"), "c"),
                                                          ("empty", (), None)]
