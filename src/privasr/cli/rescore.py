"""``privasr rescore``: N-best rescoring with weights tuned on a dev set.

``privasr rescore run --config FILE [--set key=value ...] --out DIR`` runs a config
(:mod:`privasr.experiments.rescore`); ``privasr rescore run --nbest TEST --dev DEV --lm ARPA --out DIR`` builds the
same config from flags for quick ad-hoc use (flags and ``--set`` also override a config file's values).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import typer

from privasr.cli._console import make_console
from privasr.errors import ConfigError, InputError

__all__ = ["app", "run", "flags_to_overrides", "print_warnings", "print_folds", "FOLD_UNIT", "fold_overrides"]

app = typer.Typer(help="Rescore N-best lists with language models; tune weights on dev, report test WER.",
                  no_args_is_help=True)


def flags_to_overrides(nbest: Path | None, dev: Path | None, lms: list[str], prior: str | None,
                       mode: str | None, first_pass_lm: bool | None, method: str | None,
                       fmt: str | None) -> dict[str, Any]:
    """Dotted config overrides from the ad-hoc flags (``--lm`` is ``PATH`` or ``NAME=PATH``).

    >>> flags_to_overrides(Path("t.jsonl"), None, ["x.arpa", "big=y.arpa"], "rank", None, False, None, None)
    {'data.test': 't.jsonl', 'lms.x': 'x.arpa', 'lms.big': 'y.arpa', 'combine.prior': 'rank', 'combine.first_pass_lm': False}
    """
    out: dict[str, Any] = {}
    if nbest is not None:
        out["data.test"] = str(nbest)
    if dev is not None:
        out["data.dev"] = str(dev)
    if fmt is not None:
        out["data.format"] = fmt
    for i, item in enumerate(lms):
        if "=" in item:
            name, path = item.split("=", 1)
        else:
            path = item
            name = Path(item).name.split(".")[0] or f"lm{i + 1}"
            if not name[:1].isalpha():
                name = f"lm{i + 1}_{name}"
        if f"lms.{name}" in out:
            raise ConfigError(f"two --lm flags give the name {name!r}", expected="NAME=PATH to tell them apart")
        out[f"lms.{name}"] = path
    if prior is not None:
        out["combine.prior"] = prior
    if mode is not None:
        out["combine.mode"] = mode
    if first_pass_lm is not None:
        out["combine.first_pass_lm"] = first_pass_lm
    if method is not None:
        out["search.method"] = method
    return out


FOLD_UNIT = typer.Option(None, "--fold-unit", help="With --folds: 'meeting' (default) or 'series' (whole AMI "
                                                     "meeting series per fold; config key fold_unit).")
"""The ``--fold-unit`` option every runner with ``--folds`` takes."""


def fold_overrides(folds: int | None, fold_unit: str | None, **dropped: Any) -> dict[str, Any]:
    """The config overrides of ``--folds K`` and ``--fold-unit U`` (none for unset flags); with ``--folds``,
    ``dropped`` too (the keys a cross-validated run does without, e.g. ``tables={}``).

    >>> fold_overrides(5, None, tables={}), fold_overrides(None, "series"), fold_overrides(None, None)
    ({'folds': 5, 'tables': {}}, {'fold_unit': 'series'}, {})
    """
    out: dict[str, Any] = {"folds": folds, **dropped} if folds is not None else {}
    return {**out, "fold_unit": fold_unit} if fold_unit is not None else out


def print_folds(m: Mapping[str, Any], out: Path, system: str, extra: str = "") -> None:
    """The one-line summary of a cross-validated run (``--folds K``: ``rescore``, ``fmp``, ``fedlm``, ``anon``) and where its
    results and report are: the pooled WER of ``system`` against the baseline, MAPSSWE p, the folds' spread and
    ``extra`` (appended as given)."""
    from rich.markup import escape

    make_console().print(escape(
        f"pooled over {m['folds']} folds: {system} {100 * m['wer']:.2f}% against {100 * m['wer_baseline']:.2f}% "
        f"(relative {100 * m['wer_rel_change']:+.2f}%, MAPSSWE p = {m['mapsswe_p']:.3g}); folds "
        f"{100 * m['fold_rel_change_min']:+.2f}% to {100 * m['fold_rel_change_max']:+.2f}%, {m['folds_improved']} of "
        f"{m['folds']} improve" + extra))
    make_console().print(f"[bold]results:[/] {out / 'results.json'}  [bold]report:[/] {out / 'report.md'}")


def print_warnings(metrics: dict[str, Any]) -> None:
    """Each of a run's ``warnings`` (dev/test overlap, a tiny test set) as one ``warning:`` line on stderr."""
    from rich.text import Text

    con = make_console(stderr=True)
    for w in metrics.get("warnings") or ():
        con.print(Text.assemble(("warning: ", "bold yellow"), str(w)), highlight=False)


