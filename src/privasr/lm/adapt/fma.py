"""Fast marginal adaptation (FMA; Kneser, Peters & Klakow 1997), paper 003 eq. (1).

Given a background backoff n-gram P_B and a unigram P_A estimated on (little) adaptation text::

    P_FMA(w|h) = alpha(w) P_B(w|h) / Z(h),   alpha(w) = (P_A(w) / P_B(w))^beta,   Z(h) = sum_w alpha(w) P_B(w|h)

where P_B(w) is the background unigram (by default the model's own unigram distribution, see below) and
``beta`` in [0, 1] sets the strength (0: no change). Words more frequent in the adaptation data than in the
background are scaled up, others down, and every history is renormalised.

**Exact normaliser.** The sum over the whole vocabulary is done with the backoff structure: for a listed
history h with explicit successors E(h) and backoff weight bow(h) (h' = h minus its first word)::

    Z(h) = sum_{w in E(h)} alpha(w) P_B(w|h) + bow(h) (Z(h') - sum_{w in E(h)} alpha(w) P_B(w|h')),
    Z(()) = sum_w alpha(w) P_B(w),      Z(h) = Z(h') when h is not listed.

This is exact (no approximation), vectorised with numpy, and costs one pass over the n-grams.

Two ways to use it:

- :class:`FmaModel`, a runtime wrapper (implements :class:`~privasr.lm.base.LanguageModel`) computing Z(h)
  per history on demand (cached);
- :func:`fma_rewrite`, an **exact** rewrite into a new backoff model with the same n-gram set: for every listed
  n-gram p'(w|h) = alpha(w) p(w|h) / Z(h), and bow'(h) = bow(h) Z(h') / Z(h). Then for an unlisted h w,
  bow'(h) p'(w|h') = bow(h) Z(h')/Z(h) * alpha(w) p(w|h')/Z(h') = alpha(w) p(w|h)/Z(h): the rewritten ARPA gives
  exactly the FMA probabilities everywhere (up to the 9 digits of the ARPA file). SRILM cannot write this
  model (its ``-adapt-marginals`` only works at run time). ``<s>``'s unigram line is kept as it is.

**Unigrams.** ``P_A`` comes from :func:`adaptation_unigram`: counts of the adaptation words plus one ``</s>``
per sentence, over the background vocabulary (words it does not know count as ``<unk>`` when it has one, and
are dropped otherwise), smoothed either by a Dirichlet prior on the background unigram (default,
P_A(w) = (c(w) + mu P_B(w)) / (N + mu): with little data alpha stays near 1) or add-k
(P_A(w) = (c(w) + k) / (N + k |V|)). ``P_B`` defaults to the model's unigram distribution. For Kneser-Ney
models that is a *continuation* distribution rather than the word frequencies, so pass the unigram of the
background training text (:func:`text_unigram`) when it is available.

>>> from privasr.lm.ngram.model import NgramModel
>>> base = NgramModel.from_entries(2, {
...     1: {("<s>",): (-99.0, -0.2), ("a",): (-0.4, -0.1), ("b",): (-0.6, -0.05), ("</s>",): (-0.6, 0.0)},
...     2: {("<s>", "a"): (-0.2, 0.0), ("a", "b"): (-0.3, 0.0)}})
>>> pa = {"a": 0.2, "b": 0.6, "</s>": 0.2}
>>> fma = FmaModel(base, pa, beta=0.5)
>>> round(float((10 ** fma.distribution(["a"])).sum()), 12)
1.0
>>> new = fma_rewrite(base, pa, beta=0.5)
>>> abs(new.logprob("b", ["<s>"]) - fma.logprob("b", ["<s>"])) < 1e-12
True
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Literal

import numpy as np

from privasr.errors import InputError
from privasr.lm.base import BOS, EOS, UNK, SentenceScore
from privasr.lm.ngram.tables import NgramTables

if TYPE_CHECKING:
    from privasr.lm.ngram.model import NgramModel

__all__ = ["FmaModel", "fma_rewrite", "rewrite_with_alpha", "fma_alpha", "fma_normalizers", "adaptation_unigram", "text_unigram",
           "Unigram"]

Unigram = Mapping[str, float] | np.ndarray
"""A unigram distribution: ``{word: probability}``, or an array over the model's vocabulary ids."""


def _tables(base: NgramModel | NgramTables) -> NgramTables:
    return base if isinstance(base, NgramTables) else NgramTables.from_model(base)


