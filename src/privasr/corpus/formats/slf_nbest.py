"""N-best lists from HTK SLF word lattices (format ``htk-lattice``): the N best distinct word strings.

A lattice (read by :func:`~privasr.corpus.formats.htk_lattice.parse_htk_lattice`) holds many paths; a path's
score is

    total = acscale * a + lmscale * l + wdpenalty * (number of words)

summed over its links, with ``a`` and ``l`` the links' acoustic and LM log-probabilities (natural log; a
link without ``l=`` adds 0) and the scale factors taken from the lattice header (``acscale=``, ``lmscale=``,
``wdpenalty=``, as HTK's ``HVite``/``HDecode`` write them), or given by the caller; a factor neither gives
defaults to HTK's own defaults, ``acscale`` 1, ``lmscale`` 1, ``wdpenalty`` 0. The pronunciation scores
``p=`` (``prscale``) are not used. Words are counted and spelt without the fillers of
:func:`~privasr.corpus.formats.htk_lattice.is_filler` (``!NULL``, ``<s>``, ``</s>``, ``<sil>``, ``[NOISE]``...),
so paths that differ only in fillers or in word times spell the same hypothesis: the N-best list holds the N
best **distinct** word strings, each with the score of its best path (duplicates merged, the best kept).

The search is exact: an A* search over word-string prefixes whose states are the sets of lattice nodes a
prefix can reach (a lazy determinisation of the lattice over its non-filler words), guided by the exact best
completion score of every node (one backward pass), so the strings come out in score order and the search
stops after the N-th (Mohri & Riley 2002, "An efficient algorithm for the n-best-strings problem").

Each hypothesis has the scores ``am`` (sum of ``a``), ``lm`` (sum of ``l``) and ``total`` (as above); the
N-best list's ``meta`` records the lattice's ``UTTERANCE=`` and the scale factors used.

>>> from privasr.corpus.formats.htk_lattice import parse_htk_lattice
>>> lat = parse_htk_lattice('''lmscale=2.0 start=0 end=4
... N=5 L=6
... I=0 W=!NULL
... I=1 W=hello
... I=2 W=yellow
... I=3 W=<sil>
... I=4 W=!NULL
... J=0 S=0 E=1 a=-10.0 l=-2.0
... J=1 S=0 E=2 a=-8.0 l=-5.0
... J=2 S=1 E=4 a=-1.0
... J=3 S=1 E=3 a=-0.5
... J=4 S=3 E=4 a=-0.25
... J=5 S=2 E=4 a=-1.5
... ''')
>>> nb = lattice_nbest(lat, "u1", n=5)
>>> [(h.text, h.scores["total"], h.scores["am"], h.scores["lm"]) for h in nb.hyps]
[('hello', -14.75, -10.75, -2.0), ('yellow', -19.5, -9.5, -5.0)]
>>> nb.meta["lmscale"]
2.0
"""

from __future__ import annotations

import heapq
import itertools
import math
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np

from privasr.corpus.formats._common import natural_key, strip_compression
from privasr.corpus.formats.htk_lattice import Lattice, is_filler, read_htk_lattice
from privasr.corpus.records import Hypothesis, NBest
from privasr.corpus.textio import PathLike
from privasr.errors import InputError

__all__ = ["DEFAULT_NBEST", "lattice_nbest", "read_htk_nbest", "lattice_files", "lattice_utt_id", "scale_factors"]

DEFAULT_NBEST = 10
"""How many hypotheses an N-best list from a lattice holds unless told otherwise."""

_HTK_DEFAULTS = {"acscale": 1.0, "lmscale": 1.0, "wdpenalty": 0.0}
_LATTICE_SUFFIX = re.compile(r"\.(lat|slf|htk)$", re.IGNORECASE)

_Entry = tuple[float, float, float]  # (total, am, lm) of the best path reaching a node with the current prefix


def scale_factors(lat: Lattice, *, acscale: float | None = None, lmscale: float | None = None,
                  wdpenalty: float | None = None, path: PathLike | str | None = None) -> dict[str, float]:
    """The scale factors of the path score: the arguments, else the lattice header, else HTK's defaults.

    >>> from privasr.corpus.formats.htk_lattice import parse_htk_lattice
    >>> scale_factors(parse_htk_lattice("lmscale=14.0 wdpenalty=-2\\nN=1 L=0\\nI=0\\n"), acscale=0.5)
    {'acscale': 0.5, 'lmscale': 14.0, 'wdpenalty': -2.0}
    >>> scale_factors(parse_htk_lattice("lmscale=x\\nN=1 L=0\\nI=0\\n"), path="u.lat")
    Traceback (most recent call last):
    ...
    privasr.errors.InputError: u.lat: header lmscale='x' (expected a finite number)
    """
    given = {"acscale": acscale, "lmscale": lmscale, "wdpenalty": wdpenalty}
    out: dict[str, float] = {}
    for key, default in _HTK_DEFAULTS.items():
        v = given[key]
        if v is None and key in lat.header:
            try:
                v = float(lat.header[key])
            except ValueError:
                v = math.nan
            if not math.isfinite(v):
                raise InputError(f"header {key}={lat.header[key][:40]!r}", path=path, expected="a finite number")
        elif v is not None and not math.isfinite(v):
            raise InputError(f"{key} is {v!r}", expected="a finite number")
        out[key] = float(default if v is None else v)
    return out


