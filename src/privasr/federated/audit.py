r"""Attacks on what a federated server sees: the raw scores that the privacy audit's statistics consume.

An honest-but-curious server (docs/privacy.md, "Who sees what") sees, per mode:

* **without secure aggregation**: every reporting client's :class:`~privasr.federated.core.Update`.
  :class:`RecordingBackend` wraps any backend and keeps those updates per round (``views[round][client]``);
* **with secure aggregation**, and what any observer of the releases sees: a function of the round's **sum**.
  :func:`aggregate_recorder` gives an ``on_round`` callback that keeps the per-round change of a server-state
  entry. For FMP that is ``state["sum"]``: the loop adds the DP noise once to the round's accumulated sum before
  ``server_update``, so in ``send="increment"`` mode ``sum_r - sum_{r-1}`` is the round's (noisy) aggregate, and
  in ``send="cumulative"`` mode ``sum_r`` is.

The attacks return raw scores and labels (:class:`MembershipTrials`) or word sets (:class:`WordSetResult`);
turning them into rates, Clopper-Pearson intervals, empirical epsilon lower bounds or exposures is the job of
:mod:`privasr.privacy.audit`. Four attacks:

1. **FMP membership on per-client uploads** (:func:`plant_fmp`, :func:`fmp_membership_scores`): rare words
   (``canary_ids``, e.g. :func:`unused_ids`) are planted in every hypothesis of ``repeats`` extra utterances of
   the member clients' first group; the score of a client is its round-0 count of those words (0 when absent).
2. **FMP membership on the aggregate** (:func:`fmp_aggregate_trials`, :func:`fmp_trial_runner`): the standard
   "one secret per trial" auditing game. Each trial is a fresh run in which a fresh random target client holds
   the canary with probability 1/2; the score is the canary count in the round's aggregate (noisy with DP), the
   label whether the target held it. One bit per run is what a DP guarantee for one unit speaks about, so the
   trials are independent draws of the mechanism on neighbouring inputs, as the epsilon lower bounds need.
3. **fedlm word-set reconstruction** (:func:`embedding_word_set`, :func:`word_set_scores`,
   :func:`cohort_word_set_scores`, :func:`noisy_word_set_scores`): the input-embedding rows of a fedlm delta
   that changed are the words the client fed to the model (its words and ``<s>``; ``</s>`` is only a target, so
   its row stays zero unless the embeddings are tied to the output layer, in which case every row moves and the
   attack reads the whole vocabulary).
4. **fedlm canaries** (:func:`plant_fedlm`, :func:`sentence_log_perplexity`): canary sentences planted in the
   member clients' text, and the per-sentence log-perplexity of a model that the exposure statistic ranks.

>>> import numpy as np
>>> from privasr.federated.algorithms.fmp import FmpAlgorithm, FmpClient, FmpConfig, FmpUtterance
>>> from privasr.federated.loop import run_federated
>>> from privasr.federated.sampling import AllClients
>>> clients = [FmpClient(f"c{i}", ((FmpUtterance("a", ([1, 2], [2]), [0.0, -1.0]),),)) for i in range(4)]
>>> canary = unused_ids(clients, vocab_size=6)[-1:]
>>> planted = plant_fmp(clients, 6, canary, members=[0, 2], rng=np.random.default_rng(0))
>>> backend = RecordingBackend()
>>> on_round, aggregates = aggregate_recorder("sum")
>>> alg = FmpAlgorithm(FmpConfig(sigma=0.01), np.full(6, 1 / 6))  # the rank kernel keeps only the 1-best
>>> _ = run_federated(alg, planted, rounds=1, sampler=AllClients(), backend=backend, on_round=on_round)
>>> trials = fmp_membership_scores(backend.views, canary, members=[0, 2])
>>> trials.scores.tolist(), trials.labels.tolist()
([1.0, 0.0, 1.0, 0.0], [True, False, True, False])
>>> fmp_canary_count(aggregates[0].value, canary)
2.0
"""

from __future__ import annotations

import math
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from privasr.errors import ConfigError, InputError
from privasr.federated.algorithms._config import is_int
from privasr.federated.algorithms.fedlm import FedLmAlgorithm, FedLmClient, FedLmConfig, target_weights
from privasr.federated.algorithms.fmp import FmpAlgorithm, FmpClient, FmpUtterance
from privasr.federated.backends.local import LocalBackend
from privasr.federated.core import ClientOutcome, ClientTask, SumAccumulator, Update
from privasr.lm.neural.train import make_batch
from privasr.privacy.dp.clip import global_norm

__all__ = [
    "Upload",
    "RecordingBackend",
    "RoundAggregate",
    "aggregate_recorder",
    "sum_updates",
    "MembershipTrials",
    "unused_ids",
    "plant_fmp",
    "fmp_canary_count",
    "fmp_membership_scores",
    "fmp_aggregate_trials",
    "fmp_trial_runner",
    "WordSetResult",
    "CohortWordSets",
    "SPECIAL_IDS",
    "EMBEDDING_KEY",
    "client_word_set",
    "embedding_word_set",
    "word_set_scores",
    "cohort_word_set_scores",
    "noisy_word_set_scores",
    "plant_fedlm",
    "sentence_log_perplexity",
]

SPECIAL_IDS: tuple[int, int, int] = (0, 1, 2)
"""The ids of ``<unk>``, ``<s>`` and ``</s>`` in every :class:`~privasr.lm.neural.vocab.Vocabulary`."""

EMBEDDING_KEY = "embed.weight"
"""The input-embedding matrix's parameter name in privasr's word-level Transformer and LSTM models."""

_IGNORE = -100


# ---------------------------------------------------------------------------------------------------------------
# what the server sees
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Upload:
    """One client's update as the server received it (without secure aggregation).

    Attributes:
        round: the round it was sent in.
        slot: its position in the round's sample.
        index: the client's index in the population.
        update: what it sent.
    """

    round: int
    slot: int
    index: int
    update: Update


def _round_of(tasks: Sequence[ClientTask], calls: int) -> int:
    """The round of a batch of tasks: ``seed[1]`` of :func:`~privasr.federated.core.client_seed`'s
    ``(seed, round, index, slot, 1)``; if the seeds are not laid out that way, the number of earlier calls."""
    s = tasks[0].seed
    if len(s) == 5 and s[2] == tasks[0].index and s[3] == tasks[0].slot:
        return int(s[1])
    return calls


