"""Markdown pieces the runners' report.md files share: a results table whose rows carry a paired-bootstrap
interval against the baseline (``ci_low``, ``ci_high``) shows it as one labelled column in WER points.

>>> print(markdown_table("rounds", [{"T": 1, "wer": 0.19, "ci_low": -0.021, "ci_high": 0.001}],
...                      lambda k, v: f"{100 * v:.2f}%" if k == "wer" else str(v)))
## rounds
<BLANKLINE>
| T | wer | 95% CI, system minus baseline (WER points) |
|---|---|---|
| 1 | 19.00% | [-2.10, +0.10] |
<BLANKLINE>
<BLANKLINE>
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["markdown_table", "CI_COLUMN"]

CI_COLUMN = "95% CI, system minus baseline (WER points)"


def markdown_table(name: str, rows: Sequence[Mapping[str, Any]], cell: Callable[[str, Any], str],
                   *, skip: Sequence[str] = ()) -> str:
    """``## name`` and a Markdown table of ``rows`` (the first row's keys, minus ``skip``), each value written by
    ``cell(key, value)``; ``ci_low`` and ``ci_high`` become one interval column. Empty for no rows."""
    if not rows:
        return ""
    keys = [k for k in rows[0] if k not in skip and k not in ("ci_low", "ci_high")]
    ci = "ci_low" in rows[0] and "ci_high" in rows[0]
    head = [*keys, CI_COLUMN] if ci else keys
    lines = [f"## {name}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [cell(k, r.get(k)) for k in keys]
        if ci:
            lo, hi = r.get("ci_low"), r.get("ci_high")
            cells.append("" if lo is None or hi is None else f"[{100 * lo:+.2f}, {100 * hi:+.2f}]")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n\n"
