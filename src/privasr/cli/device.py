"""``privasr serve`` (the operator's side) and ``privasr device`` (each device's own side) of a deployment
whose devices hold their own data.

* ``privasr serve fmp|fedlm|ftl --config CONFIG --devices N --out KIT``: the operator's stages on its own data only
  (the NNLM's text, ``data.dev``), then the kit (:mod:`privasr.federated.backends.flower_serve`): the bundle, a
  code-free Flower app, the server's spec, credentials, commands. ``data.test`` is never opened.
* ``privasr device init DEVICE --bundle B --bundle-hash H --index I --trust-app FAB``: a device folder
  (:mod:`privasr.device.folder`).
* ``privasr device serve DEVICE --runtime-api HOST:PORT``: serve the device's SuperNode
  (``--isolation process``) with privasr's installed ClientApp (:mod:`privasr.device.runtime`).
* ``privasr device rescore DEVICE --out FILE``: the user's personalised 1-best of its own lists.
* ``privasr device status DEVICE``: the ledger (files used per round, files set aside and why).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import typer

from privasr.cli._console import make_console
from privasr.errors import ConfigError, InputError

__all__ = ["serve_app", "device_app"]

serve_app = typer.Typer(help="The operator's side of a deployment whose devices hold their own data.",
                        no_args_is_help=True)
device_app = typer.Typer(help="A device's own side of a deployment: its folder, its SuperNode's ClientApp, "
                              "its personalised 1-best.", no_args_is_help=True)


def _serve(algorithm: str, config: Path, devices: int, out: Path, overrides: list[str], hosts: list[str],
           port: int, client_timeout: float = 600.0, **options: Any) -> None:
    import importlib
    import json

    from privasr.config import apply_overrides, parse_overrides, read_config
    from privasr.federated.backends.flower_serve import write_serve_kit

    if devices < 1:
        raise ConfigError(f"--devices {devices}", expected="at least 1")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"--out {out} exists and is not an empty folder", expected="a new folder for the kit")
    module = importlib.import_module(f"privasr.experiments.{algorithm}")
    raw: dict[str, Any] = apply_overrides(read_config(config), parse_overrides(overrides))
    try:
        cfg = getattr(module, f"load_{algorithm}_config")(raw)
    except InputError as e:
        raise e.at(config) from None
    from privasr.federated.loop import check_run_arguments

    # cohorts that cannot fit the devices, or never reach min_clients, are refused before any work
    check_run_arguments([None] * devices, 1, cfg.federated.min_clients, None, cfg.federated.make_sampler())
    work = out.parent / f".{out.name}.prepare"  # the operator's caches, outside the kit
    with make_console(stderr=True).status(f"preparing {algorithm} ({cfg.name}) on the operator's data"):
        federation, write = module.operator_side(cfg, work, devices, **options)
        kit = write_serve_kit(out, federation, write, hosts=hosts, port=port,
                              client_timeout=client_timeout if client_timeout > 0 else None)
    info = json.loads((kit / "kit.json").read_text())
    con = make_console()
    con.print(f"{devices} devices, {federation.rounds} rounds"
              + (", secure aggregation" if getattr(federation.secagg, "enabled", False) else "")
              + (", differential privacy" if federation.privacy is not None else ""))
    con.print(f"[bold]bundle:[/] {kit / 'bundle'} sha256 {info['bundle']}")
    con.print(f"[bold]app:[/] sha256 {info['app']}")
    con.print(f"[bold]commands:[/] {kit / 'COMMANDS.md'}")


_CONFIG_HELP = "The runner's config (data.dev is the operator's; data.test is never opened)."
_TIMEOUT_HELP = "Seconds the server waits for a device's reply in a round before dropping it (0: for ever)."


@serve_app.command("fmp")
def serve_fmp(
    config: Path = typer.Option(..., "--config", help=_CONFIG_HELP),
    devices: int = typer.Option(..., "--devices", help="The number of devices (one key pair each)."),
    out: Path = typer.Option(..., "--out", help="The kit's folder (new)."),
    overrides: list[str] = typer.Option([], "--set", help="Override a config value (dotted keys, YAML values)."),
    hosts: list[str] = typer.Option([], "--host", help="A name or address the devices reach the SuperLink at."),
    port: int = typer.Option(9092, "--port", help="The SuperLink's port in the commands."),
    client_timeout: float = typer.Option(600.0, "--client-timeout", help=_TIMEOUT_HELP),
    nnlm: str = typer.Option("torch", "--nnlm", help="How the NNLM travels in the bundle: torch (its weights; "
                                                    "the simulation's scores exactly), onnx or onnx-int8 "
                                                    "(scored with onnxruntime on the device)."),
) -> None:
    """Prepare FMP on the operator's own data and write the kit the devices and the server need."""
    from privasr.device.fmp import NNLM_FORMATS

    if nnlm not in NNLM_FORMATS:
        raise ConfigError(f"--nnlm {nnlm}", expected=f"one of {', '.join(NNLM_FORMATS)}")
    _serve("fmp", config, devices, out, overrides, hosts, port, client_timeout, nnlm_format=nnlm)