class RecordingBackend:
    """A backend that runs clients on ``inner`` and keeps what each successful client sent: the server's view
    without secure aggregation.

    Outcomes pass through unchanged and in the inner backend's order, so a run on a recording backend ends in
    the same state as on ``inner``. Use it with :func:`~privasr.federated.loop.run_federated` or
    :func:`~privasr.federated.backends.run_on` (it is a backend object, so ``run_on`` leaves it open; close it,
    which closes ``inner``). With a backend that sums securely (its ``secagg`` is set) the server gets only the
    sum: :meth:`run_secure` is passed through and nothing is recorded per client.

    Args:
        inner: any backend (``run(algorithm, payload, tasks, timeout)``); ``None``: a
            :class:`~privasr.federated.backends.local.LocalBackend`.
        rounds: the rounds to record (``None``: all); a fedlm upload is a whole model delta, so record only the
            rounds an attack reads.

    Attributes:
        uploads: every recorded :class:`Upload`, in arrival order.
        payloads: ``round -> the broadcast`` of each recorded round (fedlm: the parameters the clients started
            from, so ``params_after - payloads[r]`` is the round's server step).

    >>> import numpy as np
    >>> from privasr.federated.loop import run_federated
    >>> from privasr.federated.sampling import AllClients
    >>> class Count:
    ...     name = "count"
    ...     def init(self, rng): return 0
    ...     def broadcast(self, state, round): return None
    ...     def client_update(self, payload, client, state, rng): return Update({"n": np.array([client])}), None
    ...     def accumulate(self, acc, update): return (acc or 0) + int(update.arrays["n"][0])
    ...     def server_update(self, state, acc, round, rng): return state + acc, {}
    >>> rec = RecordingBackend(rounds={1})
    >>> run_federated(Count(), [3, 5], rounds=2, sampler=AllClients(), backend=rec).state
    16
    >>> {r: {i: u.arrays["n"].tolist() for i, u in v.items()} for r, v in rec.views.items()}
    {1: {0: [3], 1: [5]}}
    """

    def __init__(self, inner: Any = None, rounds: Container[int] | None = None) -> None:
        if inner is not None and not callable(getattr(inner, "run", None)):
            raise ConfigError(f"the inner backend is a {type(inner).__name__} without run()",
                              expected="a backend object (privasr.federated.backends.make_backend) or None")
        self.inner = LocalBackend() if inner is None else inner
        self.rounds = rounds
        self.uploads: list[Upload] = []
        self.payloads: dict[int, Any] = {}
        self._calls = 0

    @property
    def name(self) -> str:
        """``recording(<inner backend's name>)``."""
        return f"recording({getattr(self.inner, 'name', type(self.inner).__name__)})"

    @property
    def secagg(self) -> Any:
        """The inner backend's secure aggregation settings (``None``: the server sees every update)."""
        return getattr(self.inner, "secagg", None)

    def _wanted(self, r: int) -> bool:
        return self.rounds is None or r in self.rounds

    def run(self, algorithm: Any, payload: Any, tasks: Sequence[ClientTask],
            timeout: float | None = None) -> Iterator[ClientOutcome]:
        """The inner backend's outcomes, recording each successful client's update."""
        tasks = list(tasks)
        r = _round_of(tasks, self._calls) if tasks else self._calls
        self._calls += 1
        record = self._wanted(r)
        if record and tasks:
            self.payloads[r] = payload
        for out in self.inner.run(algorithm, payload, tasks, timeout):
            if record and out.ok:
                self.uploads.append(Upload(r, out.slot, out.index, out.update))
            yield out

    def run_secure(self, *args: Any, **kwargs: Any) -> Any:
        """Secure aggregation on the inner backend (nothing is recorded: the server gets only the sum)."""
        self._calls += 1
        return self.inner.run_secure(*args, **kwargs)

    @property
    def views(self) -> dict[int, dict[int, Update]]:
        """``views[round][client index] -> Update``: what each client sent in each recorded round (a client drawn
        twice in one round, with replacement, appears with the update of its first slot; :attr:`uploads` has
        both)."""
        out: dict[int, dict[int, tuple[int, Update]]] = {}
        for u in self.uploads:
            per = out.setdefault(u.round, {})
            if u.index not in per or u.slot < per[u.index][0]:
                per[u.index] = (u.slot, u.update)
        return {r: {i: per[i][1] for i in sorted(per)} for r, per in sorted(out.items())}

    def clear(self) -> None:
        """Forget everything recorded (between trials on the same backend)."""
        self.uploads.clear()
        self.payloads.clear()
        self._calls = 0

    def close(self) -> None:
        """Close the inner backend."""
        close = getattr(self.inner, "close", None)
        if close is not None:
            close()


@dataclass(frozen=True)
class RoundAggregate:
    """What a round released, as read off the server state after it.

    Attributes:
        round: the round.
        value: the change of the state entry over the round (an array, or a name -> array dict for a dict
            entry such as fedlm's ``params``), or the entry itself with ``cumulative=True``.
        metrics: the round's metrics (``epsilon`` and ``delta`` spent so far when DP is on).
    """

    round: int
    value: Any
    metrics: dict[str, Any] = field(default_factory=dict)


def _copy_tree(v: Any) -> Any:
    if isinstance(v, Mapping):
        return {k: np.array(x, dtype=np.float64) for k, x in v.items()}
    return np.array(v, dtype=np.float64)


def _minus(a: Any, b: Any) -> Any:
    if isinstance(a, Mapping):
        return {k: a[k] - b[k] for k in a}
    return a - b


def _zeros_like(v: Any) -> Any:
    if isinstance(v, Mapping):
        return {k: np.zeros_like(x) for k, x in v.items()}
    return np.zeros_like(v)


