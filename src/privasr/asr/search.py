"""Search for the acoustic models of :mod:`privasr.asr.models`: greedy and beam search into canonical N-best lists.

Unit level (one :class:`UnitHypothesis` per result: unit ids without ``<sos>``/``<eos>``/``<blank>``, the
natural-log probability the model gives them, the search's ranking score):

* :func:`seq2seq_greedy` -- batched argmax decoding of the attention decoder;
* :func:`seq2seq_beam_search` -- per-utterance beam search (the beam's hypotheses run as one batch). At every
  step the ``beam`` best one-unit extensions of the live hypotheses are kept; those ending in ``<eos>`` are
  finished, the others stay live (so the live set may shrink, as in ESPnet). The search stops when ``beam``
  hypotheses have finished, none is live, or after ``max_len`` decoder steps (the ``<eos>`` step counts;
  ``max_len`` defaults to ``ceil(max_len_ratio * encoder frames)``); hypotheses still live then are returned
  unfinished (no ``<eos>`` in their probability). Finished and unfinished hypotheses are ranked by
  ``logprob / ((5 + n) / 6) ** length_norm + length_penalty * n`` (Wu et al. 2016's length normalisation
  plus a per-unit reward; ``n`` = decoder steps, ``<eos>`` included); with both 0 (the defaults) the score is
  the log-probability. Beam 1 is exactly greedy decoding.
* :func:`ctc_greedy` -- best path, repeats collapsed and blanks dropped; its ``logprob`` is the exact
  ``ln P(units | X)`` of the collapsed sequence (the CTC forward algorithm, summing over all alignments);
* :func:`ctc_prefix_beam_search` -- CTC prefix beam search (Hannun et al. 2014): prefixes carry the
  probabilities of ending in blank / non-blank, so all alignments of a prefix are merged; ``logprob`` =
  ``ln(p_blank + p_nonblank)`` at the last frame (exact when nothing was pruned, a lower bound otherwise).

* :func:`joint_rescore` -- joint CTC/attention scoring (Watanabe et al. 2017) of attention beam hypotheses:
  ``score = (1 - w) * ln P_att(units | X) + w * ln P_ctc(units | X)``, the CTC term exact (forward algorithm), so a
  hypothesis the encoder's alignment cannot support (a looping or truncated attention output) falls behind.

Utterance level: :func:`decode` runs one of them over feature arrays and returns
:class:`~privasr.corpus.records.NBest` lists with the conventions of :mod:`privasr.asr.decode`: the words come
from the tokenizer, hypotheses spelling the same words are merged (the best kept), the list is sorted best
first, every hypothesis has ``scores["am"]`` = its natural-log probability (and ``scores["total"]`` = the
ranking score when length normalisation or a length penalty is on: the list is sorted by it), an unfinished
hypothesis has ``meta["finished"] = False``; the list's ``meta`` names the search. :func:`write_nbest_jsonl`
writes them in the canonical N-best JSON Lines format, so the rescoring tools apply.

>>> import torch
>>> from privasr.asr.models import AcousticConfig, build_model
>>> from privasr.asr.units import CharTokenizer
>>> tok = CharTokenizer.train([("AB", "C")])
>>> model = build_model(AcousticConfig.preset("tiny", input_dim=3), tok, seed=0)
>>> feats = [torch.randn(12, 3, generator=torch.Generator().manual_seed(0))]
>>> nb = decode(model, tok, feats, ["u1"], method="beam", beam=4, nbest=3)[0]
>>> nb.utt_id, len(nb) <= 3, all("am" in h.scores for h in nb)
('u1', True, True)
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F

from privasr.asr.models import (
    BLANK_ID,
    EOS_ID,
    SOS_ID,
    AcousticModel,
    CtcModel,
    Seq2SeqModel,
    collate,
)
from privasr.asr.units import Tokenizer
from privasr.corpus.formats.nbest_jsonl import write_nbest
from privasr.corpus.records import Hypothesis, NBest
from privasr.errors import ConfigError, InputError

__all__ = [
    "UnitHypothesis",
    "seq2seq_greedy",
    "seq2seq_beam_search",
    "ctc_greedy",
    "ctc_prefix_beam_search",
    "ctc_beam_search",
    "joint_rescore",
    "to_nbest",
    "decode",
    "write_nbest_jsonl",
    "decode_to_jsonl",
]


@dataclass(frozen=True, slots=True)
class UnitHypothesis:
    """One search result: ``units`` (ids, no specials), ``logprob`` (natural log), ``score`` (ranking score),
    ``finished`` (``False`` when the attention decoder hit ``max_len`` before ``<eos>``)."""

    units: tuple[int, ...]
    logprob: float
    score: float
    finished: bool = True


# --------------------------------------------------------------------------------------------- helpers


@contextlib.contextmanager
def _evaluating(model: torch.nn.Module) -> Iterator[None]:
    was = model.training
    model.eval()
    try:
        with torch.inference_mode():
            yield
    finally:
        model.train(was)


def _check_int(v: Any, name: str, lo: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < lo:
        raise ConfigError(f"{name}={v!r}", expected=f"an integer >= {lo}")
    return int(v)


def _check_float(v: Any, name: str, lo: float | None = None) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or (lo is not None and v < lo):
        raise ConfigError(f"{name}={v!r}", expected="a finite number" + (f" >= {lo}" if lo is not None else ""))
    return float(v)


def _beam_args(beam: Any, nbest: Any) -> tuple[int, int]:
    beam = _check_int(beam, "beam")
    nbest = beam if nbest is None else _check_int(nbest, "nbest")
    if nbest > beam:
        raise ConfigError(f"nbest={nbest} is larger than beam={beam}", expected="nbest <= beam")
    return beam, nbest


def _inputs(model: AcousticModel, feats: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(feats, torch.Tensor) or feats.dim() != 3:
        raise InputError(f"features of shape {tuple(getattr(feats, 'shape', ()))}", expected="a [batch, frames, dim] tensor")
    if feats.shape[0] == 0:
        raise InputError("empty batch (no utterances)", expected="at least one utterance")
    lengths = torch.as_tensor(lengths, dtype=torch.long).cpu()
    if lengths.numel() != feats.shape[0] or (lengths < 1).any():
        bad = (lengths < 1).nonzero().flatten().tolist()
        if bad:
            raise InputError(f"utterance {bad[0]}: zero-length input (0 frames)", expected="at least one frame")
        raise InputError(f"{lengths.numel()} lengths for {feats.shape[0]} utterances", expected="one length each")
    return feats.to(model.device), lengths


def _rank_score(logprob: float, n: int, length_norm: float, length_penalty: float) -> float:
    if length_norm:
        logprob = logprob / ((5.0 + n) / 6.0) ** length_norm
    return logprob + length_penalty * n


def _limits(enc_lengths: torch.Tensor, max_len: int | None, max_len_ratio: float) -> list[int]:
    if max_len is not None:
        return [max_len] * enc_lengths.numel()
    return [max(1, math.ceil(max_len_ratio * int(n))) for n in enc_lengths.tolist()]


def _seq2seq(model: AcousticModel) -> Seq2SeqModel:
    if not isinstance(model, Seq2SeqModel):
        raise ConfigError(f"attention search needs a Seq2SeqModel, got {type(model).__name__}",
                          expected="a seq2seq model (use the ctc_* functions for CTC)")
    return model


# --------------------------------------------------------------------------------------------- seq2seq


def seq2seq_greedy(model: Seq2SeqModel, feats: torch.Tensor, lengths: torch.Tensor, *, max_len: int | None = None,
                   max_len_ratio: float = 1.0) -> list[UnitHypothesis]:
    """Batched greedy decoding of the attention decoder: one :class:`UnitHypothesis` per utterance.

    >>> from privasr.asr.models import AcousticConfig, build_model
    >>> m = build_model(AcousticConfig.preset("tiny", input_dim=2, vocab_size=6), seed=0)
    >>> hyps = seq2seq_greedy(m, torch.randn(2, 5, 2), torch.tensor([5, 3]), max_len=4)
    >>> len(hyps), all(len(h.units) <= 4 and h.logprob <= 0 for h in hyps)
    (2, True)
    """
    m = _seq2seq(model)
    max_len = None if max_len is None else _check_int(max_len, "max_len")
    ratio = _check_float(max_len_ratio, "max_len_ratio", 0.0)
    feats, lengths = _inputs(m, feats, lengths)
    with _evaluating(m):
        mem = m.memory(feats, lengths)
        limits = _limits(mem.lengths, max_len, ratio)
        b = feats.shape[0]
        state = m.initial_state(mem)
        prev = torch.full((b,), SOS_ID, dtype=torch.long, device=feats.device)
        units: list[list[int]] = [[] for _ in range(b)]
        logp = [0.0] * b
        done = [False] * b
        finished = [False] * b
        for t in range(max(limits)):
            logits, state = m.step(prev, state, mem)
            lp = F.log_softmax(logits.float(), dim=-1)
            best = lp.argmax(-1)
            best_lp = lp.gather(1, best[:, None]).squeeze(1).tolist()
            best_l = best.tolist()
            for k in range(b):
                if done[k]:
                    continue
                logp[k] += best_lp[k]
                if best_l[k] == EOS_ID:
                    done[k] = finished[k] = True
                else:
                    units[k].append(best_l[k])
                    if t + 1 >= limits[k]:
                        done[k] = True
            if all(done):
                break
            prev = best
    return [UnitHypothesis(tuple(u), lp_, lp_, f) for u, lp_, f in zip(units, logp, finished, strict=True)]


def seq2seq_beam_search(model: Seq2SeqModel, feats: torch.Tensor, lengths: torch.Tensor, *, beam: int = 8,
                        nbest: int | None = None, max_len: int | None = None, max_len_ratio: float = 1.0,
                        length_norm: float = 0.0, length_penalty: float = 0.0) -> list[list[UnitHypothesis]]:
    """Beam search of the attention decoder (see the module documentation), per utterance of the batch.

    Returns, per utterance, up to ``nbest`` (default ``beam``) hypotheses sorted by score, best first.

    >>> from privasr.asr.models import AcousticConfig, build_model
    >>> m = build_model(AcousticConfig.preset("tiny", input_dim=2, vocab_size=6), seed=0)
    >>> x, n = torch.randn(1, 5, 2), torch.tensor([5])
    >>> out = seq2seq_beam_search(m, x, n, beam=3, max_len=4)[0]
    >>> [h.score for h in out] == sorted((h.score for h in out), reverse=True)
    True
    >>> seq2seq_beam_search(m, x, n, beam=1)[0][0].units == seq2seq_greedy(m, x, n)[0].units
    True
    """
    m = _seq2seq(model)
    beam, nbest = _beam_args(beam, nbest)
    max_len = None if max_len is None else _check_int(max_len, "max_len")
    ratio = _check_float(max_len_ratio, "max_len_ratio", 0.0)
    alpha = _check_float(length_norm, "length_norm", 0.0)
    beta = _check_float(length_penalty, "length_penalty")
    feats, lengths = _inputs(m, feats, lengths)
    out: list[list[UnitHypothesis]] = []
    with _evaluating(m):
        mem_all = m.memory(feats, lengths)
        limits = _limits(mem_all.lengths, max_len, ratio)
        for b in range(feats.shape[0]):
            n_enc = int(mem_all.lengths[b])
            one = torch.tensor([b], device=feats.device)
            mem = mem_all.select(one)
            mem = mem._replace(enc=mem.enc[:, :n_enc], projected=mem.projected[:, :n_enc], mask=mem.mask[:, :n_enc])
            out.append(_beam_one(m, mem, beam, nbest, limits[b], alpha, beta))
    return out


def _beam_one(m: Seq2SeqModel, mem: Any, beam: int, nbest: int, limit: int, alpha: float,
              beta: float) -> list[UnitHypothesis]:
    device = mem.enc.device
    state = m.initial_state(mem)
    live: list[tuple[int, ...]] = [()]
    live_lp = torch.zeros(1, device=device, dtype=torch.float64)
    finished: list[UnitHypothesis] = []
    prev = torch.full((1,), SOS_ID, dtype=torch.long, device=device)
    for t in range(limit):
        k = len(live)
        rows = torch.zeros(k, dtype=torch.long, device=device)
        logits, state = m.step(prev, state, mem.select(rows))
        lp = F.log_softmax(logits.float(), dim=-1).double()
        cand = (live_lp[:, None] + lp).flatten()
        top_lp, top_idx = cand.topk(min(beam, cand.numel()))
        v = lp.shape[1]
        keep_rows, keep_units, keep_lp, new_live = [], [], [], []
        for s, i in zip(top_lp.tolist(), top_idx.tolist(), strict=True):
            r, u = divmod(i, v)
            if u == EOS_ID:
                finished.append(UnitHypothesis(live[r], s, _rank_score(s, t + 1, alpha, beta), True))
            else:
                keep_rows.append(r)
                keep_units.append(u)
                keep_lp.append(s)
                new_live.append((*live[r], u))
        if not new_live or len(finished) >= beam:
            live = []
            break
        idx = torch.tensor(keep_rows, dtype=torch.long, device=device)
        state = state.select(idx)
        prev = torch.tensor(keep_units, dtype=torch.long, device=device)
        live_lp = torch.tensor(keep_lp, dtype=torch.float64, device=device)
        live = new_live
    n = len(live[0]) if live else 0
    for units, s in zip(live, live_lp.tolist(), strict=False):
        finished.append(UnitHypothesis(units, s, _rank_score(s, n, alpha, beta), False))
    finished.sort(key=lambda h: (-h.score, h.units))
    return finished[:nbest]


# ------------------------------------------------------------------------------------------------- CTC


def _ctc_log_probs(model: AcousticModel, feats: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    fn = getattr(model, "ctc_log_probs", None)
    if fn is None:
        raise ConfigError(f"{type(model).__name__} has no CTC output", expected="a CtcModel or a seq2seq model "
                          "with ctc_weight > 0")
    feats, lengths = _inputs(model, feats, lengths)
    lp, n = fn(feats, lengths)
    return lp.float(), n.cpu()


def _ctc_sequence_logprob(lp: torch.Tensor, units: Sequence[int]) -> float:
    """``ln P(units | X)`` for one utterance's ``[T, V]`` log-probabilities (the CTC forward algorithm)."""
    t = lp.shape[0]
    tg = torch.tensor([list(units)], dtype=torch.long)
    nll = F.ctc_loss(lp[:, None, :].cpu(), tg if units else torch.zeros(1, 1, dtype=torch.long),
                     torch.tensor([t]), torch.tensor([len(units)]), blank=BLANK_ID, reduction="sum")
    return -float(nll)


