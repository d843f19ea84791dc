r"""Federated marginal personalisation (FMP; paper 000, Liu & Peng, sections 2 and 4) for N-best rescoring.

The server holds no in-domain text. Each client (an AMI meeting, a speaker, a device) receives its utterances in
time order, split into ``T + 1`` groups; group ``t`` is decoded and rescored in round ``t`` (section 3.2). The
NNLM's scores of every hypothesis are computed once beforehand by the experiment harness, so no network runs
here: the client data is an :class:`FmpClient` of :class:`FmpUtterance` (word ids per hypothesis and the
baseline total score of each).

**Adapted scores (eqs. 1-2).** Eq. (1) rescales the NNLM by ``(g_i(w) / u(w)) ** lambda``; rescoring uses it
unnormalised (section 2.1), so hypothesis ``s = w_1 .. w_m`` of an utterance of client ``i`` scores::

    score_i(s) = base(s) + bias_weight * sum_k lambda * ln(g_i(w_k) / u(w_k))
    g_i(w)     = (1 - alpha - beta) u(w) + alpha qbar(w) + beta q_i(w)                              (2)

``base`` is the baseline total (acoustic + tuned weights x (first-pass LM, NNLM) + word penalty), ``bias_weight``
the NNLM's weight in it, ``u`` the background unigram. Before the first aggregation ``qbar := u``; a client with
no cache has ``q_i := u``; so the first group with ``refresh="round"`` is exactly the baseline. The chosen
hypothesis is the argmax (ties go to the better rank). ``ln(g/u)`` is computed only at the words of the utterance
(sparse lookups into the cache, gathers from ``u`` and ``qbar``): a client never builds a vocabulary-sized vector.

**Personal cache (eqs. 3-5).** With ``rank(s) = 1`` for the first hypothesis of the list as given (the harness's
N-best order, best first)::

    K(s)       = exp(-(rank(s) - 1) ** 2 / (2 sigma ** 2))                                           (3)
    cache_i(w) = sum_{s in S_i} K(s) c_s(w),     c_i = sum_w cache_i(w)                             (5)
    q_i(w)     = (cache_i(w) + mu u(w)) / (c_i + mu),     mu = smoothing                            (4)

The "Smoothing" of eq. (4) is a Dirichlet prior toward the background with pseudo-count mass ``mu``: with little
text ``q_i`` stays near ``u`` (``g/u`` near 1), with much text it tends to the relative frequencies; ``mu = 0``
is the unsmoothed estimate. ``<unk>`` (id 0) is counted like any word: ``u(<unk>) > 0``, so its factor is
defined, and a client whose words are often out of vocabulary shifts mass there like for any other word. The
kernel uses the rank in the list, never the adapted ranking, so the counts depend only on what the first pass
heard, not on ``qbar`` or on earlier choices. ``refresh="utterance"`` adds each utterance's counts to the cache
right after it is rescored, so later utterances of the same round use them (section 2.2 allows this);
``refresh="round"`` adds a whole group's counts at the end of the client's round (Algorithm 1).

**Server (eq. 6).** The server averages the clients' *unsmoothed* estimates ``cache_i / c_i`` with weights
``c_i``, i.e. it sums count vectors (the smoothing toward ``u`` is a client-side choice, and eq. 2 mixes ``u``
in again)::

    qbar(w) = sum_i c_i (cache_i(w) / c_i) / sum_i c_i = sum_i cache_i(w) / sum_i c_i                (6)

``send="cumulative"``: each client sends its whole cache and ``qbar`` averages this round's caches only (eq. 6
literally). ``send="increment"``: a client sends only the kernel-weighted counts added since its last report
(the "deltas" of section 2.3; each utterance is released once) and the server keeps the running sum, so ``qbar``
is eq. 6 over everything reported so far. With every client in every round and no noise both give the same
``qbar``. What crosses is a sparse vector, sorted unique word ids with positive float counts, never a word
sequence: a bag of the words of the client's N-best lists, which reveals the words it used to whoever sees the
update (docs/privacy.md); the broadcast is ``qbar`` and the round number, never client data.

**Differential privacy (eqs. 7-9).** ``dp_unit`` bounds the L1 norm of what one unit can add to the released
sums; :func:`~privasr.federated.loop.run_federated` then adds Laplace noise of scale ``b = dp_cap / epsilon``
once per round to the summed vector, and ``qbar = max(sum, 0) / sum(max(sum, 0))`` is post-processing of the
noisy sum (eq. 8 with negative noisy counts clamped so that ``qbar`` stays a distribution). In increment mode
the server keeps the *unclamped* noisy running sum, so noise of later rounds is not biased upward.

* ``dp_unit="utterance"``: an utterance's kernel-weighted count vector is scaled down to L1 norm ``<= dp_cap``
  before it enters the cache. With ``send="increment"`` that capped vector enters exactly one round's sum
  (the round its client next reports), so adding or removing one utterance changes the whole sequence of
  releases by at most ``dp_cap`` in L1. Laplace releases of a query with per-release L1 difference ``d_t``
  lose ``d_t / b``, and those add up; ``sum_t d_t <= dp_cap``, so ``b = dp_cap / epsilon`` per round gives
  ``(epsilon, 0)``-DP per utterance for the whole run: parallel composition over disjoint data
  (``PrivacySettings(composition="parallel")``). With ``dp_cap = 1`` this is the paper's ``Laplace(1/epsilon)``,
  but argued for the whole count vector of an utterance rather than per word.
* ``dp_unit="user"`` (a client): in increment mode the total a client sends over the whole run is capped at
  ``dp_cap``; once it has sent that much it sends nothing more, and the last increment is scaled to fit. The
  L1 differences of all releases a user touches add up to ``<= dp_cap``, so the same ``b`` gives ``(epsilon, 0)``
  user-level DP for the whole run (parallel). In cumulative mode each release (the cache) is scaled to L1
  ``<= dp_cap``.
* ``send="cumulative"``: the same utterance (user) is in every later release, each with sensitivity ``dp_cap``:
  composition is sequential, ``epsilon`` per round (``rounds x epsilon`` with the basic theorem).

:meth:`FmpConfig.privacy_composition` returns which. The round metrics ``sent_mass``, ``utterances`` and
``changed`` are exact simulation diagnostics, not covered by the guarantee, so a run with ``dp_unit`` set does
not report them; ``qbar`` (and the state's noisy sum) are covered. This is central DP: the aggregator that sums
the clients' updates sees them before the noise (each client's capped counts, or only their sum under secure
aggregation), so the guarantee is for the releases, not against it.

**Client state** (a pytree kept on the device, never in an update): the cache (sparse, ``cache_ids`` sorted
unique int64 and ``cache_counts`` float64), the counts not yet sent (``pending_*``, increment mode), ``sent``
(the total released so far, for the user-level cap), ``next_group`` (the first group not yet rescored), the
last global distribution received restricted to the words of the groups still to come (``held_*``), and
``chosen``: ``{utt_id: hypothesis index}`` for every utterance rescored so far (the harness reads it to compute
WER in simulation; in a deployment it is the device's own transcript). A client not sampled in some rounds
still receives its groups in time: when next sampled it first rescores the groups it missed with the ``qbar``
it last received (the background before any), then the current group with the new ``qbar``, as a device that
decodes every utterance on arrival with the latest global distribution it holds. :meth:`FmpAlgorithm.finish`
does the same for the groups that arrive after a client's last report.

>>> import numpy as np
>>> u = np.array([0.1, 0.3, 0.3, 0.3])
>>> said = FmpUtterance("a1", (np.array([2, 2, 2]),), np.array([0.0]))
>>> ask = FmpUtterance("a2", (np.array([1]), np.array([2])), np.array([0.0, -0.1]), bias_weight=0.5)
>>> client = FmpClient("meeting1", ((said, ask),))
>>> alg = FmpAlgorithm(FmpConfig(alpha=0.0, beta=0.5, refresh="utterance"), u)
>>> state = alg.init(np.random.default_rng(0))
>>> update, cstate = alg.client_update(alg.broadcast(state, 0), client, None, np.random.default_rng(0))
>>> cstate["chosen"], update.arrays["ids"].tolist(), update.arrays["counts"].round(3).tolist()
({'a1': 0, 'a2': 1}, [1, 2], [1.0, 3.98])
>>> state, metrics = alg.server_update(state, alg.accumulate(None, update), 0, np.random.default_rng(0))
>>> state["qbar"].round(3).tolist(), metrics["changed"]
([0.0, 0.201, 0.799, 0.0], 1.0)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from privasr.errors import ConfigError, InputError
from privasr.federated.algorithms._config import config_from_dict
from privasr.federated.core import SumAccumulator, Update
from privasr.federated.secagg import SCALAR_BOUND, Summand

__all__ = [
    "FmpUtterance",
    "FmpClient",
    "FmpConfig",
    "FmpAlgorithm",
    "rank_kernel",
    "BackgroundBigram",
    "utterance_counts",
    "personal_unigram",
    "log_factor",
    "adapted_scores",
    "REFRESH",
    "SEND",
    "DP_UNITS",
]

SECAGG_COUNT_BOUND = 4096
"""The default bound of one word's count from one client in one round under secure aggregation."""

