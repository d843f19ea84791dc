"""NIST trn reader/writer."""

from __future__ import annotations

import gzip
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from privasr.corpus.formats.trn import read_trn, spu_id, write_trn
from privasr.corpus.records import Transcript
from privasr.errors import InputError


def write(tmp_path: Path, text: str, name: str = "x.trn") -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def test_read_basic(tmp_path):
    p = write(tmp_path, "hello world (spk1-u1)\n (spk1-u2)\n\n;; comment\n  a  b   (spk2_u3)  \n")
    ts = read_trn(p)
    assert [(t.utt_id, t.words, t.speaker, t.order) for t in ts] == [
        ("spk1-u1", ("hello", "world"), "spk1", 1), ("spk1-u2", (), "spk1", 2), ("spk2_u3", ("a", "b"), "spk2", 5)]


def test_roundtrip_gz(tmp_path):
    ts = [Transcript("a-1", ("x", "y")), Transcript("a-2", ()), Transcript("b", ("z",))]
    p = tmp_path / "out.trn.gz"
    write_trn(p, ts)
    assert gzip.open(p, "rt").read() == "x y (a-1)\n (a-2)\nz (b)\n"
    assert [(t.utt_id, t.words) for t in read_trn(p)] == [(t.utt_id, t.words) for t in ts]


@pytest.mark.parametrize("text,line,what", [
    ("a b (u1)\na b\n", 2, "does not end"),
    ("a b (u1)\na b (u1)\n", 2, "duplicate"),
    ("a b u1)\n", 1, "no '\\('"),
    ("a b ()\n", 1, "invalid utterance id"),
    ("a (b) (u1)\n", 1, "sclite markup"),
])
def test_errors_are_located(tmp_path, text, line, what):
    p = write(tmp_path, text)
    with pytest.raises(InputError, match=what) as e:
        read_trn(p)
    assert e.value.line == line and e.value.path == str(p)


def test_invalid_utf8_and_missing(tmp_path):
    p = tmp_path / "bad.trn"
    p.write_bytes(b"ok (u1)\n\xff\xfe (u2)\n")
    with pytest.raises(InputError, match="UTF-8") as e:
        read_trn(p)
    assert e.value.path == str(p) and e.value.line is not None
    with pytest.raises(InputError):
        read_trn(tmp_path / "missing.trn")


def test_write_rejects_unwritable_ids(tmp_path):
    with pytest.raises(InputError):
        write_trn(tmp_path / "o.trn", [Transcript("u(1)", ("a",))])
    with pytest.raises(InputError):
        write_trn(tmp_path / "o.trn", [Transcript("u", ("a",)), Transcript("u", ())])


def test_spu_id():
    assert spu_id("1688-1688-142285-0000") == "1688"
    assert spu_id("a_b-c") == "a" and spu_id("abc") == "abc" and spu_id("_x") == "_x"


ids = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_\-.]{0,8}", fullmatch=True)
tokens = st.lists(st.from_regex(r"[a-z']{1,6}", fullmatch=True), max_size=5)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(ids, tokens), max_size=6, unique_by=lambda t: t[0]))
def test_roundtrip_property(rows):
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "r.trn"
        ts = [Transcript(i, tuple(w)) for i, w in rows]
        write_trn(p, ts)
        back = read_trn(p)
    assert [(t.utt_id, t.words, t.speaker) for t in back] == [(i, tuple(w), spu_id(i)) for i, w in rows]


@settings(max_examples=150, deadline=None)
@given(st.one_of(
    st.binary(max_size=200),
    st.text(alphabet=st.sampled_from(list("ab (-_)\n\t\r;é\x00\x85\u2028")), max_size=80).map(lambda s: s.encode()),
))
def test_fuzz_valid_or_input_error(data):
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "f.trn"
        p.write_bytes(data)
        try:
            ts = read_trn(p)
        except InputError as e:
            assert e.path == str(p) and (e.line is None or e.line >= 1)
            return
    assert all(isinstance(t, Transcript) and t.utt_id and t.speaker for t in ts)
    assert len({t.utt_id for t in ts}) == len(ts)
