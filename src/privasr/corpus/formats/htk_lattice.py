"""HTK Standard Lattice Format (SLF) word lattices, and the best path that spells given words.

An SLF file (``.lat``, ``.slf``, optionally ``.gz``/``.xz``) has header fields (``VERSION=1.0``,
``UTTERANCE=...``, ``start=``, ``end=``, scale factors), a size line ``N=<nodes> L=<links>``, then one line
per node (``I=<id> t=<seconds> W=<word> v=<variant>``) and one per link (``J=<id> S=<from> E=<to>
a=<acoustic log-prob> l=<LM log-prob> p=<posterior> ...``). Words may sit on nodes (pocketsphinx, HTK ``HVite``) or on
links (``W=`` on a ``J=`` line); a link's word, when it has one, is the word of that link, otherwise the word
of its end node is. Scores are natural-log (``base=`` in the header, if present, converts other bases).
Field values may be quoted (``W="it's"``) as SLF allows. Every malformed line is an
:class:`~privasr.errors.InputError` naming the file and the line.

:func:`best_path_scores` finds, for each of several word sequences, the highest acoustic score
(sum of ``a=`` over the links) of a start-to-end path whose non-filler words spell that sequence; filler
words (``!NULL``, ``!SENT_START``, ``!SENT_END``, ``<s>``, ``<sil>``, ``[NOISE]``, ``++X++``) are free.
That is how a decoder's N-best strings get comparable acoustic scores from its own lattice.

:func:`word_posteriors` turns the links' posteriors (``p=``, written by pocketsphinx and by HTK's
``HLRescore -p``) into the confidence of each word of a time-aligned hypothesis: the maximum over the
word's frames of the summed posterior of every link that carries the same word through that frame
(``C_max``, Wessel, Schlueter, Macherey and Ney, "Confidence measures for large vocabulary continuous
speech recognition", IEEE TSAP 2001). Summing over links merges the many copies of a word that differ only
in their start or end frame, between which a single link's (or node's) posterior is split.

>>> text = '''VERSION=1.0
... start=0
... end=3
... N=4 L=4
... I=0 t=0.00 W=!NULL
... I=1 t=0.50 W=hello
... I=2 t=0.50 W=yellow
... I=3 t=1.00 W=!SENT_END
... J=0 S=0 E=1 a=-10.0 l=-2.0
... J=1 S=0 E=2 a=-8.0 l=-5.0
... J=2 S=1 E=3 a=-1.0
... J=3 S=2 E=3 a=-1.5
... '''
>>> lat = parse_htk_lattice(text)
>>> lat.n_nodes, lat.n_links, lat.node_words[1]
(4, 4, 'hello')
>>> best_path_scores(lat, [("hello",), ("yellow",), ("jello",)])
[-11.0, -9.5, None]
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from privasr.corpus.textio import PathLike, read_text, split_words
from privasr.errors import InputError

__all__ = ["Lattice", "parse_htk_lattice", "read_htk_lattice", "best_path_scores", "is_filler", "word_posteriors"]

_FILLER = re.compile(r"^(!NULL|!SENT_START|!SENT_END|<.*>|\[.*\]|\+\+.*\+\+)$")
_FIELD = re.compile(r'([A-Za-z]+)=("(?:[^"\\]|\\.)*"|\S+)')


def is_filler(word: str | None) -> bool:
    """Whether a lattice word is a null node, sentence boundary, silence or noise filler.

    >>> [is_filler(w) for w in ("!NULL", "<sil>", "[NOISE]", "++UH++", "uh", None)]
    [True, True, True, True, False, True]
    """
    return word is None or bool(_FILLER.match(word))


@dataclass(frozen=True, slots=True)
class Lattice:
    """A word lattice: node words and times, links with acoustic and LM scores (natural log).

    ``node_words[i]`` is node ``i``'s word (``None`` when it has none), ``link_words[j]`` link ``j``'s own
    word (``None`` when the word is on its end node); ``link_lm`` holds ``nan`` where a link has no ``l=``,
    ``link_posterior`` (a probability, ``p=``) ``nan`` where a link has no ``p=``.
    """

    start: int
    end: int
    node_words: tuple[str | None, ...]
    node_times: tuple[float | None, ...]
    link_start: np.ndarray
    link_end: np.ndarray
    link_am: np.ndarray
    link_lm: np.ndarray
    link_words: tuple[str | None, ...]
    header: dict[str, str]
    link_posterior: np.ndarray | None = None

    @property
    def n_nodes(self) -> int:
        return len(self.node_words)

    @property
    def n_links(self) -> int:
        return len(self.link_words)

    def link_word(self, j: int) -> str | None:
        """The word a path spells when it takes link ``j``."""
        w = self.link_words[j]
        return w if w is not None else self.node_words[int(self.link_end[j])]


def _unquote(v: str) -> str:
    if len(v) >= 2 and v[0] == v[-1] == '"':
        return re.sub(r"\\(.)", r"\1", v[1:-1])
    return v


def _fields(line: str) -> dict[str, str]:
    if '"' not in line:  # the common case: whitespace-separated NAME=VALUE tokens
        out = {}
        for tok in split_words(line):
            name, eq, value = tok.partition("=")
            if not eq or not name.isalpha() or not value:
                raise InputError(f"cannot parse {tok[:40]!r}", expected="NAME=VALUE fields")
            out[name] = value
        return out
    out = {}
    pos = 0
    for m in _FIELD.finditer(line):
        if line[pos:m.start()].strip():
            raise InputError(f"cannot parse {line[pos:m.start()].strip()[:40]!r}", expected="NAME=VALUE fields")
        out[m.group(1)] = _unquote(m.group(2))
        pos = m.end()
    if line[pos:].strip():
        raise InputError(f"cannot parse {line[pos:].strip()[:40]!r}", expected="NAME=VALUE fields")
    return out


def _int(fields: dict[str, str], key: str, what: str) -> int:
    v = fields.get(key)
    if v is None:
        raise InputError(f"{what} has no {key}=", expected=f"{key}=<integer>")
    try:
        return int(v)
    except ValueError:
        raise InputError(f"{what} {key}={v[:40]!r}", expected="an integer") from None


def _new_id(fields: dict[str, str], key: str, what: str, count: int | None, seen: dict[int, Any]) -> int:
    """The id of a new node (``I=``) or link (``J=``): after the size line, below its count, not seen before."""
    if count is None:
        raise InputError(f"a {what} before the N= L= size line", expected="N=<nodes> L=<links> first")
    i = _int(fields, key, what)
    if not 0 <= i < count:
        raise InputError(f"{what} id {i} outside 0..{count - 1}", expected=f"ids below {'N' if key == 'I' else 'L'}")
    if i in seen:
        raise InputError(f"{what} {i} defined twice", expected=f"unique {what} ids")
    return i


def _float(v: str, what: str) -> float:
    try:
        x = float(v)
    except ValueError:
        raise InputError(f"{what} is {v[:40]!r}", expected="a number") from None
    if not math.isfinite(x):
        raise InputError(f"{what} is {v[:40]!r}", expected="a finite number")
    return x


def parse_htk_lattice(text: str, path: PathLike | str | None = None) -> Lattice:
    """Parse SLF text (see the module doc); ``path`` locates errors.

    >>> parse_htk_lattice("N=1 L=0\\nI=0 t=x\\n", "u.lat")
    Traceback (most recent call last):
    ...
    privasr.errors.InputError: u.lat:2: node time t is 'x' (expected a number)
    """
    header: dict[str, str] = {}
    n_nodes = n_links = None
    nodes: dict[int, tuple[str | None, float | None]] = {}
    links: dict[int, tuple[int, int, float, float, str | None, float]] = {}
    scale = 1.0
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            f = _fields(line)
            if "I" in f:
                i = _new_id(f, "I", "node", n_nodes, nodes)
                t = _float(f["t"], "node time t") if "t" in f else None
                nodes[i] = (f.get("W"), t)
            elif "J" in f:
                j = _new_id(f, "J", "link", n_links, links)
                s, e = _int(f, "S", f"link {j}"), _int(f, "E", f"link {j}")
                for end in (s, e):
                    if not 0 <= end < n_nodes:  # type: ignore[operator]
                        raise InputError(f"link {j} refers to node {end}", expected=f"node ids 0..{n_nodes - 1}")
                a = _float(f["a"], f"link {j} a") * scale if "a" in f else 0.0
                lm = _float(f["l"], f"link {j} l") * scale if "l" in f else math.nan
                post = _float(f["p"], f"link {j} posterior p") if "p" in f else math.nan
                if not (math.isnan(post) or 0.0 <= post <= 1.001):
                    raise InputError(f"link {j} posterior p={f['p']}", expected="a probability in [0, 1]")
                # decoders computing in integer log base 1.0001 (pocketsphinx) round a certain link to 1.0001
                post = min(post, 1.0)
                links[j] = (s, e, a, lm, f.get("W"), post)
            elif "N" in f or "L" in f:
                if n_nodes is not None:
                    raise InputError("a second N= L= size line", expected="one lattice per file")
                n_nodes, n_links = _int(f, "N", "size line"), _int(f, "L", "size line")
                if n_nodes < 1 or n_links < 0:
                    raise InputError(f"N={n_nodes} L={n_links}", expected="N >= 1 and L >= 0")
            else:
                header.update(f)
                if "base" in f:
                    b = _float(f["base"], "base")
                    if b <= 0 or b == 1.0:
                        raise InputError(f"base={f['base']}", expected="a log base > 0 other than 1 (0: linear)")
                    scale = math.log(b)
        except InputError as e:
            raise e.at(path, lineno) from None
    if n_nodes is None or n_links is None:
        raise InputError("no N= L= size line", path=path, expected="an HTK SLF lattice")
    if len(nodes) != n_nodes or len(links) != n_links:
        raise InputError(f"{len(nodes)} nodes and {len(links)} links, the size line says N={n_nodes} L={n_links}",
                         path=path, expected="every node and link defined once")
    try:
        start = int(header.get("start", min(nodes, key=lambda i: (nodes[i][1] or 0.0, i))))
        end = int(header.get("end", max(nodes, key=lambda i: (nodes[i][1] or 0.0, -i))))
    except ValueError:
        raise InputError(f"start={header.get('start')!r} end={header.get('end')!r}", path=path,
                         expected="integer node ids") from None
    if not (0 <= start < n_nodes and 0 <= end < n_nodes):
        raise InputError(f"start={start} end={end}", path=path, expected=f"node ids 0..{n_nodes - 1}")
    ls = sorted(links)
    return Lattice(
        start=start,
        end=end,
        node_words=tuple(nodes[i][0] for i in range(n_nodes)),
        node_times=tuple(nodes[i][1] for i in range(n_nodes)),
        link_start=np.array([links[j][0] for j in ls], dtype=np.int64),
        link_end=np.array([links[j][1] for j in ls], dtype=np.int64),
        link_am=np.array([links[j][2] for j in ls], dtype=np.float64),
        link_lm=np.array([links[j][3] for j in ls], dtype=np.float64),
        link_words=tuple(links[j][4] for j in ls),
        header=header,
        link_posterior=np.array([links[j][5] for j in ls], dtype=np.float64),
    )


def read_htk_lattice(path: PathLike) -> Lattice:
    """Read an SLF lattice file (``.gz``/``.xz``/``.bz2`` allowed; strict UTF-8)."""
    return parse_htk_lattice(read_text(path), path)


def _topological_links(lat: Lattice, path: PathLike | str | None) -> list[int]:
    """Link indices ordered so that every link comes after all links into its start node."""
    indeg = np.zeros(lat.n_nodes, dtype=np.int64)
    np.add.at(indeg, lat.link_end, 1)
    out_links: list[list[int]] = [[] for _ in range(lat.n_nodes)]
    for j, s in enumerate(lat.link_start.tolist()):
        out_links[s].append(j)
    stack = [i for i in range(lat.n_nodes) if indeg[i] == 0]
    order: list[int] = []
    ends = lat.link_end.tolist()
    while stack:
        u = stack.pop()
        for j in out_links[u]:
            order.append(j)
            v = ends[j]
            indeg[v] -= 1
            if indeg[v] == 0:
                stack.append(v)
    if len(order) != lat.n_links:
        raise InputError("the lattice has a cycle", path=path, expected="a directed acyclic graph")
    return order


def best_path_scores(lat: Lattice, hyps: Sequence[Sequence[str]], *,
                     filler: Callable[[str | None], bool] = is_filler,
                     word_key: Callable[[str], str] | None = None) -> list[float | None]:
    """The best acoustic score of a start-to-end path spelling each word sequence (``None``: no such path).

    Args:
        lat: the lattice.
        hyps: word sequences (fillers excluded).
        filler: which lattice words a path may pass without spelling them (see :func:`is_filler`).
        word_key: maps a lattice word to the word it spells (e.g. strips pronunciation variants ``(2)``).

    The search is one pass over the links in topological order, over all sequences at once: the state
    of a node is, for every sequence and every prefix length, the best score of a path reaching it that
    has spelt that prefix.
    """
    n_h = len(hyps)
    if n_h == 0:
        return []
    k_max = max(len(h) for h in hyps)
    vocab: dict[str, int] = {}
    for h in hyps:
        for w in h:
            vocab.setdefault(w, len(vocab))
    # match[v][h, k]: the k-th word of hypothesis h is word v (k < len(h))
    match = np.zeros((len(vocab), n_h, k_max), dtype=bool)
    for hi, h in enumerate(hyps):
        for k, w in enumerate(h):
            match[vocab[w], hi, k] = True
    lengths = np.array([len(h) for h in hyps])
    neg = -np.inf
    state: list[np.ndarray | None] = [None] * lat.n_nodes
    init = np.full((n_h, k_max + 1), neg)
    init[:, 0] = 0.0
    state[lat.start] = init
    kinds: list[int] = []  # -2 filler, -1 a word no hypothesis has, >= 0 vocabulary index
    for j in range(lat.n_links):
        w = lat.link_word(j)
        if filler(w):
            kinds.append(-2)
        else:
            key = word_key(w) if word_key is not None else w  # type: ignore[arg-type]
            kinds.append(vocab.get(key, -1))
    starts, ends, am = lat.link_start.tolist(), lat.link_end.tolist(), lat.link_am.tolist()
    for j in _topological_links(lat, None):
        kind = kinds[j]
        if kind == -1:
            continue
        src = state[starts[j]]
        if src is None:
            continue
        cand = src + am[j]
        v = ends[j]
        dst = state[v]
        if dst is None:
            dst = state[v] = np.full((n_h, k_max + 1), neg)
        if kind == -2:
            np.maximum(dst, cand, out=dst)
        else:
            moved = np.where(match[kind], cand[:, :-1], neg)
            np.maximum(dst[:, 1:], moved, out=dst[:, 1:])
    final = state[lat.end]
    if final is None:
        return [None] * n_h
    best = final[np.arange(n_h), lengths]
    return [float(x) if np.isfinite(x) else None for x in best]


def word_posteriors(lat: Lattice, segments: Sequence[tuple[str, float, float]], *, word_on: str = "end",
                    frame_s: float = 0.01, word_key: Callable[[str], str] | None = None) -> list[float]:
    """The lattice confidence ``C_max`` of each word of a time-aligned hypothesis (see the module doc).

    Args:
        lat: a lattice with link posteriors (``p=`` on every link) and node times.
        segments: ``(word, start_s, end_s)`` for each word to score, in seconds; ``end_s`` is the start of
            the word's last frame (as decoders report segment end frames), so ``end_s >= start_s``.
        word_on: which node of a link carries the word the link spans from its start node's time to its end
            node's: ``"end"`` (the HTK convention: node times are word ends) or ``"start"`` (pocketsphinx's
            ``write_htk``: a node is a word at its start frame, its out-links are the word's end frames).
        frame_s: the frame length in seconds (10 ms for pocketsphinx and HTK front ends).
        word_key: maps a lattice word to the word it spells (e.g. strips pronunciation variants ``(2)``).

    Returns:
        One probability per segment: the most, over the segment's frames, of the posteriors summed over the
        links with the same word covering that frame; 0.0 when no such link covers any of its frames.

    Raises:
        InputError: a link without a posterior, a segment that ends before it starts, or a bad ``word_on`` /
            ``frame_s``.

    >>> lat = parse_htk_lattice(\'\'\'N=4 L=4
    ... I=0 t=0.00 W=!NULL
    ... I=1 t=0.30 W=cat
    ... I=2 t=0.32 W=cat
    ... I=3 t=0.60 W=!SENT_END
    ... J=0 S=0 E=1 a=-1 p=0.5
    ... J=1 S=0 E=2 a=-1 p=0.3
    ... J=2 S=1 E=3 a=-1 p=0.5
    ... J=3 S=2 E=3 a=-1 p=0.3
    ... \'\'\')
    >>> [round(p, 3) for p in word_posteriors(lat, [("cat", 0.0, 0.29), ("cat", 0.33, 0.59), ("dog", 0.0, 0.29)])]
    [0.8, 0.0, 0.0]
    """
    if word_on not in ("end", "start"):
        raise InputError(f"word_on={word_on!r}", expected="'end' or 'start'")
    if not (math.isfinite(frame_s) and frame_s > 0):
        raise InputError(f"frame_s={frame_s!r}", expected="a frame length > 0 seconds")
    post = lat.link_posterior
    if lat.n_links and (post is None or np.isnan(post).any()):
        raise InputError("the lattice has links without a posterior p=", expected="p= on every link")
    times = lat.node_times
    starts, ends = lat.link_start.tolist(), lat.link_end.tolist()
    by_word: dict[str, list[tuple[int, int, float]]] = {}
    for j in range(lat.n_links):
        s, e = starts[j], ends[j]
        w = lat.link_words[j] or lat.node_words[s if word_on == "start" else e]
        t_s, t_e = times[s], times[e]
        if is_filler(w) or t_s is None or t_e is None:
            continue
        key = word_key(w) if word_key is not None else w  # type: ignore[arg-type]
        by_word.setdefault(key, []).append((round(t_s / frame_s), round(t_e / frame_s), float(post[j])))  # type: ignore[index]
    out = []
    for w, t0, t1 in segments:
        a, b = round(t0 / frame_s), round(t1 / frame_s)
        if b < a:
            raise InputError(f"segment {w!r} ends ({t1}) before it starts ({t0})", expected="end >= start")
        acc = np.zeros(b - a + 1)
        for f0, f1, p in by_word.get(w, ()):
            lo, hi = max(f0, a), min(f1 - 1, b)  # a link covers its start node's frame up to the frame before its end's
            if lo <= hi:
                acc[lo - a: hi - a + 1] += p
        out.append(float(min(1.0, acc.max())))
    return out