def ctc_greedy(model: AcousticModel, feats: torch.Tensor, lengths: torch.Tensor) -> list[UnitHypothesis]:
    """Best-path CTC decoding (repeats collapsed, blanks dropped); ``logprob`` is the exact ``ln P(units | X)``.

    >>> from privasr.asr.models import AcousticConfig, build_model
    >>> m = build_model(AcousticConfig.preset("tiny", arch="ctc", input_dim=2, vocab_size=6), seed=0)
    >>> [h.logprob <= 0 for h in ctc_greedy(m, torch.randn(2, 5, 2), torch.tensor([5, 2]))]
    [True, True]
    """
    with _evaluating(model):
        lp, n = _ctc_log_probs(model, feats, lengths)
        best = lp.argmax(-1).cpu().tolist()
        out = []
        for b, path in enumerate(best):
            units: list[int] = []
            last = BLANK_ID
            for u in path[: int(n[b])]:
                if u != last and u != BLANK_ID:
                    units.append(u)
                last = u
            s = _ctc_sequence_logprob(lp[b, : int(n[b])], units)
            out.append(UnitHypothesis(tuple(units), s, s))
    return out


def _logaddexp(a: float, b: float) -> float:
    if a == -math.inf:
        return b
    if b == -math.inf:
        return a
    return max(a, b) + math.log1p(math.exp(-abs(a - b)))