def _command_line() -> list[str] | None:
    """The command line when run as ``privasr`` / ``python -m privasr`` (not when called from Python)."""
    if sys.argv and Path(sys.argv[0]).name in ("privasr", "__main__.py"):
        return ["privasr", *sys.argv[1:]]
    return None


@app.command("run")
def run(
    out: Path = typer.Option(..., "--out", help="Output folder: results.json, report.md, rescored test N-best."),
    config: Path | None = typer.Option(None, "--config", help="YAML config (see privasr.experiments.rescore)."),
    overrides: list[str] = typer.Option([], "--set", help="Override a config value: --set search.method=grid "
                                                          "(dotted keys, YAML values; repeatable)."),
    nbest: Path | None = typer.Option(None, "--nbest", help="Test N-best set to rescore (data.test)."),
    dev: Path | None = typer.Option(None, "--dev", help="Dev N-best set for tuning the weights (data.dev)."),
    lm: list[str] = typer.Option([], "--lm", help="New LM as an ARPA file, PATH or NAME=PATH (repeatable)."),
    prior: str | None = typer.Option(None, "--prior", help="am, rank (rank-only lists), uniform or total."),
    mode: str | None = typer.Option(None, "--mode", help="LM combination: loglinear or linear."),
    first_pass_lm: bool | None = typer.Option(None, "--first-pass-lm/--no-first-pass-lm",
                                              help="Keep the first-pass LM score in the combination."),
    method: str | None = typer.Option(None, "--method", help="Weight search: coordinate, grid or fixed."),
    fmt: str | None = typer.Option(None, "--format", help="Reader format of the N-best files (default: detected)."),
    folds: int | None = typer.Option(None, "--folds", help="Cross-validate over meetings: pool dev and test, cut "
                                     "their meetings into K folds, tune on K-1 and rescore the K-th, rotating "
                                     "(config key folds; privasr.experiments.rescore_folds)."),
    fold_unit: str | None = FOLD_UNIT,
) -> None:
    """Rescore a test N-best set with weights tuned on dev; report WER, MAPSSWE and a bootstrap CI.

    With --folds K every meeting of dev and test is rescored once, by weights tuned without it; the report gives
    each fold, the pooled figures and their spread across folds and meetings."""
    from privasr.config import apply_overrides, parse_overrides, read_config
    from privasr.experiments.rescore import load_config, run_rescore
    from privasr.outputs import check_output_dir, output_dir

    check_output_dir(out)
    if config is None and nbest is None:
        raise ConfigError("give --config FILE or --nbest TEST (with --dev DEV and --lm ARPA)")
    raw: dict[str, Any] = read_config(config) if config is not None else {}
    if config is None:
        raw.setdefault("name", f"ad hoc: {nbest}")
    flags = flags_to_overrides(nbest, dev, lm, prior, mode, first_pass_lm, method, fmt)
    raw = apply_overrides(raw, {**flags, **parse_overrides(overrides), **fold_overrides(folds, fold_unit)})
    try:
        cfg = load_config(raw)
    except InputError as e:  # name the config file when the problem is in it
        raise (e.at(config) if config is not None else e) from None
    console = make_console(stderr=True)
    if cfg.folds is not None:
        from privasr.experiments.rescore_folds import run_rescore_folds

        with output_dir(out), console.status(f"rescoring ({cfg.name}), {cfg.folds} folds"):
            metrics = run_rescore_folds(cfg, out, argv=_command_line())
        print_folds(metrics, out, "test WER")
        return
    with output_dir(out), console.status(f"rescoring ({cfg.name})"):
        metrics = run_rescore(cfg, out, argv=_command_line())
    print_warnings(metrics)
    con = make_console()
    if metrics.get("wer") is not None:
        base = "baseline" if "baseline" in metrics else "first pass"
        con.print(f"test WER {100 * metrics['wer']:.2f}% ({base} {100 * metrics['wer_baseline']:.2f}%, "
                  f"relative {100 * metrics['wer_rel_change']:+.2f}%, MAPSSWE p = {metrics['mapsswe_p']:.3g})")
    else:
        con.print("test set without references: rescored lists written, no WER")
    con.print(f"[bold]results:[/] {out / 'results.json'}  [bold]report:[/] {out / 'report.md'}")
