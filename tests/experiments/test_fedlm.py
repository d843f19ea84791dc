"""The FedLM experiment runner end to end: the synthetic N-best corpus and a tiny Earnings-21-shaped fixture."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from privasr.cli import main  # noqa: E402
from privasr.confidence.features import FEATURE_NAMES  # noqa: E402
from privasr.config import apply_overrides  # noqa: E402
from privasr.errors import ConfigError, InputError  # noqa: E402
from privasr.experiments.fedlm import load_fedlm_config, run_fedlm  # noqa: E402


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    from privasr.synth import SynthConfig, generate

    d = tmp_path_factory.mktemp("synth")
    generate(SynthConfig.preset("tiny", seed=1)).write(d)
    return d


def _nnlm(corpus: Path) -> dict:
    return {"neural": {"train": {"text": str(corpus / "text" / "background.txt"),
                                 "valid": str(corpus / "text" / "background.txt"),
                                 "preset": "tiny-transformer", "seed": 0,
                                 "options": {"max_epochs": 1, "batch_size": 32, "lr": 0.01, "patience": 0,
                                             "amp": False}}}}


def _raw(corpus: Path, tmp: Path, **over) -> dict:
    raw = {"name": "fedlm-test", "seed": 0,
           # the tiny corpus's test part has three clients: it is the client (dev) side here
           "data": {"kind": "nbest", "dev": str(corpus / "nbest" / "test.jsonl"),
                    "test": str(corpus / "nbest" / "dev.jsonl")},
           "clients": {"key": "client"},
           "nnlm": _nnlm(corpus),
           "cache_dir": str(tmp / "cache"),
           "fedlm": {"loss": "token", "batch_size": 8, "client_lr": 0.5, "server": {"name": "adam", "lr": 0.01}},
           "rounds": 2,
           "federated": {"backend": "local", "sampler": "all"},
           "rescore": {"ranges": {"lm": [0, 2, 0.5], "nnlm": [0, 2, 0.5], "word_penalty": [-2, 2, 1]}},
           "eval": {"bootstrap_resamples": 50}}
    return apply_overrides(raw, over)


def test_nbest_run_writes_the_contract_metrics(corpus, tmp_path):
    m = run_fedlm(load_fedlm_config(_raw(corpus, tmp_path, **{"eval.every": 1})), tmp_path / "out")
    for k in ("wer", "wer_baseline", "wer_rel_change", "mapsswe_p", "ppl", "ppl_baseline", "ppl_all_utts"):
        assert k in m and np.isfinite(m[k])
    assert m["ppl"] != m["ppl_baseline"]  # the model moved
    assert m["ppl"] != m["ppl_all_utts"]  # token weighting is not the unweighted run
    res = json.loads((tmp_path / "out" / "results.json").read_text())
    assert res["metrics"]["ppl"] == m["ppl"] and res["config"]["name"] == "fedlm-test"
    assert len(res["history"]) == 2 and "eval_ppl" in res["history"][-1]["metrics"]
    # the last round's evaluation is the final model's perplexity
    assert res["history"][-1]["metrics"]["eval_ppl"] == pytest.approx(m["ppl"], rel=1e-9)
    assert res["data_info"]["confidence_source"] == "data"  # the synthetic 1-bests carry confidences
    report = (tmp_path / "out" / "report.md").read_text()
    assert m["wer_system"].startswith("federatedly fine-tuned NNLM rescoring") and f"| {m['wer_system']} |" in report
    assert f"| {m['wer_baseline_system']} (baseline) |" in report
    # the adapted model is saved as a neural checkpoint with the run's perplexity
    from privasr.experiments.fedlm import MODEL_FILE
    from privasr.lm.neural.checkpoint import load_checkpoint

    ck = load_checkpoint(tmp_path / "out" / MODEL_FILE)
    assert len(ck.vocab) == m["vocab_size"] and ck.extra["ppl"] == m["ppl"]


def test_with_baseline_interpolates_the_unadapted_nnlm(corpus, tmp_path):
    raw = _raw(corpus, tmp_path, rounds=1, compare_all=False, **{"rescore.with_baseline": True})
    m = run_fedlm(load_fedlm_config(raw), tmp_path / "out")
    res = json.loads((tmp_path / "out" / "results.json").read_text())
    assert m["rescore_with_baseline"] is True
    assert set(res["rescore"]["weights_adapted"]) == {"lm", "nnlm", "nnlm_adapted", "word_penalty"}
    # the configured NNLM range applies to both NNLM weights
    assert res["rescore"]["weights_adapted"]["nnlm_adapted"] <= 2.0
    with pytest.raises(ConfigError, match="with_baseline"):
        load_fedlm_config(_raw(corpus, tmp_path, **{"rescore.with_baseline": "yes"}))


def test_a_resumed_run_equals_the_finished_one(corpus, tmp_path):
    raw = _raw(corpus, tmp_path, compare_all=False, **{"eval.every": 1})
    first = run_fedlm(load_fedlm_config(raw), tmp_path / "out")
    again = run_fedlm(load_fedlm_config(raw), tmp_path / "out")  # every round is in the checkpoint
    assert again["ppl"] == first["ppl"] and again["wer"] == first["wer"]
    # the per-round evaluations were checkpointed with their rounds
    hist = json.loads((tmp_path / "out" / "results.json").read_text())["history"]
    assert [h["metrics"]["eval_ppl"] for h in hist][-1] == pytest.approx(first["ppl"], rel=1e-9)


def test_classifier_confidences_are_cross_fitted_and_reported(corpus, tmp_path):
    pytest.importorskip("sklearn")
    raw = _raw(corpus, tmp_path, confidence={"source": "classifier", "folds": 2}, compare_all=False)
    m = run_fedlm(load_fedlm_config(raw), tmp_path / "out")
    assert 0.0 <= m["ece"] <= 1.0 and 0.0 <= m["auc"] <= 1.0
    res = json.loads((tmp_path / "out" / "results.json").read_text())
    assert res["confidence"]["folds"] == 2 and res["data_info"]["confidence_source"] == "classifier"
    assert (tmp_path / "out" / "reliability.csv").is_file()
    assert "Reliability diagram" in (tmp_path / "out" / "report.md").read_text()
    assert res["confidence"]["features"][-1] == "decoder_confidence"
    # the synthetic 1-bests' own confidences left out of the classifier: another, weaker model
    raw = _raw(corpus, tmp_path, confidence={"source": "classifier", "folds": 2,
                                            "exclude_features": ["decoder_confidence"]}, compare_all=False)
    cfg = load_fedlm_config(raw)
    assert "decoder_confidence" not in cfg.confidence.features()
    from privasr.experiments.fedlm import _cross_fit

    dev = [nb for nb in load_nbest_for_test(corpus) if nb.best.words]
    _, without, _ = _cross_fit(dev, cfg)
    assert "decoder_confidence" not in without["features"] and without["auc"] < m["auc"]


def load_nbest_for_test(corpus):
    from privasr.corpus.formats.nbest_jsonl import read_nbest

    return read_nbest(corpus / "nbest" / "test.jsonl")


@pytest.mark.parametrize("confidence,needle", [
    ({"source": "classifier", "exclude_features": ["pitch"]}, "confidence.exclude_features"),
    ({"source": "classifier", "exclude_features": list(FEATURE_NAMES)}, "confidence.exclude_features"),
    ({"source": "oracle", "exclude_features": ["agreement"]}, "N-best classifier only"),
])
def test_bad_exclude_features(corpus, tmp_path, confidence, needle):
    with pytest.raises(ConfigError, match=needle):
        load_fedlm_config(_raw(corpus, tmp_path, confidence=confidence))


def test_the_reference_text_oracle_trains_on_the_dev_references(corpus, tmp_path):
    from privasr.corpus.formats.nbest_jsonl import read_nbest

    raw = _raw(corpus, tmp_path, compare_all=False, rounds=1, **{"data.client_text": "reference"})
    m = run_fedlm(load_fedlm_config(raw), tmp_path / "out")
    info = json.loads((tmp_path / "out" / "results.json").read_text())["data_info"]
    refs = [nb.ref for nb in read_nbest(corpus / "nbest" / "test.jsonl") if nb.ref]
    assert info["client_text"] == "reference" and info["words"] == sum(len(r) for r in refs)
    first_pass = run_fedlm(load_fedlm_config(_raw(corpus, tmp_path, compare_all=False, rounds=1)), tmp_path / "fp")
    assert m["ppl"] != first_pass["ppl"] and m["ppl_baseline"] == first_pass["ppl_baseline"]
    with pytest.raises(ConfigError, match="data.client_text"):
        load_fedlm_config(_raw(corpus, tmp_path, **{"data.client_text": "gold"}))


def test_oracle_confidences_are_the_reference_alignment_labels(corpus, tmp_path):
    from privasr.confidence.features import labels_many
    from privasr.experiments.fedlm import load_data

    data = load_data(load_fedlm_config(_raw(corpus, tmp_path, confidence={"source": "oracle"})))
    labels = {nb.utt_id: y for nb, y in zip(data.dev, labels_many(data.dev), strict=True)}
    by_words = {nb.best.words: labels[nb.utt_id] for nb in data.dev if nb.best.words}
    seen = 0
    for _, utts in data.clients:
        for words, conf in utts:
            assert set(np.unique(conf)) <= {0.0, 1.0} and conf.tolist() == by_words[words].astype(float).tolist()
            seen += 1
    assert seen and any(c.min() == 0.0 for _, u in data.clients for _, c in u)  # the fixture has errors


def test_dp_run_reports_epsilon_and_delta_from_the_accountant(corpus, tmp_path):
    pytest.importorskip("dp_accounting")
    from privasr.privacy.dp.accounting import epsilon_for

    raw = _raw(corpus, tmp_path, compare_all=False, dp={"noise_multiplier": 1.5, "delta": 1e-5},
               **{"fedlm.clip_norm": 0.5, "fedlm.weighting": "uniform"})
    m = run_fedlm(load_fedlm_config(raw), tmp_path / "out")
    assert m["delta"] == 1e-5 and m["noise_multiplier"] == 1.5 and m["clip_norm"] == 0.5
    # every client every round: 2 un-amplified Gaussian releases
    assert m["epsilon"] == pytest.approx(epsilon_for(1.5, 2, "all", delta=1e-5), rel=1e-6)
    # what the run publishes: per round only the released step's norm, epsilon and delta (and the server's own
    # evaluation); no count of sampled or reporting clients, no drop reasons, no seconds, no loss or tokens
    res = json.loads((tmp_path / "out" / "results.json").read_text())
    for h in res["history"]:
        assert set(h["metrics"]) <= {"update_norm", "epsilon", "delta", "eval_ppl"}
        assert {"update_norm", "epsilon", "delta"} <= set(h["metrics"])
        assert (h["sampled"], h["reported"], h["dropped"], h["seconds"], h["client_seconds"]) == \
            (None, None, {}, None, None)
    assert m["denominator"] == m["population"] == m["clients"]  # every client sampled: N, declared by the run
    assert not {"federated_s", "variants_s", "total_s"} & set(m)  # the federated stage's time grows with the data
    assert "fixed denominator" in (tmp_path / "out" / "report.md").read_text()


def test_loss_and_init_tables_and_the_noise_table(corpus, tmp_path):
    pytest.importorskip("dp_accounting")
    raw = _raw(corpus, tmp_path, rounds=1, compare_all=False,
               tables={"loss": ["all", "token"], "init": ["scratch"], "noise": [0.0, 0.5], "noise_draws": 3},
               **{"fedlm.clip_norm": 0.5, "fedlm.weighting": "uniform"})
    m = run_fedlm(load_fedlm_config(raw), tmp_path / "out")
    t = json.loads((tmp_path / "out" / "results.json").read_text())["tables"]
    assert [r["loss"] for r in t["loss"]] == ["none (unadapted)", "all", "token"]
    assert t["loss"][0]["ppl"] == m["ppl_baseline"] and t["loss"][2]["ppl"] == m["ppl"]  # the main run is reused
    assert t["loss"][0]["wer"] == m["wer_baseline"] and t["loss"][2]["wer"] == m["wer"]  # N-best data: WER too
    assert t["init"][0]["ppl"] > m["ppl"]  # one round from scratch is far worse than fine-tuning
    zero, noisy = t["noise"]
    assert zero["draws"] == 1 and zero["ppl_min"] == zero["ppl"] == zero["ppl_max"]  # no noise, nothing to draw
    assert noisy["epsilon"] > 0 and noisy["delta"] == 1e-5
    # every noisy row is the mean of 3 runs that differ in their noise draw only
    assert noisy["draws"] == 3 and len(noisy["mapsswe_p_draws"]) == 3
    assert noisy["ppl_min"] < noisy["ppl_max"] and noisy["ppl_min"] <= noisy["ppl"] <= noisy["ppl_max"]
    assert noisy["wer_min"] <= noisy["wer"] <= noisy["wer_max"]
    assert noisy["mapsswe_p"] == float(np.median(noisy["mapsswe_p_draws"]))
    report = (tmp_path / "out" / "report.md").read_text()
    assert "means over 3 runs that differ only in their noise draw" in report and "mapsswe_p_draws" not in report
    with pytest.raises(ConfigError, match="noise_draws"):
        load_fedlm_config({**raw, "tables": {"noise": [1.0], "noise_draws": 0}})


def test_zipf_devices_and_speaker_clients(corpus, tmp_path):
    m = run_fedlm(load_fedlm_config(_raw(corpus, tmp_path, compare_all=False, rounds=1,
                                         clients={"key": "zipf", "devices": 50, "exponent": 1.0})),
                  tmp_path / "zipf")
    assert 1 < m["clients"] <= 50


def test_ray_backend_matches_the_local_run(corpus, tmp_path):
    pytest.importorskip("ray")
    raw = _raw(corpus, tmp_path, rounds=1, compare_all=False)
    local = run_fedlm(load_fedlm_config(raw), tmp_path / "local")
    ray = run_fedlm(load_fedlm_config({**raw, "federated": {"backend": "ray", "backend_options": {"num_workers": 2},
                                                            "sampler": "all"}}), tmp_path / "ray")
    # the same client updates, summed in arrival order: equal up to float32 rounding
    assert ray["ppl"] == pytest.approx(local["ppl"], rel=1e-4)


@pytest.mark.slow
def test_flower_backend_matches_the_local_run(corpus, tmp_path):
    pytest.importorskip("flwr")
    raw = _raw(corpus, tmp_path, rounds=1, compare_all=False)
    local = run_fedlm(load_fedlm_config(raw), tmp_path / "local")
    fl = run_fedlm(load_fedlm_config({**raw, "federated": {"backend": "flower", "sampler": "all"}}),
                   tmp_path / "flower")
    assert fl["ppl"] == pytest.approx(local["ppl"], rel=1e-4)


@pytest.mark.parametrize(("over", "match"), [
    ({"data": {"kind": "lattice"}}, "data.kind"),
    ({"data": {"kind": "nbest", "dev": "x"}}, "needs dev and test"),
    ({"fedlm.loss": "confident"}, "loss"),
    ({"fedlm.clip_norm": 1.0}, "weighting"),
    ({"dp": {"noise_multiplier": 1.0}}, "clip_norm"),
    ({"rounds": 0}, "rounds"),
    ({"init": "random"}, "init"),
    ({"tables": {"loss": ["best"]}}, "tables.loss"),
    ({"tables": {"noise": [1.0]}}, "clip_norm"),
    ({"tables": {"threshold": [1.5]}}, "tables.threshold"),
    ({"tables": {"threshold": 0.5}}, "tables.threshold"),
    ({"confidence": {"source": "psychic"}}, "confidence.source"),
    ({"clients": {"key": "room"}}, "clients.key"),
    ({"federated.backend": "pigeon"}, "federated.backend"),
    ({"colour": 1}, "colour"),
])
def test_config_errors(corpus, tmp_path, over, match):
    with pytest.raises(ConfigError, match=match):
        load_fedlm_config(_raw(corpus, tmp_path, **over))


def test_cli_runs_and_a_bad_config_is_one_line(corpus, tmp_path, capsys):
    import yaml

    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(_raw(corpus, tmp_path, rounds=1, compare_all=False)))
    assert main(["fedlm", "run", "--config", str(p), "--out", str(tmp_path / "o")]) == 0
    assert "perplexity" in capsys.readouterr().out
    p.write_text("name: x\ncolour: red\n")
    assert main(["fedlm", "run", "--config", str(p), "--out", str(tmp_path / "o2")]) == 2


# ------------------------------------------------------------------------------- Earnings-21-shaped fixture

_WORDS = "the company reported strong revenue growth in the quarter and margins improved".split()


def _tar(path: Path, files: dict[str, str]) -> Path:
    with tarfile.open(path, "w:xz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _earnings_fixture(d: Path, error_rate: float = 0.0) -> Path:
    """Four calls of 30 six-word utterances; with ``error_rate``, that share of the CTM words is the word
    "quarterback" in place of the reference word (same confidence distribution: only the word tells)."""
    rng = np.random.default_rng(0)
    ctms, nlps = {}, {}
    for call in ("100", "200", "300", "400"):
        lines, rows = [], ["token|speaker|ts|endTs|punctuation|case|tags|wer_tags"]
        t = 0.0
        for _ in range(30):
            words = [_WORDS[int(i)] for i in rng.integers(0, len(_WORDS), size=6)]
            for w in words:
                said = "quarterback" if rng.uniform() < error_rate else w
                lines.append(f"{call} A {t:.2f} 0.20 {said.upper()} {rng.uniform(0.3, 1.0):.2f}")
                rows.append(f"{w.capitalize()}|0||||LC|[]|[]")
                t += 0.25
            rows[-1] = rows[-1].replace("||||", "|||.|")
            lines.append(f"{call} A {t:.2f} 0.10 , 1.00")  # punctuation: no letter or digit, dropped
            t += 1.5  # a pause: next utterance
        ctms[f"ctm/{call}.ctm"] = "\n".join(lines) + "\n"
        nlps[f"nlp_references/{call}.nlp"] = "\n".join(rows) + "\n"
    _tar(d / "ctm.tar.xz", ctms)
    _tar(d / "refs.tar.xz", nlps)
    (d / "eval.csv").write_text("file_id,company_name\n400,Acme\n")
    (d / "background.txt").write_text(" ".join(_WORDS) + "\n")
    return d


@pytest.fixture(scope="module")
def earnings(tmp_path_factory) -> Path:
    return _earnings_fixture(tmp_path_factory.mktemp("e21"))


@pytest.fixture(scope="module")
def earnings_noisy(tmp_path_factory) -> Path:
    return _earnings_fixture(tmp_path_factory.mktemp("e21-noisy"), error_rate=0.3)


def _e21_raw(earnings: Path, corpus: Path, tmp: Path, **over) -> dict:
    raw = {"name": "fedlm-e21-test", "seed": 0,
           "data": {"kind": "earnings21", "ctm": str(earnings / "ctm.tar.xz"),
                    "references": str(earnings / "refs.tar.xz"), "eval_calls": str(earnings / "eval.csv"),
                    "split_gap": 1.0},
           "nnlm": _nnlm(corpus), "cache_dir": str(tmp / "cache"),
           "fedlm": {"loss": "token", "batch_size": 4, "client_lr": 0.5, "server": "fedavg"},
           "rounds": 2, "tables": {"loss": ["all", "threshold", "utterance", "token"]}}
    return apply_overrides(raw, over)


def test_earnings21_run_holds_out_the_eval_calls(earnings, corpus, tmp_path):
    m = run_fedlm(load_fedlm_config(_e21_raw(earnings, corpus, tmp_path)), tmp_path / "out")
    assert m["clients"] == 3 and m["eval_sentences"] == 30
    res = json.loads((tmp_path / "out" / "results.json").read_text())
    assert res["data_info"]["eval_calls"] == ["400"] and "400" not in res["data_info"]["client_calls"]
    rows = {r["loss"]: r["ppl"] for r in res["tables"]["loss"]}
    assert rows["all"] == m["ppl_all_utts"] and rows["token"] == m["ppl"]
    assert len(set(rows.values())) == len(rows)  # every weighting trains a different model
    assert "wer" not in m  # no N-best lists: perplexity only


def test_earnings21_calibration_calls_leave_the_clients_and_are_reported(earnings, corpus, tmp_path):
    pytest.importorskip("sklearn")
    raw = _e21_raw(earnings, corpus, tmp_path, tables={}, compare_all=False, rounds=1,
                   confidence={"source": "data", "calibrate_calls": 1})
    m = run_fedlm(load_fedlm_config(raw), tmp_path / "out")
    res = json.loads((tmp_path / "out" / "results.json").read_text())
    assert m["clients"] == 2 and res["data_info"]["calibration_calls"] == ["100"]
    assert "100" not in res["data_info"]["client_calls"]
    # the fixture's CTM words are the reference words: every word is a hit, the raw confidences (0.3-1.0) are
    # under-confident, and calibration moves them up
    assert res["confidence"]["base_rate"] == 1.0 and m["ece"] < m["ece_raw"]
    assert res["data_info"]["mean_confidence"] > 0.9
    with pytest.raises(ConfigError, match="calibrate_calls"):
        load_fedlm_config(_raw(corpus, tmp_path, confidence={"source": "data", "calibrate_calls": 2}))


def test_earnings21_labelled_calls_are_a_dev_set_and_thresholds_report_what_they_keep(earnings, corpus,
                                                                                     tmp_path):
    pytest.importorskip("sklearn")
    raw = _e21_raw(earnings, corpus, tmp_path, compare_all=False, rounds=1,
                   confidence={"source": "data", "calibrate_calls": 1},
                   fedlm={"loss": "threshold", "threshold": 0.0, "batch_size": 4, "client_lr": 0.5,
                          "server": "fedavg"},
                   tables={"loss": ["all"], "threshold": [0.0, 1.0]})
    m = run_fedlm(load_fedlm_config(raw), tmp_path / "out")
    res = json.loads((tmp_path / "out" / "results.json").read_text())
    # the dev set is call 100's reference (30 sentences), never a client's or an eval call's text
    assert m["dev_sentences"] == 30 and m["ppl_dev"] < m["ppl_dev_baseline"]
    assert m["threshold_kept_words"] == 1.0
    rows = {r["threshold"]: r for r in res["tables"]["threshold"]}
    # calibrated confidences are all below 1: threshold 1 drops every utterance and the model stays put
    assert rows[0.0]["kept_words"] == 1.0 and rows[1.0]["kept_words"] == 0.0
    assert rows[1.0]["ppl_dev"] == pytest.approx(m["ppl_dev_baseline"]) and rows[1.0]["ppl_dev"] > m["ppl_dev"]
    # threshold 0 keeps everything: the same run as the main one; "all" trains the same data, so same result
    assert rows[0.0]["ppl"] == m["ppl"] and rows[0.0]["ppl_dev"] == m["ppl_dev"]
    loss_all = res["tables"]["loss"][1]
    assert loss_all["loss"] == "all" and abs(loss_all["ppl_dev"] - m["ppl_dev"]) < 1e-6 * m["ppl_dev"]
    assert all("ppl_dev" in r for r in res["tables"]["threshold"])
    assert "Development set" in (tmp_path / "out" / "report.md").read_text()


def test_kept_share_counts_the_words_of_utterances_at_or_over_the_threshold():
    from privasr.experiments.fedlm import _Data, _kept_share

    utts = [(("a", "b"), np.array([0.2, 0.4])), (("c", "d", "e", "f"), np.array([0.6, 0.6, 0.6, 0.6]))]
    data = _Data([("x", utts)], [], {})
    assert [_kept_share(data, c) for c in (0.0, 0.3, 0.31, 0.6, 0.61)] == [1.0, 1.0, 4 / 6, 4 / 6, 0.0]


def test_earnings21_ctm_classifier_learns_what_the_confidences_miss(earnings_noisy, corpus, tmp_path):
    pytest.importorskip("sklearn")
    raw = _e21_raw(earnings_noisy, corpus, tmp_path, tables={}, compare_all=False, rounds=1,
                   confidence={"source": "classifier", "calibrate_calls": 1,
                               "background": str(earnings_noisy / "background.txt")})
    m = run_fedlm(load_fedlm_config(raw), tmp_path / "out")
    res = json.loads((tmp_path / "out" / "results.json").read_text())
    assert m["clients"] == 2 and res["data_info"]["calibration_calls"] == ["100"]
    conf = res["confidence"]
    assert conf["method"] == "ctm classifier" and conf["classifier"]["feature_names"][0] == "confidence"
    # the CTM confidences carry no signal here; the word's absence from the background text does
    assert m["auc_raw"] < 0.6 and m["auc"] > 0.95
    assert 0.6 < res["data_info"]["mean_confidence"] < 0.8  # about 70% of the client words are right


def test_earnings21_oracle_confidences_mark_exactly_the_wrong_words(earnings_noisy, corpus, tmp_path):
    from privasr.experiments.fedlm import _earnings21

    data = _earnings21(load_fedlm_config(_e21_raw(earnings_noisy, corpus, tmp_path,
                                                  confidence={"source": "oracle"})))
    pairs = [(w, c) for _, utts in data.clients for words, conf in utts for w, c in zip(words, conf, strict=True)]
    assert pairs and all((c == 0.0) == (w == "quarterback") for w, c in pairs)


def test_earnings21_classifier_config_errors(earnings, corpus, tmp_path):
    with pytest.raises(ConfigError, match="calibrate_calls"):
        load_fedlm_config(_e21_raw(earnings, corpus, tmp_path, confidence={"source": "classifier"}))
    with pytest.raises(ConfigError, match="confidence.background"):
        load_fedlm_config(_e21_raw(earnings, corpus, tmp_path,
                                   confidence={"source": "data", "background": "gutenberg"}))
    cfg = load_fedlm_config(_e21_raw(earnings, corpus, tmp_path,
                                     confidence={"source": "classifier", "calibrate_calls": 1}))
    assert cfg.confidence.background == str(corpus / "text" / "background.txt")  # the NNLM's training text


def test_earnings21_errors_name_the_problem(earnings, corpus, tmp_path):
    with pytest.raises(InputError, match="no reference"):
        run_fedlm(load_fedlm_config(_e21_raw(earnings, corpus, tmp_path, **{"data.eval_calls": ["999"]})),
                  tmp_path / "o")
    with pytest.raises(ConfigError, match="speaker"):
        load_fedlm_config(_e21_raw(earnings, corpus, tmp_path, clients={"key": "speaker"}))


@pytest.mark.parametrize("name", ["fedlm-earnings21", "fedlm-earnings21-rev", "fedlm-ami", "fedlm-ami-dp",
                                  "fedlm-ami-whisper", "fedlm-ami-adapted", "fedlm-ami-posteriors"])
def test_shipped_configs_validate(name):
    from privasr.config import read_config

    root = Path(__file__).resolve().parents[2]
    cfg = load_fedlm_config(read_config(root / "configs" / f"{name}.yaml"), check_files=False)
    assert cfg.name == name
    if name == "fedlm-ami-dp":
        assert cfg.dp is not None and cfg.dp.noise_multiplier == 1.5 and cfg.fedlm["clip_norm"] == 0.5
    if name.startswith("fedlm-earnings21"):
        assert cfg.fedlm["loss"] == "token" and cfg.compare_all  # the contract: ppl, ppl_baseline, ppl_all_utts


def test_lists_without_a_first_pass_lm_score_rescore_with_first_pass_lm_off(corpus, tmp_path):
    """An end-to-end recogniser's lists (Whisper's) have an ``am`` total and no ``lm``: rescoring leaves the
    first-pass LM term out, and asking for it is an error, not a silent zero."""
    import dataclasses

    from privasr.corpus.formats.nbest_jsonl import read_nbest, write_nbest

    paths = {}
    for part in ("dev", "test"):
        recs = [dataclasses.replace(nb, hyps=tuple(dataclasses.replace(h, scores={"am": h.scores["am"]})
                                                   for h in nb.hyps))
                for nb in read_nbest(corpus / "nbest" / f"{part}.jsonl")]
        paths[part] = tmp_path / f"{part}.jsonl"
        write_nbest(paths[part], recs)
    over = {"data.dev": str(paths["test"]), "data.test": str(paths["dev"]), "rounds": 1, "compare_all": False,
            "rescore.first_pass_lm": False, "rescore.ranges": {"nnlm": [0, 2, 0.5], "word_penalty": [-2, 2, 1]}}
    run_fedlm(load_fedlm_config(_raw(corpus, tmp_path, **over)), tmp_path / "out")
    res = json.loads((tmp_path / "out" / "results.json").read_text())
    assert set(res["rescore"]["weights_adapted"]) == {"nnlm", "word_penalty"}
    with pytest.raises((InputError, ConfigError), match="lm"):
        run_fedlm(load_fedlm_config(_raw(corpus, tmp_path, **{**over, "rescore.first_pass_lm": True})),
                  tmp_path / "out2")