@serve_app.command("fedlm")
def serve_fedlm(
    config: Path = typer.Option(..., "--config", help=_CONFIG_HELP),
    devices: int = typer.Option(..., "--devices", help="The number of devices (one key pair each)."),
    out: Path = typer.Option(..., "--out", help="The kit's folder (new)."),
    overrides: list[str] = typer.Option([], "--set", help="Override a config value (dotted keys, YAML values)."),
    hosts: list[str] = typer.Option([], "--host", help="A name or address the devices reach the SuperLink at."),
    port: int = typer.Option(9092, "--port", help="The SuperLink's port in the commands."),
    client_timeout: float = typer.Option(600.0, "--client-timeout", help=_TIMEOUT_HELP),
) -> None:
    """Prepare fedlm (NNLM, confidence classifier) on the operator's own data and write the kit."""
    _serve("fedlm", config, devices, out, overrides, hosts, port, client_timeout)


@serve_app.command("ftl")
def serve_ftl(
    config: Path = typer.Option(..., "--config", help="An FTL config (synthetic data: the operator uses its "
                                                      "server speakers only)."),
    devices: int = typer.Option(..., "--devices", help="The number of devices (one key pair each)."),
    out: Path = typer.Option(..., "--out", help="The kit's folder (new)."),
    overrides: list[str] = typer.Option([], "--set", help="Override a config value (dotted keys, YAML values)."),
    hosts: list[str] = typer.Option([], "--host", help="A name or address the devices reach the SuperLink at."),
    port: int = typer.Option(9092, "--port", help="The SuperLink's port in the commands."),
    client_timeout: float = typer.Option(600.0, "--client-timeout", help=_TIMEOUT_HELP),
) -> None:
    """Prepare FTL (units, seed model) on the operator's own speakers and write the kit."""
    _serve("ftl", config, devices, out, overrides, hosts, port, client_timeout)


@device_app.command("init")
def init(
    folder: Path = typer.Argument(..., help="The device's folder (new, or holding only inbox/)."),
    bundle: Path = typer.Option(..., "--bundle", help="The operator's bundle folder."),
    bundle_hash: str = typer.Option(..., "--bundle-hash", help="The bundle's SHA-256, as the operator published it."),
    index: int = typer.Option(..., "--index", help="This device's index in the run (0 .. devices-1)."),
    trust_app: list[str] = typer.Option([], "--trust-app", help="The SHA-256 of an app this device serves "
                                                                 "(repeatable)."),
    inbox: Path | None = typer.Option(None, "--inbox", help="The user's files (default DEVICE/inbox)."),
    name: str | None = typer.Option(None, "--name", help="The client's name (never leaves the device)."),
) -> None:
    """Make a device folder: check and copy the bundle, record the trusted app hashes."""
    from privasr.device.folder import init_device
    from privasr.device.node import Device

    d = init_device(folder, bundle=bundle, bundle_hash=bundle_hash, index=index, name=name, inbox=inbox,
                    trusted_apps=tuple(trust_app))
    Device(d.root)  # the bundle builds a model here
    make_console().print(f"device {d.index} ({d.name}): put its N-best files into {d.inbox}")


