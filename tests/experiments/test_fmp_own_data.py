"""FMP on own data without torch: an ARPA base model, the ``background`` key (text files or an ARPA file's
unigrams, recorded in results.json), and the dev/test-overlap and tiny-sample warnings of the fmp and rescore
runners."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from privasr.cli import main
from privasr.errors import ConfigError
from privasr.experiments.fmp import load_fmp_config


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    from privasr.synth import SynthConfig, generate

    d = tmp_path_factory.mktemp("synth")
    generate(SynthConfig.preset("tiny", seed=1)).write(d)
    assert main(["lm", "train-ngram", "--text", str(d / "text" / "background.txt"), "--order", "3",
                 "--arpa", str(d / "bg3.arpa"), "--discount-fallback"]) == 0
    return d


def _config(corpus: Path, tmp: Path, **extra: object) -> Path:
    cfg = {"data": {"dev": str(corpus / "nbest" / "dev.jsonl"), "test": str(corpus / "nbest" / "test.jsonl")},
           "nnlm": str(corpus / "bg3.arpa"), "fmp": {"rounds": 2, "sigma": 1.0}, "lam_grid": [0.0, 1.0],
           "eval": {"bootstrap_resamples": 20}, **extra}
    p = tmp / "fmp.json"
    p.write_text(json.dumps(cfg))
    return p


def test_arpa_base_model_with_its_own_unigrams_by_default(corpus, tmp_path, capsys):
    assert main(["fmp", "run", "--config", str(_config(corpus, tmp_path)), "--out", str(tmp_path / "o")]) == 0
    res = json.loads((tmp_path / "o" / "results.json").read_text())
    assert res["background"]["kind"] == "arpa unigrams"
    assert res["background"]["sources"] == [str(corpus / "bg3.arpa")]
    assert res["data"]["background"]["sha256"]
    report = (tmp_path / "o" / "report.md").read_text()
    assert "Background unigram u(w): arpa unigrams" in report and "n-gram LM rescoring (baseline)" in report
    # a tiny test set: the significance tests are flagged, on stderr (one line each) and in the report
    err = capsys.readouterr().err
    assert "warning: the significance tests" in err and "test utterances (fewer than 100)" in report


def test_background_text_files_are_recorded(corpus, tmp_path):
    bg = str(corpus / "text" / "background.txt")
    cfg = _config(corpus, tmp_path, background=[bg, bg], fmp={"rounds": 1, "order": 2})
    assert main(["fmp", "run", "--config", str(cfg), "--out", str(tmp_path / "o")]) == 0
    res = json.loads((tmp_path / "o" / "results.json").read_text())
    assert res["background"]["kind"] == "text" and res["background"]["sources"] == [bg, bg]
    assert res["background"]["sentences"] == 2 * len(Path(bg).read_text().splitlines())
    assert {"background[0]", "background[1]"} <= set(res["data"])
    assert res["config"]["background"] == [bg, bg]


def test_dev_equal_to_test_warns(corpus, tmp_path, capsys):
    cfg = _config(corpus, tmp_path)
    assert main(["fmp", "run", "--config", str(cfg), "--set", f"data.test={corpus / 'nbest' / 'dev.jsonl'}",
                 "--out", str(tmp_path / "o")]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert any("same file" in line and "tuning sees the test set" in line for line in err)
    assert "**Warning:** dev and test are the same file" in (tmp_path / "o" / "report.md").read_text()


@pytest.mark.parametrize(("over", "match"), [
    ({"background": []}, "empty list"),
    ({"background": "no-such-file.txt"}, "no such file"),
    ({"background": ["{arpa}", "{text}"]}, "mixes an ARPA file"),
    ({"background": "{arpa}", "fmp": {"order": 2}}, "personal bigrams need background text"),
    ({"normalize": True}, "needs a neural LM"),
])
def test_background_and_base_model_config_errors(corpus, over, match):
    fill = {"{arpa}": str(corpus / "bg3.arpa"), "{text}": str(corpus / "text" / "background.txt")}
    over = {k: ([fill.get(x, x) for x in v] if isinstance(v, list) else fill.get(v, v) if isinstance(v, str) else v)
            for k, v in over.items()}
    raw = {"data": {"dev": str(corpus / "nbest" / "dev.jsonl"), "test": str(corpus / "nbest" / "test.jsonl")},
           "nnlm": str(corpus / "bg3.arpa"), **over}
    with pytest.raises(ConfigError, match=match):
        load_fmp_config(raw)


def test_rescore_warns_on_shared_ids_and_tiny_test(corpus, tmp_path, capsys):
    dev = corpus / "nbest" / "dev.jsonl"
    assert main(["rescore", "run", "--nbest", str(dev), "--dev", str(dev), "--lm", str(corpus / "bg3.arpa"),
                 "--out", str(tmp_path / "o")]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(err) == 2 and "same file" in err[0] and "significance tests" in err[1]
    res = json.loads((tmp_path / "o" / "results.json").read_text())
    assert res["metrics"]["warnings"][0].startswith("dev and test are the same file")
    report = (tmp_path / "o" / "report.md").read_text()
    assert report.count("**Warning:**") == 2
