"""The operator's side (``privasr serve fmp``): no client data read or written, a code-free app whose hash the
devices trust; the loopback deployment with real processes (slow): SecAgg+, a foreign app refused, kill -9 of
the launcher."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from privasr.cli import main
from privasr.device.folder import init_device, write_replay
from privasr.errors import ConfigError, InputError
from privasr.federated.backends.flower_deploy import KitLock
from privasr.federated.backends.flower_serve import read_serve_kit, run_serve_kit

from .conftest import fmp_config


def test_the_operator_never_opens_the_devices_data(synth_corpus, tmp_path):
    """An audit hook records every file the operator's side opens: the dev set and the background text, never
    data.test; the kit holds no utterance of it."""
    from privasr.corpus.load import load_nbest
    from privasr.experiments.fmp import load_fmp_config, operator_side
    from privasr.federated.backends.flower_serve import write_serve_kit

    test_file = (synth_corpus / "nbest" / "test.jsonl").resolve()
    cfg = load_fmp_config(fmp_config(synth_corpus, tmp_path / "cache"))
    opened: list[str] = []
    active = [True]

    def hook(event, args):
        if active[0] and event == "open" and isinstance(args[0], str | bytes | os.PathLike):
            opened.append(os.fspath(args[0]) if not isinstance(args[0], bytes) else args[0].decode())

    sys.addaudithook(hook)
    try:
        fed, write = operator_side(cfg, tmp_path / "prepare", 3)
        kit = write_serve_kit(tmp_path / "kit", fed, write)
    finally:
        active[0] = False
    assert not any(Path(p).resolve() == test_file for p in opened)
    assert any(Path(p).name == "dev.jsonl" for p in opened)  # the hook did see the operator's own data
    blob = b"".join(p.read_bytes() for p in kit.rglob("*") if p.is_file())
    for nb in load_nbest(test_file)[:20]:
        assert nb.utt_id.encode() not in blob
    app = (kit / "app").iterdir()
    assert [p.name for p in app] == ["pyproject.toml"]  # the app carries no code
    info = read_serve_kit(kit)
    assert info["devices"] == 3 and len(info["bundle"]) == 64 and len(info["app"]) == 64


def test_serve_refusals(synth_corpus, tmp_path, capsys, serve_kit):
    cfg = fmp_config(synth_corpus, tmp_path / "cache")
    cfg["data"] = {"nbest": str(synth_corpus / "nbest" / "dev.jsonl"), "split": {"key": "speaker", "dev": "even"}}
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    assert main(["serve", "fmp", "--config", str(tmp_path / "c.json"), "--devices", "2", "--out",
                 str(tmp_path / "k")]) == 2
    assert "the test half is the devices' data" in capsys.readouterr().err
    assert main(["serve", "fmp", "--config", str(tmp_path / "c.json"), "--devices", "0", "--out",
                 str(tmp_path / "k")]) == 2
    # a cohort that can never reach min_clients: refused before the operator's preparation starts
    (tmp_path / "d.json").write_text(json.dumps(fmp_config(synth_corpus, tmp_path / "nocache",
                                                           federated={"min_clients": 5})))
    capsys.readouterr()
    assert main(["serve", "fmp", "--config", str(tmp_path / "d.json"), "--devices", "3", "--out",
                 str(tmp_path / "k")]) == 2
    assert "min_clients" in capsys.readouterr().err and not (tmp_path / "nocache").exists()
    kit, fed, info, test = serve_kit
    with pytest.raises(ConfigError, match="device folder"):
        run_serve_kit(kit, [tmp_path])
    with pytest.raises(InputError, match="not a device folder"):
        run_serve_kit(kit, [tmp_path] * info["devices"])
    with KitLock(kit), pytest.raises(ConfigError, match="is being run by pid"):
        with KitLock(kit):
            pass
    assert main(["fed", "run", str(kit), "--devices", str(tmp_path)]) == 2


def _devices(serve_kit, root: Path):
    kit, fed, info, test = serve_kit
    reps = write_replay(test, root / "replay", key="client", rounds=fed.rounds - 1)
    devs = [init_device(root / f"device-{i}", bundle=kit / "bundle", bundle_hash=info["bundle"], index=i,
                        name=name, trusted_apps=(info["app"],)).root for i, (name, _) in enumerate(reps)]
    return devs, [r for _, r in reps]


def _copy_kit(kit: Path, to: Path) -> Path:
    import shutil

    shutil.copytree(kit, to)
    return to


def _skip_unless_slow(request):
    if "slow" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("a deployment with real processes: run with -m slow")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_real_devices_with_secagg_match_the_simulation(request, synth_corpus, tmp_path):
    """``privasr serve fmp`` with SecAgg+, 3 devices each with its own SuperNode (``--isolation process``) and
    ``privasr device serve`` over TLS with registered keys, files arriving round by round; the server's sum
    equals the simulation's within SecAgg's quantisation; the kit moved elsewhere runs again and resumes."""
    _skip_unless_slow(request)
    from privasr.corpus.load import load_nbest
    from privasr.experiments.fmp import federation, load_fmp_config
    from privasr.federated.loop import run_federated
    from privasr.federated.tree import load_tree

    config = fmp_config(synth_corpus, tmp_path / "cache", federated={"backend": "flower",
                                                                     "secagg": {"enabled": True}})
    (tmp_path / "fmp.json").write_text(json.dumps(config))
    assert main(["serve", "fmp", "--config", str(tmp_path / "fmp.json"), "--devices", "3", "--out",
                 str(tmp_path / "kit")]) == 0
    kit = tmp_path / "kit"
    info = read_serve_kit(kit)
    test = load_nbest(synth_corpus / "nbest" / "test.jsonl")
    reps = write_replay(test, tmp_path / "replay", key="client", rounds=info["rounds"] - 1)
    args = []
    for i, (name, r) in enumerate(reps):
        assert main(["device", "init", str(tmp_path / f"d{i}"), "--bundle", str(kit / "bundle"), "--bundle-hash",
                     info["bundle"], "--index", str(i), "--trust-app", info["app"], "--name", name]) == 0
        args += ["--devices", str(tmp_path / f"d{i}"), "--replay", str(r)]
    assert main(["fed", "run", str(kit), *args, "--timeout", "900"]) == 0
    state = load_tree(kit / "state.npz")
    sim = federation(load_fmp_config(config), tmp_path / "sim")
    local = run_federated(sim.algorithm, sim.clients, rounds=sim.rounds, sampler=sim.sampler, seed=sim.seed)
    step = 2 * 4096 / 2 ** 22
    assert np.allclose(state["sum"], local.state["sum"], rtol=0, atol=sim.rounds * len(sim.clients) * step)
    res = json.loads((kit / "results.json").read_text())
    assert res["metrics"]["reported"] == [3] * sim.rounds
    moved = _copy_kit(kit, tmp_path / "moved")  # a relocated kit: the checkpoint is found, nothing to redo
    again = run_serve_kit(moved, [tmp_path / f"d{i}" for i in range(3)], run_timeout=600)
    assert again.resumed_from == sim.rounds


@pytest.mark.slow
def test_a_foreign_app_is_refused_and_never_reaches_the_data(request, serve_kit, tmp_path):
    """A stranger's app (its own ClientApp would write a file and read the node config) submitted to the
    SuperLink: the device refuses its task, imports nothing of it and opens nothing of its folder."""
    _skip_unless_slow(request)
    from privasr.federated.backends.flower_deploy import (
        _deployment_env,
        _flwr_cli,
        _free_port,
        _Processes,
        _register_nodes,
        _start_superlink,
        _tool,
        _Workdir,
        _write_flwr_config,
    )
    from privasr.federated.credentials import Credentials

    kit, fed, info, test = serve_kit
    kit = _copy_kit(kit, tmp_path / "kit")
    dev = init_device(tmp_path / "dev", bundle=kit / "bundle", bundle_hash=info["bundle"], index=0,
                      trusted_apps=(info["app"],))
    marker = tmp_path / "foreign-ran"
    app = tmp_path / "foreignapp"
    (app / "foreignapp").mkdir(parents=True)
    (app / "pyproject.toml").write_text((kit / "app" / "pyproject.toml").read_text()
                                        .replace("privasr-serve", "foreignapp")
                                        .replace("privasr.federated.backends.flower_serve_apps:client_app",
                                                 "foreignapp.client:app")
                                        .replace("privasr.federated.backends.flower_serve_apps:server_app",
                                                 "foreignapp.server:app"))
    (app / "foreignapp" / "__init__.py").write_text("")
    (app / "foreignapp" / "server.py").write_text(
        "import time\n"
        "from flwr.app import ConfigRecord, Message, RecordDict\n"
        "from flwr.serverapp import ServerApp\n"
        "app = ServerApp()\n"
        "@app.main()\n"
        "def main(grid, context):\n"
        "    nodes = []\n"
        "    while not nodes:\n"
        "        nodes = list(grid.get_node_ids())\n"
        "        time.sleep(0.2)\n"
        "    grid.send_and_receive([Message(RecordDict({'q': ConfigRecord({})}), dst_node_id=n,\n"
        "                                   message_type='train') for n in nodes], timeout=120)\n")
    (app / "foreignapp" / "client.py").write_text(
        "from flwr.clientapp import ClientApp\n"
        f"open({str(marker)!r}, 'w').write('imported')\n"
        "app = ClientApp()\n")
    wd = _Workdir(kit)
    creds = Credentials.in_folder(wd.credentials, info["devices"])
    port = _free_port()
    home = kit / "loopback"
    _write_flwr_config(wd, port, creds, home)
    env = _deployment_env(home)
    wd.logs.mkdir(exist_ok=True)
    procs = _Processes(env, wd.logs)
    try:
        _start_superlink(procs, port, creds)
        _register_nodes(procs, creds.node_public_keys[:1])
        api = _free_port()
        procs.start("supernode-0", [_tool("flower-supernode"), *creds.supernode_args(0), "--superlink",
                                    f"127.0.0.1:{port}", "--isolation", "process", "--host", "127.0.0.1",
                                    "--port", str(api)])
        procs.start("device-0", [sys.executable, "-m", "privasr", "device", "serve", str(dev.root),
                                 "--runtime-api", f"127.0.0.1:{api}"])
        started = _flwr_cli(["run", str(app), "privasr", "--format", "json"], env)
        assert json.loads(started.stdout)["success"], started.stdout
        log = wd.logs / "device-0.log"
        deadline = time.monotonic() + 180
        while "refused: app" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.5)
    finally:
        procs.stop()
    assert "refused: app" in log.read_text()
    assert not marker.exists()
    assert not dev.ledger_path.exists() and not dev.node_states.exists()


@pytest.mark.slow
def test_killing_the_launcher_leaves_no_process_and_a_rerun_resumes(request, serve_kit, tmp_path):
    """SIGKILL of ``privasr fed run`` after round 1: every process it started goes with it, the kit's lock is
    free, and a new run resumes from the checkpoint to the same final sum."""
    _skip_unless_slow(request)
    from privasr.federated.backends.flower_deploy import _descendants
    from privasr.federated.tree import load_tree

    kit, fed, info, test = serve_kit
    kit = _copy_kit(kit, tmp_path / "kit")
    devs, reps = _devices(serve_kit, tmp_path)
    args = [a for i in range(len(devs)) for a in ("--devices", str(devs[i]), "--replay", str(reps[i]))]
    proc = subprocess.Popen([sys.executable, "-m", "privasr", "fed", "run", str(kit), *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ckpt = kit / "checkpoint" / "state.npz"
    deadline = time.monotonic() + 600
    family: set[int] = set()
    while time.monotonic() < deadline:
        family |= _descendants(proc.pid)
        if ckpt.exists() and int(load_tree(ckpt)["round"]) >= 1:
            break
        time.sleep(0.2)
    family |= _descendants(proc.pid)
    assert family, "the launcher started nothing"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in family):
        time.sleep(0.2)
    alive = [p for p in family if Path(f"/proc/{p}").exists()
             and "zombie" not in Path(f"/proc/{p}/status").read_text().lower()]
    assert not alive, f"orphans left: {alive}"
    result = run_serve_kit(kit, devs, run_timeout=600, replays=reps)
    assert result.resumed_from >= 1 and len(result.history) == fed.rounds


@pytest.mark.slow
def test_real_fedlm_devices_with_secagg_match_the_operator_side_run(request, synth_corpus, tmp_path):
    """``privasr serve fedlm`` (clipped deltas, FedAvg) with SecAgg+, 3 real devices whose lists are all there from
    the start: the final parameters equal the local run over the same clients made on the operator's machine,
    within SecAgg's quantisation."""
    _skip_unless_slow(request)
    from privasr.corpus.load import load_nbest
    from privasr.corpus.records import Population
    from privasr.device.node import Device
    from privasr.federated.algorithms.fedlm import FedLmClient
    from privasr.federated.loop import run_federated
    from privasr.federated.tree import load_tree

    from .test_fedlm_device import _fedlm_config

    config = _fedlm_config(synth_corpus, tmp_path / "cache",
                           fedlm={"loss": "token", "batch_size": 8, "client_lr": 0.5, "clip_norm": 1.0,
                                  "weighting": "uniform",
                                  "server": {"name": "sgd", "lr": 1.0}},
                           federated={"backend": "flower", "secagg": {"enabled": True}})
    (tmp_path / "c.json").write_text(json.dumps(config))
    assert main(["serve", "fedlm", "--config", str(tmp_path / "c.json"), "--devices", "3", "--out",
                 str(tmp_path / "kit")]) == 0
    kit = tmp_path / "kit"
    info = read_serve_kit(kit)
    test = load_nbest(synth_corpus / "nbest" / "test.jsonl")
    reps = write_replay(test, tmp_path / "replay", key="client", rounds=0)
    args = []
    for i, (name, r) in enumerate(reps):
        assert main(["device", "init", str(tmp_path / f"d{i}"), "--bundle", str(kit / "bundle"), "--bundle-hash",
                     info["bundle"], "--index", str(i), "--trust-app", info["app"], "--name", name]) == 0
        args += ["--devices", str(tmp_path / f"d{i}"), "--replay", str(r)]
    assert main(["fed", "run", str(kit), *args, "--timeout", "900"]) == 0
    state = load_tree(kit / "state.npz")
    from privasr.experiments.fedlm import load_fedlm_config, operator_side

    fed, _ = operator_side(load_fedlm_config(config), tmp_path / "again", 3)
    model = Device(tmp_path / "d0").model
    clients = []
    for c in Population.group(test, key="client"):
        kept = [nb for nb in c.utterances if nb.best.words]
        conf = [np.clip(np.asarray(x, dtype=np.float64), 0, 1) for x in model.classifier.predict_many(kept)]
        clients.append(FedLmClient(c.id, tuple(tuple(model.vocab.encode(nb.best.words)) for nb in kept),
                                   tuple(conf)))
    local = run_federated(fed.algorithm, clients, rounds=fed.rounds, sampler=fed.sampler, seed=fed.seed)
    step = 2 * 1.0 / 2 ** 22  # SecAgg+'s grid for values in [-clip_norm, clip_norm]
    for k, v in local.state["params"].items():
        assert np.allclose(state["params"][k], v, rtol=0, atol=fed.rounds * 3 * step + 1e-6), k


