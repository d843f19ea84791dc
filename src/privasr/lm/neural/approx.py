"""N-gram (ARPA) approximations of a neural language model (paper 003, section 2.4).

A neural LM cannot go into a first-pass decoder or any tool that reads ARPA files; an n-gram model whose
probabilities come from the neural model can. Two constructions are offered, both giving a **normalised
backoff model** (every history's distribution sums to 1, with backoff weights from
:func:`~privasr.lm.ngram.tables.recompute_backoffs`) that KenLM and SRILM read:

* :func:`approximate_ngram` -- the probability-based conversion of the paper: for every word of a corpus and
  its uni-, bi-, tri-gram history, take the neural probability, average over the occurrences, normalise, write
  an ARPA model. The n-gram set is the set of n-grams seen in the corpus (orders ``1..order``; every vocabulary
  word is a unigram), optionally enlarged with the neural model's ``topk`` most probable next words at each
  corpus position.
* :func:`overwrite_ngram` -- keep the n-gram set of an existing model (say, the MKN trigram of the same text)
  and overwrite its probabilities with the averaged neural ones.

**How the neural probabilities are averaged.** At every corpus position ``i`` (sentence ``<s> w1 .. wk </s>``,
predicting ``w_i``, ``</s>`` included) the neural model sees its real context, the **whole sentence prefix**
``<s> w1 .. w_{i-1}`` (the full history the network was trained on), and gives a next-word distribution
``P_nn(. | prefix_i)``. The n-gram history of order ``n`` at that position is the last ``n - 1`` tokens of the
prefix (``<s>`` counts as a token; positions too close to ``<s>`` have no history of that order). The
approximated distribution of an n-gram history ``h`` is the average of the neural distributions over all
occurrences of ``h`` in the corpus::

    p(w | h) = 1/c(h) * sum_{i : history_n(i) = h} P_nn(w | prefix_i)

(the expectation of the neural prediction given that the last ``n - 1`` words are ``h``). For the empty history
(unigrams) the average runs over every position of the corpus, so each shorter history simply pools more
occurrences: the neural model never sees a truncated history. An average of distributions is a distribution,
so ``p(. | h)`` sums to 1 over the vocabulary; the model lists ``p(w | h)`` explicitly for the kept n-grams
``h w`` and gives the rest of the mass, through the backoff weight of ``h``, to the (equally approximated)
lower-order distribution of the words it does not list. This is the paper's "average over occurrences, then
normalise", with the normalisation done exactly by the backoff weights (a word listed after ``h`` gets exactly
its averaged neural probability).

**Vocabulary.** :func:`approximate_ngram` uses the neural vocabulary (``<unk>``, ``<s>``, ``</s>``, words);
corpus words outside it are ``<unk>``. :func:`overwrite_ngram` uses the base model's vocabulary: a base word
the neural model does not know gets a share of the neural ``<unk>`` probability, in proportion to its base
unigram probability among such words (the base ``<unk>`` included), and the neural probability of words the
base does not know is dropped; each position's distribution is renormalised over the base vocabulary before
averaging, so the averages are still distributions. ``<s>`` is never predicted (log10 probability -99, as in
every ARPA file).

>>> import torch
>>> from privasr.lm.neural.models import NeuralLMConfig, build_model
>>> from privasr.lm.neural.vocab import Vocabulary
>>> from privasr.lm.ngram.tables import NgramTables
>>> sents = [["a", "b", "a"], ["b", "b"], ["a"]]
>>> vocab = Vocabulary.build(sents)
>>> _ = torch.manual_seed(0)
>>> src = ModelSource(build_model(NeuralLMConfig.preset("tiny-lstm"), vocab), vocab)
>>> m = approximate_ngram(src, sents, order=2)
>>> [m.num_ngrams(n) for n in (1, 2)]
[5, 7]
>>> t = NgramTables.from_model(m)
>>> max(abs(float((10 ** t.distribution(h)).sum()) - 1) for h in t.histories()) < 1e-9
True
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from privasr.errors import InputError
from privasr.lm.base import BOS, EOS, UNK
from privasr.lm.ngram.model import NgramModel
from privasr.lm.ngram.tables import NgramTables, recompute_backoffs

__all__ = ["approximate_ngram", "overwrite_ngram", "ModelSource", "ApproxStats", "check_normalised"]

_LOG_ZERO = -99.0


@dataclass
class ApproxStats:
    """What an approximation did (filled in when passed as ``stats=``)."""

    positions: int = 0
    sentences: int = 0
    ngrams: tuple[int, ...] = ()
    topk_added: tuple[int, ...] = ()
    kept_base: int = 0
    neural_s: float = 0.0
    total_s: float = 0.0


class ModelSource:
    """Next-word distributions of a neural model at every position of whole sentences (one forward per batch).

    Args:
        model: a ``torch.nn.Module`` taking word ids ``[B, T]`` (first input ``<s>``) and returning
            ``(logits [B, T, V], state)`` (:func:`privasr.lm.neural.models.build_model`).
        vocab: its :class:`~privasr.lm.neural.vocab.Vocabulary` (ids ``<unk>`` 0, ``<s>`` 1, ``</s>`` 2).
        max_len: the longest input fed at once (``None``: the model config's ``max_len`` for a Transformer with
            learned positions, else no limit: whole sentences, as :class:`~privasr.lm.neural.scorer.NeuralLM`
            scores them). A longer sentence is fed in windows: an LSTM carries its state across, a Transformer
            re-reads the last ``max_len // 2`` tokens as context of the next window.
        batch_tokens: about this many input tokens per forward pass.
        device: torch device.
    """

    def __init__(self, model: Any, vocab: Any, *, max_len: int | None = None, batch_tokens: int = 4096,
                 device: str = "cpu") -> None:
        self.model = model
        self.vocab = vocab
        self.words: tuple[str, ...] = tuple(vocab.words)
        cfg = getattr(model, "config", None)
        self.recurrent = getattr(cfg, "arch", "lstm") == "lstm"
        if max_len is None and not self.recurrent and getattr(cfg, "positions", "sinusoidal") == "learned":
            max_len = int(cfg.max_len)
        self.max_len = max_len
        self.batch_tokens = max(1, int(batch_tokens))
        self.device = device

    @classmethod
    def from_lm(cls, lm: Any, **kw: Any) -> ModelSource:
        """From a :class:`privasr.lm.neural.scorer.NeuralLM` (or anything with ``model`` and ``vocab``)."""
        if isinstance(lm, ModelSource):
            return lm
        model = getattr(lm, "model", None)
        vocab = getattr(lm, "vocab", None)
        if model is None or vocab is None:
            raise InputError(f"{type(lm).__name__} has no neural model and vocabulary",
                             expected="a NeuralLM (with .model and .vocab) or a ModelSource")
        if "device" not in kw and getattr(lm, "device", None) is not None:
            kw["device"] = str(lm.device)
        return cls(model, vocab, **kw)

    def _logprobs(self, ids: Any) -> Any:
        import torch

        from privasr.lm.neural.scorer import exact_inference

        with exact_inference(self.device):
            logits, _ = self.model(ids)
            return torch.log_softmax(logits.float(), dim=-1)

    def _long(self, seq: list[int]) -> np.ndarray:
        """Natural-log distributions [len(seq), V] for one long input (windows, see the class docstring)."""
        import torch

        from privasr.lm.neural.scorer import exact_inference

        dev = self.device
        assert self.max_len is not None
        out = []
        if self.recurrent:
            state = None
            for lo in range(0, len(seq), self.max_len):
                x = torch.tensor([seq[lo:lo + self.max_len]], device=dev)
                with exact_inference(dev):
                    logits, state = self.model(x, state=state)
                out.append(torch.log_softmax(logits.float(), dim=-1)[0].cpu().numpy())
            return np.concatenate(out)
        hop = max(1, self.max_len // 2)
        first = torch.tensor([seq[:self.max_len]], device=dev)
        out.append(self._logprobs(first)[0].cpu().numpy())
        done = min(len(seq), self.max_len)
        while done < len(seq):
            lo = done - (self.max_len - hop)
            win = seq[lo:lo + self.max_len]
            lp = self._logprobs(torch.tensor([win], device=dev))[0].cpu().numpy()
            take = lp[done - lo:]
            out.append(take)
            done += len(take)
        return np.concatenate(out)

    def sentence_logprobs(self, sentences: Sequence[Sequence[int]]) -> Iterator[tuple[int, np.ndarray]]:
        """For each sentence (neural word ids, no ``<s>``/``</s>``): ``(index, natural-log distributions)``, the
        array ``[len + 1, V]`` holding the next-word distribution after ``<s>``, after ``<s> w1``, ... after the
        whole sentence (the last row predicts ``</s>``). Sentences come in an efficient (length-sorted) order."""
        import torch

        bos, eos = self.vocab.bos_id, self.vocab.eos_id
        lens = np.fromiter((len(s) + 1 for s in sentences), dtype=np.int64, count=len(sentences))
        order = np.argsort(lens, kind="stable")
        was_training = bool(getattr(self.model, "training", False))
        self.model.eval()
        try:
            with torch.no_grad():
                i = 0
                while i < len(order):
                    n = int(lens[order[i]])
                    if self.max_len is not None and n > self.max_len:
                        s = int(order[i])
                        yield s, self._long([bos, *sentences[s]])
                        i += 1
                        continue
                    j = i
                    longest = n
                    while j < len(order):
                        nn_ = int(lens[order[j]])
                        if self.max_len is not None and nn_ > self.max_len:
                            break
                        if (j - i + 1) * max(longest, nn_) > self.batch_tokens and j > i:
                            break
                        longest = max(longest, nn_)
                        j += 1
                    idx = order[i:j]
                    x = np.full((len(idx), longest), eos, dtype=np.int64)  # right padding: causal models ignore it
                    for r, s in enumerate(idx.tolist()):
                        x[r, 0] = bos
                        x[r, 1:lens[s]] = sentences[s]
                    lp = self._logprobs(torch.from_numpy(x).to(self.device)).cpu().numpy()
                    for r, s in enumerate(idx.tolist()):
                        yield s, lp[r, :lens[s]]
                    i = j
        finally:
            if was_training:
                self.model.train()


# ---------------------------------------------------------------------------------------------- corpus


@dataclass
class _Corpus:
    """Sentences as one flat array of target ids ``<s> w .. </s> <s> ...`` plus per-token positions."""

    flat: np.ndarray  # target ids
    pos: np.ndarray  # position in the sentence (<s> = 0)
    starts: np.ndarray  # flat index of each sentence's <s>
    nn_ids: list[list[int]]  # neural ids of each sentence's words


def _encode(sentences: Sequence[Sequence[str]], tid: dict[str, int], t_unk: int, t_bos: int, t_eos: int,
            nn_vocab: Any) -> _Corpus:
    flat: list[int] = []
    starts = []
    nn_ids = []
    for s in sentences:
        starts.append(len(flat))
        flat.append(t_bos)
        flat.extend(tid.get(w, t_unk) for w in s)
        flat.append(t_eos)
        nn_ids.append(nn_vocab.encode(s))
    arr = np.array(flat, dtype=np.int64)
    st = np.array(starts, dtype=np.int64)
    lens = np.diff(np.append(st, len(arr)))
    pos = np.arange(len(arr), dtype=np.int64) - np.repeat(st, lens)
    if (arr < 0).any():
        raise InputError("the corpus has words outside the model vocabulary and the model has no <unk>",
                         expected="an <unk> unigram in the base model")
    return _Corpus(arr, pos, st, nn_ids)


def _context_rows(corpus: _Corpus, keys: list[np.ndarray], mult: int, order: int) -> list[np.ndarray]:
    """``rows[n-1][t]``: row of the n-gram ending at flat index ``t`` among the model's order-n n-grams (-1: absent).

    ``keys[n-1]`` are the sorted keys ``prefix_row * mult + last_id`` (order 1: the word id itself)."""
    ids = corpus.flat
    total = len(ids)
    rows = [ids.copy()]
    for n in range(2, order + 1):
        prev = np.full(total, -1, dtype=np.int64)
        prev[1:] = rows[-1][:-1]
        ok = (corpus.pos >= n - 1) & (prev >= 0)
        cur = np.full(total, -1, dtype=np.int64)
        k = keys[n - 1]
        if ok.any() and len(k):
            q = prev[ok] * mult + ids[ok]
            p = np.searchsorted(k, q)
            pc = np.minimum(p, len(k) - 1)
            cur[ok] = np.where(k[pc] == q, pc, -1)
        rows.append(cur)
    return rows


# ---------------------------------------------------------------------------------------------- neural pass


def _target_map(nn_words: Sequence[str], t_vocab: Sequence[str], t_unigram_lp: np.ndarray | None
                ) -> tuple[np.ndarray, np.ndarray]:
    """``(col, mult)``: target word ``t`` takes ``mult[t] * P_nn[col[t]]`` before renormalisation."""
    nn_index = {w: i for i, w in enumerate(nn_words)}
    nn_unk = nn_index.get(UNK, -1)
    col = np.zeros(len(t_vocab), dtype=np.int64)
    mult = np.ones(len(t_vocab))
    group = []
    for t, w in enumerate(t_vocab):
        if w == BOS:
            mult[t] = 0.0
        elif w in nn_index and w != UNK:
            col[t] = nn_index[w]
        else:
            group.append(t)
    if group:
        g = np.array(group, dtype=np.int64)
        if nn_unk < 0:
            mult[g] = 0.0
        else:
            col[g] = nn_unk
            if t_unigram_lp is None:
                mult[g] = 1.0 / len(g)
            else:
                p = 10.0 ** t_unigram_lp[g]
                mult[g] = p / p.sum() if p.sum() > 0 else 1.0 / len(g)
    return col, mult


def _identity(col: np.ndarray, mult: np.ndarray, v_nn: int) -> bool:
    return len(col) == v_nn and bool((col == np.arange(v_nn)).all()) and bool((mult[mult != 0] == 1).all())


def _neural_pass(source: ModelSource, corpus: _Corpus, col: np.ndarray, mult: np.ndarray,
                 consume: Callable[[np.ndarray, np.ndarray], None], *, chunk_positions: int = 2048,
                 progress: Callable[[int, int], None] | None = None) -> int:
    """Feed ``consume(flat_positions, probs [P, T])`` with the target-vocabulary distributions (probabilities,
    rows summing to 1) at every predicted corpus position, in chunks. Returns the number of positions."""
    ident = _identity(col, mult, len(source.words))
    buf_pos: list[np.ndarray] = []
    buf_lp: list[np.ndarray] = []
    n_buf = 0
    done = 0
    n_sent = len(corpus.nn_ids)

    def flush() -> None:
        nonlocal buf_pos, buf_lp, n_buf
        if not buf_pos:
            return
        pos = np.concatenate(buf_pos)
        lp = np.concatenate(buf_lp).astype(np.float64)
        if ident:
            p = np.exp(lp)
            p[:, mult == 0] = 0.0
        else:
            p = np.exp(lp)[:, col] * mult
        p /= p.sum(axis=1, keepdims=True)
        consume(pos, p)
        buf_pos, buf_lp, n_buf = [], [], 0

    for k, (s, lp) in enumerate(source.sentence_logprobs(corpus.nn_ids)):
        start = int(corpus.starts[s])
        buf_pos.append(np.arange(start + 1, start + 1 + len(lp), dtype=np.int64))
        buf_lp.append(lp)
        n_buf += len(lp)
        done += len(lp)
        if n_buf >= chunk_positions:
            flush()
        if progress is not None and (k + 1) % 500 == 0:
            progress(k + 1, n_sent)
    flush()
    if progress is not None:
        progress(n_sent, n_sent)
    return done


class _Accumulator:
    """Sums of the target distributions over the occurrences of each history, for the kept n-grams only."""

    def __init__(self, skeleton: NgramModel, corpus: _Corpus) -> None:
        self.order = skeleton.order
        self.v = len(skeleton.vocab)
        self.mult = self.v + 1
        self.keys: list[np.ndarray] = []
        self.words: list[np.ndarray] = []
        self.succ_start: list[np.ndarray] = []
        for n in range(1, self.order + 1):
            pre, last = skeleton.structure(n)
            if n == 1:
                self.keys.append(last.copy())
                self.words.append(last.copy())
                self.succ_start.append(np.zeros(0, dtype=np.int64))
                continue
            self.keys.append(pre * self.mult + last)
            self.words.append(last)
            m_prev = skeleton.num_ngrams(n - 1)
            self.succ_start.append(np.searchsorted(pre, np.arange(m_prev + 1)))
        self.rows = _context_rows(corpus, self.keys, self.mult, self.order)
        self.sums = [np.zeros(self.v)] + [np.zeros(skeleton.num_ngrams(n)) for n in range(2, self.order + 1)]
        self.ctx_count = [np.zeros(1)] + [np.zeros(skeleton.num_ngrams(n - 1)) for n in range(2, self.order + 1)]

    def __call__(self, pos: np.ndarray, p: np.ndarray) -> None:
        self.sums[0] += p.sum(axis=0)
        self.ctx_count[0][0] += len(pos)
        for n in range(2, self.order + 1):
            ctx = self.rows[n - 2][pos - 1]  # the (n-1)-gram ending just before the predicted token
            ok = ctx >= 0
            if not ok.any():
                continue
            r = np.flatnonzero(ok)
            c = ctx[ok]
            self.ctx_count[n - 1] += np.bincount(c, minlength=len(self.ctx_count[n - 1]))
            st = self.succ_start[n - 1]
            lo, hi = st[c], st[c + 1]
            ln = hi - lo
            tot = int(ln.sum())
            if tot == 0:
                continue
            for a, b in _spans(ln, 1 << 22):
                lsub = ln[a:b]
                rep = np.repeat(np.arange(a, b), lsub)
                off = np.arange(len(rep)) - np.repeat(np.cumsum(lsub) - lsub, lsub)
                rows = lo[rep] + off
                vals = p[r[rep], self.words[n - 1][rows]]
                self.sums[n - 1] += np.bincount(rows, weights=vals, minlength=len(self.sums[n - 1]))

    def averages(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per order: ``(mean probability of each kept n-gram, whether its history occurred)``."""
        out = []
        c0 = self.ctx_count[0][0]
        out.append((self.sums[0] / max(c0, 1.0), np.full(self.v, c0 > 0)))
        for n in range(2, self.order + 1):
            pre = self.keys[n - 1] // self.mult
            cnt = self.ctx_count[n - 1][pre]
            seen = cnt > 0
            avg = np.zeros(len(pre))
            avg[seen] = self.sums[n - 1][seen] / cnt[seen]
            out.append((avg, seen))
        return out