def ctc_prefix_beam_search(log_probs: np.ndarray | torch.Tensor, *, beam: int = 8, nbest: int | None = None,
                           blank: int = BLANK_ID, exclude: Sequence[int] = (SOS_ID, EOS_ID),
                           unit_beam: int | None = None) -> list[UnitHypothesis]:
    """CTC prefix beam search over one utterance's ``[T, V]`` natural-log probabilities.

    ``beam`` prefixes survive each frame; ``unit_beam`` (default: all) limits the units tried per frame to
    the most probable ones; units in ``exclude`` are never emitted. Returns up to ``nbest`` (default
    ``beam``) prefixes, most probable first, with ``logprob = score = ln(p_blank + p_nonblank)``.

    >>> lp = np.log(np.array([[0.6, 0.4, 0.0], [0.6, 0.4, 0.0]]) + 1e-30)   # blank = 0, unit 1
    >>> [(h.units, round(math.exp(h.logprob), 2)) for h in ctc_prefix_beam_search(lp, beam=2, exclude=())]
    [((1,), 0.64), ((), 0.36)]
    """
    beam, nbest = _beam_args(beam, nbest)
    lp = log_probs.detach().cpu().double().numpy() if isinstance(log_probs, torch.Tensor) \
        else np.asarray(log_probs, dtype=np.float64)
    if lp.ndim != 2 or lp.shape[0] == 0:
        raise InputError(f"log-probabilities of shape {lp.shape}", expected="[frames >= 1, units]")
    v = lp.shape[1]
    if not 0 <= blank < v:
        raise ConfigError(f"blank={blank} for {v} units", expected=f"0..{v - 1}")
    allowed = np.array([u for u in range(v) if u != blank and u not in set(exclude)], dtype=np.int64)
    if unit_beam is not None:
        unit_beam = _check_int(unit_beam, "unit_beam")
    ninf = -math.inf
    beams: dict[tuple[int, ...], tuple[float, float]] = {(): (0.0, ninf)}
    for t in range(lp.shape[0]):
        row = lp[t]
        units = allowed
        if unit_beam is not None and unit_beam < len(allowed):
            units = allowed[np.argsort(-row[allowed], kind="stable")[:unit_beam]]
        unit_lp = row[units].tolist()
        units_l = units.tolist()
        lb = float(row[blank])
        nxt: dict[tuple[int, ...], list[float]] = {}
        for prefix, (pb, pnb) in beams.items():
            total = _logaddexp(pb, pnb)
            cur = nxt.setdefault(prefix, [ninf, ninf])
            cur[0] = _logaddexp(cur[0], total + lb)
            last = prefix[-1] if prefix else None
            if last is not None:
                cur[1] = _logaddexp(cur[1], pnb + float(row[last]))
            for u, lu in zip(units_l, unit_lp, strict=True):
                ext = (*prefix, u)
                e = nxt.setdefault(ext, [ninf, ninf])
                e[1] = _logaddexp(e[1], (pb if u == last else total) + lu)
        ranked = sorted(nxt.items(), key=lambda kv: (-_logaddexp(*kv[1]), kv[0]))[:beam]
        beams = {k: (p[0], p[1]) for k, p in ranked}
    out = [UnitHypothesis(k, s, s) for k, s in ((k, _logaddexp(*p)) for k, p in beams.items()) if s > ninf]
    out.sort(key=lambda h: (-h.score, h.units))
    return out[:nbest]


