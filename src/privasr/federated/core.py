"""The federated algorithm protocol: what runs on a client, what leaves it, and what the server does with it.

A federated algorithm is five functions over plain data (apple/pfl-research's ``FederatedAlgorithm`` and
FedJAX's ``init``/``apply`` are the models); a backend (:mod:`privasr.federated.backends`) decides where the
clients run, and :func:`privasr.federated.loop.run_federated` owns the rounds:

* ``init(rng) -> state``: the server's state (a *pytree*: dicts, lists, tuples, numpy arrays, numbers, strings,
  ``None``; it is checkpointed every round by :mod:`privasr.federated.tree`);
* ``broadcast(state, round) -> payload``: what every sampled client receives;
* ``client_update(payload, client, client_state, rng) -> (Update, client_state)``: runs on the device.
  ``client_state`` is the client's own persistent state (FMP's cache lives there); it is never part of an
  :class:`Update` (in simulation the backend keeps it, and checkpoints it as the devices' storage);
* ``accumulate(acc, update) -> acc``: folds one :class:`Update` into the server's running aggregate as it
  arrives; memory must not grow with the number of clients;
* ``server_update(state, acc, round, rng) -> (state, metrics)``.

:class:`Update` is the **only** thing that leaves a client: numeric arrays, a weight and numeric metrics. Its
constructor rejects strings, bytes and object arrays, so no string can cross the boundary by construction;
tests assert further that no token sequence does. Numbers derived from text do cross it and reveal words (FMP's
word counts, the embedding rows a fedlm delta changes); who sees them in which mode is in docs/privacy.md.

Differential privacy (:mod:`privasr.privacy.dp`) wraps this: the algorithm bounds each unit's contribution
(clipping a client's update, or capping an utterance's counts), the loop adds noise **once** to the
accumulated sum (:meth:`SumAccumulator.add_noise`) before ``server_update``, and feeds the accountant the
event of the sampler actually used. ``server_update`` then receives a *release*
(:meth:`SumAccumulator.released`): the noised arrays, ``weight`` a data-independent denominator (the expected
cohort weight), ``count`` 0 and no metrics, so nothing it computes or publishes depends on the data beyond the
noised sum. An algorithm that supports DP defines three more members, which the loop checks before round 0:

* ``dp_bound() -> (norm, bound)``: ``("l2", C)`` or ``("l1", cap)``, the bound of one unit's contribution to the
  sum (a :class:`~privasr.errors.ConfigError` when its settings bound nothing, e.g. weighted aggregation);
* ``zero_sum(state) -> SumAccumulator``: the sum of no update (zeros of the release's shapes), which a round in
  which nobody reported releases with noise alone;
* ``dp_metrics``: the names of the ``server_update`` metrics that are functions of the release only (the loop
  publishes no other metric of a DP round).

>>> import numpy as np
>>> u = Update({"counts": np.array([2.0, 1.0])}, weight=3.0, metrics={"n_utts": 1})
>>> acc = SumAccumulator.empty().add(u).add(Update({"counts": np.array([1.0, 0.0])}, weight=1.0))
>>> acc.arrays["counts"].tolist(), acc.weight, acc.count, acc.metrics
([3.0, 1.0], 4.0, 2, {'n_utts': 1.0})
>>> Update({"text": np.array(["secret"])})
Traceback (most recent call last):
...
privasr.errors.InputError: update array 'text' has dtype <U6 (expected numeric arrays only: no text leaves a client)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol, TypeVar

import numpy as np

from privasr.errors import InputError, PrivasrError

__all__ = [
    "Update",
    "FederatedAlgorithm",
    "SumAccumulator",
    "ClientTask",
    "ClientOutcome",
    "FederatedError",
    "client_seed",
]

S = TypeVar("S")
P = TypeVar("P")
C = TypeVar("C")
A = TypeVar("A")


class FederatedError(PrivasrError, RuntimeError):
    """A round could not complete (too few clients reported, a checkpoint does not match the run, ...)."""


def _numeric(name: str, a: Any) -> np.ndarray:
    arr = np.asarray(a)
    if arr.dtype.kind not in "biuf":
        raise InputError(f"update array {name!r} has dtype {arr.dtype}",
                         expected="numeric arrays only: no text leaves a client")
    if arr.dtype.kind == "f" and not np.all(np.isfinite(arr)):
        raise InputError(f"update array {name!r} holds NaN or infinity", expected="finite values")
    return arr


@dataclass(frozen=True)
class Update:
    """What one client sends to the server: numeric arrays, an aggregation weight and numeric metrics.

    Attributes:
        arrays: name -> numeric array (a model delta, a sparse count vector's ids and values, ...). Arrays are
            made read-only; no strings, bytes or objects are accepted.
        weight: the aggregation weight (a word count, 1 for uniform weighting); finite and >= 0.
        metrics: name -> number (training loss, number of utterances, ...); summed over clients by
            :class:`SumAccumulator`.
    """

    arrays: Mapping[str, np.ndarray] = field(default_factory=dict)
    weight: float = 1.0
    metrics: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.arrays, Mapping):
            raise InputError(f"update arrays are a {type(self.arrays).__name__}", expected="a name -> array mapping")
        arrays = {}
        for k, v in self.arrays.items():
            if not isinstance(k, str):
                raise InputError(f"update array name {k!r}", expected="string names")
            a = _numeric(k, v).copy()
            a.setflags(write=False)
            arrays[k] = a
        w = self.weight
        if isinstance(w, bool) or not isinstance(w, int | float | np.integer | np.floating) or not math.isfinite(w) \
                or w < 0:
            raise InputError(f"update weight {w!r}", expected="a finite number >= 0")
        metrics = {}
        for k, v in dict(self.metrics).items():
            if not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, int | float | np.integer | np.floating) \
                    or not math.isfinite(v):
                raise InputError(f"update metric {k!r} = {v!r}", expected="string names with finite numbers")
            metrics[k] = float(v)
        object.__setattr__(self, "arrays", MappingProxyType(arrays))
        object.__setattr__(self, "weight", float(w))
        object.__setattr__(self, "metrics", MappingProxyType(metrics))

    @property
    def nbytes(self) -> int:
        """Bytes of array payload (what a device would upload, before compression).

        >>> Update({"x": np.zeros(4)}).nbytes
        32
        """
        return int(sum(a.nbytes for a in self.arrays.values()))


@dataclass(frozen=True)
class SumAccumulator:
    """A streaming sum of updates: arrays added element-wise (float64), weights and metrics summed.

    Memory is one copy of the arrays, whatever the number of clients. Updates must all carry the same array
    names and shapes.
    """

    arrays: Mapping[str, np.ndarray]
    weight: float = 0.0
    count: int = 0
    metrics: Mapping[str, float] = field(default_factory=dict)
    noised: int = 0

    @classmethod
    def empty(cls) -> SumAccumulator:
        """An accumulator with nothing in it."""
        return cls({})

    def add(self, update: Update, scale: float = 1.0) -> SumAccumulator:
        """This sum plus ``scale * update.arrays`` (the weight is added unscaled); a new accumulator.

        The running arrays are updated in place when this accumulator owns them (the returned object reuses
        them): treat the old accumulator as consumed.
        """
        if self.count and set(update.arrays) != set(self.arrays):
            raise InputError(f"update arrays {sorted(update.arrays)} differ from earlier ones {sorted(self.arrays)}")
        arrays = dict(self.arrays)
        for k, a in update.arrays.items():
            if k in arrays:
                if arrays[k].shape != a.shape:
                    raise InputError(f"update array {k!r} has shape {a.shape}",
                                     expected=f"{arrays[k].shape} like the earlier updates")
                arrays[k] += a if scale == 1.0 else scale * a
            else:
                arrays[k] = np.array(a, dtype=np.float64) * scale
        metrics = dict(self.metrics)
        for k, v in update.metrics.items():
            metrics[k] = metrics.get(k, 0.0) + v
        return SumAccumulator(arrays, self.weight + update.weight, self.count + 1, metrics, self.noised)

    def add_sparse(self, name: str, size: int, ids: np.ndarray, values: np.ndarray, weight: float = 0.0,
                   metrics: Mapping[str, float] | None = None) -> SumAccumulator:
        """This sum plus a sparse vector (``values`` at ``ids``) into the dense array ``name`` of length ``size``.

        Costs O(len(ids)) (the dense array is allocated once), so a server can fold in millions of sparse
        client updates over a large vocabulary. Like :meth:`add`, the running arrays are updated in place.

        >>> acc = SumAccumulator.empty().add_sparse("c", 4, np.array([1, 3, 1]), np.array([1.0, 2.0, 0.5]), 3.5)
        >>> acc.arrays["c"].tolist(), acc.weight, acc.count
        ([0.0, 1.5, 0.0, 2.0], 3.5, 1)
        """
        ids = np.asarray(ids)
        values = np.asarray(values, dtype=np.float64)
        if ids.shape != values.shape or ids.ndim != 1 or ids.dtype.kind not in "iu":
            raise InputError(f"sparse update {name!r}: ids {ids.shape} {ids.dtype}, values {values.shape}",
                             expected="1-d integer ids and values of the same length")
        increasing = ids.size < 2 or bool((ids[1:] > ids[:-1]).all())
        if ids.size and ((ids[0] < 0 or ids[-1] >= size) if increasing else (ids.min() < 0 or ids.max() >= size)):
            raise InputError(f"sparse update {name!r} has ids outside [0, {size})")
        arrays = dict(self.arrays)
        if name not in arrays:
            arrays[name] = np.zeros(size, dtype=np.float64)
        elif arrays[name].shape != (size,):
            raise InputError(f"sparse update {name!r} of size {size}", expected=f"size {arrays[name].shape}")
        if not increasing:
            np.add.at(arrays[name], ids, values)  # repeated ids: unbuffered
        else:
            arrays[name][ids] += values  # strictly increasing ids (what clients send): buffered, much faster
        merged = dict(self.metrics)
        for k, v in (metrics or {}).items():
            merged[k] = merged.get(k, 0.0) + float(v)
        return SumAccumulator(arrays, self.weight + float(weight), self.count + 1, merged, self.noised)

    def add_sparse_block(self, name: str, size: int, ids: Sequence[np.ndarray], values: Sequence[np.ndarray],
                         weight: float = 0.0, metrics: Mapping[str, float] | None = None) -> SumAccumulator:
        """This sum plus a block of sparse vectors (``values[i]`` at ``ids[i]``, one per client) in one
        ``np.bincount``: what :meth:`add_sparse` does for each, without its per-client cost (a server folds
        arriving updates in blocks). ``weight`` and ``metrics`` are the block's totals; ``count`` grows by
        ``len(ids)``. The sum is the same up to floating-point summation order.

        >>> acc = SumAccumulator.empty().add_sparse_block("c", 4, [np.array([1, 3]), np.array([1])],
        ...                                               [np.array([1.0, 2.0]), np.array([0.5])], 3.5)
        >>> acc.arrays["c"].tolist(), acc.weight, acc.count
        ([0.0, 1.5, 0.0, 2.0], 3.5, 2)
        """
        if len(ids) != len(values):
            raise InputError(f"sparse block {name!r}: {len(ids)} id arrays and {len(values)} value arrays",
                             expected="one of each per update")
        arrays = dict(self.arrays)
        if name not in arrays:
            arrays[name] = np.zeros(size, dtype=np.float64)
        elif arrays[name].shape != (size,):
            raise InputError(f"sparse update {name!r} of size {size}", expected=f"size {arrays[name].shape}")
        if ids:
            try:
                flat_ids = np.concatenate(ids)
                flat_values = np.concatenate(values).astype(np.float64, copy=False)
                ok = flat_ids.ndim == 1 and flat_ids.dtype.kind in "iu" and flat_values.ndim == 1 and \
                    list(map(len, ids)) == list(map(len, values))
            except (ValueError, TypeError):  # arrays of different dimensions
                ok = False
            if not ok:
                bad = next((i for i, (a, b) in enumerate(zip(ids, values, strict=True))
                            if np.ndim(a) != 1 or np.asarray(a).dtype.kind not in "iu" or np.shape(a) != np.shape(b)),
                           0)
                raise InputError(f"sparse update {name!r} #{bad} of the block: ids {np.shape(ids[bad])} "
                                 f"{np.asarray(ids[bad]).dtype}, values {np.shape(values[bad])}",
                                 expected="1-d integer ids and values of the same length")
            if flat_ids.dtype.kind == "u":  # bincount takes signed ids (too large ones wrap negative: refused)
                flat_ids = flat_ids.astype(np.int64)
            try:  # bincount refuses negative ids and grows past ``size`` for too large ones: one pass checks both
                summed = np.bincount(flat_ids, weights=flat_values, minlength=size)
            except ValueError:
                summed = np.zeros(size + 1)
            if summed.size != size:
                raise InputError(f"sparse update {name!r} has ids outside [0, {size})")
            arrays[name] += summed
        merged = dict(self.metrics)
        for k, v in (metrics or {}).items():
            merged[k] = merged.get(k, 0.0) + float(v)
        return SumAccumulator(arrays, self.weight + float(weight), self.count + len(ids), merged, self.noised)

    def add_noise(self, mechanism: Any, rng: np.random.Generator) -> SumAccumulator:
        """A copy with ``mechanism.add_noise`` applied to the summed arrays (counted in ``noised``).

        The loop calls this exactly once per round when differential privacy is on.
        """
        noisy = mechanism.add_noise(self.arrays, rng)
        return SumAccumulator(dict(noisy), self.weight, self.count, dict(self.metrics), self.noised + 1)

    def released(self, denominator: float) -> SumAccumulator:
        """What a DP round's ``server_update`` receives: these (noised) arrays with ``weight = denominator``,
        ``count = 0`` and no metrics; :meth:`mean` is then ``arrays / denominator``.

        The exact number of reporting clients, their summed weights and metrics are not covered by the noise,
        so a release carries none of them: an algorithm that divides by ``weight`` divides by the
        data-independent ``denominator`` the loop chose (DP-FedAvg's fixed denominator, McMahan et al. 2018).

        >>> acc = SumAccumulator({"x": np.array([3.0])}, weight=2.0, count=2, metrics={"loss": 1.0}, noised=1)
        >>> r = acc.released(1.5)
        >>> r.weight, r.count, dict(r.metrics), r.mean()["x"].tolist(), r.is_release
        (1.5, 0, {}, [2.0], True)
        """
        if not (isinstance(denominator, int | float) and math.isfinite(denominator) and denominator > 0):
            raise FederatedError(f"a DP release's denominator is {denominator!r} (expected a finite number > 0)")
        return SumAccumulator(self.arrays, float(denominator), 0, {}, max(self.noised, 1))

    @property
    def is_release(self) -> bool:
        """Whether this is a DP release (:meth:`released`): noised, with a data-independent ``weight``."""
        return self.noised > 0

    def mean(self) -> dict[str, np.ndarray]:
        """The weighted mean, ``arrays / weight`` (the caller scaled each update by its weight).

        >>> SumAccumulator.empty().add(Update({"x": np.array([2.0])}, weight=2.0), scale=2.0).mean()["x"].tolist()
        [2.0]
        """
        if self.weight <= 0:
            raise FederatedError("no weight was accumulated this round")
        return {k: v / self.weight for k, v in self.arrays.items()}


class FederatedAlgorithm(Protocol[S, P, C, A]):
    """The five functions of a federated algorithm (see the module docstring)."""

    name: str

    def init(self, rng: np.random.Generator) -> S: ...

    def broadcast(self, state: S, round: int) -> P: ...

    def client_update(self, payload: P, client: Any, client_state: C | None,
                      rng: np.random.Generator) -> tuple[Update, C]: ...

    def accumulate(self, acc: A | None, update: Update) -> A: ...

    def server_update(self, state: S, acc: A, round: int, rng: np.random.Generator) -> tuple[S, dict[str, Any]]: ...


@dataclass(frozen=True)
class ClientTask:
    """One client's work in a round, as a backend receives it.

    Attributes:
        slot: the position in this round's sample (results are accumulated in arrival order; ``slot`` keeps
            them identifiable).
        index: the client's index in the population.
        client: the client's data (stays on the device).
        state: the client's persistent state (``None`` the first time).
        seed: the seed of the client's generator this round (:func:`client_seed`).
    """

    slot: int
    index: int
    client: Any
    state: Any
    seed: tuple[int, ...]


@dataclass(frozen=True)
class ClientOutcome:
    """What a backend returns for one task: an update and the new client state, or the reason it failed."""

    slot: int
    index: int
    update: Update | None = None
    state: Any = None
    error: str | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """Whether the client reported an update."""
        return self.error is None and self.update is not None


def client_seed(seed: int, round: int, index: int, slot: int) -> tuple[int, ...]:
    """The entropy of a client's generator: the same on every backend and after a resume.

    >>> client_seed(0, 3, 17, 2)
    (0, 3, 17, 2, 1)
    """
    return (int(seed), int(round), int(index), int(slot), 1)


def run_client(algorithm: Any, payload: Any, task: ClientTask) -> tuple[Update, Any]:
    """Run ``algorithm.client_update`` for ``task`` and check that what leaves is an :class:`Update`."""
    rng = np.random.default_rng(list(task.seed))
    result = algorithm.client_update(payload, task.client, task.state, rng)
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], Update)):
        raise FederatedError(f"{type(algorithm).__name__}.client_update returned {type(result).__name__}; "
                             "expected (Update, client_state)")
    return result
