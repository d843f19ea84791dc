"""``privasr ftl``: federated transfer learning of acoustic models (paper 002) experiments.

``privasr ftl run --config configs/ftl-an4.yaml [--set key=value ...] --out DIR`` runs
:mod:`privasr.experiments.ftl` and writes ``DIR/results.json`` and ``DIR/report.md``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from privasr.cli._console import make_console
from privasr.errors import InputError

__all__ = ["app", "run", "compare"]

app = typer.Typer(help="Federated transfer learning of acoustic models (client pool, client/server optimisers, "
                       "softmax weighting, server replay).", no_args_is_help=True)


@app.command("run")
def run(
    config: Path = typer.Option(..., "--config", help="YAML config (see configs/ftl-an4.yaml)."),
    out: Path = typer.Option(..., "--out", help="Output folder: results.json, report.md, cache/, checkpoint/."),
    overrides: list[str] = typer.Option([], "--set", help="Override a config value: --set rounds=5 "
                                                          "(dotted keys, YAML values; repeatable)."),
) -> None:
    """Run an FTL experiment: seed model, federated runs (system and FedAvg baseline), WER/CER, rounds to target."""
    from privasr.cli.rescore import _command_line
    from privasr.config import apply_overrides, parse_overrides, read_config
    from privasr.experiments.ftl import load_ftl_config, run_ftl
    from privasr.outputs import check_output_dir, output_dir

    check_output_dir(out)
    raw: dict[str, Any] = apply_overrides(read_config(config), parse_overrides(overrides))
    try:
        cfg = load_ftl_config(raw)
    except InputError as e:
        raise e.at(config) from None
    with output_dir(out), make_console(stderr=True).status(f"FTL ({cfg.name})"):
        m = run_ftl(cfg, out, argv=_command_line())
    r, rb = m["rounds_to_target"], m["rounds_to_target_baseline"]
    make_console().print(escape(
        f"test WER / CER: {m['wer_system']} {100 * m['wer']:.2f}% / {100 * m['cer']:.2f}% against the baseline "
        f"{m['wer_baseline_system']} {100 * m['wer_baseline']:.2f}% / {100 * m['cer_baseline']:.2f}% (MAPSSWE p = "
        f"{m['mapsswe_p']:.3g}); rounds to the target loss {m['target_loss']:.4f}: "
        f"{'not reached' if r is None else r} against {'not reached' if rb is None else rb}"))
    make_console().print(f"[bold]results:[/] {out / 'results.json'}  [bold]report:[/] {out / 'report.md'}")


@app.command("compare")
def compare(
    runs: list[Path] = typer.Argument(..., help="Finished FTL output folders (or their results.json), e.g. one "
                                                "per seed, all on the same test set."),
    a: str = typer.Option("ftl", "--a", help="System A: a name in each run's 'runs' (ftl, baseline, a table row)."),
    b: str = typer.Option("baseline", "--b", help="System B, compared with A."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Write DIR/results.json (config, seed, version, "
                                                              "metrics), DIR/report.md and its plots."),
    seed: int = typer.Option(0, "--seed", help="Seed of the bootstrap's random generator."),
    resamples: int = typer.Option(1000, "--resamples", help="Number of bootstrap resamples."),
    confidence: float = typer.Option(0.95, "--confidence", help="Coverage of the bootstrap interval."),
) -> None:
    """Compare two systems over several FTL runs (seeds): each run's WERs and MAPSSWE, and the seed-averaged
    WER difference with a paired bootstrap interval over test utterances."""
    from privasr.experiments.ftl_compare import compare_runs, write_comparison
    from privasr.outputs import check_output_dir

    if out is not None:
        check_output_dir(out)
    r = compare_runs([str(p) for p in runs], a, b, resamples=resamples, confidence=confidence, seed=seed)
    con = make_console()
    for row in r["per_run"]:
        con.print(f"{row['run']}: {a} {100 * row['wer_a']:.2f}%  {b} {100 * row['wer_b']:.2f}%  MAPSSWE p = "
                  f"{row['mapsswe_p']:.3g} ({row['mapsswe_better']})")
    p = r["pooled"]
    con.print(f"over {p['runs']} runs: {a} {100 * p['wer_a']:.2f}%  {b} {100 * p['wer_b']:.2f}%  difference "
              f"{100 * p['difference']:+.2f} points, {100 * p['confidence']:g}% interval [{100 * p['ci_low']:+.2f}, "
              f"{100 * p['ci_high']:+.2f}], P({a} better) = {p['prob_a_better']:.3f}")
    if out is not None:
        path = write_comparison(out, r, {"runs": [str(x) for x in runs], "a": a, "b": b, "resamples": resamples,
                                         "confidence": confidence}, seed)
        con.print(f"[bold]results:[/] {path}  [bold]report:[/] {out / 'report.md'}")
