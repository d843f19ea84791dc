"""A deployment kit: one federated run, split into what each machine of a real federation needs.

:func:`write_kit` writes a :class:`~privasr.federated.loop.Federation` (``privasr fed split`` makes one from a
runner config) into a folder:

============================  ===============================================================================
``data/client-<i>/``          client ``i``'s own data (:mod:`~privasr.federated.client_store`): copy it to
                              device ``i`` only
``algorithm.pkl``             the public model and settings the ClientApp runs (no client data): every device
``server.pkl``                the algorithm, sampler, DP and SecAgg settings the ServerApp runs (no client
                              data): the server
``credentials/``              ``ca.crt`` (every device and the operator), ``server.crt``/``server.key`` (the
                              SuperLink), ``nodes/node-<i>.key`` (device ``i`` only), ``nodes/node-<i>.pub``
                              (registered with the SuperLink), ``ca.key`` (keep offline)
``app/``                      the Flower app to ``flwr run``
``home/config.toml``          the operator's ``flwr`` connection (``FLWR_HOME``)
``COMMANDS.md``               the commands, with these paths
``kit.json``                  what the kit holds (no data): sizes, settings, a fingerprint per client folder
============================  ===============================================================================

:func:`run_kit` runs the kit on this machine with the same commands (a SuperLink, one SuperNode per client
folder, ``flwr run``), each SuperNode reading only its own folder and keeping its state under
``devices/client-<i>/``; the ServerApp checkpoints to ``checkpoint/`` after every round, so running the kit again
after a kill continues where it stopped. The ServerApp writes ``result.pkl``.

>>> sorted(KIT_FILES)
['COMMANDS.md', 'algorithm.pkl', 'app', 'credentials', 'data', 'home', 'kit.json', 'server.pkl']
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from privasr import __version__
from privasr.errors import ConfigError, InputError
from privasr.federated.backends.flower import _ServerSpec, check_secagg
from privasr.federated.backends.flower_deploy import (
    ALGORITHM_KEY,
    DATA_DIR_KEY,
    LOOPBACK_HOSTS,
    STATE_DIR_KEY,
    KitLock,
    _execute,
    _result_of,
    _Workdir,
    _write_app,
    _write_flwr_config,
)
from privasr.federated.client_store import split_clients
from privasr.federated.credentials import Credentials, make_credentials
from privasr.federated.loop import FederatedResult, Federation, check_privacy, check_run_arguments

__all__ = ["write_kit", "run_kit", "read_kit", "read_kit_json", "KIT_FILES", "DEFAULT_PORT"]

KIT_FILES = ("data", "algorithm.pkl", "server.pkl", "credentials", "app", "home", "COMMANDS.md", "kit.json")
DEFAULT_PORT = 9092
"""The SuperLink's port in the kit's commands (Flower's Fleet API default)."""


def write_kit(folder: str | os.PathLike[str], federation: Federation, *, hosts: Sequence[str] = (),
              port: int = DEFAULT_PORT) -> Path:
    """Write ``federation`` as a deployment kit into the new folder ``folder`` (see the module docstring).

    Args:
        folder: a folder that does not exist or is empty.
        federation: the run (algorithm, clients, rounds, sampler, DP, secure aggregation).
        hosts: the names and addresses devices reach the SuperLink at (its certificate is made for them and
            for loopback); the first is used in the commands (default ``127.0.0.1``).
        port: the SuperLink's port in the commands.

    Raises:
        ConfigError: a non-empty folder, bad run settings (checked as :func:`run_flower` checks them).
    """
    out = Path(folder)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"{out} exists and is not an empty folder", expected="a new folder for the kit")
    f = federation
    check_run_arguments(f.clients, f.rounds, f.min_clients, None, f.sampler)
    secagg = check_secagg(f.secagg, f.algorithm, f.sampler, len(f.clients), f.privacy)
    if f.privacy is not None:  # DP settings that void the guarantee are refused before the kit is written
        check_privacy(f.algorithm, f.privacy, f.sampler, len(f.clients), f.min_clients, secagg)
    names = tuple(dict.fromkeys([*hosts, *LOOPBACK_HOSTS]))
    wd = _Workdir(out.resolve())
    spec = _ServerSpec(f.algorithm, len(f.clients), f.rounds, f.sampler, int(f.seed), f.min_clients, None, f.privacy,
                       None, False, 600.0, 0.2, str(wd.work / "checkpoint"), True, f.key, secagg)
    try:
        wd.work.mkdir(parents=True, exist_ok=True)
        folders = split_clients(f.clients, wd.data)
        _write_app(wd, spec)
        creds = make_credentials(wd.credentials, nodes=len(f.clients), hosts=names)
        _write_flwr_config(wd, port, creds, host=names[0] if hosts else "127.0.0.1")
        fingerprints = {p.name: json.loads((p / "manifest.json").read_text())["sha256"] for p in folders}
        (wd.work / "kit.json").write_text(json.dumps({
            "name": f.name, "privasr": __version__, "clients": len(f.clients), "rounds": f.rounds,
            "sampler": f.sampler.to_dict(), "seed": int(f.seed), "min_clients": f.min_clients,
            "dp": None if f.privacy is None else {"mechanism": f.privacy.mechanism.to_spec(),
                                                  "composition": f.privacy.composition},
            "secagg": None if secagg is None else secagg.to_dict(), "hosts": list(names), "port": port,
            "client_folders": fingerprints}, indent=2) + "\n")
        (wd.work / "COMMANDS.md").write_text(commands(wd, creds, len(f.clients), names[0] if hosts else "127.0.0.1",
                                                      port))
    except BaseException:
        shutil.rmtree(wd.work, ignore_errors=True)  # no half kit (and no private key) is left behind
        raise
    return wd.work