@device_app.command("serve")
def serve(
    folder: Path = typer.Argument(..., help="The device's folder."),
    runtime_api: str = typer.Option(..., "--runtime-api", help="The SuperNode's Runtime API (its --host:--port), "
                                                               "started with --isolation process."),
    max_tasks: int | None = typer.Option(None, "--max-tasks", help="Stop after this many tasks (default: never)."),
    replay: Path | None = typer.Option(None, "--replay", help="A replay folder (privasr.device.folder.write_replay):"
                                                              " round r's files enter the inbox before round r."),
) -> None:
    """Serve the device's SuperNode with privasr's installed ClientApp, for trusted apps only."""
    from privasr.device.node import Device
    from privasr.device.runtime import serve as serve_loop

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per poll otherwise
    device = Device(folder, replay=replay)
    counts = serve_loop(device, runtime_api, max_tasks=max_tasks)
    make_console().print(f"tasks: {counts}")


@device_app.command("rescore")
def rescore(
    folder: Path = typer.Argument(..., help="The device's folder."),
    out: Path = typer.Option(..., "--out", help="The 1-best file."),
    fmt: str = typer.Option("kaldi-text", "--format", "-f", help="kaldi-text ('utt_id words' lines) or another "
                                                                 "transcript format privasr writes: "
                                                                 "transcript-jsonl, trn, ctm, conll."),
) -> None:
    """Write the user's personalised 1-best of every list on the device (nothing leaves the device)."""
    from privasr.corpus.load import Dataset, write_dataset
    from privasr.corpus.records import Transcript
    from privasr.device.node import Device
    from privasr.outputs import check_output_file

    check_output_file(out)
    best = Device(folder).rescore()
    tmp = out.with_name(f".{out.name}.tmp")
    if fmt == "kaldi-text":
        tmp.write_text("".join(f"{u} {t}\n" for u, t in best), encoding="utf-8")
    else:
        recs = tuple(Transcript(u, tuple(t.split())) for u, t in best)
        try:
            write_dataset(Dataset("1best", "transcript", fmt, recs), tmp, fmt)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    tmp.replace(out)
    make_console().print(f"{len(best)} utterances -> {out}")


@device_app.command("replay")
def replay(
    nbest: Path = typer.Option(..., "--nbest", help="An N-best set (any format privasr reads)."),
    rounds: int = typer.Option(..., "--rounds", help="The run's rounds minus one (FMP's fmp.rounds)."),
    out: Path = typer.Option(..., "--out", help="A new folder: one replay folder per client."),
    key: str = typer.Option("client", "--key", help="What a device is: client (meeting) or speaker."),
) -> None:
    """Cut an N-best set into per-device replay folders (a test bed standing in for phones that decode over a
    run): ``privasr device serve --replay OUT/<i>`` feeds round r's files to the device before round r."""
    from privasr.corpus.load import load_nbest
    from privasr.device.folder import write_replay

    made = write_replay(load_nbest(nbest), out, key=key, rounds=rounds)
    con = make_console()
    for i, (name, folder) in enumerate(made):
        con.print(f"device {i}: {name} -> {folder}")


@device_app.command("status")
def status(folder: Path = typer.Argument(..., help="The device's folder.")) -> None:
    """Which files went into which round, and which were set aside (and why)."""
    from privasr.device.folder import DeviceFolder

    d = DeviceFolder(folder)
    led = d.ledger()
    con = make_console()
    for r in d.taken_rounds():
        con.print(f"round {r}: {len(led['rounds'][str(r)])} file(s)")
    for name, e in sorted(led["files"].items()):
        if e.get("status") == "set-aside":
            con.print(f"set aside: {name}: {e.get('error')}")
