"""Devices that build their own clients from their own raw N-best files, served through Flower's real message
path (an in-process grid), against the simulation of the same run on the operator's machine."""

from __future__ import annotations

import json
import os
import pickle
import sys

import numpy as np
import pytest

from privasr.cli import main
from privasr.device.folder import DeviceFolder, init_device, write_replay
from privasr.device.node import Device, dispatch
from privasr.errors import ConfigError, InputError

from .conftest import fmp_config


def _devices(serve_kit, tmp_path, *, replay=True):
    kit, fed, info, test = serve_kit
    replays = write_replay(test, tmp_path / "replay", key="client", rounds=fed.rounds - 1)
    out = []
    for i, (name, folder) in enumerate(replays):
        d = init_device(tmp_path / f"device-{i}", bundle=kit / "bundle", bundle_hash=info["bundle"], index=i,
                        name=name, trusted_apps=(info["app"],))
        out.append(Device(d.root, replay=folder if replay else None))
    return out


def _serve_inprocess(fed, devices, ckpt):
    from privasr.federated.backends.flower_inprocess import serve_inprocess

    return serve_inprocess(dispatch(devices), len(devices), fed.algorithm, rounds=fed.rounds, sampler=fed.sampler,
                           seed=fed.seed, min_clients=fed.min_clients, privacy=fed.privacy, checkpoint_dir=ckpt,
                           key=fed.key)


def test_devices_match_the_simulation(serve_kit, synth_corpus, tmp_path, monkeypatch):
    """Each device takes its files round by round, scores them with the bundle's NNLM and runs FMP; the server's
    sums equal the simulation's (operator-side clients), and each device's 1-best equals the simulation's
    choice. Nothing on a device is unpickled: pickle's and cloudpickle's load/loads raise while the devices
    work; the server's side opens nothing in a device folder (an audit hook)."""
    from privasr.experiments.fmp import federation, load_fmp_config
    from privasr.federated.loop import run_federated

    kit, fed, info, test = serve_kit
    devices = _devices(serve_kit, tmp_path)

    def no_pickle(*a, **k):
        raise AssertionError("a device unpickled something")

    # the server's side (the ServerApp's loop, in this process) opens no device folder: an audit hook records
    # what is opened outside the devices' own handling of their messages
    import sys
    import threading

    roots = [str(d.folder.root.resolve()) for d in devices]
    inside = threading.local()
    server_opened: list[str] = []
    device_opened: list[str] = []

    def hook(event, args):
        if event == "open" and isinstance(args[0], str | os.PathLike):
            path = os.path.abspath(os.fspath(args[0]))
            if any(path.startswith(r) for r in roots):
                (device_opened if getattr(inside, "device", False) else server_opened).append(path)

    def handled(d):
        inner = d.handle

        def handle(message, context):
            inside.device = True
            try:
                return inner(message, context)
            finally:
                inside.device = False

        d.handle = handle
        return d

    sys.addaudithook(hook)
    import ray.cloudpickle as cloudpickle

    with monkeypatch.context() as m:
        m.setattr(pickle, "load", no_pickle)
        m.setattr(pickle, "loads", no_pickle)
        m.setattr(cloudpickle, "load", no_pickle)
        m.setattr(cloudpickle, "loads", no_pickle)
        res, grid = _serve_inprocess(fed, [handled(d) for d in devices], tmp_path / "ckpt")
        roots.clear()  # the hook stays installed; it records nothing more
        best = [dict(d.rescore()) for d in devices]
    assert server_opened == [] and device_opened  # the hook saw the devices open their own files
    sim = federation(load_fmp_config(fmp_config(synth_corpus, kit.parent / "cache")), tmp_path / "sim")
    local = run_federated(sim.algorithm, sim.clients, rounds=sim.rounds, sampler=sim.sampler, seed=sim.seed)
    assert [c.id for c in sim.clients] == [d.folder.name for d in devices]
    assert len(devices) >= 3 and res.state["sum"].sum() > 10 and sum(len(b) for b in best) == len(test)
    np.testing.assert_allclose(res.state["sum"], local.state["sum"], rtol=1e-12, atol=1e-12)
    for i, c in enumerate(sim.clients):
        chosen = sim.algorithm.finish(c, local.client_states[i])["chosen"]
        hyps = {nb.utt_id: nb for nb in test}
        want = {u: " ".join(hyps[u].hyps[k].words) for u, k in chosen.items()}
        assert best[i] == want
    # each file was used exactly once, in the round it arrived in
    for d in devices:
        led = d.folder.ledger()
        for name, e in led["files"].items():
            assert e["status"] == "used" and e["round"] == int(name.split("-")[1].split(".")[0])
    # what went up: ids and counts only
    ups = [x for x in grid.exchanges if x.message_type == "train"]
    assert ups and not any(x.error for x in ups)
    # the CLI's check of a deployment: the same WER, no utterance differs; a 1-best missing a line is refused
    from privasr.federated.tree import save_tree

    hyp = tmp_path / "1best.txt"
    hyp.write_text("".join(f"{u} {t}\n" for b in best for u, t in b.items()))
    save_tree(tmp_path / "state.npz", res.state)
    (tmp_path / "c.json").write_text(json.dumps(fmp_config(synth_corpus, kit.parent / "cache")))
    assert main(["fmp", "compare-deployment", "--config", str(tmp_path / "c.json"), "--hyp", str(hyp),
                 "--state", str(tmp_path / "state.npz"), "--out", str(tmp_path / "cmp")]) == 0
    m = json.loads((tmp_path / "cmp" / "results.json").read_text())["metrics"]
    assert m["utterances_differing"] == 0 and m["wer_deployment"] == m["wer_simulation"] > 0
    assert m["sum_max_abs_diff"] < 1e-9
    hyp.write_text("".join(hyp.read_text().splitlines(keepends=True)[1:]))
    assert main(["fmp", "compare-deployment", "--config", str(tmp_path / "c.json"), "--hyp", str(hyp),
                 "--out", str(tmp_path / "cmp2")]) == 2


