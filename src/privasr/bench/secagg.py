"""What secure aggregation (Flower's SecAgg+) costs per round against plain aggregation, and what a dropout adds.

Everything runs in this process, with the real code on both sides: the server's per-round logic is
:class:`~privasr.federated.backends.flower.GridBackend` (``run`` for a plain round, ``run_secure`` for a
SecAgg+ round: Flower's ``SecAggPlusWorkflow`` stages), the nodes run the real ``ClientApp`` of
:func:`~privasr.federated.backends.flower.make_client_app` (with Flower's ``secaggplus_mod`` for the secure
rounds), and the messages go through :class:`~privasr.federated.backends.flower_inprocess.InProcessGrid`,
which serialises and parses every message with Flower's protobuf serialisation, as between processes, and
counts its bytes. The nodes run one after the other, so a round's wall time is the work of the server **and**
of every node (in a deployment the nodes work in parallel, on their own machines): read the per-client
figures for a device's cost and ``server_s`` for the server's.

Four cases, each with ``clients`` clients (8; ``--quick``: 4) sampled every round and SecAgg+ with its default
settings (:class:`~privasr.federated.secagg.SecAggSettings`: shares with every other client, reconstruction
threshold 0.67, 22-bit quantisation):

* ``fmp_12k``, ``fmp_50k`` (``--quick``: 2k, 5k): FMP, vocabulary ``V`` = 12,000 and 50,000.
  :class:`BenchFmp` is the real :class:`~privasr.federated.algorithms.fmp.FmpAlgorithm` (its broadcast, dense
  ``qbar`` over ``V``, ``accumulate``, ``server_update``, and for SecAgg its ``secure_summand``: the counts dense
  over ``V``, and ``from_secure_sum``) with a uniform background; only ``client_update`` is synthetic: each
  client reports ``words`` (300) distinct word ids a round, drawn from a Zipf(1.1) law, with kernel-weighted
  counts (Gamma(1, 1)), in FMP's exact update format (sorted unique ``ids`` and ``counts``, weight, the
  ``utterances``/``changed`` metrics). Rescoring N-best lists is left out: it is the same in both modes.
* ``fedlm_1m``, ``fedlm_3.5m`` (``--quick``: 20k, 50k): a fedlm delta of ``D`` = 1,000,000 and 3,500,000
  parameters. :class:`BenchDelta` broadcasts float32 parameters and sends a float32 delta (two tensors, 40 % and
  60 % of ``D``) clipped to the L2 norm ``clip_norm`` = 0.5, as fedlm with ``clip_norm``; its ``accumulate``,
  ``secure_bound``, ``secure_summand`` and ``from_secure_sum`` are fedlm's own
  (:class:`~privasr.federated.algorithms.fedlm.FedLmAlgorithm`'s functions, with a real ``FedLmConfig``);
  only the training is replaced by a random delta.

Per case: one untimed warm-up round, then ``rounds`` (3; ``--quick``: 1) rounds, each run four times with the
same payload and the same client seeds (so the clients send the same updates): plain; secure; secure with the
last client going offline in the ``collect masked vectors`` stage (after the key exchange: the server
reconstructs its pairwise masks from the survivors' shares); and secure over the survivors alone (the baseline
of the dropout). The server state then advances with the plain sum (``server_update``), so later rounds
broadcast a realistic payload (FMP's dense ``qbar``). Reported per case (means over the timed rounds; bytes are
serialised message contents per client and round, summed over the protocol's stages):

* ``plain_round_s``, ``secure_round_s``, ``secure_vs_plain_time``: the round's wall time in this process;
  ``*_round_parallel_s`` and ``secure_vs_plain_time_parallel``: the server's time plus, per stage, the slowest
  node's (what the round would take with the nodes on their own machines, the network aside);
* ``plain_upload_bytes``, ``secure_upload_bytes``, ``secure_vs_plain_upload``, the same for the download, and
  the secure round's bytes per stage (``secure_upload_by_stage``, ``secure_download_by_stage``);
* ``plain_client_s``, ``secure_client_s``, ``secure_vs_plain_client_time``: a client's seconds per round in its
  ``ClientApp`` (all stages); ``client_masking_s``: of those, the seconds in ``secaggplus_mod`` in the
  ``collect masked vectors`` stage around privasr's handler (decrypting the shares, quantising, the masks),
  measured on the node as that stage's time minus the handler's (privasr's train handler is timed for the
  duration of the benchmark); ``client_masking_share``: all clients' masking over the secure round's wall time;
* ``plain_server_s``, ``secure_server_s``, ``secure_vs_plain_server_time``: the round's wall time minus the
  nodes' (the server's work and the serialisation of both sides); ``stage_share``: each SecAgg+ stage's share of
  the secure round's wall time (``GridBackend.last_secure.stages_s``; ``decode``: the rest, turning the unmasked
  sum into the accumulator);
* ``max_error_steps``: the largest difference between the unmasked sum and the plain sum of the same updates,
  in quantisation steps ``2 b / 2^bits`` (``b``: the algorithm's bound); at most one step per client, so the
  benchmark raises when it exceeds the number of clients (``error_bound_steps``);
* the dropout: ``dropout_round_s`` against ``survivors_round_s`` (``dropout_vs_survivors_time``), the same for
  the server's time and the ``unmask`` stage (``dropout_vs_survivors_unmask``: the server reconstructs the
  dropped node's key and regenerates its masks with every survivor), ``dropout_vs_secure_time`` (against the
  round without a dropout), ``dropout_upload_bytes``/``survivors_upload_bytes``, ``dropout_stage_share``, and
  ``dropout_max_error_steps``: the sum against the plain sum over the survivors (bound: the survivors).

Also: ``cpu_count``, ``cpu``, ``load_average`` (the 1-minute load when the benchmark started) and ``clients``.
``DIR/results.json`` holds the metrics and ``DIR/report.md`` a table of them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from privasr.errors import ConfigError
from privasr.federated.algorithms.fedlm import FedLmAlgorithm, FedLmConfig
from privasr.federated.algorithms.fmp import FmpAlgorithm, FmpConfig
from privasr.federated.core import ClientTask, SumAccumulator, Update
from privasr.federated.secagg import SCALAR_BOUND, SecAggSettings
from privasr.results import write_results

__all__ = ["run", "BenchFmp", "BenchDelta", "CASES", "QUICK_CASES"]

CASES: dict[str, tuple[str, int]] = {"fmp_12k": ("fmp", 12_000), "fmp_50k": ("fmp", 50_000),
                                     "fedlm_1m": ("fedlm", 1_000_000), "fedlm_3.5m": ("fedlm", 3_500_000)}
"""Case name -> (kind, size): FMP's vocabulary or the delta's number of parameters."""

QUICK_CASES: dict[str, tuple[str, int]] = {"fmp_2k": ("fmp", 2_000), "fmp_5k": ("fmp", 5_000),
                                           "fedlm_20k": ("fedlm", 20_000), "fedlm_50k": ("fedlm", 50_000)}
"""The cases of ``--quick``."""

WORDS = 300
"""Distinct words one FMP client reports in a round."""

CLIP_NORM = 0.5
"""The L2 norm the fedlm deltas are clipped to (the bound of every coordinate under SecAgg)."""

STAGES = ("setup", "share keys", "collect masked vectors", "unmask")
_WIRE_STAGES = dict(zip(("setup", "share_keys", "collect_masked_vectors", "unmask"), STAGES, strict=True))


class BenchFmp(FmpAlgorithm):
    """FMP with a synthetic client: ``words`` distinct Zipf(1.1) word ids a round, Gamma(1, 1) counts.

    Everything else is :class:`~privasr.federated.algorithms.fmp.FmpAlgorithm` (default config, uniform
    background over ``vocab`` words). A client is its index (the round's generator draws its words); its
    state counts its rounds.

    >>> alg = BenchFmp(100, words=5)
    >>> u, st = alg.client_update(alg.broadcast(alg.init(np.random.default_rng(0)), 0), 0, None,
    ...                           np.random.default_rng(1))
    >>> sorted(u.arrays), u.arrays["ids"].size, bool(np.all(np.diff(u.arrays["ids"]) > 0)), st
    (['counts', 'ids'], 5, True, {'rounds': 1})
    >>> bool(np.isclose(alg.secure_summand(u, None).arrays["counts"].sum(), u.weight))
    True
    """

    name = "bench-fmp"

    def __init__(self, vocab: int, words: int = WORDS) -> None:
        super().__init__(FmpConfig(), np.full(int(vocab), 1.0 / int(vocab)))
        self.words = int(min(words, vocab))
        ranks = np.arange(1, self.vocab_size + 1, dtype=np.float64)
        p = ranks ** -1.1
        self._p = p / p.sum()

    def config_dict(self) -> dict[str, Any]:
        return {**super().config_dict(), "vocab": self.vocab_size, "words": self.words}

    def client_update(self, payload: Mapping[str, Any], client: Any, client_state: Mapping[str, Any] | None,
                      rng: np.random.Generator) -> tuple[Update, dict[str, Any]]:
        ids = np.sort(rng.choice(self.vocab_size, size=self.words, replace=False, p=self._p)).astype(np.int64)
        counts = rng.gamma(1.0, 1.0, size=ids.size) + 1e-3
        rounds = 0 if client_state is None else int(client_state["rounds"])
        update = Update({"ids": ids, "counts": counts}, weight=float(counts.sum()),
                        metrics={"utterances": float(rng.integers(5, 40)), "changed": float(rng.integers(0, 5))})
        return update, {"rounds": rounds + 1}


class BenchDelta:
    """A fedlm-like update: a float32 delta of ``dim`` parameters (tensors ``embedding``, 40 %, and ``layers``)
    clipped to the L2 norm ``clip_norm``, uniformly weighted.

    ``accumulate``, ``secure_bound``, ``secure_summand`` and ``from_secure_sum`` are
    :class:`~privasr.federated.algorithms.fedlm.FedLmAlgorithm`'s own (with ``FedLmConfig(clip_norm=...,
    weighting="uniform", server="fedavg")``); the server applies the mean delta (FedAvg).

    >>> alg = BenchDelta(10)
    >>> u, _ = alg.client_update(alg.broadcast(alg.init(np.random.default_rng(0)), 0), 0, None,
    ...                          np.random.default_rng(1))
    >>> {k: (v.dtype.name, v.size) for k, v in u.arrays.items()}, round(alg.norm(u), 6), u.weight
    ({'embedding': ('float32', 4), 'layers': ('float32', 6)}, 0.5, 1.0)
    >>> alg.secure_bound(None), sorted(alg.secure_summand(u, None).scalars)
    (0.5, ['clipped', 'tokens', 'weight'])
    """

    name = "bench-delta"
    accumulate = FedLmAlgorithm.accumulate
    secure_bound = FedLmAlgorithm.secure_bound
    secure_summand = FedLmAlgorithm.secure_summand
    from_secure_sum = FedLmAlgorithm.from_secure_sum

    def decoded(self, update: Any) -> Any:
        """The update as sent: the benchmark's deltas are never compressed (what ``accumulate`` decodes)."""
        return update

    def __init__(self, dim: int, clip_norm: float = CLIP_NORM) -> None:
        self.dim = int(dim)
        self.config = FedLmConfig(clip_norm=float(clip_norm), weighting="uniform", server="fedavg")
        first = (2 * self.dim) // 5
        self.shapes = {"embedding": first, "layers": self.dim - first}

    def config_dict(self) -> dict[str, Any]:
        return {"dim": self.dim, "clip_norm": self.config.clip_norm}

    def init(self, rng: np.random.Generator) -> dict[str, Any]:
        return {"params": {k: (0.02 * rng.standard_normal(n)).astype(np.float32) for k, n in self.shapes.items()}}

    def broadcast(self, state: Mapping[str, Any], round: int) -> dict[str, Any]:
        return {"params": state["params"]}

    @staticmethod
    def norm(update: Update) -> float:
        """The update's global L2 norm."""
        return float(np.sqrt(sum(float(np.sum(np.square(a, dtype=np.float64))) for a in update.arrays.values())))

    def client_update(self, payload: Mapping[str, Any], client: Any, client_state: Any,
                      rng: np.random.Generator) -> tuple[Update, None]:
        delta = {k: rng.standard_normal(n, dtype=np.float32) for k, n in self.shapes.items()}
        raw = self.norm(Update(delta))
        scale = min(1.0, float(self.config.clip_norm) / raw)
        delta = {k: (v * np.float32(scale)).astype(np.float32) for k, v in delta.items()}
        return Update(delta, weight=1.0, metrics={"tokens": float(rng.integers(50, 500)),
                                                  "clipped": float(raw > self.config.clip_norm)}), None

    def server_update(self, state: Mapping[str, Any], acc: SumAccumulator | None, round: int,
                      rng: np.random.Generator) -> tuple[dict[str, Any], dict[str, float]]:
        if acc is None or acc.weight <= 0:
            return dict(state), {"clients": 0.0}
        mean = acc.mean()
        params = {k: (v + mean[k]).astype(np.float32) for k, v in state["params"].items()}
        return {"params": params}, {"clients": float(acc.count)}


