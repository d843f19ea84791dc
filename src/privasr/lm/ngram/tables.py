"""Numpy tables of a backoff (ARPA) n-gram model: whole distributions and exact backoff renormalisation.

:class:`NgramTables` holds a backoff model as arrays indexed by word ids (per-order n-gram ids, log10
probabilities and backoffs, and the successor lists of every history), so that a history's full distribution
over the vocabulary is one vectorised computation. Interpolation (:mod:`privasr.lm.mix`), class-LM expansion
(:mod:`privasr.lm.ngram.class_lm`) and fast marginal adaptation (:mod:`privasr.lm.adapt.fma`) build on it;
:func:`recompute_backoffs` gives every history the backoff weight that makes its distribution sum to 1.

>>> t = NgramTables.from_entries(2, {1: {("<s>",): (-99.0, 0.0), ("a",): (-0.30103, 0.0), ("</s>",): (-0.30103, 0.0)},
...                                 2: {("<s>", "a"): (-0.1, 0.0), ("a", "</s>"): (-0.2, 0.0)}})
>>> bo = recompute_backoffs(t, t.lp)
>>> [round(float((10 ** t.distribution(h, bo=bo)).sum()), 6) for h in (["<s>"], ["a"], [])]
[1.0, 1.0, 1.0]
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from privasr.errors import InputError
from privasr.lm.base import BOS, UNK

if TYPE_CHECKING:
    from privasr.lm.ngram.model import NgramModel

__all__ = ["NgramTables", "recompute_backoffs", "unigram_mass", "synthetic_model", "Entries"]

Entries = Mapping[int, Mapping[tuple[str, ...], tuple[float, float]]]
"""N-gram entries as ``NgramModel.from_entries`` takes them: ``{n: {words: (log10 prob, log10 backoff)}}``."""

_NEG_INF = -math.inf


class NgramTables:
    """Numpy arrays of a backoff (ARPA) n-gram model, indexed by word ids.

    Word ids follow the order of the unigrams. For each order ``n`` (1..``order``): ``keys[n]`` (id tuples),
    ``index[n]`` (id tuple -> row), ``lp[n]`` and ``bo[n]`` (log10 probability and backoff weight, float64),
    ``word[n]`` (last word id of each row) and ``hist[n]`` (row of the history, the first n-1 words, in order
    n-1; -1 when that history is not an (n-1)-gram, and 0 for n = 1, the empty history). Successors of each
    history are available through :meth:`successors`.

    The model's semantics are the usual ARPA backoff: p(w|h) = p*(h w) if h w is listed, else
    bow(h) p(w|h[1:]) with bow(h) = 1 when h is not listed. ``<s>`` is never predicted: it is left out of every
    sum and :meth:`distribution` gives it -inf.

    >>> t = NgramTables.from_entries(1, {1: {("a",): (-0.30103, 0.0), ("b",): (-0.30103, 0.0)}})
    >>> t.vocab, t.logprob(["a"], "b")
    (('a', 'b'), -0.30103)
    """

    def __init__(self, order: int, vocab: Sequence[str], keys: Mapping[int, Sequence[tuple[int, ...]]],
                 lp: Mapping[int, np.ndarray], bo: Mapping[int, np.ndarray]) -> None:
        if order < 1:
            raise InputError(f"n-gram order {order}", expected="an order >= 1")
        self.order = int(order)
        self.vocab: tuple[str, ...] = tuple(vocab)
        self.wid: dict[str, int] = {w: i for i, w in enumerate(self.vocab)}
        self.bos_id: int = self.wid.get(BOS, -1)
        self.unk_id: int = self.wid.get(UNK, -1)
        self.keys: dict[int, list[tuple[int, ...]]] = {}
        self.index: dict[int, dict[tuple[int, ...], int]] = {}
        self.lp: dict[int, np.ndarray] = {}
        self.bo: dict[int, np.ndarray] = {}
        self.word: dict[int, np.ndarray] = {}
        self.hist: dict[int, np.ndarray] = {}
        for n in range(1, self.order + 1):
            k = list(keys.get(n, ()))
            self.keys[n] = k
            self.index[n] = {key: i for i, key in enumerate(k)}
            if len(self.index[n]) != len(k):
                raise InputError(f"duplicate {n}-grams", expected="each n-gram once")
            self.lp[n] = np.asarray(lp.get(n, np.zeros(0)), dtype=np.float64).copy()
            self.bo[n] = np.asarray(bo.get(n, np.zeros(0)), dtype=np.float64).copy()
            if self.lp[n].shape != (len(k),) or self.bo[n].shape != (len(k),):
                raise InputError(f"{n}-gram arrays do not match the keys", expected="one value per n-gram")
            self.word[n] = np.fromiter((key[-1] for key in k), dtype=np.int64, count=len(k))
            if n == 1:
                self.hist[n] = np.zeros(len(k), dtype=np.int64)
            else:
                prev = self.index[n - 1]
                self.hist[n] = np.fromiter((prev.get(key[:-1], -1) for key in k), dtype=np.int64, count=len(k))
        if [key[0] for key in self.keys[1]] != list(range(len(self.vocab))):
            raise InputError("unigrams must list the vocabulary in id order", expected="one unigram per word")
        self._succ: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._lower_paths: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                           np.ndarray]] = {}

    # ------------------------------------------------------------------------------------ builders
    @classmethod
    def from_entries(cls, order: int, entries: Entries) -> NgramTables:
        """Tables from ``{n: {words: (log10 prob, log10 backoff)}}`` (unigrams define the vocabulary order).

        Every n-gram's words must be unigrams.
        """
        uni = list(entries.get(1, {}))
        vocab = [k[0] for k in uni]
        wid = {w: i for i, w in enumerate(vocab)}
        keys: dict[int, list[tuple[int, ...]]] = {}
        lp: dict[int, np.ndarray] = {}
        bo: dict[int, np.ndarray] = {}
        for n in range(1, order + 1):
            ent = entries.get(n, {})
            try:
                keys[n] = [tuple(wid[w] for w in k) for k in ent]
            except KeyError as e:
                raise InputError(f"a {n}-gram uses the word {e.args[0]!r}, which is not a unigram",
                                 expected="every word of every n-gram listed as a unigram") from None
            if any(len(k) != n for k in keys[n]):
                raise InputError(f"an entry of order {n} has the wrong length", expected=f"{n} words")
            vals = np.array(list(ent.values()), dtype=np.float64).reshape(-1, 2)
            lp[n], bo[n] = vals[:, 0], vals[:, 1]
        return cls(order, vocab, keys, lp, bo)

    @classmethod
    def from_model(cls, model: NgramModel) -> NgramTables:
        """Tables of an :class:`~privasr.lm.ngram.model.NgramModel` (through its ``entries(n)``)."""
        keys: dict[int, list[tuple[int, ...]]] = {}
        lp: dict[int, np.ndarray] = {}
        bo: dict[int, np.ndarray] = {}
        for n in range(1, model.order + 1):
            ids, p, b = model.arrays(n)
            keys[n] = [tuple(r) for r in ids.tolist()]
            lp[n], bo[n] = np.array(p, dtype=np.float64), np.array(b, dtype=np.float64)
        order1 = [k[0] for k in keys[1]]
        if order1 != list(range(len(model.vocab))):  # unigrams listed in another order: reorder
            perm = np.argsort(np.array(order1, dtype=np.int64))
            keys[1] = [keys[1][i] for i in perm.tolist()]
            lp[1], bo[1] = lp[1][perm], bo[1][perm]
        return cls(model.order, model.vocab, keys, lp, bo)

    def to_entries(self, lp: Mapping[int, np.ndarray] | None = None,
                   bo: Mapping[int, np.ndarray] | None = None) -> dict[int, dict[tuple[str, ...], tuple[float, float]]]:
        """``{n: {words: (log10 prob, log10 backoff)}}`` of these tables, optionally with other values."""
        lp = self.lp if lp is None else lp
        bo = self.bo if bo is None else bo
        v = self.vocab
        return {n: {tuple(v[i] for i in key): (float(p), float(b))
                    for key, p, b in zip(self.keys[n], lp[n].tolist(), bo[n].tolist(), strict=True)}
                for n in range(1, self.order + 1)}

    def to_model(self, lp: Mapping[int, np.ndarray] | None = None,
                 bo: Mapping[int, np.ndarray] | None = None) -> NgramModel:
        """An :class:`~privasr.lm.ngram.model.NgramModel` with these n-grams (and optionally other values)."""
        from privasr.lm.ngram.model import NgramModel

        return NgramModel.from_entries(self.order, self.to_entries(lp, bo))

    # ------------------------------------------------------------------------------------ queries
    def num_ngrams(self, n: int) -> int:
        """Number of n-grams of order ``n``."""
        return len(self.keys[n])

    def ids(self, words: Iterable[str]) -> tuple[int, ...]:
        """Word ids; words not in the vocabulary become the ``<unk>`` id, or -1 (matches nothing)."""
        return tuple(self.wid.get(w, self.unk_id) for w in words)

    def successors(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``(rows, starts)``: the rows of order ``n`` sorted by history, and where each history's rows start.

        The successors of history row ``r`` (order n-1) are ``rows[starts[r]:starts[r + 1]]``.
        """
        if n not in self._succ:
            h = self.hist[n]
            rows = np.argsort(h, kind="stable")
            m = 1 if n == 1 else len(self.keys[n - 1])
            starts = np.searchsorted(h[rows], np.arange(m + 1), side="left")
            self._succ[n] = (rows, starts)
        return self._succ[n]

    def logprob(self, history: Sequence[str], word: str) -> float:
        """log10 p(word | history) by ARPA backoff (-inf when ``word`` is not in the vocabulary)."""
        return self.logprob_ids(self.ids(history), self.wid.get(word, -1))

    def logprob_ids(self, ctx: Sequence[int], w: int, lp: Mapping[int, np.ndarray] | None = None,
                    bo: Mapping[int, np.ndarray] | None = None) -> float:
        """log10 p(w | ctx) on ids (``w`` = -1: -inf); ``lp``/``bo`` replace the tables' values if given."""
        if w < 0:
            return _NEG_INF
        lp = self.lp if lp is None else lp
        bo = self.bo if bo is None else bo
        ctx = tuple(ctx)[max(0, len(ctx) - self.order + 1):]
        total = 0.0
        while True:
            n = len(ctx) + 1
            r = self.index[n].get(ctx + (w,))
            if r is not None:
                return total + float(lp[n][r])
            if not ctx:
                return _NEG_INF
            hr = self.index[n - 1].get(ctx)
            if hr is not None:
                total += float(bo[n - 1][hr])
            ctx = ctx[1:]

    def distribution(self, history: Sequence[str] | Sequence[int], lp: Mapping[int, np.ndarray] | None = None,
                     bo: Mapping[int, np.ndarray] | None = None) -> np.ndarray:
        """log10 p(w | history) for every vocabulary id ``w`` (``<s>`` gets -inf), by ARPA backoff, vectorised.

        ``history`` is a word sequence or a sequence of ids; only its last ``order - 1`` items matter.
        """
        lp = self.lp if lp is None else lp
        bo = self.bo if bo is None else bo
        ctx = tuple(history)
        if ctx and isinstance(ctx[0], str):
            ctx = self.ids(ctx)  # type: ignore[arg-type]
        ctx = tuple(int(c) for c in ctx)[max(0, len(ctx) - self.order + 1):]
        vec = lp[1].copy()
        for k in range(1, len(ctx) + 1):
            suffix = ctx[len(ctx) - k:]
            r = self.index[k].get(suffix)
            if r is None:
                continue
            vec += bo[k][r]
            rows, starts = self.successors(k + 1)
            sel = rows[starts[r]:starts[r + 1]]
            vec[self.word[k + 1][sel]] = lp[k + 1][sel]
        if self.bos_id >= 0:
            vec[self.bos_id] = _NEG_INF
        return vec

    def _lower_path(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Structure of p(w | h[1:]) for each row h w of order n >= 2: the explicit row reached, the bows on the way.

        Returns ``(tgt_order, tgt_row, bow_row_of, bow_order, bow_row, order_rows)``: row ``i`` takes its
        probability from ``lp[tgt_order[i]][tgt_row[i]]`` (tgt_row -1: -inf) plus the backoff weights
        ``bo[bow_order[j]][bow_row[j]]`` for every ``j`` with ``bow_row_of[j] == i``.
        """
        if n in self._lower_paths:
            return self._lower_paths[n]
        m = len(self.keys[n])
        tgt_order = np.zeros(m, dtype=np.int64)
        tgt_row = np.full(m, -1, dtype=np.int64)
        b_of: list[int] = []
        b_ord: list[int] = []
        b_row: list[int] = []
        index = self.index
        for i, key in enumerate(self.keys[n]):
            w = key[-1]
            ctx = key[1:-1]
            while True:
                k = len(ctx) + 1
                r = index[k].get(ctx + (w,))
                if r is not None:
                    tgt_order[i], tgt_row[i] = k, r
                    break
                if not ctx:
                    break
                hr = index[k - 1].get(ctx)
                if hr is not None:
                    b_of.append(i)
                    b_ord.append(k - 1)
                    b_row.append(hr)
                ctx = ctx[1:]
        res = (tgt_order, tgt_row, np.array(b_of, dtype=np.int64), np.array(b_ord, dtype=np.int64),
               np.array(b_row, dtype=np.int64), np.arange(m))
        self._lower_paths[n] = res
        return res

    def lower_logprobs(self, n: int, lp: Mapping[int, np.ndarray] | None = None,
                       bo: Mapping[int, np.ndarray] | None = None) -> np.ndarray:
        """log10 p(w | h[1:]) for every row ``h w`` of order ``n >= 2`` (vectorised over rows).

        Only ``lp`` of orders < n and ``bo`` of orders < n-1 are read, so backoff weights can be rebuilt order by
        order (:func:`recompute_backoffs`).
        """
        lp = self.lp if lp is None else lp
        bo = self.bo if bo is None else bo
        tgt_order, tgt_row, b_of, b_ord, b_row, _ = self._lower_path(n)
        out = np.full(len(tgt_row), _NEG_INF)
        for k in range(1, n):
            sel = (tgt_order == k) & (tgt_row >= 0)
            out[sel] = lp[k][tgt_row[sel]]
        for k in range(1, n - 1):
            sel = b_ord == k
            if sel.any():
                np.add.at(out, b_of[sel], bo[k][b_row[sel]])
        return out

    def histories(self) -> Iterator[tuple[int, ...]]:
        """Every history with explicit successors (the empty one first), as id tuples."""
        yield ()
        for n in range(2, self.order + 1):
            seen = np.unique(self.hist[n][self.hist[n] >= 0])
            for r in seen.tolist():
                yield self.keys[n - 1][r]


def recompute_backoffs(tables: NgramTables, lp: Mapping[int, np.ndarray],
                       *, floor: float = 1e-300) -> dict[int, np.ndarray]:
    """Backoff weights that make every history's distribution sum to 1, for given n-gram log10 probabilities.

    For each history h (an n-gram with successors):
    bow(h) = (1 - sum_{w: h w listed} p(w|h)) / (1 - sum_{w: h w listed} p(w|h[1:])), with p(.|h[1:]) the new
    model's own lower-order distribution (SRILM ``computeBOW``); orders are processed upwards so the lower
    orders are final when used. ``<s>`` is left out of the sums. N-grams without successors get bow = 1
    (log 0). When nothing is left to distribute (both sums 1 up to rounding) the weight is 1; a numerator below
    ``floor`` is clamped to ``floor``. The unigram distribution itself must already sum to 1.

    >>> t = NgramTables.from_entries(2, {1: {("a",): (-0.30103, 9.0), ("b",): (-0.30103, 0.0)},
    ...                                 2: {("a", "a"): (-0.1, 0.0)}})
    >>> bo = recompute_backoffs(t, t.lp)
    >>> round(float(bo[1][0]), 6), float(bo[1][1])
    (-0.385795, 0.0)
    >>> round(float((10 ** t.distribution(["a"], bo=bo)).sum()), 6)
    1.0
    """
    new_bo: dict[int, np.ndarray] = {n: np.zeros(tables.num_ngrams(n)) for n in range(1, tables.order + 1)}
    for n in range(1, tables.order):
        m = tables.num_ngrams(n)
        rows_next = tables.num_ngrams(n + 1)
        if rows_next == 0 or m == 0:
            continue
        hist = tables.hist[n + 1]
        ok = (hist >= 0) & (tables.word[n + 1] != tables.bos_id)
        p_hi = 10.0 ** lp[n + 1]
        p_lo = 10.0 ** tables.lower_logprobs(n + 1, lp, new_bo)
        s_hi = np.bincount(hist[ok], weights=p_hi[ok], minlength=m)
        s_lo = np.bincount(hist[ok], weights=p_lo[ok], minlength=m)
        has = np.bincount(hist[hist >= 0], minlength=m) > 0
        num = 1.0 - s_hi
        den = 1.0 - s_lo
        bo = np.zeros(m)
        live = has & (den > 1e-15)
        bo[live] = np.log10(np.maximum(num[live], floor)) - np.log10(den[live])
        new_bo[n] = bo
    return new_bo


# =============================================================================================== mixture


def unigram_mass(tables: NgramTables) -> float:
    """Sum of the unigram probabilities without ``<s>`` (1 for a normalised model).

    >>> round(unigram_mass(NgramTables.from_model(synthetic_model(1, 3))), 12)
    1.0
    """
    p = 10.0 ** tables.lp[1]
    if tables.bos_id >= 0:
        p = p.copy()
        p[tables.bos_id] = 0.0
    return float(math.fsum(p.tolist()))



def synthetic_model(order: int, words: int | Sequence[str], *, seed: int = 0, keep: float = 0.4,
                    unk: bool = True) -> NgramModel:
    """A random, exactly normalised backoff model (for tests and examples).

    The vocabulary is ``<s>``, ``</s>``, optionally ``<unk>``, and ``words`` (a count gives ``w0, w1, ...``).
    Each candidate n-gram is kept with probability ``keep``; candidates extend listed histories and have their
    suffix listed (as in Kneser-Ney models). Explicit probabilities are random, leaving mass to back off, and
    the backoff weights come from :func:`recompute_backoffs`, so every history sums to 1.

    >>> m = synthetic_model(3, 5, seed=1)
    >>> t = NgramTables.from_model(m)
    >>> max(abs(float((10 ** t.distribution(h)).sum()) - 1) for h in t.histories()) < 1e-12
    True
    """
    rng = np.random.default_rng(seed)
    names = [f"w{i}" for i in range(words)] if isinstance(words, int) else list(words)
    vocab = [BOS, "</s>", *([UNK] if unk else []), *names]
    events = [w for w in vocab if w != BOS]
    p1 = rng.dirichlet(np.ones(len(events)))
    entries: dict[int, dict[tuple[str, ...], tuple[float, float]]] = {1: {(BOS,): (-99.0, 0.0)}}
    for w, p in zip(events, p1.tolist(), strict=True):
        entries[1][(w,)] = (math.log10(p), 0.0)
    hist_words = [w for w in vocab if w != "</s>"]
    for n in range(2, order + 1):
        prev = entries[n - 1]
        ent: dict[tuple[str, ...], tuple[float, float]] = {}
        for h in prev:
            if h[-1] == "</s>" or (n > 2 and BOS in h[1:]) or h[-1] not in hist_words:
                continue
            cands = [w for w in events if n == 2 or (h[1:] + (w,)) in prev]
            chosen = [w for w in cands if rng.random() < keep][: len(events) - 1]
            if not chosen:
                continue
            d = rng.dirichlet(np.ones(len(chosen) + 1))[:-1] * rng.uniform(0.3, 0.95)
            for w, p in zip(chosen, d.tolist(), strict=True):
                ent[h + (w,)] = (math.log10(p), 0.0)
        entries[n] = ent
    tables = NgramTables.from_entries(order, entries)
    bo = recompute_backoffs(tables, tables.lp)
    return tables.to_model(bo=bo)
