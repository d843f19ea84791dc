r"""Federated transfer learning of an acoustic model (paper 002, sections 3.1-3.3).

A pool of clients holds fixed data: each :class:`FtlClient` keeps its utterances (model inputs and output-unit
ids, :class:`~privasr.asr.train.Example`). In round ``t`` the server broadcasts the parameters ``w_s``; every
sampled client (the loop samples ``N << K`` clients with replacement, paper 3.1) trains a copy with its **client
optimiser** for ``local_epochs`` passes (or ``local_steps`` steps) over its data and uploads
``Delta_j = w_j - w_s`` (eq. 7's pseudo-gradient, with the sign of
:mod:`~privasr.federated.server_opt`).

**Hierarchical optimisation (3.2).** Two optimisers: the client's (``client_optimizer``; stateless SGD by
default, as the paper: a client's optimiser state would not survive between rounds on a device; ``adam``
starts from a fresh state every round) and the server's, a
:func:`~privasr.federated.server_opt.make_server_optimizer` spec applied to the averaged pseudo-gradient (Adam by
default; ``"fedavg"`` -- SGD with learning rate 1 -- is the single-optimiser baseline: the new model is the
weighted average of the client models).

**Weighting (3.3).** The average is weighted by the clients' target units (``weighting="count"``), uniformly,
or by a softmax of the negative client training losses with ``temperature`` (``"softmax"``:
``w_j = exp(-L_j / T) / sum_i exp(-L_i / T)``, ``L_j`` the client's mean per-unit training loss of the round).
Softmax weights are folded in streaming with log-weights (:class:`~privasr.federated.weighting.WeightedMean`),
so nothing overflows and the server keeps one running copy of the model whatever the number of clients.

**Server replay (3.2, eq. 9).** After every aggregation the server takes ``replay_steps`` SGD steps
(``replay_lr``, batches of ``replay_batch_size``) on held-out data of its own (``replay``: e.g. the data the
seed model was trained on), which keeps the global model from drifting to the clients' distribution.

What leaves a client: float32 parameter deltas (or, with ``compression``, their encoded form:
:mod:`privasr.federated.compression`), the weight (its number of target units) and the numeric metrics ``loss``
and ``units``; no features, no transcripts. A delta is a function of both, and FTL has no
differential privacy (docs/privacy.md).

>>> import numpy as np
>>> from privasr.asr.models import AcousticConfig
>>> from privasr.asr.train import Example
>>> from privasr.asr.units import CharTokenizer
>>> tok = CharTokenizer.train([("AB",), ("BA",)])
>>> rng = np.random.default_rng(0)
>>> ex = tuple(Example(f"u{i}", "s", w, rng.normal(size=(6, 4)).astype(np.float32), tuple(tok.encode(w)))
...            for i, w in enumerate([("AB",), ("BA",)]))
>>> alg = FtlAlgorithm(FtlConfig(weighting="softmax", server="fedavg"),
...                    AcousticConfig.preset("tiny", arch="ctc", input_dim=4), tok)
>>> state = alg.init(np.random.default_rng(0))
>>> upd, _ = alg.client_update(alg.broadcast(state, 0), FtlClient("c1", ex), None, np.random.default_rng(1))
>>> upd.weight, upd.metrics["units"], sorted(upd.arrays) == sorted(state["params"])
(4.0, 4.0, True)
>>> new, m = alg.server_update(state, alg.accumulate(None, upd), 0, np.random.default_rng(2))
>>> m["clients"], bool(m["update_norm"] > 0)
(1.0, True)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import torch

from privasr.asr.models import AcousticConfig, AcousticModel, build_model
from privasr.asr.train import Example, evaluate_loss, spec_augment_stacked, train
from privasr.asr.units import Tokenizer
from privasr.errors import ConfigError, InputError
from privasr.federated.algorithms._config import TorchModelAlgorithm, config_from_dict, is_int, is_real
from privasr.federated.compression import CompressionSettings, check_no_secagg
from privasr.federated.core import SumAccumulator, Update
from privasr.federated.secagg import SCALAR_BOUND, Summand, summand_of
from privasr.federated.server_opt import make_server_optimizer
from privasr.federated.weighting import WEIGHT_KINDS, WeightedMean
from privasr.privacy.dp.clip import clip_float32, global_norm

__all__ = ["FtlClient", "FtlConfig", "FtlAlgorithm", "CLIENT_OPTIMIZERS", "SoftmaxAccumulator"]

CLIENT_OPTIMIZERS = ("sgd", "adam")
"""Client optimisers: plain (momentum) SGD, or Adam started afresh every round."""


@dataclass(frozen=True)
class FtlClient:
    """One client's fixed data: its utterances as model inputs with unit ids (never sent anywhere).

    Raises:
        InputError: no examples, or an example with no frames or no units.
    """

    id: str
    examples: tuple[Example, ...]

    def __post_init__(self) -> None:
        ex = tuple(self.examples)
        if not ex:
            raise InputError(f"client {self.id!r} has no utterances", expected="at least one")
        for e in ex:
            if not isinstance(e, Example):
                raise InputError(f"client {self.id!r}: an example is a {type(e).__name__}", expected="an Example")
            if e.num_frames < 1 or not e.units:
                raise InputError(f"client {self.id!r}, utterance {e.utt_id!r} has {e.num_frames} frames and "
                                 f"{len(e.units)} units", expected="at least one of each")
        object.__setattr__(self, "examples", ex)

    def __len__(self) -> int:
        return len(self.examples)


def _optimizer_spec(spec: Any, default: dict[str, Any], what: str, names: Sequence[str]) -> dict[str, Any]:
    if spec is None:
        return dict(default)
    if isinstance(spec, str):
        spec = {"name": spec}
    if not isinstance(spec, Mapping) or "name" not in spec:
        raise ConfigError(f"{what}={spec!r}", expected="an optimiser name or a mapping with 'name'")
    spec = dict(spec)
    if spec["name"] not in names:
        raise ConfigError(f"{what} name {spec['name']!r}", expected=f"one of {list(names)}")
    return spec


@dataclass(frozen=True)
class FtlConfig:
    """Hyper-parameters of federated acoustic training (see the module docstring).

    Attributes:
        local_epochs: passes over the client's data per round (when ``local_steps`` is 0).
        local_steps: if > 0, exactly this many client steps per round instead.
        batch_size: utterances per client batch.
        client_optimizer: ``{"name": "sgd", "lr": 0.1, "momentum": 0.0}`` (default) or ``{"name": "adam",
            "lr": 0.001}``.
        clip_norm: gradient-norm clipping of every local step (``None``: off); training stability, not DP.
        weighting: ``"count"`` (target units), ``"uniform"`` or ``"softmax"``.
        temperature: the softmax temperature ``T > 0``.
        server: a server optimiser spec (default ``{"name": "adam", "lr": 0.001}``; ``"fedavg"``, ``"lamb"``,
            ...).
        replay_steps: server replay steps after each aggregation (0: off).
        replay_lr: the replay SGD learning rate.
        replay_batch_size: utterances per replay batch.
        spec_augment: SpecAugment (2 frequency and 2 time masks, :func:`~privasr.asr.train.spec_augment_stacked`)
            on the client's utterances in local training, a fresh mask every time an utterance is seen.
        compression: how the client compresses its delta (``None``/``"none"``, or a
            :class:`~privasr.federated.compression.CompressionSettings` mapping such as ``{kind: topk, fraction:
            0.1}``); the server decodes every update before weighting it. Not with secure aggregation.
        delta_clip: ``None`` or ``C > 0``: the L2 bound of a client's whole delta (DP-FedAvg, as fedlm's
            ``clip_norm``), the sensitivity the Gaussian mechanism of a DP run is calibrated to; needs
            ``weighting="uniform"`` (a weighted sum has no bound).

    >>> FtlConfig(delta_clip=1.0)
    Traceback (most recent call last):
    ...
    privasr.errors.ConfigError: delta_clip=1.0 with weighting='count' (expected weighting='uniform': the noise is calibrated to a sum of clipped, unweighted deltas)
    >>> FtlConfig(weighting="softmax", temperature=0)
    Traceback (most recent call last):
    ...
    privasr.errors.ConfigError: temperature=0 (expected a finite number > 0)
    >>> FtlConfig.from_dict(FtlConfig().to_dict()).client_optimizer
    {'name': 'sgd', 'lr': 0.1, 'momentum': 0.0}
    """

    local_epochs: int = 1
    local_steps: int = 0
    batch_size: int = 8
    client_optimizer: Any = None
    clip_norm: float | None = 5.0
    weighting: str = "count"
    temperature: float = 1.0
    server: Any = None
    replay_steps: int = 0
    replay_lr: float = 0.1
    replay_batch_size: int = 8
    spec_augment: bool = False
    compression: Any = None
    delta_clip: float | None = None

    def __post_init__(self) -> None:
        for name, lo in (("local_epochs", 1), ("local_steps", 0), ("batch_size", 1), ("replay_steps", 0),
                         ("replay_batch_size", 1)):
            v = getattr(self, name)
            if not is_int(v) or v < lo:
                raise ConfigError(f"{name}={v!r}", expected=f"an integer >= {lo}")
            object.__setattr__(self, name, int(v))
        for name in ("temperature", "replay_lr"):
            v = getattr(self, name)
            if not is_real(v) or v <= 0:
                raise ConfigError(f"{name}={v!r}", expected="a finite number > 0")
            object.__setattr__(self, name, float(v))
        if self.clip_norm is not None:
            if not is_real(self.clip_norm) or self.clip_norm <= 0:
                raise ConfigError(f"clip_norm={self.clip_norm!r}", expected="None or a finite number > 0")
            object.__setattr__(self, "clip_norm", float(self.clip_norm))
        if not isinstance(self.spec_augment, bool):
            raise ConfigError(f"spec_augment={self.spec_augment!r}", expected="true or false")
        if self.weighting not in WEIGHT_KINDS:
            raise ConfigError(f"weighting={self.weighting!r}", expected=f"one of {list(WEIGHT_KINDS)}")
        if self.delta_clip is not None:
            if not is_real(self.delta_clip) or self.delta_clip <= 0:
                raise ConfigError(f"delta_clip={self.delta_clip!r}", expected="None or a finite number > 0")
            object.__setattr__(self, "delta_clip", float(self.delta_clip))
            if self.weighting != "uniform":
                raise ConfigError(f"delta_clip={self.delta_clip!r} with weighting={self.weighting!r}",
                                  expected="weighting='uniform': the noise is calibrated to a sum of clipped, "
                                           "unweighted deltas")
        opt = _optimizer_spec(self.client_optimizer, {"name": "sgd", "lr": 0.1, "momentum": 0.0},
                              "client_optimizer", CLIENT_OPTIMIZERS)
        lr = opt.get("lr", 0.1 if opt["name"] == "sgd" else 0.001)
        if not is_real(lr) or lr <= 0:
            raise ConfigError(f"client_optimizer lr={lr!r}", expected="a finite number > 0")
        opt["lr"] = float(lr)
        extra = set(opt) - ({"name", "lr", "momentum"} if opt["name"] == "sgd" else {"name", "lr"})
        if extra:
            raise ConfigError(f"client_optimizer {opt['name']!r} has unknown setting(s) {sorted(extra)}")
        if opt["name"] == "sgd":
            mom = opt.get("momentum", 0.0)
            if not is_real(mom) or not 0 <= mom < 1:
                raise ConfigError(f"client_optimizer momentum={mom!r}", expected="a number in [0, 1)")
            opt["momentum"] = float(mom)
        object.__setattr__(self, "client_optimizer", opt)
        spec = self.server if self.server is not None else {"name": "adam", "lr": 0.001}
        spec = {"name": spec} if isinstance(spec, str) else spec
        if not isinstance(spec, Mapping):
            raise ConfigError(f"server={spec!r}", expected="a server optimiser name or a mapping with 'name'")
        make_server_optimizer(dict(spec))  # validates
        object.__setattr__(self, "server", dict(spec))
        object.__setattr__(self, "compression", CompressionSettings.of(self.compression))

    def to_dict(self) -> dict[str, Any]:
        """The configuration as a plain dict (read back by :meth:`from_dict`; ``compression`` only when on, so
        runs without it keep their checkpoint keys)."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["client_optimizer"] = dict(self.client_optimizer)
        d["server"] = dict(self.server)
        if self.compression.enabled:
            d["compression"] = self.compression.to_dict()
        else:
            del d["compression"]
        if self.delta_clip is None:  # runs without it keep their checkpoint keys
            del d["delta_clip"]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> FtlConfig:
        """A config from a dict; missing keys take their defaults (unknown keys: :class:`ConfigError`)."""
        return config_from_dict(cls, d, "FTL")