# -- timing privasr's train handler on the nodes ----------------------------------------------------------------


@contextlib.contextmanager
def _timed_handler(sink: dict[tuple[str, int], float]) -> Iterator[None]:
    """Time privasr's train handler on the nodes (``(round, partition) -> seconds``) for a ``with`` block.

    The ClientApp's ``train`` function calls ``privasr.federated.backends.flower._node_train`` by name, so
    wrapping that module attribute times exactly the handler that ``secaggplus_mod`` wraps; it is restored
    after the block.
    """
    from privasr.federated.backends import flower

    inner = flower._node_train

    def timed(message: Any, context: Any, data_path: str, state_dir: str | None) -> Any:
        t0 = time.perf_counter()
        try:
            return inner(message, context, data_path, state_dir)
        finally:
            key = (str(message.metadata.group_id), int(context.node_config["partition-id"]))
            sink[key] = sink.get(key, 0.0) + time.perf_counter() - t0

    flower._node_train = timed
    try:
        yield
    finally:
        flower._node_train = inner


@contextlib.contextmanager
def _quiet_flower() -> Iterator[None]:
    """Flower logs every SecAgg+ stage at INFO, and a node that restarts the protocol after a round it dropped out
    of at WARNING: keep its logger at ERROR for a ``with`` block (the benchmark checks every round's outcome)."""
    logger = logging.getLogger("flwr")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


