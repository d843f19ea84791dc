"""Kaldi text reader/writer."""

from __future__ import annotations

import lzma
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privasr.corpus.formats.kaldi_text import read_kaldi_text, write_kaldi_text
from privasr.corpus.records import Transcript
from privasr.errors import InputError


def test_read_basic(tmp_path):
    p = tmp_path / "text"
    p.write_text("u1 hello world\nu2\n\n  u3\ta  b \n", encoding="utf-8")
    assert [(t.utt_id, t.words, t.order, t.speaker) for t in read_kaldi_text(p)] == [
        ("u1", ("hello", "world"), 1, None), ("u2", (), 2, None), ("u3", ("a", "b"), 4, None)]


def test_roundtrip_xz(tmp_path):
    ts = [Transcript("a", ("x", "y")), Transcript("b", ())]
    p = tmp_path / "text.xz"
    write_kaldi_text(p, ts)
    assert lzma.open(p, "rt").read() == "a x y\nb\n"
    assert [(t.utt_id, t.words) for t in read_kaldi_text(p)] == [("a", ("x", "y")), ("b", ())]


def test_duplicate_id_is_located(tmp_path):
    p = tmp_path / "text"
    p.write_text("u1 a\nu2 b\nu1 c\n")
    with pytest.raises(InputError, match="duplicate") as e:
        read_kaldi_text(p)
    assert e.value.line == 3 and e.value.path == str(p)


def test_bad_bytes_and_writer_errors(tmp_path):
    p = tmp_path / "text"
    p.write_bytes(b"u1 a\nu2 \xc3\x28\n")
    with pytest.raises(InputError, match="UTF-8") as e:
        read_kaldi_text(p)
    assert e.value.path == str(p) and e.value.line is not None
    with pytest.raises(InputError):
        write_kaldi_text(tmp_path / "o", [Transcript("a", ()), Transcript("a", ("x",))])


ids = st.from_regex(r"[A-Za-z0-9_\-]{1,8}", fullmatch=True)
tokens = st.lists(st.from_regex(r"[a-z'<>]{1,6}", fullmatch=True), max_size=5)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(ids, tokens), max_size=6, unique_by=lambda t: t[0]))
def test_roundtrip_property(rows):
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "text"
        write_kaldi_text(p, [Transcript(i, tuple(w)) for i, w in rows])
        back = read_kaldi_text(p)
    assert [(t.utt_id, t.words) for t in back] == [(i, tuple(w)) for i, w in rows]


@settings(max_examples=150, deadline=None)
@given(st.one_of(
    st.binary(max_size=200),
    st.text(alphabet=st.sampled_from(list("ab u1\n\t\r\x0b\x0c\x1c\x85\u2028\u3000é")), max_size=80).map(str.encode),
))
def test_fuzz_valid_or_input_error(data):
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "text"
        p.write_bytes(data)
        try:
            ts = read_kaldi_text(p)
        except InputError as e:
            assert e.path == str(p)
            return
    assert all(isinstance(t, Transcript) for t in ts)
    assert len({t.utt_id for t in ts}) == len(ts)


def test_a_kaldi_data_folder_takes_speakers_from_utt2spk(tmp_path):
    from privasr.corpus.formats.kaldi_text import read_kaldi_text, write_kaldi_text
    from privasr.corpus.records import Transcript
    from privasr.errors import InputError

    d = tmp_path / "dev"
    write_kaldi_text(d / "text", [Transcript("u1", ("a",), speaker="s1"), Transcript("u2", ("b",), speaker="s2")])
    assert (d / "utt2spk").read_text() == "u1 s1\nu2 s2\n"
    assert [t.speaker for t in read_kaldi_text(d / "text")] == ["s1", "s2"]
    write_kaldi_text(tmp_path / "other.txt", [Transcript("u1", ("a",), speaker="s1")])
    assert not (tmp_path / "utt2spk").exists()  # only a file named text is a data folder's
    (d / "utt2spk").write_text("u1 s1\n")
    with pytest.raises(InputError, match=r"utt2spk: utterance 'u2' \(line 2 of .*\) has no speaker"):
        read_kaldi_text(d / "text")
    (d / "utt2spk").write_text("u1 s1\nu2\n")
    with pytest.raises(InputError, match=r"utt2spk:2: line has 1 fields"):
        read_kaldi_text(d / "text")


def test_references_give_speakers_to_lists_without_them(tmp_path):
    from privasr.corpus.records import Hypothesis, NBest, Transcript
    from privasr.corpus.references import attach_references

    nbs = [NBest("u1", (Hypothesis(("a",)),)), NBest("u2", (Hypothesis(("b",)),), speaker="mine")]
    out = attach_references(nbs, [Transcript("u1", ("a",), speaker="s1", client="c"),
                                  Transcript("u2", ("b",), speaker="s2")])
    assert [(nb.ref, nb.speaker, nb.client) for nb in out] == [(("a",), "s1", "c"), (("b",), "mine", None)]
