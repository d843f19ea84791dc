"""``privasr fed``: deploy a federated run on real machines.

* ``privasr fed split fmp|fedlm|ftl --config CONFIG --out KIT`` runs the runner's stages up to its federated run and
  writes that run as a deployment kit (:mod:`privasr.federated.backends.flower_kit`): one folder per client, the
  Flower app, the server's and the devices' files, credentials and ``COMMANDS.md``.
* ``privasr fed run KIT`` runs a kit on this machine with those commands (loopback), writing
  ``KIT/results.json``.
* ``privasr fed credentials --out DIR --nodes N`` makes a CA, a SuperLink certificate and SuperNode keys.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from privasr.cli._console import make_console
from privasr.errors import ConfigError, InputError

__all__ = ["app", "split", "run", "credentials"]

app = typer.Typer(help="Deploy federated runs: split a run into per-client folders and a Flower app, run it.",
                  no_args_is_help=True)

_RUNNERS = {"fmp": ("privasr.experiments.fmp", "load_fmp_config"),
            "fedlm": ("privasr.experiments.fedlm", "load_fedlm_config"),
            "ftl": ("privasr.experiments.ftl", "load_ftl_config")}


@app.command("split")
def split(
    algorithm: str = typer.Argument(..., help="The runner whose config it is: fmp, fedlm or ftl."),
    config: Path = typer.Option(..., "--config", help="The runner's YAML config (its federated section applies)."),
    out: Path = typer.Option(..., "--out", help="The kit's folder (new)."),
    overrides: list[str] = typer.Option([], "--set", help="Override a config value (dotted keys, YAML values)."),
    hosts: list[str] = typer.Option([], "--host", help="A name or address the devices reach the SuperLink at "
                                                       "(repeatable; the first goes into the commands)."),
    port: int = typer.Option(9092, "--port", help="The SuperLink's port in the commands."),
) -> None:
    """Prepare a federated run (data, models, tuning) and write it as a deployment kit."""
    import importlib

    from privasr.config import apply_overrides, parse_overrides, read_config
    from privasr.federated.backends.flower_kit import write_kit

    if algorithm not in _RUNNERS:
        raise ConfigError(f"unknown runner {algorithm!r}", expected=f"one of {', '.join(_RUNNERS)}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"--out {out} exists and is not an empty folder", expected="a new folder for the kit")
    module = importlib.import_module(_RUNNERS[algorithm][0])
    raw: dict[str, Any] = apply_overrides(read_config(config), parse_overrides(overrides))
    try:
        cfg = getattr(module, _RUNNERS[algorithm][1])(raw)
    except InputError as e:
        raise e.at(config) from None
    work = out.parent / f".{out.name}.prepare"  # the runner's caches: server side, outside the kit
    with make_console(stderr=True).status(f"preparing {algorithm} ({cfg.name})"):
        federation = module.federation(cfg, work)
        kit = write_kit(out, federation, hosts=hosts, port=port)
    con = make_console()
    con.print(f"{len(federation.clients)} client folders, {federation.rounds} rounds"
              + (", secure aggregation" if getattr(federation.secagg, "enabled", False) else "")
              + (", differential privacy" if federation.privacy is not None else ""))
    con.print(f"[bold]kit:[/] {kit}  [bold]commands:[/] {kit / 'COMMANDS.md'}  "
              f"[bold]on this machine:[/] privasr fed run {kit}")


@app.command("run")
def run(
    kit: Path = typer.Argument(..., help="A kit written by `privasr fed split`."),
    timeout: float | None = typer.Option(None, "--timeout", help="Seconds the run may take (default: no limit)."),
    devices: list[Path] = typer.Option([], "--devices", help="A `privasr serve` kit's device folders, device i "
                                                             "i-th (repeat the option)."),
    replays: list[Path] = typer.Option([], "--replay", help="With --devices: one replay folder per device "
                                                            "(`privasr device replay`), device i i-th."),
) -> None:
    """Run a kit on this machine: a SuperLink and one SuperNode per client folder (or device) over TLS, then
    the run."""
    from privasr.federated.backends.flower_kit import read_kit, run_kit
    from privasr.federated.tree import save_tree
    from privasr.results import write_results

    if (kit / "kit.json").is_file() and '"kind": "serve"' in (kit / "kit.json").read_text():
        _run_serve(kit, devices, timeout, replays)
        return
    if devices:
        raise ConfigError("--devices is for kits written by `privasr serve`", expected="a serve kit")
    info = read_kit(kit)
    what = f"running {info.get('name') or 'the kit'}: {info['clients']} SuperNodes"
    with make_console(stderr=True).status(f"{what}, starting") as status:
        def progress(done: int) -> None:
            status.update(f"{what}, round {done} of {info['rounds']} done")

        result = run_kit(kit, run_timeout=timeout, progress=progress)
    save_tree(kit / "state.npz", result.state)
    last = result.history[-1].metrics if result.history else {}
    metrics = {"rounds": len(result.history), "resumed_from": result.resumed_from,
               "reported": [h.reported for h in result.history],  # None in a DP run
               **{k: v for k, v in last.items() if isinstance(v, int | float)}}
    write_results(kit, config=info, seed=info.get("seed"), metrics=metrics,
                  data={k: {"path": f"data/{k}", "sha256": v}  # the kit's client folders, hashed when written
                        for k, v in info.get("client_folders", {}).items()},
                  extra={"history": [h.to_dict() for h in result.history]})
    con = make_console()
    private = "epsilon" in last  # a DP run publishes no count of the clients that reported (docs/privacy.md)
    con.print(f"{len(result.history)} rounds, "
              + ("clients per round not published (differential privacy)" if private
                 else f"clients per round {metrics['reported']}")
              + (f", epsilon {last['epsilon']:.3g}" if private else ""))
    con.print(f"[bold]results:[/] {kit / 'results.json'}  [bold]state:[/] {kit / 'state.npz'}")


def _run_serve(kit: Path, devices: list[Path], timeout: float | None, replays: list[Path]) -> None:
    from privasr.federated.backends.flower_serve import read_serve_kit, run_serve_kit
    from privasr.federated.tree import save_tree
    from privasr.results import write_results

    info = read_serve_kit(kit)
    what = f"running {info.get('name') or 'the kit'}: {info['devices']} devices"
    with make_console(stderr=True).status(f"{what}, starting") as status:
        def progress(done: int) -> None:
            status.update(f"{what}, round {done} of {info['rounds']} done")

        result = run_serve_kit(kit, devices, run_timeout=timeout, replays=replays or None, progress=progress)
    save_tree(kit / "state.npz", result.state)
    last = result.history[-1].metrics if result.history else {}
    metrics = {"rounds": len(result.history), "resumed_from": result.resumed_from,
               "reported": [h.reported for h in result.history],
               **{k: v for k, v in last.items() if isinstance(v, int | float)}}
    write_results(kit, config=info, seed=info.get("run", {}).get("seed"), metrics=metrics,
                  data={"bundle": {"path": "bundle", "sha256": info["bundle"]}},
                  extra={"history": [h.to_dict() for h in result.history]})
    make_console().print(f"{len(result.history)} rounds; [bold]results:[/] {kit / 'results.json'}")


@app.command("credentials")
def credentials(
    out: Path = typer.Option(..., "--out", help="A new folder for the files."),
    nodes: int = typer.Option(..., "--nodes", help="The number of SuperNode key pairs."),
    hosts: list[str] = typer.Option([], "--host", help="A name or address of the SuperLink (repeatable; "
                                                       "default: loopback)."),
) -> None:
    """Make a private CA, the SuperLink's certificate for its hosts and one key pair per SuperNode."""
    from privasr.federated.credentials import DEFAULT_HOSTS, make_credentials

    c = make_credentials(out, nodes=nodes, hosts=tuple(hosts) or DEFAULT_HOSTS)
    con = make_console()
    con.print(f"CA {c.ca_cert}, SuperLink {c.server_cert} (+ key), {nodes} SuperNode key pairs in {c.folder / 'nodes'}")
    con.print("flower-superlink " + " ".join(c.superlink_args()))