def aggregate_recorder(key: str = "sum", *, initial: Any = None, cumulative: bool = False
                       ) -> tuple[Callable[[Any, Any], None], list[RoundAggregate]]:
    """An ``on_round`` callback for :func:`~privasr.federated.loop.run_federated` (or
    :func:`~privasr.federated.backends.run_on`) and the list of :class:`RoundAggregate` it fills, one per round.

    Each round it takes ``state[key]`` (an array or a name -> array dict) and stores its change since the
    previous round, float64; the first round's change is from ``initial`` (``None``: zeros, right for FMP's
    ``sum``, which starts at zero; fedlm: pass the initial ``params``). ``cumulative=True`` stores
    ``state[key]`` itself.

    For FMP with ``send="increment"``, ``key="sum"`` gives each round's aggregate count vector as released: the
    noisy sum with DP, the exact sum without (what a SecAgg+ server unmasks); with ``send="cumulative"`` use
    ``cumulative=True``. For fedlm, ``key="params"`` gives the server step (with ``server="fedavg"``: the
    weighted mean delta, noisy with DP).

    >>> cb, aggs = aggregate_recorder("sum")
    >>> cb(None, {"sum": np.array([1.0, 2.0])}); cb(None, {"sum": np.array([1.0, 5.0])})
    >>> [(a.round, a.value.tolist()) for a in aggs]
    [(0, [1.0, 2.0]), (1, [0.0, 3.0])]
    """
    out: list[RoundAggregate] = []
    prev: list[Any] = [None if initial is None else _copy_tree(initial)]

    def on_round(entry: Any, state: Any) -> None:
        if not isinstance(state, Mapping) or key not in state:
            have = sorted(state) if isinstance(state, Mapping) else type(state).__name__
            raise InputError(f"the server state has no entry {key!r} (it has {have})",
                             expected="the key of the state entry that holds the aggregate")
        now = _copy_tree(state[key])
        r = len(out) if entry is None else int(entry.round)
        metrics = {} if entry is None else dict(entry.metrics)
        if cumulative:
            value = now
        else:
            before = _zeros_like(now) if prev[0] is None else prev[0]
            value = _minus(now, before)
        prev[0] = now
        out.append(RoundAggregate(r, value, metrics))

    return on_round, out


def sum_updates(updates: Iterable[Update | Mapping[str, np.ndarray]], *, weighted: bool = False
                ) -> dict[str, np.ndarray]:
    """The element-wise sum of dense updates (fedlm deltas): what a secure-aggregation server unmasks.

    ``weighted=True`` scales each by its ``weight`` like fedlm's ``accumulate`` (the same when the weights are 1:
    ``weighting="uniform"``, which DP and secure aggregation need). Not for FMP's sparse updates (use the
    aggregate of :func:`aggregate_recorder`).

    >>> sum_updates([Update({"x": np.array([1.0, 0.0])}), {"x": np.array([0.5, 2.0])}])["x"].tolist()
    [1.5, 2.0]
    """
    acc = SumAccumulator.empty()
    for u in updates:
        u = u if isinstance(u, Update) else Update(dict(u))
        acc = acc.add(u, scale=u.weight if weighted else 1.0)
    if acc.count == 0:
        raise InputError("no updates to sum", expected="at least one update")
    return dict(acc.arrays)


# ---------------------------------------------------------------------------------------------------------------
# FMP membership
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MembershipTrials:
    """The trials of a membership attack: one score and the truth per trial.

    Attributes:
        scores: float64 ``[n]``, larger = more likely a member (the attack's statistic, e.g. a canary count).
        labels: bool ``[n]``, whether the trial's target was a member (held the canary).
        ids: int64 ``[n]``: the client index (per-client trials) or the trial number (aggregate trials).

    >>> t = MembershipTrials(np.array([2.0, 0.0]), np.array([True, False]), np.array([0, 1]))
    >>> t.n, t.n_members
    (2, 1)
    """

    scores: np.ndarray
    labels: np.ndarray
    ids: np.ndarray

    def __post_init__(self) -> None:
        s = np.array(self.scores, dtype=np.float64)
        lab = np.asarray(self.labels)
        ids = np.asarray(self.ids)
        if s.ndim != 1 or lab.shape != s.shape or ids.shape != s.shape:
            raise InputError(f"membership trials of shapes scores {s.shape}, labels {lab.shape}, ids {ids.shape}",
                             expected="three 1-d arrays of the same length")
        if lab.dtype.kind != "b" or (ids.size and ids.dtype.kind not in "iu"):
            raise InputError(f"membership labels of dtype {lab.dtype}, ids of dtype {ids.dtype}",
                             expected="bool labels and integer ids")
        if not np.all(np.isfinite(s)):
            raise InputError("a membership score is NaN or infinite", expected="finite scores")
        for name, a in (("scores", s), ("labels", lab.copy()), ("ids", ids.astype(np.int64))):
            a.setflags(write=False)
            object.__setattr__(self, name, a)

    @property
    def n(self) -> int:
        """The number of trials."""
        return int(self.scores.size)

    @property
    def n_members(self) -> int:
        """The number of trials whose target was a member."""
        return int(self.labels.sum())


def _member_set(members: Any, n: int | None, what: str = "members") -> set[int]:
    """Client indices from a boolean mask (of length ``n`` when given) or a sequence of indices."""
    a = np.asarray(list(members) if not isinstance(members, np.ndarray) else members)
    if a.size == 0:
        return set()
    if a.ndim != 1:
        raise InputError(f"{what} of shape {a.shape}", expected="a boolean mask or a list of client indices")
    if a.dtype.kind == "b":
        if n is not None and a.size != n:
            raise InputError(f"a {what} mask of length {a.size} for {n} clients", expected=f"length {n}")
        return {int(i) for i in np.flatnonzero(a)}
    if a.dtype.kind not in "iu":
        raise InputError(f"{what} of dtype {a.dtype}", expected="a boolean mask or integer client indices")
    if a.min() < 0 or (n is not None and a.max() >= n):
        raise InputError(f"{what} hold index {int(a.min() if a.min() < 0 else a.max())}",
                         expected=f"client indices in [0, {n})" if n is not None else "indices >= 0")
    return {int(i) for i in a}


def _canary_ids(canary_ids: Any, vocab_size: int | None = None) -> np.ndarray:
    try:
        ids = np.asarray(canary_ids)
    except (TypeError, ValueError):
        ids = np.zeros(0, dtype=object)
    if ids.ndim != 1 or ids.size == 0 or ids.dtype.kind not in "iu":
        raise InputError(f"canary ids {canary_ids!r}", expected="a non-empty list of integer word ids")
    if np.unique(ids).size != ids.size:
        raise InputError(f"canary ids {ids.tolist()} repeat a word", expected="distinct word ids")
    if ids.min() < 0 or (vocab_size is not None and ids.max() >= vocab_size):
        raise InputError(f"canary ids {ids.tolist()}",
                         expected=f"word ids in [0, {vocab_size})" if vocab_size is not None else "ids >= 0")
    return ids.astype(np.int64)