ACCUMULATE_BLOCK = 4096
"""Client updates the server folds in per ``np.bincount`` (:meth:`FmpAlgorithm.accumulate_many`)."""

REFRESH = ("utterance", "round")
"""When the personal cache is updated: after every utterance, or at the end of the client's round."""

SEND = ("increment", "cumulative")
"""What a client sends: the counts added since its last report, or its whole cache."""

DP_UNITS = (None, "utterance", "user")
"""The unit whose contribution ``dp_cap`` bounds (``None``: no bound, no differential privacy)."""

_EMPTY_IDS = np.zeros(0, dtype=np.int64)
_EMPTY_VALS = np.zeros(0, dtype=np.float64)
_EMPTY_IDS.setflags(write=False)
_EMPTY_VALS.setflags(write=False)


def _readonly(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


def _is_real(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, int | float | np.integer | np.floating) and math.isfinite(v)


# ---------------------------------------------------------------------------------------------------------------
# client data


@dataclass(frozen=True, eq=False)
class FmpUtterance:
    """One utterance's N-best list as the rescorer sees it: word ids and baseline scores per hypothesis.

    Attributes:
        utt_id: the utterance id (unique within its client; it never leaves the device).
        word_ids: one 1-d integer array per hypothesis, in rank order (best first): ids into the background
            vocabulary, out-of-vocabulary words as 0 (``<unk>``). A hypothesis may be empty.
        base: float64, one per hypothesis: the baseline total score (higher is better), finite.
        bias_weight: the NNLM's weight in that total (the FMP log-factor enters scaled by it), finite, >= 0.

    Raises:
        InputError: naming the utterance, for an empty list, ids that are not non-negative integers, a ``base``
            of another length or with NaN/infinity, or a bad ``bias_weight``.

    >>> utt = FmpUtterance("u1", ([5, 2, 5], [5, 3]), [-1.0, -1.5])
    >>> utt.vocab.tolist(), utt.n_hypotheses
    ([2, 3, 5], 2)
    >>> FmpUtterance("u2", ([1, -2],), [0.0])
    Traceback (most recent call last):
    ...
    privasr.errors.InputError: utterance 'u2', hypothesis 0: negative word id -2 (expected ids >= 0, <unk> = 0)
    """

    utt_id: str
    word_ids: tuple[np.ndarray, ...]
    base: np.ndarray
    bias_weight: float = 1.0
    _inv: np.ndarray = field(init=False, repr=False)
    _hyp: np.ndarray = field(init=False, repr=False)
    _vocab: np.ndarray = field(init=False, repr=False)
    _prev: np.ndarray = field(init=False, repr=False)
    _next: np.ndarray = field(init=False, repr=False)
    _pair_hyp: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        uid = self.utt_id
        if not isinstance(uid, str) or not uid:
            raise InputError(f"utterance id {uid!r}", expected="a non-empty string")
        where = f"utterance {uid!r}"
        hyps = self.word_ids
        if not isinstance(hyps, list | tuple):
            raise InputError(f"{where}: word_ids is a {type(hyps).__name__}",
                             expected="a tuple with one 1-d integer array per hypothesis")
        if not hyps:
            raise InputError(f"{where} has no hypotheses", expected="at least one hypothesis")
        arrays = []
        for k, h in enumerate(hyps):
            a = np.asarray(h)
            if a.size == 0 and a.ndim <= 1:
                a = np.zeros(0, dtype=np.int64)
            if a.ndim != 1 or a.dtype.kind not in "iu":
                raise InputError(f"{where}, hypothesis {k}: word ids of shape {a.shape} and dtype {a.dtype}",
                                 expected="a 1-d integer array")
            if a.size and a.min() < 0:
                raise InputError(f"{where}, hypothesis {k}: negative word id {int(a.min())}",
                                 expected="ids >= 0, <unk> = 0")
            arrays.append(_readonly(a.astype(np.int64, copy=True)))
        try:
            base = np.array(self.base, dtype=np.float64)
        except (TypeError, ValueError):
            raise InputError(f"{where}: base scores are not numbers", expected="one float per hypothesis") from None
        if base.shape != (len(arrays),):
            raise InputError(f"{where}: {base.size} base scores (shape {base.shape}) for {len(arrays)} hypotheses",
                             expected="one base score per hypothesis")
        if not np.all(np.isfinite(base)):
            raise InputError(f"{where}: a base score is NaN or infinite", expected="finite scores")
        bw = self.bias_weight
        if not _is_real(bw) or bw < 0:
            raise InputError(f"{where}: bias_weight {bw!r}", expected="a finite number >= 0")
        lengths = np.array([a.size for a in arrays], dtype=np.int64)
        flat = np.concatenate(arrays) if lengths.sum() else np.zeros(0, dtype=np.int64)
        vocab, inv = np.unique(flat, return_inverse=True)
        object.__setattr__(self, "word_ids", tuple(arrays))
        object.__setattr__(self, "base", _readonly(base))
        object.__setattr__(self, "bias_weight", float(bw))
        object.__setattr__(self, "_vocab", _readonly(vocab.astype(np.int64)))
        object.__setattr__(self, "_inv", _readonly(inv.reshape(-1).astype(np.int64)))
        object.__setattr__(self, "_hyp", _readonly(np.repeat(np.arange(len(arrays), dtype=np.int64), lengths)))
        # consecutive word pairs of every hypothesis (for personal bigram marginals, order 2)
        prev = [a[:-1] for a in arrays]
        nxt = [a[1:] for a in arrays]
        npairs = np.array([p.size for p in prev], dtype=np.int64)
        empty = npairs.sum() == 0
        object.__setattr__(self, "_prev", _readonly(_EMPTY_IDS.copy() if empty else np.concatenate(prev)))
        object.__setattr__(self, "_next", _readonly(_EMPTY_IDS.copy() if empty else np.concatenate(nxt)))
        object.__setattr__(self, "_pair_hyp", _readonly(np.repeat(np.arange(len(arrays), dtype=np.int64), npairs)))

    @property
    def n_hypotheses(self) -> int:
        """The length of the N-best list."""
        return len(self.word_ids)

    @property
    def vocab(self) -> np.ndarray:
        """The sorted unique word ids occurring in any hypothesis (int64, read-only)."""
        return self._vocab


@dataclass(frozen=True, eq=False)
class FmpClient:
    """One client's data: its utterances in time order, split into the groups processed round by round.

    Attributes:
        id: the client's name (a meeting, a speaker, a device).
        groups: ``T + 1`` groups of :class:`FmpUtterance`, in time order; group ``t`` is processed in round ``t``
            (rounds beyond the last group have nothing new to rescore; the client still reports). Groups may be
            empty.

    Raises:
        InputError: for a non-utterance in a group or an utterance id used twice in the client.

    >>> c = FmpClient("m1", ((FmpUtterance("a", ([1],), [0.0]),), ()))
    >>> len(c.groups), c.n_utterances
    (2, 1)
    """

    id: str
    groups: tuple[tuple[FmpUtterance, ...], ...]
    _group_vocab: tuple[np.ndarray, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise InputError(f"client id {self.id!r}", expected="a non-empty string")
        if not isinstance(self.groups, list | tuple):
            raise InputError(f"client {self.id!r}: groups is a {type(self.groups).__name__}",
                             expected="a tuple of groups (tuples of FmpUtterance)")
        groups = []
        seen: set[str] = set()
        for t, g in enumerate(self.groups):
            if not isinstance(g, list | tuple):
                raise InputError(f"client {self.id!r}, group {t} is a {type(g).__name__}",
                                 expected="a tuple of FmpUtterance")
            for utt in g:
                if not isinstance(utt, FmpUtterance):
                    raise InputError(f"client {self.id!r}, group {t} holds a {type(utt).__name__}",
                                     expected="FmpUtterance items")
                if utt.utt_id in seen:
                    raise InputError(f"client {self.id!r}: utterance id {utt.utt_id!r} occurs twice",
                                     expected="unique utterance ids within a client")
                seen.add(utt.utt_id)
            groups.append(tuple(g))
        vocab = tuple(_readonly(np.unique(np.concatenate([u.vocab for u in g])).astype(np.int64)) if g
                      else _EMPTY_IDS for g in groups)
        object.__setattr__(self, "groups", tuple(groups))
        object.__setattr__(self, "_group_vocab", vocab)

    @property
    def n_utterances(self) -> int:
        """The number of utterances over all groups."""
        return sum(len(g) for g in self.groups)

    def vocab_from(self, group: int) -> np.ndarray:
        """The sorted unique word ids of groups ``group, group + 1, ...`` (what is still to be rescored).

        >>> FmpClient("m", ((FmpUtterance("a", ([4, 1],), [0.0]),), (FmpUtterance("b", ([2],), [0.0]),))).vocab_from(1)
        array([2])
        """
        rest = self._group_vocab[max(0, group):]
        if not rest:
            return _EMPTY_IDS
        return np.unique(np.concatenate(rest)).astype(np.int64)


# ---------------------------------------------------------------------------------------------------------------
# configuration


def _choice(name: str, value: Any, allowed: Sequence[Any]) -> Any:
    if value not in allowed or isinstance(value, bool):
        raise ConfigError(f"{name}={value!r}", expected=f"one of {list(allowed)}")
    return value


def _real(name: str, value: Any, *, low: float = 0.0, open_low: bool = False) -> float:
    bad = not _is_real(value) or (value <= low if open_low else value < low)
    if bad:
        raise ConfigError(f"{name}={value!r}", expected=f"a finite number {'>' if open_low else '>='} {low:g}")
    return float(value)


@dataclass(frozen=True)
class FmpConfig:
    """FMP's hyper-parameters (see the module docstring for what each does).

    Attributes:
        alpha: weight of the global distribution in eq. (2), >= 0.
        beta: weight of the personal distribution in eq. (2), >= 0; ``alpha + beta <= 1``.
        sigma: the rank kernel's bandwidth (eq. 3), > 0.
        lam: the exponent lambda of eq. (1), >= 0 (0: no adaptation).
        smoothing: the Dirichlet pseudo-count mass toward the background in eq. (4), >= 0.
        refresh: ``"utterance"`` or ``"round"``: when the personal cache takes in new counts.
        send: ``"increment"`` or ``"cumulative"``: what a client sends each round.
        order: 1 (unigram marginals, the paper) or 2: also personal bigram marginals (the paper's future work),
            kept on the device only (see the module docstring, "Personal bigram marginals").
        beta2: order 2: weight of the personal bigram estimate against the background bigram, in [0, 1].
        lam2: order 2: the exponent of the bigram factor, >= 0.
        smoothing2: order 2: Dirichlet pseudo-counts of the personal bigram estimate toward the background's.
        dp_unit: ``None``, ``"utterance"`` or ``"user"``: whose contribution ``dp_cap`` bounds.
        dp_cap: the L1 bound of one unit's contribution, > 0 (the Laplace mechanism's sensitivity).
        qbar_threshold: entries of the (noisy) global count sum below this are set to 0 before ``qbar`` is
            normalised, >= 0. Post-processing of the released sum, so it costs no privacy; with DP it removes
            the noise floor that would otherwise spread mass over the whole vocabulary and, divided by small
            ``u(w)``, promote rare words.

    Raises:
        ConfigError: naming the field, for a value out of range or of the wrong type.

    >>> try:
    ...     FmpConfig(alpha=0.6, beta=0.5)
    ... except ConfigError as e:
    ...     print(e.message)
    alpha + beta = 1.1
    >>> FmpConfig.from_dict(FmpConfig(sigma=1.0).to_dict()).sigma
    1.0
    """

    alpha: float = 0.5
    beta: float = 0.25
    sigma: float = 5.0
    lam: float = 1.0
    smoothing: float = 1.0
    refresh: str = "utterance"
    send: str = "increment"
    order: int = 1
    beta2: float = 0.5
    lam2: float = 1.0
    smoothing2: float = 1.0
    dp_unit: str | None = None
    dp_cap: float = 1.0
    qbar_threshold: float = 0.0

    def __post_init__(self) -> None:
        alpha = _real("alpha", self.alpha)
        beta = _real("beta", self.beta)
        if alpha + beta > 1.0 + 1e-12:
            raise ConfigError(f"alpha + beta = {alpha + beta:g}",
                              expected="alpha + beta <= 1: 1 - alpha - beta is the background's weight")
        object.__setattr__(self, "alpha", alpha)
        object.__setattr__(self, "beta", beta)
        object.__setattr__(self, "sigma", _real("sigma", self.sigma, open_low=True))
        object.__setattr__(self, "lam", _real("lam", self.lam))
        object.__setattr__(self, "smoothing", _real("smoothing", self.smoothing))
        _choice("refresh", self.refresh, REFRESH)
        _choice("send", self.send, SEND)
        if isinstance(self.order, bool) or not isinstance(self.order, int | np.integer) or self.order not in (1, 2):
            raise ConfigError(f"order={self.order!r}", expected="1 (unigram marginals) or 2 (plus personal bigrams)")
        object.__setattr__(self, "order", int(self.order))
        beta2 = _real("beta2", self.beta2)
        if beta2 > 1.0:
            raise ConfigError(f"beta2={beta2!r}", expected="a weight in [0, 1]")
        object.__setattr__(self, "beta2", beta2)
        object.__setattr__(self, "lam2", _real("lam2", self.lam2))
        object.__setattr__(self, "smoothing2", _real("smoothing2", self.smoothing2))
        _choice("dp_unit", self.dp_unit, DP_UNITS)
        object.__setattr__(self, "dp_cap", _real("dp_cap", self.dp_cap, open_low=True))
        object.__setattr__(self, "qbar_threshold", _real("qbar_threshold", self.qbar_threshold))

    @property
    def background_weight(self) -> float:
        """``1 - alpha - beta``, the background's weight in eq. (2) (clamped at 0).

        >>> FmpConfig().background_weight
        0.25
        """
        return max(0.0, 1.0 - self.alpha - self.beta)

    def to_dict(self) -> dict[str, Any]:
        """The configuration as a plain dict (read back by :meth:`from_dict`).

        >>> FmpConfig().to_dict()["send"]
        'increment'
        """
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> FmpConfig:
        """A config from a dict; missing keys take their defaults.

        Raises:
            ConfigError: for an unknown key or a bad value.

        >>> try:
        ...     FmpConfig.from_dict({"lambda": 1.0})
        ... except ConfigError as e:
        ...     print(e.message)
        unknown FMP setting 'lambda'
        """
        return config_from_dict(cls, d, "FMP")

    def privacy_composition(self) -> str:
        """How the per-round Laplace releases compose for the DP unit (see the module docstring).

        ``"parallel"`` with ``send="increment"`` (each capped unit enters the released sums with total L1 at most
        ``dp_cap`` over the whole run), ``"sequential"`` with ``send="cumulative"`` (every release holds it again).

        >>> FmpConfig(send="increment").privacy_composition(), FmpConfig(send="cumulative").privacy_composition()
        ('parallel', 'sequential')
        """
        return "parallel" if self.send == "increment" else "sequential"

    def sensitivity(self) -> float:
        """The L1 sensitivity of one release for the DP unit: ``dp_cap`` (the Laplace scale is ``dp_cap / eps``).

        Raises:
            ConfigError: when ``dp_unit`` is ``None`` (contributions are then unbounded).

        >>> FmpConfig(dp_unit="utterance", dp_cap=2.0).sensitivity()
        2.0
        """
        if self.dp_unit is None:
            raise ConfigError("FMP has no sensitivity with dp_unit=None (contributions are unbounded)",
                              expected="dp_unit='utterance' or 'user' for differential privacy")
        return self.dp_cap


# ---------------------------------------------------------------------------------------------------------------
# the maths, on sparse vectors


def rank_kernel(n: int, sigma: float) -> np.ndarray:
    """Eq. (3): ``K = exp(-(rank - 1) ** 2 / (2 sigma ** 2))`` for ranks ``1..n`` (float64, length ``n``).

    Small ``sigma`` keeps only the 1-best (the others underflow to 0); large ``sigma`` tends to uniform weights.

    >>> rank_kernel(3, 1.0).round(4).tolist()
    [1.0, 0.6065, 0.1353]
    >>> rank_kernel(3, 0.01).tolist()
    [1.0, 0.0, 0.0]
    """
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 0:
        raise ConfigError(f"n={n!r}", expected="an integer >= 0")
    sigma = _real("sigma", sigma, open_low=True)
    r = np.arange(int(n), dtype=np.float64)
    return np.exp(-(r * r) / (2.0 * sigma * sigma))


def utterance_counts(utt: FmpUtterance, sigma: float) -> tuple[np.ndarray, np.ndarray]:
    """An utterance's kernel-weighted word counts ``sum_s K(s) c_s(w)``, sparse: (sorted ids, positive values).

    Words whose only occurrences have weight 0 (after underflow) are left out, so nothing reveals them.

    >>> utt = FmpUtterance("u", ([1, 2, 2], [1, 3]), [0.0, -1.0])
    >>> ids, vals = utterance_counts(utt, 1.0)
    >>> ids.tolist(), vals.round(4).tolist()
    ([1, 2, 3], [1.6065, 2.0, 0.6065])
    """
    k = rank_kernel(utt.n_hypotheses, sigma)
    vals = np.bincount(utt._inv, weights=k[utt._hyp], minlength=utt.vocab.size).astype(np.float64)
    keep = vals > 0
    return utt.vocab[keep].copy(), vals[keep]


def personal_unigram(ids: np.ndarray, cache_ids: np.ndarray, cache_counts: np.ndarray, u: np.ndarray,
                     smoothing: float) -> np.ndarray:
    """Eq. (4): ``q_i(w) = (cache(w) + mu u(w)) / (c + mu)`` at the words ``ids`` (``u`` given at those words).

    ``cache_ids`` are sorted unique; ``c`` is the cache's total. An empty cache with ``mu = 0`` gives ``u``.
    Costs ``O(len(ids) log len(cache_ids))``.

    >>> personal_unigram(np.array([1, 2]), np.array([2]), np.array([3.0]), np.array([0.3, 0.3]), 1.0).tolist()
    [0.075, 0.825]
    """
    ids = np.asarray(ids, dtype=np.int64)
    u = np.asarray(u, dtype=np.float64)
    total = float(np.sum(cache_counts))
    if total + smoothing <= 0:
        return u.copy()
    return (_lookup(cache_ids, cache_counts, ids) + smoothing * u) / (total + smoothing)


def log_factor(u: np.ndarray, qbar: np.ndarray | None, q: np.ndarray, config: FmpConfig) -> np.ndarray:
    """``lambda * ln(g(w) / u(w))`` with ``g`` of eq. (2), element-wise at some words.

    Args:
        u: the background unigram at those words (> 0).
        qbar: the global distribution at those words, or ``None`` before the first aggregation (``u`` is used).
        q: the client's personal unigram at those words (:func:`personal_unigram`).
        config: alpha, beta and lambda.

    Returns:
        float64 factors; ``-inf`` where ``g(w) = 0`` (possible only with ``alpha + beta = 1``), 0 everywhere when
        ``lambda = 0``.

    >>> cfg = FmpConfig(alpha=0.0, beta=0.5)
    >>> log_factor(np.array([0.3]), None, np.array([0.825]), cfg).round(6).tolist() == [round(math.log(1.875), 6)]
    True
    """
    u = np.asarray(u, dtype=np.float64)
    if config.lam == 0:
        return np.zeros_like(u)
    qb = u if qbar is None else np.asarray(qbar, dtype=np.float64)
    g = config.background_weight * u + config.alpha * qb + config.beta * np.asarray(q, dtype=np.float64)
    with np.errstate(divide="ignore"):
        return config.lam * np.log(g / u)


def adapted_scores(utt: FmpUtterance, factors: np.ndarray) -> np.ndarray:
    """``base + bias_weight * (sum of the factors of each hypothesis' words)``, one score per hypothesis.

    Args:
        utt: the utterance.
        factors: one log-factor per word of ``utt.vocab`` (same order), e.g. from :func:`log_factor`.

    >>> utt = FmpUtterance("u", ([1], [2, 2]), [0.0, -0.5], bias_weight=0.5)
    >>> adapted_scores(utt, np.array([-1.0, 1.0])).tolist()
    [-0.5, 0.5]
    """
    factors = np.asarray(factors, dtype=np.float64)
    if factors.shape != utt.vocab.shape:
        raise InputError(f"utterance {utt.utt_id!r}: {factors.size} factors for {utt.vocab.size} distinct words",
                         expected="one factor per word of utt.vocab")
    if utt.bias_weight == 0 or utt._inv.size == 0:
        return utt.base.copy()
    per_hyp = np.bincount(utt._hyp, weights=factors[utt._inv], minlength=utt.n_hypotheses)
    return utt.base + utt.bias_weight * per_hyp


def _lookup(ids: np.ndarray, vals: np.ndarray, query: np.ndarray) -> np.ndarray:
    """Values of a sparse vector (sorted unique ``ids``) at ``query`` (0 where absent).

    >>> _lookup(np.array([2, 5]), np.array([1.0, 3.0]), np.array([5, 4, 2])).tolist()
    [3.0, 0.0, 1.0]
    """
    if ids.size == 0:
        return np.zeros(query.shape, dtype=np.float64)
    pos = np.minimum(np.searchsorted(ids, query), ids.size - 1)
    return np.where(ids[pos] == query, vals[pos], 0.0)


@dataclass(frozen=True, eq=False)
class BackgroundBigram:
    """The background bigram ``u2(w|v) = (C(v, w) + prior u(w)) / (C(v) + prior)`` from the background text's
    counts (the NNLM's training text, like ``u``), for FMP's personal bigram marginals (``order=2``).

    Attributes:
        keys: sorted unique pair keys ``v * V + w`` (int64).
        counts: ``C(v, w)`` for each key.
        history: ``C(v)``, dense over the vocabulary (the count of ``v`` as a history).
        prior: Dirichlet pseudo-counts toward ``u(w)`` (> 0, so unseen pairs keep a probability).

    >>> bg = BackgroundBigram.from_sentences([[3, 4, 3, 4], [3, 5]], vocab_size=6, prior=1.0)
    >>> u = np.full(6, 1 / 6)
    >>> bg.prob(np.array([3, 3]), np.array([4, 5]), u).round(4).tolist()
    [0.5417, 0.2917]
    """

    keys: np.ndarray
    counts: np.ndarray
    history: np.ndarray
    prior: float = 10.0

    @classmethod
    def from_sentences(cls, sentences: Sequence[Sequence[int]], vocab_size: int, prior: float = 10.0
                       ) -> BackgroundBigram:
        """Count the consecutive pairs of id sequences (the caller drops ``<unk>`` ids first, as for hypotheses)."""
        if not _is_real(prior) or prior <= 0:
            raise ConfigError(f"prior={prior!r}", expected="a number > 0")
        v = int(vocab_size)
        parts = [np.asarray(s, dtype=np.int64) for s in sentences if len(s) > 1]
        if parts:
            prev = np.concatenate([p[:-1] for p in parts])
            nxt = np.concatenate([p[1:] for p in parts])
            if prev.size and (min(prev.min(), nxt.min()) < 0 or max(prev.max(), nxt.max()) >= v):
                raise InputError("background bigram ids outside the vocabulary", expected=f"ids in [0, {v})")
            keys, counts = np.unique(prev * v + nxt, return_counts=True)
            history = np.bincount(prev, minlength=v).astype(np.float64)
        else:
            keys, counts, history = _EMPTY_IDS, np.zeros(0), np.zeros(v)
        return cls(_readonly(keys.astype(np.int64)), _readonly(counts.astype(np.float64)), _readonly(history),
                   float(prior))

    @property
    def vocab_size(self) -> int:
        """``V``."""
        return int(self.history.size)

    def prob(self, prev: np.ndarray, nxt: np.ndarray, u: np.ndarray) -> np.ndarray:
        """``u2(next | prev)`` element-wise (``u``: the background unigram, dense)."""
        c = _lookup(self.keys, self.counts, prev * self.vocab_size + nxt)
        return (c + self.prior * u[nxt]) / (self.history[prev] + self.prior)


def _merge(parts: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """The sum of sparse vectors, as sorted unique ids and float64 values."""
    parts = [p for p in parts if p[0].size]
    if not parts:
        return _EMPTY_IDS, _EMPTY_VALS
    if len(parts) == 1:
        return parts[0]
    ids = np.concatenate([p[0] for p in parts])
    vals = np.concatenate([p[1] for p in parts])
    uniq, inv = np.unique(ids, return_inverse=True)
    return uniq.astype(np.int64), np.bincount(inv.reshape(-1), weights=vals, minlength=uniq.size)


def _cap_l1(values: np.ndarray, cap: float) -> np.ndarray:
    """``values`` (non-negative) scaled down so that they sum to at most ``cap`` (never above, even by rounding)."""
    total = float(values.sum())
    if total <= cap:
        return values
    if cap <= 0:
        return np.zeros_like(values)
    out = values * (cap / total)
    while float(out.sum()) > cap:  # floating-point rounding: shave until the bound holds exactly
        out = out * (1.0 - 1e-12)
    return out


# ---------------------------------------------------------------------------------------------------------------
# the algorithm


class FmpAlgorithm:
    """FMP as a :class:`~privasr.federated.core.FederatedAlgorithm` (see the module docstring).

    Server state: ``{"sum": float64[V], "qbar": float64[V] or float64[0]}`` (``sum``: the running noisy count
    sum in increment mode, this round's in cumulative mode; ``qbar`` empty until a round had positive mass).
    Payload: ``{"round": r, "qbar": ...}``. Update: ``arrays={"ids": int64 sorted unique, "counts": float64 > 0}``,
    ``weight`` = the counts' total, ``metrics={"utterances", "changed"}``.

    Args:
        config: the hyper-parameters.
        background: ``u(w)`` over the vocabulary: float, all > 0, summing to 1 within 1e-9.
        background_bigram: the background bigram (needed with ``config.order == 2``).
        normalizer: for the exactly normalised variant of eq. (1): ``normalizer(utt, f)`` returns, per hypothesis,
            ``sum_k ln Z(h_k)`` over its predicted tokens, ``Z(h) = sum_v p_nnlm(v|h) exp(f(v))``, given the dense
            unigram log-factors ``f`` (natural log, ``lambda`` included). The adapted score then becomes
            ``base + bias_weight * (sum_k f(w_k) - sum_k ln Z(h_k))``: the NNLM rescaled and renormalised at
            every history. It needs the NNLM on the device (the experiment runner passes
            :func:`privasr.federated.algorithms.fmp_data.nnlm_normalizer`); clients then hold the whole ``qbar``. Personal
            bigram factors, when on, stay unnormalised.
        hold_all: keep the whole ``qbar`` on the client between rounds. By default a client keeps ``qbar`` only
            at the words of its groups still to come (it knows them in a simulation); a device does not know which
            words it will decode next (:class:`~privasr.device.fmp.FmpDeviceModel`). The results are the same.

    Raises:
        ConfigError: if ``config`` is not an :class:`FmpConfig`.
        InputError: for a bad background.

    >>> alg = FmpAlgorithm(FmpConfig(), np.full(4, 0.25))
    >>> alg.name, alg.vocab_size, alg.broadcast(alg.init(np.random.default_rng(0)), 0)["qbar"].size
    ('fmp', 4, 0)
    """

    name = "fmp"
    dp_metrics = ("qbar_mass", "qbar_support", "has_qbar")
    """The server metrics of a DP round: functions of the noised running sum only."""

    def __init__(self, config: FmpConfig, background: np.ndarray,
                 background_bigram: BackgroundBigram | None = None,
                 normalizer: Callable[[FmpUtterance, np.ndarray], np.ndarray] | None = None, *,
                 hold_all: bool = False) -> None:
        if not isinstance(config, FmpConfig):
            raise ConfigError(f"FMP config is a {type(config).__name__}", expected="an FmpConfig")
        try:
            u = np.array(background, dtype=np.float64)
        except (TypeError, ValueError):
            raise InputError("the background unigram is not numeric", expected="a float array") from None
        if u.ndim != 1 or u.size == 0:
            raise InputError(f"the background unigram has shape {u.shape}", expected="a non-empty 1-d array")
        bad = np.flatnonzero(~(np.isfinite(u) & (u > 0)))
        if bad.size:
            raise InputError(f"the background unigram is {u[bad[0]]!r} at word id {int(bad[0])} "
                             f"({bad.size} such entries)", expected="u(w) > 0 and finite for every word")
        total = float(u.sum())
        if abs(total - 1.0) > 1e-9:
            raise InputError(f"the background unigram sums to {total!r}",
                             expected="a distribution summing to 1 (within 1e-9)")
        self.config = config
        self.background = _readonly(u)
        self.vocab_size = int(u.size)
        if config.order == 2:
            if not isinstance(background_bigram, BackgroundBigram):
                raise ConfigError("FMP with order=2 needs the background bigram",
                                  expected="FmpAlgorithm(config, u, BackgroundBigram.from_sentences(...))")
            if background_bigram.vocab_size != self.vocab_size:
                raise InputError(f"the background bigram has {background_bigram.vocab_size} words, the unigram "
                                 f"{self.vocab_size}", expected="the same vocabulary")
        self.background_bigram = background_bigram
        if normalizer is not None and not callable(normalizer):
            raise ConfigError(f"normalizer is a {type(normalizer).__name__}", expected="a callable or None")
        self.normalizer = normalizer
        self.hold_all = bool(hold_all)

    def config_dict(self) -> dict[str, Any]:
        """The configuration (part of the loop's checkpoint key)."""
        return {**self.config.to_dict(), "normalized": self.normalizer is not None}

    # -- server ---------------------------------------------------------------------------------------------

    def init(self, rng: np.random.Generator) -> dict[str, Any]:
        """``{"sum": zeros(V), "qbar": empty}``: no counts, no global distribution yet."""
        return {"sum": np.zeros(self.vocab_size), "qbar": np.zeros(0)}

    def broadcast(self, state: Mapping[str, Any], round: int) -> dict[str, Any]:
        """``{"round": round, "qbar": state["qbar"]}`` (an empty array before the first aggregation)."""
        q = self._qbar(state["qbar"], "server state")
        return {"round": int(round), "qbar": np.zeros(0) if q is None else q}

    def accumulate(self, acc: SumAccumulator | None, update: Update) -> SumAccumulator:
        """Fold a client's sparse counts into the dense sum ``"counts"`` (``O(len(ids))``)."""
        if set(update.arrays) != {"ids", "counts"}:
            raise InputError(f"FMP update with arrays {sorted(update.arrays)}", expected="['counts', 'ids']")
        acc = SumAccumulator.empty() if acc is None else acc
        return acc.add_sparse("counts", self.vocab_size, update.arrays["ids"], update.arrays["counts"],
                              weight=update.weight, metrics=update.metrics)

    def accumulate_many(self, acc: SumAccumulator | None, updates: Iterable[Update],
                        block: int = ACCUMULATE_BLOCK) -> SumAccumulator:
        """Fold a stream of clients' sparse counts into the dense sum in blocks of ``block`` updates, one
        ``np.bincount`` per block (:meth:`SumAccumulator.add_sparse_block`): the same sum as :meth:`accumulate`
        on each (up to summation order), at a fraction of the per-client cost; memory is one block of updates
        whatever the number of clients.

        >>> alg = FmpAlgorithm(FmpConfig(), np.full(4, 0.25))
        >>> ups = [Update({"ids": np.array([1, 3]), "counts": np.array([2.0, 1.0])}, 3.0, {"utterances": 1.0})] * 3
        >>> acc = alg.accumulate_many(None, iter(ups), block=2)
        >>> acc.arrays["counts"].tolist(), acc.count, acc.metrics["utterances"]
        ([0.0, 6.0, 0.0, 3.0], 3, 3.0)
        """
        acc = SumAccumulator.empty() if acc is None else acc
        ids: list[np.ndarray] = []
        counts: list[np.ndarray] = []
        weight = 0.0
        metrics: dict[str, float] = {}
        add_ids, add_counts = ids.append, counts.append
        for update in updates:
            a = update.arrays
            try:
                if len(a) != 2:
                    raise KeyError
                add_ids(a["ids"])
                add_counts(a["counts"])
            except KeyError:
                raise InputError(f"FMP update with arrays {sorted(a)}", expected="['counts', 'ids']") from None
            weight += update.weight
            for k, v in update.metrics.items():
                metrics[k] = metrics.get(k, 0.0) + v
            if len(ids) >= block:
                acc = acc.add_sparse_block("counts", self.vocab_size, ids, counts, weight, metrics)
                ids, counts, weight, metrics = [], [], 0.0, {}
                add_ids, add_counts = ids.append, counts.append
        if ids:
            acc = acc.add_sparse_block("counts", self.vocab_size, ids, counts, weight, metrics)
        return acc

    def secure_bound(self, bound: float | None) -> float:
        """The bound of a client's (kernel-weighted) count of one word in one round under secure aggregation
        (default :data:`SECAGG_COUNT_BOUND`); larger counts are clipped on the client."""
        return float(SECAGG_COUNT_BOUND if bound is None else bound)

    def secure_summand(self, update: Update, bound: float | None) -> Summand:
        """The update for secure aggregation: its counts dense over the vocabulary (``V`` values instead of the
        sparse ids; SecAgg+ can only sum vectors of one shape), and ``utterances``/``changed`` as scalars.

        >>> alg = FmpAlgorithm(FmpConfig(), np.full(4, 0.25))
        >>> u = Update({"ids": np.array([1, 3]), "counts": np.array([2.0, 1.0])}, 3.0, {"utterances": 1.0})
        >>> alg.secure_summand(u, None).arrays["counts"].tolist()
        [0.0, 2.0, 0.0, 1.0]
        """
        if set(update.arrays) != {"ids", "counts"}:
            raise InputError(f"FMP update with arrays {sorted(update.arrays)}", expected="['counts', 'ids']")
        dense = SumAccumulator.empty().add_sparse("counts", self.vocab_size, update.arrays["ids"],
                                                  update.arrays["counts"]).arrays["counts"]
        metrics = {k: (float(update.metrics.get(k, 0.0)), SCALAR_BOUND) for k in ("utterances", "changed")}
        return Summand({"counts": dense}, {"counts": self.secure_bound(bound)}, metrics)

    def from_secure_sum(self, arrays: Mapping[str, np.ndarray], scalars: Mapping[str, float],
                        count: int) -> SumAccumulator:
        """The accumulator :meth:`accumulate` would have built from the same clients (weight: the counts' sum)."""
        counts = np.asarray(arrays["counts"], dtype=np.float64)
        return SumAccumulator({"counts": counts}, float(counts.sum()), int(count),
                              {k: float(scalars.get(k, 0.0)) for k in ("utterances", "changed")})

    def server_update(self, state: Mapping[str, Any], acc: SumAccumulator | None, round: int,
                      rng: np.random.Generator) -> tuple[dict[str, Any], dict[str, float]]:
        """Eq. (6) (eq. 8 with noise): the new count sum and ``qbar = max(sum, 0) / total``.

        Increment mode adds the round's (possibly noisy) counts to the running sum; cumulative mode keeps only
        the round's. When the clamped total is not positive, the previous ``qbar`` (possibly none) is kept.
        """
        v = self.vocab_size
        counts = None if acc is None else acc.arrays.get("counts")
        counts = np.zeros(v) if counts is None else np.asarray(counts, dtype=np.float64)
        prev = np.asarray(state["sum"], dtype=np.float64)
        if counts.shape != (v,) or prev.shape != (v,):
            raise InputError(f"FMP count sums of shapes {counts.shape} and {prev.shape}", expected=f"({v},)")
        total = prev + counts if self.config.send == "increment" else counts.copy()
        pos = np.where(total > self.config.qbar_threshold, total, 0.0) if self.config.qbar_threshold > 0 \
            else np.maximum(total, 0.0)
        mass = float(pos.sum())
        if mass > 0 and math.isfinite(mass):
            qbar = pos / mass
        else:
            old = self._qbar(state["qbar"], "server state")
            qbar = np.zeros(0) if old is None else old
        metrics = {
            "qbar_mass": mass,
            "qbar_support": float(np.count_nonzero(qbar)),
            "has_qbar": float(qbar.size > 0),
            "clients": float(0 if acc is None else acc.count),
            "sent_mass": float(0.0 if acc is None else acc.weight),
            "utterances": float(0.0 if acc is None else acc.metrics.get("utterances", 0.0)),
            "changed": float(0.0 if acc is None else acc.metrics.get("changed", 0.0)),
        }
        if self.config.dp_unit is not None or (acc is not None and acc.is_release):
            # exact sums of what clients sent are not covered by the noise: a DP run does not publish them
            for k in ("clients", "sent_mass", "utterances", "changed"):
                metrics.pop(k)
        return {"sum": total, "qbar": qbar}, metrics

    @property
    def dp_unit(self) -> str | None:
        """The unit of the DP guarantee: ``"utterance"`` or ``"user"`` (a client), ``None`` without DP."""
        return self.config.dp_unit

    def dp_bound(self) -> tuple[str, float]:
        """``("l1", dp_cap)``: one unit (an utterance or a user, ``dp_unit``) moves the summed counts by at most
        ``dp_cap`` in L1.

        Raises:
            ConfigError: without ``dp_unit`` (nothing is capped).
        """
        if self.config.dp_unit is None:
            raise ConfigError("differential privacy for FMP without dp_unit",
                              expected="dp_unit 'utterance' or 'user': the Laplace noise is calibrated to capped "
                                       "counts")
        return "l1", float(self.config.dp_cap)

    def zero_sum(self, state: Mapping[str, Any]) -> SumAccumulator:
        """The sum of no client's counts (zeros over the vocabulary): what an empty DP round releases, noised."""
        return SumAccumulator({"counts": np.zeros(self.vocab_size)})

    # -- client ---------------------------------------------------------------------------------------------

    def new_client_state(self) -> dict[str, Any]:
        """The state of a client that has not taken part yet (see the module docstring for the fields).

        >>> st = FmpAlgorithm(FmpConfig(), np.full(2, 0.5)).new_client_state()
        >>> st["cache_ids"].dtype, st["next_group"], st["chosen"]
        (dtype('int64'), 0, {})
        """
        return {
            "cache_ids": _EMPTY_IDS.copy(), "cache_counts": _EMPTY_VALS.copy(),
            "pending_ids": _EMPTY_IDS.copy(), "pending_counts": _EMPTY_VALS.copy(),
            "sent": 0.0, "next_group": 0,
            "held": False, "held_ids": _EMPTY_IDS.copy(), "held_qbar": _EMPTY_VALS.copy(),
            "bigram_keys": _EMPTY_IDS.copy(), "bigram_counts": _EMPTY_VALS.copy(),
            "bigram_hist_ids": _EMPTY_IDS.copy(), "bigram_hist_counts": _EMPTY_VALS.copy(),
            "chosen": {},
        }

    def client_update(self, payload: Mapping[str, Any], client: FmpClient, client_state: Mapping[str, Any] | None,
                      rng: np.random.Generator) -> tuple[Update, dict[str, Any]]:
        """Rescore the client's group ``payload["round"]`` (and groups it missed), update its cache, report counts.

        Returns:
            The :class:`~privasr.federated.core.Update` (sorted unique ids and their counts, nothing else) and
            the client's new state (the input state is not modified).
        """
        if not isinstance(client, FmpClient):
            raise InputError(f"FMP client is a {type(client).__name__}", expected="an FmpClient")
        r = payload["round"]
        if isinstance(r, bool) or not isinstance(r, int | np.integer) or r < 0:
            raise InputError(f"FMP payload round {r!r}", expected="an integer >= 0")
        r = int(r)
        qbar = self._qbar(payload["qbar"], "payload")
        st = self._client_state(client_state)
        n_groups = len(client.groups)
        done = changed = 0
        # groups that arrived while the client was not sampled: rescored with the qbar it last received
        for g in range(st["next_group"], min(r, n_groups)):
            n, c = self._rescore_group(client, g, st, self._held_lookup(st))
            done, changed = done + n, changed + c
        if st["next_group"] <= r < n_groups:
            n, c = self._rescore_group(client, r, st, None if qbar is None else qbar.__getitem__)
            done, changed = done + n, changed + c
        st["next_group"] = min(max(st["next_group"], r + 1), n_groups)
        if qbar is None:
            st["held"], st["held_ids"], st["held_qbar"] = False, _EMPTY_IDS.copy(), _EMPTY_VALS.copy()
        else:
            # exact normalisation needs qbar at every word, not only the words still to come
            future = client.vocab_from(st["next_group"]) if self.normalizer is None and not self.hold_all \
                else np.arange(self.vocab_size, dtype=np.int64)
            self._check_ids(client, future)
            st["held"], st["held_ids"], st["held_qbar"] = True, future, qbar[future]
        ids, counts = self._outgoing(st)
        update = Update({"ids": ids, "counts": counts}, weight=float(counts.sum()),
                        metrics={"utterances": done, "changed": changed})
        return update, st

    def finish(self, client: FmpClient, client_state: Mapping[str, Any] | None) -> dict[str, Any]:
        """Rescore the groups that arrived after the client's last report, with the ``qbar`` it last received.

        Nothing is sent (the run is over); the returned state's ``chosen`` then covers every utterance of the
        client. Use it after :func:`~privasr.federated.loop.run_federated` to score the whole test set.

        >>> u = np.full(3, 1 / 3)
        >>> c = FmpClient("m", ((FmpUtterance("a", ([1],), [0.0]),), (FmpUtterance("b", ([2], [1]), [0.0, 0.0]),)))
        >>> FmpAlgorithm(FmpConfig(), u).finish(c, None)["chosen"]
        {'a': 0, 'b': 1}
        """
        if not isinstance(client, FmpClient):
            raise InputError(f"FMP client is a {type(client).__name__}", expected="an FmpClient")
        st = self._client_state(client_state)
        for g in range(st["next_group"], len(client.groups)):
            self._rescore_group(client, g, st, self._held_lookup(st))
        st["next_group"] = len(client.groups)
        return st

    # -- internals ------------------------------------------------------------------------------------------

    def _qbar(self, q: Any, where: str) -> np.ndarray | None:
        q = np.asarray(q, dtype=np.float64)
        if q.size == 0:
            return None
        if q.shape != (self.vocab_size,):
            raise InputError(f"{where}: qbar of shape {q.shape}", expected=f"({self.vocab_size},) or empty")
        return q

    def _client_state(self, s: Mapping[str, Any] | None) -> dict[str, Any]:
        fresh = self.new_client_state()
        if s is None:
            return fresh
        missing = sorted(set(fresh) - set(s))
        if missing:
            raise InputError(f"FMP client state lacks {missing}", expected="a state made by FmpAlgorithm")
        st = dict(s)
        for k in ("cache_ids", "pending_ids", "held_ids", "bigram_keys", "bigram_hist_ids"):
            st[k] = np.asarray(st[k], dtype=np.int64)
        for k in ("cache_counts", "pending_counts", "held_qbar", "bigram_counts", "bigram_hist_counts"):
            st[k] = np.asarray(st[k], dtype=np.float64)
        st["sent"], st["next_group"], st["held"] = float(st["sent"]), int(st["next_group"]), bool(st["held"])
        st["chosen"] = dict(st["chosen"])
        return st

    def _held_lookup(self, st: Mapping[str, Any]) -> Callable[[np.ndarray], np.ndarray] | None:
        if not st["held"]:
            return None
        held_ids, held_q = st["held_ids"], st["held_qbar"]

        def at(ids: np.ndarray) -> np.ndarray:
            pos = np.minimum(np.searchsorted(held_ids, ids), max(held_ids.size - 1, 0))
            if held_ids.size == 0 or not np.array_equal(held_ids[pos], ids):
                raise InputError("the client's held global distribution does not cover its later words",
                                 expected="client data unchanged between rounds")
            return held_q[pos]

        return at

    def _check_ids(self, client: FmpClient, ids: np.ndarray, utt: FmpUtterance | None = None) -> None:
        if ids.size and ids[-1] >= self.vocab_size:
            where = f"client {client.id!r}" + ("" if utt is None else f", utterance {utt.utt_id!r}")
            raise InputError(f"{where}: word id {int(ids[-1])} is outside the vocabulary",
                             expected=f"ids < {self.vocab_size} (the background's size)")

    def _rescore_group(self, client: FmpClient, g: int, st: dict[str, Any],
                       qbar_at: Callable[[np.ndarray], np.ndarray] | None) -> tuple[int, int]:
        """Rescore group ``g`` in place of ``st`` (choices, cache, pending); returns (utterances, changed)."""
        cfg = self.config
        chosen = st["chosen"]
        cache = (st["cache_ids"], st["cache_counts"])
        new: list[tuple[np.ndarray, np.ndarray]] = []
        new2: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        changed = 0
        for utt in client.groups[g]:
            ids = utt.vocab
            self._check_ids(client, ids, utt)
            if cfg.lam == 0 or utt.bias_weight == 0 or ids.size == 0:
                scores = utt.base
            else:
                u = self.background[ids]
                q = personal_unigram(ids, cache[0], cache[1], u, cfg.smoothing)
                scores = adapted_scores(utt, log_factor(u, None if qbar_at is None else qbar_at(ids), q, cfg))
            if cfg.order == 2 and cfg.lam2 > 0 and utt.bias_weight > 0 and utt._prev.size:
                scores = scores + utt.bias_weight * self._bigram_factors(utt, st)
            if self.normalizer is not None and cfg.lam > 0 and utt.bias_weight > 0:
                scores = scores - utt.bias_weight * self._log_normalizers(utt, cache, qbar_at)
            choice = int(np.argmax(scores))
            chosen[utt.utt_id] = choice
            changed += choice != 0
            counts = utterance_counts(utt, cfg.sigma)
            if cfg.dp_unit == "utterance":
                counts = (counts[0], _cap_l1(counts[1], cfg.dp_cap))
            new.append(counts)
            if cfg.order == 2:
                new2.append(self._bigram_counts(utt))
            if cfg.refresh == "utterance":
                cache = _merge([cache, counts])
                if cfg.order == 2:
                    self._add_bigrams(st, [new2[-1]])
        if cfg.refresh == "round":
            cache = _merge([cache, *new])
            if cfg.order == 2:
                self._add_bigrams(st, new2)
        st["cache_ids"], st["cache_counts"] = cache
        if cfg.send == "increment":
            st["pending_ids"], st["pending_counts"] = _merge([(st["pending_ids"], st["pending_counts"]), *new])
        return len(client.groups[g]), changed

    def _log_normalizers(self, utt: FmpUtterance, cache: tuple[np.ndarray, np.ndarray],
                         qbar_at: Callable[[np.ndarray], np.ndarray] | None) -> np.ndarray:
        """Per hypothesis, ``sum_k ln Z(h_k)`` with ``Z(h) = sum_v p(v|h) exp(f(v))`` for the dense unigram log-factors
        ``f`` of eq. (1) (the exactly normalised variant; see :class:`FmpAlgorithm`)."""
        assert self.normalizer is not None
        cfg = self.config
        every = np.arange(self.vocab_size, dtype=np.int64)
        q = personal_unigram(every, cache[0], cache[1], self.background, cfg.smoothing)
        f = log_factor(self.background, None if qbar_at is None else qbar_at(every), q, cfg)
        f.setflags(write=False)
        out = np.asarray(self.normalizer(utt, f), dtype=np.float64)
        if out.shape != (utt.n_hypotheses,) or not np.all(np.isfinite(out)):
            raise InputError(f"utterance {utt.utt_id!r}: the normalizer returned shape {out.shape}",
                             expected="one finite log-normaliser sum per hypothesis")
        return out

    def _bigram_factors(self, utt: FmpUtterance, st: Mapping[str, Any]) -> np.ndarray:
        """Per hypothesis, ``sum over its word pairs of lam2 * ln(((1 - beta2) u2 + beta2 q2_i) / u2)``."""
        cfg, v, bg = self.config, self.vocab_size, self.background_bigram
        assert bg is not None
        self._check_ids_bigram(utt)
        keys, inv = np.unique(utt._prev * v + utt._next, return_inverse=True)
        prev, nxt = keys // v, keys % v
        u2 = bg.prob(prev, nxt, self.background)
        c_vw = _lookup(st["bigram_keys"], st["bigram_counts"], keys)
        c_v = _lookup(st["bigram_hist_ids"], st["bigram_hist_counts"], prev)
        q2 = (c_vw + cfg.smoothing2 * u2) / np.maximum(c_v + cfg.smoothing2, 1e-300)
        q2 = np.where(c_v + cfg.smoothing2 > 0, q2, u2)
        f = cfg.lam2 * np.log(((1.0 - cfg.beta2) * u2 + cfg.beta2 * q2) / u2)
        return np.bincount(utt._pair_hyp, weights=f[inv.reshape(-1)], minlength=utt.n_hypotheses)

    def _check_ids_bigram(self, utt: FmpUtterance) -> None:
        if utt._prev.size and max(int(utt._prev.max()), int(utt._next.max())) >= self.vocab_size:
            raise InputError(f"utterance {utt.utt_id!r}: a word id is outside the vocabulary",
                             expected=f"ids < {self.vocab_size}")

    def _bigram_counts(self, utt: FmpUtterance) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The utterance's kernel-weighted pair counts: (sorted keys, counts, history ids of the keys)."""
        v = self.vocab_size
        if utt._prev.size == 0:
            return _EMPTY_IDS, _EMPTY_VALS, _EMPTY_IDS
        k = rank_kernel(utt.n_hypotheses, self.config.sigma)[utt._pair_hyp]
        keys, inv = np.unique(utt._prev * v + utt._next, return_inverse=True)
        vals = np.bincount(inv.reshape(-1), weights=k, minlength=keys.size)
        keep = vals > 0
        return keys[keep].astype(np.int64), vals[keep], (keys[keep] // v).astype(np.int64)

    def _add_bigrams(self, st: dict[str, Any], parts: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> None:
        """Add pair counts to the device's bigram cache (it never leaves the device)."""
        st["bigram_keys"], st["bigram_counts"] = _merge([(st["bigram_keys"], st["bigram_counts"]),
                                                         *[(k, c) for k, c, _ in parts]])
        st["bigram_hist_ids"], st["bigram_hist_counts"] = _merge(
            [(st["bigram_hist_ids"], st["bigram_hist_counts"]), *[(h, c) for _, c, h in parts]])

    def _outgoing(self, st: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
        """What the client sends now (and the state after sending): sorted unique ids and positive counts."""
        cfg = self.config
        if cfg.send == "increment":
            ids, vals = st["pending_ids"], st["pending_counts"]
            st["pending_ids"], st["pending_counts"] = _EMPTY_IDS.copy(), _EMPTY_VALS.copy()
            if cfg.dp_unit == "user":
                vals = _cap_l1(vals, max(cfg.dp_cap - st["sent"], 0.0))
        else:
            ids, vals = st["cache_ids"], st["cache_counts"]
            if cfg.dp_unit == "user":
                vals = _cap_l1(vals, cfg.dp_cap)
        keep = vals > 0
        ids = np.array(ids[keep], dtype=np.int64)
        vals = np.array(vals[keep], dtype=np.float64)
        st["sent"] = st["sent"] + float(vals.sum())
        return ids, vals