# -- one case ------------------------------------------------------------------------------------------------------


@dataclass
class _Round:
    """One round of one mode: wall seconds, the grid's exchanges, handler seconds, the sum, the stages."""

    wall: float
    exchanges: list[Any]
    handler: dict[int, float]
    acc: Any
    stages: dict[str, float]
    reported: int


def _grids(alg: Any, n: int, folder: Path) -> tuple[Any, Any, Any, Any]:
    """A plain and a secure grid, each with its GridBackend (the nodes discovered as the ServerApp does)."""
    from privasr.federated.backends.flower import GridBackend, discover_nodes, make_client_app
    from privasr.federated.backends.flower_inprocess import InProcessGrid

    # a fresh file name per case: the nodes load a pickled algorithm once per process, by path, so a name that
    # came back (``id()`` of a collected object) would hand a later case an earlier case's algorithm
    with tempfile.NamedTemporaryFile("wb", dir=folder, prefix=f"{alg.name}-", suffix=".pkl", delete=False) as f:
        pickle.dump((alg, list(range(n))), f, protocol=pickle.HIGHEST_PROTOCOL)
    path = Path(f.name)
    plain_grid = InProcessGrid(make_client_app(path), n, keep_messages=False)
    secure_grid = InProcessGrid(make_client_app(path, secure=True), n, keep_messages=False)
    plain = GridBackend(plain_grid, discover_nodes(plain_grid, n, wait=10.0, poll=0.01), poll=0.01)
    secure = GridBackend(secure_grid, discover_nodes(secure_grid, n, wait=10.0, poll=0.01), poll=0.01,
                         secagg=SecAggSettings(enabled=True))
    return plain_grid, plain, secure_grid, secure


