"""The operator's kit of a deployment whose devices hold their own data (``privasr serve fmp|fedlm|ftl``).

Unlike :mod:`~privasr.federated.backends.flower_kit` (``privasr fed split``, which cuts a corpus the operator
holds into client folders), this kit holds **no client data**: the devices build their clients themselves from
their own raw files with the published bundle (:mod:`privasr.device`). :func:`write_serve_kit` writes:

============================  ===============================================================================
``bundle/``                   the model bundle (arrays + JSON + SHA-256 manifest): every device
``app/pyproject.toml``        the Flower app, **no code**: its components name privasr's installed ServerApp
                              and a ClientApp stand-in; its FAB hash goes to every device
``server.pkl``                the server's own spec (algorithm, sampler, DP, SecAgg): the operator only; no
                              device ever receives it
``credentials/``              ``ca.crt``, the SuperLink's certificate and key, one key pair per device
``home/config.toml``          the operator's ``flwr`` connection
``COMMANDS.md``               the commands of every machine, with the bundle's and the app's hashes
``kit.json``                  devices, rounds, settings, ``bundle`` and ``app`` hashes
============================  ===============================================================================

The ServerApp (:mod:`~privasr.federated.backends.flower_serve_apps`, installed code) reads the kit's folder from
the run config
(``flwr run KIT/app privasr --run-config "kit='KIT'"``), so a kit can be moved. It checkpoints to
``KIT/checkpoint`` after every round and writes ``KIT/result.pkl``; it never asks a device for its state.

:func:`run_serve_kit` runs the whole deployment on this machine: the SuperLink, one SuperNode per device with
``--isolation process`` and, next to it, the device's own ``privasr device serve`` process (the only code that
touches the device's folder), then ``flwr run``. It holds a lock on the kit (a second run of the same kit is
refused while one is running), and every process it starts dies with it, even when it is killed with SIGKILL
(``PR_SET_PDEATHSIG``, and Flower's own parent-process watch down the tree).
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from privasr import __version__
from privasr.errors import ConfigError, InputError
from privasr.federated.backends.flower import _serve, _ServerSpec, check_secagg
from privasr.federated.backends.flower_deploy import (
    LOOPBACK_HOSTS,
    KitLock,
    _deployment_env,
    _flwr_cli,
    _free_port,
    _Processes,
    _register_nodes,
    _result_of,
    _start_superlink,
    _tool,
    _wait_for_result,
    _Workdir,
    _write_flwr_config,
)
from privasr.federated.backends.flower_kit import DEFAULT_PORT, read_kit_json
from privasr.federated.core import FederatedError
from privasr.federated.credentials import Credentials, make_credentials
from privasr.federated.loop import FederatedResult, Federation, check_privacy, check_run_arguments

__all__ = ["write_serve_kit", "read_serve_kit", "run_serve_kit", "app_hash", "SERVE_FILES", "APP_NAME"]

SERVE_FILES = ("bundle", "app", "server.pkl", "credentials", "home", "COMMANDS.md", "kit.json")
APP_NAME = "privasr-serve"

_PYPROJECT = """\
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "privasr-serve"
version = "1.0.0"
description = "A privasr federated run whose devices hold their own data (no code: privasr's installed apps)"
license = "Apache-2.0"
dependencies = []

[tool.flwr.app]
publisher = "privasr"

[tool.flwr.app.components]
serverapp = "privasr.federated.backends.flower_serve_apps:server_app"
clientapp = "privasr.federated.backends.flower_serve_apps:client_app"

