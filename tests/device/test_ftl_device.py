"""FTL devices: each builds its client from its own feature files and transcripts with the bundle (units, CMVN
over its own utterances, frame stacking), served through Flower's message path in one process, against the same
run over clients built on the operator's machine."""

from __future__ import annotations

import json

import numpy as np
import pytest

from privasr.cli import main
from privasr.device.folder import init_device
from privasr.device.ftl import read_transcripts, write_ftl_replay
from privasr.device.node import Device, dispatch
from privasr.errors import InputError

pytest.importorskip("torch")


def _raw(**over):
    raw = {"name": "ftl-devices", "seed": 1,
           "data": {"kind": "synthetic", "speakers": 6, "utterances": 6, "test_speakers": 2, "valid_every": 3},
           "model": {"preset": "tiny", "arch": "ctc"}, "seed_model": {"epochs": 2, "lr": 0.005, "batch_size": 8},
           "rounds": 2, "federated": {"sampler": "all"},
           "ftl": {"client_optimizer": {"name": "sgd", "lr": 0.3}, "server": {"name": "adam", "lr": 0.005}}}
    raw.update(over)
    return raw


def test_ftl_devices_match_the_operator_side_clients(tmp_path, monkeypatch):
    import pickle

    from privasr.asr.synth_an4 import synthetic_corpus
    from privasr.asr.train import an4_examples
    from privasr.experiments.ftl import load_ftl_config, operator_side, split_speakers
    from privasr.federated.algorithms.ftl import FtlClient
    from privasr.federated.backends.flower_inprocess import serve_inprocess
    from privasr.federated.backends.flower_serve import write_serve_kit
    from privasr.federated.loop import run_federated

    cfg = load_ftl_config(_raw())
    train, _ = synthetic_corpus(6, 6, 2, seed=1)
    _, client_spk = split_speakers([u.speaker for u in train], cfg.data.seed_fraction)
    mine = [u for u in train if u.speaker in set(client_spk)]
    fed, write = operator_side(cfg, tmp_path / "prepare", len(client_spk))
    kit = write_serve_kit(tmp_path / "kit", fed, write)
    info = json.loads((kit / "kit.json").read_text())
    reps = write_ftl_replay(mine, tmp_path / "replay", rounds=0)
    devices = [Device(init_device(tmp_path / f"d{i}", bundle=kit / "bundle", bundle_hash=info["bundle"], index=i,
                                  name=spk, trusted_apps=(info["app"],)).root, replay=r)
               for i, (spk, r) in enumerate(reps)]
    assert all(d.kind == "ftl" for d in devices)

    def no_pickle(*a, **k):
        raise AssertionError("a device unpickled something")

    with monkeypatch.context() as m:
        m.setattr(pickle, "load", no_pickle)
        m.setattr(pickle, "loads", no_pickle)
        res, _ = serve_inprocess(dispatch(devices), len(devices), fed.algorithm, rounds=fed.rounds,
                                 sampler=fed.sampler, seed=fed.seed, min_clients=fed.min_clients,
                                 privacy=None, checkpoint_dir=tmp_path / "ckpt", key=fed.key)
    assert all(h.reported == len(devices) for h in res.history)
    # the MFC round trip keeps the features bit for bit; the same clients made on the operator's machine
    tok = fed.algorithm.tokenizer
    clients = [FtlClient(spk, tuple(an4_examples([u for u in mine if u.speaker == spk], tok, cmvn="speaker")))
               for spk, _ in reps]
    local = run_federated(fed.algorithm, clients, rounds=fed.rounds, sampler=fed.sampler, seed=fed.seed)
    for k, v in local.state["params"].items():
        np.testing.assert_allclose(res.state["params"][k], v, rtol=1e-5, atol=1e-6)


def test_ftl_files_and_refusals(tmp_path, capsys):
    (tmp_path / "t.txt").write_text("u1 HELLO\n")
    with pytest.raises(InputError, match="no feature file u1.mfc"):
        read_transcripts(tmp_path / "t.txt")
    raw = _raw(data={"kind": "an4"})
    (tmp_path / "c.json").write_text(json.dumps(raw))
    assert main(["serve", "ftl", "--config", str(tmp_path / "c.json"), "--devices", "2", "--out",
                 str(tmp_path / "k")]) == 2
    err = capsys.readouterr().err
    assert "synthetic" in err or "data.root" in err