def _as_vector(uni: Unigram, tables: NgramTables, what: str) -> np.ndarray:
    """A unigram as an array over vocabulary ids (``<s>`` set to 1), validated: > 0 on every other word."""
    v = len(tables.vocab)
    if isinstance(uni, np.ndarray):
        vec = np.asarray(uni, dtype=np.float64).copy()
        if vec.shape != (v,):
            raise InputError(f"{what} has {vec.size} values for {v} words", expected="one value per vocabulary word")
    else:
        vec = np.ones(v)
        missing = [w for w in tables.vocab if w != BOS and w not in uni]
        if missing:
            raise InputError(f"{what} has no probability for {missing[0]!r} ({len(missing)} words missing)",
                             expected="a probability for every vocabulary word (smooth it)")
        for w, i in tables.wid.items():
            if w != BOS:
                vec[i] = float(uni[w])
    if tables.bos_id >= 0:
        vec[tables.bos_id] = 1.0
    if not np.all(np.isfinite(vec)) or np.any(vec <= 0):
        bad = int(np.flatnonzero(~(np.isfinite(vec) & (vec > 0)))[0])
        raise InputError(f"{what} gives {tables.vocab[bad]!r} probability {vec[bad]!r}",
                         expected="probabilities > 0 (smooth the unigram)")
    return vec


def _base_unigram(tables: NgramTables, base_unigram: Unigram | None) -> np.ndarray:
    if base_unigram is None:
        p = 10.0 ** tables.lp[1]
        if tables.bos_id >= 0:
            p[tables.bos_id] = 1.0
        return _as_vector(p, tables, "the base unigram")
    return _as_vector(base_unigram, tables, "the base unigram")


def fma_alpha(base: NgramModel | NgramTables, adapt_unigram: Unigram, beta: float,
              base_unigram: Unigram | None = None) -> np.ndarray:
    """alpha(w) = (P_A(w) / P_B(w))^beta over the base vocabulary ids (``<s>``: 1).

    >>> t = NgramTables.from_entries(1, {1: {("a",): (math.log10(0.25), 0.0), ("b",): (math.log10(0.75), 0.0)}})
    >>> fma_alpha(t, {"a": 0.5, "b": 0.5}, 1.0).round(6).tolist()
    [2.0, 0.666667]
    """
    if isinstance(beta, bool) or not isinstance(beta, int | float) or not math.isfinite(beta) or beta < 0:
        raise InputError(f"beta is {beta!r}", expected="a finite number >= 0")
    t = _tables(base)
    pa = _as_vector(adapt_unigram, t, "the adaptation unigram")
    pb = _base_unigram(t, base_unigram)
    return (pa / pb) ** float(beta)


def _suffix_rows(tables: NgramTables, k: int) -> np.ndarray:
    """For every row of order k: the row (in order k-1) of the longest listed suffix of key[1:] and its order."""
    m = tables.num_ngrams(k)
    out_row = np.zeros(m, dtype=np.int64)
    out_ord = np.zeros(m, dtype=np.int64)
    if k == 1:
        return np.stack([out_ord, out_row])
    for i, key in enumerate(tables.keys[k]):
        ctx = key[1:]
        while ctx:
            r = tables.index[len(ctx)].get(ctx)
            if r is not None:
                out_ord[i], out_row[i] = len(ctx), r
                break
            ctx = ctx[1:]
    return np.stack([out_ord, out_row])


def fma_normalizers(base: NgramModel | NgramTables, alpha: np.ndarray) -> tuple[float, dict[int, np.ndarray]]:
    """Z for the empty history and for every listed history: ``(Z0, {k: Z of each order-k row})``, k < order.

    Vectorised over the n-grams of each order (see the module docstring for the recursion).

    >>> t = NgramTables.from_entries(1, {1: {("a",): (math.log10(0.5), 0.0), ("b",): (math.log10(0.5), 0.0)}})
    >>> fma_normalizers(t, np.array([3.0, 1.0]))
    (2.0, {})
    """
    t = _tables(base)
    a = np.asarray(alpha, dtype=np.float64)
    p1 = 10.0 ** t.lp[1]
    mask = np.ones(len(p1), dtype=bool)
    if t.bos_id >= 0:
        mask[t.bos_id] = False
    z0 = float(math.fsum((a[mask] * p1[mask]).tolist()))
    zs: dict[int, np.ndarray] = {}
    for k in range(1, t.order):
        m = t.num_ngrams(k)
        suf_ord, suf_row = _suffix_rows(t, k)
        zsuf = np.full(m, z0)
        for j in range(1, k):
            sel = suf_ord == j
            zsuf[sel] = zs[j][suf_row[sel]]
        hist = t.hist[k + 1]
        ok = (hist >= 0) & (t.word[k + 1] != t.bos_id)
        aw = a[t.word[k + 1][ok]]
        s1 = np.bincount(hist[ok], weights=aw * 10.0 ** t.lp[k + 1][ok], minlength=m)
        s2 = np.bincount(hist[ok], weights=aw * 10.0 ** t.lower_logprobs(k + 1)[ok], minlength=m)
        zs[k] = s1 + 10.0 ** t.bo[k] * (zsuf - s2)
    return z0, zs