[tool.flwr.app.config]
kit = ""
"""


def app_hash(app: str | os.PathLike[str]) -> str:
    """The SHA-256 of the FAB Flower builds from the app folder ``app`` (what a device trusts; Flower's build is
    deterministic: fixed dates, sorted files)."""
    import hashlib
    import warnings

    from flwr.cli.build import build_fab_from_disk

    with warnings.catch_warnings():  # pathspec's deprecation notice inside Flower's build
        warnings.simplefilter("ignore", DeprecationWarning)
        return hashlib.sha256(build_fab_from_disk(Path(app))).hexdigest()


def write_serve_kit(folder: str | os.PathLike[str], federation: Federation,
                    write_bundle: Callable[[Path, Mapping[str, Any]], str], *, hosts: Sequence[str] = (),
                    port: int = DEFAULT_PORT, client_timeout: float | None = 600.0) -> Path:
    """Write the operator's kit into the new folder ``folder`` (see the module docstring).

    Args:
        federation: the server's run (its clients are ``None``: one per device).
        write_bundle: ``write_bundle(folder, run) -> hash`` writes the devices' bundle (``run``: the run's public
            settings).
        hosts: the names devices reach the SuperLink at; ``port``: its port.
        client_timeout: seconds the server waits for a device's reply in a round before it drops the device
            from that round (a phone that went away mid-round); ``None``: wait for ever.

    Raises:
        ConfigError: a non-empty folder, run settings that cannot succeed or void the DP guarantee.
    """
    out = Path(folder)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"{out} exists and is not an empty folder", expected="a new folder for the kit")
    f = federation
    n = len(f.clients)
    check_run_arguments(f.clients, f.rounds, f.min_clients, None, f.sampler)
    secagg = check_secagg(f.secagg, f.algorithm, f.sampler, n, f.privacy)
    if f.privacy is not None:
        check_privacy(f.algorithm, f.privacy, f.sampler, n, f.min_clients, secagg)
    names = tuple(dict.fromkeys([*hosts, *LOOPBACK_HOSTS]))
    wd = _Workdir(out.resolve())
    if client_timeout is not None and not (isinstance(client_timeout, int | float) and client_timeout > 0):
        raise ConfigError(f"client timeout {client_timeout!r}", expected="seconds > 0, or none")
    spec = _ServerSpec(f.algorithm, n, f.rounds, f.sampler, int(f.seed), f.min_clients, client_timeout, f.privacy,
                       None, False, 600.0, 0.2, None, True, f.key, secagg)
    dp = None if f.privacy is None else {"mechanism": f.privacy.mechanism.to_spec(),
                                         "composition": f.privacy.composition}
    run = {"devices": n, "rounds": f.rounds, "sampler": f.sampler.to_dict(), "seed": int(f.seed),
           "min_clients": f.min_clients, "dp": dp, "secagg": None if secagg is None else secagg.to_dict()}
    try:
        wd.work.mkdir(parents=True, exist_ok=True)
        bundle = write_bundle(wd.work / "bundle", run)
        wd.app.mkdir()
        (wd.app / "pyproject.toml").write_text(_PYPROJECT)
        fab = app_hash(wd.app)
        with open(wd.spec, "wb") as fh:
            pickle.dump(spec, fh, protocol=pickle.HIGHEST_PROTOCOL)
        creds = make_credentials(wd.credentials, nodes=n, hosts=names)
        host = names[0] if hosts else "127.0.0.1"
        _write_flwr_config(wd, port, creds, host=host)
        (wd.work / "kit.json").write_text(json.dumps({
            "kind": "serve", "name": f.name, "privasr": __version__, "devices": n, "rounds": f.rounds, "run": run,
            "bundle": bundle, "app": fab, "hosts": list(names), "port": port, "client_timeout": client_timeout},
            indent=2) + "\n")
        kind = json.loads((wd.work / "bundle" / "manifest.json").read_text())["kind"]
        (wd.work / "COMMANDS.md").write_text(_commands(wd, creds, n, host, port, bundle, fab, kind))
    except BaseException:
        shutil.rmtree(wd.work, ignore_errors=True)
        raise
    return wd.work


def _commands(wd: _Workdir, creds: Credentials, n: int, host: str, port: int, bundle: str, fab: str,
              kind: str) -> str:
    link = " ".join(["flower-superlink", *creds.superlink_args(), "--disable-runtime-dependency-installation",
                     "--host", "0.0.0.0", "--port", str(port)])
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    files = ("transcripts (Kaldi text) with <utt_id>.mfc features beside them go into DEVICE/inbox/"
             if kind == "ftl" else "the user's N-best files go into DEVICE/inbox/ (any format privasr reads)")
    rescore = ("    privasr device rescore DEVICE --out 1best.txt        # the user's personalised 1-best, any time\n"
               if kind == "fmp" else "")
    return f"""# Deploying this kit: {n} devices, each with its own data

