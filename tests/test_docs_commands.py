"""The documentation agrees with the program: every ``privasr ...`` command in README.md and docs/*.md exists and its
``--help`` runs, and the docs' Python examples run (fragments, and examples needing the shared data or an extra
that is not installed, skip with the reason)."""

from __future__ import annotations

import ast
import builtins
import re
from pathlib import Path

import click
import pytest
import typer
from typer.testing import CliRunner

from privasr.cli import app

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```([\w-]*)\n(.*?)^```", re.S | re.M)
_INLINE = re.compile(r"`(privasr(?: [^`]*)?)`")


def _command_lines(text: str) -> list[str]:
    """``privasr ...`` command lines: in shell/plain code blocks and in inline code."""
    lines: list[str] = []
    for m in _FENCE.finditer(text):
        if m.group(1) in ("", "sh", "bash", "shell", "console", "text"):
            for line in m.group(2).splitlines():
                line = line.strip().removeprefix("$ ")
                if line.startswith("privasr ") or line == "privasr":
                    lines.append(line)
                # commands after a pipe or '&&' on the same line
                lines.extend(part.strip() for part in re.split(r"&&|;|\|\|", line)[1:]
                             if part.strip().startswith("privasr "))
    outside = _FENCE.sub("", text)
    lines.extend(m.group(1) for m in _INLINE.finditer(outside))
    return lines


def _resolve(line: str) -> tuple[str, ...] | str:
    """The command path a documented line names (``("lm", "train-ngram")``), or an error message when a word
    after ``privasr`` names no command of the group it is given to."""
    root = typer.main.get_command(app)
    tokens = line.split()[1:]
    path: list[str] = []
    cmd: click.Command = root
    for tok in tokens:
        if not isinstance(cmd, click.Group):
            break
        if tok in cmd.commands:
            path.append(tok)
            cmd = cmd.commands[tok]
            continue
        if re.fullmatch(r"[a-z][a-z0-9-]*", tok):
            return f"{' '.join(['privasr', *path, tok])!r}: no such command (from {line!r})"
        break
    return tuple(path)


def _documented() -> dict[tuple[str, ...], str]:
    out: dict[tuple[str, ...], str] = {}
    errors: list[str] = []
    for doc in DOCS:
        for line in _command_lines(doc.read_text(encoding="utf-8")):
            r = _resolve(line)
            if isinstance(r, str):
                errors.append(f"{doc.relative_to(ROOT)}: {r}")
            else:
                out.setdefault(r, f"{doc.relative_to(ROOT)}: {line}")
    if errors:
        out[("<unknown>",)] = "\n".join(errors)
    return out


DOCUMENTED = _documented()


def test_the_docs_name_many_commands():
    assert len(DOCUMENTED) >= 20 and ("rescore", "run") in DOCUMENTED and ("demo",) in DOCUMENTED


@pytest.mark.parametrize("path", sorted(DOCUMENTED), ids=lambda p: " ".join(p) or "privasr")
def test_documented_command_has_a_working_help(path):
    assert path != ("<unknown>",), "documented commands that do not exist:\n" + DOCUMENTED[path]
    r = CliRunner().invoke(app, [*path, "--help"])
    assert r.exit_code == 0, f"{DOCUMENTED[path]}\n{r.output}"
    assert "Usage:" in r.output


def test_a_missing_command_in_the_docs_is_caught():
    assert isinstance(_resolve("privasr lm no-such-thing --x"), str)
    assert _resolve("privasr lm train-ngram --text F") == ("lm", "train-ngram")
    assert _resolve("privasr bench NAME --out DIR") == ("bench",)


# ---------------------------------------------------------------------------------------------- Python examples


def _python_blocks() -> list[tuple[str, str]]:
    blocks = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for m in _FENCE.finditer(text):
            if m.group(1) == "python":
                line = text[:m.start()].count("\n") + 1
                blocks.append((f"{doc.relative_to(ROOT)}:{line}", m.group(2)))
    return blocks


def free_names(source: str) -> set[str]:
    """Names a block reads but neither defines, imports nor gets from builtins (a fragment of a longer example).

    >>> sorted(free_names("import numpy as np\\nx = np.ones(2)\\nprint(x, clients)"))
    ['clients']
    """
    tree = ast.parse(source)
    defined = set(dir(builtins))
    loaded: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (defined if isinstance(node.ctx, ast.Store | ast.Del) else loaded).add(node.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            defined.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            defined.add(node.name)
        elif isinstance(node, ast.arg):
            defined.add(node.arg)
    return loaded - defined


_NEEDS_DATA = ("an4_features", "data_dir(", "PRIVASR_DATA", "../shared")
_TRAINS = [pytest.mark.slow, pytest.mark.timeout(1800)]  # the AN4 training example: minutes on a CPU
PYTHON_BLOCKS = [pytest.param(src, id=where, marks=_TRAINS if "an4_features" in src else [])
                 for where, src in _python_blocks()]


def test_the_docs_have_python_examples():
    assert len(PYTHON_BLOCKS) >= 3


@pytest.mark.parametrize("source", PYTHON_BLOCKS)
def test_python_example_runs(source, tmp_path, monkeypatch):
    code = compile(source, "<docs example>", "exec")  # a syntax error fails, fragment or not
    missing = free_names(source)
    if missing:
        pytest.skip(f"a fragment: uses {', '.join(sorted(missing))} from the text around it")
    if any(k in source for k in _NEEDS_DATA):
        from privasr.paths import data_dir

        if data_dir() is None:
            pytest.skip("needs the shared data (../shared/data or $PRIVASR_DATA)")
    monkeypatch.chdir(tmp_path)
    try:
        exec(code, {"__name__": "__docs_example__"})
    except ModuleNotFoundError as e:
        pytest.skip(f"needs {e.name}, from an extra that is not installed")
