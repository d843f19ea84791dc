"""Fuzzing of every corpus reader: each input must give valid records or an InputError, nothing else.

Inputs are random bytes and mutations of the small valid fixtures in ``tests/data/formats`` (byte flips,
truncation, dropped/duplicated/swapped lines, inserted garbage fields, wrong types, NaN/inf and huge
numbers, invalid UTF-8), optionally compressed (``.gz``/``.xz``) and then possibly corrupted, or packed
into tar archives.
"""

from __future__ import annotations

import gzip
import io
import lzma
import os
import re
import shutil
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from privasr.corpus.formats.ami_hmnet import read_ami_hmnet
from privasr.corpus.formats.ami_tts import read_ami_tts
from privasr.corpus.formats.an4 import read_an4
from privasr.corpus.formats.conll import read_conll
from privasr.corpus.formats.ctm import read_ctm
from privasr.corpus.formats.earnings21 import read_earnings21, read_nlp, read_speaker_names
from privasr.corpus.formats.hyporadise import read_hyporadise
from privasr.corpus.formats.nbest_jsonl import read_nbest, read_transcripts
from privasr.corpus.formats.srilm_nbest import read_srilm_nbest
from privasr.corpus.load import load_path, read_text_lines
from privasr.corpus.records import NBest, Transcript
from privasr.errors import InputError

DATA = Path(__file__).resolve().parents[1] / "data" / "formats"
SETTINGS = settings(max_examples=int(os.environ.get("PRIVASR_FUZZ_EXAMPLES", "150")), deadline=None,
                    derandomize=not os.environ.get("PRIVASR_FUZZ_RANDOM"),
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

WEIRD = [b"NaN", b"Infinity", b"-Infinity", b"1e999", b"-1e999", b"9" * 400, b'"x"', b"null", b"true", b"[]",
         b"{}", b"\xff\xfe", b"\xc3", b"-inf", b"nan", b"inf", b"|", b"(", b")", b"-DOCSTART-", b"B-", b"I-X",
         b";;", b"0.5", b"-1", b"", b" ", b"\t", b"\x00", b"[[[[[[[[", b'{"a":', b"NBestList2.0", b"'", b"\xe2\x80\xa8",
         b"\x1c", b"1.5", b"2", b"[1, 2]", b'["a"]', b"-0", b"1e308", b"0x10"]
_TOKEN = re.compile(rb"[A-Za-z0-9_.+-]+|\"[^\"]*\"")


@st.composite
def mutate(draw: st.DrawFn, seed: bytes) -> bytes:
    """A random mutation of ``seed``."""
    data = seed
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "truncate", "drop", "dup", "swap", "insert", "token", "garbage"]))
        lines = data.split(b"\n")
        if op == "flip" and data:
            i = draw(st.integers(0, len(data) - 1))
            data = data[:i] + bytes([draw(st.integers(0, 255))]) + data[i + 1:]
        elif op == "truncate" and data:
            data = data[: draw(st.integers(0, len(data) - 1))]
        elif op in ("drop", "dup") and lines:
            i = draw(st.integers(0, len(lines) - 1))
            lines[i:i + 1] = [] if op == "drop" else [lines[i], lines[i]]
            data = b"\n".join(lines)
        elif op == "swap" and len(lines) > 1:
            i, j = draw(st.integers(0, len(lines) - 1)), draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
            data = b"\n".join(lines)
        elif op == "insert":
            i = draw(st.integers(0, len(data)))
            data = data[:i] + draw(st.sampled_from(WEIRD)) + data[i:]
        elif op == "token":
            toks = list(_TOKEN.finditer(data))
            if toks:
                m = toks[draw(st.integers(0, len(toks) - 1))]
                data = data[: m.start()] + draw(st.sampled_from(WEIRD)) + data[m.end():]
        elif op == "garbage":
            i = draw(st.integers(0, len(data)))
            data = data[:i] + draw(st.binary(max_size=12)) + data[i:]
    return data


@st.composite
def packed(draw: st.DrawFn, seed: bytes) -> tuple[str, bytes]:
    """A mutated seed, maybe compressed (``.gz``/``.xz``), maybe with the compressed bytes damaged."""
    data = draw(mutate(seed)) if draw(st.booleans()) or not seed else seed
    comp = draw(st.sampled_from(["", ".gz", ".xz"]))
    if comp == ".gz":
        data = gzip.compress(data, mtime=0)
    elif comp == ".xz":
        data = lzma.compress(data)
    if comp and draw(st.booleans()):
        data = draw(mutate(data))
    return comp, data


def _check(result: Any) -> None:
    if isinstance(result, dict):  # read_speaker_names
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in result.items())
        return
    assert isinstance(result, list)
    for r in result:
        assert isinstance(r, NBest | Transcript) or hasattr(r, "records")


def _run(fn: Callable[[], Any]) -> None:
    try:
        _check(fn())
    except InputError:
        pass