def ctc_beam_search(model: AcousticModel, feats: torch.Tensor, lengths: torch.Tensor, *, beam: int = 8,
                    nbest: int | None = None, unit_beam: int | None = None) -> list[list[UnitHypothesis]]:
    """:func:`ctc_prefix_beam_search` of each utterance of a batch (a :class:`~privasr.asr.models.CtcModel`
    or a seq2seq model with a CTC head).

    >>> from privasr.asr.models import AcousticConfig, build_model
    >>> m = build_model(AcousticConfig.preset("tiny", arch="ctc", input_dim=2, vocab_size=6), seed=0)
    >>> [len(h) for h in ctc_beam_search(m, torch.randn(2, 4, 2), torch.tensor([4, 1]), beam=3)]
    [3, 3]
    """
    beam, nbest = _beam_args(beam, nbest)
    with _evaluating(model):
        lp, n = _ctc_log_probs(model, feats, lengths)
    return [ctc_prefix_beam_search(lp[b, : int(n[b])], beam=beam, nbest=nbest, unit_beam=unit_beam)
            for b in range(lp.shape[0])]


IMPOSSIBLE_CTC = -1e9
"""The CTC log-probability given to units no alignment over the frames can produce (too many for the frames)."""


def joint_rescore(model: AcousticModel, feats: torch.Tensor, lengths: torch.Tensor,
                  hyps: Sequence[Sequence[UnitHypothesis]], *, ctc_weight: float) -> list[list[UnitHypothesis]]:
    """Re-rank each utterance's hypotheses by ``(1 - ctc_weight) * logprob + ctc_weight * ln P_ctc(units | X)``
    (the model's CTC head: a :class:`~privasr.asr.models.Seq2SeqModel` with ``ctc_weight > 0``); ``logprob`` is
    kept, ``score`` becomes the joint score, and the lists come back sorted by it, best first.

    >>> from privasr.asr.models import AcousticConfig, build_model
    >>> m = build_model(AcousticConfig.preset("tiny", input_dim=2, vocab_size=6, ctc_weight=0.3), seed=0)
    >>> x, n = torch.randn(1, 6, 2), torch.tensor([6])
    >>> out = joint_rescore(m, x, n, seq2seq_beam_search(m, x, n, beam=3, max_len=4), ctc_weight=0.3)[0]
    >>> [h.score for h in out] == sorted((h.score for h in out), reverse=True)
    True
    >>> joint_rescore(m, x, n, [[]], ctc_weight=1.5)
    Traceback (most recent call last):
    ...
    privasr.errors.ConfigError: ctc_weight=1.5 (expected a number in [0, 1])
    """
    w = _check_float(ctc_weight, "ctc_weight", 0.0)
    if w > 1:
        raise ConfigError(f"ctc_weight={ctc_weight!r}", expected="a number in [0, 1]")
    if len(hyps) != feats.shape[0]:
        raise InputError(f"{len(hyps)} hypothesis lists for {feats.shape[0]} utterances", expected="one per utterance")
    with _evaluating(model):
        lp, n = _ctc_log_probs(model, feats, lengths)
    out = []
    for b, hs in enumerate(hyps):
        frames = lp[b, : int(n[b])]
        rescored = []
        for h in hs:
            c = _ctc_sequence_logprob(frames, h.units)
            c = c if math.isfinite(c) else IMPOSSIBLE_CTC
            rescored.append(UnitHypothesis(h.units, h.logprob, (1.0 - w) * h.logprob + w * c, h.finished))
        rescored.sort(key=lambda h: (-h.score, h.units))
        out.append(rescored)
    return out


