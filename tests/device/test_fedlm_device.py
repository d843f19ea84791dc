"""fedlm devices: each builds its client from its own N-best lists with the bundle (1-best text, word
confidences from the operator's classifier), served through Flower's message path in one process, against the
same run over clients built on the operator's machine."""

from __future__ import annotations

import json

import numpy as np
import pytest

from privasr.cli import main
from privasr.device.folder import init_device, write_replay
from privasr.device.node import Device, dispatch
from privasr.errors import ConfigError, InputError

from .conftest import fmp_config


def _fedlm_config(corpus, cache, **over):
    c = fmp_config(corpus, cache)
    raw = {"name": "fedlm-devices", "seed": 0,
           "data": {"kind": "nbest", "dev": str(corpus / "nbest" / "dev.jsonl"),
                    "test": str(corpus / "nbest" / "test.jsonl")},
           "clients": {"key": "client"}, "nnlm": c["nnlm"], "cache_dir": str(cache),
           "confidence": {"source": "classifier", "kind": "gbm"},
           "fedlm": {"loss": "token", "batch_size": 8, "client_lr": 0.5, "server": {"name": "adam", "lr": 0.01}},
           "rounds": 2, "federated": {"backend": "local", "sampler": "all"}}
    raw.update(over)
    return raw


def test_fedlm_devices_match_the_operator_side_clients(synth_corpus, tmp_path, monkeypatch):
    import os
    import pickle
    import sys
    from pathlib import Path

    from privasr.corpus.load import load_nbest
    from privasr.corpus.records import Population
    from privasr.device.bundle import read_bundle
    from privasr.experiments.fedlm import load_fedlm_config, operator_side
    from privasr.federated.algorithms.fedlm import FedLmClient
    from privasr.federated.backends.flower_inprocess import serve_inprocess
    from privasr.federated.backends.flower_serve import write_serve_kit
    from privasr.federated.loop import run_federated

    cfg = load_fedlm_config(_fedlm_config(synth_corpus, tmp_path / "cache"))
    test_file = (synth_corpus / "nbest" / "test.jsonl").resolve()
    test = load_nbest(test_file)
    pop = list(Population.group(test, key="client"))
    opened: list[str] = []
    active = [True]

    def hook(event, args):
        if active[0] and event == "open" and isinstance(args[0], str | os.PathLike):
            opened.append(os.fspath(args[0]))

    sys.addaudithook(hook)
    try:
        fed, write = operator_side(cfg, tmp_path / "prepare", len(pop))
        kit = write_serve_kit(tmp_path / "kit", fed, write)
    finally:
        active[0] = False
    assert not any(Path(p).resolve() == test_file for p in opened)  # the devices' lists are never opened
    assert any(Path(p).name == "dev.jsonl" for p in opened)
    info = json.loads((kit / "kit.json").read_text())
    b = read_bundle(kit / "bundle", expected=info["bundle"])
    assert b.kind == "fedlm" and b.settings["confidence"]["source"] == "classifier"
    assert not any(k.startswith("nnlm/") for k in b.arrays)  # the weights come with every round
    reps = write_replay(test, tmp_path / "replay", key="client", rounds=0)  # every list there from the start
    devices = [Device(init_device(tmp_path / f"d{i}", bundle=kit / "bundle", bundle_hash=info["bundle"], index=i,
                                  name=name, trusted_apps=(info["app"],)).root, replay=r)
               for i, (name, r) in enumerate(reps)]
    assert all(d.kind == "fedlm" for d in devices)

    def no_pickle(*a, **k):
        raise AssertionError("a device unpickled something")

    with monkeypatch.context() as m:
        m.setattr(pickle, "load", no_pickle)
        m.setattr(pickle, "loads", no_pickle)
        res, _ = serve_inprocess(dispatch(devices), len(devices), fed.algorithm, rounds=fed.rounds,
                                 sampler=fed.sampler, seed=fed.seed, min_clients=fed.min_clients,
                                 privacy=fed.privacy, checkpoint_dir=tmp_path / "ckpt", key=fed.key)
    # the same clients made on the operator's machine: the 1-best as ids, the classifier's confidences
    model = devices[0].model
    clients = []
    for c in pop:
        kept = [nb for nb in c.utterances if nb.best.words]
        conf = [np.clip(np.asarray(x, dtype=np.float64), 0, 1) for x in model.classifier.predict_many(kept)]
        clients.append(FedLmClient(c.id, tuple(tuple(model.vocab.encode(nb.best.words)) for nb in kept),
                                   tuple(conf)))
    local = run_federated(fed.algorithm, clients, rounds=fed.rounds, sampler=fed.sampler, seed=fed.seed)
    for k, v in local.state["params"].items():
        np.testing.assert_allclose(res.state["params"][k], v, rtol=1e-6, atol=1e-7)
    assert any(not np.array_equal(local.state["params"][k], fed.algorithm.init_state[k])
               for k in local.state["params"])  # the model moved
    with pytest.raises(ConfigError, match="no personal rescoring"):
        devices[0].rescore()


def test_serve_fedlm_refusals(synth_corpus, tmp_path, capsys):
    for over, match in (({"confidence": {"source": "oracle"}}, "needs the devices' references"),
                        ({"data": {"kind": "nbest", "dev": str(synth_corpus / "nbest" / "dev.jsonl"),
                                   "test": str(synth_corpus / "nbest" / "test.jsonl"),
                                   "client_text": "reference"}}, "which devices do not have")):
        (tmp_path / "c.json").write_text(json.dumps(_fedlm_config(synth_corpus, tmp_path / "cache", **over)))
        assert main(["serve", "fedlm", "--config", str(tmp_path / "c.json"), "--devices", "2", "--out",
                     str(tmp_path / "k")]) == 2
        assert match in capsys.readouterr().err


def test_fedlm_device_files_ctm_and_kaldi_text(tmp_path):
    """A fedlm device takes CTM files (cut at pauses, lowercased, with their confidences) and Kaldi text (no
    confidences) beside N-best lists; a CTM without confidences is set aside, naming the file."""
    from privasr.device.fedlm import read_client_text

    (tmp_path / "a.ctm").write_text("c1 A 0.0 0.2 Good 0.9\nc1 A 0.2 0.1 , 1.0\nc1 A 0.3 0.2 Day 0.8\n"
                                    "c1 A 5.0 0.5 Um 0.4\n")
    recs = read_client_text(tmp_path / "a.ctm", 1.0)
    assert [(r.utt_id, r.best.words, r.best.confidences) for r in recs] == [
        ("c1_0000", ("good", "day"), (0.9, 0.8)), ("c1_0001", ("um",), (0.4,))]
    (tmp_path / "text").write_text("u1 hello there\nu2 bye\n")
    recs = read_client_text(tmp_path / "text")
    assert [(r.utt_id, r.best.words, r.best.confidences) for r in recs] == [
        ("u1", ("hello", "there"), None), ("u2", ("bye",), None)]
    (tmp_path / "b.ctm").write_text("c2 A 0.0 0.2 Good\n")
    with pytest.raises(InputError, match="b.ctm"):
        read_client_text(tmp_path / "b.ctm", 1.0)