# (fixture file, file name to write, reader taking the written path)
FILE_READERS: list[tuple[str, str, Callable[[Path], Any]]] = [
    ("canonical_nbest.jsonl", "x.jsonl", read_nbest),
    ("canonical_transcripts.jsonl", "x.jsonl", read_transcripts),
    ("ami_tts/dev.jsonl", "dev.jsonl", read_ami_tts),
    ("hyporadise/small.json", "h.json", read_hyporadise),
    ("small.ctm", "x.ctm", read_ctm),
    ("small.ctm", "x.ctm", lambda p: read_ctm(p, split_gap=0.5)),
    ("small.conll", "x.conll", read_conll),
    ("an4_test.transcription", "x.transcription", read_an4),
    ("earnings21/nlp_references/c1.nlp", "c1.nlp", read_nlp),
    ("earnings21/speaker-metadata.csv", "s.csv", read_speaker_names),
    ("srilm/utt1", "utt1", read_srilm_nbest),
    ("srilm/utt2", "utt2", read_srilm_nbest),
    ("srilm/utt3", "utt3", read_srilm_nbest),
    ("small.conll", "book.txt", read_text_lines),
    ("canonical_nbest.jsonl", "any.jsonl", load_path),
    ("small.ctm", "any.ctm", load_path),
]


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@pytest.mark.parametrize(("seed_name", "name", "reader"), FILE_READERS,
                         ids=[f"{a}-{i}" for i, (a, _, _) in enumerate(FILE_READERS)])
@SETTINGS
@given(data=st.data())
def test_file_readers(work: Path, seed_name: str, name: str, reader: Callable[[Path], Any], data: st.DataObject) -> None:
    seed = (DATA / seed_name).read_bytes()
    comp, blob = data.draw(packed(seed))
    d = work / "f"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir()
    p = d / (name + comp)
    p.write_bytes(blob)
    _run(lambda: reader(p))


@SETTINGS
@given(blob=st.binary(max_size=300), name=st.sampled_from(["x.jsonl", "x.json", "x.ctm", "x.nlp", "x.conll", "u",
                                                         "x.transcription", "x.jsonl.gz", "x.tar.xz", "x.txt"]))
def test_random_bytes(work: Path, blob: bytes, name: str) -> None:
    d = work / "r"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir()
    p = d / name
    p.write_bytes(blob)
    for reader in (read_nbest, read_transcripts, read_ami_tts, read_hyporadise, read_ctm, read_conll, read_an4,
                   read_nlp, read_srilm_nbest, read_ami_hmnet, read_earnings21, read_text_lines, load_path):
        _run(lambda r=reader: r(p))  # type: ignore[misc]


@SETTINGS
@given(data=st.data())
def test_hyporadise_with_ids(work: Path, data: st.DataObject) -> None:
    d = work / "h"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir()
    (d / "h.json").write_bytes(data.draw(mutate((DATA / "hyporadise" / "small.json").read_bytes())))
    (d / "h.ids.txt").write_bytes(data.draw(mutate((DATA / "hyporadise" / "small.ids.txt").read_bytes())))
    _run(lambda: read_hyporadise(d / "h.json", ids=d / "h.ids.txt"))
    _run(lambda: load_path(d))


@SETTINGS
@given(data=st.data())
def test_hmnet_gz(work: Path, data: st.DataObject) -> None:
    seed = gzip.decompress((DATA / "hmnet" / "train" / "split_0.jsonl.gz").read_bytes())
    comp, blob = data.draw(packed(seed))
    d = work / "m"
    shutil.rmtree(d, ignore_errors=True)
    (d / "train").mkdir(parents=True)
    (d / "train" / f"split_0.jsonl{comp}").write_bytes(blob)
    _run(lambda: read_ami_hmnet(d / "train" / f"split_0.jsonl{comp}"))
    _run(lambda: read_ami_hmnet(d))


def _tar(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz") as t:
        for name, blob in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(blob)
            t.addfile(info, io.BytesIO(blob))
    return buf.getvalue()


@SETTINGS
@given(data=st.data())
def test_tar_readers(work: Path, data: st.DataObject) -> None:
    nlp = data.draw(mutate((DATA / "earnings21" / "nlp_references" / "c1.nlp").read_bytes()))
    tags = data.draw(mutate((DATA / "earnings21" / "wer_tags" / "c1.wer_tag.json").read_bytes()))
    ctm = data.draw(mutate((DATA / "small.ctm").read_bytes()))
    refs = _tar({"nlp_references/c1.nlp": nlp, "wer_tags/c1.wer_tag.json": tags})
    sys = _tar({"ctm/c1.ctm": ctm, "ctm/c2.ctm": b"c2 A 0 1 x 0.5\n"})
    if data.draw(st.booleans()):
        refs = data.draw(mutate(refs))
    if data.draw(st.booleans()):
        sys = data.draw(mutate(sys))
    d = work / "t"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir()
    (d / "refs.tar.xz").write_bytes(refs)
    (d / "sys.tar.xz").write_bytes(sys)
    _run(lambda: read_earnings21(d / "refs.tar.xz"))
    _run(lambda: read_ctm(d / "sys.tar.xz"))
    _run(lambda: load_path(d))


@SETTINGS
@given(data=st.data())
def test_folder_scan(work: Path, data: st.DataObject) -> None:
    d = work / "s"
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(DATA, d)
    victims = sorted(p for p in d.rglob("*") if p.is_file())
    for _ in range(data.draw(st.integers(1, 3))):
        v = victims[data.draw(st.integers(0, len(victims) - 1))]
        v.write_bytes(data.draw(mutate(v.read_bytes())))
    _run(lambda: load_path(d))
