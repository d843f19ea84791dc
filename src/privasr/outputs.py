"""Output paths of the commands: checked before any work, and no empty folder left behind by a failed run.

A command that writes a file (``--json FILE``, ``--arpa FILE``) calls :func:`check_output_file` before it reads
its inputs; one that writes a folder (``--out DIR``) calls :func:`check_output_dir`, and runs its work inside
:func:`output_dir`, which removes the folders it created if the run fails and leaves them empty (never a file,
so a resumable run's checkpoint stays). Problems are :class:`~privasr.errors.InputError` naming the path, which
the command line prints as one ``error:`` line (exit status 2).

>>> import tempfile, pathlib
>>> root = pathlib.Path(tempfile.mkdtemp())
>>> _ = (root / "taken").write_text("x")
>>> check_output_dir(root / "taken")
Traceback (most recent call last):
...
privasr.errors.InputError: .../taken: the output folder is an existing file (expected a folder, or a path that does not exist yet)
>>> check_output_file(root / "taken" / "results.json")
Traceback (most recent call last):
...
privasr.errors.InputError: .../taken: cannot write .../taken/results.json: a parent of it is a file, not a folder (expected a path under a writable folder)
>>> try:
...     with output_dir(root / "new" / "run") as out:
...         raise ValueError("the inputs were bad")
... except ValueError:
...     pass
>>> (root / "new").exists()
False
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from privasr.errors import InputError

__all__ = ["check_output_file", "check_output_dir", "output_dir", "remove_empty_dirs"]


def _existing_ancestor(path: Path) -> Path:
    """The nearest ancestor of ``path`` (or ``path`` itself) that exists (as anything, possibly a file)."""
    p = path.absolute()
    while not p.exists() and not p.is_symlink() and p != p.parent:
        p = p.parent
    return p


def _check_parent(path: Path, what: str) -> None:
    """The folders above ``path`` exist as folders or can be made, and the nearest existing one is writable."""
    anc = _existing_ancestor(path.parent)
    if not anc.is_dir():
        raise InputError(f"cannot write {what} {path}: a parent of it is a file, not a folder", path=anc,
                         expected="a path under a writable folder")
    if not os.access(anc, os.W_OK | os.X_OK):
        raise InputError(f"cannot write {what} {path}: the folder is not writable", path=anc,
                         expected="a path under a folder you may write to")


def check_output_file(path: str | Path, *, overwrite: bool = True) -> Path:
    """Check that ``path`` can be written as a file before any work starts; create nothing.

    ``path`` must not be a folder (nor, with ``overwrite=False``, an existing file); the folders above it must
    be folders (missing ones are made when the file is written) under a writable one. Returns ``Path(path)``.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> check_output_file(d / "sub" / "r.json") == d / "sub" / "r.json", (d / "sub").exists()
    (True, False)
    >>> check_output_file(d)
    Traceback (most recent call last):
    ...
    privasr.errors.InputError: ...: the output file is an existing folder (expected a file name)
    """
    p = Path(path)
    if p.is_dir():
        raise InputError("the output file is an existing folder", path=p, expected="a file name")
    if p.exists() and not overwrite:
        raise InputError("the output file exists", path=p, expected="a new file name (or --force to overwrite)")
    if p.exists() and not os.access(p, os.W_OK):
        raise InputError("the output file is not writable", path=p, expected="a file you may write to")
    _check_parent(p, "the file")
    return p


def check_output_dir(path: str | Path) -> Path:
    """Check that ``path`` can be used as an output folder before any work starts; create nothing.

    An existing folder is fine (a resumed run continues in it); an existing file is not; a new folder must be
    under a writable folder (the missing ones above it are made by :func:`output_dir`). Returns ``Path(path)``.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> check_output_dir(d) == d, check_output_dir(d / "a" / "b") == d / "a" / "b", (d / "a").exists()
    (True, True, False)
    """
    p = Path(path)
    if p.exists() or p.is_symlink():
        if not p.is_dir():
            raise InputError("the output folder is an existing file", path=p,
                             expected="a folder, or a path that does not exist yet")
        if not os.access(p, os.W_OK | os.X_OK):
            raise InputError("the output folder is not writable", path=p, expected="a folder you may write to")
        return p
    _check_parent(p, "the folder")
    return p


def remove_empty_dirs(top: str | Path) -> None:
    """Remove ``top`` and the folders under it, bottom up, where they are empty; files are never touched.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp()) / "run"
    >>> (d / "a" / "b").mkdir(parents=True); (d / "keep").mkdir(); _ = (d / "keep" / "ckpt").write_text("1")
    >>> remove_empty_dirs(d)
    >>> sorted(str(q.relative_to(d)) for q in d.rglob("*"))
    ['keep', 'keep/ckpt']
    """
    t = Path(top)
    if not t.is_dir() or t.is_symlink():
        return
    for dirpath, _dirnames, _files in os.walk(t, topdown=False):
        with contextlib.suppress(OSError):  # not empty, or gone already
            os.rmdir(dirpath)


@contextlib.contextmanager
def output_dir(path: str | Path) -> Iterator[Path]:
    """Check ``path`` (:func:`check_output_dir`), yield it, and if the block raises, remove the folders it created
    that are still empty (those that existed before are left as they were, and so is every file).

    The block (the run) makes the folder when it first writes into it; nothing is created here.
    """
    p = check_output_dir(path)
    created_top: Path | None = None
    if not p.exists():
        created_top = p.absolute()
        while not created_top.parent.exists() and created_top.parent != created_top:
            created_top = created_top.parent
    try:
        yield p
    except BaseException:
        if created_top is not None:
            remove_empty_dirs(created_top)
        raise