def _plain_round(grid: Any, backend: Any, alg: Any, payload: Any, tasks: list[ClientTask],
                 handler: dict[tuple[str, int], float], drop: int) -> tuple[_Round, Any]:
    """A plain round (its sum over every client) and the plain sum without client ``drop``."""
    epoch, start = str(backend.epoch), len(grid.exchanges)
    t0 = time.perf_counter()
    updates: dict[int, Update] = {}
    acc = None
    for out in backend.run(alg, payload, tasks):
        if out.update is None:
            raise AssertionError(f"client {out.index} failed in a plain round: {out.error}")
        updates[out.index] = out.update
        acc = alg.accumulate(acc, out.update)
    wall = time.perf_counter() - t0
    survivors = None
    for i, u in sorted(updates.items()):
        if i != drop:
            survivors = alg.accumulate(survivors, u)
    return _Round(wall, grid.exchanges[start:], _handler_of(handler, epoch), acc, {}, len(updates)), survivors


def _secure_round(grid: Any, backend: Any, alg: Any, payload: Any, tasks: list[ClientTask],
                  handler: dict[tuple[str, int], float], crash: int | None = None) -> _Round:
    epoch, start = str(backend.epoch), len(grid.exchanges)
    grid.crash = set() if crash is None else {(epoch, crash)}
    t0 = time.perf_counter()
    outs, acc, clipped = backend.run_secure(alg, payload, tasks)
    wall = time.perf_counter() - t0
    grid.crash = set()
    failed = {o.index: o.error for o in outs if o.error is not None}
    expect = set() if crash is None else {crash}
    if set(failed) != expect or acc is None:
        raise AssertionError(f"secure round: clients {sorted(failed)} dropped ({failed}), expected "
                             f"{sorted(expect)}")
    if clipped:
        raise AssertionError(f"secure round: {clipped:g} values were clipped to the bound")
    stages = dict(backend.last_secure.stages_s)
    return _Round(wall, grid.exchanges[start:], _handler_of(handler, epoch), acc, stages, len(outs) - len(failed))


