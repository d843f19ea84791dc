"""Score combination for N-best rescoring: per-hypothesis features, LM scores with a cache, and totals.

An N-best set becomes a :class:`ScoreTable`: every hypothesis of every list in one flat numpy array per
*feature*, with ``offsets`` marking where each utterance's list starts. The features are

* ``am``, ``lm``, ``total``: the first-pass scores of that name (natural log), present when every
  hypothesis has them;
* ``rank``: minus the 0-based first-pass rank (``0, -1, -2, ...``): a prior for lists without scores;
* ``n_words``: the number of words (the word penalty's feature);
* one feature per new language model: its natural-log sentence probability with ``<s>``/``</s>``
  (:attr:`~privasr.lm.base.SentenceScore.ln_total`, OOVs scored as ``<unk>``).

A :class:`Combination` turns features into one total per hypothesis, with the weights of a flat
parameter dict::

    loglinear:  total = w_prior * prior + sum_k w_k * ln P_k(W) + word_penalty * n_words
    linear:     total = w_prior * prior + lm_scale * ln(sum_k lambda_k P_k(W)) + word_penalty * n_words

where ``prior`` is ``am`` (the acoustic score), ``rank`` (for rank-only lists such as Whisper N-best) or
nothing (``uniform``), the LMs ``k`` are the first-pass LM (feature ``lm``) and/or the new LMs, the
``lambda`` lie on the simplex and ``w_prior`` is fixed (1 by default: only ratios of weights matter).
The 1-best of each list is the hypothesis with the largest total; ties go to the better first-pass rank.

Everything here is pure: records are never modified, rescoring returns new records.

>>> from privasr.corpus.records import Hypothesis, NBest
>>> nb = NBest("u1", (Hypothesis.from_text("a b", scores={"am": -10.0, "lm": -5.0}),
...                   Hypothesis.from_text("a c", scores={"am": -9.0, "lm": -8.0})), ref=("a", "b"))
>>> table = score_table([nb])
>>> comb = Combination(prior="am", lms=("lm",))
>>> totals = comb.totals(table, {"lm": 1.0, "word_penalty": 0.0})
>>> totals.tolist(), select(table, totals).tolist()
([-15.0, -17.0], [0])
>>> [h.text for h in rerank([nb], table, totals)[0]]
['a b', 'a c']
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

import numpy as np

from privasr import progress
from privasr.corpus.records import Hypothesis, NBest
from privasr.errors import ConfigError, InputError
from privasr.lm.base import LN10, LanguageModel

__all__ = [
    "LMScoreCache",
    "ScoreTable",
    "Combination",
    "score_table",
    "select",
    "select_many",
    "rerank",
    "rescore",
    "PRIORS",
    "MODES",
    "RESERVED_NAMES",
    "FIRST_PASS_SCORES",
]

PRIORS = ("am", "rank", "uniform", "total")
"""Acoustic/first-pass part of the total: the ``am`` score, ``-rank`` (rank-only lists), nothing, or the
decoder's combined ``total`` score."""

MODES = ("loglinear", "linear")
"""How several LMs are combined: log-linearly (one weight each) or linearly in probability."""

FIRST_PASS_SCORES = ("am", "lm", "total")
"""First-pass score names turned into features when every hypothesis has them."""

RESERVED_NAMES = frozenset({"am", "lm", "total", "rank", "n_words", "word_penalty", "lm_scale", "lambda",
                            "prior", "uniform"})
"""Names a new language model may not take (they are features or parameters)."""

Mode = Literal["loglinear", "linear"]