def fma_rewrite(base: NgramModel | NgramTables, adapt_unigram: Unigram, beta: float,
                base_unigram: Unigram | None = None) -> NgramModel:
    """The FMA-adapted model written as a backoff n-gram model with the base model's n-gram set (exact).

    p'(w|h) = alpha(w) p(w|h) / Z(h) for every listed n-gram, bow'(h) = bow(h) Z(h') / Z(h) (module docstring).

    >>> from privasr.lm.ngram.tables import synthetic_model
    >>> base = synthetic_model(3, 4, seed=0)
    >>> pa = {w: 0.1 for w in base.vocab if w != "<s>"} | {"w2": 0.5}
    >>> new = fma_rewrite(base, pa, 1.0)
    >>> [new.num_ngrams(n) == base.num_ngrams(n) for n in (1, 2, 3)]
    [True, True, True]
    >>> new.logprob("w2", ["w0"]) > base.logprob("w2", ["w0"])
    True
    """
    t = _tables(base)
    return rewrite_with_alpha(t, fma_alpha(t, adapt_unigram, beta, base_unigram))


def rewrite_with_alpha(base: NgramModel | NgramTables, alpha: np.ndarray) -> NgramModel:
    """The backoff model of P(w|h) = alpha(w) P_B(w|h) / Z(h) for any positive word weights ``alpha``.

    >>> t = NgramTables.from_entries(1, {1: {("a",): (math.log10(0.5), 0.0), ("b",): (math.log10(0.5), 0.0)}})
    >>> [round(10 ** p, 6) for _, p, _ in rewrite_with_alpha(t, np.array([3.0, 1.0])).entries(1)]
    [0.75, 0.25]
    """
    t = _tables(base)
    alpha = np.asarray(alpha, dtype=np.float64)
    if alpha.shape != (len(t.vocab),) or not np.all(np.isfinite(alpha)) or np.any(alpha <= 0):
        raise InputError("word weights alpha", expected="one finite weight > 0 per vocabulary word")
    z0, zs = fma_normalizers(t, alpha)
    log_a = np.log10(alpha)
    lp: dict[int, np.ndarray] = {}
    bo: dict[int, np.ndarray] = {}
    for n in range(1, t.order + 1):
        zh = np.full(t.num_ngrams(n), z0) if n == 1 else zs[n - 1][t.hist[n]]
        new = t.lp[n] + log_a[t.word[n]] - np.log10(zh)
        if n == 1 and t.bos_id >= 0:
            new[t.bos_id] = t.lp[1][t.bos_id]
        lp[n] = new
        if n < t.order:
            suf_ord, suf_row = _suffix_rows(t, n)
            zsuf = np.full(t.num_ngrams(n), z0)
            for j in range(1, n):
                sel = suf_ord == j
                zsuf[sel] = zs[j][suf_row[sel]]
            bo[n] = t.bo[n] + np.log10(zsuf) - np.log10(zs[n])
        else:
            bo[n] = np.zeros(t.num_ngrams(n))
    return t.to_model(lp, bo)


