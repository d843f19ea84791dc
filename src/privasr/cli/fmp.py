"""``privasr fmp``: federated marginal personalisation (paper 000) experiments.

``privasr fmp run --config configs/fmp-ami.yaml [--set key=value ...] --out DIR`` runs
:mod:`privasr.experiments.fmp` and writes ``DIR/results.json`` and ``DIR/report.md``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from privasr.cli._console import make_console
from privasr.cli.rescore import FOLD_UNIT
from privasr.errors import InputError

__all__ = ["app", "run", "compare_deployment"]

app = typer.Typer(help="Federated marginal personalisation of a neural LM for N-best rescoring.",
                  no_args_is_help=True)


@app.command("run")
def run(
    config: Path = typer.Option(..., "--config", help="YAML config (see configs/fmp-ami.yaml)."),
    out: Path = typer.Option(..., "--out", help="Output folder: results.json, report.md, checkpoint/."),
    overrides: list[str] = typer.Option([], "--set", help="Override a config value: --set fmp.rounds=5 "
                                                          "(dotted keys, YAML values; repeatable)."),
    folds: int | None = typer.Option(None, "--folds", help="Cross-validate over meetings: pool dev and test, cut "
                                     "their meetings into K folds, tune on K-1 and run FMP over the K-th, rotating "
                                     "(config key folds; tables are dropped; privasr.experiments.fmp_folds)."),
    dp_draws: int | None = typer.Option(None, "--dp-draws", help="With --folds and a dp section: R noise draws "
                                        "of every fold's test run (config key dp_draws)."),
    fold_unit: str | None = FOLD_UNIT,
) -> None:
    """Run an FMP experiment: generic-NNLM rescoring baseline vs FMP, test WER with MAPSSWE.

    With --folds K every meeting is a test client once, the settings tuned without it; the report gives each fold,
    the pooled figures and their spread across folds and meetings (and noise draws with --dp-draws R)."""
    from privasr.cli.rescore import _command_line, fold_overrides, print_folds, print_warnings
    from privasr.config import apply_overrides, parse_overrides, read_config
    from privasr.experiments.fmp import load_fmp_config, run_fmp
    from privasr.metrics.bootstrap import difference_interval
    from privasr.outputs import check_output_dir, output_dir

    check_output_dir(out)
    raw: dict[str, Any] = apply_overrides(read_config(config), parse_overrides(overrides))
    raw = apply_overrides(raw, fold_overrides(folds, fold_unit, tables={}))
    if dp_draws is not None:
        raw = apply_overrides(raw, {"dp_draws": dp_draws})
    try:
        cfg = load_fmp_config(raw)
    except InputError as e:
        raise e.at(config) from None
    if cfg.folds is not None:
        from privasr.experiments.fmp_folds import run_fmp_folds

        with output_dir(out), make_console(stderr=True).status(f"FMP ({cfg.name}), {cfg.folds} folds"):
            m = run_fmp_folds(cfg, out, argv=_command_line())
        print_folds(m, out, m["wer_system"],
                    f"; epsilon = {m['epsilon']:.3g} per fold" if m.get("epsilon") is not None else "")
        return
    with output_dir(out), make_console(stderr=True).status(f"FMP ({cfg.name})"):
        m = run_fmp(cfg, out, argv=_command_line())
    print_warnings(m)
    con = make_console()
    con.print(escape(f"test WER: {m['wer_system']} {100 * m['wer']:.2f}% against the baseline "
                     f"{m['wer_baseline_system']} {100 * m['wer_baseline']:.2f}% (relative "
                     f"{100 * m['wer_rel_change']:+.2f}%, MAPSSWE p = {m['mapsswe_p']:.3g}; "
                     f"{difference_interval(m['bootstrap_ci_low'], m['bootstrap_ci_high'])}); lam = {m['lam']:g}"
                     + (f", epsilon = {m['epsilon']:.3g}" if "epsilon" in m else "")))
    con.print(f"[bold]results:[/] {out / 'results.json'}  [bold]report:[/] {out / 'report.md'}")


@app.command("compare-deployment")
def compare_deployment(
    config: Path = typer.Option(..., "--config", help="The config the deployment was served from."),
    hyp: Path = typer.Option(..., "--hyp", help="The devices' 1-best (privasr device rescore), concatenated."),
    out: Path = typer.Option(..., "--out", help="Output folder: results.json, report.md."),
    state: Path | None = typer.Option(None, "--state", help="The deployment's final server state (KIT/state.npz)."),
    overrides: list[str] = typer.Option([], "--set", help="Override a config value (as given to privasr serve)."),
) -> None:
    """Test WER of a deployment's 1-best against the simulation of the same config (this machine reads the test
    set: a check, not a deployment)."""
    from privasr.cli.rescore import _command_line
    from privasr.config import apply_overrides, parse_overrides, read_config
    from privasr.experiments.fmp import compare_deployment as compare
    from privasr.experiments.fmp import load_fmp_config
    from privasr.outputs import check_output_dir, output_dir

    check_output_dir(out)
    raw: dict[str, Any] = apply_overrides(read_config(config), parse_overrides(overrides))
    try:
        cfg = load_fmp_config(raw)
    except InputError as e:
        raise e.at(config) from None
    with output_dir(out), make_console(stderr=True).status(f"simulating {cfg.name}"):
        m = compare(cfg, hyp, out, state=state, argv=_command_line())
    make_console().print(f"test WER: simulation {100 * m['wer_simulation']:.2f}%, deployment "
                    f"{100 * m['wer_deployment']:.2f}%; {m['utterances_differing']} of {m['utterances']} "
                    "utterances differ")
