"""Linear interpolation of language models: runtime mixture, EM weights, static n-gram merge.

Three pieces, as in SRILM:

- :class:`LinearMix` interpolates any :class:`~privasr.lm.base.LanguageModel` components word by word,
  linearly in probability: P(w|h) = sum_i lambda_i P_i(w|h), each component with its own full history.
- :func:`estimate_weights` finds the weights that maximise the held-out likelihood by EM, exactly like SRILM
  ``compute-best-mix``: each component gives a stream of per-token probabilities; one EM step sets
  lambda_i <- mean over tokens of the posterior lambda_i P_i(t) / sum_j lambda_j P_j(t); iteration stops when no
  weight changes by more than ``tol`` (default 1e-6) relative to its previous value. The held-out perplexity
  at the weights of every iteration is kept (:class:`EmResult`).
- :func:`merge_ngrams` writes the mixture of n-gram models as one backoff model (SRILM ``ngram -mix-lm``
  static interpolation): the n-gram set is the union of the components' sets, every n-gram in it gets
  p(w|h) = sum_i lambda_i p_i(w|h) (each p_i computed with component i's own backoff), and every backoff weight
  is recomputed so that each history's distribution sums to 1 (:func:`recompute_backoffs`). The merged model
  equals the runtime mixture **exactly on every n-gram of the union**. Where the merged model backs off
  (h w in no component) it gives bow(h) p(w|h'), while the runtime mixture gives sum_i lambda_i bow_i(h) p_i(w|h');
  one weight per history cannot reproduce the components' different backoff weights, so there the merge is an
  approximation (the same one SRILM makes), normalised but not equal to the runtime mixture.

**Words outside a component's vocabulary.** With ``oov="unk"`` (the default, KenLM's and rescoring's
convention) a component scores a word it does not know with its ``<unk>`` probability when it has ``<unk>``, and
0 when it does not. With ``oov="zero"`` a component always contributes 0 for words it does not know; then the
mixture is a proper distribution over the union of the vocabularies (``<unk>`` counted as one word). The two
agree when all components share one vocabulary. A token is flagged OOV by the mixture only when every component
flags it; such tokens are left out of :func:`estimate_weights`, as SRILM leaves out OOVs.
:func:`merge_ngrams` always uses ``oov="zero"`` semantics (a component gives 0 to a word it does not know) and
maps history words a component does not know to its ``<unk>``.

The numpy view of backoff models it works on is :class:`~privasr.lm.ngram.tables.NgramTables`.

>>> round(em_weights(np.log10([[0.5, 0.5, 0.5], [0.1, 0.1, 0.1]])).weights[0], 6)
1.0
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import numpy as np

from privasr.errors import InputError
from privasr.lm.base import LN10, LanguageModel, SentenceScore
from privasr.lm.ngram.tables import NgramTables, recompute_backoffs

if TYPE_CHECKING:
    from privasr.lm.ngram.model import NgramModel

__all__ = ["LinearMix", "estimate_weights", "em_weights", "EmResult", "EmIteration", "merge_ngrams", "check_weights"]

OovPolicy = Literal["unk", "zero"]

_NEG_INF = -math.inf


def check_weights(weights: Sequence[float], n_models: int) -> np.ndarray:
    """Validate interpolation weights: ``n_models`` finite values >= 0 summing to 1 (within 1e-6).

    >>> check_weights([0.25, 0.75], 2).tolist()
    [0.25, 0.75]
    >>> check_weights([0.5, 0.6], 2)
    Traceback (most recent call last):
    ...
    privasr.errors.InputError: interpolation weights sum to 1.1 (expected weights summing to 1)
    """
    w = np.asarray(list(weights), dtype=np.float64)
    if w.shape != (n_models,):
        raise InputError(f"{w.size} weights for {n_models} models", expected="one weight per model")
    if not np.all(np.isfinite(w)) or np.any(w < 0):
        raise InputError(f"interpolation weights {w.tolist()}", expected="finite weights >= 0")
    if abs(float(w.sum()) - 1.0) > 1e-6:
        raise InputError(f"interpolation weights sum to {float(w.sum()):.6g}", expected="weights summing to 1")
    return w / w.sum()


def _combine(scores: Sequence[SentenceScore], weights: np.ndarray, oov: OovPolicy) -> SentenceScore:
    tokens = scores[0].tokens
    lps = np.vstack([s.logprobs for s in scores])
    oovs = np.vstack([s.oov for s in scores])
    if oov == "zero":
        lps = np.where(oovs, _NEG_INF, lps)
    with np.errstate(divide="ignore"):
        lw = np.log(weights)[:, None]
    ln = np.logaddexp.reduce(lps * LN10 + lw, axis=0) if len(scores) > 1 else lps[0] * LN10 + lw[0]
    return SentenceScore(tokens, ln / LN10, oovs.all(axis=0))


class LinearMix:
    """Linear interpolation of language models, word by word: P(w|h) = sum_i lambda_i P_i(w|h).

    Args:
        models: the components (any :class:`~privasr.lm.base.LanguageModel`; each keeps its own history).
        weights: one weight per component, >= 0, summing to 1.
        oov: ``"unk"`` (a component scores a word it does not know with its ``<unk>`` probability, or 0 without
            ``<unk>``) or ``"zero"`` (always 0; the mixture is then normalised over the union vocabulary).
            See the module docstring.

    A token is OOV for the mixture when it is OOV for every component. ``order`` is the largest component order.

    >>> from privasr.lm.base import SentenceScore
    >>> class Uniform:
    ...     order = 1
    ...     def __init__(self, vocab): self.vocab = set(vocab)
    ...     def __contains__(self, w): return w in self.vocab
    ...     def score(self, words, *, bos=True, eos=True):
    ...         toks = tuple(words) + (("</s>",) if eos else ())
    ...         oov = np.array([t not in self.vocab for t in toks])
    ...         return SentenceScore(toks, np.where(oov, -np.inf, -np.log10(len(self.vocab))), oov)
    ...     def score_batch(self, sents, *, bos=True, eos=True):
    ...         return [self.score(s, bos=bos, eos=eos) for s in sents]
    >>> mix = LinearMix([Uniform(["a", "</s>"]), Uniform(["a", "b", "c", "</s>"])], [0.5, 0.5])
    >>> [round(10 ** float(x), 4) for x in mix.score(["a", "b"]).logprobs]
    [0.375, 0.125, 0.375]
    """

    def __init__(self, models: Sequence[LanguageModel], weights: Sequence[float], *, oov: OovPolicy = "unk") -> None:
        if not models:
            raise InputError("no models to interpolate", expected="at least one model")
        if oov not in ("unk", "zero"):
            raise InputError(f"oov policy {oov!r}", expected="'unk' or 'zero'")
        self.models: tuple[LanguageModel, ...] = tuple(models)
        self.weights: np.ndarray = check_weights(weights, len(self.models))
        self.oov: OovPolicy = oov

    @property
    def order(self) -> int:
        """The largest order among the components."""
        return max(int(m.order) for m in self.models)

    def __contains__(self, word: object) -> bool:
        return any(word in m for m in self.models)

    def score(self, words: Sequence[str], *, bos: bool = True, eos: bool = True) -> SentenceScore:
        """Score one sentence: per token, log10 of the weighted sum of the components' probabilities."""
        return _combine([m.score(words, bos=bos, eos=eos) for m in self.models], self.weights, self.oov)

    def score_batch(self, sentences: Sequence[Sequence[str]], *, bos: bool = True,
                    eos: bool = True) -> list[SentenceScore]:
        """Score many sentences (each component scores the batch, then tokens are combined)."""
        per_model = [m.score_batch(sentences, bos=bos, eos=eos) for m in self.models]
        return [_combine([pm[i] for pm in per_model], self.weights, self.oov) for i in range(len(sentences))]


