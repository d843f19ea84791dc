from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from privasr.corpus.formats.ctm import ctm_utterances, read_ctm, write_ctm
from privasr.corpus.records import Transcript
from privasr.errors import InputError

from ._helpers import expect_error


def test_read_fixture(test_data: Path) -> None:
    a, b = read_ctm(test_data / "formats" / "small.ctm")
    assert a.utt_id == "call1" and a.client == "call1" and a.meta["channel"] == "A"
    assert a.words == ("good", "morning", "everyone")
    assert a.times == ((0.0, 0.5), (0.5, 0.8), (2.5, 2.7)) and a.confidences == (1.0, 0.85, 0.4)
    assert b.utt_id == "call2"


def test_split_gap(test_data: Path) -> None:
    recs = read_ctm(test_data / "formats" / "small.ctm", split_gap=1.0)
    assert [(r.utt_id, r.words, r.order) for r in recs] == [
        ("call1_0000", ("good", "morning"), 0), ("call1_0001", ("everyone",), 1), ("call2_0000", ("hello",), 0)]


def test_channels_and_no_confidence(tmp_path: Path) -> None:
    p = tmp_path / "c.ctm"
    p.write_text("r A 0 1 x\nr B 0 1 y\nr A 1 1 z\n")
    recs = read_ctm(p)
    assert [(r.utt_id, r.words, r.confidences) for r in recs] == [("r_A", ("x", "z"), None), ("r_B", ("y",), None)]


def test_round_trip(tmp_path: Path, test_data: Path) -> None:
    for split in (None, 1.0):
        recs = read_ctm(test_data / "formats" / "small.ctm", split_gap=split)
        write_ctm(tmp_path / "o.ctm", recs)
        assert read_ctm(tmp_path / "o.ctm") == read_ctm(test_data / "formats" / "small.ctm")
    odd = [Transcript("r", ("a", "b"), times=((0.1, 0.30000000000000004), (1 / 3, 2 / 3)), client="r",
                      meta={"channel": "1"})]
    write_ctm(tmp_path / "odd.ctm.gz", odd)
    back = read_ctm(tmp_path / "odd.ctm.gz")[0]
    assert back.words == odd[0].words
    flat = [x for t in back.times or () for x in t]
    assert flat == pytest.approx([x for t in odd[0].times or () for x in t], abs=1e-9)


def test_folder_and_tar(tmp_path: Path, test_data: Path) -> None:
    d = tmp_path / "ctm"
    d.mkdir()
    (d / "a.ctm").write_text("r1 A 0 1 x 0.5\n")
    (d / "b.ctm").write_text("r2 A 0 1 y 0.5\n")
    assert [r.utt_id for r in read_ctm(d)] == ["r1", "r2"]
    tar = tmp_path / "sys.tar.xz"
    with tarfile.open(tar, "w:xz") as t:
        for name, text in (("ctm/a.ctm", b"r1 A 0 1 x 0.5\n"), ("ctm/b.ctm", b"r2 A 0 1 y 0.5\nr2 A zz 1 y\n")):
            info = tarfile.TarInfo(name)
            info.size = len(text)
            t.addfile(info, io.BytesIO(text))
    err = expect_error(read_ctm, tar, 2, "start time 'zz'")
    assert err.path == f"{tar}:ctm/b.ctm"


@pytest.mark.parametrize(
    ("text", "line", "needle"),
    [
        ("r A 0 1 x 0.5\nr A 0 1\n", 2, "4 fields"),
        ("r A 0 1 x 0.5\nr A 0 -1 y 0.5\n", 2, "duration"),
        ("r A 0 1 x 1.5\n", 1, "above 1"),
        ("r A 0 1 x 0.5\nr A 1 1 y\n", 2, "mixes"),
        ("r A nan 1 x\n", 1, "start time"),
        ("r A 0 inf x\n", 1, "duration"),
    ],
)
def test_malformed(tmp_path: Path, text: str, line: int, needle: str) -> None:
    p = tmp_path / "b.ctm"
    p.write_text(text)
    expect_error(read_ctm, p, line, needle)


def test_recording_in_two_files(tmp_path: Path) -> None:
    (tmp_path / "a.ctm").write_text("r A 0 1 x\n")
    (tmp_path / "b.ctm").write_text("r A 2 1 y\n")
    with pytest.raises(InputError, match="already appeared"):
        read_ctm(tmp_path)


@pytest.mark.shared
def test_real_earnings21_ctms(shared_data: Path) -> None:
    rev = read_ctm(shared_data / "earnings21" / "asr_rev_kaldi_ctm_with_conf.tar.xz")
    assert len(rev) == 45 and sum(len(t) for t in rev) == 369181
    assert all(t.confidences is not None and t.times is not None for t in rev)
    low = sum(c < 0.9 for t in rev for c in t.confidences or ()) / 369181
    assert 0.10 <= low <= 0.13


def _tar(path: Path, files: dict[str, str]) -> Path:
    with tarfile.open(path, "w:xz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_ctm_utterances_lowercase_split_and_keep_confidences(tmp_path: Path) -> None:
    lines = {"100": ["100 A 0.00 0.20 GOOD 0.90", "100 A 0.20 0.10 -- 1.00", "100 A 0.30 0.20 Day 0.50",
                     "100 A 3.00 0.20 uh-huh 0.30", "100 A 5.00 0.20 . 0.99"],
             "200": ["200 A 0.00 0.20 Q3 0.70"]}
    path = _tar(tmp_path / "ctm.tar.xz", {f"ctm/{c}.ctm": "\n".join(ls) + "\n" for c, ls in lines.items()})
    utts = ctm_utterances(path, 1.0)
    assert [(u.utt_id, u.words, u.confidences, u.times) for u in utts] == [
        ("100_0000", ("good", "day"), (0.9, 0.5), ((0.0, 0.2), (0.3, 0.5))),
        ("100_0001", ("uh-huh",), (0.3,), ((3.0, 3.2),)),
        ("200_0000", ("q3",), (0.7,), ((0.0, 0.2),))]
    assert all(u.client == u.utt_id[:3] for u in utts)


def test_ctm_utterances_need_confidences(tmp_path: Path) -> None:
    noconf = _tar(tmp_path / "noconf.tar.xz", {"ctm/1.ctm": "1 A 0.0 0.1 hello\n"})
    with pytest.raises(InputError, match="no confidences"):
        ctm_utterances(noconf, 1.0)
