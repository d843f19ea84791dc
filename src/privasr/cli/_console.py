"""The consoles the command line prints with: rich, never wrapping a path or a command.

rich wraps text at the terminal's width, and at 80 columns when the output is a pipe or a file, so a printed path
could come out as ``report: `` on one line and the path on the next. Here long lines stay whole (soft wrap: a
terminal folds them only on screen, a pipe gets them as they are), and when the stream is not a terminal, tables
get 200 columns instead of 80, so that each row stays one line.

>>> c = make_console()
>>> c.soft_wrap
True
"""

from __future__ import annotations

import sys

from rich.console import Console

__all__ = ["make_console", "PIPE_WIDTH"]

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