# =============================================================================================== EM
@dataclass(frozen=True)
class EmIteration:
    """One EM iteration: the weights it started from and the held-out perplexity and log10 likelihood there."""

    iteration: int
    weights: tuple[float, ...]
    ppl: float
    logprob: float


@dataclass(frozen=True)
class EmResult:
    """Result of :func:`em_weights` / :func:`estimate_weights`.

    Attributes:
        weights: the final weights (sum 1).
        ppl: held-out perplexity at the final weights (tokens counted: ``tokens``).
        iterations: one :class:`EmIteration` per EM step, in order.
        converged: whether the relative change fell below ``tol`` before ``max_iter``.
        tokens: tokens used (``</s>`` included; tokens OOV for every component or with probability 0 under
            every component are left out).
        skipped: tokens left out.
    """

    weights: tuple[float, ...]
    ppl: float
    iterations: list[EmIteration] = field(default_factory=list)
    converged: bool = True
    tokens: int = 0
    skipped: int = 0


def em_weights(logprobs: np.ndarray | Sequence[Sequence[float]], *, init: Sequence[float] | None = None,
               tol: float = 1e-6, max_iter: int = 10_000,
               callback: Callable[[EmIteration], None] | None = None) -> EmResult:
    """EM interpolation weights from per-token log10 probability streams (SRILM ``compute-best-mix``).

    ``logprobs`` has one row per component and one column per held-out token (-inf: probability 0). Columns
    where every component gives 0 are left out. Each step computes, with the current weights, the posterior
    of each component for each token and sets the new weight to the posterior's mean; it stops when every
    weight changed by at most ``tol`` times its previous value (SRILM's test, with 1e-6 instead of SRILM's
    default 1e-3). ``callback`` sees every :class:`EmIteration` as it happens.

    >>> r = em_weights(np.log10([[0.5, 0.1, 0.4], [0.2, 0.3, 0.2]]))
    >>> [round(w, 4) for w in r.weights], r.converged, round(r.iterations[0].ppl, 4)
    ([0.7282, 0.2718], True, 3.6246)
    """
    lp = np.asarray(logprobs, dtype=np.float64)
    if lp.ndim != 2 or lp.shape[0] < 1:
        raise InputError(f"probability streams of shape {lp.shape}", expected="(models, tokens)")
    if np.any(np.isnan(lp)) or np.any(lp > 1e-9):
        raise InputError("probability streams contain NaN or log10 probabilities > 0",
                         expected="log10 probabilities <= 0 or -inf")
    k = lp.shape[0]
    keep = np.isfinite(lp).any(axis=0)
    ln = lp[:, keep] * LN10
    n_tok = int(keep.sum())
    if n_tok == 0:
        raise InputError("no held-out token has a probability > 0 under any model",
                         expected="held-out text the models can score")
    w = np.full(k, 1.0 / k) if init is None else check_weights(init, k)
    if not (tol > 0):
        raise InputError(f"tolerance {tol!r}", expected="a number > 0")
    iters: list[EmIteration] = []
    converged = False
    for it in range(1, max_iter + 1):
        with np.errstate(divide="ignore"):
            joint = ln + np.log(w)[:, None]
        mix = np.logaddexp.reduce(joint, axis=0) if k > 1 else joint[0]
        total = float(mix.sum()) / LN10
        rec = EmIteration(it, tuple(float(x) for x in w), 10.0 ** (-total / n_tok), total)
        iters.append(rec)
        if callback is not None:
            callback(rec)
        post = np.exp(joint - mix[None, :])
        new = post.mean(axis=1)
        new /= new.sum()
        done = bool(np.all(np.abs(new - w) <= tol * w))
        w = new
        if done:
            converged = True
            break
    with np.errstate(divide="ignore"):
        joint = ln + np.log(w)[:, None]
    total = float((np.logaddexp.reduce(joint, axis=0) if k > 1 else joint[0]).sum()) / LN10
    return EmResult(tuple(float(x) for x in w), 10.0 ** (-total / n_tok), iters, converged, n_tok,
                    int(lp.shape[1] - n_tok))