# ---------------------------------------------------------------------------------------------- N-best


def to_nbest(utt_id: str, hyps: Sequence[UnitHypothesis], tokenizer: Tokenizer, *, ref: Sequence[str] | None = None,
             speaker: str | None = None, client: str | None = None, with_total: bool = False,
             meta: dict[str, Any] | None = None) -> NBest:
    """An :class:`NBest` of unit hypotheses: words from ``tokenizer``, hypotheses with the same words merged
    (the best score kept), sorted by score, best first; ``scores = {"am": logprob}`` (plus ``"total": score``
    with ``with_total``); unfinished hypotheses get ``meta["finished"] = False``.

    >>> from privasr.asr.units import CharTokenizer
    >>> tok = CharTokenizer.train([("A", "B")])
    >>> hs = [UnitHypothesis((5, 4, 6), -1.0, -1.0), UnitHypothesis((5, 4, 4, 6), -0.5, -0.5),
    ...       UnitHypothesis((5,), -2.0, -2.0)]
    >>> [(h.text, h.scores["am"]) for h in to_nbest("u", hs, tok)]
    [('A B', -0.5), ('A', -2.0)]
    """
    best: dict[tuple[str, ...], UnitHypothesis] = {}
    for h in sorted(hyps, key=lambda h: (-h.score, h.units)):
        words = tokenizer.decode(h.units)
        if words not in best:
            best[words] = h
    out = []
    for words, h in best.items():
        scores = {"am": h.logprob, **({"total": h.score} if with_total else {})}
        out.append(Hypothesis(words, scores=scores, meta=None if h.finished else {"finished": False}))
    return NBest(utt_id, tuple(out), client=client, speaker=speaker, ref=None if ref is None else tuple(ref),
                 meta=meta)


