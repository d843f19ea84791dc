"""Plots of finished runs, drawn from their ``results.json`` alone (matplotlib, Agg backend; the ``plots``
extra).

Every runner calls :func:`plots_section` after writing results.json: it draws the run's plots into
``OUT/plots/`` and returns the Markdown that links them from report.md, or, without matplotlib, one warning line
saying how to install it (and logs that warning once). ``privasr report RUN_DIR...`` calls :func:`draw` on one
or several runs, overlaid (seeds, systems). Each kind of plot is drawn from whatever part of results.json holds
its numbers, so one function serves every runner that writes that part:

* :func:`~privasr.plots.curves.round_curves`: the round ``history`` (FedLM, FMP);
* :func:`~privasr.plots.curves.ftl_convergence`: FTL's ``runs`` (loss per round against FedAvg, test WER);
* :func:`~privasr.plots.sweeps.table_sweeps`: ``tables`` (WER against T, sigma, epsilon, noise, ...);
* :func:`~privasr.plots.sweeps.stability_curves`: ``metrics.cells`` of ``privasr fedlm stability`` (non-finite
  client models and training loss against the client learning rate);
* :func:`~privasr.plots.reliability.reliability_diagram`: ``reliability`` (the confidence model);
* :func:`~privasr.plots.systems.system_wers`, :func:`~privasr.plots.systems.client_spread`,
  :func:`~privasr.plots.systems.seed_pairs`, :func:`~privasr.plots.systems.fold_spread`: WER by system, over
  clients, over seeds, over cross-validation folds;
* :func:`~privasr.plots.audit.roc_curves`, :func:`~privasr.plots.audit.exposure_curves`,
  :func:`~privasr.plots.audit.epsilon_bounds`: the privacy audit's ``sections``;
* :func:`~privasr.plots.audit.name_survival`: planted names surviving anonymisation per shape (``privasr anon
  eval-names``).

>>> import json, pathlib, tempfile
>>> out = pathlib.Path(tempfile.mkdtemp())
>>> res = {"metrics": {"wer_baseline": 0.2}, "tables": {"rounds": [{"T": 1, "wer": 0.19}, {"T": 2, "wer": 0.18}]}}
>>> _ = (out / "results.json").write_text(json.dumps(res))
>>> print(plots_section(out))
<BLANKLINE>
## Plots
<BLANKLINE>
FMP: WER against the number of rounds T (`plots/table_rounds.png`):
<BLANKLINE>
![FMP: WER against the number of rounds T](plots/table_rounds.png)
<BLANKLINE>
>>> (out / "plots" / "table_rounds.png").read_bytes()[:4]
b'\\x89PNG'
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from privasr.errors import InputError
from privasr.plots._figure import EXTRA_HINT, Plot, PlotsUnavailable, Run, pyplot
from privasr.plots.audit import epsilon_bounds, exposure_curves, name_survival, roc_curves
from privasr.plots.curves import ftl_convergence, round_curves
from privasr.plots.reliability import reliability_diagram
from privasr.plots.sweeps import stability_curves, table_sweeps
from privasr.plots.systems import client_spread, fold_spread, seed_pairs, system_wers

__all__ = ["KINDS", "Plot", "PlotsUnavailable", "Run", "draw", "markdown", "plots_section", "read_results"]

log = logging.getLogger("privasr.plots")

KINDS: tuple[Callable[[Sequence[Run]], list[Plot]], ...] = (
    system_wers, client_spread, seed_pairs, fold_spread, round_curves, ftl_convergence, table_sweeps, reliability_diagram,
    roc_curves, exposure_curves, epsilon_bounds, name_survival, stability_curves)
"""Every kind of plot, in the order a report shows them."""

_warned = False


def read_results(run: str | Path) -> dict[str, Any]:
    """The results.json of ``run`` (a run's folder or the file itself) as a dict; an :class:`InputError`
    naming the file when it is missing or not a JSON object.

    >>> read_results("/nonexistent/run")
    Traceback (most recent call last):
    ...
    privasr.errors.InputError: /nonexistent/run/results.json: no such file (expected the results.json of a finished privasr run)
    """
    p = Path(run)
    path = p / "results.json" if p.is_dir() or p.suffix != ".json" else p
    expected = "the results.json of a finished privasr run"
    try:
        res = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError("no such file", path=path, expected=expected) from None
    except json.JSONDecodeError as e:
        raise InputError(f"not JSON ({e.msg})", path=path, line=e.lineno, expected=expected) from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read it ({e})", path=path, expected=expected) from None
    if not isinstance(res, dict):
        raise InputError(f"a JSON {type(res).__name__}, not an object", path=path, expected=expected)
    return res


def draw(runs: Sequence[Run], folder: str | Path) -> list[tuple[Plot, Path]]:
    """Draw every kind of plot the runs hold the numbers for into ``folder`` (``<name>.png``), the runs
    overlaid; return each plot with its file. Raises :class:`PlotsUnavailable` without matplotlib."""
    pyplot()
    out = []
    for kind in KINDS:
        for plot in kind(runs):
            out.append((plot, plot.save(folder)))
    return out


def markdown(drawn: Sequence[tuple[Plot, Path]], relative_to: str | Path) -> str:
    """The Markdown of a ``## Plots`` section linking the drawn plots (paths relative to ``relative_to``,
    the folder of the report); ``""`` when nothing was drawn."""
    if not drawn:
        return ""
    lines = ["", "## Plots", ""]
    for plot, path in drawn:
        rel = Path(path).resolve().relative_to(Path(relative_to).resolve()).as_posix()
        lines += [f"{plot.title} (`{rel}`):", "", f"![{plot.title}]({rel})", ""]
    return "\n".join(lines)


def plots_section(out: str | Path) -> str:
    """Draw the plots of the run in ``out`` (from ``out/results.json``) into ``out/plots/`` and return the
    Markdown to append to ``out/report.md``: a ``## Plots`` section, ``""`` when the run has nothing to draw,
    or, without matplotlib, a warning line naming the extra (also logged, once per process)."""
    global _warned
    out = Path(out)
    try:
        drawn = draw([("", read_results(out))], out / "plots")
    except PlotsUnavailable:
        msg = f"plots were skipped: matplotlib is not installed; {EXTRA_HINT}, then `privasr report {out}`"
        if not _warned:
            log.warning(msg)
            _warned = True
        return f"\n> Warning: {msg}.\n"
    return markdown(drawn, out)