def estimate_weights(models: Sequence[LanguageModel], heldout_sentences: Iterable[Sequence[str]], *,
                     init: Sequence[float] | None = None, tol: float = 1e-6, max_iter: int = 10_000,
                     oov: OovPolicy = "unk", callback: Callable[[EmIteration], None] | None = None) -> EmResult:
    """Interpolation weights maximising the held-out likelihood, by EM (see :func:`em_weights`).

    Every model scores every held-out sentence (``<s>`` … ``</s>``); the per-token probabilities, with words a
    model does not know handled by ``oov`` as in :class:`LinearMix`, are the EM streams. Tokens OOV for every
    model are left out, as SRILM leaves out OOVs. The result's ``ppl`` is the perplexity of the mixture with the
    final weights on the tokens used (``</s>`` counted, like SRILM's ``ppl``).

    >>> import numpy as np
    >>> from privasr.lm.base import SentenceScore
    >>> class Const:
    ...     order = 1
    ...     def __init__(self, p): self.p = p
    ...     def __contains__(self, w): return True
    ...     def score(self, words, *, bos=True, eos=True):
    ...         toks = tuple(words) + ("</s>",)
    ...         return SentenceScore(toks, np.full(len(toks), np.log10(self.p)), np.zeros(len(toks), bool))
    ...     def score_batch(self, s, *, bos=True, eos=True): return [self.score(x) for x in s]
    >>> r = estimate_weights([Const(0.5), Const(0.25)], [["a", "b"]])
    >>> [round(x, 3) for x in r.weights]
    [1.0, 0.0]
    """
    if oov not in ("unk", "zero"):
        raise InputError(f"oov policy {oov!r}", expected="'unk' or 'zero'")
    sents = [tuple(s) for s in heldout_sentences]
    if not sents:
        raise InputError("no held-out sentences", expected="at least one sentence")
    rows = []
    all_oov: np.ndarray | None = None
    for m in models:
        scores = m.score_batch(sents, bos=True, eos=True)
        lps = np.concatenate([s.logprobs for s in scores])
        oovs = np.concatenate([s.oov for s in scores])
        if oov == "zero":
            lps = np.where(oovs, _NEG_INF, lps)
        rows.append(lps)
        all_oov = oovs if all_oov is None else (all_oov & oovs)
    stream = np.vstack(rows)
    assert all_oov is not None
    stream[:, all_oov] = _NEG_INF  # left out, like SRILM's OOVs
    return em_weights(stream, init=init, tol=tol, max_iter=max_iter, callback=callback)


