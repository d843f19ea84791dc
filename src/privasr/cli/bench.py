"""``privasr bench``: speed benchmarks that report ratios against a baseline measured in the same run."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import typer

from privasr.cli._console import make_console
from privasr.errors import ConfigError


def run(name: str, out: Path, quick: bool, seed: int, device: str = "cpu", clients: int | None = None) -> None:
    """Run one benchmark (or ``all``) and print its metrics."""
    from privasr.bench import BENCHMARKS, get

    names = list(BENCHMARKS) if name == "all" else [name]
    for n in names:
        if n not in BENCHMARKS:
            raise ConfigError(f"unknown benchmark {n!r}", expected=f"one of {sorted(BENCHMARKS)} or 'all'")
    if device != "cpu":
        if not (device == "cuda" or (device.startswith("cuda:") and device[5:].isdigit())):
            raise ConfigError(f"--device {device!r}", expected="cpu, cuda or cuda:N")
        if name == "all":
            names = [n for n in names if "device" in inspect.signature(get(n)).parameters]
        elif "device" not in inspect.signature(get(name)).parameters:
            raise ConfigError(f"benchmark {name!r} runs on the CPU only",
                              expected="--device cpu (benchmarks with a device: nnlm-scoring, nnlm-train, ftl)")
    if clients is not None and (name == "all" or "clients" not in inspect.signature(get(name)).parameters):
        raise ConfigError(f"--clients with benchmark {name!r}",
                          expected="a benchmark with a number of clients (secagg)")
    console = make_console()
    for n in names:
        target = out / n if name == "all" else out
        with console.status(f"benchmark {n}"):
            kwargs: dict[str, object] = {"device": device} if device != "cpu" else {}
            if clients is not None:
                kwargs["clients"] = clients
            metrics = get(n)(target, quick=quick, seed=seed, **kwargs)
        console.print(f"[bold]{n}[/] -> {target / 'results.json'}")
        console.print_json(json.dumps(metrics))


def bench(
    name: str = typer.Argument(..., help="Benchmark name (see the list above) or 'all'."),
    out: Path = typer.Option(..., "--out", help="Output folder for results.json."),
    quick: bool = typer.Option(False, "--quick", help="Smaller sizes, fewer repeats (for smoke tests)."),
    seed: int = typer.Option(0, "--seed", help="Random seed for generated inputs."),
    device: str = typer.Option("cpu", "--device",
                               help="cpu, or cuda[:N] for the benchmarks that have a GPU path (nnlm-scoring, ftl, "
                                    "nnlm-train; with 'all', only those run)."),
    clients: int | None = typer.Option(None, "--clients", help="Number of clients (secagg: default 8, at least 4)."),
) -> None:
    """Run a benchmark by name, or all of them (then one sub-folder each)."""
    run(name, out, quick, seed, device, clients)


def _document_names() -> None:
    from privasr.bench import BENCHMARKS

    bench.__doc__ = (bench.__doc__ or "") + "\n\nBenchmarks: " + ", ".join(BENCHMARKS) + "."


_document_names()