def unused_ids(clients: Sequence[FmpClient], vocab_size: int) -> np.ndarray:
    """The word ids no hypothesis of any client contains, ascending (candidates for canary words: with them a
    non-member's score is exactly 0 without noise). ``<unk>`` (id 0) is never offered.

    >>> c = FmpClient("m", ((FmpUtterance("a", ([1, 3],), [0.0]),),))
    >>> unused_ids([c], 6).tolist()
    [2, 4, 5]
    """
    if not is_int(vocab_size) or vocab_size < 1:
        raise InputError(f"vocab_size={vocab_size!r}", expected="an integer >= 1")
    used = np.zeros(int(vocab_size), dtype=bool)
    used[0] = True
    for c in _fmp_clients(clients):
        for g in c.groups:
            for utt in g:
                if utt.vocab.size and utt.vocab[-1] >= vocab_size:
                    raise InputError(f"client {c.id!r}, utterance {utt.utt_id!r}: word id {int(utt.vocab[-1])}",
                                     expected=f"ids < vocab_size={vocab_size}")
                used[utt.vocab] = True
    return np.flatnonzero(~used).astype(np.int64)


def _fmp_clients(clients: Any) -> list[FmpClient]:
    if isinstance(clients, str | bytes) or not isinstance(clients, Sequence):
        raise InputError(f"clients are a {type(clients).__name__}", expected="a list of FmpClient")
    for i, c in enumerate(clients):
        if not isinstance(c, FmpClient):
            raise InputError(f"client {i} is a {type(c).__name__}", expected="an FmpClient")
    return list(clients)


def _check_repeats(repeats: Any) -> int:
    if not is_int(repeats) or repeats < 1:
        raise InputError(f"repeats={repeats!r}", expected="an integer >= 1")
    return int(repeats)


def plant_fmp(clients: Sequence[FmpClient], vocab_size: int, canary_ids: Sequence[int], members: Any,
              rng: np.random.Generator, repeats: int = 1) -> list[FmpClient]:
    """New clients in which each member holds ``repeats`` extra utterances with the canary words, in group 0.

    Each planted utterance copies the hypotheses, base scores and NNLM weight of one of the client's
    utterances (drawn with ``rng``) and inserts all ``canary_ids``, as one block at a random position, into
    **every** hypothesis, so the canary words are counted whatever the rank kernel keeps (a client without
    utterances gets one hypothesis holding only the canary). The utterances are appended to the first group
    (created if the client has none), so the member reports them in round 0. Non-members and the input list are
    left as they are (clients are immutable; the returned list is new).

    Args:
        clients: the population.
        vocab_size: the background vocabulary's size (canary ids must be below it).
        canary_ids: distinct word ids, rare ones (:func:`unused_ids`) so that a non-member scores 0.
        members: the member clients: a boolean mask over ``clients`` or a list of indices.
        rng: draws the template utterances and insertion positions.
        repeats: planted utterances per member (>= 1).

    >>> c = FmpClient("m", ((FmpUtterance("a", ([1, 2], [1]), [0.0, -1.0]),),))
    >>> [p] = plant_fmp([c], 5, [4], members=[0], rng=np.random.default_rng(0))
    >>> [(u.utt_id, [h.tolist() for h in u.word_ids]) for u in p.groups[0]]
    [('a', [[1, 2], [1]]), ('canary0', [[1, 2, 4], [1, 4]])]
    """
    clients = _fmp_clients(clients)
    if not is_int(vocab_size) or vocab_size < 1:
        raise InputError(f"vocab_size={vocab_size!r}", expected="an integer >= 1")
    canary = _canary_ids(canary_ids, int(vocab_size))
    who = _member_set(members, len(clients))
    repeats = _check_repeats(repeats)
    out = list(clients)
    for i in sorted(who):
        c = clients[i]
        utts = [u for g in c.groups for u in g]
        taken = {u.utt_id for u in utts}
        planted = []
        for k in range(repeats):
            uid = f"canary{k}"
            while uid in taken:
                uid = "_" + uid
            taken.add(uid)
            if utts:
                t = utts[int(rng.integers(len(utts)))]
                hyps = []
                for h in t.word_ids:
                    at = int(rng.integers(h.size + 1))
                    hyps.append(np.concatenate([h[:at], canary, h[at:]]))
                planted.append(FmpUtterance(uid, tuple(hyps), t.base.copy(), t.bias_weight))
            else:
                planted.append(FmpUtterance(uid, (canary.copy(),), np.zeros(1)))
        groups = list(c.groups) or [()]
        groups[0] = (*groups[0], *planted)
        out[i] = FmpClient(c.id, tuple(groups))
    return out


def fmp_canary_count(view: Update | np.ndarray, canary_ids: Sequence[int]) -> float:
    """The summed count of the canary words in an FMP upload (sparse ``ids``/``counts``; 0 where absent) or in
    a dense aggregate count vector (which may be noisy, hence negative).

    >>> u = Update({"ids": np.array([1, 4]), "counts": np.array([2.0, 0.5])})
    >>> fmp_canary_count(u, [4, 3]), fmp_canary_count(np.array([0.0, 1.0, 0.0, -0.25, 3.0]), [4, 3])
    (0.5, 2.75)
    """
    canary = _canary_ids(canary_ids)
    if isinstance(view, Update):
        if set(view.arrays) != {"ids", "counts"}:
            raise InputError(f"an FMP upload with arrays {sorted(view.arrays)}", expected="['counts', 'ids']")
        ids, counts = view.arrays["ids"], view.arrays["counts"]
        return float(np.asarray(counts, dtype=np.float64)[np.isin(ids, canary)].sum())
    dense = np.asarray(view, dtype=np.float64)
    if dense.ndim != 1 or canary.max() >= dense.size:
        raise InputError(f"an FMP aggregate of shape {dense.shape} for canary ids {canary.tolist()}",
                         expected="a dense count vector over the vocabulary")
    return float(dense[canary].sum())