def _handler_of(handler: dict[tuple[str, int], float], epoch: str) -> dict[int, float]:
    return {part: s for (g, part), s in handler.items() if g == epoch}


def _max_error_steps(secure: Any, plain: Any, step: float) -> float:
    return max(float(np.max(np.abs(np.asarray(secure.arrays[k], dtype=np.float64)
                                   - np.asarray(plain.arrays[k], dtype=np.float64)))) / step
               for k in plain.arrays)


def _per_client(rnd: _Round) -> dict[str, Any]:
    """Bytes and seconds of one round per client (the nodes it sent messages to), in total and per stage."""
    train = [x for x in rnd.exchanges if x.message_type == "train"]
    n = len({x.partition for x in train})
    up: dict[str, float] = {}
    down: dict[str, float] = {}
    slowest: dict[str, float] = {}
    masking = 0.0
    for x in train:
        stage = _WIRE_STAGES.get(x.stage, "plain")
        up[stage] = up.get(stage, 0.0) + x.bytes_up / n
        down[stage] = down.get(stage, 0.0) + x.bytes_down / n
        slowest[stage] = max(slowest.get(stage, 0.0), x.node_s)
        if stage == "collect masked vectors" and not x.error:
            if x.partition not in rnd.handler:
                raise AssertionError("privasr's train handler was not timed on the node (is the ClientApp's "
                                     "train function still privasr.federated.backends.flower._node_train?)")
            masking += x.node_s - rnd.handler[x.partition]
    node_s = sum(x.node_s for x in train)
    server_s = rnd.wall - node_s
    return {"wall": rnd.wall, "upload": sum(up.values()), "download": sum(down.values()), "client_s": node_s / n,
            "server_s": server_s, "parallel_s": server_s + sum(slowest.values()), "masking_total_s": masking,
            "up_by_stage": up, "down_by_stage": down, "shares": _shares(rnd) if rnd.stages else {},
            "unmask_s": rnd.stages.get("unmask", 0.0)}


def _mean(rows: list[dict[str, Any]], key: str) -> float:
    return float(np.mean([r[key] for r in rows]))


def _mean_dict(rows: list[dict[str, float]]) -> dict[str, float]:
    return {k: float(np.mean([r.get(k, 0.0) for r in rows])) for k in rows[0]}


def _shares(rnd: _Round) -> dict[str, float]:
    shares = {s: rnd.stages.get(s, 0.0) / rnd.wall for s in STAGES}
    shares["decode"] = max(0.0, 1.0 - sum(shares.values()))
    return shares


