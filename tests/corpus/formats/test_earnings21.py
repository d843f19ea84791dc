from __future__ import annotations

import io
import tarfile
from collections import Counter
from pathlib import Path

import pytest

from privasr.corpus.formats.earnings21 import call_tokens, read_earnings21, read_nlp, read_speaker_names
from privasr.corpus.records import Span

from ._helpers import expect_error

HEADER = "token|speaker|ts|endTs|punctuation|case|tags|wer_tags\n"


def test_fixture(test_data: Path) -> None:
    a, b = read_nlp(test_data / "formats" / "earnings21" / "nlp_references" / "c1.nlp")
    assert (a.utt_id, a.client, a.speaker, a.order) == ("c1_0000", "c1", "c1_0", 0)
    assert a.words == ("Good", "morning", "I'm", "Steve", "Jobs")  # the empty token is dropped
    assert a.entities == (Span(1, 2, "TIME"), Span(2, 3, "CONTRACTION"), Span(3, 5, "PERSON"))
    assert a.meta["entity_ids"] == ("5", "2", "9")  # '2' is typed from the tags column only
    assert a.meta["punctuation"] == ("", ".", "", "", ".") and a.meta["case"][0] == "UC"
    assert a.meta["dropped"] == ((7, "|0|||.|CA|['4:CARDINAL']|['4']"),)
    assert b.words == ("Thanks", "Steve") and b.entities == (Span(1, 2, "PERSON"),)
    assert a.times is None and "ts" not in a.meta


def test_folder_equals_file(test_data: Path) -> None:
    d = test_data / "formats" / "earnings21"
    assert read_earnings21(d) == read_nlp(d / "nlp_references" / "c1.nlp")
    assert call_tokens(read_earnings21(d)) == {"c1": ("Good", "morning", "I'm", "Steve", "Jobs", "Thanks", "Steve")}


def test_missing_tags_file(tmp_path: Path) -> None:
    p = tmp_path / "x.nlp"
    p.write_text(HEADER + "Bob|0||||UC|['1:PERSON']|['1']\n")
    assert read_nlp(p)[0].entities == ()


def test_times_and_raw_values(tmp_path: Path) -> None:
    p = tmp_path / "x.nlp"
    p.write_text(HEADER + "a|0|0.5|0.9|||[]|[]\nb|0|1.0|1.2|||[]|[]\nc|1||.|||[]|[]\n")
    a, b = read_nlp(p)
    assert a.times == ((0.5, 0.9), (1.0, 1.2)) and b.times is None and b.meta["endTs"] == (".",)


def test_tar(tmp_path: Path, test_data: Path) -> None:
    d = test_data / "formats" / "earnings21"
    tar = tmp_path / "refs.tar.xz"
    with tarfile.open(tar, "w:xz") as t:
        t.add(d / "nlp_references" / "c1.nlp", "nlp_references/c1.nlp")
        t.add(d / "wer_tags" / "c1.wer_tag.json", "wer_tags/c1.wer_tag.json")
        bad = (HEADER + "x|0||||LC|[|[]\n").encode()
        info = tarfile.TarInfo("nlp_references/c2.nlp")
        info.size = len(bad)
        t.addfile(info, io.BytesIO(bad))
    err = expect_error(read_earnings21, tar, 2, "tags column")
    assert err.path == f"{tar}:nlp_references/c2.nlp"


@pytest.mark.parametrize(
    ("body", "line", "needle"),
    [
        ("a|0||||LC|[]\n", 2, "7 fields"),
        ("a||||||[]|[]\n", 2, "speaker"),
        ("a b|0||||LC|[]|[]\n", 2, "whitespace"),
        ("a|0||||LC|[]|[1]\n", 2, "quoted"),
    ],
)
def test_malformed(tmp_path: Path, body: str, line: int, needle: str) -> None:
    p = tmp_path / "x.nlp"
    p.write_text(HEADER + body)
    expect_error(read_nlp, p, line, needle)
    p.write_text("tok|spk\n" + body)
    expect_error(read_nlp, p, 1, "header")


def test_speaker_names(test_data: Path, tmp_path: Path) -> None:
    names = read_speaker_names(test_data / "formats" / "earnings21" / "speaker-metadata.csv")
    assert names == {"c1_0": "Steve Jobs", "c1_1": "Cook, Tim"}
    p = tmp_path / "s.csv"
    p.write_text("file_id,speaker_id,speaker_name\nc1,0\n")
    expect_error(read_speaker_names, p, 2, "2 fields")


@pytest.mark.shared
def test_real_references(shared_data: Path) -> None:
    recs = read_earnings21(shared_data / "earnings21" / "references_nlp_wertags.tar.xz")
    assert len({r.client for r in recs}) == 44
    dropped = sum(len(r.meta.get("dropped", ())) for r in recs)
    assert dropped == 2  # two empty tokens in 4382825
    assert sum(len(r) for r in recs) + dropped == 362351
    assert len({r.speaker for r in recs}) == 467
    labels = Counter(s.label for r in recs for s in r.entities)
    assert labels["PERSON"] == 2212 and labels["ORG"] == 2871 and labels["DATE"] == 6533
    names = read_speaker_names(shared_data / "earnings21" / "speaker-metadata.csv")
    assert len(names) == 466 and {r.speaker for r in recs} - set(names) == {"4346818_13"}