def fmp_membership_scores(views: Mapping[int, Mapping[int, Update]], canary_ids: Sequence[int], members: Any,
                          *, round: int = 0) -> MembershipTrials:
    """The per-client membership attack on FMP uploads (secure aggregation off): one trial per client that
    reported in ``round``, score = its count of the canary words (:func:`fmp_canary_count`), label = member.

    Args:
        views: :attr:`RecordingBackend.views` (``round -> client index -> Update``).
        canary_ids: the planted words.
        members: the member clients (a list of indices, or a boolean mask over the population).
        round: the round whose uploads are scored (the canaries are planted in group 0: round 0).

    Returns:
        :class:`MembershipTrials` with ``ids`` the client indices, ascending. Clients not sampled in ``round``
        are not trials.

    >>> up = lambda ids, c: Update({"ids": np.array(ids), "counts": np.array(c)})
    >>> t = fmp_membership_scores({0: {0: up([1, 5], [1.0, 2.0]), 3: up([1], [4.0])}}, [5], members=[0])
    >>> t.ids.tolist(), t.scores.tolist(), t.labels.tolist()
    ([0, 3], [2.0, 0.0], [True, False])
    """
    canary = _canary_ids(canary_ids)
    if not isinstance(views, Mapping) or round not in views:
        have = sorted(views) if isinstance(views, Mapping) else type(views).__name__
        raise InputError(f"no uploads recorded for round {round} (recorded: {have})",
                         expected="RecordingBackend.views of a run that recorded that round")
    per = views[round]
    idx = sorted(int(i) for i in per)
    mask_n = None
    m = np.asarray(list(members) if not isinstance(members, np.ndarray) else members)
    if m.dtype.kind == "b":
        mask_n = m.size
        if idx and idx[-1] >= mask_n:
            raise InputError(f"a members mask of length {mask_n} but client {idx[-1]} reported",
                             expected="a mask over the whole population")
    who = _member_set(m, mask_n)
    scores = np.array([fmp_canary_count(per[i], canary) for i in idx], dtype=np.float64)
    labels = np.array([i in who for i in idx], dtype=bool)
    return MembershipTrials(scores, labels, np.array(idx, dtype=np.int64))


def fmp_aggregate_trials(make_run: Callable[[bool, np.random.Generator], float], n_trials: int,
                         rng: np.random.Generator) -> MembershipTrials:
    """The "one secret per trial" membership game on an aggregate: ``n_trials`` independent runs.

    In trial ``t`` a fair coin (from ``rng``) decides whether the target holds the canary, and
    ``make_run(member, trial_rng)`` runs the algorithm and returns the attack's score, e.g. the canary count of
    the round's aggregate (:func:`fmp_trial_runner` builds one that draws a fresh random target, plants the
    canary if ``member``, runs on the backend, DP and SecAgg settings it was given and reads the aggregate).
    ``trial_rng`` is a generator of its own per trial (spawned from ``rng``), so a trial's target, planting and
    run seed do not depend on the coin. Each run releases one bit about one target, which is the setting of a
    DP guarantee for one unit: the trials are independent draws of the mechanism on neighbouring datasets,
    and their scores and labels are the input of the likelihood-ratio test and the epsilon lower bound.

    >>> t = fmp_aggregate_trials(lambda member, r: 3.0 if member else 0.0, 6, np.random.default_rng(1))
    >>> bool(np.all(t.scores[t.labels] == 3.0) and np.all(t.scores[~t.labels] == 0.0)), t.ids.tolist()
    (True, [0, 1, 2, 3, 4, 5])
    """
    if not callable(make_run):
        raise ConfigError(f"make_run is a {type(make_run).__name__}", expected="a callable (member, rng) -> score")
    if not is_int(n_trials) or n_trials < 1:
        raise ConfigError(f"n_trials={n_trials!r}", expected="an integer >= 1")
    if not isinstance(rng, np.random.Generator):
        raise ConfigError(f"rng is a {type(rng).__name__}", expected="a numpy.random.Generator")
    coins = rng.random(int(n_trials)) < 0.5
    streams = rng.spawn(int(n_trials))
    scores = np.zeros(int(n_trials))
    for t in range(int(n_trials)):
        s = make_run(bool(coins[t]), streams[t])
        try:
            scores[t] = float(s)
        except (TypeError, ValueError):
            raise InputError(f"trial {t}: make_run returned {s!r}", expected="a number (the attack's score)") from None
    return MembershipTrials(scores, coins, np.arange(int(n_trials), dtype=np.int64))


def fmp_trial_runner(algorithm: FmpAlgorithm, clients: Sequence[FmpClient], canary_ids: Sequence[int], *,
                     sampler: Any, rounds: int = 1, round: int = 0, repeats: int = 1, backend: Any = None,
                     privacy: Callable[[], Any] | None = None, secagg: Any = None,
                     options: dict[str, Any] | None = None, min_clients: int = 1,
                     ) -> Callable[[bool, np.random.Generator], float]:
    """A ``make_run`` for :func:`fmp_aggregate_trials`: one FMP run per call, scored on the round's aggregate.

    Each call draws a target uniformly from ``clients`` with the trial's generator, plants ``repeats`` canary
    utterances in it when ``member`` (:func:`plant_fmp`), runs ``rounds`` rounds with a seed drawn from the same
    generator on ``backend`` (:func:`~privasr.federated.backends.run_on`: a name, ``"flower"`` or a backend
    object, which is reused and left open: pass one to avoid starting e.g. Ray per trial) and returns the canary
    count of round ``round``'s released aggregate (:func:`aggregate_recorder` on ``state["sum"]``; the noisy sum
    with DP). With secure aggregation and server-side noise the server itself sees the exact sum, i.e. the
    score of the same run without DP.

    Args:
        algorithm: the FMP algorithm (its config decides increment or cumulative aggregates).
        clients: the population without canaries (use :func:`unused_ids` for the canary words).
        canary_ids: the planted words.
        sampler, rounds, min_clients: the loop's settings.
        round: the round whose aggregate is scored (< ``rounds``; the canary is reported in round 0).
        repeats: planted utterances per member.
        backend, options, secagg: where to run (see :func:`~privasr.federated.backends.run_on`).
        privacy: ``None`` (no DP) or a function returning **fresh** :class:`~privasr.federated.loop.PrivacySettings`
            per run (an accountant is stateful).

    >>> from privasr.federated.algorithms.fmp import FmpConfig
    >>> from privasr.federated.sampling import AllClients
    >>> pop = [FmpClient(f"c{i}", ((FmpUtterance("a", ([1, 2],), [0.0]),),)) for i in range(3)]
    >>> run = fmp_trial_runner(FmpAlgorithm(FmpConfig(), np.full(5, 0.2)), pop, [4], sampler=AllClients())
    >>> t = fmp_aggregate_trials(run, 4, np.random.default_rng(0))
    >>> t.labels.tolist(), t.scores.tolist()
    ([False, True, True, True], [0.0, 1.0, 1.0, 1.0])
    """
    from privasr.federated.backends import run_on

    if not isinstance(algorithm, FmpAlgorithm):
        raise ConfigError(f"algorithm is a {type(algorithm).__name__}", expected="an FmpAlgorithm")
    population = _fmp_clients(clients)
    if not population:
        raise InputError("there are no clients", expected="at least one FmpClient")
    canary = _canary_ids(canary_ids, algorithm.vocab_size)
    repeats = _check_repeats(repeats)
    if not is_int(rounds) or not is_int(round) or not 0 <= round < rounds:
        raise ConfigError(f"round={round!r} with rounds={rounds!r}", expected="0 <= round < rounds")
    if privacy is not None and not callable(privacy):
        raise ConfigError(f"privacy is a {type(privacy).__name__}",
                          expected="None or a function returning fresh PrivacySettings")
    cumulative = algorithm.config.send == "cumulative"

    def make_run(member: bool, rng: np.random.Generator) -> float:
        target = int(rng.integers(len(population)))
        planted = plant_fmp(population, algorithm.vocab_size, canary, [target] if member else [], rng, repeats)
        seed = int(rng.integers(2 ** 31 - 1))
        on_round, aggregates = aggregate_recorder("sum", cumulative=cumulative)
        run_on(backend, algorithm, planted, options=options, on_round=on_round, secagg=secagg, rounds=rounds,
               sampler=sampler, seed=seed, min_clients=min_clients, privacy=None if privacy is None else privacy())
        found = [a for a in aggregates if a.round == round]
        if not found:
            raise InputError(f"the run recorded no aggregate for round {round}",
                             expected="a run of at least round + 1 rounds")
        return fmp_canary_count(found[0].value, canary)

    return make_run