def _case(kind: str, size: int, n: int, rounds: int, seed: int, folder: Path) -> dict[str, Any]:
    """Measure one case (see the module docstring)."""
    from privasr.federated.core import client_seed

    alg: Any = BenchFmp(size) if kind == "fmp" else BenchDelta(size)
    bits = SecAggSettings().quantization_bits
    step = 2.0 * alg.secure_bound(None) / 2 ** bits
    drop = n - 1
    handler: dict[tuple[str, int], float] = {}
    plain_grid, plain, secure_grid, secure = _grids(alg, n, folder)
    state = alg.init(np.random.default_rng([seed, 1]))
    rows: dict[str, list[dict[str, Any]]] = {"plain": [], "secure": [], "dropout": [], "survivors": []}
    errors: list[float] = []
    drop_errors: list[float] = []
    with _timed_handler(handler):
        for r in range(rounds + 1):  # round 0: warm-up, not reported
            payload = alg.broadcast(state, r)
            tasks = [ClientTask(i, i, None, None, client_seed(seed, r, i, i)) for i in range(n)]
            p, survivors_sum = _plain_round(plain_grid, plain, alg, payload, tasks, handler, drop)
            s = _secure_round(secure_grid, secure, alg, payload, tasks, handler)
            d = _secure_round(secure_grid, secure, alg, payload, tasks, handler, crash=drop)
            v = _secure_round(secure_grid, secure, alg, payload, tasks[:drop], handler)
            err, derr = _max_error_steps(s.acc, p.acc, step), _max_error_steps(d.acc, survivors_sum, step)
            if not (err <= n and derr <= n - 1):
                raise AssertionError(f"{kind} {size}: the unmasked sum is {err:.3g} quantisation steps from the "
                                     f"plain sum ({derr:.3g} with a dropout): more than one step per client")
            if (p.reported, s.reported, d.reported, v.reported) != (n, n, n - 1, n - 1):
                raise AssertionError(f"{kind} {size}: {p.reported}, {s.reported}, {d.reported} and {v.reported} "
                                     f"clients summed, expected {n}, {n}, {n - 1} and {n - 1}")
            state, _ = alg.server_update(state, p.acc, r, np.random.default_rng([seed, 2, r]))
            if r == 0:
                continue
            errors.append(err)
            drop_errors.append(derr)
            for mode, rnd in (("plain", p), ("secure", s), ("dropout", d), ("survivors", v)):
                rows[mode].append(_per_client(rnd))
    pl, se, dr, sv = rows["plain"], rows["secure"], rows["dropout"], rows["survivors"]
    m: dict[str, Any] = {
        "kind": kind, "size": size, "clients": n, "rounds": rounds,
        "plain_round_s": _mean(pl, "wall"), "secure_round_s": _mean(se, "wall"),
        "plain_round_parallel_s": _mean(pl, "parallel_s"), "secure_round_parallel_s": _mean(se, "parallel_s"),
        "plain_upload_bytes": _mean(pl, "upload"), "secure_upload_bytes": _mean(se, "upload"),
        "plain_download_bytes": _mean(pl, "download"), "secure_download_bytes": _mean(se, "download"),
        "plain_client_s": _mean(pl, "client_s"), "secure_client_s": _mean(se, "client_s"),
        "plain_server_s": _mean(pl, "server_s"), "secure_server_s": _mean(se, "server_s"),
        "client_masking_s": _mean(se, "masking_total_s") / n,
        "client_masking_share": float(np.mean([r["masking_total_s"] / r["wall"] for r in se])),
        "stage_share": _mean_dict([r["shares"] for r in se]),
        "secure_upload_by_stage": _mean_dict([r["up_by_stage"] for r in se]),
        "secure_download_by_stage": _mean_dict([r["down_by_stage"] for r in se]),
        "max_error_steps": max(errors), "error_bound_steps": n,
        "dropout_round_s": _mean(dr, "wall"), "survivors_round_s": _mean(sv, "wall"),
        "dropout_server_s": _mean(dr, "server_s"), "survivors_server_s": _mean(sv, "server_s"),
        "dropout_unmask_s": _mean(dr, "unmask_s"), "survivors_unmask_s": _mean(sv, "unmask_s"),
        "dropout_upload_bytes": _mean(dr, "upload"), "survivors_upload_bytes": _mean(sv, "upload"),
        "dropout_stage_share": _mean_dict([r["shares"] for r in dr]),
        "dropout_max_error_steps": max(drop_errors), "dropout_survivors": n - 1,
    }
    for what in ("time", "upload", "download", "client_time", "server_time", "time_parallel"):
        key = {"time": "round_s", "upload": "upload_bytes", "download": "download_bytes",
               "client_time": "client_s", "server_time": "server_s", "time_parallel": "round_parallel_s"}[what]
        m[f"secure_vs_plain_{what}"] = m[f"secure_{key}"] / m[f"plain_{key}"]
    m["dropout_vs_survivors_time"] = m["dropout_round_s"] / m["survivors_round_s"]
    m["dropout_vs_survivors_server_time"] = m["dropout_server_s"] / m["survivors_server_s"]
    m["dropout_vs_survivors_unmask"] = m["dropout_unmask_s"] / m["survivors_unmask_s"]
    m["dropout_vs_secure_time"] = m["dropout_round_s"] / m["secure_round_s"]
    return m


