"""SRILM N-best lists (``nbest-format(5)``), one file per utterance, converted to natural-log scores.

SRILM reads three formats (Stolcke, SRILM manual page ``nbest-format``):

1. Header ``NBestList1.0``, then ``(score) w1 w2 ...``: *score* is a composite acoustic/LM score on the
   **bytelog** scale (log base 1.0001, divided by 1024). Read as ``scores["total"] = score * 1024 *
   ln(1.0001)`` nats.
2. Header ``NBestList2.0``, then ``(score) w1 ( st: s1 et: e1 g: g1 a: a1 ) w2 ( ... ) ...``: per word start
   and end times (seconds), LM score *g* and acoustic score *a* (bytelog). Read as ``total`` (converted
   as above), ``lm`` = sum of *g*, ``am`` = sum of *a* (converted), and word ``times``. Sub-word units (phone
   and state entries, whose start time is not after the previous word's end, or whose token ends in
   ``-<digit>``) are skipped, as SRILM's ``nbest2-to-nbest1`` does.
3. No header, ``ascore lscore nwords w1 w2 ...``: acoustic and LM log-probabilities in **log base 10**;
   read as ``am = ascore * ln(10)``, ``lm = lscore * ln(10)``; *nwords* is checked against the words.
   ``-inf`` is accepted for scores. This is what ``ngram -rescore`` writes, and what :func:`write_srilm_nbest`
   writes (``am``/``lm`` divided by ln 10: exact round trips up to the last bit of the float).

``utt_id`` = the file name without a ``.gz``/``.xz``/``.bz2`` suffix. Input may be one file, a folder of
files (sorted by name; hidden files skipped) or a list file naming one N-best file per line (relative to
the list's folder). Hypotheses keep their file order (SRILM lists are written best first).

>>> import tempfile, pathlib, math
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> _ = (d / "utt1").write_text("-100.5 -12.25 2 hello world\\n-101 -11 1 hello\\n")
>>> nb = read_srilm_nbest(d / "utt1")[0]
>>> nb.utt_id, nb.best.words, round(nb.best.scores["lm"], 4), round(-12.25 * math.log(10), 4)
('utt1', ('hello', 'world'), -28.2067, -28.2067)
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path

from privasr.corpus.formats._common import (
    is_file,
    natural_key,
    strip_compression,
)
from privasr.corpus.records import Hypothesis, NBest
from privasr.corpus.textio import PathLike, iter_lines, open_write_text, split_words
from privasr.errors import InputError

__all__ = ["read_srilm_nbest", "read_srilm_file", "write_srilm_nbest", "BYTELOG_TO_LN", "LOG10_TO_LN",
           "srilm_nbest_format"]

LOG10_TO_LN = math.log(10.0)
"""Multiply a log10 score by this to get natural log."""
BYTELOG_TO_LN = 1024.0 * math.log(1.0001)
"""Multiply a bytelog score (log base 1.0001 / 1024) by this to get natural log."""

_MAGIC = {"NBestList1.0": 1, "NBestList2.0": 2}


def _num(s: str, what: str, *, allow_neg_inf: bool = True) -> float:
    try:
        x = float(s)
    except ValueError:
        raise InputError(f"{what} {s[:40]!r} is not a number", expected="a number") from None
    if math.isnan(x) or x == math.inf or (x == -math.inf and not allow_neg_inf):
        raise InputError(f"{what} is {s[:40]}", expected="a finite number" + (" or -inf" if allow_neg_inf else ""))
    return x


def _paren_score(s: str) -> float:
    if len(s) < 3 or s[0] != "(" or s[-1] != ")":
        raise InputError(f"score {s[:40]!r} is not in parentheses", expected="(score) w1 w2 ...")
    return _num(s[1:-1], "score") * BYTELOG_TO_LN


def _parse3(f: list[str]) -> Hypothesis:
    if len(f) < 3:
        raise InputError(f"{len(f)} fields", expected="ascore lscore nwords w1 w2 ...")
    am = _num(f[0], "acoustic score") * LOG10_TO_LN
    lm = _num(f[1], "LM score") * LOG10_TO_LN
    if not f[2].isdigit() or int(f[2]) != len(f) - 3:
        raise InputError(f"nwords is {f[2][:40]} but there are {len(f) - 3} words", expected="nwords == words")
    return Hypothesis(tuple(f[3:]), scores={"am": am, "lm": lm})


def _parse2(f: list[str]) -> Hypothesis:
    total = _paren_score(f[0])
    if (len(f) - 1) % 11:
        raise InputError(f"{len(f) - 1} fields after the score", expected="11 fields per word: "
                         "w ( st: S et: E g: G a: A )")
    words: list[str] = []
    times: list[tuple[float, float]] = []
    g_sum = a_sum = 0.0
    prev_end = -math.inf
    for i in range(1, len(f), 11):
        w = f[i : i + 11]
        if w[1] != "(" or w[2] != "st:" or w[4] != "et:" or w[6] != "g:" or w[8] != "a:" or w[10] != ")":
            raise InputError(f"word {w[0][:40]!r} has malformed details", expected="w ( st: S et: E g: G a: A )")
        st = _num(w[3], "start time", allow_neg_inf=False)
        et = _num(w[5], "end time", allow_neg_inf=False)
        g = _num(w[7], "LM score")
        a = _num(w[9], "acoustic score")
        if st > prev_end and not (len(w[0]) >= 2 and w[0][-2] == "-" and w[0][-1].isdigit()):
            words.append(w[0])
            times.append((st, et))
            g_sum += g
            a_sum += a
            prev_end = et
    return Hypothesis(tuple(words), scores={"total": total, "lm": g_sum * BYTELOG_TO_LN,
                                            "am": a_sum * BYTELOG_TO_LN}, times=tuple(times))


def _parse1(f: list[str]) -> Hypothesis:
    return Hypothesis(tuple(f[1:]), scores={"total": _paren_score(f[0])})


def read_srilm_file(path: PathLike, utt_id: str | None = None) -> NBest:
    """Read one SRILM N-best file (any of the three formats) as one utterance.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "u2.gz"
    >>> import gzip
    >>> with gzip.open(p, "wt") as f:
    ...     _ = f.write("NBestList1.0\\n(-1024) a b\\n")
    >>> nb = read_srilm_file(p)
    >>> nb.utt_id, nb.best.words, round(nb.best.scores["total"], 3)
    ('u2', ('a', 'b'), -104.852)
    """
    p = Path(path)
    fmt = 3
    hyps: list[Hypothesis] = []
    first = True
    for n, line in iter_lines(p):
        f = split_words(line)
        if not f:
            continue
        if first and f[0] in _MAGIC:
            first = False
            if len(f) != 1:
                raise InputError("the header line has extra fields", path=p, line=n, expected=f[0])
            fmt = _MAGIC[f[0]]
            continue
        first = False
        try:
            hyps.append(_parse3(f) if fmt == 3 else _parse2(f) if fmt == 2 else _parse1(f))
        except InputError as e:
            raise e.at(p, n) from None
    return NBest(utt_id or _utt_id(p), tuple(hyps), meta={"srilm_format": fmt})


def _utt_id(p: Path) -> str:
    u = strip_compression(p.name)
    if not u.strip() or any(c.isspace() for c in u):
        raise InputError(f"file name {p.name!r} cannot be an utterance id", path=p, expected="a name without spaces")
    return u


def _numeric(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def srilm_nbest_format(path: PathLike) -> int | None:
    """1, 2 or 3 for an SRILM N-best file, ``None`` if its first non-blank line fits none (e.g. a list file).

    A first line of format 3's shape (three numbers, then words) counts as format 3 even when its details
    are wrong (a ``nan`` score, a word count that does not match), so that reading it reports the fault.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "x"
    >>> _ = p.write_text("-1.5 -2 1 a\\n")
    >>> srilm_nbest_format(p)
    3
    >>> _ = p.write_text("-1.5 nan 3 a\\n")
    >>> srilm_nbest_format(p)
    3
    >>> read_srilm_nbest(p)
    Traceback (most recent call last):
    ...
    privasr.errors.InputError: ...x:1: LM score is nan (expected a finite number or -inf)
    """
    for _, line in iter_lines(path):
        f = split_words(line)
        if not f:
            continue
        if f[0] in _MAGIC:
            return _MAGIC[f[0]]
        if len(f) >= 3 and _numeric(f[0]) and _numeric(f[1]) and _numeric(f[2]):
            return 3
        return None
    return 3


def read_srilm_nbest(path: PathLike) -> list[NBest]:
    """Read SRILM N-best lists from a file, a folder of files, or a list file (one path per line).

    A file whose first line is neither a header nor a format-3 hypothesis is taken as a list file.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "a").write_text("-1 -2 1 x\\n"); _ = (d / "b").write_text("-3 -4 0\\n")
    >>> _ = (d / "list").write_text("a\\nb\\n")
    >>> [(nb.utt_id, len(nb)) for nb in read_srilm_nbest(d / "list")]
    [('a', 1), ('b', 1)]
    """
    p = Path(path)
    if p.is_dir():
        files = sorted((q for q in p.iterdir() if q.is_file() and not q.name.startswith(".")),
                       key=lambda q: natural_key(q.name))
        return _read_many(files, p)
    if srilm_nbest_format(p) is not None:
        return [read_srilm_file(p)]
    files = []
    for n, line in iter_lines(p):
        s = line.strip()
        if not s:
            continue
        q = Path(s)
        q = q if q.is_absolute() else p.parent / q
        if not is_file(q):
            raise InputError(f"{s[:80]!r} is neither an N-best hypothesis nor an existing file", path=p, line=n,
                             expected="an SRILM N-best file or a list of N-best files")
        files.append(q)
    return _read_many(files, p)


def _read_many(files: list[Path], where: Path) -> list[NBest]:
    out = []
    seen: dict[str, Path] = {}
    for q in files:
        nb = read_srilm_file(q)
        if nb.utt_id in seen:
            raise InputError(f"utterance {nb.utt_id!r} also in {seen[nb.utt_id]}", path=q,
                             expected="unique file names")
        seen[nb.utt_id] = q
        out.append(nb)
    return out


def _log10(x: float) -> str:
    return "-inf" if x == -math.inf else repr(x / LOG10_TO_LN)


def write_srilm_nbest(folder: PathLike, records: Iterable[NBest], suffix: str = "") -> int:
    """Write each utterance to ``folder/<utt_id><suffix>`` in SRILM format 3; returns the number of files.

    Every hypothesis needs ``am`` and ``lm`` scores (natural log; written as log10). ``suffix`` may be e.g.
    ``".gz"`` to compress.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> nb = NBest("u1", (Hypothesis(("a", "b"), scores={"am": -2.302585092994046, "lm": float("-inf")}),))
    >>> write_srilm_nbest(d, [nb])
    1
    >>> (d / "u1").read_text()
    '-1.0 -inf 2 a b\\n'
    """
    out = Path(folder)
    n = 0
    for r in records:
        if not isinstance(r, NBest):
            raise InputError(f"record is {type(r).__name__}", path=out, expected="NBest")
        if "/" in r.utt_id or "\\" in r.utt_id or r.utt_id in (".", "..") or any(c.isspace() for c in r.utt_id):
            raise InputError(f"utterance id {r.utt_id!r} cannot be a file name", path=out,
                             expected="ids without slashes or spaces")
        rows = []
        for k, h in enumerate(r.hyps):
            if "am" not in h.scores or "lm" not in h.scores:
                raise InputError(f"utterance {r.utt_id!r} hypothesis {k} lacks an 'am' or 'lm' score", path=out,
                                 expected="am and lm scores for SRILM format 3")
            rows.append(f"{_log10(h.scores['am'])} {_log10(h.scores['lm'])} {len(h.words)} {h.text}".rstrip())
        with open_write_text(out / f"{r.utt_id}{suffix}") as f:
            f.writelines(x + "\n" for x in rows)
        n += 1
    return n
