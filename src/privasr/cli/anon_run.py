"""``privasr anon run``: language models from privacy-transformed transcripts (paper 003, Tables 2-4).

``privasr anon run --config configs/anon-ami.yaml [--set key=value ...] --out DIR`` runs
:mod:`privasr.experiments.anon` and writes ``DIR/results.json`` and ``DIR/report.md``. The config (schema
:class:`~privasr.experiments.anon.AnonRunConfig`) is validated, overrides applied, before any work starts.
:func:`run` is a typer command; the ``anon`` command group registers it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from privasr.cli._console import make_console
from privasr.cli.rescore import FOLD_UNIT
from privasr.errors import InputError

__all__ = ["run"]


def run(
    config: Path = typer.Option(..., "--config", help="YAML config (see configs/anon-ami.yaml)."),
    out: Path = typer.Option(..., "--out", help="Output folder: results.json, report.md (and cache/ unless the "
                                                "config names a cache_dir)."),
    overrides: list[str] = typer.Option([], "--set", help="Override a config value: --set lstm.options.max_epochs=2 "
                                                          "(dotted keys, YAML values; repeatable)."),
    folds: int | None = typer.Option(None, "--folds", help="Cross-validate over meetings: pool the dev and test "
                                     "N-best sets, cut their meetings into K folds; each fold trains and tunes on "
                                     "what it does not test (config key folds; export_arpa is dropped; "
                                     "privasr.experiments.anon_folds)."),
    fold_unit: str | None = FOLD_UNIT,
) -> None:
    """Train M1-M4 on anonymised and original AMI text, adapt on clean data, interpolate, rescore N-best lists.

    With --folds K every N-best meeting is tested once, by models and weights tuned without it; the report gives
    each fold, the pooled tables and their spread across folds and meetings."""
    from privasr.cli.rescore import _command_line, fold_overrides, print_folds
    from privasr.config import apply_overrides, parse_overrides, read_config
    from privasr.experiments.anon import load_anon_config, run_anon
    from privasr.outputs import check_output_dir, output_dir

    check_output_dir(out)
    raw: dict[str, Any] = apply_overrides(read_config(config), parse_overrides(overrides))
    raw = apply_overrides(raw, fold_overrides(folds, fold_unit, export_arpa=False))
    try:
        cfg = load_anon_config(raw)
    except InputError as e:
        raise e.at(config) from None
    if cfg.folds is not None:
        from privasr.experiments.anon_folds import run_anon_folds

        with output_dir(out):
            m = run_anon_folds(cfg, out, argv=_command_line(),
                               progress=lambda msg: print(msg, file=sys.stderr, flush=True))
        rec = m["recovered_fraction"]
        print_folds(m, out, m["wer_system"], f"; {m['wer_original_system']} {100 * m['wer_original']:.2f}%, "
                    "recovered fraction " + ("n/a" if rec is None else f"{rec:.2f}"))
        return
    with output_dir(out):
        m = run_anon(cfg, out, argv=_command_line(), progress=lambda msg: print(msg, file=sys.stderr, flush=True))
    rec = m["recovered_fraction"]
    make_console().print(
        f"test WER: {m['wer_system']} {100 * m['wer']:.2f}% (baseline {m['wer_baseline_system']} "
        f"{100 * m['wer_baseline']:.2f}%, MAPSSWE p {m['mapsswe_p']:.3g}; {m['wer_original_system']} "
        f"{100 * m['wer_original']:.2f}%); recovered fraction "
        + ("n/a" if rec is None else f"{rec:.2f}") + f"; ppl {m['ppl']:.1f} vs {m['ppl_baseline']:.1f}")
    make_console().print(f"[bold]results:[/] {out / 'results.json'}  [bold]report:[/] {out / 'report.md'}")
