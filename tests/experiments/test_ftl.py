"""``privasr ftl run`` (paper 002): config validation, a small synthetic run with the contract's keys, resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from privasr.asr.synth_an4 import synthetic_corpus  # noqa: E402
from privasr.cli import main  # noqa: E402
from privasr.errors import ConfigError  # noqa: E402
from privasr.experiments.ftl import load_ftl_config, run_ftl, split_speakers  # noqa: E402

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def _cfg(**over):
    raw = {"name": "t", "seed": 1,
           "data": {"kind": "synthetic", "speakers": 6, "utterances": 6, "test_speakers": 2, "valid_every": 3},
           "model": {"preset": "tiny", "arch": "ctc"}, "seed_model": {"epochs": 3, "lr": 0.005, "batch_size": 8},
           "rounds": 3, "federated": {"sampler": {"kind": "with_replacement", "n": 2}},
           "ftl": {"client_optimizer": {"name": "sgd", "lr": 0.3}, "server": {"name": "adam", "lr": 0.005}},
           "tables": {"variants": [{"name": "groups+replay", "clients": "groups",
                                    "ftl": {"replay_steps": 2, "weighting": "count"}}]},
           "clients": {"groups": 2}}
    raw.update(over)
    return load_ftl_config(raw)


@pytest.mark.parametrize(
    ("over", "match"),
    [
        ({"data": {"kind": "an5"}}, "data.kind"),
        ({"data": {"seed_fraction": 1.0}}, "seed_fraction"),
        ({"clients": {"key": "device"}}, "clients.key"),
        ({"ftl": {"weighting": "loss"}}, "weighting"),
        ({"model": {"preset": "huge"}}, "preset"),
        ({"eval": {"method": "viterbi"}}, "eval.method"),
        ({"eval": {"head": "both"}}, "eval.head"),
        ({"eval": {"head": "attention"}}, "model.arch is 'ctc'"),
        ({"eval": {"head": "ctc"}, "model": {"preset": "tiny", "arch": "seq2seq"}}, "no CTC head"),
        ({"eval": {"method": "greedy", "head": "joint"}, "model": {"preset": "tiny", "arch": "seq2seq",
                                                                  "ctc_weight": 0.3}}, "eval.method 'beam'"),
        ({"rounds": 0}, "rounds"),
        ({"colour": "red"}, "colour"),
        ({"seed_model": {"select": "first"}}, "seed_model.select"),
        ({"target_from_seed": 1.0}, "target_from_seed"),
        ({"target_from_seed": 0.8, "target_loss": 0.5}, "both set"),
    ],
)
def test_config_errors_name_the_key(over, match):
    with pytest.raises(ConfigError, match=match):
        _cfg(**over)


def test_the_shipped_config_validates_and_keeps_its_contract():
    from privasr.config import read_config

    cfg = load_ftl_config(read_config(CONFIGS / "ftl-an4.yaml"))
    assert cfg.clients.key == "speaker" and cfg.ftl.weighting == "softmax"
    assert cfg.ftl.server["name"] == "adam" and cfg.baseline.server["name"] in ("fedavg", "sgd")
    assert cfg.baseline.weighting == "count" and cfg.data.kind == "an4"


def test_the_baseline_is_plain_fedavg_whatever_the_system_adds():
    cfg = _cfg(ftl={"server": {"name": "adam", "lr": 0.005}, "temperature": 3.0, "replay_steps": 2})
    assert cfg.ftl.temperature == 3.0 and cfg.ftl.replay_steps == 2
    assert cfg.baseline.temperature == 1.0 and cfg.baseline.replay_steps == 0 and cfg.baseline.weighting == "count"
    assert cfg.baseline.client_optimizer == cfg.ftl.client_optimizer
    cfg = _cfg(baseline={"server": "fedavg", "replay_steps": 1})
    assert cfg.baseline.replay_steps == 1  # explicit overrides still win


def test_speaker_split_is_deterministic():
    a, _ = synthetic_corpus(speakers=4, utterances=3, test_speakers=2, seed=5)
    server, clients = split_speakers([u.speaker for u in a], 0.5)
    assert len(server) == 2 and len(clients) == 2 and not set(server) & set(clients)


def test_a_small_run_writes_the_contract_and_resumes_to_the_same_result(tmp_path):
    cfg = _cfg()
    m = run_ftl(cfg, tmp_path / "o")
    for k in ("wer", "cer", "rounds_to_target", "rounds_to_target_baseline", "wer_baseline"):
        assert k in m
    assert 0 <= m["mapsswe_p"] <= 1 and m["mapsswe_better"] in ("system", "baseline", "same")
    res = json.loads((tmp_path / "o" / "results.json").read_text())
    runs = res["runs"]
    # the test's 1-best hypotheses are kept, and MAPSSWE compares the system's with the baseline's
    from privasr.metrics.mapsswe import mapsswe

    test = synthetic_corpus(6, 6, 2, seed=1)[1]
    sig = mapsswe([u.words for u in test], [h.split() for h in runs["ftl"]["hypotheses"]],
                  [h.split() for h in runs["baseline"]["hypotheses"]], ids=[f"{u.speaker}-{u.utt_id}" for u in test])
    assert sig.p == m["mapsswe_p"] and len(runs["ftl"]["hypotheses"]) == len(test)
    assert set(runs) == {"ftl", "baseline", "groups+replay"} and runs["groups+replay"]["clients"] == 2
    assert len(runs["ftl"]["valid_loss"]) == 3
    # the target is the best validation loss of the baseline, which therefore reaches it
    assert m["target_loss"] == min(runs["baseline"]["valid_loss"]) and m["rounds_to_target_baseline"] is not None
    report = (tmp_path / "o" / "report.md").read_text()
    assert "| seed model |" in report
    # every run by its human name, in results.json's metrics and runs and in the report
    assert m["wer_system"] == runs["ftl"]["label"] == "FTL (client SGD + server Adam, softmax weighting)"
    assert m["wer_baseline_system"] == runs["baseline"]["label"] == "FedAvg (client SGD, count weighting)"
    assert runs["groups+replay"]["label"] == ("FTL (client SGD + server Adam, count weighting, server replay 2 steps, "
                                              "speaker groups as clients)")
    assert "| FTL (client SGD + server Adam, softmax weighting) (system, `ftl`) |" in report
    assert "the baseline reaches it by construction" in report
    # a second run in the same folder reuses the seed model and the finished checkpoints: same numbers
    again = run_ftl(cfg, tmp_path / "o")
    assert {k: v for k, v in again.items() if not k.endswith("_s")} == \
        {k: v for k, v in m.items() if not k.endswith("_s")}


def test_a_new_evaluation_reuses_the_trained_runs(tmp_path, monkeypatch):
    from privasr.federated.algorithms.ftl import FtlAlgorithm

    model = {"preset": "tiny", "arch": "seq2seq", "ctc_weight": 0.3}
    first = run_ftl(_cfg(model=model, rounds=2, tables={}, eval={"head": "attention"}), tmp_path / "o")

    def no_training(*a, **k):
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(FtlAlgorithm, "client_update", no_training)
    for ev in ({"head": "ctc"}, {"method": "beam", "beam": 3, "head": "joint"}):
        again = run_ftl(_cfg(model=model, rounds=2, tables={}, eval=ev, name="renamed"), tmp_path / "o")
        assert again["valid_loss"] == first["valid_loss"] and again["target_loss"] == first["target_loss"]
    assert json.loads((tmp_path / "o" / "results.json").read_text())["config"]["eval"]["head"] == "joint"


def test_cli_runs_with_overrides(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("data: {kind: synthetic, speakers: 4, utterances: 4, test_speakers: 2, valid_every: 2}\n"
                   "model: {preset: tiny, arch: ctc}\nseed_model: {epochs: 1}\n"
                   "federated: {sampler: {kind: with_replacement, n: 2}}\n")
    assert main(["ftl", "run", "--config", str(cfg), "--out", str(tmp_path / "o"), "--set", "rounds=1"]) == 0
    assert json.loads((tmp_path / "o" / "results.json").read_text())["metrics"]["rounds"] == 1
    assert main(["ftl", "run", "--config", str(cfg), "--out", str(tmp_path / "o"), "--set", "rounds=zero"]) == 2


@pytest.mark.slow
def test_flower_simulation_gives_the_local_result(tmp_path):
    pytest.importorskip("flwr")
    local = run_ftl(_cfg(rounds=2, tables={}), tmp_path / "local")
    flower = run_ftl(_cfg(rounds=2, tables={}, federated={"backend": "flower",
                                                          "sampler": {"kind": "with_replacement", "n": 2}}),
                     tmp_path / "flower")
    a = json.loads((tmp_path / "local" / "results.json").read_text())["runs"]
    b = json.loads((tmp_path / "flower" / "results.json").read_text())["runs"]
    for name in ("ftl", "baseline"):
        assert a[name]["valid_loss"] == pytest.approx(b[name]["valid_loss"], rel=1e-6)
    assert local["wer"] == pytest.approx(flower["wer"], abs=0.02)  # updates arrive in another order


def test_the_seed_model_epoch_can_be_chosen_on_held_out_server_utterances(tmp_path):
    cfg = _cfg(seed_model={"epochs": 3, "lr": 0.005, "batch_size": 8, "select": "best"}, rounds=1,
               tables={"variants": []})
    m = run_ftl(cfg, tmp_path / "out")
    losses = m["seed_model_held_out_loss"]
    assert len(losses) == 3 and m["seed_model_epoch"] == 1 + losses.index(min(losses))
    again = run_ftl(cfg, tmp_path / "out")  # from the cache: the same selection and result
    assert again["seed_model_epoch"] == m["seed_model_epoch"] and again["wer"] == m["wer"]
    assert "seed_model_epoch" not in run_ftl(_cfg(rounds=1, tables={"variants": []}), tmp_path / "last")


def test_compressed_runs_record_their_upload_bytes(tmp_path):
    cfg = _cfg(ftl={"client_optimizer": {"name": "sgd", "lr": 0.3}, "server": {"name": "adam", "lr": 0.005},
                    "compression": {"kind": "quantize", "bits": 8, "block": 64}}, tables={"variants": []})
    run_ftl(cfg, tmp_path / "q8")
    runs = json.loads((tmp_path / "q8" / "results.json").read_text())["runs"]
    sent, raw = runs["ftl"]["upload_bytes"], runs["ftl"]["upload_raw_bytes"]
    assert len(sent) == len(raw) == 3 and all(r / s > 3.5 for s, r in zip(sent, raw, strict=True))
    assert "Upload per client per round: ftl " in (tmp_path / "q8" / "report.md").read_text()
    plain = _cfg(tables={"variants": []})
    run_ftl(plain, tmp_path / "none")
    runs = json.loads((tmp_path / "none" / "results.json").read_text())["runs"]
    assert runs["ftl"]["upload_bytes"] == runs["ftl"]["upload_raw_bytes"]  # fp32: sent as it is


def test_a_target_from_the_seed_model_is_decided_by_neither_run(tmp_path):
    m = run_ftl(_cfg(target_from_seed=0.9, tables={"variants": []}, label="my FTL"), tmp_path / "o")
    res = json.loads((tmp_path / "o" / "results.json").read_text())
    assert m["target_loss"] == pytest.approx(0.9 * m["valid_loss_seed"])
    for name, key in (("ftl", "rounds_to_target"), ("baseline", "rounds_to_target_baseline")):
        losses = res["runs"][name]["valid_loss"]
        reached = [r + 1 for r, v in enumerate(losses) if v <= m["target_loss"] + 1e-12]
        assert m[key] == (reached[0] if reached else None)
    report = (tmp_path / "o" / "report.md").read_text()
    assert "0.9 times the seed model's validation loss" in report and "by construction" not in report
    assert m["wer_system"] == "my FTL" and "None" not in report