@pytest.mark.slow
def test_real_ftl_devices_match_the_operator_side_run(request, tmp_path):
    """``privasr serve ftl`` (synthetic speakers), 3 real devices with their own feature files and transcripts
    over TLS: the final parameters equal the local run over the same clients made on the operator's machine."""
    _skip_unless_slow(request)
    from privasr.asr.synth_an4 import synthetic_corpus
    from privasr.asr.train import an4_examples
    from privasr.device.ftl import write_ftl_replay
    from privasr.experiments.ftl import load_ftl_config, operator_side, split_speakers
    from privasr.federated.algorithms.ftl import FtlClient
    from privasr.federated.loop import run_federated
    from privasr.federated.tree import load_tree

    from .test_ftl_device import _raw

    raw = _raw()
    (tmp_path / "c.json").write_text(json.dumps(raw))
    train, _ = synthetic_corpus(6, 6, 2, seed=1)
    cfg = load_ftl_config(raw)
    _, client_spk = split_speakers([u.speaker for u in train], cfg.data.seed_fraction)
    mine = [u for u in train if u.speaker in set(client_spk)]
    assert main(["serve", "ftl", "--config", str(tmp_path / "c.json"), "--devices", str(len(client_spk)), "--out",
                 str(tmp_path / "kit")]) == 0
    kit = tmp_path / "kit"
    info = read_serve_kit(kit)
    reps = write_ftl_replay(mine, tmp_path / "replay", rounds=0)
    args = []
    for i, (spk, r) in enumerate(reps):
        assert main(["device", "init", str(tmp_path / f"d{i}"), "--bundle", str(kit / "bundle"), "--bundle-hash",
                     info["bundle"], "--index", str(i), "--trust-app", info["app"], "--name", spk]) == 0
        args += ["--devices", str(tmp_path / f"d{i}"), "--replay", str(r)]
    assert main(["fed", "run", str(kit), *args, "--timeout", "900"]) == 0
    state = load_tree(kit / "state.npz")
    fed, _ = operator_side(cfg, tmp_path / "again", len(client_spk))
    tok = fed.algorithm.tokenizer
    clients = [FtlClient(spk, tuple(an4_examples([u for u in mine if u.speaker == spk], tok, cmvn="speaker")))
               for spk, _ in reps]
    local = run_federated(fed.algorithm, clients, rounds=fed.rounds, sampler=fed.sampler, seed=fed.seed)
    for k, v in local.state["params"].items():
        assert np.allclose(state["params"][k], v, rtol=1e-5, atol=1e-6), k


