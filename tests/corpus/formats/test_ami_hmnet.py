from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from privasr.corpus.formats.ami_hmnet import HmnetCounts, read_ami_hmnet, scan_ami_hmnet

from ._helpers import expect_error


def test_fixture(test_data: Path) -> None:
    recs = read_ami_hmnet(test_data / "formats" / "hmnet" / "train" / "split_0.jsonl.gz")
    assert [(r.utt_id, r.client, r.speaker, r.order, r.meta["role"]) for r in recs] == [
        ("ES2004a_B_0", "ES2004a", "ES2004a_B", 0, "PM"), ("ES2004a_A_2", "ES2004a", "ES2004a_A", 2, "ME")]
    assert recs[0].words == ("Hello", ",", "we", "'re", "here", ".")
    assert "split" not in recs[0].meta
    assert scan_ami_hmnet(test_data / "formats" / "hmnet" / "train") == HmnetCounts(1, 3, 1, 10)


def test_root_folder_gives_splits(test_data: Path) -> None:
    recs = read_ami_hmnet(test_data / "formats" / "hmnet")
    assert [(r.utt_id, r.meta["split"]) for r in recs] == [
        ("ES2004a_B_0", "train"), ("ES2004a_A_2", "train"), ("IS1000a_C_0", "dev")]


@pytest.mark.parametrize(
    ("meeting", "needle"),
    [
        ({"id": "M", "meeting": [{"speaker": "A", "utt": {"word": ["a", 1]}}]}, "not a string"),
        ({"id": "M", "meeting": [{"speaker": "", "utt": {"word": ["a"]}}]}, "speaker"),
        ({"id": "M", "meeting": {}}, "list of turns"),
        ({"meeting": []}, "meeting id"),
        ({"id": "M", "meeting": [{"speaker": "A", "utt": {"word": ["a b"]}}]}, "invalid token"),
    ],
)
def test_malformed(tmp_path: Path, meeting: dict, needle: str) -> None:  # type: ignore[type-arg]
    p = tmp_path / "split_0.jsonl.gz"
    good = {"id": "OK", "meeting": [{"speaker": "A", "role": "PM", "utt": {"word": ["a"]}}]}
    with gzip.open(p, "wt") as f:
        f.write(json.dumps(good) + "\n" + json.dumps(meeting) + "\n")
    expect_error(read_ami_hmnet, p, 2, needle)


def test_duplicate_meeting(tmp_path: Path) -> None:
    p = tmp_path / "s.jsonl"
    line = json.dumps({"id": "M", "meeting": [{"speaker": "A", "utt": {"word": ["a"]}}]})
    p.write_text(f"{line}\n{line}\n")
    expect_error(read_ami_hmnet, p, 2, "appears twice")


@pytest.mark.shared
@pytest.mark.parametrize(("split", "counts"), [("train", HmnetCounts(97, 28388, 0, 475849)),
                                               ("dev", HmnetCounts(20, 5783, 0, 90184)),
                                               ("test", HmnetCounts(20, 5393, 0, 104621))])
def test_real_counts(shared_data: Path, split: str, counts: HmnetCounts) -> None:
    folder = shared_data / "ami-transcripts" / "AMI_proprec" / split
    assert scan_ami_hmnet(folder) == counts  # no empty turns in the public files: turns == utterances


@pytest.mark.shared
def test_real_ids_match_nbest(shared_data: Path) -> None:
    from privasr.corpus.formats.ami_tts import read_ami_tts

    recs = read_ami_hmnet(shared_data / "ami-transcripts" / "AMI_proprec" / "dev")
    by_id = {r.utt_id: r for r in recs}
    nbest = read_ami_tts(shared_data / "ami-tts-nbest" / "dev.jsonl.xz")
    assert all(n.utt_id in by_id and by_id[n.utt_id].speaker == n.speaker for n in nbest)