def _spans(lengths: np.ndarray, budget: int) -> Iterator[tuple[int, int]]:
    """Cut ``range(len(lengths))`` into consecutive pieces whose lengths sum to about ``budget``."""
    cum = np.cumsum(lengths)
    a = 0
    while a < len(lengths):
        base = cum[a - 1] if a else 0
        b = int(np.searchsorted(cum, base + budget, side="right"))
        b = max(b, a + 1)
        yield a, b
        a = b


def _finish(vocab: Sequence[str], ngram_ids: list[np.ndarray], lps: list[np.ndarray]) -> NgramModel:
    """A model with these n-grams and log10 probabilities, backoff weights recomputed so every history sums to 1."""
    zeros = [np.zeros(len(p)) for p in lps]
    raw = NgramModel.from_arrays(vocab, ngram_ids, lps, zeros)
    tables = NgramTables.from_model(raw)
    bo = recompute_backoffs(tables, tables.lp)
    ids = [raw.ngram_ids(n) for n in range(1, raw.order + 1)]
    probs = [np.asarray(raw.arrays(n)[1]) for n in range(1, raw.order + 1)]
    # tables rows follow the model's entries order except possibly for order 1 (sorted by id there too)
    bows = [bo[n] for n in range(1, raw.order + 1)]
    return NgramModel.from_arrays(vocab, ids, probs, bows)