Method = Literal["greedy", "beam"]
Head = Literal["auto", "attention", "ctc", "joint"]


def _joint_head(model: AcousticModel, method: str, head: str, ctc_weight: float | None) -> tuple[bool, float | None]:
    """Check ``method`` and ``head``; whether the search is joint, and the CTC weight (the model's by default)."""
    if method not in ("greedy", "beam"):
        raise ConfigError(f"method={method!r}", expected="'greedy' or 'beam'")
    if head not in ("auto", "attention", "ctc", "joint"):
        raise ConfigError(f"head={head!r}", expected="'auto', 'attention', 'ctc' or 'joint'")
    if head != "joint":
        return False, ctc_weight
    if method != "beam":
        raise ConfigError("head='joint' with method='greedy'", expected="method='beam' (joint scoring re-ranks "
                          "the attention beam)")
    if not isinstance(model, Seq2SeqModel) or not model.config.ctc_weight:
        raise ConfigError(f"head='joint' needs a seq2seq model with a CTC head, got {type(model).__name__}",
                          expected="a Seq2SeqModel with ctc_weight > 0")
    return True, model.config.ctc_weight if ctc_weight is None else ctc_weight


def _search_batch(model: AcousticModel, x: torch.Tensor, n: torch.Tensor, *, use_ctc: bool, method: str,
                  joint: bool, beam: int, nbest: int | None, max_len: int | None, max_len_ratio: float,
                  length_norm: float, length_penalty: float, unit_beam: int | None,
                  ctc_weight: float | None) -> list[list[UnitHypothesis]]:
    """One batch's hypotheses per utterance, by the search :func:`decode` chose."""
    if use_ctc:
        return [[h] for h in ctc_greedy(model, x, n)] if method == "greedy" else \
            ctc_beam_search(model, x, n, beam=beam, nbest=nbest, unit_beam=unit_beam)
    if method == "greedy":
        return [[h] for h in seq2seq_greedy(model, x, n, max_len=max_len, max_len_ratio=max_len_ratio)]
    results = seq2seq_beam_search(model, x, n, beam=beam, nbest=beam if joint else nbest, max_len=max_len,
                                  max_len_ratio=max_len_ratio, length_norm=length_norm,
                                  length_penalty=length_penalty)
    if joint:
        results = [r[:nbest] for r in joint_rescore(model, x, n, results,
                                                    ctc_weight=ctc_weight)]  # type: ignore[arg-type]
    return results


