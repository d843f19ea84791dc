"""Spoken-digit folder reader."""

import pytest

from privasr.corpus.formats.fsdd import looks_like_fsdd, read_fsdd
from privasr.corpus.load import load_path
from privasr.errors import InputError


def _touch(d, *names):
    for n in names:
        (d / n).write_bytes(b"RIFF0000WAVE")


def test_read_and_detect(tmp_path):
    _touch(tmp_path, "9_ann_10.wav", "9_ann_2.wav", "0_bob_0.wav")
    ts = read_fsdd(tmp_path)
    assert [(t.utt_id, t.words[0], t.client) for t in ts] == [
        ("9_ann_2", "nine", "ann"), ("9_ann_10", "nine", "ann"), ("0_bob_0", "zero", "bob")]
    assert looks_like_fsdd(tmp_path)
    [ds] = load_path(tmp_path)
    assert ds.fmt == "fsdd" and len(ds.records) == 3


def test_errors(tmp_path):
    with pytest.raises(InputError, match="no .wav files"):
        read_fsdd(tmp_path)
    _touch(tmp_path, "1_ann_0.wav", "hello.wav")
    assert not looks_like_fsdd(tmp_path)
    with pytest.raises(InputError, match="hello.wav: file name does not follow"):
        read_fsdd(tmp_path)
    with pytest.raises(InputError, match="not a folder"):
        read_fsdd(tmp_path / "1_ann_0.wav")