The kit holds no device's data. Every device gets the same public files: `bundle/` (hash `{bundle}`),
`credentials/ca.crt`, and its own key `credentials/nodes/node-I.key`; it trusts the app hash `{fab}`.

## The operator

    {link}
    FLWR_HOME={wd.home} flwr supernode register {wd.credentials}/nodes/node-I.pub privasr   # for each device I
    FLWR_HOME={wd.home} flwr run {wd.app} privasr --run-config "kit='{wd.work}'"

The ServerApp checkpoints to `{wd.work}/checkpoint` after every round and writes `{wd.work}/result.pkl`; the
same `flwr run` after a failure continues from the last round.

## Each device I (0 to {n - 1})

    privasr device init DEVICE --bundle bundle --bundle-hash {bundle} --index I --trust-app {fab}
    # {files}
    flower-supernode --root-certificates ca.crt --auth-supernode-private-key node-I.key --superlink {address} \\
        --isolation process --host 127.0.0.1 --port 9094
    privasr device serve DEVICE --runtime-api 127.0.0.1:9094
{rescore}
`privasr device serve` runs privasr's installed ClientApp for tasks of the app `{fab[:16]}...` only; it
never installs or imports anything a task brings.

## On this machine

`privasr fed run {wd.work} --devices DEVICE_0 ... DEVICE_{n - 1}` runs all of the above on loopback.
"""


def read_serve_kit(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """The kit's ``kit.json`` after checking that every file of a serve kit is there.

    Raises:
        InputError: naming the missing or unreadable file.
    """
    return read_kit_json(folder, SERVE_FILES, made_by="privasr serve", count="devices",
                         what="a serve kit's description", kind="serve")


# -- the installed apps ----------------------------------------------------------------------------------------


def _server_app() -> Any:
    from flwr.serverapp import ServerApp

    app = ServerApp()

    @app.main()
    def main(grid: Any, context: Any) -> None:
        given = str(context.run_config.get("kit", ""))
        if not given:
            raise FederatedError("no kit folder in the run config (flwr run KIT/app privasr --run-config "
                                 "\"kit='KIT'\")")
        kit = Path(given)
        result_path = kit / "result.pkl"
        try:
            read_serve_kit(kit)
            with open(kit / "server.pkl", "rb") as fh:
                spec = pickle.load(fh)  # noqa: S301 - the operator's own file, on the operator's machine
            spec.checkpoint_dir = str(kit / "checkpoint")
            result = _serve(grid, spec)
            accountant = spec.privacy.accountant.state_dict() if spec.privacy is not None else None
            outcome: dict[str, Any] = {"ok": True, "result": result, "accountant": accountant}
        except Exception as e:
            outcome = {"ok": False, "error": f"{type(e).__name__}: {e}", "federated": isinstance(e, FederatedError),
                       "message": str(e), "traceback": traceback.format_exc()}
        if kit.is_dir():
            tmp = result_path.with_name("result.pkl.tmp")
            with open(tmp, "wb") as fh:
                pickle.dump(outcome, fh, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, result_path)
        if not outcome["ok"]:
            raise FederatedError(outcome["error"])

    return app


def _client_app() -> Any:
    from flwr.clientapp import ClientApp

    app = ClientApp()

    def refuse(message: Any, context: Any) -> Any:
        raise FederatedError("this app's devices run `privasr device serve` next to a SuperNode started with "
                             "--isolation process; Flower's own ClientApp runtime serves nothing of it")

    app.train()(refuse)
    app.query("privasr_hello")(refuse)
    app.query("privasr_state")(refuse)
    return app


# -- the whole deployment on this machine ----------------------------------------------------------------------


def run_serve_kit(folder: str | os.PathLike[str], devices: Sequence[str | os.PathLike[str]], *,
                  run_timeout: float | None = None,
                  replays: Sequence[str | os.PathLike[str]] | None = None,
                  progress: Callable[[int], None] | None = None) -> FederatedResult:
    """Run the serve kit in ``folder`` on this machine with the device folders ``devices`` (device ``i`` must
    have index ``i``; see the module docstring); the run's result. ``replays``: one replay folder per device
    (``privasr device serve --replay``), for runs whose files arrive round by round. ``progress(rounds done)``
    is called as the checkpoint advances.

    Raises:
        ConfigError: another run of the kit is going, a wrong number of devices.
        InputError: a device folder or the kit is not what it should be.
        FederatedError: the run failed (the ServerApp's own error).
    """
    info = read_serve_kit(folder)
    wd = _Workdir(Path(folder).resolve())
    n = int(info["devices"])
    if len(devices) != n:
        raise ConfigError(f"{len(devices)} device folder(s) for a kit of {n} devices",
                          expected=f"{n} folders, device i at position i")
    folders = [Path(d).resolve() for d in devices]
    for i, d in enumerate(folders):
        try:
            index = json.loads((d / "device.json").read_text(encoding="utf-8"))["index"]
        except (OSError, ValueError, KeyError, TypeError):
            raise InputError("not a device folder", path=d / "device.json",
                             expected="a folder made by `privasr device init`") from None
        if index != i:
            raise InputError(f"device folder {d} has index {index}, given at position {i}",
                             path=d / "device.json", expected="device i at position i")
    if replays is not None and len(replays) != n:
        raise ConfigError(f"{len(replays)} replay folder(s) for {n} devices", expected="one per device, or none")
    replays = None if replays is None else [Path(r).resolve() for r in replays]  # the processes run elsewhere
    creds = Credentials.in_folder(wd.credentials, n)
    with KitLock(wd.work):
        wd.result.unlink(missing_ok=True)
        home = wd.work / "loopback"
        port = _free_port()
        _write_flwr_config(wd, port, creds, home)
        env = _deployment_env(home)
        wd.logs.mkdir(parents=True, exist_ok=True)
        procs = _Processes(env, wd.logs)
        try:
            _start_superlink(procs, port, creds)
            _register_nodes(procs, creds.node_public_keys[:n])
            for i, d in enumerate(folders):
                api = _free_port()
                procs.start(f"supernode-{i}", [_tool("flower-supernode"), *creds.supernode_args(i), "--superlink",
                                               f"127.0.0.1:{port}", "--isolation", "process", "--host",
                                               "127.0.0.1", "--port", str(api)])
                procs.start(f"device-{i}", [sys.executable, "-m", "privasr", "device", "serve", str(d),
                                            "--runtime-api", f"127.0.0.1:{api}",
                                            *(["--replay", str(replays[i])] if replays else [])], restart=True)
            started = _flwr_cli(["run", str(wd.app), "privasr", "--run-config", f"kit='{wd.work}'", "--format",
                                 "json"], env)
            try:
                run_id = str(json.loads(started.stdout)["run-id"])
            except (ValueError, KeyError, TypeError):
                raise FederatedError(f"flwr run failed (status {started.returncode}):\n{started.stdout[-2000:]}"
                                     f"\n{started.stderr[-2000:]}") from None
            _wait_for_result(wd, procs, env, run_id, run_timeout, progress)
            t0 = time.monotonic()
            while True:  # the ServerApp renames its result into place: wait for the complete file
                try:
                    with open(wd.result, "rb") as fh:
                        outcome: dict[str, Any] = pickle.load(fh)  # noqa: S301 - our own ServerApp's file
                    break
                except (EOFError, pickle.UnpicklingError):
                    if time.monotonic() - t0 > 10:
                        raise
                    time.sleep(0.1)
        finally:
            procs.stop()
    return _result_of(outcome, None)