def decode(model: AcousticModel, tokenizer: Tokenizer, features: Sequence[Any], utt_ids: Sequence[str], *,
           method: Method = "beam", head: Head = "auto", beam: int = 8, nbest: int | None = None,
           batch_size: int = 16, max_len: int | None = None, max_len_ratio: float = 1.0,
           length_norm: float = 0.0, length_penalty: float = 0.0, unit_beam: int | None = None,
           refs: Sequence[Sequence[str]] | None = None, speakers: Sequence[str] | None = None,
           clients: Sequence[str] | None = None, ctc_weight: float | None = None) -> list[NBest]:
    """Decode feature arrays ``[T_i, F]`` into one :class:`NBest` per utterance (in input order).

    ``head="auto"`` searches with the attention decoder of a :class:`~privasr.asr.models.Seq2SeqModel` and
    with the CTC output of a :class:`~privasr.asr.models.CtcModel`; ``"ctc"`` uses the CTC head of a joint
    model; ``"joint"`` (beam only) re-ranks the attention beam by :func:`joint_rescore` with ``ctc_weight``
    (default: the weight the model was trained with; ``scores["total"]`` is the joint score, ``scores["am"]``
    the attention log-probability). ``method="greedy"`` gives one hypothesis per utterance; ``"beam"`` up to ``nbest`` (default
    ``beam``). The other options go to the search functions of this module. ``refs``, ``speakers`` and
    ``clients`` (one per utterance) are attached to the lists.

    >>> from privasr.asr.models import AcousticConfig, build_model
    >>> from privasr.asr.units import CharTokenizer
    >>> tok = CharTokenizer.train([("AB",)])
    >>> m = build_model(AcousticConfig.preset("tiny", arch="ctc", input_dim=2), tok, seed=0)
    >>> nbs = decode(m, tok, [np.zeros((4, 2))], ["x"], method="greedy", refs=[("AB",)])
    >>> nbs[0].utt_id, len(nbs[0]), nbs[0].ref, nbs[0].meta["search"]
    ('x', 1, ('AB',), 'ctc-greedy')
    >>> decode(m, tok, [np.zeros((0, 2))], ["x"])
    Traceback (most recent call last):
    ...
    privasr.errors.InputError: utterance 'x': zero-length features (0 frames) (expected at least one frame)
    """
    feats = list(features)
    ids = list(utt_ids)
    if len(ids) != len(feats):
        raise InputError(f"{len(feats)} feature arrays but {len(ids)} utterance ids", expected="one id per utterance")
    for name, extra in (("refs", refs), ("speakers", speakers), ("clients", clients)):
        if extra is not None and len(extra) != len(feats):
            raise InputError(f"{len(extra)} {name} for {len(feats)} utterances", expected="one per utterance")
    joint, ctc_weight = _joint_head(model, method, head, ctc_weight)
    batch_size = _check_int(batch_size, "batch_size")
    if method == "beam":
        beam, nbest = _beam_args(beam, nbest)
    use_ctc = isinstance(model, CtcModel) if head == "auto" else head == "ctc"
    if not use_ctc:
        _seq2seq(model)
    search = ("ctc-" if use_ctc else "joint-" if joint else "attention-") + ("greedy" if method == "greedy" else "beam")
    with_total = joint or (not use_ctc and method == "beam" and (length_norm != 0 or length_penalty != 0))
    meta = {"search": search, **({"beam": beam} if method == "beam" else {}),
            **({"ctc_weight": ctc_weight} if joint else {})}
    out: list[NBest] = []
    for start in range(0, len(feats), batch_size):
        batch = collate(feats[start: start + batch_size], utt_ids=ids[start: start + batch_size])
        results = _search_batch(model, batch.feats, batch.feat_lengths, use_ctc=use_ctc, method=method, joint=joint,
                                beam=beam, nbest=nbest, max_len=max_len, max_len_ratio=max_len_ratio,
                                length_norm=length_norm, length_penalty=length_penalty, unit_beam=unit_beam,
                                ctc_weight=ctc_weight)
        for k, hyps in enumerate(results, start):
            out.append(to_nbest(ids[k], hyps, tokenizer, ref=None if refs is None else refs[k],
                                speaker=None if speakers is None else speakers[k],
                                client=None if clients is None else clients[k], with_total=with_total,
                                meta=dict(meta)))
    return out


def write_nbest_jsonl(path: str | Path, records: Sequence[NBest]) -> int:
    """Write N-best lists with the canonical JSON Lines writer (:func:`privasr.corpus.formats.nbest_jsonl.write_nbest`).

    >>> import tempfile, pathlib
    >>> from privasr.corpus.formats.nbest_jsonl import read_nbest
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "am.jsonl"
    >>> recs = [NBest("u", (Hypothesis(("A",), scores={"am": -0.25}),), meta={"search": "ctc-greedy"})]
    >>> write_nbest_jsonl(p, recs), read_nbest(p) == recs
    (1, True)
    """
    return write_nbest(path, records)


def decode_to_jsonl(path: str | Path, model: AcousticModel, tokenizer: Tokenizer, features: Sequence[Any],
                    utt_ids: Sequence[str], **options: Any) -> list[NBest]:
    """:func:`decode` then :func:`write_nbest_jsonl`; returns the lists written."""
    records = decode(model, tokenizer, features, utt_ids, **options)
    write_nbest_jsonl(path, records)
    return records
