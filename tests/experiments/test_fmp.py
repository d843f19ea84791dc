"""The FMP experiment runner end to end on the project's synthetic corpus (tiny NNLM trained on the fly)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from privasr.cli import main  # noqa: E402
from privasr.config import apply_overrides  # noqa: E402
from privasr.errors import ConfigError  # noqa: E402
from privasr.experiments.fmp import load_fmp_config, run_fmp  # noqa: E402


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    from privasr.synth import SynthConfig, generate

    d = tmp_path_factory.mktemp("synth")
    generate(SynthConfig.preset("tiny", seed=1)).write(d)
    return d


def _raw(corpus: Path, tmp: Path, **over) -> dict:
    raw = {"name": "fmp-test", "seed": 0,
           "data": {"dev": str(corpus / "nbest" / "dev.jsonl"), "test": str(corpus / "nbest" / "test.jsonl")},
           "clients": {"key": "client"},
           "nnlm": {"neural": {"train": {"text": str(corpus / "text" / "background.txt"),
                                         "valid": str(corpus / "text" / "background.txt"),
                                         "preset": "tiny-transformer", "seed": 0,
                                         "options": {"max_epochs": 1, "batch_size": 32, "lr": 0.01,
                                                     "patience": 0, "amp": False}}}},
           "cache_dir": str(tmp / "cache"),
           "search": {"ranges": {"lm": [0, 2, 0.5], "nnlm": [0, 2, 0.5], "word_penalty": [-2, 2, 1]}},
           "fmp": {"alpha": 0.5, "beta": 0.25, "sigma": 1.0, "rounds": 2},
           "lam_grid": [0.0, 0.5, 1.0],
           "eval": {"bootstrap_resamples": 50}}
    return apply_overrides(raw, over)


def test_run_writes_the_contract_metrics_and_tables(corpus, tmp_path, monkeypatch):
    from privasr.experiments import fmp

    seeds, real = [], fmp.simulate

    def spy(*a, **k):
        if k.get("dp") is not None:
            seeds.append(k["seed"])
        return real(*a, **k)

    monkeypatch.setattr(fmp, "simulate", spy)
    cfg = load_fmp_config(_raw(corpus, tmp_path, **{"tables": {"rounds": [1, 2], "epsilon": [1.0]}}))
    m = run_fmp(cfg, tmp_path / "out")
    assert seeds == [0, 1, 2, 3, 4]  # the epsilon row's noise draws: distinct seeds
    for k in ("wer", "wer_baseline", "wer_rel_change", "mapsswe_p", "rounds", "lam"):
        assert k in m
    assert m["rounds"] == 2 and m["lam"] in (0.0, 0.5, 1.0)
    res = json.loads((tmp_path / "out" / "results.json").read_text())
    assert res["metrics"]["wer"] == m["wer"] and res["config"]["name"] == "fmp-test"
    assert [r["T"] for r in res["tables"]["rounds"]] == [1, 2]
    eps = res["tables"]["epsilon"][0]
    assert eps["epsilon"] == pytest.approx(1.0, abs=1e-3)  # per draw, not multiplied by the draws
    # the epsilon row is the mean of 5 noise draws (distinct seeds), with their range
    assert eps["draws"] == 5 and len(eps["mapsswe_p_draws"]) == 5
    assert eps["wer_min"] <= eps["wer"] <= eps["wer_max"]
    assert len(res["history"]) == 3  # T + 1 rounds
    report = (tmp_path / "out" / "report.md").read_text()
    assert m["wer_system"].endswith(" rescoring + FMP, T = 2") and f"| {m['wer_system']} |" in report
    assert f"| {m['wer_baseline_system']} (baseline) |" in report
    # lam = 0 is exactly the baseline
    if m["lam"] == 0.0:
        assert m["wer"] == m["wer_baseline"]


def test_lam_zero_reproduces_the_baseline(corpus, tmp_path):
    m = run_fmp(load_fmp_config(_raw(corpus, tmp_path, lam_grid=[0.0])), tmp_path / "out")
    assert m["wer"] == m["wer_baseline"] and m["changed_vs_baseline"] == 0
    assert m["word_changes"] == {"gained": [], "lost": [], "net": 0, "words_changed": 0}


def test_word_changes_account_for_the_wer_change(corpus, tmp_path):
    m = run_fmp(load_fmp_config(_raw(corpus, tmp_path, lam_grid=[3.0])), tmp_path / "out")
    wc = m["word_changes"]
    assert set(wc) == {"gained", "lost", "net", "words_changed"}
    if len(wc["gained"]) + len(wc["lost"]) == wc["words_changed"]:  # nothing cut by the top-15 lists
        assert wc["net"] == sum(n for _, n in wc["gained"]) - sum(n for _, n in wc["lost"])
    if m["changed_vs_baseline"] and wc["words_changed"]:
        assert "recognised correctly more often" in (tmp_path / "out" / "report.md").read_text()


def test_dp_run_reports_epsilon_and_delta(corpus, tmp_path):
    pytest.importorskip("dp_accounting")
    raw = _raw(corpus, tmp_path, dp={"epsilon": 0.5, "unit": "utterance", "cap": 1.0})
    m = run_fmp(load_fmp_config(raw), tmp_path / "out")
    assert m["epsilon"] == pytest.approx(0.5, abs=1e-3) and m["delta"] == 1e-5
    assert not {"fmp_s", "tables_s", "total_s"} & set(m)  # the federated stage's time grows with the data
    # per round only functions of the noised running sum, and the accountant's figures
    for h in json.loads((tmp_path / "out" / "results.json").read_text())["history"]:
        assert set(h["metrics"]) == {"qbar_mass", "qbar_support", "has_qbar", "epsilon", "delta"}
        assert (h["sampled"], h["reported"], h["dropped"], h["seconds"], h["client_seconds"]) == \
            (None, None, {}, None, None)


@pytest.mark.parametrize(("over", "match"), [
    ({"fmp.alpha": 0.9}, "alpha"),
    ({"fmp.refresh": "never"}, "refresh"),
    ({"fmp.rounds": -1}, "fmp.rounds"),
    ({"lam_grid": []}, "lam_grid"),
    ({"dp": {"epsilon": 0}}, "dp.epsilon"),
    ({"dp": {"epsilon": 1, "unit": "meeting"}}, "dp.unit"),
    ({"federated.backend": "pigeon"}, "federated.backend"),
    ({"federated.sampler": {"kind": "sometimes"}}, "sometimes"),
    ({"colour": 1}, "colour"),
    ({"clients.key": "room"}, "clients.key"),
])
def test_config_errors(corpus, tmp_path, over, match):
    with pytest.raises(ConfigError, match=match):
        load_fmp_config(_raw(corpus, tmp_path, **over))


def test_cli_bad_config_is_one_line(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("name: x\ncolour: red\n")
    assert main(["fmp", "run", "--config", str(p), "--out", str(tmp_path / "o")]) == 2


def test_ray_backend_gives_the_local_result(corpus, tmp_path):
    pytest.importorskip("ray")
    local = run_fmp(load_fmp_config(_raw(corpus, tmp_path, lam_grid=[1.0])), tmp_path / "local")
    ray = run_fmp(load_fmp_config(_raw(corpus, tmp_path, lam_grid=[1.0],
                                       federated={"backend": "ray", "backend_options": {"num_workers": 2}})),
                  tmp_path / "ray")
    assert ray["wer"] == local["wer"] and ray["changed_vs_baseline"] == local["changed_vs_baseline"]


@pytest.mark.slow
def test_flower_backend_gives_the_local_result(corpus, tmp_path):
    pytest.importorskip("flwr")
    local = run_fmp(load_fmp_config(_raw(corpus, tmp_path, lam_grid=[1.0])), tmp_path / "local")
    fl = run_fmp(load_fmp_config(_raw(corpus, tmp_path, lam_grid=[1.0], federated={"backend": "flower"})),
                 tmp_path / "flower")
    assert fl["wer"] == local["wer"]


def test_single_file_split_by_key_with_a_rank_prior(corpus, tmp_path):
    raw = _raw(corpus, tmp_path, lam_grid=[0.5])
    raw["data"] = {"nbest": str(corpus / "nbest" / "test.jsonl"), "split": {"key": "client", "dev": "even"}}
    raw["combine"] = {"prior": "rank", "first_pass_lm": False}
    raw["search"] = {"ranges": {"nnlm": [0, 2, 0.5], "word_penalty": [-2, 2, 1]}}
    m = run_fmp(load_fmp_config(raw), tmp_path / "out")
    res = json.loads((tmp_path / "out" / "results.json").read_text())
    assert set(res["split"]["dev"]).isdisjoint(res["split"]["test"])
    assert set(m["weights_baseline"]) == {"nnlm", "word_penalty"}
    raw["data"]["dev"] = "x"
    with pytest.raises(ConfigError, match="nbest and dev/test"):
        load_fmp_config(raw)


def test_oracle_cache_is_a_flagged_diagnostic(corpus, tmp_path):
    m = run_fmp(load_fmp_config(_raw(corpus, tmp_path, lam_grid=[1.0], oracle_cache=True)), tmp_path / "out")
    assert m["oracle_cache"] is True and 0.0 <= m["wer"] <= 1.0
    assert "Diagnostic run" in (tmp_path / "out" / "report.md").read_text()
    with pytest.raises(ConfigError, match="oracle_cache"):
        load_fmp_config(_raw(corpus, tmp_path, oracle_cache="yes"))


def test_personal_bigram_run_and_table(corpus, tmp_path):
    raw = _raw(corpus, tmp_path, lam_grid=[0.5], lam2_grid=[0.0, 1.0], tables={"bigram": [2]})
    raw["fmp"]["order"] = 2
    m = run_fmp(load_fmp_config(raw), tmp_path / "out")
    assert m["order"] == 2 and m["lam2"] in (0.0, 1.0) and len(m["lam2_trace"]) == 2
    res = json.loads((tmp_path / "out" / "results.json").read_text())
    assert res["tables"]["bigram"][0]["T"] == 2 and res["tables"]["bigram"][0]["lam2"] == m["lam2"]


def test_exactly_normalised_run(corpus, tmp_path):
    m0 = run_fmp(load_fmp_config(_raw(corpus, tmp_path, lam_grid=[0.0], normalize=True)), tmp_path / "zero")
    assert m0["normalized"] is True and m0["wer"] == m0["wer_baseline"]  # f = 0: Z = 1, nothing changes
    m = run_fmp(load_fmp_config(_raw(corpus, tmp_path, lam_grid=[1.0], normalize=True)), tmp_path / "one")
    assert 0.0 <= m["wer"] <= 1.0
    with pytest.raises(ConfigError, match="normalize"):
        load_fmp_config(_raw(corpus, tmp_path, normalize=True, oracle_cache=True))


def test_the_background_is_normalised_as_the_nnlm_was_trained(corpus, tmp_path):
    """u(w) counts the words the NNLM saw: with ``normalize: neural`` on the NNLM's training text the
    background text is normalised the same way; an explicit ``background`` is read as it is."""
    from privasr.experiments.fmp import background, background_normalize
    from privasr.federated.algorithms.fmp_data import WordIds

    text = tmp_path / "bg.txt"
    text.write_text("we're here\nwe're gonna go\n", encoding="utf-8")
    raw = _raw(corpus, tmp_path, **{"nnlm.neural.train.text": str(text), "nnlm.neural.train.normalize": "neural"})
    cfg = load_fmp_config(raw)
    assert background_normalize(cfg) == "neural"
    vocab = WordIds(("<unk>", "<s>", "</s>", "we", "are", "here", "going", "to", "go", "we're"))
    u, sents, _ = background(cfg, vocab)
    assert sents == [("we", "are", "here"), ("we", "are", "going", "to", "go")]
    assert u[vocab.words.index("we're")] < u[vocab.words.index("are")]
    explicit = load_fmp_config({**raw, "background": str(text)})
    assert background_normalize(explicit) is None and ("we're", "here") in background(explicit, vocab)[1]
