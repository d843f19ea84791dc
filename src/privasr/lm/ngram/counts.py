r"""Vectorised n-gram counting for Kneser-Ney estimation, with KenLM ``lmplz``'s conventions.

Sentences become one flat ``int`` array ``<s> w1 .. wk </s> <s> ...``; word ids are KenLM's: ``<unk>`` 0,
``<s>`` 1, ``</s>`` 2, then words in order of first appearance. Tokens spelled ``<s>``, ``</s>`` or ``<unk>``
in the text are dropped (lmplz treats them as whitespace); an empty sentence still counts as ``<s> </s>``.

The n-grams of order ``n`` are the length-``n`` windows of each sentence (so only the first word can be
``<s>``: lmplz's padded windows ``<s> <s> ...`` collapse to these). Order by order, each window gets the
*type index* of the pair ``(type of its (n-1)-word prefix, last word)`` with one ``np.unique`` over ``int64``
keys ``prefix * (V + 1) + word``; sorted keys are then lexicographic in word ids, exactly the layout of
:class:`~privasr.lm.ngram.model.NgramModel`'s tables. Nothing loops over n-grams in Python.

Counts (Chen & Goodman; KenLM ``adjust_counts.cc``): the highest order keeps raw counts; a lower-order
n-gram gets its *continuation* count, the number of distinct words seen before it, except n-grams that start
with ``<s>`` (nothing can precede them), which keep their raw counts. ``<s>`` and ``<unk>`` have count 0.

>>> c = count_ngrams([["a", "b"], ["a"]], 2)
>>> c.vocab
('<unk>', '<s>', '</s>', 'a', 'b')
>>> c.table(2)
[(('<s>', 'a'), 2), (('a', '</s>'), 1), (('a', 'b'), 1), (('b', '</s>'), 1)]
>>> c.table(1)   # continuation counts: a follows only <s>; </s> follows a and b
[(('<unk>',), 0), (('<s>',), 0), (('</s>',), 2), (('a',), 1), (('b',), 1)]
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from privasr.corpus.textio import PathLike, iter_lines
from privasr.errors import InputError, InputWarning
from privasr.lm.base import BOS, EOS, UNK

__all__ = ["NgramCounts", "OrderCounts", "count_ngrams", "tokenize_line", "read_sentences", "check_training_text", "UNK_ID", "BOS_ID",
           "EOS_ID"]

UNK_ID, BOS_ID, EOS_ID = 0, 1, 2
_SPECIAL = (UNK, BOS, EOS)
_SPECIAL_SET = frozenset(_SPECIAL)
_DELIMS = re.compile(r"[ \t\r\x00]+")


def check_training_text(sents: list[list[str]], path: PathLike, *, skip_symbols: bool = False) -> list[list[str]]:
    """lmplz's rule for ``<s>``, ``</s>`` and ``<unk>`` in training text: an error at the first one (file:line),
    or with ``skip_symbols`` (lmplz ``--skip_symbols``) one warning and every one read as whitespace.

    >>> check_training_text([["a", "b"]], "t.txt")
    [['a', 'b']]
    >>> check_training_text([["a"], ["<s>", "b"]], "t.txt")
    Traceback (most recent call last):
    ...
    privasr.errors.InputError: t.txt:2: special word <s> in the training text, as lmplz refuses it (expected text without <s>, </s> or <unk>; --skip-symbols reads them as whitespace, as lmplz --skip_symbols does)
    """
    for k, sent in enumerate(sents, start=1):
        if _SPECIAL_SET.isdisjoint(sent):
            continue
        word = next(w for w in sent if w in _SPECIAL_SET)
        if not skip_symbols:
            raise InputError(f"special word {word} in the training text, as lmplz refuses it", path=path, line=k,
                             expected="text without <s>, </s> or <unk>; --skip-symbols reads them as whitespace, "
                                      "as lmplz --skip_symbols does")
        warnings.warn(f"{word} appears in the input ({path}:{k}). All instances of <s>, </s>, and <unk> will be "
                      "interpreted as whitespace.", InputWarning, stacklevel=2)
        return [[w for w in s if w not in _SPECIAL_SET] for s in sents]
    return sents


def tokenize_line(line: str) -> list[str]:
    """Split a line into tokens exactly as lmplz does (on spaces, tabs, ``\\r`` and NUL only).

    >>> tokenize_line(" a\\tb  c\\u00a0d ")
    ['a', 'b', 'c\\xa0d']
    """
    return [t for t in _DELIMS.split(line) if t]


def read_sentences(path: PathLike) -> Iterator[list[str]]:
    """The sentences of a text file (one per line, lmplz tokenisation; ``.gz``/``.xz``/``.bz2`` welcome)."""
    for _, line in iter_lines(path):
        yield tokenize_line(line)


@dataclass
class OrderCounts:
    """The n-gram types of one order.

    Attributes:
        keys: sorted ``int64`` keys ``prefix_type * (V + 1) + last_word`` (for order 1: the word ids).
        raw: raw occurrence counts.
        count: the counts KN uses (continuation counts below the highest order, raw counts at it).
        suffix: type index of each n-gram's suffix (its last ``n - 1`` words) in the order below.
        first: the first word id of each n-gram (emptied once the counts are final).
    """

    keys: np.ndarray
    raw: np.ndarray
    count: np.ndarray
    suffix: np.ndarray
    first: np.ndarray


@dataclass
class NgramCounts:
    """Counts of every order, as :func:`count_ngrams` makes them."""

    vocab: tuple[str, ...]
    orders: list[OrderCounts]
    tokens: int  #: words counted (without ``<s>``/``</s>``), lmplz's "Unigram tokens"
    sentences: int
    extra: dict[str, int] = field(default_factory=dict)

    @property
    def order(self) -> int:
        return len(self.orders)

    @property
    def mult(self) -> int:
        """The key multiplier ``V + 1``."""
        return len(self.vocab) + 1

    def ids(self, n: int) -> np.ndarray:
        """``(types, n)`` word ids of order ``n``, in key order."""
        if n == 1:
            return self.orders[0].keys[:, None].astype(np.int64)
        prev = self.ids(n - 1)
        k = self.orders[n - 1].keys
        return np.concatenate([prev[k // self.mult], (k % self.mult)[:, None]], axis=1)

    def table(self, n: int) -> list[tuple[tuple[str, ...], int]]:
        """``[(words, count)]`` of order ``n`` (for inspection and tests; not for big corpora)."""
        voc = self.vocab
        return [(tuple(voc[i] for i in row), int(c))
                for row, c in zip(self.ids(n).tolist(), self.orders[n - 1].count.tolist(), strict=True)]


def _encode(sentences: Iterable[Sequence[str]], vocab: Collection[str] | None
            ) -> tuple[tuple[str, ...], np.ndarray, np.ndarray]:
    toks: list[str] = []
    lens: list[int] = []
    for k, s in enumerate(sentences):
        if isinstance(s, str):
            raise InputError(f"sentence {k} is a string", expected="a sequence of tokens (split the line first)")
        toks.extend(s)
        lens.append(len(s))
    seen = dict.fromkeys(toks)  # words in order of first appearance (C speed)
    words = list(_SPECIAL)
    mapping: dict[str, int] = {UNK: -1, BOS: -1, EOS: -1}
    if vocab is None:
        for w in seen:
            if w not in mapping:
                mapping[w] = len(words)
                words.append(w)
    else:
        allowed = set(vocab) - set(_SPECIAL)
        for w in seen:
            if w in mapping:
                continue
            if w in allowed:
                mapping[w] = len(words)
                words.append(w)
            else:
                mapping[w] = UNK_ID
        extra = [w for w in (vocab if isinstance(vocab, Sequence) else sorted(vocab))
                 if w not in mapping and w not in _SPECIAL]
        for w in dict.fromkeys(extra):
            mapping[w] = len(words)
            words.append(w)
    ids = np.fromiter(map(mapping.__getitem__, toks), dtype=np.int64, count=len(toks))
    lens_a = np.asarray(lens, dtype=np.int64)
    drop = ids < 0
    if drop.any():
        sent = np.repeat(np.arange(len(lens_a)), lens_a)
        lens_a = lens_a - np.bincount(sent[drop], minlength=len(lens_a))
        ids = ids[~drop]
    return tuple(words), ids, lens_a


def count_ngrams(sentences: Iterable[Sequence[str]], order: int, *, vocab: Collection[str] | None = None
                 ) -> NgramCounts:
    """Count the n-grams of orders ``1..order`` of tokenised sentences (see the module docstring).

    Args:
        sentences: token sequences (one per sentence, without ``<s>``/``</s>``).
        order: the highest order (>= 1).
        vocab: if given, words outside it become ``<unk>``; vocabulary words absent from the text are added as
            unigrams with count 0 (after the seen words, in the collection's order, or sorted for sets).
    """
    if not isinstance(order, int) or isinstance(order, bool) or order < 1:
        raise InputError(f"order {order!r}", expected="an integer >= 1")
    words, ids, lens = _encode(sentences, vocab)
    v = len(words)
    mult = v + 1
    n_sent = len(lens)
    tokens = int(lens.sum())
    span = lens + 2
    total = int(span.sum())
    starts = np.cumsum(span) - span
    seq = np.full(total, -1, dtype=np.int64)
    seq[starts] = BOS_ID
    seq[starts + lens + 1] = EOS_ID
    seq[seq < 0] = ids
    del ids
    pos = np.arange(total, dtype=np.int64) - np.repeat(starts, span)
    del starts

    orders: list[OrderCounts] = []
    # order 1: every vocabulary word is a type
    word_pos = pos >= 1
    raw1 = np.bincount(seq[word_pos], minlength=v).astype(np.int64)
    del word_pos
    first1 = np.arange(v, dtype=np.int64)
    orders.append(OrderCounts(keys=first1.copy(), raw=raw1, count=raw1,
                              suffix=np.zeros(v, dtype=np.int64), first=first1))
    idx_prev = seq  # type index of the window of the previous order ending at each position
    for n in range(2, order + 1):
        t = np.flatnonzero(pos >= n - 1)
        if len(orders[-1].keys) * mult >= 2**62:
            raise InputError(f"too many {n - 1}-grams for 64-bit keys", expected="a smaller corpus or order")
        key = idx_prev[t - 1] * mult + seq[t]
        uniq, first_at, inv, raw = np.unique(key, return_index=True, return_inverse=True, return_counts=True)
        del key
        rep = t[first_at]
        suffix = idx_prev[rep]  # the (n-1)-window ending at the same position
        first = orders[-1].first[uniq // mult]
        raw = raw.astype(np.int64, copy=False)
        orders.append(OrderCounts(keys=uniq, raw=raw, count=raw, suffix=suffix, first=first))
        if n < order:
            idx = np.full(total, -1, dtype=np.int64)
            idx[t] = inv.reshape(-1)
            idx_prev = idx
        del t, inv, first_at, rep
    # continuation counts below the highest order
    for n in range(1, order):
        cont = np.bincount(orders[n].suffix, minlength=len(orders[n - 1].keys)).astype(np.int64)
        oc = orders[n - 1]
        if n == 1:
            cont[BOS_ID] = 0
        else:
            bos_first = oc.first == BOS_ID
            cont[bos_first] = oc.raw[bos_first]
        oc.count = cont
    for oc in orders:
        oc.first = oc.first[:0]  # only needed above
    if order == 1:
        orders[0].count[BOS_ID] = 0
    return NgramCounts(vocab=words, orders=orders, tokens=tokens, sentences=n_sent)
