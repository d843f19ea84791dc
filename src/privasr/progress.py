"""Progress bars for long work (rich, on stderr), and the one switch that silences them.

The library reports progress through this module only: :func:`track` wraps an iterable, :func:`task` opens a
bar that the caller advances, :func:`note` prints one line of news (e.g. "resuming from round 3"). All of it
goes to stderr, so stdout stays clean for results.

Nothing is shown when

* ``privasr --quiet`` (:func:`set_quiet`) or ``PRIVASR_QUIET=1`` asks for silence (bars and notes), or
* stderr is not a terminal (bars only: a note is one line and is still printed, a log file gets no bar).

When silent, :func:`track` returns its iterable unchanged and :func:`task` hands out a task whose methods do
nothing, so the cost is one function call.

Bars nest: a :func:`task` opened while another is running (the clients of a round inside the run's rounds) is
drawn under it in the same display and removed when it ends; the outermost bars stay on screen as the record
of what ran (unless opened with ``transient=True``).

>>> set_quiet(True)
>>> sum(track(range(4), "counting"))
6
>>> with task("rounds", total=2) as t:
...     t.advance()
...     t.update(info="loss 1.2")
>>> note("resuming from round 3")  # quiet: prints nothing
>>> set_quiet(None)
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

__all__ = ["set_quiet", "is_quiet", "bars_enabled", "track", "task", "note", "Task", "QUIET_ENV"]

T = TypeVar("T")

QUIET_ENV = "PRIVASR_QUIET"

_quiet: bool | None = None  # None: decided by the environment
_lock = threading.RLock()
_progress: Any = None  # the running rich Progress (one display, shared by nested tasks)
_depth = 0


def set_quiet(quiet: bool | None) -> None:
    """Silence (``True``) or allow (``False``) progress and notes; ``None`` leaves it to ``PRIVASR_QUIET``.

    >>> set_quiet(True); is_quiet()
    True
    >>> set_quiet(None)
    """
    global _quiet
    _quiet = quiet


def is_quiet() -> bool:
    """Whether ``--quiet`` (:func:`set_quiet`) or ``PRIVASR_QUIET`` (``1``, ``true``, ``yes``) asked for silence.

    >>> import os
    >>> os.environ[QUIET_ENV] = "1"; is_quiet()
    True
    >>> del os.environ[QUIET_ENV]
    """
    if _quiet is not None:
        return _quiet
    return os.environ.get(QUIET_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def _make_console() -> Any:
    """The console bars and notes are written to: stderr as it is now (tests replace this function)."""
    from rich.console import Console

    return Console(stderr=True)


def bars_enabled() -> bool:
    """Whether bars are drawn: not quiet, and stderr is a terminal.

    >>> set_quiet(True); bars_enabled()
    False
    >>> set_quiet(None)
    """
    if is_quiet():
        return False
    with _lock:
        if _progress is not None:
            return True
    return bool(_make_console().is_terminal)


class Task:
    """A running bar: :meth:`advance` it, or :meth:`update` its count, total, description or info text.

    A disabled task (quiet, or stderr is not a terminal) does nothing.
    """

    __slots__ = ("_id",)

    def __init__(self, task_id: Any = None) -> None:
        self._id = task_id

    def advance(self, n: float = 1) -> None:
        """Count ``n`` more steps done."""
        if self._id is not None and _progress is not None:
            _progress.advance(self._id, n)

    def update(self, *, completed: float | None = None, total: float | None = None,
               description: str | None = None, info: str | None = None) -> None:
        """Set the count done, the total, the description or the info text shown after the bar."""
        if self._id is None or _progress is None:
            return
        fields: dict[str, Any] = {}
        if info is not None:
            fields["info"] = info
        _progress.update(self._id, completed=completed, total=total, description=description, **fields)


_NULL = Task()


def _new_progress() -> Any:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                    console=_make_console(), transient=False)


@contextmanager
def task(description: str, total: float | None = None, *, completed: float = 0,
         transient: bool = False) -> Iterator[Task]:
    """A bar for the work inside the ``with`` block (``total=None``: an unknown amount).

    Args:
        description: what is being done ("fedlm rounds", "reading train.txt").
        total: the number of steps, or ``None``.
        completed: steps already done (a resumed run).
        transient: remove the bar when the block ends even if it is the outermost (nested bars always are).

    >>> set_quiet(True)
    >>> with task("epochs", total=3, completed=1) as t:
    ...     t.update(completed=2)
    >>> set_quiet(None)
    """
    global _progress, _depth
    if not bars_enabled():
        yield _NULL
        return
    with _lock:
        if _progress is None:
            _progress = _new_progress()
            _progress.start()
        _depth += 1
        nested = _depth > 1
        task_id = _progress.add_task(description, total=total, completed=completed, info="")
    try:
        yield Task(task_id)
    finally:
        with _lock:
            if nested or transient:
                _progress.remove_task(task_id)
            _depth -= 1
            if _depth == 0:
                _progress.stop()
                _progress = None


def track(iterable: Iterable[T], description: str, total: float | None = None) -> Iterator[T] | Iterable[T]:
    """``iterable``, advancing a bar by one per item (``total`` defaults to ``len(iterable)`` when it has one).

    When bars are off this returns ``iterable`` itself.

    >>> set_quiet(True)
    >>> list(track(["a", "b"], "letters"))
    ['a', 'b']
    >>> set_quiet(None)
    """
    if not bars_enabled():
        return iterable
    if total is None and hasattr(iterable, "__len__"):
        total = len(iterable)  # type: ignore[arg-type]
    return _tracked(iterable, description, total)


def _tracked(iterable: Iterable[T], description: str, total: float | None) -> Iterator[T]:
    with task(description, total) as t:
        for item in iterable:
            yield item
            t.advance()


def note(message: str) -> None:
    """Print one line of news to stderr (above any running bars), unless quiet.

    >>> set_quiet(True); note("resuming from round 2 (checkpoint runs/x)")
    >>> set_quiet(None)
    """
    if is_quiet():
        return
    with _lock:
        console = _progress.console if _progress is not None else _make_console()
    console.print(message, highlight=False, markup=False, soft_wrap=True)