# ---------------------------------------------------------------------------------------------------------------
# fedlm word sets
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class WordSetResult:
    """A word set read off a delta, compared with the words the client(s) trained on.

    Precision and recall are over ordinary words only (``special_ids`` excluded from both sets); ``nan`` when
    undefined (precision of an empty read-off, recall of an empty true set).

    Attributes:
        precision: ``|found & true| / |found|``.
        recall: ``|found & true| / |true|``.
        true_words: the word ids trained on (without special ids).
        found_words: the word ids read off (without special ids).
        special_found: the special ids read off (``<s>`` always, as every utterance's first input; ``<unk>``
            when out-of-vocabulary words were trained on; ``</s>`` only with tied embeddings).
    """

    precision: float
    recall: float
    true_words: frozenset[int]
    found_words: frozenset[int]
    special_found: frozenset[int] = frozenset()

    @classmethod
    def compare(cls, found: Iterable[int], true: Iterable[int],
                special_ids: Iterable[int] = SPECIAL_IDS) -> WordSetResult:
        """Score a read-off set against the truth.

        >>> r = WordSetResult.compare({1, 3, 4, 5}, {3, 4, 6})
        >>> r.precision, round(r.recall, 3), sorted(r.found_words), sorted(r.special_found)
        (0.6666666666666666, 0.667, [3, 4, 5], [1])
        """
        special = {int(i) for i in special_ids}
        f = frozenset(int(i) for i in found)
        t = frozenset(int(i) for i in true) - special
        words = f - special
        hit = len(words & t)
        precision = hit / len(words) if words else math.nan
        recall = hit / len(t) if t else math.nan
        return cls(precision, recall, t, frozenset(words), frozenset(f & special))


@dataclass(frozen=True)
class CohortWordSets:
    """The word set read off a cohort's summed delta.

    Attributes:
        union: the read-off against the union of the cohort's words (what the sum reveals about the cohort).
        per_client: for each cohort member, the same read-off against its own words: ``precision`` is the
            share of the read-off words that are the client's, i.e. the precision of attributing every found
            word to that client (about ``1/k`` for a cohort of ``k`` with disjoint vocabularies), ``recall`` the
            share of its words that are found.
    """

    union: WordSetResult
    per_client: list[WordSetResult]


def _embedding(delta: Any, embedding_key: str) -> np.ndarray:
    arrays = delta.arrays if isinstance(delta, Update) else delta
    if not isinstance(arrays, Mapping):
        raise InputError(f"a delta that is a {type(delta).__name__}", expected="an Update or a name -> array mapping")
    if embedding_key not in arrays:
        raise InputError(f"the delta has no array {embedding_key!r} (it has {sorted(arrays)[:8]})",
                         expected="the input-embedding parameter's name (a word-level model, not char_aware)")
    e = np.asarray(arrays[embedding_key])
    if e.ndim != 2 or e.dtype.kind not in "biuf":
        raise InputError(f"{embedding_key!r} has shape {e.shape} and dtype {e.dtype}",
                         expected="a numeric [vocabulary, dim] matrix")
    return e


def embedding_word_set(delta: Update | Mapping[str, np.ndarray], embedding_key: str = EMBEDDING_KEY,
                       tol: float = 0.0) -> set[int]:
    """The word ids whose input-embedding row in ``delta`` has some ``|value| > tol``.

    For a fedlm client delta these are exactly the ids fed to the model (its words and ``<s>``): unused rows get
    a zero gradient and stay exactly zero, also after clipping.

    >>> embedding_word_set({"embed.weight": np.array([[0.0, 0.0], [0.0, -1e-3], [2.0, 0.0]])})
    {1, 2}
    """
    if not isinstance(tol, int | float) or isinstance(tol, bool) or not tol >= 0:
        raise ConfigError(f"tol={tol!r}", expected="a number >= 0")
    e = _embedding(delta, embedding_key)
    return {int(i) for i in np.flatnonzero((np.abs(e) > tol).any(axis=1))}


def client_word_set(client: FedLmClient, config: FedLmConfig | None = None) -> set[int]:
    """The word ids a fedlm client trains on: those of its utterances with some positive loss weight under
    ``config``'s loss (``None``: every utterance; with ``loss="threshold"`` low-confidence utterances are
    dropped and their words are not fed to the model).

    >>> c = FedLmClient("c", ((3, 4), (5,)), (np.array([1.0, 1.0]), np.array([0.1])))
    >>> sorted(client_word_set(c)), sorted(client_word_set(c, FedLmConfig(loss="threshold")))
    ([3, 4, 5], [3, 4])
    """
    if not isinstance(client, FedLmClient):
        raise InputError(f"client is a {type(client).__name__}", expected="a FedLmClient")
    out: set[int] = set()
    for j, s in enumerate(client.sentences):
        if config is not None:
            w = target_weights(config, len(s), None if client.weights is None else client.weights[j])
            if not w.any():
                continue
        out.update(s)
    return out


def _pairs(updates: Any, clients: Sequence[FedLmClient]) -> list[tuple[Any, FedLmClient]]:
    if isinstance(updates, Mapping):
        keys = sorted(updates)
        bad = [k for k in keys if not is_int(k) or not 0 <= k < len(clients)]
        if bad:
            raise InputError(f"updates for client index {bad[0]!r} of {len(clients)} clients",
                             expected="client indices into clients (RecordingBackend.views[round])")
        return [(updates[k], clients[k]) for k in keys]
    updates = list(updates)
    if len(updates) != len(clients):
        raise InputError(f"{len(updates)} updates for {len(clients)} clients", expected="one update per client")
    return list(zip(updates, clients, strict=True))