# -- the benchmark -------------------------------------------------------------------------------------------------


def run(out: Path, quick: bool = False, seed: int = 0, clients: int | None = None) -> dict[str, Any]:
    """Measure, write ``out/results.json`` and ``out/report.md``; return the metrics.

    Args:
        out: the output folder.
        quick: smaller cases (:data:`QUICK_CASES`), 4 clients, 1 timed round.
        seed: the seed of the clients' updates.
        clients: the number of clients (default 8; ``--quick`` 4); at least 4, so that one may drop out.

    Raises:
        ConfigError: fewer than 4 clients.
        AssertionError: a secure sum off the plain one by more than one quantisation step per client, or a
            round that did not sum the clients it should have.
    """
    from privasr.bench import device_name
    from privasr.federated.backends.flower_inprocess import task_identity

    n = int(clients) if clients is not None else (4 if quick else 8)
    if n < 4:
        raise ConfigError(f"--clients {n}", expected="at least 4 (SecAgg+'s minimum cohort is 3, and one client "
                                                     "drops out in the dropout round)")
    rounds = 1 if quick else 3
    cases = QUICK_CASES if quick else CASES
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    metrics: dict[str, Any] = {"cpu_count": os.cpu_count(), "cpu": device_name("cpu"), "load_average": load,
                               "clients": n, "rounds": rounds, "cases": {}}
    with tempfile.TemporaryDirectory(prefix="privasr-bench-secagg-") as tmp, task_identity(), _quiet_flower():
        for name, (kind, size) in cases.items():
            metrics["cases"][name] = _case(kind, size, n, rounds, seed, Path(tmp))
    metrics["max_error_steps"] = max(c["max_error_steps"] for c in metrics["cases"].values())
    metrics["error_within_bound"] = True  # _case raises otherwise
    settings = SecAggSettings(enabled=True)
    write_results(out, config={"benchmark": "secagg", "quick": quick, "clients": n, "rounds": rounds,
                               "cases": {k: {"kind": v[0], "size": v[1]} for k, v in cases.items()},
                               "fmp_words": WORDS, "fedlm_clip_norm": CLIP_NORM, "secagg": settings.to_dict(),
                               "scalar_bound": SCALAR_BOUND},
                  seed=seed, metrics=metrics)
    (Path(out) / "report.md").write_text(report(metrics), encoding="utf-8")
    return metrics


def _size(n: float) -> str:
    """Bytes in words: ``1.5 MB``, ``12.0 kB``, ``300 B``.

    >>> _size(1_500_000), _size(12_000), _size(300)
    ('1.50 MB', '12.0 kB', '300 B')
    """
    if n >= 1e6:
        return f"{n / 1e6:.2f} MB"
    if n >= 1e3:
        return f"{n / 1e3:.1f} kB"
    return f"{n:.0f} B"


