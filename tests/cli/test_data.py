"""``privasr data`` commands: synth, inspect, convert, and their errors."""

import json

import pytest

from privasr.cli import main


@pytest.fixture(scope="module")
def synth_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth")
    assert main(["data", "synth", "--out", str(out), "--preset", "tiny", "--seed", "1"]) == 0
    return out


def test_synth_writes_corpus(synth_dir):
    assert (synth_dir / "nbest" / "dev.jsonl").is_file()
    assert (synth_dir / "text" / "background.txt").is_file()
    manifest = json.loads((synth_dir / "manifest.json").read_text())
    assert manifest["seed"] == 1


def test_synth_bad_override(tmp_path, capsys):
    assert main(["data", "synth", "--out", str(tmp_path), "--set", "n_clients=-3"]) == 2
    assert "n_clients" in capsys.readouterr().err
    assert main(["data", "synth", "--out", str(tmp_path), "--set", "no_such_knob=1"]) == 2


def test_inspect_json_counts(synth_dir, capsys):
    path = synth_dir / "nbest" / "test.jsonl"
    assert main(["data", "inspect", str(path), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    assert s["utterances"] == len(lines)
    assert s["clients"] == len({x["client"] for x in lines})
    assert s["words"] == sum(len(x["ref"].split()) for x in lines)
    assert 0 <= s["wer_oracle"] <= s["wer_1best"]
    in_list = sum(any(h["words"] == x["ref"] for h in x["hyps"]) for x in lines if x["ref"]) / len(lines)
    assert s["ref_in_list"] == pytest.approx(in_list) and 0 < in_list < 1


def test_inspect_table_and_folder(synth_dir, capsys):
    assert main(["data", "inspect", str(synth_dir / "nbest")]) == 0
    out = capsys.readouterr().out
    assert "dev" in out and "test" in out and "total" in out


def test_inspect_missing_and_malformed(tmp_path, capsys):
    assert main(["data", "inspect", str(tmp_path / "nope.jsonl")]) == 2
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"utt_id": "a", "hyps": [{"words": "x"}]}\n{"utt_id": "b", "hyps": [{"words": 3}]}\n')
    assert main(["data", "inspect", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.jsonl:2" in err
    assert "Traceback" not in err


def test_convert_roundtrip_and_refuses_overwrite(synth_dir, tmp_path, capsys):
    src = synth_dir / "nbest" / "dev.jsonl"
    before = src.read_bytes()
    dst = tmp_path / "dev.jsonl"
    assert main(["data", "convert", str(src), str(dst)]) == 0
    assert dst.read_bytes() == before  # canonical in, canonical out: byte-identical
    assert main(["data", "convert", str(src), str(dst)]) == 2  # exists, no --force
    assert main(["data", "convert", str(src), str(src), "--force"]) == 2  # never over the input
    assert src.read_bytes() == before