def word_set_scores(updates: Sequence[Update] | Mapping[int, Update], clients: Sequence[FedLmClient],
                    embedding_key: str = EMBEDDING_KEY, special_ids: Iterable[int] = SPECIAL_IDS, *,
                    tol: float = 0.0, config: FedLmConfig | None = None) -> list[WordSetResult]:
    """Per client: the word set read off its own delta (:func:`embedding_word_set`, secure aggregation off)
    against the words it trained on (:func:`client_word_set` with ``config``).

    ``updates`` are aligned with ``clients``, or a ``client index -> Update`` mapping such as
    ``RecordingBackend.views[round]`` with ``clients`` the whole population (results in index order).
    Without noise and with untied embeddings, precision and recall are 1.

    >>> d = {"embed.weight": np.array([[0.0], [1.0], [0.0], [0.5], [0.2]])}
    >>> [r] = word_set_scores([d], [FedLmClient("c", ((3, 4),))])
    >>> r.precision, r.recall, sorted(r.special_found)
    (1.0, 1.0, [1])
    """
    special = tuple(int(i) for i in special_ids)
    return [WordSetResult.compare(embedding_word_set(u, embedding_key, tol), client_word_set(c, config), special)
            for u, c in _pairs(updates, clients)]


def cohort_word_set_scores(aggregate: Update | Mapping[str, np.ndarray], clients: Sequence[FedLmClient],
                           embedding_key: str = EMBEDDING_KEY, special_ids: Iterable[int] = SPECIAL_IDS, *,
                           tol: float = 0.0, config: FedLmConfig | None = None) -> CohortWordSets:
    """The word set read off a cohort's summed delta (what a secure-aggregation server unmasks:
    :func:`sum_updates` of the round's uploads, or the fedavg step of :func:`aggregate_recorder`) against the
    union of the cohort's words, and against each member's (:class:`CohortWordSets`).

    The sum reveals the union (recall 1, precision 1 without noise, barring exact cancellation) but not who
    said which word: attributing the found words to one member has precision ``|W_i| / |union|``.

    >>> d = {"embed.weight": np.array([[0.0], [1.0], [0.0], [0.5], [0.2], [0.1]])}
    >>> cs = cohort_word_set_scores(d, [FedLmClient("a", ((3, 4),)), FedLmClient("b", ((5,),))])
    >>> cs.union.precision, cs.union.recall, [r.precision for r in cs.per_client]
    (1.0, 1.0, [0.6666666666666666, 0.3333333333333333])
    """
    clients = list(clients)
    if not clients:
        raise InputError("an empty cohort", expected="at least one client")
    special = tuple(int(i) for i in special_ids)
    found = embedding_word_set(aggregate, embedding_key, tol)
    words = [client_word_set(c, config) for c in clients]
    union = WordSetResult.compare(found, set().union(*words), special)
    return CohortWordSets(union, [WordSetResult.compare(found, w, special) for w in words])


def noisy_word_set_scores(update: Update | Mapping[str, np.ndarray], client: FedLmClient, mechanism: Any,
                          rng: np.random.Generator, *, threshold: float = 3.0,
                          embedding_key: str = EMBEDDING_KEY, special_ids: Iterable[int] = SPECIAL_IDS,
                          config: FedLmConfig | None = None) -> WordSetResult:
    """The word set read off one client's clipped delta after the loop's Gaussian noise: a cohort of one.

    ``mechanism`` is the run's :class:`~privasr.privacy.dp.mechanisms.GaussianMechanism` (its ``clip_norm``
    the algorithm's); its ``add_noise`` draws ``N(0, std^2)``, ``std = noise_multiplier * clip_norm``, on every
    coordinate of the embedding matrix, which is what DP-FedAvg releases for that matrix when the client is
    alone in its round (the loop adds the noise once to the sum of uniform-weight deltas; the other
    parameters' noise is independent and not read here). A row is read as a word when any of its values
    exceeds ``threshold * std`` in magnitude (``std = 0``: any non-zero value).

    What this measures: how well a per-coordinate threshold test recovers the word set from **one** noisy
    release of a lone client, with no sampling amplification and no other client's words in the sum. It is
    a lower bound on what a stronger attacker (a test on the whole row, several rounds, a prior over words)
    reads; it is not the server's view, which is the clipped delta before the noise (:func:`word_set_scores`).
    An unused row of dimension ``d`` is read (a false positive) with probability
    ``1 - (1 - 2 Phi(-threshold))^d``, about 4% for ``d = 16`` and ``threshold = 3``.

    Raises:
        InputError: the delta's L2 norm exceeds the mechanism's ``clip_norm`` (the noise would not be
            calibrated to it: set ``clip_norm`` in the algorithm).

    >>> from privasr.privacy.dp.mechanisms import GaussianMechanism
    >>> d = {"embed.weight": np.array([[0.0, 0.0], [0.0, 0.6], [0.0, 0.0], [0.8, 0.0]])}
    >>> r = noisy_word_set_scores(d, FedLmClient("c", ((3,),)), GaussianMechanism(1.0, 0.0), np.random.default_rng(0))
    >>> r.precision, r.recall
    (1.0, 1.0)
    """
    if not (hasattr(mechanism, "add_noise") and hasattr(mechanism, "std") and hasattr(mechanism, "clip_norm")):
        raise ConfigError(f"mechanism is a {type(mechanism).__name__}", expected="a GaussianMechanism")
    if not isinstance(threshold, int | float) or isinstance(threshold, bool) or not threshold >= 0:
        raise ConfigError(f"threshold={threshold!r}", expected="a number of standard deviations >= 0")
    arrays = update.arrays if isinstance(update, Update) else update
    e = _embedding(arrays, embedding_key)
    norm = global_norm({k: np.asarray(v, dtype=np.float64) for k, v in dict(arrays).items()})
    if norm > mechanism.clip_norm * (1 + 1e-6):
        raise InputError(f"the delta's L2 norm is {norm:.6g}, above the mechanism's clip_norm {mechanism.clip_norm:g}",
                         expected="a clipped delta (FedLmConfig(clip_norm=...) equal to the mechanism's)")
    noisy = mechanism.add_noise({embedding_key: e}, rng)[embedding_key]
    found = {int(i) for i in np.flatnonzero((np.abs(noisy) > threshold * mechanism.std).any(axis=1))}
    return WordSetResult.compare(found, client_word_set(client, config), special_ids)


