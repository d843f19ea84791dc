"""``privasr bench``: speed benchmarks that report ratios against a baseline measured in the same run."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import typer
from rich.console import Console

from privasr.errors import ConfigError


def run(name: str, out: Path, quick: bool, seed: int, device: str = "cpu") -> None:
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
    console = Console()
    for n in names:
        target = out / n if name == "all" else out
        with console.status(f"benchmark {n}"):
            kwargs = {"device": device} if device != "cpu" else {}
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
) -> None:
    """Run a benchmark by name, or all of them (then one sub-folder each)."""
    run(name, out, quick, seed, device)


def _document_names() -> None:
    from privasr.bench import BENCHMARKS

    bench.__doc__ = (bench.__doc__ or "") + "\n\nBenchmarks: " + ", ".join(BENCHMARKS) + "."


_document_names()