def test_a_malformed_file_is_set_aside_and_the_round_goes_on(serve_kit, tmp_path, caplog):
    kit, fed, info, test = serve_kit
    dev = _devices(serve_kit, tmp_path, replay=False)[0]
    box = dev.folder.inbox
    from privasr.corpus.formats.nbest_jsonl import write_nbest

    good = [nb for nb in test if nb.meta.get("client", None) is not None][:2] or test[:2]
    write_nbest(box / "a.jsonl", good[:1])
    (box / "b.jsonl").write_text('{"utt_id": "x", "hyps": [\n')
    before = {p.name: p.read_bytes() for p in box.iterdir()}
    with caplog.at_level("WARNING"):
        taken = dev.folder.take(0, dev.prepare)
    assert taken.used == ["a.jsonl"] and taken.set_aside == ["b.jsonl"]
    assert sum("set aside b.jsonl" in r.getMessage() for r in caplog.records) == 1
    led = dev.folder.ledger()
    assert "b.jsonl" in led["files"]["b.jsonl"]["error"] and led["files"]["b.jsonl"]["status"] == "set-aside"
    # the next round takes only what is new; the same file again is not taken twice
    write_nbest(box / "c.jsonl", good[1:2])
    again = dev.folder.take(1, dev.prepare)
    assert again.used == ["c.jsonl"] and dev.folder.take(1, dev.prepare).used == ["c.jsonl"]
    # an utterance seen before is refused; nothing the user gave is changed
    write_nbest(box / "d.jsonl", good[:1])
    assert dev.folder.take(2, dev.prepare).set_aside == ["d.jsonl"]
    assert all(before[k] == (box / k).read_bytes() for k in before)
    # the user fixes the set-aside file: a later round takes it; a used file that changes is not taken again
    others = [nb for nb in test if nb.utt_id not in {g.utt_id for g in good[:2]}]
    write_nbest(box / "b.jsonl", others[:1])
    with caplog.at_level("WARNING"):
        write_nbest(box / "a.jsonl", others[1:3])
        taken = dev.folder.take(3, dev.prepare)
    assert taken.used == ["b.jsonl"] and taken.set_aside == []
    assert any("a.jsonl changed after it was used in round 0" in r.getMessage() for r in caplog.records)
    assert dev.folder.take(4, dev.prepare).used == []