def _family(pid: int) -> list[tuple[int, str]]:
    from privasr.federated.backends.flower_deploy import _descendants

    out = []
    for p in _descendants(pid):
        try:
            out.append((p, Path(f"/proc/{p}/cmdline").read_text().replace("\0", " ")))
        except OSError:
            pass
    return out


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_killed_device_or_serverapp(request, serve_kit, synth_corpus, tmp_path, caplog):
    """kill -9 of a device's process as it takes a round: the launcher starts it again and it continues from its
    own state and ledger (dropped from the rounds until its SuperNode lets the dead task go, after the kit's
    client timeout; the simulation's result when its reply had gone out; killed mid-upload, the round hangs in
    Flower's SuperNode until the run timeout, and the kit run again resumes). kill -9 of the ServerApp: the launcher says so (not the
    SuperLink's noise) and leaves no process; run again, the kit resumes from its checkpoint to the same end."""
    _skip_unless_slow(request)
    import threading

    from privasr.experiments.fmp import federation, load_fmp_config, operator_side
    from privasr.federated.backends.flower_serve import write_serve_kit
    from privasr.federated.core import FederatedError
    from privasr.federated.loop import run_federated
    from privasr.federated.tree import load_tree

    kit, fed, info, test = serve_kit
    # seven rounds: a device killed mid-round may miss a few while its SuperNode lets the dead task go
    cfg = load_fmp_config(fmp_config(synth_corpus, kit.parent / "cache",
                                     fmp={"alpha": 0.5, "beta": 0.25, "sigma": 1.0, "rounds": 6}))
    sim = federation(cfg, tmp_path / "sim")
    local = run_federated(sim.algorithm, sim.clients, rounds=sim.rounds, sampler=sim.sampler, seed=sim.seed)
    fed, write = operator_side(cfg, tmp_path / "prepare", len(sim.clients))
    kit = write_serve_kit(tmp_path / "kit", fed, write, client_timeout=20)  # a device gone mid-round: dropped
    mine = (kit, fed, read_serve_kit(kit), test)

    def kill_when(pred, match):
        def watch():
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                if pred():
                    for p, cmd in _family(os.getpid()):
                        if match in cmd:
                            os.kill(p, signal.SIGKILL)
                            return
                time.sleep(0.02)
        t = threading.Thread(target=watch, daemon=True)
        t.start()
        return t

    # a device killed as it takes round 1
    k1 = _copy_kit(kit, tmp_path / "k1")
    devs, reps = _devices(mine, tmp_path / "a")
    led = devs[1] / "state" / "ledger.json"
    kill_when(lambda: led.exists() and "1" in json.loads(led.read_text())["rounds"], f"device serve {devs[1]}")
    with caplog.at_level("WARNING", logger="privasr.federated"):
        try:
            res = run_serve_kit(k1, devs, run_timeout=150, replays=reps)
        except FederatedError as e:
            # killed while its reply was being uploaded: Flower's SuperNode waits for the reply's missing parts
            # and the round never ends; the launcher's run timeout stops it, and the kit run again resumes
            assert "took longer than" in str(e)
            res = run_serve_kit(k1, devs, run_timeout=300, replays=reps)
            assert res.resumed_from >= 1
    assert "device-1 exited with status -9; starting it again" in caplog.text
    # killed before its reply went out, the device is dropped (after the kit's client timeout) until its
    # SuperNode lets the dead task go (Flower's task heartbeat), then serves the later rounds from its own state;
    # killed after, nothing differs from the simulation
    dropped = [h.round for h in res.history if h.dropped]
    assert all(set(h.dropped) <= {"1:1"} for h in res.history)  # only the killed device, nobody else
    assert dropped == list(range(1, 1 + len(dropped)))  # from the round it was killed in, consecutively
    assert res.history[-1].reported == len(devs)  # and back by the end
    if not dropped:
        np.testing.assert_allclose(res.state["sum"], local.state["sum"], rtol=1e-12, atol=1e-12)
    # the ServerApp killed after round 1
    k2 = _copy_kit(kit, tmp_path / "k2")
    devs, reps = _devices(mine, tmp_path / "b")
    ckpt = k2 / "checkpoint" / "state.npz"
    kill_when(lambda: ckpt.exists() and int(load_tree(ckpt)["round"]) >= 1, "flwr-serverapp")
    with pytest.raises(FederatedError, match="ServerApp ended .* without writing its result"):
        run_serve_kit(k2, devs, run_timeout=600, replays=reps)
    assert not [p for p, cmd in _family(os.getpid()) if "flower-super" in cmd or "device serve" in cmd]
    again = run_serve_kit(k2, devs, run_timeout=600, replays=reps)
    assert again.resumed_from >= 1
    np.testing.assert_allclose(again.state["sum"], local.state["sum"], rtol=1e-12, atol=1e-12)
