"""Deployment kits: ``privasr fed split`` writes a run as per-device folders, a Flower app and credentials;
``privasr fed run`` runs the kit's commands on loopback (slow)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr")

from privasr.cli import main  # noqa: E402
from privasr.errors import ConfigError, InputError  # noqa: E402
from privasr.federated.backends.flower_kit import KIT_FILES, read_kit, run_kit, write_kit  # noqa: E402
from privasr.federated.client_store import load_client  # noqa: E402
from privasr.federated.loop import Federation, run_federated  # noqa: E402
from privasr.federated.sampling import AllClients, UniformWithoutReplacement  # noqa: E402
from privasr.federated.secagg import SecAggSettings  # noqa: E402


def _fmp(n_clients=3, v=30, seed=5):
    from privasr.federated.algorithms import FmpAlgorithm, FmpClient, FmpConfig, FmpUtterance

    rng = np.random.default_rng(seed)
    clients = []
    for c in range(n_clients):
        groups = []
        for g in range(3):
            utts = tuple(FmpUtterance(f"c{c}g{g}u{k}", tuple(rng.integers(0, v, size=4) for _ in range(4)),
                                      np.sort(rng.normal(size=4))[::-1], 0.7) for k in range(2))
            groups.append(utts)
        clients.append(FmpClient(f"meeting-{c}", tuple(groups)))
    u = np.full(v, 1.0 / v)
    return Federation(FmpAlgorithm(FmpConfig(), u), clients, 3, AllClients(), seed=2,
                      secagg=SecAggSettings(enabled=True), name="toy")


def test_a_kit_gives_each_machine_only_its_files(tmp_path):
    fed = _fmp()
    kit = write_kit(tmp_path / "kit", fed, hosts=["fl.example.org"], port=9443)
    assert sorted(p.name for p in kit.iterdir() if p.name != "logs") == sorted(KIT_FILES)
    info = read_kit(kit)
    assert info["clients"] == 3 and info["secagg"]["enabled"] and info["hosts"][0] == "fl.example.org"
    # every device folder holds its own client, exactly
    for i, c in enumerate(fed.clients):
        back = load_client(kit / "data" / f"client-{i}", index=i)
        assert back.id == c.id and len(back.groups) == len(c.groups)
        for g, h in zip(back.groups, c.groups, strict=True):
            for u, w in zip(g, h, strict=True):
                assert u.utt_id == w.utt_id and np.array_equal(u.base, w.base)
                assert all(np.array_equal(a, b) for a, b in zip(u.word_ids, w.word_ids, strict=True))
    # the server's and the devices' pickles hold no client data
    for name in ("server.pkl", "algorithm.pkl"):
        raw = (kit / name).read_bytes()
        assert b"meeting-" not in raw and b"c0g0u0" not in raw
    with open(kit / "algorithm.pkl", "rb") as f:
        assert pickle.load(f)[1] is None
    commands = (kit / "COMMANDS.md").read_text()
    assert "--enable-supernode-auth" in commands and "fl.example.org:9443" in commands
    assert commands.count("flwr supernode register") == 3 and "privasr-algorithm='DEVICE/algorithm.pkl'" in commands
    assert str(kit / "credentials" / "ca.key") not in commands  # the CA key is never needed by a command
    assert "fl.example.org:9443" in (kit / "home" / "config.toml").read_text()


def test_bad_kits_and_settings_are_refused_before_anything_is_written(tmp_path):
    fed = _fmp()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(ConfigError, match="not an empty folder"):
        write_kit(tmp_path / "full", fed)
    small = Federation(fed.algorithm, fed.clients, 2, UniformWithoutReplacement(n=2), secagg=SecAggSettings(
        enabled=True))
    with pytest.raises(ConfigError, match="min_cohort=3"):
        write_kit(tmp_path / "small", small)
    assert not (tmp_path / "small").exists()
    n = len(fed.clients)
    never = Federation(fed.algorithm, fed.clients, 2, fed.sampler, min_clients=n + 2)  # every round would fail
    with pytest.raises(ConfigError, match=f"min_clients={n + 2} but a round's cohort holds at most {n} clients"):
        write_kit(tmp_path / "never", never)
    assert not (tmp_path / "never").exists()
    kit = write_kit(tmp_path / "kit", fed)
    (kit / "server.pkl").unlink()
    with pytest.raises(InputError, match="server.pkl is missing"):
        read_kit(kit)
    with pytest.raises(InputError, match="is missing"):
        run_kit(tmp_path / "nowhere")


def test_cli_credentials_and_split_errors(tmp_path, capsys):
    assert main(["fed", "credentials", "--out", str(tmp_path / "c"), "--nodes", "2"]) == 0
    assert (tmp_path / "c" / "nodes" / "node-1.key").is_file()
    assert "--enable-supernode-auth" in capsys.readouterr().out
    assert main(["fed", "split", "nope", "--config", str(tmp_path / "x.yaml"), "--out", str(tmp_path / "k")]) == 2
    assert "unknown runner 'nope'" in capsys.readouterr().err


@pytest.mark.slow
def test_fed_split_and_run_match_the_local_run(request, tmp_path):
    """``privasr fed split`` of an FMP config (synthetic corpus) with SecAgg+, then ``privasr fed run`` with real
    processes over TLS: the local backend's result within the quantisation error; moved to another folder and
    run again, the kit resumes from its checkpoint and changes nothing."""
    if "slow" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("a deployment with real processes (minutes): run with -m slow")
    from privasr.experiments.fmp import federation, load_fmp_config
    from privasr.synth import SynthConfig, generate

    corpus = tmp_path / "corpus"
    generate(SynthConfig.preset("tiny", seed=1)).write(corpus)
    config = {"name": "fmp-kit", "seed": 0,
              "data": {"dev": str(corpus / "nbest" / "dev.jsonl"), "test": str(corpus / "nbest" / "test.jsonl")},
              "clients": {"key": "client"},
              "nnlm": {"neural": {"train": {"text": str(corpus / "text" / "background.txt"),
                                            "valid": str(corpus / "text" / "background.txt"),
                                            "preset": "tiny-transformer", "seed": 0,
                                            "options": {"max_epochs": 1, "batch_size": 32, "lr": 0.01,
                                                        "patience": 0, "amp": False}}}},
              "cache_dir": str(tmp_path / "cache"),
              "search": {"ranges": {"lm": [0, 2, 0.5], "nnlm": [0, 2, 0.5], "word_penalty": [-2, 2, 1]}},
              "fmp": {"alpha": 0.5, "beta": 0.25, "sigma": 1.0, "rounds": 2}, "lam_grid": [0.5, 1.0],
              "federated": {"backend": "flower", "secagg": {"enabled": True}}}
    (tmp_path / "fmp.yaml").write_text(json.dumps(config))
    assert main(["fed", "split", "fmp", "--config", str(tmp_path / "fmp.yaml"), "--out", str(tmp_path / "kit")]) == 0
    fed = federation(load_fmp_config(config), tmp_path / "again")  # the same preparation, in this process
    local = run_federated(fed.algorithm, fed.clients, rounds=fed.rounds, sampler=fed.sampler, seed=fed.seed)
    assert main(["fed", "run", str(tmp_path / "kit"), "--timeout", "900"]) == 0
    res = json.loads((tmp_path / "kit" / "results.json").read_text())
    assert res["metrics"]["reported"] == [len(fed.clients)] * fed.rounds
    kit_info = json.loads((tmp_path / "kit" / "kit.json").read_text())
    assert {k: v["sha256"] for k, v in res["data"].items()} == kit_info["client_folders"]  # hashes, not paths
    assert not any(v.get("missing") for v in res["data"].values())
    from privasr.federated.tree import load_tree

    state = load_tree(tmp_path / "kit" / "state.npz")
    step = 2 * 4096 / 2 ** 22
    assert np.allclose(state["sum"], local.state["sum"], rtol=0, atol=fed.rounds * len(fed.clients) * step)
    import shutil

    moved = shutil.copytree(tmp_path / "kit", tmp_path / "moved")  # kits can be moved: run where it lies now
    again = run_kit(Path(moved), run_timeout=600)  # resumes after the last round: nothing to do
    assert again.resumed_from == fed.rounds and np.array_equal(again.state["sum"], state["sum"])