@dataclass
class SoftmaxAccumulator:
    """The streaming softmax-weighted sum of one round: a :class:`~privasr.federated.weighting.WeightedMean`
    of the deltas with log-weights ``-L_j / T``, plus the summed metrics and the client count."""

    mean: WeightedMean = field(default_factory=WeightedMean)
    count: int = 0
    metrics: dict[str, float] = field(default_factory=dict)


class FtlAlgorithm(TorchModelAlgorithm):
    """Federated acoustic-model training as a :class:`~privasr.federated.core.FederatedAlgorithm`.

    Server state: ``{"params": {name: float32 array}, "opt": server optimiser state}``; payload: the
    parameters; update: ``{name: float32 delta}`` with ``weight`` = the client's target units and metrics
    ``loss`` (mean per-unit training loss of the round) and ``units``. No client state.

    Args:
        config: the hyper-parameters.
        model_config: the acoustic model (``vocab_size`` 0 takes the tokenizer's).
        tokenizer: the output units.
        init_state: parameters to start from (a seed model), or ``None`` for a fresh model seeded by ``init``.
        replay: the server's held-out examples for replay (needed when ``config.replay_steps > 0``).
        device: where clients and replay train (``"cpu"``, ``"cuda"``).

    Raises:
        ConfigError: bad settings; replay steps without replay data.
        InputError: ``init_state`` does not fit the model.
    """

    name = "ftl"
    dp_metrics = ("update_norm", "replay_loss")
    """The server metrics of a DP round: functions of the release (and of the server's own replay data)."""
    dp_unit = "client"
    """The unit of the DP guarantee: one client (its clipped delta)."""

    def __init__(self, config: FtlConfig, model_config: AcousticConfig, tokenizer: Tokenizer,
                 init_state: Mapping[str, np.ndarray] | None = None, replay: Sequence[Example] | None = None,
                 device: str = "cpu") -> None:
        if not isinstance(config, FtlConfig):
            raise ConfigError(f"FTL config is a {type(config).__name__}", expected="an FtlConfig")
        if not isinstance(model_config, AcousticConfig):
            raise ConfigError(f"model config is a {type(model_config).__name__}", expected="an AcousticConfig")
        if model_config.vocab_size == 0:
            model_config = model_config.replace(vocab_size=tokenizer.vocab_size)
        self.config = config
        self.model_config = model_config
        self.tokenizer = tokenizer
        self.device = str(device)
        self.optimizer = make_server_optimizer(config.server)
        self.replay = tuple(replay or ())
        if config.replay_steps and not self.replay:
            raise ConfigError(f"replay_steps={config.replay_steps} but the server has no replay data",
                              expected="replay examples, or replay_steps: 0")
        self.init_state: dict[str, np.ndarray] | None = None
        if init_state is not None:
            self.init_state = self._check_params(init_state, "init_state")

    def config_dict(self) -> dict[str, Any]:
        """The configuration (part of the loop's checkpoint key)."""
        return {**self.config.to_dict(), "model": self.model_config.to_dict(), "units": self.tokenizer.vocab_size,
                "seeded": self.init_state is not None, "replay_utterances": len(self.replay)}

    # -- model plumbing -------------------------------------------------------------------------------------

    def _build_model(self) -> AcousticModel:
        return build_model(self.model_config, self.tokenizer, seed=0).to(self.device)

    def _train(self, params: Mapping[str, np.ndarray], examples: Sequence[Example], optimizer: Mapping[str, Any],
               epochs: int, steps: int, batch_size: int, seed: int,
               augment: bool = False) -> tuple[dict[str, np.ndarray], float, int]:
        model = self.load(params)
        if optimizer["name"] == "adam":
            opt: torch.optim.Optimizer = torch.optim.Adam(model.parameters(), lr=optimizer["lr"])
        else:
            opt = torch.optim.SGD(model.parameters(), lr=optimizer["lr"], momentum=optimizer.get("momentum", 0.0))
        log = train(model, opt, examples, steps=steps or None, epochs=None if steps else epochs,
                    batch_size=batch_size, seed=seed, clip_norm=self.config.clip_norm,
                    augment=spec_augment_stacked if augment else None)
        model.eval()
        units = log.units
        loss = float(np.mean(log.losses)) if log.losses else 0.0
        if not math.isfinite(loss):
            raise InputError(f"the training loss became {loss}", expected="a smaller client learning rate")
        return self.params_of(model), loss, units

    # -- server ---------------------------------------------------------------------------------------------

    def init(self, rng: np.random.Generator) -> dict[str, Any]:
        """``{"params", "opt"}``: the seed model's parameters, or a fresh model seeded from ``rng``."""
        if self.init_state is not None:
            params = {k: v.copy() for k, v in self.init_state.items()}
        else:
            params = self.params_of(build_model(self.model_config, self.tokenizer, seed=int(rng.integers(2 ** 31))))
        return {"params": params, "opt": self.optimizer.init(params)}

    def accumulate(self, acc: SumAccumulator | SoftmaxAccumulator | None,
                   update: Update) -> SumAccumulator | SoftmaxAccumulator:
        """Count/uniform weighting: ``acc + w_j delta_j``; softmax: fold ``delta_j`` with log-weight
        ``-L_j / T`` into a running weighted mean. One running copy of the model either way. A compressed update
        is decoded first."""
        update = self.decoded(update)
        if self.config.weighting != "softmax":
            acc = SumAccumulator.empty() if acc is None else acc
            assert isinstance(acc, SumAccumulator)
            return acc.add(update, scale=update.weight if self.config.weighting == "count" else 1.0)
        acc = SoftmaxAccumulator() if acc is None else acc
        assert isinstance(acc, SoftmaxAccumulator)
        acc.mean.add(update.arrays, -float(update.metrics["loss"]) / self.config.temperature)
        acc.count += 1
        for k, v in update.metrics.items():
            acc.metrics[k] = acc.metrics.get(k, 0.0) + float(v)
        return acc

    def secure_bound(self, bound: float | None) -> float:
        """The bound of every coordinate of a client's weighted delta under secure aggregation: FTL's deltas
        have no natural one, so ``federated.secagg.bound`` must be set."""
        check_no_secagg(self.config.compression, "ftl")
        if bound is None:
            raise ConfigError("secure aggregation of FTL deltas without federated.secagg.bound",
                              expected="a bound on every coordinate of a client's (weighted) delta")
        return float(bound)

    def secure_summand(self, update: Update, bound: float | None) -> Summand:
        """``w * delta`` with the weight ``w`` (target units, 1, or ``exp(-loss / T)`` for softmax weighting,
        computed on the client) and the loss and unit counts as scalars."""
        b = self.secure_bound(bound)
        loss = float(update.metrics.get("loss", 0.0))
        w, w_bound = {"count": (float(update.weight), SCALAR_BOUND), "uniform": (1.0, 1.0),
                      "softmax": (math.exp(-max(loss, 0.0) / self.config.temperature), 1.0)}[self.config.weighting]
        arrays = {k: w * np.asarray(v, dtype=np.float64) for k, v in update.arrays.items()}
        metrics = {"loss": (loss, 1024.0), "units": (float(update.metrics.get("units", 0.0)), SCALAR_BOUND)}
        return summand_of(arrays, b, weight=(w, w_bound), metrics=metrics)

    def from_secure_sum(self, arrays: Mapping[str, np.ndarray], scalars: Mapping[str, float],
                        count: int) -> SumAccumulator:
        """A :class:`~privasr.federated.core.SumAccumulator` of the weighted deltas (softmax weighting too)."""
        return SumAccumulator(dict(arrays), float(scalars.get("weight", 0.0)), int(count),
                              {k: float(scalars.get(k, 0.0)) for k in ("loss", "units")})

    def dp_bound(self) -> tuple[str, float]:
        """``("l2", delta_clip)``: one client moves the (unweighted) sum of deltas by at most ``delta_clip``.

        Raises:
            ConfigError: without ``delta_clip`` (``clip_norm`` clips each local step's gradient, not the delta).
        """
        if self.config.delta_clip is None:
            raise ConfigError("differential privacy for FTL without delta_clip",
                              expected="delta_clip set (and weighting: uniform): clip_norm bounds each local "
                                       "step's gradient, not what a client sends")
        return "l2", float(self.config.delta_clip)

    def server_update(self, state: Mapping[str, Any], acc: SumAccumulator | SoftmaxAccumulator | None, round: int,
                      rng: np.random.Generator) -> tuple[dict[str, Any], dict[str, float]]:
        """The weighted mean of the deltas, one server optimiser step, then ``replay_steps`` replay steps.

        A DP release (``acc.is_release``: noised, ``weight`` the loop's data-independent denominator, no count or
        metrics) is divided by its weight whatever the weighting said, and publishes no loss or unit count.
        """
        params = state["params"]
        release = isinstance(acc, SumAccumulator) and acc.is_release
        count = 0 if acc is None else acc.count
        metrics: dict[str, float] = {} if release else {"clients": float(count)}
        if acc is None or (count == 0 and not release):
            return {"params": dict(params), "opt": state["opt"]}, {**metrics, "update_norm": 0.0}
        if not release:
            metrics["loss"] = acc.metrics.get("loss", 0.0) / count
            metrics["units"] = acc.metrics.get("units", 0.0)
        if release:
            assert isinstance(acc, SumAccumulator)
            delta = acc.mean()
        elif isinstance(acc, SoftmaxAccumulator):
            delta = acc.mean.result()
        else:
            if acc.weight <= 0:
                return {"params": dict(params), "opt": state["opt"]}, {**metrics, "update_norm": 0.0}
            # uniform: the plain sum / count; count (and softmax under secure aggregation): weighted mean
            delta = {k: v / count for k, v in acc.arrays.items()} if self.config.weighting == "uniform" \
                else acc.mean()
        metrics["update_norm"] = global_norm(delta)
        new, opt = self.optimizer.step(params, delta, state["opt"])
        new = {k: np.asarray(v, dtype=np.float32) for k, v in new.items()}
        if self.config.replay_steps:
            new, loss, _ = self._train(new, self.replay, {"name": "sgd", "lr": self.config.replay_lr}, 1,
                                       self.config.replay_steps, self.config.replay_batch_size,
                                       int(rng.integers(2 ** 31)))
            metrics["replay_loss"] = loss
        return {"params": new, "opt": opt}, metrics

    # -- client ---------------------------------------------------------------------------------------------

    def client_update(self, payload: Mapping[str, np.ndarray], client: FtlClient, client_state: Any,
                      rng: np.random.Generator) -> tuple[Update, Any]:
        """Train from the broadcast parameters with the client optimiser; send ``w_j - w_s`` (compressed with
        ``compression``; the client state is ``None``, or ``{"residual": ...}`` with error feedback, kept on
        the device)."""
        if not isinstance(client, FtlClient):
            raise InputError(f"client is a {type(client).__name__}", expected="an FtlClient")
        start = self._check_params(payload, "the broadcast parameters")
        c = self.config
        trained, loss, units = self._train(start, client.examples, c.client_optimizer, c.local_epochs,
                                           c.local_steps, c.batch_size, int(rng.integers(2 ** 31)), c.spec_augment)
        delta = {k: trained[k] - start[k] for k in start}
        metrics = {"loss": loss, "units": float(units)}
        if c.delta_clip is not None:
            delta, clipped = clip_float32(delta, c.delta_clip)
            metrics["clipped"] = float(clipped)
        return self.encoded(delta, float(units), metrics, client_state, rng, c.delta_clip)

    # -- evaluation -----------------------------------------------------------------------------------------

    def loss(self, params: Mapping[str, np.ndarray], examples: Sequence[Example]) -> float:
        """The per-unit loss of ``examples`` under ``params`` (evaluation mode)."""
        return evaluate_loss(self.load(self._check_params(params, "params")), examples)[0]