def _topological_nodes(lat: Lattice, out_links: list[list[int]], path: PathLike | str | None) -> list[int]:
    indeg = np.zeros(lat.n_nodes, dtype=np.int64)
    np.add.at(indeg, lat.link_end, 1)
    ends = lat.link_end.tolist()
    stack = [i for i in range(lat.n_nodes - 1, -1, -1) if indeg[i] == 0]
    order: list[int] = []
    while stack:
        u = stack.pop()
        order.append(u)
        for j in out_links[u]:
            v = ends[j]
            indeg[v] -= 1
            if indeg[v] == 0:
                stack.append(v)
    if len(order) != lat.n_nodes:
        raise InputError("the lattice has a cycle", path=path, expected="a directed acyclic graph")
    return order


def lattice_nbest(lat: Lattice, utt_id: str, n: int = DEFAULT_NBEST, *, acscale: float | None = None,
                  lmscale: float | None = None, wdpenalty: float | None = None,
                  filler: Callable[[str | None], bool] = is_filler,
                  path: PathLike | str | None = None) -> NBest:
    """The ``n`` best distinct word strings of a lattice, best first (see the module doc for the score).

    Args:
        lat: the lattice.
        utt_id: the utterance id of the N-best list.
        n: how many hypotheses at most (fewer when the lattice spells fewer distinct strings).
        acscale, lmscale, wdpenalty: scale factors; ``None``: the header's, else HTK's defaults (1, 1, 0).
        filler: which lattice words are not spelt (and not counted for the word penalty).
        path: the lattice file, for error messages.

    Raises :class:`InputError` when no path leads from the start node to the end node, or on a cycle.
    Ties in score come out in the order the search reaches them (deterministic).
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InputError(f"N-best size {n!r}", expected="an integer >= 1")
    sf = scale_factors(lat, acscale=acscale, lmscale=lmscale, wdpenalty=wdpenalty, path=path)
    starts, ends = lat.link_start.tolist(), lat.link_end.tolist()
    am = lat.link_am.tolist()
    lm = np.nan_to_num(lat.link_lm, nan=0.0).tolist()
    words = [lat.link_word(j) for j in range(lat.n_links)]
    is_fill = [filler(w) for w in words]
    weight = [sf["acscale"] * am[j] + sf["lmscale"] * lm[j] + (0.0 if is_fill[j] else sf["wdpenalty"])
              for j in range(lat.n_links)]
    out_links: list[list[int]] = [[] for _ in range(lat.n_nodes)]
    for j, s in enumerate(starts):
        out_links[s].append(j)
    order = _topological_nodes(lat, out_links, path)
    topo = [0] * lat.n_nodes
    for k, u in enumerate(order):
        topo[u] = k
    # h[u]: the best score of a path from u to the end node (-inf: the end cannot be reached)
    h = [-math.inf] * lat.n_nodes
    h[lat.end] = 0.0
    for u in reversed(order):
        for j in out_links[u]:
            x = weight[j] + h[ends[j]]
            if x > h[u]:
                h[u] = x
    if h[lat.start] == -math.inf:
        raise InputError(f"no path from the start node {lat.start} to the end node {lat.end}", path=path,
                         expected="a lattice whose end node can be reached from its start node")
    fill_out = [[j for j in out_links[u] if is_fill[j] and h[ends[j]] > -math.inf] for u in range(lat.n_nodes)]
    word_out = [[j for j in out_links[u] if not is_fill[j] and h[ends[j]] > -math.inf] for u in range(lat.n_nodes)]

    def relax(dst: dict[int, _Entry], v: int, e: _Entry) -> bool:
        old = dst.get(v)
        if old is None or e[0] > old[0]:
            dst[v] = e
            return True
        return False

    def closure(seeds: dict[int, _Entry]) -> dict[int, _Entry]:
        """``seeds`` extended along filler links (in topological order, so every node is final when popped)."""
        state = dict(seeds)
        heap = [(topo[u], u) for u in state]
        heapq.heapify(heap)
        done: set[int] = set()
        while heap:
            _, u = heapq.heappop(heap)
            if u in done:
                continue
            done.add(u)
            tot, a, g = state[u]
            for j in fill_out[u]:
                v = ends[j]
                if relax(state, v, (tot + weight[j], a + am[j], g + lm[j])):
                    heapq.heappush(heap, (topo[v], v))
        return state

    def priority(state: dict[int, _Entry]) -> float:
        return max(e[0] + h[u] for u, e in state.items())

    counter = itertools.count()
    first = closure({lat.start: (0.0, 0.0, 0.0)})
    heap: list[tuple[float, int, tuple[str, ...], dict[int, _Entry] | None, _Entry | None]] = [
        (-priority(first), next(counter), (), first, None)]
    hyps: list[Hypothesis] = []
    while heap and len(hyps) < n:
        _, _, prefix, state, final = heapq.heappop(heap)
        if state is None:  # a complete string: strings come out best first, each once
            assert final is not None
            hyps.append(Hypothesis(prefix, scores={"am": final[1], "lm": final[2], "total": final[0]}))
            continue
        if lat.end in state:
            e = state[lat.end]
            heapq.heappush(heap, (-e[0], next(counter), prefix, None, e))
        by_word: dict[str, dict[int, _Entry]] = {}
        for u, (tot, a, g) in state.items():
            for j in word_out[u]:
                w = words[j]
                assert w is not None
                relax(by_word.setdefault(w, {}), ends[j], (tot + weight[j], a + am[j], g + lm[j]))
        for w, seeds in by_word.items():
            nxt = closure(seeds)
            heapq.heappush(heap, (-priority(nxt), next(counter), (*prefix, w), nxt, None))
    meta = {"lattice": {"nodes": lat.n_nodes, "links": lat.n_links}, **sf}
    if "UTTERANCE" in lat.header:
        meta["utterance"] = lat.header["UTTERANCE"]
    return NBest(utt_id, tuple(hyps), meta=meta)


def lattice_utt_id(path: PathLike) -> str:
    """The utterance id of a lattice file: its name without compression and ``.lat``/``.slf``/``.htk`` suffixes.

    >>> lattice_utt_id("lats/AMI-3E0501_u3005_134168_134318.lat.gz")
    'AMI-3E0501_u3005_134168_134318'
    """
    return _LATTICE_SUFFIX.sub("", strip_compression(Path(path).name))


def lattice_files(folder: PathLike) -> list[Path]:
    """The lattice files of a folder (``*.lat``, ``*.slf``, ``*.htk``, optionally compressed), by natural order."""
    d = Path(folder)
    return sorted((q for q in d.iterdir() if q.is_file() and not q.name.startswith(".")
                   and _LATTICE_SUFFIX.search(strip_compression(q.name))), key=lambda q: natural_key(q.name))


def read_htk_nbest(path: PathLike, n: int = DEFAULT_NBEST, *, acscale: float | None = None,
                   lmscale: float | None = None, wdpenalty: float | None = None) -> list[NBest]:
    """N-best lists from one SLF lattice file or a folder of them (one utterance per file).

    ``utt_id`` is :func:`lattice_utt_id` of the file; the other arguments are those of :func:`lattice_nbest`.
    Malformed lattices raise :class:`InputError` naming the file and line.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "u1.lat").write_text("N=2 L=1\\nI=0 t=0 W=!NULL\\nI=1 t=1 W=hi\\nJ=0 S=0 E=1 a=-1 l=-2\\n")
    >>> [(nb.utt_id, nb.best.text, nb.best.scores["total"]) for nb in read_htk_nbest(d)]
    [('u1', 'hi', -3.0)]
    >>> _ = (d / "u2.lat").write_text("N=2 L=1\\nI=0 t=0 W=!NULL\\nI=1 t=1 W=hi\\nJ=0 S=0 E=7\\n")
    >>> read_htk_nbest(d)
    Traceback (most recent call last):
    ...
    privasr.errors.InputError: .../u2.lat:4: link 0 refers to node 7 (expected node ids 0..1)
    """
    p = Path(path)
    if p.is_dir():
        files = lattice_files(p)
        if not files:
            raise InputError("no lattice files", path=p, expected="*.lat, *.slf or *.htk files (optionally .gz)")
    else:
        files = [p]
    out: list[NBest] = []
    seen: dict[str, Path] = {}
    for f in files:
        utt = lattice_utt_id(f)
        if utt in seen:
            raise InputError(f"utterance {utt!r} has two lattices ({seen[utt].name} and {f.name})", path=p,
                             expected="one lattice file per utterance")
        seen[utt] = f
        lat = read_htk_lattice(f)
        out.append(lattice_nbest(lat, utt, n, acscale=acscale, lmscale=lmscale, wdpenalty=wdpenalty, path=f))
    return out
