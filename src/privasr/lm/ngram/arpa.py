r"""Reading and writing ARPA back-off language model files.

The format (as SRILM, KenLM and IRSTLM write it)::

    \data\
    ngram 1=3
    ngram 2=1

    \1-grams:
    -1.0<TAB><s><TAB>-0.3
    ...
    \2-grams:
    -0.2<TAB><s> a
    \end\

:func:`write_arpa` writes ``\data\`` first, tab-separated fields, unigrams in vocabulary order and longer
n-grams sorted, numbers with 9 significant digits, ``-99`` for ``log10(0)``, and a backoff on every line below
the highest order (KenLM's layout; KenLM, SRILM and this reader load it). :func:`read_arpa` accepts any
whitespace between fields and ``.gz``/``.xz``/``.bz2`` files, and turns every defect into an
:class:`~privasr.errors.InputError` with the file, the line and what was expected: a bad header or count,
a wrong number of fields, a non-numeric or positive log probability, an unknown section, fewer or more
n-grams than announced, a word missing from the unigrams, a missing lower-order prefix, a duplicate n-gram.

>>> import tempfile, pathlib
>>> from privasr.lm.ngram.model import NgramModel
>>> m = NgramModel.from_entries(2, {1: {("<s>",): (-99, -0.3), ("a",): (-0.5, -0.1), ("</s>",): (-0.4, 0)},
...                                 2: {("<s>", "a"): (-0.2, 0.0)}})
>>> p = pathlib.Path(tempfile.mkdtemp()) / "m.arpa"
>>> write_arpa(m, p)
>>> print(p.read_text().replace("\t", " | "))
\data\
ngram 1=3
ngram 2=1
<BLANKLINE>
\1-grams:
-99 | <s> | -0.3
-0.5 | a | -0.1
-0.4 | </s> | 0
<BLANKLINE>
\2-grams:
-0.2 | <s> a
<BLANKLINE>
\end\
<BLANKLINE>
>>> read_arpa(p).logprob("a", ["<s>"])
-0.2
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterable, Iterator

import numpy as np

from privasr.corpus.records import invisible_problem
from privasr.corpus.textio import PathLike, iter_lines, open_write_text, split_words
from privasr.errors import InputError
from privasr.lm.ngram.model import NgramModel, StructureError

__all__ = ["read_arpa", "write_arpa", "arpa_counts"]

_NGRAM_LINE = re.compile(r"^ngram\s+(\d+)\s*=\s*(\d+)$")
_SECTION = re.compile(r"^\\(\d+)-grams:$")
_LOG0 = -99.0
_CHUNK = 100_000


def write_arpa(model: NgramModel, path: PathLike, *, digits: int = 9) -> None:
    """Write ``model`` to ``path`` in ARPA format (compressed by suffix: ``.gz``, ``.xz``, ``.bz2``).

    Numbers get ``digits`` significant digits (the default 9 keeps float32 values, e.g. KenLM's, exact).
    """
    order = model.order
    fmt = f"%.{digits}g"
    if not 1 <= digits <= 17:
        raise InputError(f"digits={digits}", expected="1..17 significant digits")

    def num(values: np.ndarray) -> list[str]:
        out = [fmt % x for x in (values + 0.0).tolist()]  # + 0.0 turns -0.0 into 0.0
        if np.isneginf(values).any():
            out = ["-99" if s == "-inf" else s for s in out]
        return out

    with open_write_text(path) as f:
        f.write("\\data\\\n")
        for n in range(1, order + 1):
            f.write(f"ngram {n}={model.num_ngrams(n)}\n")
        vocab = list(model.vocab)
        spaced = [" " + w for w in vocab]
        prev: list[str] = []
        for n in range(1, order + 1):
            f.write(f"\n\\{n}-grams:\n")
            _, probs, bows = model.arrays(n)
            prefix, last = model.structure(n)
            keep = n < order  # the next order builds on these strings
            words: list[str] = []
            for lo in range(0, len(probs), _CHUNK):  # bounded memory for numbers and lines
                hi = lo + _CHUNK
                if n == 1:
                    chunk = vocab[lo:hi]
                else:  # an n-gram's text is its prefix's text plus its last word
                    chunk = [prev[i] + spaced[j] for i, j in zip(prefix[lo:hi].tolist(), last[lo:hi].tolist(),
                                                                  strict=True)]
                ps = num(probs[lo:hi])
                if n < order:
                    f.writelines(map("%s\t%s\t%s\n".__mod__, zip(ps, chunk, num(bows[lo:hi]), strict=True)))
                else:
                    f.writelines(map("%s\t%s\n".__mod__, zip(ps, chunk, strict=True)))
                if keep:
                    words.extend(chunk)
            prev = words
        f.write("\n\\end\\\n")


def _number(text: str, what: str, path: PathLike, line: int, *, prob: bool) -> float:
    try:
        x = float(text)
    except ValueError:
        x = math.nan
    if "_" in text or math.isnan(x):
        raise InputError(f"{what} {text!r} is not a number", path=path, line=line,
                         expected="a decimal log10 value") from None
    if prob and x > 0:
        raise InputError(f"{what} {text!r} is positive", path=path, line=line, expected="a log10 probability <= 0")
    if not prob and math.isinf(x):
        raise InputError(f"{what} {text!r} is infinite", path=path, line=line, expected="a finite log10 backoff")
    return x


def read_arpa(path: PathLike) -> NgramModel:
    """Read an ARPA file into an :class:`~privasr.lm.ngram.model.NgramModel` (errors: :class:`InputError`)."""
    return _read(path, iter_lines(path))


def _read(path: PathLike, lines: Iterable[tuple[int, str]]) -> NgramModel:
    it = iter(lines)
    counts, lineno, line = _read_header(path, it)
    vocab, ids_flat, probs, bows, linenos = _read_sections(path, counts, lineno, line, it)
    for lineno, raw in it:
        line = raw.strip()
        if line:
            raise InputError(f"content after \\end\\: {line[:40]!r}", path=path, line=lineno,
                             expected="end of file")
    order = len(counts)
    try:
        return NgramModel.from_arrays(
            list(vocab),
            [np.asarray(ids_flat[k], dtype=np.int64).reshape(-1, k + 1) for k in range(order)],
            [np.asarray(p, dtype=np.float64) for p in probs],
            [np.asarray(b, dtype=np.float64) for b in bows],
        )
    except StructureError as e:
        nums = linenos[e.order - 1]
        line_of = nums[e.row] if e.row < len(nums) else None
        raise InputError(e.message, path=path, line=line_of, expected=e.expected) from None


def _read_header(path: PathLike, it: Iterator[tuple[int, str]]) -> tuple[list[int], int, str]:
    """``\\data\\`` and the ``ngram n=<count>`` lines: the counts, and the number and text of the first line
    after them (it must open the 1-grams section)."""
    counts: list[int] = []
    started = False
    last = 0
    for lineno, raw in it:
        last = lineno
        line = raw.strip()
        if not line:
            continue
        if not started:
            if line != "\\data\\":
                raise InputError(f"the file starts with {line[:40]!r}", path=path, line=lineno,
                                 expected="'\\data\\' (an ARPA file)")
            started = True
            continue
        m = _NGRAM_LINE.match(line)
        if m:
            k, c = int(m.group(1)), int(m.group(2))
            if k != len(counts) + 1:
                raise InputError(f"header line for order {k} after {len(counts)} order(s)", path=path,
                                 line=lineno, expected=f"'ngram {len(counts) + 1}=<count>'")
            counts.append(c)
            continue
        if not counts:
            raise InputError(f"unexpected header line {line[:40]!r}", path=path, line=lineno,
                             expected="'ngram 1=<count>'")
        if counts[0] == 0:
            raise InputError("the header announces no unigrams", path=path, line=lineno,
                             expected="ngram 1=<count> with count >= 1")
        return counts, lineno, line
    raise InputError("the file ends early", path=path, line=last + 1,
                     expected="'ngram 1=<count>'" if started else "'\\data\\'")


def _read_sections(path: PathLike, counts: list[int], first_lineno: int, first_line: str,
                   it: Iterator[tuple[int, str]]
                   ) -> tuple[dict[str, int], list[list[int]], list[list[float]], list[list[float]], list[list[int]]]:
    """The n-gram sections, from ``first_line`` up to ``\\end\\``: the vocabulary (word -> id), and per order the
    flat word ids, log10 probabilities, log10 backoffs and line numbers of its entries.

    One loop over every entry line, kept inline (no call per line) because it is the reader's hot path.
    """
    order = len(counts)
    n = 0  # current section order
    vocab: dict[str, int] = {}
    ids_flat: list[list[int]] = []
    probs: list[list[float]] = []
    bows: list[list[float]] = []
    linenos: list[list[int]] = []
    last = first_lineno
    for lineno, raw in itertools.chain(((first_lineno, first_line),), it):
        last = lineno
        line = raw.strip()
        if not line:
            continue
        if line.startswith("\\"):
            n = _section_line(path, lineno, line, n, counts, probs)
            if n > order:  # \end\
                return vocab, ids_flat, probs, bows, linenos
            for table in (ids_flat, probs, bows, linenos):
                table.append([])
            continue
        if n == 0:
            raise InputError(f"unexpected line {line[:40]!r}", path=path, line=lineno,
                             expected="'\\1-grams:'")
        parts = split_words(line)
        nf = len(parts)
        if nf == n + 1:
            bo = 0.0
        elif nf == n + 2 and n < order:
            bo = _number(parts[-1], "backoff", path, lineno, prob=False)
        else:
            exp = (f"<log10 prob> <{n} word(s)> [<log10 backoff>]" if n < order
                   else f"<log10 prob> <{n} word(s)>")
            raise InputError(f"{nf} fields in a {n}-gram line", path=path, line=lineno, expected=exp)
        if len(probs[n - 1]) >= counts[n - 1]:
            raise InputError(f"more {n}-grams than the header's {counts[n - 1]}", path=path, line=lineno,
                             expected=f"'\\{n + 1}-grams:'" if n < order else "'\\end\\'")
        lp = _number(parts[0], "log10 probability", path, lineno, prob=True)
        if n == 1:
            w = parts[1]
            if not (w.isascii() and w.isprintable()) and (why := invisible_problem(w)) is not None:
                raise InputError(f"the word {why}", path=path, line=lineno,
                                 expected="visible characters only (KenLM and SRILM keep such a character inside the "
                                          "word, so it would never match the text's word)")
            if w in vocab:
                raise InputError(f"duplicate unigram {w!r}", path=path, line=lineno,
                                 expected="each word listed once")
            vocab[w] = len(vocab)
            ids_flat[0].append(vocab[w])
        else:
            try:
                ids_flat[n - 1].extend([vocab[w] for w in parts[1:n + 1]])
            except KeyError as e:
                raise InputError(f"word {e.args[0]!r} is not in the 1-grams", path=path, line=lineno,
                                 expected="n-grams over the listed unigrams") from None
        probs[n - 1].append(lp)
        bows[n - 1].append(bo)
        linenos[n - 1].append(lineno)
    raise InputError("the file ends early", path=path, line=last + 1, expected="'\\end\\'")


def _section_line(path: PathLike, lineno: int, line: str, n: int, counts: list[int],
                  probs: list[list[float]]) -> int:
    """Check a ``\\<k>-grams:`` or ``\\end\\`` line after section ``n`` (0: none yet) has been read; return the
    new section's order ``k``, or ``len(counts) + 1`` for ``\\end\\``."""
    order = len(counts)
    if n > 0 and len(probs[n - 1]) != counts[n - 1]:
        raise InputError(f"the {n}-grams section has {len(probs[n - 1])} entries but the header "
                         f"announces {counts[n - 1]}", path=path, line=lineno,
                         expected=f"{counts[n - 1]} {n}-grams")
    m = _SECTION.match(line)
    if m:
        k = int(m.group(1))
        if k != n + 1 or k > order:
            raise InputError(f"section {line!r} out of place", path=path, line=lineno,
                             expected=f"'\\{n + 1}-grams:'" if n < order else "'\\end\\'")
        return k
    if line == "\\end\\":
        if n != order:
            raise InputError("\\end\\ before all sections", path=path, line=lineno,
                             expected=f"'\\{n + 1}-grams:'")
        return order + 1
    raise InputError(f"unknown section {line[:40]!r}", path=path, line=lineno,
                     expected=f"'\\{n + 1}-grams:'" if n < order else "'\\end\\'")


def arpa_counts(path: PathLike) -> list[int]:
    """The n-gram counts announced in an ARPA file's header (reads only the header).

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "h.arpa"
    >>> _ = p.write_text("\\\\data\\\\\\nngram 1=2\\nngram 2=1\\n\\n\\\\1-grams:\\n")
    >>> arpa_counts(p)
    [2, 1]
    """
    counts: list[int] = []
    started = False
    for lineno, raw in iter_lines(path):
        line = raw.strip()
        if not started:
            if not line:
                continue
            if line != "\\data\\":
                raise InputError("not an ARPA file", path=path, line=lineno, expected="'\\data\\'")
            started = True
            continue
        m = _NGRAM_LINE.match(line)
        if m:
            counts.append(int(m.group(2)))
        elif line:
            break
    return counts
