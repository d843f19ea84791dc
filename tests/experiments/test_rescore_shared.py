"""End-to-end checks on the real data in ../shared (skipped cleanly without it)."""

from __future__ import annotations

import json

import pytest

from privasr.cli import main
from privasr.config import apply_overrides, read_config
from privasr.experiments.rescore import load_config

pytestmark = pytest.mark.shared

REPO_CONFIGS = __import__("pathlib").Path(__file__).resolve().parents[2] / "configs"


def test_configs_validate(shared_data):
    for name in ("rescore-ami-ngram", "rescore-ami-indomain-ngram", "rescore-librispeech-ngram"):
        load_config(read_config(REPO_CONFIGS / f"{name}.yaml"))


def test_ami_rescoring_end_to_end(shared_data, tmp_path):
    """configs/rescore-ami-ngram.yaml: the AMI-train trigram gives at least 5% relative WER reduction on test."""
    out = tmp_path / "ami"
    assert main(["rescore", "run", "--config", str(REPO_CONFIGS / "rescore-ami-ngram.yaml"),
                 "--set", "eval.bootstrap_resamples=200", "--out", str(out)]) == 0
    res = json.loads((out / "results.json").read_text())
    m = res["metrics"]
    assert m["wer_baseline"] == pytest.approx(0.5350, abs=5e-4)  # SOURCE.txt: 53.5%
    assert m["wer_rel_change"] <= -0.05 and m["mapsswe_p"] < 1e-3 and m["bootstrap_ci_high"] < 0
    assert m["dev_wer"] < m["dev_wer_baseline"] and m["wer_oracle"] < m["wer"]
    assert (out / "lm" / "ami3.arpa").is_file() and res["lms"]["ami3"]["cached"] is False
    # a second run reuses the cached LM and gives the same weights and WER
    cfg = load_config(apply_overrides(read_config(REPO_CONFIGS / "rescore-ami-ngram.yaml"),
                                      {"eval.bootstrap_resamples": 200, "eval.first_pass_retuned": False}))
    from privasr.experiments.rescore import run_rescore

    m2 = run_rescore(cfg, out)
    assert m2["weights"] == m["weights"] and m2["wer"] == m["wer"]
    assert json.loads((out / "results.json").read_text())["lms"]["ami3"]["cached"] is True


def test_adapted_configs_validate(shared_data):
    """Every config of the main N-best set loads with its runner's validator and points at the adapted set."""
    from privasr.experiments.anon import load_anon_config
    from privasr.experiments.fedlm import load_fedlm_config
    from privasr.experiments.fmp import load_fmp_config

    loaders = {"rescore": load_config, "fmp": load_fmp_config, "fedlm": load_fedlm_config,
               "anon": load_anon_config}
    names = sorted(p.stem for p in REPO_CONFIGS.glob("*-adapted.yaml"))
    assert len(names) == 10
    for name in names:
        raw = read_config(REPO_CONFIGS / f"{name}.yaml")
        assert raw["name"] == name
        assert all("ami-tts-nbest-adapted/" in str(raw["data"][k]) for k in ("dev", "test"))
        if "onnx" in str(raw.get("lms", "")):  # its model is an export a documented command makes first
            loaders[name.split("-")[0]](raw, check_files=False)
        else:
            loaders[name.split("-")[0]](raw)


def test_whisper_configs_validate_and_say_how_to_build_their_lists():
    """Every ``*-whisper.yaml`` loads with its runner's validator, reads the Whisper testbed, leaves the first-pass
    LM out (Whisper's lists have none), trains its LMs on neural-normalised text, and its comment names the
    command that builds the lists."""
    from privasr.experiments.anon import load_anon_config
    from privasr.experiments.fedlm import load_fedlm_config
    from privasr.experiments.fmp import load_fmp_config

    loaders = {"rescore": load_config, "fmp": load_fmp_config, "fedlm": load_fedlm_config,
               "anon": load_anon_config}
    paths = sorted(REPO_CONFIGS.glob("*-whisper.yaml"))
    assert {p.stem.split("-")[0] for p in paths} == set(loaders)
    for p in paths:
        raw = read_config(p)
        assert raw["name"] == p.stem
        assert all("testbeds/ami-tts-whisper/" in str(raw["data"][k]) for k in ("dev", "test"))
        cfg = loaders[p.stem.split("-")[0]](raw, check_files=False)
        text = p.read_text(encoding="utf-8")
        assert "rescore-ami-ngram-whisper.yaml" in text or "--engine whisper" in text
        assert "neural" in str(raw)
        if hasattr(cfg, "combine"):
            assert cfg.combine.first_pass_lm is False
        elif hasattr(cfg, "rescore"):
            assert cfg.rescore.first_pass_lm is False
