"""Own data on the command line: references for reference-less N-best lists (``--ref``), 1-best export,
HTK lattices as N-best input, and the folders ``privasr data synth`` / ``privasr demo`` write."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from privasr.cli import main
from privasr.corpus.formats.nbest_jsonl import read_nbest, read_transcripts, write_transcripts
from privasr.errors import InputError


@pytest.fixture(scope="module")
def synth_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth")
    assert main(["data", "synth", "--out", str(out), "--preset", "tiny", "--seed", "3"]) == 0
    return out


def inspect_json(capsys, *args: str) -> dict:
    capsys.readouterr()
    assert main(["data", "inspect", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


def test_inspect_synth_folder(synth_dir, capsys):
    s = inspect_json(capsys, str(synth_dir))
    assert s["privasr_folder"]["kind"] == "synth"
    assert s["privasr_folder"]["description"] == "a privasr data synth corpus (seed 3, 4 clients)"
    names = [d["name"] for d in s["datasets"]]
    assert names == ["nbest/dev", "nbest/test", "text/transcripts_dev", "text/transcripts_test", "text/background"]
    test = s["datasets"][1]
    assert test["utterances"] == len(read_nbest(synth_dir / "nbest" / "test.jsonl")) and "wer_1best" in test
    assert main(["data", "inspect", str(synth_dir)]) == 0
    out = capsys.readouterr().out
    assert "a privasr data synth corpus" in out and "text/background: background text" in out


def test_inspect_demo_folder(synth_dir, tmp_path, capsys):
    """The layout run_demo writes: corpus/, anon/*.jsonl, results.json, model folders."""
    demo = tmp_path / "demo-out"
    shutil.copytree(synth_dir, demo / "corpus")
    (demo / "results.json").write_text("{}\n")
    (demo / "fedlm").mkdir()
    (demo / "fedlm" / "model.pt").write_bytes(b"\0\1")
    write_transcripts(demo / "anon" / "transcripts_dev.tag.jsonl",
                      read_transcripts(synth_dir / "text" / "transcripts_dev.jsonl"))
    s = inspect_json(capsys, str(demo))
    assert s["privasr_folder"]["kind"] == "demo"
    assert [d["name"] for d in s["datasets"]][-1] == "anon/transcripts_dev.tag"
    assert s["privasr_folder"]["files"]["anon/transcripts_dev.tag"]["what"].startswith(
        "dev clients' transcripts, entities replaced by tags")
    # without the manifest it is no privasr folder: the scan reads what it recognises
    (demo / "corpus" / "manifest.json").unlink()
    (demo / "corpus" / "clients.json").unlink()
    assert "privasr_folder" not in inspect_json(capsys, str(demo))


def srilm_copy(synth_dir: Path, tmp_path: Path) -> Path:
    """The test N-best lists as SRILM files (which hold no references)."""
    out = tmp_path / "srilm"
    assert main(["data", "convert", str(synth_dir / "nbest" / "test.jsonl"), str(out), "--to", "srilm"]) == 0
    return out


def test_ref_on_srilm_gives_the_original_wer(synth_dir, tmp_path, capsys):
    original = inspect_json(capsys, str(synth_dir / "nbest" / "test.jsonl"))
    srilm = srilm_copy(synth_dir, tmp_path)
    bare = inspect_json(capsys, str(srilm))
    assert "wer_1best" not in bare
    refs = synth_dir / "text" / "transcripts_test.jsonl"
    with_refs = inspect_json(capsys, str(srilm), "--ref", str(refs))
    assert with_refs["words"] == original["words"]
    assert with_refs["wer_1best"] == pytest.approx(original["wer_1best"])
    assert with_refs["wer_oracle"] == pytest.approx(original["wer_oracle"])
    # and as a Kaldi text file, the same
    kaldi = tmp_path / "text"
    assert main(["data", "convert", str(refs), str(kaldi), "--to", "kaldi-text"]) == 0
    assert inspect_json(capsys, str(srilm), "--ref", str(kaldi))["wer_1best"] == pytest.approx(original["wer_1best"])
    # convert keeps them: canonical JSON Lines with references
    out = tmp_path / "with-refs.jsonl"
    assert main(["data", "convert", str(srilm), str(out), "--ref", str(kaldi)]) == 0
    assert all(nb.ref is not None for nb in read_nbest(out))


def test_ref_errors(synth_dir, tmp_path, capsys):
    srilm = srilm_copy(synth_dir, tmp_path)
    dev_refs = synth_dir / "text" / "transcripts_dev.jsonl"  # other utterances
    capsys.readouterr()
    assert main(["data", "inspect", str(srilm), "--ref", str(dev_refs)]) == 2
    err = one_error_line(capsys)
    n_test = len(read_nbest(synth_dir / "nbest" / "test.jsonl"))
    assert f"transcripts_dev.jsonl: {n_test} of {n_test} N-best lists have no reference: " in err
    # a conflicting reference: the synth lists have their own
    conflict = tmp_path / "conflict.jsonl"
    ts = read_transcripts(synth_dir / "text" / "transcripts_test.jsonl")
    write_transcripts(conflict, [ts[0].__class__(ts[0].utt_id, ("something", "else")), *ts[1:]])
    assert main(["data", "inspect", str(synth_dir / "nbest" / "test.jsonl"), "--ref", str(conflict)]) == 2
    assert f"utterance {ts[0].utt_id} already has the reference" in one_error_line(capsys)
    # a reference file that holds N-best lists, and references for transcripts only
    assert main(["data", "inspect", str(srilm), "--ref", str(synth_dir / "nbest" / "test.jsonl")]) == 2
    assert "holds N-best lists (nbest-jsonl), not references" in one_error_line(capsys)
    assert main(["data", "inspect", str(dev_refs), "--ref", str(dev_refs)]) == 2
    assert "--ref attaches references to N-best lists" in one_error_line(capsys)
    assert main(["data", "convert", str(srilm), str(tmp_path / "x.jsonl"), "--ref", str(dev_refs)]) == 2
    assert not (tmp_path / "x.jsonl").exists()


@pytest.mark.parametrize("to, line", [("kaldi-text", "{id} {words}"), ("trn", "{words} ({id})")])
def test_one_best_export(synth_dir, tmp_path, capsys, to, line):
    src = synth_dir / "nbest" / "dev.jsonl"
    dst = tmp_path / f"dev.{to}"
    assert main(["data", "convert", str(src), str(dst), "--to", to]) == 0
    assert "1-best transcripts" in capsys.readouterr().out
    nbs = read_nbest(src)
    assert dst.read_text().splitlines() == [line.format(id=nb.utt_id, words=nb.best.text).strip() for nb in nbs]


def test_lattices_to_nbest_and_one_best(shared_data, tmp_path, capsys):
    lats = shared_data / "ami-htk-lattices"
    if not lats.is_dir():
        pytest.skip("ami-htk-lattices not in the shared data")
    s = inspect_json(capsys, str(lats))
    assert (s["format"], s["utterances"], s["hyps_per_utt"]) == ("htk-lattice", 8, 10.0)
    assert inspect_json(capsys, str(lats), "--nbest", "3")["hyps_per_utt"] == 3.0
    # the 1-best as Kaldi text, then that file as the lattices' references: 1-best WER 0
    text = tmp_path / "text"
    assert main(["data", "convert", str(lats), str(text), "--to", "kaldi-text", "--nbest", "2"]) == 0
    assert len(text.read_text().splitlines()) == 8
    s = inspect_json(capsys, str(lats), "--ref", str(text))
    assert s["wer_1best"] == 0.0 and s["wer_oracle"] == 0.0
    nb = tmp_path / "lat.jsonl"
    assert main(["data", "convert", str(lats), str(nb), "--nbest", "4"]) == 0
    recs = read_nbest(nb)
    assert len(recs) == 8 and all(len(r.hyps) == 4 and set(r.best.scores) == {"am", "lm", "total"} for r in recs)
    capsys.readouterr()
    assert main(["data", "inspect", str(nb), "--nbest", "3"]) == 2
    assert "--nbest is for HTK lattices" in one_error_line(capsys)


def test_bad_lattice_is_one_line(tmp_path, capsys):
    lat = tmp_path / "u1.lat"
    lat.write_text("VERSION=1.0\nN=2 L=1\nI=0 t=0.0 W=!NULL\nI=1 t=0.5 W=hi\nJ=0 S=0 E=9 a=-1\n")
    capsys.readouterr()
    assert main(["data", "inspect", str(lat)]) == 2
    assert "u1.lat:5: link 0 refers to node 9" in one_error_line(capsys)


def test_rescore_config_data_ref(synth_dir, tmp_path):
    """``data.ref``: one reference file for the dev and the test set of a rescoring run."""
    from privasr.experiments.rescore import load_config, load_data

    sets = {}
    for split in ("dev", "test"):
        sets[split] = tmp_path / f"srilm-{split}"
        assert main(["data", "convert", str(synth_dir / "nbest" / f"{split}.jsonl"), str(sets[split]),
                     "--to", "srilm"]) == 0
    refs = tmp_path / "refs.jsonl"
    write_transcripts(refs, [t for split in ("dev", "test")
                             for t in read_transcripts(synth_dir / "text" / f"transcripts_{split}.jsonl")])
    spec = {"data": {"dev": str(sets["dev"]), "test": str(sets["test"]), "ref": str(refs)},
            "search": {"method": "fixed", "weights": {"lm": 1.0, "word_penalty": 0.0}}}
    data = load_data(load_config(spec))
    for split, recs in (("dev", data.dev), ("test", data.test)):
        original = {nb.utt_id: nb.ref for nb in read_nbest(synth_dir / "nbest" / f"{split}.jsonl")}
        assert {nb.utt_id: nb.ref for nb in recs or []} == original
    assert data.fingerprints["ref"] == refs
    spec["data"]["ref"] = str(synth_dir / "text" / "transcripts_test.jsonl")  # misses the dev utterances
    with pytest.raises(InputError, match="N-best lists have no reference"):
        load_data(load_config(spec))
