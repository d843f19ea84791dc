"""What every plot module shares: matplotlib on the Agg backend (or :class:`PlotsUnavailable`), a drawn plot
(:class:`Plot`), the runs a plot overlays, and the conversion of results.json values to numbers.

>>> number("inf"), number(None), number(0.5), number("x")
(inf, None, 0.5, None)
>>> series_label("seed1", "baseline"), series_label("", "baseline"), series_label("seed1", "")
('seed1: baseline', 'baseline', 'seed1')
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from privasr.errors import PrivasrError

__all__ = ["EXTRA_HINT", "Plot", "PlotsUnavailable", "Run", "number", "pyplot", "series_label"]

EXTRA_HINT = "pip install 'privasr[plots]' (or make setup, whose extras include plots)"

Run = tuple[str, Mapping[str, Any]]
"""A run to draw: its label in legends ("" for a single run) and its results.json as a dict."""


class PlotsUnavailable(PrivasrError):
    """matplotlib is not installed: the ``plots`` extra is missing."""

    def __init__(self) -> None:
        super().__init__(f"plots need matplotlib, from the privasr 'plots' extra: {EXTRA_HINT}")


@dataclass
class Plot:
    """A drawn figure: ``name`` is its file stem (``rounds`` -> ``rounds.png``), ``title`` its caption, also drawn
    as the figure's title when the plot gave it none."""

    name: str
    title: str
    figure: Any

    def __post_init__(self) -> None:
        if self.figure is not None and getattr(self.figure, "_suptitle", None) is None:
            self.figure.suptitle(self.title)

    def save(self, folder: str | Path) -> Path:
        """Write ``folder/<name>.png`` (100 dpi), close the figure and return the path."""
        import matplotlib.pyplot as plt

        path = Path(folder) / f"{self.name}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        self.figure.savefig(path, dpi=100, bbox_inches="tight")
        plt.close(self.figure)
        return path


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the non-interactive Agg backend; :class:`PlotsUnavailable` without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        raise PlotsUnavailable() from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    plt.style.use("tableau-colorblind10")  # colour-blind-safe colours for C0, C1, ... (matplotlib's own style)
    return plt


def number(v: Any) -> float | None:
    """A results.json value as a float: numbers as they are, ``"inf"``/``"-inf"`` (how results.json writes
    infinities) as infinities, anything else (``None``, text, booleans) as ``None``."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int | float):
        return float(v)
    if v in ("inf", "-inf"):
        return math.inf if v == "inf" else -math.inf
    return None


def series_label(run: str, series: str) -> str:
    """The legend label of one series of one run: both parts, whichever is not empty."""
    return ": ".join(p for p in (run, series) if p)


def figure(n_axes: int = 1, *, width: float = 6.0, height: float = 4.0) -> tuple[Any, list[Any]]:
    """A figure with ``n_axes`` side by side (at most 3 a row) and its axes as a flat list."""
    plt = pyplot()
    cols = min(n_axes, 3)
    rows = math.ceil(n_axes / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False,
                             layout="constrained")
    flat = [a for row in axes for a in row]
    for extra in flat[n_axes:]:
        extra.set_visible(False)
    return fig, flat[:n_axes]


def legend(ax: Any) -> None:
    """A legend when the axes hold labelled series."""
    handles, labels = ax.get_legend_handles_labels()
    if labels:
        ax.legend(fontsize="small")


def rows_of(value: Any) -> list[Mapping[str, Any]]:
    """The mappings of a list (a table's rows); ``[]`` for anything else."""
    return [r for r in value if isinstance(r, Mapping)] if isinstance(value, Sequence) and not isinstance(
        value, str) else []
