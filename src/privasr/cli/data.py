"""``privasr data``: inspect, convert and synthesise corpora."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from privasr import progress
from privasr.cli._console import make_console, print_table
from privasr.errors import InputError

app = typer.Typer(help="Inspect, convert and synthesise ASR corpora.", no_args_is_help=True)
out_console = make_console()  # no truncated tables in pipes and logs


def _pct(x: Any) -> str:
    return "" if x is None else f"{100 * x:.2f}%"


_REF_HELP = ("A reference file (Kaldi text, trn or transcript JSON Lines) whose transcripts become the references "
             "of the N-best lists, by utterance id (every list needs one and every reference a list).")
_NBEST_HELP = "HTK SLF lattice input only: how many distinct best word strings each lattice's N-best list holds."


def load_inputs(path: Path, fmt: str | None, ref: Path | None = None, nbest: int | None = None,
                ) -> tuple[list[Any], dict[str, Any] | None]:
    """The data sets of ``path`` (and what privasr folder it is, if one): lattices decoded to ``nbest`` strings,
    references from ``ref`` attached to the N-best sets."""
    from privasr.corpus.formats.slf_nbest import read_htk_nbest
    from privasr.corpus.formats.trn import reading_markup
    from privasr.corpus.load import Dataset, load_path
    from privasr.corpus.privasr_folders import privasr_folder
    from privasr.corpus.references import attach_references, read_references

    folder = privasr_folder(path) if fmt is None else None
    if folder is not None:
        datasets = folder.load()
    else:
        with reading_markup():  # sclite's alternations are counted apart (privasr.metrics.summary)
            datasets = load_path(path, fmt)
    if nbest is not None:
        if nbest < 1:
            raise InputError(f"--nbest {nbest}", expected="an integer >= 1")
        if not datasets or any(d.fmt != "htk-lattice" for d in datasets):
            raise InputError("--nbest is for HTK lattices but the input holds other sets", path=path,
                             expected="a lattice file or a folder of lattices")
        if len(datasets) != 1:
            raise InputError(f"--nbest reads one lattice file or folder, the input holds {len(datasets)} sets",
                             path=path, expected="a lattice file or a folder of lattice files")
        datasets = [Dataset(datasets[0].name, "nbest", "htk-lattice", tuple(read_htk_nbest(path, nbest)))]
    if ref is not None:
        nsets = [d for d in datasets if d.kind == "nbest"]
        if not nsets:
            raise InputError("--ref attaches references to N-best lists but the input holds none", path=path,
                             expected="an N-best file or folder")
        pooled = attach_references([r for d in nsets for r in d.records], read_references(ref), path=ref)
        it = iter(pooled)
        with_refs = {id(d): Dataset(d.name, d.kind, d.fmt, tuple(next(it) for _ in d.records), d.references)
                     for d in nsets}
        datasets = [with_refs.get(id(d), d) for d in datasets]
    return datasets, None if folder is None else folder.summary()


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
    ref: Path = typer.Option(None, "--ref", help=_REF_HELP),
    nbest: int = typer.Option(None, "--nbest", help=_NBEST_HELP + " Default 10."),
    results: Path | None = typer.Option(None, "--results", help="Also write the figures as results.json to this "
                                        "file (config, version, the input's fingerprint, metrics)."),
) -> None:
    """Print counts (utterances, clients, words, hyps/utt) and 1-best/oracle WER where references exist, and
    for N-best lists how often the reference is one of the hypotheses.

    For a folder with several sets (e.g. dev and test), the totals pool the sets that are not systems
    scored against shared references; every set is listed under "datasets". A folder written by
    `privasr data synth` or `privasr demo` is read as what it is (its N-best lists and transcripts).
    """
    from privasr.metrics.summary import combine_stats, dataset_stats
    from privasr.outputs import check_output_file
    from privasr.text.normalize import Normalizer

    if results is not None:
        check_output_file(results)
    norm: str | Normalizer = normalize if normalize == "auto" else Normalizer.from_spec(normalize)
    datasets, folder = load_inputs(path, fmt, ref, nbest)
    parts = [dataset_stats(d, norm) for d in progress.track(datasets, "scoring", total=len(datasets))]
    primary = [p for p, d in zip(parts, datasets, strict=True) if d.references is None] or parts
    summary: dict[str, Any] = {"path": str(path), **combine_stats(primary), "datasets": parts}
    if folder is not None:
        summary["privasr_folder"] = folder
    if len(parts) == 1:
        summary.update({k: v for k, v in parts[0].items() if k not in ("name",)})
    if results is not None:
        from privasr.results import write_results

        write_results(results.parent, filename=results.name, seed=None, metrics=summary,
                      data={"input": path, **({"ref": ref} if ref is not None else {})},
                      config={"command": "data inspect", "path": str(path), "format": fmt, "normalize": normalize,
                              "ref": None if ref is None else str(ref), "nbest": nbest})
    if as_json:
        typer.echo(json.dumps(summary, sort_keys=False))
        return
    table = Table(title=f"privasr data inspect {path}", show_lines=False)
    ref_col = any("ref_in_list" in p for p in parts)
    cols = ("set", "kind", "format", "utts", "clients", "speakers", "words", "hyps/utt", "1-best WER", "oracle WER",
            *(("ref in list",) if ref_col else ()))
    for col in cols:
        table.add_column(col, justify="left" if col in ("set", "kind", "format") else "right")
    for p in parts:
        table.add_row(
            p["name"], p["kind"], p["format"], f"{p['utterances']:,}", f"{p['clients']:,}", f"{p['speakers']:,}",
            f"{p['words']:,}", f"{p['hyps_per_utt']:.2f}" if "hyps_per_utt" in p else "",
            _pct(p.get("wer_1best")), _pct(p.get("wer_oracle")), *((_pct(p.get("ref_in_list")),) if ref_col else ()),
        )
    if len(parts) > 1:
        table.add_row("total", "", "", f"{summary['utterances']:,}", f"{summary['clients']:,}",
                      f"{summary['speakers']:,}", f"{summary['words']:,}", "",
                      _pct(summary.get("wer_1best")), _pct(summary.get("wer_oracle")), *(("",) if ref_col else ()),
                      style="bold")
    if folder is not None:
        out_console.print(f"{path}: {folder['description']}")
        for name, f in folder["files"].items():
            out_console.print(f"  {name}: {f['what']}")
    print_table(out_console, table)


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
        "format name with a writer (see docs/formats.md). N-best lists written in a transcript format "
        "(kaldi-text, trn, transcript-jsonl, ...) are written as their first-pass 1-best."
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite existing output files."),
    ref: Path = typer.Option(None, "--ref", help=_REF_HELP),
    nbest: int = typer.Option(None, "--nbest", help=_NBEST_HELP + " Default 10."),
) -> None:
    """Convert a corpus into the canonical JSON Lines format (or another format with a writer)."""
    from privasr.corpus.load import FORMAT_KINDS, Dataset, write_dataset
    from privasr.corpus.references import one_best
    from privasr.outputs import check_output_file

    if not dst.is_dir():
        check_output_file(dst)
    datasets, _ = load_inputs(src, fmt, ref, nbest)
    targets = output_targets(datasets, src, dst, to, force)
    for _, target in targets:
        check_output_file(target)
    for d, target in targets:
        what = f"{d.kind} records"
        if d.kind == "nbest" and FORMAT_KINDS.get(to) == "transcript":
            d = Dataset(d.name, "transcript", d.fmt, tuple(one_best(d.records)))
            what = "1-best transcripts"
        n = write_dataset(d, target, to)
        out_console.print(f"wrote {n:,} {what} of {d.name} to {target}")


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