def _log10(p: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        out = np.log10(p)
    out[~np.isfinite(out)] = _LOG_ZERO
    return out


def _corpus_ngrams(corpus: _Corpus, n: int) -> np.ndarray:
    """Distinct n-grams ``(count, n)`` of target ids in the corpus (none crossing sentences)."""
    end = np.flatnonzero(corpus.pos >= n - 1)
    if not len(end):
        return np.zeros((0, n), dtype=np.int64)
    grams = np.stack([corpus.flat[end - (n - 1) + j] for j in range(n)], axis=1)
    return np.unique(grams, axis=0)


def _check_inputs(sentences: Sequence[Sequence[str]], order: int) -> list[tuple[str, ...]]:
    if isinstance(order, bool) or not isinstance(order, int) or not 1 <= order <= 6:
        raise InputError(f"order {order!r}", expected="an integer in 1..6")
    sents = [tuple(s) for s in sentences]
    if not sents:
        raise InputError("the corpus has no sentences", expected="at least one sentence")
    for s in sents:
        for w in s:
            if w in (BOS, EOS):
                raise InputError(f"the corpus contains {w}", expected="sentences without <s>/</s> (they are added)")
    return sents


# ---------------------------------------------------------------------------------------------- public API


def approximate_ngram(lm: Any, sentences: Sequence[Sequence[str]], order: int = 3, *, topk: int = 0,
                      batch_tokens: int = 4096, progress: Callable[[int, int], None] | None = None,
                      stats: ApproxStats | None = None) -> NgramModel:
    """An n-gram approximation of the neural ``lm`` on ``sentences`` (see the module docstring).

    Args:
        lm: a :class:`~privasr.lm.neural.scorer.NeuralLM` (anything with ``model`` and ``vocab``) or a
            :class:`ModelSource`.
        sentences: the corpus (word sequences without ``<s>``/``</s>``), normally the neural LM's training text.
        order: the n-gram order (1..6).
        topk: besides the corpus n-grams, list after every history occurrence the ``topk`` words the neural model
            finds most probable there (and their suffixes, so that the n-gram set stays suffix-closed as KenLM's
            lookup needs). Costs a second neural pass.
        batch_tokens: input tokens per forward pass.
        progress: called with ``(sentences done, total)`` during each neural pass.
        stats: filled in with counts and timings.

    Returns:
        A normalised backoff :class:`~privasr.lm.ngram.model.NgramModel` over the neural vocabulary.
    """
    t_start = time.perf_counter()
    sents = _check_inputs(sentences, order)
    if isinstance(topk, bool) or not isinstance(topk, int) or topk < 0:
        raise InputError(f"topk {topk!r}", expected="an integer >= 0")
    source = ModelSource.from_lm(lm, batch_tokens=batch_tokens)
    vocab = list(source.words)
    tid = {w: i for i, w in enumerate(vocab)}
    for sp in (UNK, BOS, EOS):
        if sp not in tid:
            raise InputError(f"the neural vocabulary has no {sp}", expected="<unk>, <s> and </s>")
    corpus = _encode(sents, tid, tid[UNK], tid[BOS], tid[EOS], source.vocab)
    col = np.arange(len(vocab), dtype=np.int64)
    mult = np.ones(len(vocab))
    mult[tid[BOS]] = 0.0
    v = len(vocab)
    grams = [np.arange(v, dtype=np.int64)[:, None]] + [_corpus_ngrams(corpus, n) for n in range(2, order + 1)]
    n_seen = [len(g) for g in grams]
    t_nn = 0.0
    if topk and order > 1:
        t0 = time.perf_counter()
        grams = _add_topk(source, corpus, col, mult, grams, topk, progress)
        t_nn += time.perf_counter() - t0
    skeleton = NgramModel.from_arrays(vocab, grams, [np.zeros(len(g)) for g in grams],
                                      [np.zeros(len(g)) for g in grams])
    acc = _Accumulator(skeleton, corpus)
    t0 = time.perf_counter()
    positions = _neural_pass(source, corpus, col, mult, acc, progress=progress)
    t_nn += time.perf_counter() - t0
    ids = [skeleton.ngram_ids(n) for n in range(1, order + 1)]
    lps = []
    for n, (avg, _seen) in enumerate(acc.averages(), 1):
        lp = _log10(avg)
        if n == 1:
            lp[tid[BOS]] = _LOG_ZERO
        lps.append(lp)
    model = _finish(vocab, ids, lps)
    if stats is not None:
        stats.positions, stats.sentences = positions, len(sents)
        stats.ngrams = tuple(model.num_ngrams(n) for n in range(1, order + 1))
        stats.topk_added = tuple(model.num_ngrams(n) - s for n, s in zip(range(1, order + 1), n_seen, strict=True))
        stats.neural_s, stats.total_s = t_nn, time.perf_counter() - t_start
    return model


def _add_topk(source: ModelSource, corpus: _Corpus, col: np.ndarray, mult: np.ndarray, grams: list[np.ndarray],
              k: int, progress: Callable[[int, int], None] | None) -> list[np.ndarray]:
    order = len(grams)
    found: list[list[np.ndarray]] = [[] for _ in range(order)]
    kk = min(k, len(col) - 1)

    def consume(pos: np.ndarray, p: np.ndarray) -> None:
        top = np.argpartition(-p, kk - 1, axis=1)[:, :kk] if kk < p.shape[1] else np.tile(np.arange(p.shape[1]),
                                                                                        (len(p), 1))
        for n in range(2, order + 1):
            ok = corpus.pos[pos] >= n - 1
            if not ok.any():
                continue
            pp = pos[ok]
            ctx = np.stack([corpus.flat[pp - (n - 1) + j] for j in range(n - 1)], axis=1)
            w = top[ok]
            g = np.concatenate([np.repeat(ctx, w.shape[1], axis=0), w.reshape(-1, 1)], axis=1)
            found[n - 1].append(np.unique(g, axis=0))

    _neural_pass(source, corpus, col, mult, consume, progress=progress)
    bos = int(np.flatnonzero(mult == 0)[0]) if (mult == 0).any() else -1
    out = list(grams)
    for n in range(order, 1, -1):
        parts = [out[n - 1], *found[n - 1]]
        g = np.unique(np.concatenate(parts), axis=0)
        if bos >= 0:
            g = g[g[:, -1] != bos]
        out[n - 1] = g
        if n > 2:  # suffix closure: (a b w) needs (b w)
            out[n - 2] = np.unique(np.concatenate([out[n - 2], g[:, 1:]]), axis=0)
    return out


def overwrite_ngram(lm: Any, base: NgramModel, sentences: Sequence[Sequence[str]], *, batch_tokens: int = 4096,
                    progress: Callable[[int, int], None] | None = None,
                    stats: ApproxStats | None = None) -> NgramModel:
    """``base``'s n-grams with the averaged neural probabilities of ``lm`` on ``sentences`` (see the module
    docstring), backoff weights recomputed.

    The vocabulary, order and n-gram set are ``base``'s. Every n-gram whose history occurs in ``sentences``
    gets the average neural probability; n-grams whose history never occurs there keep ``base``'s probability
    (:attr:`ApproxStats.kept_base` counts them); ``<s>`` keeps -99.
    """
    t_start = time.perf_counter()
    sents = _check_inputs(sentences, base.order)
    source = ModelSource.from_lm(lm, batch_tokens=batch_tokens)
    vocab = list(base.vocab)
    tid = {w: i for i, w in enumerate(vocab)}
    if BOS not in tid or EOS not in tid:
        raise InputError("the base model has no <s> or </s> unigram", expected="both, as in every ARPA model")
    uni = np.asarray(base.arrays(1)[1])
    uni_by_id = np.empty(len(vocab))
    uni_by_id[base.ngram_ids(1)[:, 0]] = uni
    col, mult = _target_map(source.words, vocab, uni_by_id)
    corpus = _encode(sents, tid, tid.get(UNK, -1), tid[BOS], tid[EOS], source.vocab)
    acc = _Accumulator(base, corpus)
    t0 = time.perf_counter()
    positions = _neural_pass(source, corpus, col, mult, acc, progress=progress)
    t_nn = time.perf_counter() - t0
    ids = [base.ngram_ids(n) for n in range(1, base.order + 1)]
    lps = []
    kept = 0
    for n, (avg, seen) in enumerate(acc.averages(), 1):
        old = np.asarray(base.arrays(n)[1], dtype=np.float64)
        if n == 1:
            lp = np.empty(len(vocab))
            lp[:] = _log10(avg)  # indexed by word id
            lp = lp[ids[0][:, 0]]
            lp[ids[0][:, 0] == tid[BOS]] = _LOG_ZERO
        else:
            lp = np.where(seen, _log10(np.where(seen, avg, 1.0)), old)
            kept += int((~seen).sum())
        lps.append(lp)
    model = _finish(vocab, ids, lps)
    if stats is not None:
        stats.positions, stats.sentences = positions, len(sents)
        stats.ngrams = tuple(model.num_ngrams(n) for n in range(1, base.order + 1))
        stats.kept_base = kept
        stats.neural_s, stats.total_s = t_nn, time.perf_counter() - t_start
    return model


def check_normalised(model: NgramModel) -> float:
    """The largest ``|sum_w p(w|h) - 1|`` over every history of ``model`` with explicit successors (and the
    empty history), ``<s>`` excluded: 0 up to rounding for a normalised model.

    >>> from privasr.lm.ngram.tables import synthetic_model
    >>> check_normalised(synthetic_model(3, 6)) < 1e-12
    True
    """
    t = NgramTables.from_model(model)
    worst = 0.0
    for h in t.histories():
        worst = max(worst, abs(math.fsum((10.0 ** t.distribution(h)).tolist()) - 1.0))
    return worst