def commands(wd: _Workdir, creds: Credentials, n: int, host: str, port: int) -> str:
    """The kit's ``COMMANDS.md``: how to start the SuperLink, register and start the SuperNodes, run and read
    the result, with the kit's paths."""
    link = " ".join(["flower-superlink", *creds.superlink_args(), "--disable-runtime-dependency-installation",
                     "--host", "0.0.0.0", "--port", str(port)])
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    register = "\n".join(f"FLWR_HOME={wd.home} flwr supernode register {k} privasr" for k in creds.node_public_keys)
    node_config = (f"partition-id=I num-partitions={n} {DATA_DIR_KEY}='DEVICE/data' {STATE_DIR_KEY}='DEVICE/state' "
                   f"{ALGORITHM_KEY}='DEVICE/algorithm.pkl'")
    node = " ".join(["flower-supernode", "--root-certificates", "DEVICE/ca.crt", "--auth-supernode-private-key",
                     "DEVICE/node-I.key", "--superlink", address, "--node-config", json.dumps(node_config)])
    return f"""# Deploying this kit

A federated run of {n} clients (`kit.json` says which). Each machine gets only what it needs.

## The server (SuperLink and the operator)

Start the SuperLink (TLS with the kit's certificate, only registered SuperNodes admitted):

    {link}

Register every device's public key (the node ids it prints identify the devices):

{_indent(register)}

Flower 1.42's Control API (registration, `flwr run`) has no account authentication and shares the SuperLink's
port: expose that port only to the devices and the operator.

## Each device I (0 to {n - 1})

Copy `data/client-I/` (its own data, and only its own), `credentials/ca.crt`, `credentials/nodes/node-I.key` and
`algorithm.pkl` to the device, say under `DEVICE/`, install privasr with its `federated` extra, and start:

    {node}

## The run

    FLWR_HOME={wd.home} flwr run {wd.app} privasr

The ServerApp writes `{wd.result}` (the final state and every round's log) and checkpoints to
`{wd.work / 'checkpoint'}`; run the same command again after a failure to continue from the last round.

## On this machine

`privasr fed run {wd.work}` runs exactly these commands on loopback (every SuperNode on this machine, each
reading only its own `data/client-<i>/` and keeping its state under `devices/client-<i>/`), waits for the result
and writes `results.json`.
"""


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())


def read_kit(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """The kit's ``kit.json``, after checking that every file of the kit is there.

    Raises:
        InputError: naming the missing or unreadable file.
    """
    return read_kit_json(folder, KIT_FILES, made_by="privasr fed split", count="clients", what="a kit description")


def read_kit_json(folder: str | os.PathLike[str], files: Sequence[str], *, made_by: str, count: str,
                  what: str, kind: str | None = None) -> dict[str, Any]:
    """``folder/kit.json`` of a kit whose ``files`` must all be there (a ``fed split`` or a ``serve`` kit): a JSON
    object with an integer ``count`` (and ``"kind": kind`` when given).

    Raises:
        InputError: naming the missing file, or ``kit.json`` when it is not ``what``.
    """
    out = Path(folder)
    for name in files:
        if not (out / name).exists():
            raise InputError(f"{out / name} is missing", expected=f"a kit written by `{made_by}`")
    try:
        info = json.loads((out / "kit.json").read_text())
        if not isinstance(info, dict) or (kind is not None and info.get("kind") != kind):
            raise ValueError(f"not {what}")
        int(info[count])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise InputError(f"{out / 'kit.json'} is not {what} ({e})") from None
    return info


def run_kit(folder: str | os.PathLike[str], *, run_timeout: float | None = None,
            progress: Any = None) -> FederatedResult:
    """Run the kit in ``folder`` on this machine (see the module docstring); the run's result.

    A kit run again continues from its checkpoint (a finished one returns its last result at once). The kit may
    have been moved since it was written (the ServerApp and the SuperNodes are given its folder). A second run
    of a kit while one is going is refused (:class:`~privasr.federated.backends.flower_deploy.KitLock`).
    ``progress(rounds done)`` is called as the checkpoint advances.
    """
    info = read_kit(folder)
    wd = _Workdir(Path(folder).resolve())
    n = int(info["clients"])
    creds = Credentials.in_folder(wd.credentials, n)
    data_dirs = [wd.data / f"client-{i}" for i in range(n)]
    for p in (*data_dirs, *creds.node_private_keys):
        if not p.exists():
            raise InputError(f"{p} is missing", expected=f"a kit of {n} clients written by `privasr fed split`")
    with KitLock(wd.work):  # one run of a kit at a time; the lock goes with its holder however it dies
        wd.result.unlink(missing_ok=True)
        home = wd.work / "loopback"  # this run's own FLWR_HOME: the kit's stays as written for the deployment
        outcome = _execute(wd, data_dirs, creds, wd.work / "devices", run_timeout=run_timeout, home=home,
                           kit=True, progress=progress)
    return _result_of(outcome, None)
