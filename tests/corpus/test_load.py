from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from privasr.corpus.load import FORMATS, Dataset, detect_format, load_path, write_dataset
from privasr.errors import InputError


@pytest.mark.parametrize(
    ("rel", "fmt", "kind", "n"),
    [
        ("canonical_nbest.jsonl", "nbest-jsonl", "nbest", 3),
        ("canonical_transcripts.jsonl", "transcript-jsonl", "transcript", 2),
        ("ami_tts/dev.jsonl", "ami-tts", "nbest", 2),
        ("hyporadise/small.json", "hyporadise", "nbest", 2),
        ("small.ctm", "ctm", "transcript", 2),
        ("small.conll", "conll", "transcript", 3),
        ("an4_test.transcription", "an4", "transcript", 3),
        ("earnings21/nlp_references/c1.nlp", "earnings21", "transcript", 2),
        ("hmnet/train/split_0.jsonl.gz", "ami-hmnet", "transcript", 2),
        ("srilm/utt3", "srilm", "nbest", 1),
        ("srilm/utt1", "srilm", "nbest", 1),
        ("srilm.list", "srilm", "nbest", 2),
    ],
)
def test_detect_single_files(test_data: Path, rel: str, fmt: str, kind: str, n: int) -> None:
    p = test_data / "formats" / rel
    assert detect_format(p) == fmt
    (ds,) = load_path(p)
    assert (ds.fmt, ds.kind, len(ds.records)) == (fmt, kind, n)


def test_hyporadise_picks_up_ids(test_data: Path) -> None:
    (ds,) = load_path(test_data / "formats" / "hyporadise")
    assert ds.records[0].utt_id == "1688-142285-0000"


def test_folder_scan(test_data: Path) -> None:
    sets = {d.name: d for d in load_path(test_data / "formats")}
    assert sets["formats/hmnet/train"].fmt == "ami-hmnet"
    assert sets["formats/srilm"].fmt == "srilm" and len(sets["formats/srilm"].records) == 3
    assert sets["formats/earnings21/nlp_references"].fmt == "earnings21"


def test_ctm_paired_with_references(tmp_path: Path, test_data: Path) -> None:
    shutil.copytree(test_data / "formats" / "earnings21", tmp_path / "e21")
    (tmp_path / "e21" / "sys").mkdir()
    (tmp_path / "e21" / "sys" / "c1.ctm").write_text("c1 A 0 1 good 0.9\nc1 A 1 1 morning 0.8\n")
    sets = {d.fmt: d for d in load_path(tmp_path / "e21")}
    assert sets["ctm"].references is not None and sets["ctm"].references["c1"][:2] == ("Good", "morning")
    assert sets["earnings21"].references is None


def test_unknown_content(tmp_path: Path) -> None:
    p = tmp_path / "notes.md.txt"
    p.write_text("Hello there.\nThis is prose.\n")
    with pytest.raises(InputError, match="unrecognised content") as info:
        load_path(p)
    assert "ctm" in str(info.value) and "conll" in str(info.value)
    with pytest.raises(InputError, match="unknown format"):
        load_path(p, "nope")


def test_forced_format_and_write(tmp_path: Path, test_data: Path) -> None:
    (ds,) = load_path(test_data / "formats" / "small.ctm", "ctm")
    assert write_dataset(ds, tmp_path / "o.jsonl") == 2
    (back,) = load_path(tmp_path / "o.jsonl")
    assert back.records == ds.records and back.fmt == "transcript-jsonl"
    with pytest.raises(InputError, match="no writer"):
        write_dataset(ds, tmp_path / "x", "ami-tts")
    with pytest.raises(InputError, match="holds transcript records"):
        write_dataset(ds, tmp_path / "x", "srilm")


def test_registry_shape() -> None:
    for name, (reader, writer) in FORMATS.items():
        assert callable(reader), name
        assert writer is None or callable(writer), name
    assert Dataset("a", "nbest", "nbest-jsonl", ()).references is None


@pytest.mark.shared
@pytest.mark.parametrize(
    ("folder", "expected"),
    [
        ("ami-tts-nbest", {"ami-tts-nbest/dev": 1121, "ami-tts-nbest/test": 1954}),
        ("ami-tts-nbest-indomain", {"ami-tts-nbest-indomain/dev": 911, "ami-tts-nbest-indomain/test": 2215}),
        ("ami-transcripts", {"ami-transcripts/AMI_proprec/train": 28388, "ami-transcripts/AMI_proprec/dev": 5783,
                             "ami-transcripts/AMI_proprec/test": 5393}),
        ("librispeech-whisper-5best", {"librispeech-whisper-5best/test_ls_other": 2939}),
        ("ner-wikigold", {"ner-wikigold/wikigold.conll": 1696}),
        ("an4", {"an4/etc/an4_train": 948, "an4/etc/an4_test": 130}),
        ("earnings21", {"earnings21/references_nlp_wertags": 3062, "earnings21/asr_rev_kaldi_ctm_with_conf": 45,
                        "earnings21/asr_kaldiorg_librispeech_ctm_with_conf": 44}),
    ],
)
def test_real_folders(shared_data: Path, folder: str, expected: dict[str, int]) -> None:
    t0 = time.perf_counter()
    sets = load_path(shared_data / folder)
    assert time.perf_counter() - t0 < 15
    assert {d.name: len(d.records) for d in sets} == expected
    for d in sets:
        if d.fmt == "ctm":
            assert d.references is not None and len(d.references) == 44