class LMScoreCache:
    """Natural-log sentence probabilities of one LM, each distinct word sequence scored once.

    Unknown sequences are collected and scored in batches of ``batch_size`` with the model's ``score_totals``
    where it has one (:class:`~privasr.lm.ngram.model.NgramModel`: log10 totals, OOVs as ``<unk>``, without
    per-token objects), else its ``score_batch``; :attr:`requests` and :attr:`scored` count lookups and actual
    model calls per sentence.

    >>> class Unigram:
    ...     order = 1
    ...     def __contains__(self, w): return True
    ...     def score_batch(self, sents, *, bos=True, eos=True):
    ...         from privasr.lm.base import SentenceScore
    ...         return [SentenceScore((*s, "</s>"), np.full(len(s) + 1, -1.0), np.zeros(len(s) + 1, bool))
    ...                 for s in sents]
    >>> cache = LMScoreCache(Unigram())
    >>> cache.ln_probs([("a",), ("a",), ()]).round(4).tolist()
    [-4.6052, -4.6052, -2.3026]
    >>> cache.requests, cache.scored
    (3, 2)
    """

    def __init__(self, lm: LanguageModel, *, batch_size: int = 4096) -> None:
        if not hasattr(lm, "score_batch"):
            raise ConfigError(f"{type(lm).__name__} is not a language model", expected="an object with score_batch")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"batch_size is {batch_size!r}", expected="an integer >= 1")
        self.lm = lm
        self.batch_size = batch_size
        self._scores: dict[tuple[str, ...], float] = {}
        self.requests = 0
        self.scored = 0

    def __len__(self) -> int:
        return len(self._scores)

    def ln_probs(self, sentences: Iterable[Sequence[str]]) -> np.ndarray:
        """``ln P(sentence)`` with ``<s>``/``</s>`` for each sentence (float64 array, input order)."""
        keys = [tuple(s) for s in sentences]
        self.requests += len(keys)
        todo = list(dict.fromkeys(k for k in keys if k not in self._scores))
        totals = getattr(self.lm, "score_totals", None)
        with progress.task(f"scoring hypotheses ({type(self.lm).__name__})", total=len(todo), transient=True) as bar:
            for i in range(0, len(todo), self.batch_size):
                chunk = todo[i : i + self.batch_size]
                if totals is not None:
                    lns = (totals(chunk, bos=True, eos=True)[0] * LN10).tolist()
                else:
                    results = self.lm.score_batch(chunk, bos=True, eos=True)
                    if len(results) != len(chunk):
                        raise InputError(f"{type(self.lm).__name__}.score_batch returned {len(results)} scores "
                                         f"for {len(chunk)} sentences", expected="one score per sentence")
                    lns = [float(r.ln_total) for r in results]
                self._scores.update(zip(chunk, lns, strict=True))
                self.scored += len(chunk)
                bar.advance(len(chunk))
        return np.fromiter((self._scores[k] for k in keys), dtype=np.float64, count=len(keys))


@dataclass(frozen=True)
class ScoreTable:
    """Every hypothesis of an N-best set as flat feature arrays.

    Attributes:
        utt_ids: utterance ids, in input order.
        offsets: ``offsets[i]:offsets[i+1]`` are utterance ``i``'s hypotheses (int64, length ``n + 1``).
        features: feature name -> float64 array over all hypotheses (see the module docstring).
        lm_names: the new LMs' feature names, in the order given.
        missing: first-pass score name -> id of the first utterance where a hypothesis lacks it.
    """

    utt_ids: tuple[str, ...]
    offsets: np.ndarray = field(repr=False)
    features: Mapping[str, np.ndarray] = field(repr=False)
    lm_names: tuple[str, ...] = ()
    missing: Mapping[str, str] = field(default_factory=dict)

    @property
    def n_utts(self) -> int:
        """Number of utterances."""
        return len(self.utt_ids)

    @property
    def n_hyps(self) -> int:
        """Number of hypotheses over all lists."""
        return int(self.offsets[-1])

    @property
    def lengths(self) -> np.ndarray:
        """List lengths (int64)."""
        return np.diff(self.offsets)

    def feature(self, name: str) -> np.ndarray:
        """One feature array; :class:`InputError` naming an utterance when a first-pass score is missing."""
        if name in self.features:
            return self.features[name]
        if name in self.missing:
            raise InputError(f"utterance {self.missing[name]} has a hypothesis without a {name!r} score",
                             expected=f"a {name!r} score on every hypothesis, or another prior "
                                      "(rank for rank-only lists, uniform)")
        raise ConfigError(f"unknown feature {name!r}", expected=f"one of {sorted(self.features)}")