class FmaModel:
    """Runtime FMA wrapper around a backoff n-gram model (implements :class:`~privasr.lm.base.LanguageModel`).

    Args:
        base: the background :class:`~privasr.lm.ngram.model.NgramModel`.
        adapt_unigram: P_A, ``{word: p}`` for every vocabulary word but ``<s>`` (or an array over ids); see
            :func:`adaptation_unigram`.
        beta: the adaptation strength (>= 0; 0 gives back the base model).
        base_unigram: P_B(w); default the base model's unigram distribution.

    Z(h) is computed per distinct (truncated) history when first needed, from the history's explicit
    successors and the Z of its suffix (module docstring), and cached. Scores are
    log10 alpha(w) + log10 P_B(w|h) - log10 Z(h); OOV words are scored as the base scores them (as ``<unk>``,
    whose alpha applies, or -inf) and flagged.

    >>> from privasr.lm.ngram.tables import synthetic_model
    >>> base = synthetic_model(2, 3, seed=0)
    >>> fma = FmaModel(base, {"</s>": 0.1, "<unk>": 0.1, "w0": 0.6, "w1": 0.1, "w2": 0.1}, beta=0.5)
    >>> s = fma.score(["w0", "w1"])
    >>> s.tokens, round(float(s.logprobs[0] - base.score(["w0", "w1"]).logprobs[0]), 4)
    (('w0', 'w1', '</s>'), 1.1245)
    """

    def __init__(self, base: NgramModel, adapt_unigram: Unigram, beta: float,
                 base_unigram: Unigram | None = None) -> None:
        self.base = base
        self.beta = float(beta)
        self._t = _tables(base)
        self.alpha: np.ndarray = fma_alpha(self._t, adapt_unigram, beta, base_unigram)
        self._log_alpha = np.log10(self.alpha)
        mask = np.ones(len(self.alpha), dtype=bool)
        if self._t.bos_id >= 0:
            mask[self._t.bos_id] = False
        self._z0 = float(math.fsum((self.alpha[mask] * 10.0 ** self._t.lp[1][mask]).tolist()))
        self._cache: dict[tuple[int, ...], float] = {(): self._z0}

    @property
    def order(self) -> int:
        """The base model's order."""
        return self._t.order

    @property
    def vocab(self) -> tuple[str, ...]:
        """The base model's vocabulary."""
        return self._t.vocab

    def __contains__(self, word: object) -> bool:
        return word in self._t.wid

    def z(self, history: Sequence[int]) -> float:
        """Z(h) for a history of word ids (only the last ``order - 1`` matter; cached per history)."""
        t = self._t
        ctx = tuple(history)[max(0, len(history) - t.order + 1):]
        hit = self._cache.get(ctx)
        if hit is not None:
            return hit
        r = t.index[len(ctx)].get(ctx) if all(c >= 0 for c in ctx) else None
        z_lower = self.z(ctx[1:])
        if r is None:
            val = z_lower
        else:
            k = len(ctx)
            rows, starts = t.successors(k + 1)
            sel = rows[starts[r]:starts[r + 1]]
            words = t.word[k + 1][sel]
            keep = words != t.bos_id
            sel, words = sel[keep], words[keep]
            a = self.alpha[words]
            s1 = float(np.dot(a, 10.0 ** t.lp[k + 1][sel]))
            lower = np.fromiter((t.logprob_ids(ctx[1:], int(w)) for w in words.tolist()),
                                dtype=np.float64, count=len(words))
            s2 = float(np.dot(a, 10.0 ** lower))
            val = s1 + 10.0 ** float(t.bo[k][r]) * (z_lower - s2)
        self._cache[ctx] = val
        return val

    def logprob(self, word: str, history: Sequence[str]) -> float:
        """log10 P_FMA(word | history) (OOV words as ``<unk>`` or -inf)."""
        t = self._t
        w = t.wid.get(word, t.unk_id)
        ctx = t.ids(history)
        lp = t.logprob_ids(ctx, w)
        if lp == -math.inf:
            return -math.inf
        return lp + float(self._log_alpha[w]) - math.log10(self.z(ctx))

    def distribution(self, history: Sequence[str]) -> np.ndarray:
        """log10 P_FMA(w | history) for every vocabulary id (``<s>``: -inf), vectorised."""
        t = self._t
        ids = t.ids(history)
        with np.errstate(divide="ignore"):
            return t.distribution(ids) + self._log_alpha - math.log10(self.z(ids))

    def score(self, words: Sequence[str], *, bos: bool = True, eos: bool = True) -> SentenceScore:
        """Score one sentence (conventions of :mod:`privasr.lm.base`)."""
        return self.score_batch([words], bos=bos, eos=eos)[0]

    def score_batch(self, sentences: Sequence[Sequence[str]], *, bos: bool = True,
                    eos: bool = True) -> list[SentenceScore]:
        """Score many sentences: the base model's scores plus log10 alpha(w) - log10 Z(h) per token."""
        t = self._t
        base_scores = self.base.score_batch(sentences, bos=bos, eos=eos)
        out = []
        n_ctx = t.order - 1
        for bs in base_scores:
            toks = bs.tokens
            ids = [t.wid.get(w, t.unk_id) for w in toks]
            ctx: list[int] = [t.bos_id] if bos else []
            adj = np.zeros(len(toks))
            for j, w in enumerate(ids):
                if w >= 0:
                    adj[j] = self._log_alpha[w] - math.log10(self.z(ctx[max(0, len(ctx) - n_ctx):] if n_ctx else ()))
                ctx.append(w)
            out.append(SentenceScore(toks, bs.logprobs + adj, bs.oov))
        return out

    def to_ngram(self) -> NgramModel:
        """The exact rewrite of this model as a backoff n-gram model (:func:`fma_rewrite`)."""
        return rewrite_with_alpha(self._t, self.alpha)