# =============================================================================================== static merge
def merge_ngrams(models: Sequence[NgramModel | NgramTables], weights: Sequence[float]) -> NgramModel:
    """Merge n-gram models into one backoff model (static interpolation, SRILM ``ngram -mix-lm``).

    The vocabulary and n-gram set are the unions of the components'; each n-gram ``h w`` gets
    log10 sum_i lambda_i p_i(w|h), where p_i backs off within component i (0 if ``w`` is not in its vocabulary;
    history words it does not know become its ``<unk>``); then every backoff weight is recomputed
    (:func:`recompute_backoffs`) so each history sums to 1. Exact on the n-grams of the union, an
    approximation where the merged model backs off (module docstring). The order is the largest component order.
    N-grams whose mixed probability is 0 (possible only with zero weights) are dropped.

    >>> from privasr.lm.ngram.tables import synthetic_model
    >>> a, b = synthetic_model(2, 4, seed=1), synthetic_model(2, 4, seed=2)
    >>> m = merge_ngrams([a, b], [0.3, 0.7])
    >>> exact = math.log10(0.3 * 10 ** a.logprob("w1", ["w0"]) + 0.7 * 10 ** b.logprob("w1", ["w0"]))
    >>> (a.num_ngrams(2), b.num_ngrams(2), m.num_ngrams(2)), abs(m.logprob("w1", ["w0"]) - exact) < 1e-12
    ((13, 16, 20), True)
    """
    tabs = [m if isinstance(m, NgramTables) else NgramTables.from_model(m) for m in models]
    if not tabs:
        raise InputError("no models to merge", expected="at least one n-gram model")
    w = check_weights(weights, len(tabs))
    order = max(t.order for t in tabs)
    vocab: list[str] = []
    seen: set[str] = set()
    for t in tabs:
        for v in t.vocab:
            if v not in seen:
                seen.add(v)
                vocab.append(v)
    union: dict[int, dict[tuple[str, ...], None]] = {n: {} for n in range(1, order + 1)}
    union[1] = {(v,): None for v in vocab}
    for t in tabs:
        for n in range(2, t.order + 1):
            u = union[n]
            for key in t.keys[n]:
                u.setdefault(tuple(t.vocab[i] for i in key), None)
    keys: dict[int, list[tuple[str, ...]]] = {n: list(union[n]) for n in range(1, order + 1)}
    mixed: dict[int, np.ndarray] = {}
    for n in range(1, order + 1):
        acc = np.zeros(len(keys[n]))
        for t, lam in zip(tabs, w.tolist(), strict=True):
            if lam == 0.0:
                continue
            vals = np.fromiter((t.logprob_ids(t.ids(k[:-1]), t.wid.get(k[-1], -1)) for k in keys[n]),
                               dtype=np.float64, count=len(keys[n]))
            acc += lam * 10.0 ** vals
        mixed[n] = acc
    entries: dict[int, dict[tuple[str, ...], tuple[float, float]]] = {}
    for n in range(1, order + 1):
        with np.errstate(divide="ignore"):
            lp = np.log10(mixed[n])
        entries[n] = {k: (float(p), 0.0) for k, p in zip(keys[n], lp.tolist(), strict=True) if p > _NEG_INF}
    entries = _prune_orphans(order, entries)
    merged = NgramTables.from_entries(order, entries)
    bo = recompute_backoffs(merged, merged.lp)
    return merged.to_model(bo=bo)


def _prune_orphans(order: int, entries: dict[int, dict[tuple[str, ...], tuple[float, float]]]
                   ) -> dict[int, dict[tuple[str, ...], tuple[float, float]]]:
    """Drop n-grams whose history is not listed (after zero-probability n-grams were dropped)."""
    for n in range(2, order + 1):
        prev = entries[n - 1]
        entries[n] = {k: v for k, v in entries[n].items() if k[:-1] in prev}
    return entries