def test_a_device_killed_mid_round_restarts_from_its_ledger(serve_kit, tmp_path):
    """kill -9 of a device while it takes a round (a child process), then a new process: the ledger is whole
    and the round's files are taken exactly once."""
    import subprocess
    import textwrap

    kit, fed, info, test = serve_kit
    dev = _devices(serve_kit, tmp_path, replay=False)[0]
    from privasr.corpus.formats.nbest_jsonl import write_nbest

    for k in range(3):
        write_nbest(dev.folder.inbox / f"f{k}.jsonl", test[k:k + 1])
    code = textwrap.dedent(f"""
        import os, signal
        from privasr.device.node import Device, dispatch
        d = Device({str(dev.folder.root)!r})
        prep = d.prepare
        def slow(recs):
            out = prep(recs)
            if recs[0].utt_id == {test[1].utt_id!r}:
                os.kill(os.getpid(), signal.SIGKILL)
            return out
        d.folder.take(0, slow)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=300)
    assert proc.returncode == -9
    assert not dev.folder.ledger_path.exists()  # nothing half written
    taken = Device(dev.folder.root).folder.take(0, dev.prepare)
    assert taken.used == ["f0.jsonl", "f1.jsonl", "f2.jsonl"]
    assert len(dev.folder.group(0)) == 3


def test_bundles_and_device_folders_refuse_bad_input(serve_kit, tmp_path):
    import shutil

    from privasr.device.bundle import read_bundle

    kit, fed, info, test = serve_kit
    with pytest.raises(InputError, match="not the 0000"):
        init_device(tmp_path / "d0", bundle=kit / "bundle", bundle_hash="0" * 64, index=0)
    bad = tmp_path / "bad"
    shutil.copytree(kit / "bundle", bad)
    with open(bad / "arrays.npz", "ab") as f:
        f.write(b"x")
    with pytest.raises(InputError, match="arrays.npz: the file's SHA-256 differs"):
        read_bundle(bad)
    m = json.loads((kit / "bundle" / "manifest.json").read_text())
    m["version"] = 99
    shutil.rmtree(bad)
    shutil.copytree(kit / "bundle", bad)
    (bad / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(InputError, match="bundle format version 99 is not supported"):
        read_bundle(bad)
    with pytest.raises(ConfigError, match="app hash"):
        init_device(tmp_path / "d1", bundle=kit / "bundle", bundle_hash=info["bundle"], index=0,
                    trusted_apps=("xyz",))
    with pytest.raises(InputError, match="device.json"):
        DeviceFolder(tmp_path)
    d = init_device(tmp_path / "d2", bundle=kit / "bundle", bundle_hash=info["bundle"], index=0)
    with pytest.raises(ConfigError, match="already a device folder"):
        init_device(d.root, bundle=kit / "bundle", bundle_hash=info["bundle"], index=0)
    with pytest.raises(InputError, match="no utterances"):
        Device(d.root).rescore()
    os.chmod(d.root / "bundle" / "settings.json", 0o644)


def test_devices_under_dp_with_distributed_noise_match_the_simulation(synth_corpus, tmp_path):
    """SecAgg+ with distributed Laplace noise (each device adds its share) and FMP's utterance-level DP: the
    devices' released sum equals the simulated secure DP run's exactly (the same seeds, shares and
    quantisation), and the run reports the accountant's epsilon."""

    from privasr.corpus.load import load_nbest
    from privasr.corpus.records import Population
    from privasr.experiments.fmp import federation, load_fmp_config, operator_side
    from privasr.federated.backends.flower_inprocess import run_inprocess, serve_inprocess
    from privasr.federated.backends.flower_serve import write_serve_kit

    c = fmp_config(synth_corpus, tmp_path / "cache",
                   federated={"backend": "flower", "min_clients": 3,
                              "secagg": {"enabled": True, "noise": "distributed"}},
                   dp={"epsilon": 2.0, "unit": "utterance", "cap": 1.0, "accountant": "pld", "delta": 1e-5})
    cfg = load_fmp_config(c)
    test = load_nbest(synth_corpus / "nbest" / "test.jsonl")
    n = len(Population.group(test, key="client"))
    fed, write = operator_side(cfg, tmp_path / "prepare", n)
    kit = write_serve_kit(tmp_path / "kit", fed, write)
    info = json.loads((kit / "kit.json").read_text())
    assert info["run"]["secagg"]["noise"] == "distributed" and info["run"]["dp"]["mechanism"]
    devices = _devices((kit, fed, info, test), tmp_path)
    assert all(d.secure for d in devices)
    res, _ = serve_inprocess(dispatch(devices), n, fed.algorithm, rounds=fed.rounds, sampler=fed.sampler,
                             seed=fed.seed, min_clients=fed.min_clients, privacy=fed.privacy, secagg=fed.secagg,
                             checkpoint_dir=tmp_path / "ckpt", key=fed.key)
    sim = federation(cfg, tmp_path / "sim")
    ref = run_inprocess(sim.algorithm, sim.clients, rounds=sim.rounds, sampler=sim.sampler, workdir=tmp_path / "w",
                        seed=sim.seed, min_clients=sim.min_clients, privacy=sim.privacy, secagg=sim.secagg)
    assert np.array_equal(res.state["sum"], ref.state["sum"]) and np.abs(res.state["sum"]).max() > 0
    assert res.history[-1].metrics["epsilon"] == pytest.approx(ref.history[-1].metrics["epsilon"])
    assert res.history[-1].reported is None  # a DP run publishes no count of the devices that reported
    # the check of a secure deployment simulates the same SecAgg+ protocol: nothing differs at all
    from privasr.federated.tree import save_tree

    (tmp_path / "1best.txt").write_text("".join(f"{u} {t}\n" for d in devices for u, t in d.rescore()))
    save_tree(tmp_path / "state.npz", res.state)
    (tmp_path / "c.json").write_text(json.dumps(c).replace("1e-05", "1.0e-05"))  # YAML reads 1e-05 as text
    assert main(["fmp", "compare-deployment", "--config", str(tmp_path / "c.json"), "--hyp",
                 str(tmp_path / "1best.txt"), "--state", str(tmp_path / "state.npz"), "--out",
                 str(tmp_path / "cmp")]) == 0
    m = json.loads((tmp_path / "cmp" / "results.json").read_text())["metrics"]
    assert m["utterances_differing"] == 0 and m["sum_max_abs_diff"] == 0.0


def test_device_commands(serve_kit, tmp_path, capsys):
    """``privasr device init / status / rescore`` from the command line: formats, a set-aside file in the
    status, one-line errors for a bad bundle hash and an existing output folder."""
    from privasr.corpus.formats.nbest_jsonl import write_nbest

    kit, fed, info, test = serve_kit
    d = tmp_path / "dev"
    assert main(["device", "init", str(d), "--bundle", str(kit / "bundle"), "--bundle-hash", "0" * 64,
                 "--index", "0"]) == 2
    assert "not the 0000" in capsys.readouterr().err
    assert main(["device", "init", str(d), "--bundle", str(kit / "bundle"), "--bundle-hash", info["bundle"],
                 "--index", "0", "--trust-app", info["app"]]) == 0
    write_nbest(d / "inbox" / "a.jsonl", test[:3])
    (d / "inbox" / "b.jsonl").write_text("not json\n")
    assert main(["device", "rescore", str(d), "--out", str(tmp_path / "1best.txt")]) == 0
    lines = (tmp_path / "1best.txt").read_text().splitlines()
    assert [ln.split()[0] for ln in lines] == [nb.utt_id for nb in test[:3]]
    assert main(["device", "rescore", str(d), "--out", str(tmp_path / "1best.trn"), "--format", "trn"]) == 0
    assert f"({test[0].utt_id})" in (tmp_path / "1best.trn").read_text()
    capsys.readouterr()
    assert main(["device", "status", str(d)]) == 0
    out = capsys.readouterr().out
    assert "set aside: b.jsonl" in out and "b.jsonl:1" in out
    assert main(["device", "rescore", str(d), "--out", str(tmp_path / "x.bin"), "--format", "nope"]) == 2
    assert not (tmp_path / "x.bin").exists()


@pytest.mark.parametrize("fmt", ["onnx", "onnx-int8"])
def test_onnx_bundles(synth_corpus, tmp_path, fmt):
    """FMP's bundle with the NNLM as the exported ONNX model (int8 optional): the device scores its lists with
    onnxruntime close to PyTorch's (fp32 within 1e-4 nats a sentence, int8 within 1), and the run goes through
    Flower's message path."""
    pytest.importorskip("onnxruntime")
    from privasr.corpus.load import load_nbest
    from privasr.corpus.records import Population
    from privasr.device.bundle import read_bundle
    from privasr.experiments.fmp import load_fmp_config, operator_side
    from privasr.federated.backends.flower_serve import write_serve_kit

    cfg = load_fmp_config(fmp_config(synth_corpus, tmp_path / "cache"))
    test = load_nbest(synth_corpus / "nbest" / "test.jsonl")
    n = len(Population.group(test, key="client"))
    fed, write = operator_side(cfg, tmp_path / "prepare", n, nnlm_format=fmt)
    kit = write_serve_kit(tmp_path / "kit", fed, write)
    info = json.loads((kit / "kit.json").read_text())
    b = read_bundle(kit / "bundle", expected=info["bundle"])
    assert b.settings["nnlm"]["format"] == fmt and "onnx/model.onnx" in b.arrays
    assert not any(k.startswith("nnlm/") for k in b.arrays)
    devices = _devices((kit, fed, info, test), tmp_path)
    res, grid = _serve_inprocess(fed, devices, tmp_path / "ckpt")
    assert [h.reported for h in res.history] == [n] * fed.rounds
    from privasr.lm.neural.scorer import NeuralLM

    onnx = devices[0].model.lm
    ref = NeuralLM.from_checkpoint(next((tmp_path / "cache").glob("*.pt")))  # the operator's NNLM
    hyps = [h.words for nb in test[:20] for h in nb.hyps]
    d = np.abs(np.array([s.ln_total for s in onnx.score_batch(hyps)])
               - np.array([s.ln_total for s in ref.score_batch(hyps)]))
    assert d.max() < (1e-4 if fmt == "onnx" else 1.0)


def test_personal_bigrams_travel_only_when_used(synth_corpus, tmp_path):
    """The background bigram is in FMP's bundle for ``order: 2`` only, and a device builds its algorithm with
    it."""
    from privasr.corpus.load import load_nbest
    from privasr.device.bundle import read_bundle
    from privasr.experiments.fmp import load_fmp_config, operator_side
    from privasr.federated.backends.flower_serve import write_serve_kit

    test = load_nbest(synth_corpus / "nbest" / "test.jsonl")
    for order in (1, 2):
        cfg = load_fmp_config(fmp_config(synth_corpus, tmp_path / "cache", lam2_grid=[0.5],
                                         fmp={"alpha": 0.5, "beta": 0.25, "sigma": 1.0, "rounds": 2,
                                              "order": order}))
        fed, write = operator_side(cfg, tmp_path / f"prepare{order}", 3)
        kit = write_serve_kit(tmp_path / f"kit{order}", fed, write)
        info = json.loads((kit / "kit.json").read_text())
        assert ("bigram/keys" in read_bundle(kit / "bundle").arrays) == (order == 2)
        dev = Device(init_device(tmp_path / f"d{order}", bundle=kit / "bundle", bundle_hash=info["bundle"],
                                 index=0).root)
        alg = dev.algorithm()
        assert alg.config.order == order and (alg.background_bigram is not None) == (order == 2)
        from privasr.corpus.formats.nbest_jsonl import write_nbest

        write_nbest(dev.folder.inbox / "a.jsonl", test[:4])
        assert len(dev.rescore()) == 4