def report(metrics: Mapping[str, Any]) -> str:
    """``report.md``: the cost per round, where the secure round's time goes, and what a dropout adds.

    >>> case = {"plain_round_s": 0.1, "secure_round_s": 0.2, "secure_vs_plain_time": 2.0,
    ...         "secure_vs_plain_time_parallel": 1.5, "plain_upload_bytes": 10.0, "secure_upload_bytes": 100.0,
    ...         "secure_vs_plain_upload": 10.0, "plain_download_bytes": 50.0, "secure_download_bytes": 60.0,
    ...         "secure_vs_plain_download": 1.2, "plain_client_s": 0.01, "secure_client_s": 0.02,
    ...         "client_masking_s": 0.005, "plain_server_s": 0.05, "secure_server_s": 0.1, "max_error_steps": 0.9,
    ...         "stage_share": dict.fromkeys([*STAGES, "decode"], 0.2), "client_masking_share": 0.3,
    ...         "survivors_round_s": 0.15, "dropout_round_s": 0.18, "dropout_vs_survivors_time": 1.2,
    ...         "survivors_unmask_s": 0.01, "dropout_unmask_s": 0.03, "dropout_vs_survivors_unmask": 3.0,
    ...         "dropout_vs_survivors_server_time": 1.1, "dropout_max_error_steps": 0.8}
    >>> text = report({"cpu_count": 2, "cpu": "x", "load_average": 1.0, "clients": 4, "rounds": 1,
    ...                "cases": {"fmp_2k": case}})
    >>> "| fmp_2k | 0.100 | 0.200 | 2.00 | 1.50 |" in text
    True
    """
    load = metrics.get("load_average")
    lines = [
        "# Secure aggregation (SecAgg+) vs plain aggregation",
        "",
        f"{metrics['clients']} clients sampled every round, {metrics['rounds']} timed round(s) after a warm-up, "
        f"in one process: the nodes run one after the other, so a round's time includes every node's work "
        f"(\"nodes in parallel\": the server's time plus the slowest node of each stage). "
        f"{metrics['cpu_count']} CPUs ({metrics['cpu']})"
        + (f", load average {load:.2f} at the start." if load is not None else "."),
        "",
        "Per round; bytes and client seconds per client:",
        "",
        "| case | plain s | secure s | secure / plain | secure / plain, nodes in parallel | upload plain | "
        "upload secure | ratio | download plain | download secure | ratio | client s plain | client s secure "
        "(masking) | server s plain | server s secure | error (steps) |",
        "|---|" + "---|" * 15,
    ]
    for name, c in metrics["cases"].items():
        lines.append(
            f"| {name} | {c['plain_round_s']:.3f} | {c['secure_round_s']:.3f} | {c['secure_vs_plain_time']:.2f} | "
            f"{c['secure_vs_plain_time_parallel']:.2f} | {_size(c['plain_upload_bytes'])} | "
            f"{_size(c['secure_upload_bytes'])} | {c['secure_vs_plain_upload']:.1f} | "
            f"{_size(c['plain_download_bytes'])} | {_size(c['secure_download_bytes'])} | "
            f"{c['secure_vs_plain_download']:.2f} | {c['plain_client_s']:.4f} | "
            f"{c['secure_client_s']:.4f} ({c['client_masking_s']:.4f}) | {c['plain_server_s']:.3f} | "
            f"{c['secure_server_s']:.3f} | {c['max_error_steps']:.2f} |")
    lines += ["", "Share of the secure round's time per stage, and the clients' masking in all:", "",
              "| case | " + " | ".join(STAGES) + " | decode | client masking |",
              "|---|" + "---|" * (len(STAGES) + 2)]
    for name, c in metrics["cases"].items():
        cells = [f"{c['stage_share'][k]:.2f}" for k in (*STAGES, "decode")]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {c['client_masking_share']:.2f} |")
    lines += ["", "One client going offline after the key exchange, against a secure round of the same survivors "
                  "without a dropout:", "",
              "| case | survivors s | with the dropout s | ratio | unmask s survivors | with the dropout | ratio | "
              "server time ratio | error (steps) |",
              "|---|" + "---|" * 8]
    for name, c in metrics["cases"].items():
        lines.append(
            f"| {name} | {c['survivors_round_s']:.3f} | {c['dropout_round_s']:.3f} | "
            f"{c['dropout_vs_survivors_time']:.2f} | {c['survivors_unmask_s']:.3f} | {c['dropout_unmask_s']:.3f} | "
            f"{c['dropout_vs_survivors_unmask']:.2f} | {c['dropout_vs_survivors_server_time']:.2f} | "
            f"{c['dropout_max_error_steps']:.2f} |")
    lines.append("")
    return "\n".join(lines)
