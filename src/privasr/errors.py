"""Errors raised by privasr.

Every problem with data a user gave us is an :class:`InputError` that names the file, the line (or item)
and what was expected, so the command line can print one clear message instead of a traceback.

>>> err = InputError("score is not a number", path="dev.jsonl", line=3, expected="a finite float")
>>> str(err)
'dev.jsonl:3: score is not a number (expected a finite float)'
>>> err.line
3
"""

from __future__ import annotations

from os import PathLike

__all__ = ["PrivasrError", "InputError", "ConfigError", "PrivacyWarning", "InputWarning"]


class PrivasrError(Exception):
    """Base class of every error privasr raises on purpose."""


class InputError(PrivasrError, ValueError):
    """Malformed or inconsistent input data.

    Args:
        message: what is wrong, in words.
        path: the file (or folder) the problem is in, if any.
        line: 1-based line number (or item number for whole-file JSON), if known.
        expected: what would have been valid, if it helps the user.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | PathLike[str] | None = None,
        line: int | None = None,
        expected: str | None = None,
    ) -> None:
        self.message = message
        self.path = None if path is None else str(path)
        self.line = line
        self.expected = expected
        super().__init__(str(self))

    def __str__(self) -> str:
        where = ""
        if self.path is not None:
            where = self.path if self.line is None else f"{self.path}:{self.line}"
        elif self.line is not None:
            where = f"line {self.line}"
        text = f"{where}: {self.message}" if where else self.message
        if self.expected:
            text += f" (expected {self.expected})"
        return text

    def at(self, path: str | PathLike[str] | None = None, line: int | None = None) -> InputError:
        """Return a copy of this error located at ``path``/``line`` (keeping any location already set).

        >>> InputError("bad").at("a.txt", 2).__str__()
        'a.txt:2: bad'
        """
        return InputError(
            self.message,
            path=self.path if self.path is not None else path,
            line=self.line if self.line is not None else line,
            expected=self.expected,
        )


class ConfigError(InputError):
    """An invalid experiment configuration (unknown key, wrong type, value out of range)."""


class PrivacyWarning(UserWarning):
    """A setting that weakens a privacy guarantee without voiding the run (e.g. a noise multiplier of 0: clipping
    only, epsilon infinite); settings that void it are a :class:`ConfigError`."""


class InputWarning(UserWarning):
    """Input that privasr reads the way a standard tool's option would, not as written (e.g. ``<s>`` in training
    text read as whitespace under ``--skip-symbols``, as lmplz does); the command line prints it as one line."""
