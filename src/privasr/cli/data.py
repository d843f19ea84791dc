"""``privasr data``: inspect, convert and synthesise corpora."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from privasr.errors import InputError

app = typer.Typer(help="Inspect, convert and synthesise ASR corpora.", no_args_is_help=True)
out_console = Console(width=None if sys.stdout.isatty() else 200)  # no truncated tables in pipes and logs


def _pct(x: Any) -> str:
    return "" if x is None else f"{100 * x:.2f}%"


@app.command()
def inspect(
    path: Path = typer.Argument(..., help="A corpus file or folder (any supported format; see docs/formats.md)."),
    fmt: str = typer.Option(None, "--format", "-f", help="Force a format instead of detecting it."),
    normalize: str = typer.Option(
        "auto", "--normalize", help="Text normaliser applied before scoring WER: 'auto' (N-best sets as they "
        "are; hypotheses scored against another source's references, e.g. Earnings-21 CTMs, with 'wer'), or a "
        "preset (none, asr, wer, ami) with optional overrides, e.g. 'wer,fillers=keep'."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of a table."),
    results: Path | None = typer.Option(None, "--results", help="Also write the figures as results.json to this "
                                        "file (config, version, the input's fingerprint, metrics)."),
) -> None:
    """Print counts (utterances, clients, words, hyps/utt) and 1-best/oracle WER where references exist.

    For a folder with several sets (e.g. dev and test), the totals pool the sets that are not systems
    scored against shared references; every set is listed under "datasets".
    """
    from privasr.corpus.load import load_path
    from privasr.metrics.summary import combine_stats, dataset_stats
    from privasr.outputs import check_output_file
    from privasr.text.normalize import Normalizer

    if results is not None:
        check_output_file(results)
    norm: str | Normalizer = normalize if normalize == "auto" else Normalizer.from_spec(normalize)
    datasets = load_path(path, fmt)
    parts = [dataset_stats(d, norm) for d in datasets]
    primary = [p for p, d in zip(parts, datasets, strict=True) if d.references is None] or parts
    summary: dict[str, Any] = {"path": str(path), **combine_stats(primary), "datasets": parts}
    if len(parts) == 1:
        summary.update({k: v for k, v in parts[0].items() if k not in ("name",)})
    if results is not None:
        from privasr.results import write_results

        write_results(results.parent, filename=results.name, seed=None, metrics=summary, data={"input": path},
                      config={"command": "data inspect", "path": str(path), "format": fmt, "normalize": normalize})
    if as_json:
        typer.echo(json.dumps(summary, sort_keys=False))
        return
    table = Table(title=f"privasr data inspect {path}", show_lines=False)
    for col in ("set", "kind", "format", "utts", "clients", "speakers", "words", "hyps/utt", "1-best WER", "oracle WER"):
        table.add_column(col, justify="left" if col in ("set", "kind", "format") else "right")
    for p in parts:
        table.add_row(
            p["name"], p["kind"], p["format"], f"{p['utterances']:,}", f"{p['clients']:,}", f"{p['speakers']:,}",
            f"{p['words']:,}", f"{p['hyps_per_utt']:.2f}" if "hyps_per_utt" in p else "",
            _pct(p.get("wer_1best")), _pct(p.get("wer_oracle")),
        )
    if len(parts) > 1:
        table.add_row("total", "", "", f"{summary['utterances']:,}", f"{summary['clients']:,}",
                      f"{summary['speakers']:,}", f"{summary['words']:,}", "",
                      _pct(summary.get("wer_1best")), _pct(summary.get("wer_oracle")), style="bold")
    out_console.print(table)


def output_targets(datasets: list[Any], src: Path, dst: Path, to: str, force: bool) -> list[tuple[Any, Path]]:
    """Where each dataset read from ``src`` is written: ``dst`` itself for one set (unless it is a folder), else
    ``dst/<set name>.<to>``; refuses to write over the input, and over existing files without ``force``."""
    targets: list[tuple[Any, Path]] = []
    if len(datasets) == 1 and not (dst.exists() and dst.is_dir()):
        targets.append((datasets[0], dst))
    else:
        suffix = ".jsonl" if to == "jsonl" else f".{to}"
        targets.extend((d, dst / (d.name.replace("/", "_") + suffix)) for d in datasets)
    src_res = src.resolve()
    for _, target in targets:
        if target.resolve() == src_res:
            raise InputError("refusing to write over the input", path=target)
        if target.exists() and not force:
            raise InputError("output exists (use --force to overwrite)", path=target)
    return targets


@app.command()
def convert(
    src: Path = typer.Argument(..., help="Input corpus file or folder."),
    dst: Path = typer.Argument(..., help="Output file (one set) or folder (several sets)."),
    fmt: str = typer.Option(None, "--from", help="Input format (detected when omitted)."),
    to: str = typer.Option(
        "jsonl", "--to", help="Output format: 'jsonl' (canonical N-best or transcript JSON Lines), or any "
        "format name with a writer (see docs/formats.md)."
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite existing output files."),
) -> None:
    """Convert a corpus into the canonical JSON Lines format (or another format with a writer)."""
    from privasr.corpus.load import load_path, write_dataset
    from privasr.outputs import check_output_file

    if not dst.is_dir():
        check_output_file(dst)
    datasets = load_path(src, fmt)
    targets = output_targets(datasets, src, dst, to, force)
    for _, target in targets:
        check_output_file(target)
    for d, target in targets:
        n = write_dataset(d, target, to)
        out_console.print(f"wrote {n:,} {d.kind} records of {d.name} to {target}")


@app.command()
def synth(
    out: Path = typer.Option(..., "--out", help="Output folder."),
    seed: int = typer.Option(0, "--seed", help="Random seed (the same seed gives byte-identical files)."),
    preset: str = typer.Option("small", "--preset", help="Size preset: tiny (doctests), small (seconds) or "
                                                         "medium (benchmarks)."),
    overrides: list[str] = typer.Option(
        [], "--set", help="Override a SynthConfig field, e.g. --set n_clients=100 (repeatable)."
    ),
) -> None:
    """Generate the seeded synthetic federated ASR corpus (clients, N-best lists, background text)."""
    from privasr.config import parse_overrides
    from privasr.synth import SynthConfig, generate

    config = SynthConfig.preset(preset, seed=seed, **parse_overrides(overrides))
    corpus = generate(config)
    manifest = corpus.write(out)
    out_console.print_json(json.dumps(manifest.get("stats", {})))
    out_console.print(f"corpus written to {out}")


def _register() -> None:
    from privasr.cli.data_tts import tts_nbest

    app.command("tts-nbest")(tts_nbest)


_register()
