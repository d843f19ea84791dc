"""``privasr fedlm``: federated NNLM fine-tuning (paper 001) experiments.

``privasr fedlm run --config configs/fedlm-earnings21.yaml [--set key=value ...] --out DIR`` runs
:mod:`privasr.experiments.fedlm` and writes ``DIR/results.json`` and ``DIR/report.md``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from privasr.cli._console import make_console
from privasr.cli.rescore import FOLD_UNIT
from privasr.errors import InputError

__all__ = ["app", "run", "stability"]

app = typer.Typer(help="Federated NNLM fine-tuning on first-pass transcripts with confidence-weighted losses.",
                  no_args_is_help=True)


@app.command("run")
def run(
    config: Path = typer.Option(..., "--config", help="YAML config (see configs/fedlm-earnings21.yaml)."),
    out: Path = typer.Option(..., "--out", help="Output folder: results.json, report.md, checkpoint/."),
    overrides: list[str] = typer.Option([], "--set", help="Override a config value: --set rounds=5 "
                                                          "(dotted keys, YAML values; repeatable)."),
    folds: int | None = typer.Option(None, "--folds", help="Cross-validate over meetings (N-best data): pool dev "
                                     "and test, cut their meetings into K folds; the K-1 are the clients and tune, "
                                     "the K-th is tested, rotating (config key folds; tables are dropped; "
                                     "privasr.experiments.fedlm_folds)."),
    fold_unit: str | None = FOLD_UNIT,
) -> None:
    """Run a FedLM experiment: unadapted vs federated fine-tuned NNLM (perplexity; WER on N-best data).

    With --folds K every meeting is tested once, by a model fine-tuned and weights tuned without it; the report
    gives each fold, the pooled figures and their spread across folds and meetings."""
    from privasr.cli.rescore import _command_line, fold_overrides, print_folds
    from privasr.config import apply_overrides, parse_overrides, read_config
    from privasr.experiments.fedlm import load_fedlm_config, run_fedlm
    from privasr.metrics.bootstrap import difference_interval
    from privasr.outputs import check_output_dir, output_dir

    check_output_dir(out)
    raw: dict[str, Any] = apply_overrides(read_config(config), parse_overrides(overrides))
    raw = apply_overrides(raw, fold_overrides(folds, fold_unit, tables={}))
    try:
        cfg = load_fedlm_config(raw)
    except InputError as e:
        raise e.at(config) from None
    if cfg.folds is not None:
        from privasr.experiments.fedlm_folds import run_fedlm_folds

        with output_dir(out), make_console(stderr=True).status(f"FedLM ({cfg.name}), {cfg.folds} folds"):
            m = run_fedlm_folds(cfg, out, argv=_command_line())
        print_folds(m, out, m["wer_system"],
                    (f"; against all utterances {100 * m['vs_all_rel_change']:+.2f}% (MAPSSWE p = "
                     f"{m['vs_all_mapsswe_p']:.3g})" if "vs_all_rel_change" in m else "")
                    + f"; {m['dropped_updates']} client updates dropped")
        return
    with output_dir(out), make_console(stderr=True).status(f"FedLM ({cfg.name})"):
        m = run_fedlm(cfg, out, argv=_command_line())
    con = make_console()
    line = (f"perplexity {m['ppl']:.2f} (unadapted {m['ppl_baseline']:.2f}"
            + (f", all utterances {m['ppl_all_utts']:.2f}" if "ppl_all_utts" in m else "") + ")")
    if "wer" in m:
        line += (f"; test WER: {m['wer_system']} {100 * m['wer']:.2f}% against the baseline "
                 f"{m['wer_baseline_system']} {100 * m['wer_baseline']:.2f}% (relative "
                 f"{100 * m['wer_rel_change']:+.2f}%, MAPSSWE p = {m['mapsswe_p']:.3g}; "
                 f"{difference_interval(m['bootstrap_ci_low'], m['bootstrap_ci_high'])})")
    if "epsilon" in m:
        line += f"; epsilon = {m['epsilon']:.3g} at delta = {m['delta']:.3g}"
    con.print(escape(line))
    con.print(f"[bold]results:[/] {out / 'results.json'}  [bold]report:[/] {out / 'report.md'}")


def _clip(value: str) -> float | None:
    """``none`` or a number > 0 (validated by FedLmConfig)."""
    if value.strip().lower() == "none":
        return None
    try:
        return float(value)
    except ValueError:
        raise InputError(f"--grad-clip {value!r}", expected="'none' or a number > 0") from None


@app.command("stability")
def stability(
    config: Path = typer.Option(..., "--config", help="A fedlm YAML config: its clients, NNLM and fedlm settings."),
    out: Path = typer.Option(..., "--out", help="Output folder: results.json, report.md."),
    lr: list[float] = typer.Option([1.0], "--lr", help="A client learning rate to try (repeatable)."),
    grad_clip: list[str] = typer.Option(["none"], "--grad-clip", help="A local gradient bound to try, or 'none' "
                                        "(repeatable)."),
    draws: int = typer.Option(3, "--draws", help="Batch orders per client and cell."),
    start: list[Path] = typer.Option([], "--from", help="Also train from this checkpoint (a fedlm run's "
                                     "model.pt; repeatable); the pre-trained NNLM is always a start."),
    overrides: list[str] = typer.Option([], "--set", help="Override a config value (dotted keys; repeatable)."),
) -> None:
    """How close local training runs to divergence: every client trains one round locally per learning rate,
    gradient bound and start; the report counts non-finite models, the losses and the clipped batches."""
    from privasr.cli.rescore import _command_line
    from privasr.config import apply_overrides, parse_overrides, read_config
    from privasr.experiments.fedlm import load_fedlm_config
    from privasr.experiments.fedlm_stability import run_stability
    from privasr.outputs import check_output_dir, output_dir

    check_output_dir(out)
    raw: dict[str, Any] = apply_overrides(read_config(config), parse_overrides(overrides))
    try:
        cfg = load_fedlm_config(raw)
    except InputError as e:
        raise e.at(config) from None
    clips = [_clip(c) for c in grad_clip]
    with output_dir(out), make_console(stderr=True).status(f"local training stability ({cfg.name})"):
        m = run_stability(cfg, out, lrs=lr, clips=clips, draws=draws, starts=start, argv=_command_line())
    con = make_console()
    for c in m["cells"]:
        con.print(escape(f"lr {c['client_lr']:g}, grad_clip {c['grad_clip']}, from {c['start']}: "
                         f"{c['non_finite']} of {c['trainings']} non-finite, mean loss {c['mean_loss']}"))
    con.print(f"[bold]results:[/] {out / 'results.json'}  [bold]report:[/] {out / 'report.md'}")
