"""The privacy audit runner (``privasr audit``) on the tiny demo corpus."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("faker")
pytest.importorskip("spacy")

from privasr.cli import main  # noqa: E402
from privasr.errors import ConfigError  # noqa: E402
from privasr.experiments.audit import load_audit_config, run_audit  # noqa: E402


def test_anonymisation_audit_on_the_demo_corpus(tmp_path):
    cfg = load_audit_config({"name": "t", "seed": 1, "anon": {"data": "synth", "synth_preset": "tiny",
                                                              "detector": "patterns", "canaries": 20}})
    m = run_audit(cfg, tmp_path / "out")
    res = json.loads((tmp_path / "out" / "results.json").read_text())
    a = res["sections"]["anon"]
    assert a["canaries"]["unlisted"]["canaries"] == a["canaries"]["listed"]["canaries"] == 20
    # a gazetteer catches every listed name; made-up names get through a patterns-only detector
    assert m["anon_canary_leak_rate_listed"] < m["anon_canary_leak_rate_unlisted"]
    assert m["anon_canary_leak_rate_unlisted"] > 0.5
    assert 0.0 <= m["anon_leak_rate"] <= 1.0 and a["leak"]["all"]["mentions"] > 0
    assert "| unlisted | 20 |" in (tmp_path / "out" / "report.md").read_text()


def test_config_errors(tmp_path, capsys):
    with pytest.raises(ConfigError, match="no section to run"):
        load_audit_config({"name": "x"})
    with pytest.raises(ConfigError, match="anon.canaries"):
        load_audit_config({"anon": {"canaries": 0}})
    (tmp_path / "c.yaml").write_text("anon: {data: nowhere}\n")
    assert main(["audit", "--config", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "o")]) == 2
    assert "anon.data" in capsys.readouterr().err


def test_dp_games_section_plays_each_configuration_and_its_planted_control(tmp_path):
    pytest.importorskip("dp_accounting")
    cfg = load_audit_config({"name": "t", "seed": 2, "dp_games": {"games": ["fedlm_all", "fmp_laplace"],
                                                                  "trials": 60}})
    m = run_audit(cfg, tmp_path / "out")
    games = json.loads((tmp_path / "out" / "results.json").read_text())["sections"]["dp_games"]["games"]
    assert sorted(games) == ["fedlm_all", "fmp_laplace"]
    for name in games:  # the releases hold; the planted leaks are caught
        assert m[f"dp_{name}_release_holds"] and not m[f"dp_{name}_control_holds"], games[name]
        assert games[name]["release"]["trials"] == games[name]["control"]["trials"] == 60
    assert m["dp_fmp_laplace_epsilon"] == pytest.approx(1.0, abs=1e-3)
    report = (tmp_path / "out" / "report.md").read_text()
    assert "control: noised sum / clients that reported" in report and "| **no** |" in report
    assert "fedlm weighting: words: clip_norm=0.5 with weighting='words'" in report  # refused before any work
    with pytest.raises(ConfigError, match="dp_games.games"):
        load_audit_config({"dp_games": {"games": ["fedlm_all", "fedlm_all"]}})
    with pytest.raises(ConfigError, match="dp_games.trials"):
        load_audit_config({"dp_games": {"trials": 3}})


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from privasr.synth import SynthConfig, generate

    d = tmp_path_factory.mktemp("synth")
    generate(SynthConfig.preset("tiny", seed=1)).write(d)
    return d


def _fmp_config(corpus, tmp):
    text = str(corpus / "text" / "background.txt")
    return {"name": "fmp-audit", "seed": 0,
            "data": {"dev": str(corpus / "nbest" / "dev.jsonl"), "test": str(corpus / "nbest" / "test.jsonl")},
            "clients": {"key": "client"},
            "nnlm": {"neural": {"train": {"text": text, "valid": text, "preset": "tiny-transformer", "seed": 0,
                                          "options": {"max_epochs": 1, "batch_size": 32, "lr": 0.01, "patience": 0,
                                                      "amp": False}}}},
            "cache_dir": str(tmp / "cache"),
            "search": {"ranges": {"lm": [0, 2, 0.5], "nnlm": [0, 2, 0.5], "word_penalty": [-2, 2, 1]}},
            "fmp": {"alpha": 0.5, "beta": 0.25, "sigma": 1.0, "rounds": 2}, "lam_grid": [0.5, 1.0],
            "dp": {"epsilon": 1.0, "unit": "utterance", "cap": 1.0, "accountant": "pld", "delta": 1.0e-5}}


def test_fmp_membership_games(corpus, tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("dp_accounting")
    cfg = load_audit_config({"name": "t", "seed": 0, "fmp": {"config": _fmp_config(corpus, tmp_path),
                                                             "population": 3, "trials": 60}})
    m = run_audit(cfg, tmp_path / "out")
    # without noise the planted word gives every member away: the bound is all the trials can prove
    for game in ("uploads", "aggregate"):
        assert m[f"fmp_{game}_tpr"] == 1.0 and m[f"fmp_{game}_fpr"] == 0.0 and m[f"fmp_{game}_eps_lb"] > 1.0
    res0 = json.loads((tmp_path / "out" / "results.json").read_text())["sections"]["fmp"]["games"]
    assert res0["uploads"]["separable"] and not res0["dp_aggregate"]["separable"]
    # with the DP release the audit never claims more than the accountant's epsilon
    assert m["fmp_dp_aggregate_epsilon"] == pytest.approx(1.0, abs=1e-3)
    assert 0.0 <= m["fmp_dp_aggregate_eps_lb"] <= m["fmp_dp_aggregate_epsilon"]
    res = json.loads((tmp_path / "out" / "results.json").read_text())
    games = res["sections"]["fmp"]["games"]
    assert games["uploads"]["eps_lb"] == pytest.approx(games["uploads"]["eps_lb_max"])
    assert "| the round's noisy sum (DP) |" in (tmp_path / "out" / "report.md").read_text()


def test_fedlm_section_runs_both_stages_into_the_report(corpus, tmp_path):
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)
    background = str(corpus / "text" / "background.txt")
    fedlm = {"name": "t", "seed": 0, "data": {"kind": "nbest", "dev": str(corpus / "nbest" / "test.jsonl"),
                                              "test": str(corpus / "nbest" / "dev.jsonl")},
             "clients": {"key": "client"},
             "nnlm": {"neural": {"train": {"text": background, "valid": background, "preset": "tiny-transformer",
                                           "seed": 0, "options": {"max_epochs": 1, "batch_size": 32, "lr": 0.01,
                                                                  "patience": 0, "amp": False}}}},
             "cache_dir": str(tmp_path / "cache"), "rounds": 2,
             "fedlm": {"loss": "token", "batch_size": 8, "client_lr": 1.0, "server": "fedavg"}}
    cfg = load_audit_config({"seed": 0, "fedlm": {"config": fedlm, "noise_multipliers": [1.0], "cohort": 2,
                                                  "canaries": {"n": 2, "repetitions": [1, 8], "candidates": 100}}})
    m = run_audit(cfg, tmp_path / "out")
    assert m["fedlm_wordset_recall"] == 1.0 and m["fedlm_wordset_precision"] == 1.0
    assert {k for k in m if k.startswith("fedlm_exposure_")} >= {"fedlm_exposure_no_dp_1x", "fedlm_exposure_no_dp_8x"}
    report = (tmp_path / "out" / "report.md").read_text()
    assert report.count("|---") >= 2 and "no DP" in report


def test_fmp_checkpoint_of_a_finished_run(corpus, tmp_path):
    pytest.importorskip("torch")
    from privasr.experiments.fmp import load_fmp_config, run_fmp

    raw = _fmp_config(corpus, tmp_path)
    raw.pop("dp")
    run_fmp(load_fmp_config({**raw, "lam_grid": [1.0]}), tmp_path / "run")
    m = run_audit(load_audit_config({"fmp_checkpoint": {"run": str(tmp_path / "run")}}), tmp_path / "out")
    # no DP: every word one client used is in the released sum, every unused word is exactly 0
    assert m["fmp_checkpoint_auc"] == 1.0 and m["fmp_checkpoint_fpr"] == 0.0
    (tmp_path / "empty").mkdir()
    with pytest.raises(Exception, match="not a finished `privasr fmp run`"):
        run_audit(load_audit_config({"fmp_checkpoint": {"run": str(tmp_path / "empty")}}), tmp_path / "out2")


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_fmp_games_on_flower_with_secure_aggregation(request, corpus, tmp_path):
    """The aggregate games on Flower's simulation engine, each trial's sum unmasked by SecAgg+."""
    if "slow" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("about 35 Flower simulations (minutes): run with -m slow")
    pytest.importorskip("flwr")
    raw = {**_fmp_config(corpus, tmp_path), "federated": {"backend": "flower", "secagg": {"enabled": True}}}
    cfg = load_audit_config({"fmp": {"config": raw, "population": 3, "trials": 16, "backend": "flower"}})
    m = run_audit(cfg, tmp_path / "out")
    res = json.loads((tmp_path / "out" / "results.json").read_text())
    games = res["sections"]["fmp"]["games"]
    assert res["sections"]["fmp"]["secagg"] is True
    # SecAgg hides who, not whether: every member's trial scores above every other (16 trials are too few to
    # prove an epsilon, so the bound itself is 0 here)
    assert games["aggregate"]["separable"] and games["aggregate"]["non_member_score_max"] == 0.0
    assert m["fmp_dp_aggregate_eps_lb"] <= m["fmp_dp_aggregate_epsilon"]