# ---------------------------------------------------------------------------------------------------------------
# fedlm canaries
# ---------------------------------------------------------------------------------------------------------------
def plant_fedlm(clients: Sequence[FedLmClient], canaries: Sequence[Sequence[int]], members: Any,
                repeats: int | Sequence[int], rng: np.random.Generator) -> list[FedLmClient]:
    """New clients in which each member holds every canary sentence ``repeats`` times, at random positions.

    Args:
        clients: the population (not modified; non-members are returned as they are).
        canaries: word-id sentences (without ``<s>``/``</s>``), e.g. random words of a fixed format.
        members: the member clients: a boolean mask over ``clients`` or a list of indices.
        repeats: copies of each canary per member: one count for all, or one per canary (so that one run
            gives exposure at several repetition counts); counts >= 0.
        rng: draws the insertion positions.

    Planted sentences get confidence 1 when the client has confidences.

    >>> c = FedLmClient("c", ((3, 4), (5,)))
    >>> [p] = plant_fedlm([c], [(7, 7, 6)], members=[0], repeats=2, rng=np.random.default_rng(0))
    >>> sorted(p.sentences)
    [(3, 4), (5,), (7, 7, 6), (7, 7, 6)]
    """
    if isinstance(clients, str | bytes) or not isinstance(clients, Sequence):
        raise InputError(f"clients are a {type(clients).__name__}", expected="a list of FedLmClient")
    for i, c in enumerate(clients):
        if not isinstance(c, FedLmClient):
            raise InputError(f"client {i} is a {type(c).__name__}", expected="a FedLmClient")
    if isinstance(canaries, str | bytes) or not isinstance(canaries, Sequence) or not canaries:
        raise InputError(f"canaries {canaries!r}", expected="a non-empty list of word-id sentences")
    sents = []
    for j, s in enumerate(canaries):
        if isinstance(s, str | bytes) or not isinstance(s, Sequence | np.ndarray) or len(s) == 0 \
                or not all(is_int(i) and i >= 0 for i in s):
            raise InputError(f"canary {j} is {s!r}", expected="a non-empty sequence of word ids >= 0")
        sents.append(tuple(int(i) for i in s))
    reps = [repeats] * len(sents) if is_int(repeats) else list(repeats) \
        if isinstance(repeats, Sequence | np.ndarray) else None
    if reps is None or len(reps) != len(sents) or not all(is_int(r) and r >= 0 for r in reps):
        raise InputError(f"repeats={repeats!r} for {len(sents)} canaries",
                         expected="an integer >= 0 or one per canary")
    who = _member_set(members, len(clients))
    out = list(clients)
    for i in sorted(who):
        c = clients[i]
        items: list[tuple[tuple[int, ...], np.ndarray | None]] = [
            (s, None if c.weights is None else c.weights[j]) for j, s in enumerate(c.sentences)]
        for s, r in zip(sents, reps, strict=True):
            for _ in range(int(r)):
                items.insert(int(rng.integers(len(items) + 1)), (s, None if c.weights is None else np.ones(len(s))))
        weights = None if c.weights is None else tuple(w for _, w in items)
        out[i] = FedLmClient(c.id, tuple(s for s, _ in items), weights)
    return out


@torch.no_grad()
def sentence_log_perplexity(algorithm: FedLmAlgorithm, params: Mapping[str, np.ndarray],
                            sentences: Sequence[Sequence[int]], batch_size: int = 64) -> np.ndarray:
    """Per sentence, the mean negative log-likelihood under the model with ``params`` (nats per target, the
    targets being the words and ``</s>``), float64 ``[len(sentences)]``.

    The same computation as :meth:`~privasr.federated.algorithms.fedlm.FedLmAlgorithm.perplexity` (windows of
    at most ``max_len`` targets after ``<s>``, batched), kept per sentence: the token-weighted mean of the
    result, exponentiated, is that perplexity. Exposure ranks a canary's value among candidates'.

    Raises:
        InputError: an empty sentence, an id outside the vocabulary, or parameters not of the model.

    >>> from privasr.lm.neural.models import NeuralLMConfig
    >>> from privasr.lm.neural.vocab import Vocabulary
    >>> alg = FedLmAlgorithm(FedLmConfig(), NeuralLMConfig.preset("tiny-transformer"), Vocabulary.build([["a", "b"]]))
    >>> params = alg.init(np.random.default_rng(0))["params"]
    >>> nll = sentence_log_perplexity(alg, params, [(3, 4), (4, 4, 3)])
    >>> nll.shape, bool(np.isclose(np.exp((nll * [3, 4]).sum() / 7), alg.perplexity(params, [(3, 4), (4, 4, 3)])))
    ((2,), True)
    """
    if not isinstance(algorithm, FedLmAlgorithm):
        raise ConfigError(f"algorithm is a {type(algorithm).__name__}", expected="a FedLmAlgorithm")
    if not is_int(batch_size) or batch_size < 1:
        raise ConfigError(f"batch_size={batch_size!r}", expected="an integer >= 1")
    vocab = algorithm.vocab
    v, max_len = len(vocab), algorithm.model_config.max_len
    seqs: list[np.ndarray] = []
    owner: list[int] = []
    for j, s in enumerate(sentences):
        if isinstance(s, str | bytes) or len(s) == 0 or not all(is_int(i) and 0 <= i < v for i in s):
            raise InputError(f"sentence {j} is {s!r}", expected=f"a non-empty sequence of word ids in [0, {v})")
        ids = np.array([vocab.bos_id, *s, vocab.eos_id], dtype=np.int64)
        for start in range(0, len(ids) - 1, max_len):
            seqs.append(ids[start:start + max_len + 1])
            owner.append(j)
    n = len(sentences)
    nll = np.zeros(n)
    count = np.zeros(n)
    model = algorithm.load(algorithm._check_params(params, "params"))
    model.eval()
    own = np.array(owner, dtype=np.int64)
    for lo in range(0, len(seqs), batch_size):
        x, y = make_batch(seqs[lo:lo + batch_size])
        logits, _ = model(x)
        ce = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), ignore_index=_IGNORE, reduction="none")
        ce = ce.view(y.shape).double().sum(dim=1).numpy()
        np.add.at(nll, own[lo:lo + batch_size], ce)
        np.add.at(count, own[lo:lo + batch_size], (y != _IGNORE).sum(dim=1).numpy())
    return nll / count
