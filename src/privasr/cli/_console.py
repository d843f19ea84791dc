"""The consoles the command line prints with: rich, never wrapping a path or a command.

rich wraps text at the terminal's width, and at 80 columns when the output is a pipe or a file, so a printed path
could come out as ``report: `` on one line and the path on the next. Here long lines stay whole (soft wrap: a
terminal folds them only on screen, a pipe gets them as they are), and when the stream is not a terminal, tables
get 200 columns instead of 80, so that each row stays one line.

:func:`print_table` prints a table as a box on a terminal and, into a pipe or a file, as plain lines of one fact
each (``row column: value``), which ``grep`` and ``cut`` read without parsing boxes.

>>> c = make_console()
>>> c.soft_wrap
True
>>> from rich.table import Table
>>> t = Table(title="WER of hyp.trn")
>>> for col in ("measure", "count", "% of ref words"):
...     t.add_column(col)
>>> t.add_row("substitutions", "12", "3.00%")
>>> t.add_row("sentences", "40", "")
>>> plain_lines(t)
['WER of hyp.trn', 'substitutions count: 12', 'substitutions % of ref words: 3.00%', 'sentences count: 40']
"""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console
from rich.text import Text

__all__ = ["make_console", "print_table", "plain_lines", "PIPE_WIDTH"]

PIPE_WIDTH = 200
"""Columns of a console whose stream is not a terminal (rich's default there is 80)."""


def make_console(*, stderr: bool = False) -> Console:
    """A rich console on stdout (or stderr) that never wraps a printed line; :data:`PIPE_WIDTH` columns when the
    stream is not a terminal."""
    stream = sys.stderr if stderr else sys.stdout
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):  # a closed or unusual stream
        tty = False
    return Console(stderr=stderr, soft_wrap=True, width=None if tty else PIPE_WIDTH)


def _plain(cell: Any) -> str:
    if isinstance(cell, str):
        return Text.from_markup(cell).plain
    return cell.plain if isinstance(cell, Text) else str(cell)


def plain_lines(table: Any) -> list[str]:
    """A rich table as lines of one fact each: its title, then ``label: value`` for a two-column table and
    ``label column: value`` for a wider one (the first column labels the row); empty cells are left out."""
    cols = [list(c.cells) for c in table.columns]
    headers = [c.header for c in table.columns]
    lines = [_plain(table.title)] if table.title else []
    for i in range(table.row_count):
        label = _plain(cols[0][i]) if cols else ""
        for header, cells in zip(headers[1:], cols[1:], strict=True):
            value = _plain(cells[i]) if i < len(cells) else ""
            if not value.strip():
                continue
            lines.append(f"{label}: {value}" if len(cols) == 2 else f"{label} {_plain(header)}: {value}")
    return lines


def print_table(console: Console, table: Any) -> None:
    """Print ``table`` as a box on a terminal, else as :func:`plain_lines` (one fact per line)."""
    if console.is_terminal:
        console.print(table)
        return
    for line in plain_lines(table):
        console.print(line, markup=False, highlight=False)
