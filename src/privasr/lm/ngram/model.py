"""Backoff n-gram language models (the ARPA model) and their query engine.

An :class:`NgramModel` holds, for every order ``n = 1..order``, the n-grams it lists with their log10
probability and log10 backoff weight, exactly as an ARPA file does. Queries follow the standard ARPA
backoff recursion (the one SRILM and KenLM use)::

    log10 p(w | h) = prob(h w)                       if the n-gram "h w" is listed
                   = backoff(h) + log10 p(w | h[1:])  otherwise (backoff(h) = 0 when h is not listed)

Histories longer than ``order - 1`` words are truncated. A word outside the vocabulary is scored as
``<unk>`` when the model has it (KenLM's convention) and gets ``-inf`` otherwise; either way it is flagged
as OOV in the :class:`~privasr.lm.base.SentenceScore`.

Storage: words get integer ids (their position in :attr:`NgramModel.vocab`); order 1 is indexed by id, and
the n-grams of order ``n > 1`` are one sorted ``int64`` array of keys ``index(prefix) * (V + 1) + id(last)``,
where ``index(prefix)`` is the prefix's row in order ``n - 1``. Rows are therefore in lexicographic id order,
every n-gram needs its prefix to be listed (as ARPA requires), and a lookup is one ``np.searchsorted``
per order.

Queries run on a compiled engine (the C extension ``privasr.lm.ngram._engine``, built at install time): on the
first query it builds one hash table per order ``n > 1`` from these keys to their rows, probabilities and
backoffs (two 32-byte slots per n-gram, beside the arrays' 24 bytes) and then scores a batch of token lists in
one call, reading word ids from the vocabulary dict. Its arithmetic is the numpy path's, operation for
operation, so both give the same float64 token scores and states (sentence totals agree to summation order).
Where the extension is not built (no C compiler at install time) every query takes the numpy path:
:meth:`NgramModel.score_batch` then looks up all tokens of all sentences at once, order by order.
:data:`QUERY_ENGINE` says which one is in use.

For decoders, :meth:`NgramModel.begin_state` / :attr:`NgramModel.advance` score word by word; states are
hashable tuples of word ids, truncated (like KenLM's) to the longest context the model lists, so equal states
always give equal future scores.

>>> m = NgramModel.from_entries(2, {
...     1: {("<s>",): (-99.0, -0.5), ("</s>",): (-0.5, 0.0), ("a",): (-0.4, -0.2), ("<unk>",): (-2.0, 0.0)},
...     2: {("<s>", "a"): (-0.1, 0.0), ("a", "</s>"): (-0.2, 0.0)}})
>>> m.order, m.vocab, "a" in m, "b" in m
(2, ('<s>', '</s>', 'a', '<unk>'), True, False)
>>> m.logprob("a", ["<s>"]), m.logprob("a", ["a"]), m.logprob("zz", [])
(-0.1, -0.6000000000000001, -2.0)
>>> s = m.score(["a", "b"])
>>> s.tokens, [round(x, 6) for x in s.logprobs.tolist()], s.oov.tolist()
(('a', 'b', '</s>'), [-0.1, -2.2, -0.5], [False, True, False])
>>> lp, st = m.advance(m.begin_state(), "a")
>>> lp, m.advance(st, "</s>")[0]
(-0.1, -0.2)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from itertools import repeat
from typing import Any

import numpy as np

from privasr.errors import InputError
from privasr.lm.base import BOS, EOS, UNK, SentenceScore
from privasr.lm.ngram.keyindex import KeyIndex

try:  # the compiled query engine (setup.py builds it where a C compiler is available)
    from privasr.lm.ngram._engine import Engine as _Engine
except ImportError:  # pragma: no cover - installs without a compiler
    _Engine = None

__all__ = ["NgramModel", "NgramState", "QUERY_ENGINE", "StructureError", "with_unk"]

QUERY_ENGINE = "compiled" if _Engine is not None else "numpy"
"""The query engine of this install: ``"compiled"`` (the C extension) or ``"numpy"`` (the fallback)."""

NgramState = tuple[int, ...]
"""A decoding state: the ids of the context words (oldest first), at most ``order - 1`` of them."""

_MAX_KEY = 2**62
_HASH_MIN_BATCH = 4096  # queries of one order in one call from which the hash index is used


class StructureError(InputError):
    """An n-gram table that breaks ARPA's structure (duplicate n-gram, missing prefix, unknown word).

    ``order`` and ``row`` say which input row (0-based, in the order given) is at fault, so readers can
    turn it into a file line.
    """

    def __init__(self, message: str, *, order: int, row: int, expected: str | None = None) -> None:
        super().__init__(message, expected=expected)
        self.order = order
        self.row = row


class NgramModel:
    """A backoff n-gram language model (implements :class:`privasr.lm.base.LanguageModel`).

    Build one with :meth:`from_entries`, :meth:`from_arrays`, :func:`privasr.lm.ngram.arpa.read_arpa` or
    :func:`privasr.lm.ngram.mkn.train_mkn`; the constructor itself is internal (ARPA files are written with
    :func:`privasr.lm.ngram.arpa.write_arpa`).
    """

    __slots__ = ("_order", "_vocab", "_ids", "_mult", "_keys", "_prob", "_bow", "_unk", "_bos", "_eos",
                 "_hashed", "_queried", "_engine", "advance")

    advance: Callable[[NgramState, str], tuple[float, NgramState]]
    """``advance(state, word)``: score ``word`` after ``state``; return ``(log10 prob, new state)``.

    Equal to :meth:`logprob` of the word given the words that led to ``state``; end a sentence with
    ``advance(state, "</s>")``. An OOV word without ``<unk>`` scores ``-inf`` and resets the state. An attribute,
    not a method: after the model's first query it is the compiled engine's own function (or the numpy path's
    :meth:`_advance_numpy`), so a word-by-word decoder pays no Python call around it.
    """

    def __init__(self, vocab: Sequence[str], keys: Sequence[np.ndarray], probs: Sequence[np.ndarray],
                 bows: Sequence[np.ndarray]) -> None:
        self._order = len(probs)
        self._vocab = tuple(vocab)
        self._ids = {w: i for i, w in enumerate(self._vocab)}
        if len(self._ids) != len(self._vocab):
            raise InputError("the vocabulary has duplicate words", expected="unique unigrams")
        self._mult = len(self._vocab) + 1
        self._keys = [np.asarray(k, dtype=np.int64) for k in keys]
        self._prob = [np.asarray(p, dtype=np.float64) for p in probs]
        self._bow = [np.asarray(b, dtype=np.float64) for b in bows]
        for a in (*self._keys, *self._prob, *self._bow):
            a.setflags(write=False)
        self._unk = self._ids.get(UNK, -1)
        self._bos = self._ids.get(BOS, -1)
        self._eos = self._ids.get(EOS, -1)
        self._reset_lookup()

    def _reset_lookup(self) -> None:
        # per order: a hash index of the keys (built once the batched queries of that order add up to its
        # size, so that building it costs less than the binary searches already done) and that running count
        self._hashed: list[KeyIndex | None] = [None] * self._order
        self._queried = [0] * self._order
        self._engine: Any = None  # the compiled engine, once the first query has built it; False: numpy path
        self.advance = self._advance_first

    def _compiled(self) -> Any:
        """The compiled engine over this model's arrays, or ``None`` for the numpy path. The choice is made
        once, at the model's first query: the engine where the extension is built and the order is at most 63
        (:meth:`_numpy_twin` gives a model on the numpy path)."""
        if self._engine is None:
            self._engine = False
            if _Engine is not None:
                try:
                    self._engine = _Engine(self._ids, self._keys, self._prob, self._bow, self._unk, self._bos)
                except ValueError:  # an order the engine does not support (over 63)
                    pass
            # a decoder calls advance once per word: on the engine it is the engine's own method, no wrapper
            self.advance = self._engine.advance if self._engine else self._advance_numpy
        return self._engine or None

    def _numpy_twin(self) -> NgramModel:
        """The same model (sharing its arrays) on the numpy query path: the compiled engine's oracle in the tests
        and its baseline in ``privasr bench ngram``."""
        twin = NgramModel(self._vocab, self._keys, self._prob, self._bow)
        twin._engine = False
        twin.advance = twin._advance_numpy
        return twin

    def __getstate__(self) -> dict[str, object]:
        """The model without its lookup indexes and query engine (rebuilt on demand)."""
        rebuilt = ("_hashed", "_queried", "_engine", "advance")
        return {k: getattr(self, k) for k in self.__slots__ if k not in rebuilt}

    def __setstate__(self, state: Mapping[str, object]) -> None:
        for k, v in state.items():
            object.__setattr__(self, k, v)
        self._reset_lookup()

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_arrays(cls, vocab: Sequence[str], ngrams: Sequence[np.ndarray], probs: Sequence[np.ndarray],
                    bows: Sequence[np.ndarray]) -> NgramModel:
        """Build a model from per-order arrays.

        Args:
            vocab: the unigram words; word ids are positions in it.
            ngrams: for order ``n = 1..N``, an ``(count_n, n)`` integer array of word ids (any row order);
                order 1 must be ``arange(len(vocab))[:, None]`` in some order covering every word once.
            probs: log10 probabilities per order, aligned with ``ngrams``.
            bows: log10 backoff weights per order (the highest order's are ignored and stored as 0).

        Raises:
            StructureError: a duplicate n-gram, an n-gram whose prefix is not listed, an id out of range.

        >>> m = NgramModel.from_arrays(["<s>", "a"], [np.array([[1], [0]]), np.array([[0, 1]])],
        ...                            [np.array([-1.0, -99.0]), np.array([-0.5])], [np.zeros(2), np.zeros(1)])
        >>> list(m.entries(1))
        [(('<s>',), -99.0, 0.0), (('a',), -1.0, 0.0)]
        >>> list(m.entries(2))
        [(('<s>', 'a'), -0.5, 0.0)]
        """
        if not (len(ngrams) == len(probs) == len(bows)) or not ngrams:
            raise InputError("ngrams, probs and bows need one array per order", expected="order >= 1")
        vocab = tuple(vocab)
        v = len(vocab)
        keys: list[np.ndarray] = []
        out_p: list[np.ndarray] = []
        out_b: list[np.ndarray] = []
        order = len(ngrams)
        for n in range(1, order + 1):
            ids, p, b = _checked_order(n, order, v, ngrams[n - 1], probs[n - 1], bows[n - 1])
            if n == 1:
                key, pp, bb = _unigram_rows(vocab, ids, p, b)
            else:
                if len(keys[-1]) * (v + 1) >= _MAX_KEY:
                    raise InputError(f"too many {n - 1}-grams for 64-bit keys", expected="a smaller model")
                key, perm = _ngram_keys(vocab, ids, keys)
                pp, bb = p[perm], b[perm]
            keys.append(key)
            out_p.append(pp)
            out_b.append(bb)
        return cls(vocab, keys, out_p, out_b)

    @classmethod
    def from_entries(cls, order: int,
                     entries: Mapping[int, Mapping[tuple[str, ...], tuple[float, float]]]) -> NgramModel:
        """A model from explicit ``{n: {words: (log10 prob, log10 backoff)}}`` for ``n = 1..order``.

        The vocabulary is the unigrams, in the mapping's order. Every n-gram's words must be unigrams and its
        prefix must be listed (as in an ARPA file); errors are :class:`InputError`.

        >>> m = NgramModel.from_entries(1, {1: {("a",): (-0.3, 0.0), ("</s>",): (-0.2, 0.0)}})
        >>> m.num_ngrams(1), m.logprob("a", ["a"])
        (2, -0.3)
        """
        if not isinstance(order, int) or order < 1:
            raise InputError(f"order {order!r}", expected="an integer >= 1")
        extra = sorted(set(entries) - set(range(1, order + 1)))
        if extra:
            raise InputError(f"entries for order {extra[0]} in an order-{order} model", expected=f"1..{order}")
        vocab: list[str] = []
        for w in entries.get(1, {}):
            if len(w) != 1:
                raise InputError(f"unigram key {w!r}", expected="a 1-tuple of a word")
            vocab.append(w[0])
        ids = {w: i for i, w in enumerate(vocab)}
        ngrams, probs, bows = [], [], []
        for n in range(1, order + 1):
            table = entries.get(n, {})
            rows = np.zeros((len(table), n), dtype=np.int64)
            p = np.zeros(len(table))
            b = np.zeros(len(table))
            for r, (words, val) in enumerate(table.items()):
                if len(words) != n:
                    raise InputError(f"{n}-gram key {words!r} has {len(words)} words", expected=f"{n} words")
                try:
                    rows[r] = [ids[w] for w in words]
                except KeyError as e:
                    raise InputError(f"{n}-gram {' '.join(words)!r} uses {e.args[0]!r}, which is not a unigram",
                                     expected="words listed in the 1-grams") from None
                try:
                    lp, bo = float(val[0]), float(val[1])
                except (TypeError, ValueError, IndexError):
                    raise InputError(f"{n}-gram {' '.join(words)!r} has value {val!r}",
                                     expected="(log10 prob, log10 backoff)") from None
                if math.isnan(lp) or lp > 0 or math.isnan(bo) or math.isinf(bo):
                    raise InputError(f"{n}-gram {' '.join(words)!r} has ({lp!r}, {bo!r})",
                                     expected="log10 prob <= 0 and a finite log10 backoff")
                p[r], b[r] = lp, bo
            ngrams.append(rows)
            probs.append(p)
            bows.append(b)
        return cls.from_arrays(vocab, ngrams, probs, bows)

    # ------------------------------------------------------------------ inspection

    @property
    def order(self) -> int:
        """The highest n-gram order."""
        return self._order

    @property
    def vocab(self) -> tuple[str, ...]:
        """The unigram words in id order (including ``<s>``, ``</s>`` and ``<unk>`` when listed)."""
        return self._vocab

    def __contains__(self, word: object) -> bool:
        return word in self._ids

    def __len__(self) -> int:
        return len(self._vocab)

    def __repr__(self) -> str:
        counts = ", ".join(str(len(p)) for p in self._prob)
        return f"NgramModel(order={self._order}, ngrams=[{counts}])"

    def word_id(self, word: str) -> int:
        """The id of ``word``; ``<unk>``'s id for other words, or ``-1`` when there is no ``<unk>``."""
        return self._ids.get(word, self._unk)

    def num_ngrams(self, n: int) -> int:
        """How many n-grams of order ``n`` the model lists."""
        self._check_n(n)
        return len(self._prob[n - 1])

    def _check_n(self, n: int) -> None:
        if not 1 <= n <= self._order:
            raise InputError(f"order {n} is outside the model", expected=f"1..{self._order}")

    def ngram_ids(self, n: int) -> np.ndarray:
        """The word ids of the order-``n`` n-grams as an ``(count, n)`` array, in :meth:`entries` order."""
        self._check_n(n)
        if n == 1:
            return self._keys[0][:, None].copy()
        prev = self.ngram_ids(n - 1)
        k = self._keys[n - 1]
        return np.concatenate([prev[k // self._mult], (k % self._mult)[:, None]], axis=1)

    def structure(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``(prefix_row, last_id)`` of the order-``n`` n-grams: the row of each n-gram's first ``n - 1`` words in
        order ``n - 1`` (in :meth:`entries` order) and the id of its last word. For ``n = 1`` the prefix rows are -1.

        >>> m = NgramModel.from_entries(2, {1: {("a",): (-0.3, 0.0), ("b",): (-0.3, 0.0)},
        ...                                 2: {("b", "a"): (-0.1, 0.0)}})
        >>> [x.tolist() for x in m.structure(2)]
        [[1], [0]]
        """
        self._check_n(n)
        k = self._keys[n - 1]
        if n == 1:
            return np.full(len(k), -1, dtype=np.int64), k.copy()
        return k // self._mult, k % self._mult

    def arrays(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(ids, log10 probs, log10 backoffs)`` of order ``n`` (read-only arrays, :meth:`entries` order)."""
        return self.ngram_ids(n), self._prob[n - 1], self._bow[n - 1]

    def entries(self, n: int) -> Iterator[tuple[tuple[str, ...], float, float]]:
        """``(words, log10 prob, log10 backoff)`` of every order-``n`` n-gram, in the order ARPA files list them
        here (unigrams in vocabulary order, longer n-grams in lexicographic order of word ids)."""
        ids, p, b = self.arrays(n)
        voc = self._vocab
        for row, lp, bo in zip(ids.tolist(), p.tolist(), b.tolist(), strict=True):
            yield tuple(voc[i] for i in row), lp, bo

    # ------------------------------------------------------------------ scalar queries

    def _index(self, ids: Sequence[int]) -> int:
        """Row of the n-gram ``ids`` in its order's table, or -1 when not listed."""
        if not ids or len(ids) > self._order:
            return -1
        idx = ids[0]
        if idx < 0:
            return -1
        for j in range(1, len(ids)):
            w = ids[j]
            if w < 0:
                return -1
            keys = self._keys[j]
            k = idx * self._mult + w
            pos = int(np.searchsorted(keys, k))
            if pos >= len(keys) or keys[pos] != k:
                return -1
            idx = pos
        return idx

    def _logprob_ids(self, w: int, hist: Sequence[int]) -> float:
        if w < 0:
            return -math.inf
        hist = tuple(hist[max(0, len(hist) - (self._order - 1)):]) if self._order > 1 else ()
        total = 0.0
        for start in range(len(hist) + 1):
            ctx = hist[start:]
            i = self._index((*ctx, w))
            if i >= 0:
                return total + float(self._prob[len(ctx)][i])
            c = self._index(ctx)
            if c >= 0:
                total += float(self._bow[len(ctx) - 1][c])
        return -math.inf

    def logprob(self, word: str, history: Sequence[str]) -> float:
        """log10 P(word | history) with ARPA backoff (history oldest first; ``<s>`` is an ordinary word).

        >>> m = NgramModel.from_entries(1, {1: {("a",): (-0.3, 0.0)}})
        >>> m.logprob("b", [])
        -inf
        """
        return self._logprob_ids(self.word_id(word), [self.word_id(h) for h in history])

    def begin_state(self) -> NgramState:
        """The state after ``<s>`` (the empty state if the model has no ``<s>``)."""
        return self._truncate((self._bos,)) if self._bos >= 0 else ()

    def null_state(self) -> NgramState:
        """The empty context (scoring without ``<s>``)."""
        return ()

    def _truncate(self, ctx: tuple[int, ...]) -> NgramState:
        ctx = ctx[max(0, len(ctx) - (self._order - 1)):] if self._order > 1 else ()
        for start in range(len(ctx)):
            if self._index(ctx[start:]) >= 0:
                return ctx[start:]
        return ()

    def _advance_first(self, state: NgramState, word: str) -> tuple[float, NgramState]:
        self._compiled()  # picks the query path and sets advance to it
        return self.advance(state, word)

    def _advance_numpy(self, state: NgramState, word: str) -> tuple[float, NgramState]:
        """:attr:`advance` on the numpy path (the compiled engine's ``advance`` gives the same results)."""
        w = self.word_id(word)
        lp = self._logprob_ids(w, state)
        return lp, (self._truncate((*state, w)) if w >= 0 else ())

    # ------------------------------------------------------------------ vectorised scoring

    def score(self, words: Sequence[str], *, bos: bool = True, eos: bool = True) -> SentenceScore:
        """Score one sentence (see :mod:`privasr.lm.base` for the conventions)."""
        return self.score_batch([words], bos=bos, eos=eos)[0]

    def score_batch(self, sentences: Sequence[Sequence[str]], *, bos: bool = True,
                    eos: bool = True) -> list[SentenceScore]:
        """Score many sentences at once (one call of the compiled engine; on the numpy path every order is looked
        up for all tokens at once)."""
        sents = [s if isinstance(s, tuple) else tuple(s) for s in sentences]
        if not sents:
            return []
        engine = self._compiled()
        if engine is not None:
            lens = np.fromiter(map(len, sents), dtype=np.int64, count=len(sents)) + (1 if eos else 0)
            logprobs = np.empty(int(lens.sum()))
            oov = np.empty(len(logprobs), dtype=bool)
            engine.score(sents, bos, EOS if eos else None, np.empty(len(sents)), None, logprobs, oov)
        else:
            logprobs, oov, lens = self._score_sentences(sents, bos, eos)
        logprobs.setflags(write=False)  # every sentence's scores are a read-only slice of these
        oov.setflags(write=False)
        out = []
        lo = 0
        extra = (EOS,) if eos else ()
        for s, n in zip(sents, lens.tolist(), strict=True):
            out.append(SentenceScore._trusted(s + extra, logprobs[lo:lo + n], oov[lo:lo + n]))
            lo += n
        return out

    def score_totals(self, sentences: Sequence[Sequence[str]], *, bos: bool = True, eos: bool = True
                     ) -> tuple[np.ndarray, np.ndarray]:
        """Fast path for rescoring: per sentence, the log10 total (OOVs scored as ``<unk>``, like
        :meth:`SentenceScore.total`) and the number of OOV tokens, without building :class:`SentenceScore`\\ s.

        >>> m = NgramModel.from_entries(1, {1: {("a",): (-0.3, 0.0), ("</s>",): (-0.2, 0.0), ("<unk>",): (-1, 0)}})
        >>> tot, oov = m.score_totals([["a"], ["a", "zz"]])
        >>> [round(x, 6) for x in tot.tolist()], oov.tolist()
        ([-0.5, -1.5], [0, 1])
        """
        if not len(sentences):
            return np.zeros(0), np.zeros(0, dtype=np.int64)
        engine = self._compiled()
        if engine is not None:
            totals, oovs = np.empty(len(sentences)), np.empty(len(sentences), dtype=np.int64)
            engine.score(sentences, bos, EOS if eos else None, totals, oovs, None, None)
            return totals, oovs
        logprobs, oov, lens = self._score_sentences(sentences, bos, eos)
        starts = np.cumsum(lens) - lens
        nonempty = lens > 0
        totals = np.zeros(len(lens))
        oovs = np.zeros(len(lens), dtype=np.int64)
        if nonempty.any():
            totals[nonempty] = np.add.reduceat(logprobs, starts[nonempty])
            oovs[nonempty] = np.add.reduceat(oov.astype(np.int64), starts[nonempty])
        return totals, oovs

    def _score_sentences(self, sents: Sequence[Sequence[str]], bos: bool, eos: bool
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """log10 probs and OOV flags of every predicted token (flat), and the number of tokens per sentence."""
        flat: list[str] = []
        lens = np.fromiter((len(s) for s in sents), dtype=np.int64, count=len(sents))
        for s in sents:
            if bos:
                flat.append(BOS)
            flat.extend(s)
            if eos:
                flat.append(EOS)
        ids = np.fromiter(map(self._ids.get, flat, repeat(-1)), dtype=np.int64, count=len(flat))
        del flat
        span = lens + (1 if bos else 0) + (1 if eos else 0)
        missing = ids < 0
        sentinel = len(self._vocab)  # an id that matches nothing
        ids[missing] = self._unk if self._unk >= 0 else sentinel
        if bos:
            ids[np.cumsum(span) - span] = self._bos if self._bos >= 0 else sentinel
        logprobs = self._score_flat(ids, span, bos)
        if bos:
            keep = np.ones(len(ids), dtype=bool)
            keep[np.cumsum(span) - span] = False
            return logprobs[keep], missing[keep], span - 1
        return logprobs, missing, span

    def _score_flat(self, ids: np.ndarray, lens: np.ndarray, bos: bool) -> np.ndarray:
        """log10 probs of every token of concatenated sentences (first token of each is context if ``bos``)."""
        total = len(ids)
        order = self._order
        mult = self._mult
        v = len(self._vocab)
        starts = np.repeat(np.cumsum(lens) - lens, lens)
        pos = np.arange(total, dtype=np.int64) - starts  # number of earlier tokens in the sentence
        valid_word = ids < v
        # idx[n-1][t]: row of the n-gram ending at t (words t-n+1..t), -1 when absent
        idx = [np.where(valid_word, ids, -1)]
        for n in range(2, order + 1):
            prev = np.full(total, -1, dtype=np.int64)
            prev[1:] = idx[-1][:-1]
            ok = (pos >= n - 1) & (prev >= 0) & valid_word
            cur = np.full(total, -1, dtype=np.int64)
            if ok.any() and len(self._keys[n - 1]):
                cur[ok] = self._rows(n, prev[ok] * mult + ids[ok])
            idx.append(cur)
        # longest listed n-gram ending at each token
        nstar = np.zeros(total, dtype=np.int64)
        lp = np.full(total, -np.inf)
        for n in range(1, order + 1):
            hit = idx[n - 1] >= 0
            nstar[hit] = n
            lp[hit] = self._prob[n - 1][idx[n - 1][hit]]
        # add backoffs of the contexts (length m, ending at t-1) longer than the one used: m >= nstar
        for m in range(1, order):
            ctx = np.full(total, -1, dtype=np.int64)
            ctx[1:] = idx[m - 1][:-1]
            use = (pos >= m) & (ctx >= 0) & (m >= nstar) & (nstar > 0)
            if use.any():
                lp[use] += self._bow[m - 1][ctx[use]]
        return lp


    def _rows(self, n: int, k: np.ndarray) -> np.ndarray:
        """Rows of the order-``n`` keys ``k`` (``-1`` where not listed): by binary search, or, for a large batch,
        through the order's hash index once the queries of that order add up to its number of keys (a probe
        round costs a few numpy calls, so small batches are faster by binary search)."""
        keys = self._keys[n - 1]
        if len(k) >= _HASH_MIN_BATCH:
            hashed = self._hashed[n - 1]
            if hashed is None:
                self._queried[n - 1] += len(k)
                if self._queried[n - 1] >= len(keys):
                    hashed = self._hashed[n - 1] = KeyIndex(keys)
            if hashed is not None:
                return hashed.lookup(k)
        p = np.searchsorted(keys, k)
        pc = np.minimum(p, len(keys) - 1)
        return np.where((p < len(keys)) & (keys[pc] == k), p, -1)


def _checked_order(n: int, order: int, v: int, ngrams: np.ndarray, probs: np.ndarray, bows: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Order ``n``'s ids (``(count, n)``), log10 probabilities and backoffs (0 at the highest order) as arrays,
    their shapes and word ids checked."""
    ids = np.asarray(ngrams, dtype=np.int64)
    if ids.ndim == 1 and n == 1:
        ids = ids[:, None]
    p = np.asarray(probs, dtype=np.float64)
    b = np.asarray(bows, dtype=np.float64) if n < order else np.zeros(len(p))
    if ids.ndim != 2 or ids.shape[1] != n or p.shape != (len(ids),) or b.shape != (len(ids),):
        raise InputError(f"order {n}: arrays of mismatched shapes",
                         expected=f"({len(ids)}, {n}) ids and {len(ids)} probs/backoffs")
    bad = np.flatnonzero((ids < 0) | (ids >= v))
    if len(bad):
        row = int(bad[0] // n)
        raise StructureError(f"word id {int(ids.flat[bad[0]])} out of range", order=n, row=row,
                             expected=f"ids in [0, {v})")
    return ids, p, b


def _unigram_rows(vocab: tuple[str, ...], ids: np.ndarray, p: np.ndarray, b: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Order 1's keys (the word ids), probabilities and backoffs in id order; every word listed exactly once."""
    v = len(vocab)
    k = ids[:, 0]
    if len(k) != v or len(np.unique(k)) != v:
        seen = np.zeros(v, dtype=bool)
        for r, i in enumerate(k.tolist()):
            if seen[i]:
                raise StructureError(f"duplicate unigram {vocab[i]!r}", order=1, row=r)
            seen[i] = True
        missing = int(np.flatnonzero(~seen)[0])
        raise StructureError(f"vocabulary word {vocab[missing]!r} has no unigram", order=1,
                             row=len(k), expected="one unigram per vocabulary word")
    pp = np.empty(v)
    bb = np.empty(v)
    pp[k] = p
    bb[k] = b
    return np.arange(v, dtype=np.int64), pp, bb


def _ngram_keys(vocab: tuple[str, ...], ids: np.ndarray, keys: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The sorted keys ``index(prefix) * (V + 1) + id(last)`` of the n-grams ``ids`` (order ``n > 1``, the
    lower orders' sorted keys in ``keys``) and the permutation that sorts the rows; every prefix must be listed
    and no n-gram twice."""
    n = ids.shape[1]
    mult = len(vocab) + 1
    idx = ids[:, 0].copy()
    for j in range(1, n - 1):
        kk = idx * mult + ids[:, j]
        pos = np.searchsorted(keys[j], kk)
        pos_c = np.minimum(pos, max(len(keys[j]) - 1, 0))
        ok = (pos < len(keys[j])) & (keys[j][pos_c] == kk) if len(keys[j]) else np.zeros(len(kk), bool)
        if not ok.all():
            r = int(np.flatnonzero(~ok)[0])
            words = " ".join(vocab[i] for i in ids[r])
            pre = " ".join(vocab[i] for i in ids[r, : j + 1])
            raise StructureError(f"{n}-gram {words!r} has no lower-order prefix {pre!r}", order=n,
                                 row=r, expected=f"every n-gram's prefix listed in the {j + 1}-grams")
        idx = pos
    key = idx * mult + ids[:, n - 1]
    perm = np.argsort(key, kind="stable")
    key = key[perm]
    dup = np.flatnonzero(key[1:] == key[:-1])
    if len(dup):
        r = int(perm[dup + 1].min())
        words = " ".join(vocab[i] for i in ids[r])
        raise StructureError(f"duplicate {n}-gram {words!r}", order=n, row=r,
                             expected="each n-gram listed once")
    return key, perm


def with_unk(model: NgramModel, logprob: float = -100.0) -> NgramModel:
    """The model with an ``<unk>`` unigram of ``logprob`` (backoff 0) added if it has none: what KenLM does when it
    loads an ARPA file without ``<unk>`` ("Substituting log10 probability -100"). A model with ``<unk>`` is
    returned as it is.

    >>> m = NgramModel.from_entries(1, {1: {("a",): (-0.3, 0.0), ("</s>",): (-0.3, 0.0)}})
    >>> with_unk(m).logprob("zz", []), with_unk(m).vocab[-1]
    (-100.0, '<unk>')
    """
    if UNK in model:
        return model
    order = model.order
    ids = [model.ngram_ids(n) for n in range(1, order + 1)]
    probs = [np.asarray(model.arrays(n)[1]) for n in range(1, order + 1)]
    bows = [np.asarray(model.arrays(n)[2]) for n in range(1, order + 1)]
    v = len(model.vocab)
    ids[0] = np.concatenate([ids[0], np.array([[v]], dtype=ids[0].dtype)])
    probs[0] = np.concatenate([probs[0], [float(logprob)]])
    bows[0] = np.concatenate([bows[0], [0.0]])
    return NgramModel.from_arrays([*model.vocab, UNK], ids, probs, bows)