def _hyp_lists(nbests: Sequence[NBest]) -> list[NBest]:
    out = []
    for k, nb in enumerate(nbests):
        if not isinstance(nb, NBest):
            raise InputError(f"item {k} is {type(nb).__name__}", expected="NBest records")
        out.append(nb)
    return out


def score_table(
    nbests: Sequence[NBest],
    lms: Mapping[str, LanguageModel | LMScoreCache] | None = None,
) -> ScoreTable:
    """Build the :class:`ScoreTable` of an N-best set, scoring every hypothesis with each new LM.

    ``lms`` maps a feature name to a language model or an :class:`LMScoreCache` (pass caches to share
    scores between dev and test: each distinct word sequence is scored once per LM).

    >>> from privasr.corpus.records import Hypothesis, NBest
    >>> t = score_table([NBest("u", (Hypothesis.from_text("x y", scores={"lm": -3.0}),
    ...                              Hypothesis.from_text("x")))])
    >>> t.features["rank"].tolist(), t.features["n_words"].tolist(), sorted(t.features), dict(t.missing)
    ([0.0, -1.0], [2.0, 1.0], ['n_words', 'rank'], {'am': 'u', 'lm': 'u', 'total': 'u'})
    """
    recs = _hyp_lists(nbests)
    lengths = np.fromiter((len(nb.hyps) for nb in recs), dtype=np.int64, count=len(recs))
    offsets = np.zeros(len(recs) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    hyps: list[Hypothesis] = [h for nb in recs for h in nb.hyps]
    feats: dict[str, np.ndarray] = {}
    rank = np.arange(len(hyps), dtype=np.float64) - np.repeat(offsets[:-1], lengths).astype(np.float64)
    feats["rank"] = 0.0 - rank
    feats["n_words"] = np.fromiter((len(h.words) for h in hyps), dtype=np.float64, count=len(hyps))
    missing: dict[str, str] = {}
    for name in FIRST_PASS_SCORES:
        vals = np.fromiter((h.scores.get(name, math.nan) for h in hyps), dtype=np.float64, count=len(hyps))
        bad = np.flatnonzero(np.isnan(vals))
        if bad.size:
            utt = int(np.searchsorted(offsets, bad[0], side="right") - 1)
            missing[name] = recs[utt].utt_id
        else:
            feats[name] = vals
    names: list[str] = []
    for name, lm in (lms or {}).items():
        if not isinstance(name, str) or not name or name in RESERVED_NAMES:
            raise ConfigError(f"language model name {name!r} is not allowed",
                              expected=f"a non-empty name other than {sorted(RESERVED_NAMES)}")
        cache = lm if isinstance(lm, LMScoreCache) else LMScoreCache(lm)
        feats[name] = cache.ln_probs(h.words for h in hyps)
        names.append(name)
    for a in feats.values():
        a.setflags(write=False)
    offsets.setflags(write=False)
    return ScoreTable(tuple(nb.utt_id for nb in recs), offsets, MappingProxyType(feats), tuple(names),
                      MappingProxyType(missing))


def _logsumexp_rows(x: np.ndarray) -> np.ndarray:
    m = np.max(x, axis=0)
    safe = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        return safe + np.log(np.sum(np.exp(x - safe), axis=0))


@dataclass(frozen=True)
class Combination:
    """How features become totals (see the module docstring).

    Args:
        prior: ``am`` | ``rank`` | ``uniform`` | ``total``.
        lms: the LM features combined, e.g. ``("lm", "ami3")`` (``lm`` = the first-pass LM score);
            empty for prior + word penalty only.
        mode: ``loglinear`` or ``linear``.
        prior_weight: the fixed weight of the prior (only weight ratios matter, so one weight is fixed).

    Parameters (the keys of a weights dict, see :meth:`parameters`): ``loglinear``: one per LM, named
    like the LM, plus ``word_penalty``; ``linear``: ``lm_scale``, ``lambda`` (a mapping LM -> weight on
    the simplex) and ``word_penalty``.

    >>> Combination(prior="rank", lms=("lm", "new"), mode="linear").parameters()
    ('lm_scale', 'lambda', 'word_penalty')
    """

    prior: str = "am"
    lms: tuple[str, ...] = ()
    mode: str = "loglinear"
    prior_weight: float = 1.0

    def __post_init__(self) -> None:
        if self.prior not in PRIORS:
            raise ConfigError(f"prior {self.prior!r} is not valid", expected=f"one of {list(PRIORS)}")
        if self.mode not in MODES:
            raise ConfigError(f"combination mode {self.mode!r} is not valid", expected=f"one of {list(MODES)}")
        lms = tuple(self.lms)
        if len(set(lms)) != len(lms):
            raise ConfigError(f"language models {list(lms)} repeat a name", expected="each LM once")
        for n in lms:
            if not isinstance(n, str) or not n or (n in RESERVED_NAMES and n != "lm"):
                raise ConfigError(f"language model name {n!r} is not allowed",
                                  expected=f"'lm' (first pass) or a name other than {sorted(RESERVED_NAMES)}")
        object.__setattr__(self, "lms", lms)
        pw = self.prior_weight
        if isinstance(pw, bool) or not isinstance(pw, int | float) or not math.isfinite(pw):
            raise ConfigError(f"prior_weight is {pw!r}", expected="a finite number")
        object.__setattr__(self, "prior_weight", float(pw))

    def parameters(self) -> tuple[str, ...]:
        """The weight names this combination needs, in a fixed order."""
        if self.mode == "linear":
            return ("lm_scale", "lambda", "word_penalty") if self.lms else ("word_penalty",)
        return (*self.lms, "word_penalty")

    def check_weights(self, weights: Mapping[str, Any]) -> dict[str, Any]:
        """Validated weights: every parameter present, numbers finite, ``lambda`` on the simplex.

        >>> Combination(lms=("lm",)).check_weights({"lm": 2, "word_penalty": -1})
        {'lm': 2.0, 'word_penalty': -1.0}
        >>> Combination(lms=("lm",)).check_weights({"lm": 2})
        Traceback (most recent call last):
        ...
        privasr.errors.ConfigError: weights lack 'word_penalty' (expected values for lm, word_penalty)
        """
        params = self.parameters()
        extra = sorted(set(weights) - set(params))
        if extra:
            raise ConfigError(f"unknown weight(s) {extra}", expected=f"values for {', '.join(params)}")
        out: dict[str, Any] = {}
        for p in params:
            if p not in weights:
                raise ConfigError(f"weights lack {p!r}", expected=f"values for {', '.join(params)}")
            v = weights[p]
            if p == "lambda":
                out[p] = self._check_lambda(v)
                continue
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise ConfigError(f"weight {p} is {v!r}", expected="a finite number")
            out[p] = float(v)
        return out

    def _check_lambda(self, v: Any) -> dict[str, float]:
        if not isinstance(v, Mapping) or set(v) != set(self.lms):
            raise ConfigError(f"lambda is {v!r}", expected=f"a mapping with a weight for each of {list(self.lms)}")
        lam = {}
        for k in self.lms:
            x = v[k]
            if isinstance(x, bool) or not isinstance(x, int | float) or not (0.0 <= x <= 1.0):
                raise ConfigError(f"lambda[{k}] is {x!r}", expected="a number in [0, 1]")
            lam[k] = float(x)
        if abs(sum(lam.values()) - 1.0) > 1e-6:
            raise ConfigError(f"lambda sums to {sum(lam.values())}", expected="weights summing to 1")
        return lam

    def prior_feature(self, table: ScoreTable) -> np.ndarray | None:
        """The prior's feature array (``None`` for ``uniform``)."""
        return None if self.prior == "uniform" else table.feature(self.prior)

    def mixture(self, table: ScoreTable, lam: Mapping[str, float]) -> np.ndarray:
        """``ln(sum_k lambda_k P_k)`` per hypothesis (linear interpolation in probability).

        >>> from privasr.corpus.records import Hypothesis, NBest
        >>> t = score_table([NBest("u", (Hypothesis(("a",), scores={"lm": math.log(0.2), "am": 0.0}),))])
        >>> c = Combination(lms=("lm",), mode="linear")
        >>> round(math.exp(c.mixture(t, {"lm": 1.0})[0]), 6)
        0.2
        """
        keys = [k for k in self.lms if lam[k] > 0.0]
        if not keys:
            return np.full(table.n_hyps, -np.inf)
        stack = np.stack([table.feature(k) + math.log(lam[k]) for k in keys])
        return _logsumexp_rows(stack)

    def base(self, table: ScoreTable) -> np.ndarray:
        """``prior_weight * prior`` (zeros for ``uniform``)."""
        prior = self.prior_feature(table)
        if prior is None:
            return np.zeros(table.n_hyps)
        return self.prior_weight * prior

    def totals(self, table: ScoreTable, weights: Mapping[str, Any]) -> np.ndarray:
        """The combined score of every hypothesis (float64 over ``table``'s hypotheses)."""
        w = self.check_weights(weights)
        tot = self.base(table).copy()
        if self.mode == "linear":
            if self.lms and w["lm_scale"] != 0.0:
                with np.errstate(invalid="ignore"):
                    mix = self.mixture(table, w["lambda"])
                tot += w["lm_scale"] * mix
        else:
            for k in self.lms:
                if w[k] != 0.0:
                    tot += w[k] * table.feature(k)
        if w["word_penalty"] != 0.0:
            tot += w["word_penalty"] * table.feature("n_words")
        return tot

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready description."""
        return {"prior": self.prior, "lms": list(self.lms), "mode": self.mode, "prior_weight": self.prior_weight}


def select_many(table: ScoreTable, totals: np.ndarray) -> np.ndarray:
    """For a matrix of totals (candidates x hypotheses), the chosen index within each list.

    Returns an int64 array (candidates x utterances): the position of the highest total in each list,
    ties to the smallest position (the better first-pass rank); ``-1`` for empty lists. NaN totals never
    win (they count as ``-inf``).

    >>> from privasr.corpus.records import Hypothesis, NBest
    >>> t = score_table([NBest("u", (Hypothesis(("a",)), Hypothesis(("b",)))), NBest("v", ())])
    >>> select_many(t, np.array([[1.0, 2.0], [3.0, 3.0]])).tolist()
    [[1, -1], [0, -1]]
    """
    tot = np.atleast_2d(np.asarray(totals, dtype=np.float64))
    if tot.shape[1] != table.n_hyps:
        raise InputError(f"{tot.shape[1]} totals for {table.n_hyps} hypotheses", expected="one total per hypothesis")
    tot = np.where(np.isnan(tot), -np.inf, tot)
    lengths = table.lengths
    out = np.full((tot.shape[0], table.n_utts), -1, dtype=np.int64)
    nonempty = np.flatnonzero(lengths > 0)
    if nonempty.size == 0 or tot.shape[0] == 0:
        return out
    starts = table.offsets[:-1][nonempty]
    seg_max = np.maximum.reduceat(tot, starts, axis=1)  # empty lists are skipped, so segments are exact
    hyp_utt = np.repeat(np.arange(table.n_utts), lengths)
    pos_of_utt = np.full(table.n_utts, -1, dtype=np.int64)
    pos_of_utt[nonempty] = np.arange(nonempty.size)
    expanded = seg_max[:, pos_of_utt[hyp_utt]]
    idx = np.arange(table.n_hyps, dtype=np.int64)
    cand = np.where(tot >= expanded, idx, np.iinfo(np.int64).max)
    first = np.minimum.reduceat(cand, starts, axis=1)
    out[:, nonempty] = first - starts
    return out


def select(table: ScoreTable, totals: np.ndarray) -> np.ndarray:
    """The chosen index within each list for one vector of totals (``-1`` for empty lists).

    >>> from privasr.corpus.records import Hypothesis, NBest
    >>> t = score_table([NBest("u", (Hypothesis(("a",)), Hypothesis(("b",)), Hypothesis(("c",))))])
    >>> select(t, np.array([0.0, 5.0, 5.0])).tolist()
    [1]
    """
    return select_many(table, np.asarray(totals, dtype=np.float64)[None, :])[0]


def rerank(
    nbests: Sequence[NBest],
    table: ScoreTable,
    totals: np.ndarray,
    *,
    score_name: str = "rescore",
    keep_lm_scores: bool = True,
) -> list[NBest]:
    """New N-best lists sorted by ``totals`` (best first, ties by first-pass rank); inputs untouched.

    Each hypothesis gets the combined score as ``scores[score_name]``, the new LMs' scores as
    ``scores["lm:<name>"]`` (``keep_lm_scores``) and its first-pass rank as ``meta["first_pass_rank"]``.

    >>> from privasr.corpus.records import Hypothesis, NBest
    >>> nb = NBest("u", (Hypothesis(("a",)), Hypothesis(("b",))))
    >>> t = score_table([nb])
    >>> out = rerank([nb], t, np.array([1.0, 2.0]))
    >>> [(h.text, h.scores["rescore"], h.meta["first_pass_rank"]) for h in out[0]], [h.text for h in nb]
    ([('b', 2.0, 1), ('a', 1.0, 0)], ['a', 'b'])
    """
    recs = _hyp_lists(nbests)
    if tuple(nb.utt_id for nb in recs) != table.utt_ids or table.n_hyps != sum(len(nb.hyps) for nb in recs):
        raise InputError("the N-best lists are not the ones the score table was built from")
    tot = np.asarray(totals, dtype=np.float64)
    if tot.shape != (table.n_hyps,):
        raise InputError(f"{tot.size} totals for {table.n_hyps} hypotheses", expected="one total per hypothesis")
    lm_feats = [(f"lm:{n}", table.features[n]) for n in table.lm_names] if keep_lm_scores else []
    out = []
    for i, nb in enumerate(recs):
        a = int(table.offsets[i])
        n = len(nb.hyps)
        order = sorted(range(n), key=lambda j: (-_sort_key(tot[a + j]), j))
        hyps = []
        for j in order:
            h = nb.hyps[j]
            scores = dict(h.scores)
            scores.update((name, float(f[a + j])) for name, f in lm_feats)
            scores[score_name] = float(tot[a + j])
            hyps.append(Hypothesis(h.words, scores=scores, confidences=h.confidences, times=h.times,
                                   meta={**h.meta, "first_pass_rank": j}))
        out.append(nb.with_hyps(hyps))
    return out


def _sort_key(x: float) -> float:
    return -math.inf if math.isnan(x) else x


def rescore(
    nbests: Sequence[NBest],
    combination: Combination,
    weights: Mapping[str, Any],
    lms: Mapping[str, LanguageModel | LMScoreCache] | None = None,
) -> list[NBest]:
    """Rescore N-best lists with fixed weights: :func:`score_table`, :meth:`Combination.totals`, :func:`rerank`.

    >>> from privasr.corpus.records import Hypothesis, NBest
    >>> nb = NBest("u", (Hypothesis.from_text("a b c", scores={"am": -1.0}), Hypothesis.from_text("a b")))
    >>> [h.text for h in rescore([nb], Combination(prior="rank"), {"word_penalty": -2.0})[0]]
    ['a b', 'a b c']
    """
    table = score_table(nbests, lms)
    return rerank(nbests, table, combination.totals(table, weights))


def unique_words(nbests: Iterable[NBest]) -> list[tuple[str, ...]]:
    """Distinct hypothesis word sequences in first-appearance order (what an LM cache scores).

    >>> from privasr.corpus.records import Hypothesis, NBest
    >>> unique_words([NBest("u", (Hypothesis(("a",)), Hypothesis(("a",)), Hypothesis(())))])
    [('a',), ()]
    """
    seen: dict[Hashable, None] = {}
    for nb in nbests:
        for h in nb.hyps:
            seen.setdefault(h.words, None)
    return list(seen)  # type: ignore[arg-type]