# =============================================================================================== unigrams
def text_unigram(sentences: Iterable[Sequence[str]], vocab: Sequence[str] | NgramModel | NgramTables, *,
                 k: float = 0.0) -> dict[str, float]:
    """Unigram of a text over ``vocab`` (``</s>`` once per sentence; unknown words as ``<unk>`` if in ``vocab``,
    else dropped), add-``k`` smoothed; ``<s>`` is left out. With ``k = 0`` unseen words get probability 0.

    >>> text_unigram([["a", "a", "zz"]], ["<s>", "a", "b", "</s>"], k=1.0)
    {'a': 0.5, 'b': 0.16666666666666666, '</s>': 0.3333333333333333}
    """
    words = _vocab_of(vocab)
    counts = _counts(sentences, words)
    events = [w for w in words if w != BOS]
    total = sum(counts[w] for w in events) + k * len(events)
    if total <= 0:
        raise InputError("the text has no words of the vocabulary", expected="some text to count")
    return {w: (counts[w] + k) / total for w in events}


def _vocab_of(vocab: Sequence[str] | NgramModel | NgramTables) -> tuple[str, ...]:
    v = getattr(vocab, "vocab", vocab)
    return tuple(v)  # type: ignore[arg-type]


def _counts(sentences: Iterable[Sequence[str]], vocab: Sequence[str]) -> Counter[str]:
    known = set(vocab)
    has_unk = UNK in known
    c: Counter[str] = Counter()
    for s in sentences:
        for w in s:
            if w in known:
                c[w] += 1
            elif has_unk:
                c[UNK] += 1
        c[EOS] += 1
    c.pop(BOS, None)
    return c


def adaptation_unigram(sentences: Iterable[Sequence[str]], base: NgramModel | NgramTables, *,
                       smoothing: Literal["dirichlet", "add-k"] = "dirichlet", mu: float = 1000.0, k: float = 0.5,
                       base_unigram: Unigram | None = None) -> dict[str, float]:
    """The adaptation unigram P_A over the base vocabulary (module docstring).

    ``smoothing="dirichlet"``: P_A(w) = (c(w) + mu P_B(w)) / (N + mu), P_B = ``base_unigram`` or the base model's
    unigrams; ``"add-k"``: P_A(w) = (c(w) + k) / (N + k |V|). N counts the words and one ``</s>`` per sentence.

    >>> t = NgramTables.from_entries(1, {1: {("a",): (math.log10(0.5), 0.0), ("</s>",): (math.log10(0.5), 0.0)}})
    >>> adaptation_unigram([["a", "a", "a"]], t, mu=4.0)
    {'a': 0.625, '</s>': 0.375}
    """
    t = _tables(base)
    counts = _counts(sentences, t.vocab)
    events = [w for w in t.vocab if w != BOS]
    n = float(sum(counts[w] for w in events))
    if smoothing == "dirichlet":
        if not (mu > 0 and math.isfinite(mu)):
            raise InputError(f"mu is {mu!r}", expected="a finite number > 0")
        pb = _base_unigram(t, base_unigram)
        mass = float(sum(pb[t.wid[w]] for w in events))
        return {w: float((counts[w] + mu * pb[t.wid[w]] / mass) / (n + mu)) for w in events}
    if smoothing == "add-k":
        if not (k > 0 and math.isfinite(k)):
            raise InputError(f"k is {k!r}", expected="a finite number > 0")
        return {w: (counts[w] + k) / (n + k * len(events)) for w in events}
    raise InputError(f"smoothing {smoothing!r}", expected="'dirichlet' or 'add-k'")
