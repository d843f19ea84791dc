"""Interpolated modified Kneser-Ney estimation that reproduces KenLM ``lmplz``.

What lmplz does (``lm/builder``: ``corpus_count.cc``, ``adjust_counts.cc``, ``initial_probabilities.cc``,
``interpolate.cc``), and so what :func:`train_mkn` does:

* **Counts** (:mod:`privasr.lm.ngram.counts`): raw counts at the highest order, continuation counts below it,
  except n-grams starting with ``<s>``, which keep raw counts.
* **Discounts** per order from the counts-of-counts ``t_1..t_4`` of those counts (Chen & Goodman eq. 26):
  ``Y = t1 / (t1 + 2 t2)``, ``D_k = k - (k + 1) Y t_{k+1} / t_k`` for ``k = 1, 2, 3+``, computed in float32
  as lmplz does, and rejected unless ``0 <= D_k <= k`` (lmplz's error; pass ``discount_fallback`` for its
  ``--discount_fallback``).
* **Initial probabilities** per context ``h``: ``u(w | h) = (c(h w) - D(c)) / sum_w c(h w)`` and the
  interpolation weight ``gamma(h) = (D1 N1(h) + D2 N2(h) + D3 N3+(h)) / sum_w c(h w)``.
* **Interpolation**: ``p(w | h) = u(w | h) + gamma(h) p(w | h[1:])``, down to the unigrams, which are
  interpolated with the uniform distribution over the vocabulary without ``<s>``
  (``p(w) = u(w) + gamma / (V - 1)``; ``<unk>``, with count 0, gets just ``gamma / (V - 1)``). With
  ``interpolate_unigrams=False`` (SRILM's habit) the whole ``gamma`` goes to ``<unk>`` instead.
* **Output**: ``log10 p`` for every n-gram, ``log10 gamma(g)`` as the backoff of every n-gram ``g`` that is a
  context; ``<s>`` gets probability 1 (``log10 = 0``), as in lmplz's ARPA files.
* **Pruning** (lmplz ``--prune``): thresholds per order (the last one repeats); an n-gram of order ``n >= 2``
  whose raw count is ``<= threshold[n]`` is dropped, its count moves into its context's ``gamma`` (so the model
  still sums to 1), and discounts still come from the unpruned counts. Unigrams are never pruned.
* **Vocabulary limit**: words outside ``vocab`` become ``<unk>`` before counting (so ``<unk>`` is trained
  like a word). Note that lmplz's ``--limit_vocab_file`` differs: it prunes the n-grams with such words.

Everything is vectorised over integer arrays (one ``np.unique`` per order, ``np.bincount`` per context).

>>> sents = [s.split() for s in ["a b c", "a b", "b c a", "c a b", "a c", "b b", "a"] * 2]
>>> res = estimate_mkn(sents, 2, discounts=[(0.5, 1.0, 1.5)] * 2)
>>> m = res.model
>>> m.vocab
('<unk>', '<s>', '</s>', 'a', 'b', 'c')
>>> total = sum(10 ** m.logprob(w, ["a"]) for w in m.vocab if w != "<s>")
>>> round(total, 12)
1.0
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from privasr.errors import InputError
from privasr.lm.ngram.counts import BOS_ID, UNK_ID, NgramCounts, OrderCounts, count_ngrams
from privasr.lm.ngram.model import NgramModel

__all__ = ["train_mkn", "estimate_mkn", "MknResult", "DiscountError", "kenlm_discounts", "counts_of_counts",
           "prune_thresholds"]

Discounts = tuple[float, float, float]


class DiscountError(InputError):
    """Modified Kneser-Ney discounts cannot be estimated (too little or artificial data)."""


@dataclass(frozen=True)
class MknResult:
    """The model plus what lmplz prints about it.

    Attributes:
        model: the estimated model.
        discounts: ``(D1, D2, D3+)`` per order (index 0 = unigrams).
        counts_of_counts: ``(t1, t2, t3, t4)`` per order, of the counts the discounts come from.
        ngram_counts: number of n-grams per order before pruning (lmplz's "Statistics" counts).
        tokens: words in the training text (lmplz's "Unigram tokens").
        sentences: number of sentences.
    """

    model: NgramModel
    discounts: tuple[Discounts, ...]
    counts_of_counts: tuple[tuple[int, int, int, int], ...]
    ngram_counts: tuple[int, ...]
    tokens: int
    sentences: int


def counts_of_counts(counts: np.ndarray) -> tuple[int, int, int, int]:
    """``(t1, t2, t3, t4)``: how many entries of ``counts`` equal 1, 2, 3 and 4.

    >>> counts_of_counts(np.array([0, 1, 1, 2, 5, 4, 3]))
    (2, 1, 1, 1)
    """
    b = np.bincount(np.minimum(np.asarray(counts, dtype=np.int64), 5), minlength=6)
    return int(b[1]), int(b[2]), int(b[3]), int(b[4])


def kenlm_discounts(t: Sequence[int], order_n: int = 0) -> Discounts:
    """Chen & Goodman's closed-form discounts from ``t = (t1, t2, t3, t4)``, in float32 like lmplz.

    Raises :class:`DiscountError` (lmplz's messages) when a ``t_k`` is 0 or a discount leaves ``[0, k]``.

    >>> [round(d, 6) for d in kenlm_discounts((100, 40, 20, 10))]
    [0.555556, 1.166667, 1.888889]
    """
    f32 = np.float32
    for j in (1, 2, 3):
        if t[j - 1] == 0:
            raise DiscountError(
                f"could not calculate Kneser-Ney discounts for {order_n}-grams with adjusted count {j + 1} because "
                f"no {order_n}-grams have adjusted count {j}; is this small or artificial data?",
                expected="more data, explicit discounts or discount_fallback")
    y = f32(f32(t[0]) / f32(t[0] + 2.0 * t[1]))
    out = []
    for j in (1, 2, 3):
        d = f32(j) - f32(j + 1) * y * f32(t[j]) / f32(t[j - 1])
        if d < 0.0 or d > j:
            raise DiscountError(f"{order_n}-gram discount out of range for adjusted count {j}: {float(d):g}",
                                expected=f"0 <= D{j} <= {j}")
        out.append(float(d))
    return out[0], out[1], out[2]


def prune_thresholds(prune: Sequence[int] | None, order: int) -> list[int]:
    """lmplz's ``--prune`` thresholds expanded to one per order (the last value repeats).

    >>> prune_thresholds([0, 1], 4)
    [0, 1, 1, 1]
    """
    if prune is None or len(prune) == 0:
        return [0] * order
    vals = [int(x) for x in prune]
    if any(x < 0 for x in vals) or any(int(x) != x for x in prune):
        raise InputError(f"prune thresholds {list(prune)}", expected="integers >= 0")
    if len(vals) > order:
        raise InputError(f"{len(vals)} prune thresholds for an order-{order} model", expected=f"at most {order}")
    if vals[0] != 0:
        raise InputError("unigram pruning is not supported", expected="the first prune threshold to be 0")
    if any(b < a for a, b in zip(vals, vals[1:], strict=False)):
        raise InputError(f"prune thresholds {vals} decrease", expected="non-decreasing thresholds")
    return vals + [vals[-1]] * (order - len(vals))


def _apply_discount(c: np.ndarray, d: Discounts) -> np.ndarray:
    """``c - D(c)`` for integer counts ``c`` (``D(0) = 0``), as float64."""
    table = np.array([0.0, d[0], d[1], d[2]])
    return c - table[np.minimum(c, 3)]


def _order_discounts(coc: Sequence[tuple[int, int, int, int]], order: int,
                     discounts: Sequence[Sequence[float]] | None,
                     discount_fallback: Sequence[float] | None) -> list[Discounts]:
    """``(D1, D2, D3+)`` per order: the explicit ones, else the estimates (or the fallback where they fail)."""
    disc: list[Discounts] = []
    for n in range(1, order + 1):
        if discounts is not None:
            d = tuple(float(x) for x in discounts[n - 1])
            if len(d) != 3:
                raise InputError(f"discounts for order {n}: {discounts[n - 1]!r}", expected="(D1, D2, D3+)")
            disc.append((d[0], d[1], d[2]))
            continue
        try:
            disc.append(kenlm_discounts(coc[n - 1], n))
        except DiscountError:
            if discount_fallback is None:
                raise
            fb = tuple(float(x) for x in discount_fallback)
            disc.append((fb[0], fb[1], fb[2]))
    return disc


def _unigram_probs(c1: np.ndarray, d1: Discounts, v: int, interpolate_unigrams: bool) -> np.ndarray:
    """Interpolated unigram probabilities from the unigram (continuation) counts ``c1``; ``<s>`` gets 1."""
    denom1 = c1.astype(np.float64).sum()
    if denom1 <= 0:
        raise InputError("the training text has no words and no sentences", expected="at least one sentence")
    gamma1 = (d1[0] * np.count_nonzero(c1 == 1) + d1[1] * np.count_nonzero(c1 == 2)
              + d1[2] * np.count_nonzero(c1 >= 3)) / denom1
    p = _apply_discount(c1, d1) / denom1
    if interpolate_unigrams:
        p = p + gamma1 / (v - 1)
    else:
        p[UNK_ID] += gamma1
    p[BOS_ID] = 1.0
    return p


def _interpolate(oc: Sequence[OrderCounts], keep: Sequence[np.ndarray], disc: Sequence[Discounts], mult: int,
                 p1: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Probabilities and backoffs (``gamma``, 1 for a context never extended) per order, from the unigrams up;
    a pruned n-gram's count goes into its context's ``gamma``."""
    probs = [p1]
    backoffs: list[np.ndarray] = []
    for n in range(2, len(oc) + 1):
        o = oc[n - 1]
        c = o.count.astype(np.float64)
        ctx = o.keys // mult  # type index of the context in order n-1
        n_ctx = len(oc[n - 2].keys)
        kept = keep[n - 1]
        denom = np.bincount(ctx, weights=c, minlength=n_ctx)
        d = disc[n - 1]
        ck = np.where(kept, o.count, 0)
        num = (d[0] * np.bincount(ctx, weights=(ck == 1), minlength=n_ctx)
               + d[1] * np.bincount(ctx, weights=(ck == 2), minlength=n_ctx)
               + d[2] * np.bincount(ctx, weights=(ck >= 3), minlength=n_ctx))
        if not kept.all():
            num = num + np.bincount(ctx, weights=np.where(kept, 0.0, c), minlength=n_ctx)
        has_ext = denom > 0
        gamma = np.ones(n_ctx)
        gamma[has_ext] = num[has_ext] / denom[has_ext]
        backoffs.append(gamma)
        pn = _apply_discount(o.count, d) / denom[ctx] + gamma[ctx] * probs[-1][o.suffix]
        probs.append(pn)
    backoffs.append(np.ones(len(probs[-1])))
    return probs, backoffs


def _pruned_model(counts: NgramCounts, keep: Sequence[np.ndarray], log_p: list[np.ndarray],
                  log_b: list[np.ndarray]) -> NgramModel:
    """The model of the kept n-grams (keys re-indexed to the kept contexts); the top order has no backoffs."""
    oc, mult = counts.orders, counts.mult
    keys_out: list[np.ndarray] = [oc[0].keys]
    if all(k.all() for k in keep):
        keys_out += [o.keys for o in oc[1:]]
    else:
        new_index = [np.arange(len(counts.vocab), dtype=np.int64)]
        for n in range(2, len(oc) + 1):
            k = keep[n - 1]
            old = oc[n - 1].keys[k]
            keys_out.append(new_index[-1][old // mult] * mult + old % mult)
            new_index.append(np.cumsum(k) - 1)
            log_p[n - 1] = log_p[n - 1][k]
            log_b[n - 1] = log_b[n - 1][k]
    log_b[-1] = np.zeros(len(log_p[-1]))
    return NgramModel(counts.vocab, keys_out, log_p, log_b)


def estimate_mkn(sentences: Iterable[Sequence[str]] | NgramCounts, order: int, *,
                 vocab: Collection[str] | None = None, prune: Sequence[int] | None = None,
                 discounts: Sequence[Sequence[float]] | None = None,
                 discount_fallback: Sequence[float] | None = None,
                 interpolate_unigrams: bool = True) -> MknResult:
    """Estimate an interpolated modified Kneser-Ney model and return it with its statistics.

    Args:
        sentences: token sequences (or counts already made by :func:`count_ngrams` with this order).
        order: the n-gram order (1..n; lmplz's default build supports up to 6).
        vocab: optional vocabulary limit (other words become ``<unk>``).
        prune: lmplz-style count thresholds per order (first must be 0, non-decreasing).
        discounts: explicit ``(D1, D2, D3+)`` per order instead of the estimates.
        discount_fallback: discounts for orders whose estimate fails (lmplz ``--discount_fallback``,
            whose default is ``(0.5, 1.0, 1.5)``); without it a failure raises :class:`DiscountError`.
        interpolate_unigrams: interpolate unigrams with the uniform distribution (lmplz's default).
    """
    counts = sentences if isinstance(sentences, NgramCounts) else count_ngrams(sentences, order, vocab=vocab)
    if counts.order != order:
        raise InputError(f"counts of order {counts.order} for an order-{order} model", expected="the same order")
    thresholds = prune_thresholds(prune, order)
    if discounts is not None and len(discounts) != order:
        raise InputError(f"{len(discounts)} discount triples for order {order}", expected=f"{order} triples")
    oc = counts.orders
    coc = tuple(counts_of_counts(o.count) for o in oc)
    disc = _order_discounts(coc, order, discounts, discount_fallback)
    # which n-grams survive pruning (raw count above the threshold); unigrams always do
    keep = [np.ones(len(counts.vocab), dtype=bool)]
    for n in range(2, order + 1):
        keep.append(oc[n - 1].raw > thresholds[n - 1] if thresholds[n - 1] > 0 else np.ones(len(oc[n - 1].keys), bool))
    p1 = _unigram_probs(oc[0].count, disc[0], len(counts.vocab), interpolate_unigrams)
    probs, backoffs = _interpolate(oc, keep, disc, counts.mult, p1)
    with np.errstate(divide="ignore"):  # in place: the model's arrays are these
        log_p = [np.minimum(0.0, np.log10(x, out=x), out=x) for x in probs]
        log_b = [np.log10(b, out=b) for b in backoffs]
    del probs, backoffs, p1
    model = _pruned_model(counts, keep, log_p, log_b)
    return MknResult(model=model, discounts=tuple(disc), counts_of_counts=coc,
                     ngram_counts=tuple(len(o.keys) for o in oc), tokens=counts.tokens, sentences=counts.sentences)


def train_mkn(sentences: Iterable[Sequence[str]], order: int, *, vocab: Collection[str] | None = None,
              prune: Sequence[int] | None = None, discounts: Sequence[Sequence[float]] | None = None,
              discount_fallback: Sequence[float] | None = None, interpolate_unigrams: bool = True) -> NgramModel:
    """Train an interpolated modified Kneser-Ney model as KenLM ``lmplz -o order`` would (see the module doc).

    ``discount_fallback`` (lmplz ``--discount_fallback``, e.g. ``(0.5, 1.0, 1.5)``) replaces the discounts of
    an order whose closed-form estimates are out of range, as happens on small corpora; without it such a
    corpus is an :class:`~privasr.errors.InputError`, as in lmplz. See :func:`estimate_mkn`.

    >>> m = train_mkn([["a", "b"], ["b", "a"], ["a"]], 2, discounts=[(0.5, 1.0, 1.5)] * 2)
    >>> m.order, m.num_ngrams(2), round(10 ** m.logprob("<s>", []), 6)
    (2, 6, 1.0)
    """
    return estimate_mkn(sentences, order, vocab=vocab, prune=prune, discounts=discounts,
                        discount_fallback=discount_fallback, interpolate_unigrams=interpolate_unigrams).model
