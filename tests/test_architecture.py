"""The import rules of the layers (docs/architecture.md), checked on the source files with ``ast``.

* The library (everything outside ``privasr.experiments``, ``privasr.cli`` and ``privasr.bench``) never imports
  the runners (``experiments``, ``bench``) or the command line (``cli``, and ``privasr.__main__``, which runs it).
* ``privasr.experiments`` and ``privasr.bench`` never import ``privasr.cli``.
* No import cycles: neither between modules nor between the top-level subpackages (``privasr.corpus``,
  ``privasr.metrics``, ...).
* The library's packages keep the levels of the picture in docs/architecture.md (:data:`LEVELS`): each imports
  only packages of lower levels.

Every ``import`` / ``from ... import`` of a privasr module counts, also inside functions and under
``TYPE_CHECKING``; relative imports are resolved; ``from privasr.x import y`` imports ``privasr.x.y`` when that
is a module, else ``privasr.x``. Importing ``privasr.x.y`` is not counted as importing ``privasr.x`` (its
``__init__``), so a package may import its own submodules.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
RUNNERS = ("privasr.experiments", "privasr.bench")
CLI = ("privasr.cli", "privasr.__main__")
# the library's levels, as drawn in docs/architecture.md ("Layers: what may import what")
LEVELS = {
    "privasr.errors": 0, "privasr.paths": 0, "privasr.progress": 0,
    "privasr.text": 1, "privasr.privacy": 1, "privasr.config": 1, "privasr.results": 1, "privasr.plots": 1,
    "privasr.outputs": 1,
    "privasr.corpus": 2,
    "privasr.metrics": 3,
    "privasr.anon": 4, "privasr.synth": 4,
    "privasr.lm": 5,
    "privasr.rescore": 6, "privasr.asr": 6, "privasr.confidence": 6,
    "privasr.federated": 7,
    "privasr.device": 8,
}


def module_files(src: Path = SRC, package: str = "privasr") -> dict[str, tuple[Path, bool]]:
    """``{module name: (file, is a package)}`` of every ``.py`` file under ``src/package``, and of every C
    extension's source (``.c``, a module named as the file, which imports nothing of the package)."""
    out: dict[str, tuple[Path, bool]] = {}
    for path in sorted([*(src / package).rglob("*.py"), *(src / package).rglob("*.c")]):
        parts = list(path.relative_to(src).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        out[".".join(parts)] = (path, is_package)
    return out


def _known(name: str, modules: Mapping[str, object]) -> str | None:
    """``name`` or its longest prefix that is a module (``privasr.x.f``, a function ``f``: ``privasr.x``)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(tree: ast.AST, module: str, is_package: bool, modules: Mapping[str, object],
               root: str = "privasr") -> set[str]:
    """The modules of ``root`` that ``tree`` (the source of ``module``) imports, anywhere in the file."""
    here = module if is_package else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")
                base = base[:len(base) - (node.level - 1)]
                full = ".".join([*base, node.module] if node.module else base)
            else:
                full = node.module or ""
            targets = [f"{full}.{a.name}" if f"{full}.{a.name}" in modules else full for a in node.names]
        else:
            continue
        for t in targets:
            if t == root or t.startswith(root + "."):
                found = _known(t, modules)
                if found is not None and found != module:
                    out.add(found)
    return out


def import_graph(src: Path = SRC, package: str = "privasr") -> dict[str, set[str]]:
    """``{module: the privasr modules it imports}`` for every module of ``src/package``."""
    modules = module_files(src, package)
    return {name: imports_of(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)), name, is_pkg,
                             modules, package) if path.suffix == ".py" else set()
            for name, (path, is_pkg) in modules.items()}


def subpackage(module: str) -> str:
    """The top-level subpackage (or module) of ``module``: ``privasr.lm.ngram.arpa`` -> ``privasr.lm``."""
    return ".".join(module.split(".")[:2])


def collapse(graph: Mapping[str, Iterable[str]]) -> dict[str, set[str]]:
    """The graph between top-level subpackages (edges inside one subpackage dropped)."""
    out: dict[str, set[str]] = {}
    for a, targets in graph.items():
        out.setdefault(subpackage(a), set())
        for b in targets:
            if subpackage(a) != subpackage(b):
                out[subpackage(a)].add(subpackage(b))
    return out


def find_cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """One cycle (``[a, b, ..., a]``) per knot (strongly connected component of more than one node, or a node
    that imports itself): a shortest one through the knot's first node (sorted by name)."""
    succ = _successors(graph)
    return [_shortest_cycle(comp, succ) for comp in knots(graph)]


def _successors(graph: Mapping[str, Iterable[str]]) -> dict[str, list[str]]:
    nodes = sorted(set(graph) | {b for bs in graph.values() for b in bs})
    return {n: sorted(graph.get(n, ())) for n in nodes}


def knots(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components that hold a cycle, each sorted (Tarjan's algorithm, iterative)."""
    succ = _successors(graph)
    nodes = list(succ)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    for start in nodes:
        if start in index:
            continue
        work = [(start, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = len(index)
                stack.append(v)
                on_stack.add(v)
            if i < len(succ[v]):
                work.append((v, i + 1))
                w = succ[v][i]
                if w not in index:
                    work.append((w, 0))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1 or v in succ[v]:
                    components.append(sorted(comp))
    return sorted(components)


def _shortest_cycle(comp: list[str], succ: Mapping[str, list[str]]) -> list[str]:
    members = set(comp)
    first = comp[0]
    parent: dict[str, str] = {}
    frontier = [first]
    while frontier:
        nxt = []
        for v in frontier:
            for w in succ[v]:
                if w == first:
                    path = [v]
                    while path[-1] != first:
                        path.append(parent[path[-1]])
                    return [first, *reversed(path[:-1]), first] if len(path) > 1 else [first, first]
                if w in members and w not in parent:
                    parent[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no cycle through {first}")  # pragma: no cover - a component always has one


def describe_cycles(graph: Mapping[str, Iterable[str]]) -> str:
    """One line per knot: a cycle, and the knot's other members if there are more."""
    succ = _successors(graph)
    lines = []
    for comp in knots(graph):
        cycle = _shortest_cycle(comp, succ)
        rest = [m for m in comp if m not in cycle]
        lines.append(" -> ".join(cycle) + (f"  (in one knot with {', '.join(rest)})" if rest else ""))
    return "\n".join(lines)


def _in(module: str, packages: Iterable[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph()


def test_the_graph_sees_imports_of_every_kind(graph: dict[str, set[str]]) -> None:
    assert "privasr.errors" in graph["privasr.corpus.records"]  # at module level
    assert "privasr.privacy.dp.accounting" in graph["privasr.federated.loop"]  # inside a function
    assert "privasr.metrics.align" in graph["privasr.metrics"]  # a package's own submodule
    assert len(graph) > 100 and sum(map(len, graph.values())) > 300


def test_the_library_never_imports_runners_or_the_cli(graph: dict[str, set[str]]) -> None:
    upward = [f"{a} -> {b}" for a, bs in sorted(graph.items()) if not _in(a, (*RUNNERS, *CLI))
              for b in sorted(bs) if _in(b, (*RUNNERS, *CLI))]
    if upward:
        pytest.fail("library modules import runners or the CLI:\n" + "\n".join(upward), pytrace=False)


def test_runners_never_import_the_cli(graph: dict[str, set[str]]) -> None:
    upward = [f"{a} -> {b}" for a, bs in sorted(graph.items()) if _in(a, RUNNERS)
              for b in sorted(bs) if _in(b, CLI)]
    if upward:
        pytest.fail("runners import the CLI:\n" + "\n".join(upward), pytrace=False)


def test_no_import_cycles_between_modules(graph: dict[str, set[str]]) -> None:
    if find_cycles(graph):
        pytest.fail("import cycles between modules:\n" + describe_cycles(graph), pytrace=False)


def test_no_import_cycles_between_subpackages(graph: dict[str, set[str]]) -> None:
    packages = collapse(graph)
    if find_cycles(packages):
        pytest.fail("import cycles between top-level subpackages:\n" + describe_cycles(packages), pytrace=False)


def test_library_packages_keep_their_documented_levels(graph: dict[str, set[str]]) -> None:
    packages = collapse(graph)
    library = sorted(p for p in packages if p not in ("privasr", *RUNNERS, *CLI))
    missing = [p for p in library if p not in LEVELS]
    assert not missing, f"library packages without a level in LEVELS and docs/architecture.md: {missing}"
    bad = [f"{a} (level {LEVELS[a]}) -> {b} (level {LEVELS[b]})" for a in library for b in sorted(packages[a])
           if b in LEVELS and b != a and LEVELS[b] >= LEVELS[a]]
    assert not bad, "imports against the documented levels:\n" + "\n".join(bad)


# ------------------------------------------------------------------------------------- the checker itself


def _write(root: Path, files: Mapping[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")


def test_the_checker_parses_relative_function_level_and_submodule_imports(tmp_path: Path) -> None:
    _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a/__init__.py": "from pkg.a import x\n",
        "pkg/a/x.py": "def f():\n    from ..b import y\n",
        "pkg/a/z.py": "from . import x\nfrom .x import f\nimport pkg.b.y as yy\n",
        "pkg/b/__init__.py": "from pkg.b.y import g as _g\n",
        "pkg/b/y.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import thing\n"
                      "import os\n",
    })
    g = import_graph(tmp_path, "pkg")
    assert g["pkg.a"] == {"pkg.a.x"}
    assert g["pkg.a.x"] == {"pkg.b.y"}
    assert g["pkg.a.z"] == {"pkg.a.x", "pkg.b.y"}
    assert g["pkg.b"] == {"pkg.b.y"}
    assert g["pkg.b.y"] == {"pkg.a"}  # a name of the package's __init__, under TYPE_CHECKING too
    assert find_cycles(g) == [["pkg.a", "pkg.a.x", "pkg.b.y", "pkg.a"]]
    assert collapse(g) == {"pkg": set(), "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.a"}}
    assert find_cycles(collapse(g)) == [["pkg.a", "pkg.b", "pkg.a"]]


def test_the_checker_finds_planted_cycles_and_passes_acyclic_graphs() -> None:
    acyclic = {"p.a.x": {"p.b.y", "p.c"}, "p.b.y": {"p.c"}, "p.c": set(), "p.a.w": {"p.a.x"}}
    assert find_cycles(acyclic) == [] and find_cycles(collapse(acyclic)) == []
    planted = {**acyclic, "p.c": {"p.a.w"}}
    assert find_cycles(planted) == [["p.a.w", "p.a.x", "p.c", "p.a.w"]]
    assert find_cycles(collapse(planted)) == [["p.a", "p.c", "p.a"]]
    assert find_cycles({"p.a": {"p.a"}}) == [["p.a", "p.a"]]
    # two cycles between subpackages only (every module graph edge goes to another module)
    split = {"p.a.one": {"p.b.one"}, "p.b.two": {"p.a.two"}, "p.c.x": {"p.d.x"}, "p.d.y": {"p.c.y"}}
    assert find_cycles(split) == []
    assert describe_cycles(collapse(split)) == "p.a -> p.b -> p.a\np.c -> p.d -> p.c"
    assert describe_cycles(planted) == "p.a.w -> p.a.x -> p.c -> p.a.w  (in one knot with p.b.y)"
