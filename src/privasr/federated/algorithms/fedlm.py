r"""Federated fine-tuning of a neural LM with confidence-weighted losses (paper 001, sections 2.1-2.4).

Each client holds its own first-pass transcripts as word-id sequences (ids into the model's
:class:`~privasr.lm.neural.vocab.Vocabulary`), optionally with a confidence ``c_{j,s}`` in ``[0, 1]`` for every
word ``s`` of utterance ``j`` (:class:`FedLmClient`). In round ``t`` the server broadcasts the parameters
``theta_t``; every sampled client runs ``K = local_epochs`` epochs of plain mini-batch SGD (learning rate
``eta_l = client_lr``) from ``theta_t`` on its utterances and uploads ``Delta_i = theta_i - theta_t``. With
``grad_clip = G`` every mini-batch gradient is scaled to L2 norm ``<= G`` before its step
(``torch.nn.utils.clip_grad_norm_``, as centralised LM training does): SGD at ``eta_l = 1`` on a Transformer
takes steps as long as its gradient, and a rare steep batch could otherwise throw a client's model to NaN. This
bounds each local step, not the client's delta (that is ``clip_norm``, below), and is no privacy mechanism.

**Targets and weights (eqs. 2-5).** Utterance ``j`` of words ``w_1 .. w_n`` is trained as
``<s> w_1 .. w_n </s>``: the ``T_j = n + 1`` targets are ``w_1 .. w_n, </s>`` (cut into windows of at most
``max_len`` targets like :func:`~privasr.lm.neural.train.encode_sentences`). The utterance confidence is the
mean word confidence ``c_j = (1/n) sum_s c_{j,s}`` (eq. 3; no confidences given: every ``c_{j,s} = 1``). Target
``s`` gets a weight ``a_{j,s}``:

* ``loss="all"`` (eq. 2): ``a_{j,s} = 1``;
* ``loss="threshold"`` (hard thresholding): ``a_{j,s} = 1`` if ``c_j >= threshold`` else ``0`` (the utterance
  is dropped);
* ``loss="utterance"`` (eq. 4): ``a_{j,s} = c_j``;
* ``loss="token"`` (eq. 5): ``a_{j,s} = c_{j,s}`` for the words; the ``</s>`` target, which has no confidence
  of its own, takes the utterance confidence ``c_j``.

The loss of a mini-batch ``B`` is the weighted mean cross-entropy, **normalised by the sum of the weights**::

    L_B(theta) = - sum_{(j,s) in B} a_{j,s} log p_theta(v*_{j,s} | history) / sum_{(j,s) in B} a_{j,s}

This differs from the paper's eqs. 2-5, which average ``1/T_j`` within each utterance and then ``1/n_b`` over
the batch: here every kept token counts the same whatever its utterance's length, and a batch with low
confidences is not also given a smaller step (only the relative weights within the batch matter). Windows
whose weights are all 0 (utterances the threshold drops) are left out before batching, so every mini-batch
holds ``batch_size`` windows that count (batches of mostly dropped windows made single short utterances take
full learning-rate-1 steps, and some clients diverged); a client whose weights are all 0 sends a zero delta.

**Server (eqs. 6-11).** ``Delta_t = sum_i w_i Delta_i / sum_i w_i`` (eq. 6) with ``w_i`` the number of words
the client trained on (``weighting="words"``: the words of its utterances with some positive weight) or
``w_i = 1`` (``"uniform"``), then a server optimiser step from
:func:`~privasr.federated.server_opt.make_server_optimizer`: ``{"name": "adam", "lr": 0.001}`` is FedAdam with
``eta_g = 0.001`` (eqs. 7-11, the paper), ``"fedavg"`` is ``theta_{t+1} = theta_t + Delta_t``.

**Differential privacy (section 2.4, DP-FedAvg).** With ``clip_norm = C`` every client scales its delta to
L2 norm ``<= C`` (:func:`~privasr.privacy.dp.clip.clip_by_norm`; also after the cast to float32), so adding or
removing one user moves the *unweighted* sum of deltas by at most ``C``;
:func:`~privasr.federated.loop.run_federated` then adds ``N(0, (sigma C)^2)`` once per round to that sum (user-
level DP, the accountant composes the rounds). The sum must therefore be unweighted: with word weights a
client's contribution would be ``w_i C``, unbounded, so ``clip_norm`` requires ``weighting="uniform"``
(:class:`FedLmConfig` raises :class:`~privasr.errors.ConfigError` otherwise). With the noise on, the denominator
is **not** the number of clients that reported, which the noise does not cover (the size of the released step
would tell how many took part, and with add/remove-one neighbours whether a given client did): the loop hands
``server_update`` a release whose weight is the data-independent expected cohort size
(:func:`~privasr.federated.loop.dp_denominator`: ``q x N`` for Poisson sampling, ``n`` for fixed-size samplers,
DP-FedAvg's fixed denominator). The round metrics ``loss`` and ``tokens`` are exact sums that the noise does not
cover, so they are reported only without ``clip_norm``, and ``clients`` (how many reported) only without DP; a
DP round publishes only ``update_norm`` (:attr:`FedLmAlgorithm.dp_metrics`), the norm of the released step:
post-processing.

What crosses the boundary is only float32 arrays named like the model's parameters (plus the weight and the
numeric metrics), or with ``compression`` their encoded form (:mod:`privasr.federated.compression`: quantised
after clipping, re-scaled so the decoded delta keeps ``clip_norm``; an error-feedback residual stays on the
client); the broadcast is the parameters. No word sequence leaves a client, but the words do: the
non-zero rows of the input-embedding delta are exactly the words the client trained on, and ``tokens`` is its
exact count (docs/privacy.md). With ``clip_norm`` the guarantee is central DP: it covers the released model,
not what the server sees before the noise.

>>> from privasr.lm.neural.models import NeuralLMConfig
>>> from privasr.lm.neural.vocab import Vocabulary
>>> vocab = Vocabulary.build([["a", "b"]])
>>> alg = FedLmAlgorithm(FedLmConfig(loss="token", server="fedavg"), NeuralLMConfig.preset("tiny-transformer"),
...                      vocab)
>>> state = alg.init(np.random.default_rng(0))
>>> client = FedLmClient("c1", ((3, 4), (4, 3, 3)), (np.array([1.0, 0.5]), np.array([0.0, 1.0, 1.0])))
>>> upd, _ = alg.client_update(alg.broadcast(state, 0), client, None, np.random.default_rng(1))
>>> upd.weight, upd.metrics["tokens"], sorted(upd.arrays) == sorted(state["params"])
(5.0, 6.0, True)
>>> new, m = alg.server_update(state, alg.accumulate(None, upd), 0, np.random.default_rng(2))
>>> bool(m["update_norm"] > 0), m["clients"]
(True, 1.0)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from privasr.errors import ConfigError, InputError
from privasr.federated.algorithms._config import TorchModelAlgorithm, config_from_dict, is_int, is_real
from privasr.federated.compression import CompressionSettings, check_no_secagg
from privasr.federated.core import SumAccumulator, Update
from privasr.federated.secagg import SCALAR_BOUND, Summand, summand_of
from privasr.federated.server_opt import make_server_optimizer
from privasr.lm.neural.models import NeuralLMConfig, build_model
from privasr.lm.neural.train import make_batch
from privasr.lm.neural.vocab import Vocabulary
from privasr.privacy.dp.clip import clip_float32, global_norm

__all__ = ["FedLmClient", "FedLmConfig", "FedLmAlgorithm", "LOSSES", "WEIGHTINGS", "target_weights"]

LOSSES = ("all", "threshold", "utterance", "token")
"""The confidence weightings of the loss (eqs. 2-5, see the module docstring)."""

WEIGHTINGS = ("words", "uniform")
"""How the server weights the clients' deltas (eq. 6): by words trained on, or 1 each."""

_IGNORE = -100


# ---------------------------------------------------------------------------------------------------------------
# client data
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FedLmClient:
    """One client's transcripts: word-id sequences with optional per-word confidences.

    Attributes:
        id: the client's name (used in error messages only; never sent).
        sentences: one tuple of word ids per utterance, without ``<s>``/``</s>``; each non-empty, ids >= 0
            (checked against the vocabulary by :meth:`FedLmAlgorithm.client_update`).
        weights: ``None`` (every confidence 1) or one float array per sentence, of its length, values in
            ``[0, 1]``.

    Raises:
        InputError: naming the client and the utterance.

    >>> FedLmClient("dev1", ((3, 4),), (np.array([0.5, 1.2]),))
    Traceback (most recent call last):
    ...
    privasr.errors.InputError: client 'dev1', utterance 0: confidences outside [0, 1] (expected finite values in [0, 1])
    """

    id: str
    sentences: tuple[tuple[int, ...], ...]
    weights: tuple[np.ndarray, ...] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise InputError(f"client id {self.id!r}", expected="a non-empty string")
        who = f"client {self.id!r}"
        if isinstance(self.sentences, str | bytes) or not isinstance(self.sentences, Sequence):
            raise InputError(f"{who}: sentences are a {type(self.sentences).__name__}",
                             expected="a sequence of word-id sequences")
        sents = []
        for j, s in enumerate(self.sentences):
            if isinstance(s, str | bytes) or not isinstance(s, Sequence | np.ndarray):
                raise InputError(f"{who}, utterance {j}: a {type(s).__name__}", expected="a sequence of word ids")
            if len(s) == 0:
                raise InputError(f"{who}, utterance {j} is empty", expected="at least one word id")
            if not all(is_int(i) and i >= 0 for i in s):
                raise InputError(f"{who}, utterance {j}: word ids {list(s)!r}", expected="integers >= 0")
            sents.append(tuple(int(i) for i in s))
        object.__setattr__(self, "sentences", tuple(sents))
        if self.weights is not None:
            if isinstance(self.weights, str | bytes) or not isinstance(self.weights, Sequence):
                raise InputError(f"{who}: weights are a {type(self.weights).__name__}",
                                 expected="None or one float array per sentence")
            if len(self.weights) != len(sents):
                raise InputError(f"{who}: {len(self.weights)} weight arrays for {len(sents)} sentences",
                                 expected="one per sentence")
            ws = []
            for j, (w, s) in enumerate(zip(self.weights, sents, strict=True)):
                try:
                    a = np.array(w, dtype=np.float64)
                except (TypeError, ValueError):
                    raise InputError(f"{who}, utterance {j}: confidences are not numeric",
                                     expected="a float array") from None
                if a.shape != (len(s),):
                    raise InputError(f"{who}, utterance {j}: confidences of shape {a.shape} for {len(s)} words",
                                     expected=f"shape ({len(s)},)")
                if not (np.all(np.isfinite(a)) and np.all((a >= 0) & (a <= 1))):
                    raise InputError(f"{who}, utterance {j}: confidences outside [0, 1]",
                                     expected="finite values in [0, 1]")
                a.setflags(write=False)
                ws.append(a)
            object.__setattr__(self, "weights", tuple(ws))

    @property
    def n_words(self) -> int:
        """Total number of words of the client's utterances."""
        return sum(len(s) for s in self.sentences)


# ---------------------------------------------------------------------------------------------------------------
# configuration
# ---------------------------------------------------------------------------------------------------------------
def _choice(name: str, value: Any, allowed: Sequence[Any]) -> Any:
    if isinstance(value, bool) or value not in allowed:
        raise ConfigError(f"{name}={value!r}", expected=f"one of {list(allowed)}")
    return value


@dataclass(frozen=True)
class FedLmConfig:
    """The hyper-parameters of federated NNLM fine-tuning (see the module docstring).

    Attributes:
        loss: ``"all"``, ``"threshold"``, ``"utterance"`` or ``"token"`` (eqs. 2-5).
        threshold: the utterance-confidence threshold of ``loss="threshold"``, in ``[0, 1]``.
        local_epochs: ``K``, epochs of local SGD per round (integer >= 1).
        batch_size: utterance windows per local mini-batch (integer >= 1).
        client_lr: ``eta_l``, the local SGD learning rate (> 0).
        grad_clip: ``None`` or ``G > 0``: the L2 bound of each local mini-batch gradient (the step is at most
            ``client_lr * G`` long); not a privacy mechanism.
        clip_norm: ``None`` or ``C > 0``: the L2 bound of a client's delta (DP-FedAvg); needs
            ``weighting="uniform"``.
        weighting: ``"words"`` (eq. 6) or ``"uniform"``.
        server: a :func:`~privasr.federated.server_opt.make_server_optimizer` spec (a name or a mapping).
        compression: how the client compresses its delta after clipping (``None``/``"none"``, or a
            :class:`~privasr.federated.compression.CompressionSettings` mapping such as ``{kind: quantize, bits:
            8}``); the server decodes every update before accumulating it. Not with secure aggregation.

    Raises:
        ConfigError: naming the field.

    >>> FedLmConfig(clip_norm=1.0)
    Traceback (most recent call last):
    ...
    privasr.errors.ConfigError: clip_norm=1.0 with weighting='words' (expected weighting='uniform': the noise is calibrated to a sum of clipped, unweighted deltas)
    >>> FedLmConfig.from_dict(FedLmConfig(loss="token").to_dict()).server
    {'name': 'adam', 'lr': 0.001}
    """

    loss: str = "all"
    threshold: float = 0.5
    local_epochs: int = 1
    batch_size: int = 8
    client_lr: float = 1.0
    grad_clip: float | None = None
    clip_norm: float | None = None
    weighting: str = "words"
    server: Any = None
    compression: Any = None

    def __post_init__(self) -> None:
        _choice("loss", self.loss, LOSSES)
        if not is_real(self.threshold) or not 0 <= self.threshold <= 1:
            raise ConfigError(f"threshold={self.threshold!r}", expected="a number in [0, 1]")
        object.__setattr__(self, "threshold", float(self.threshold))
        for name in ("local_epochs", "batch_size"):
            v = getattr(self, name)
            if not is_int(v) or v < 1:
                raise ConfigError(f"{name}={v!r}", expected="an integer >= 1")
            object.__setattr__(self, name, int(v))
        if not is_real(self.client_lr) or self.client_lr <= 0:
            raise ConfigError(f"client_lr={self.client_lr!r}", expected="a finite number > 0")
        object.__setattr__(self, "client_lr", float(self.client_lr))
        for name in ("grad_clip", "clip_norm"):
            v = getattr(self, name)
            if v is not None:
                if not is_real(v) or v <= 0:
                    raise ConfigError(f"{name}={v!r}", expected="None or a finite number > 0")
                object.__setattr__(self, name, float(v))
        _choice("weighting", self.weighting, WEIGHTINGS)
        if self.clip_norm is not None and self.weighting != "uniform":
            raise ConfigError(f"clip_norm={self.clip_norm!r} with weighting={self.weighting!r}",
                              expected="weighting='uniform': the noise is calibrated to a sum of clipped, "
                                       "unweighted deltas")
        spec = self.server
        if spec is None:
            spec = {"name": "adam", "lr": 0.001}
        elif isinstance(spec, str):
            spec = {"name": spec}
        elif isinstance(spec, Mapping):
            spec = dict(spec)
        else:
            raise ConfigError(f"server={spec!r}", expected="a server optimiser name or a mapping with 'name'")
        make_server_optimizer(spec)  # validates
        object.__setattr__(self, "server", spec)
        object.__setattr__(self, "compression", CompressionSettings.of(self.compression))

    def to_dict(self) -> dict[str, Any]:
        """The configuration as a plain dict (read back by :meth:`from_dict`; ``grad_clip`` and ``compression``
        only when on, so runs without them keep their checkpoint keys)."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        if self.grad_clip is None:
            del d["grad_clip"]
        d["server"] = dict(self.server)
        if self.compression.enabled:
            d["compression"] = self.compression.to_dict()
        else:
            del d["compression"]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> FedLmConfig:
        """A config from a dict; missing keys take their defaults.

        Raises:
            ConfigError: for an unknown key or a bad value.

        >>> FedLmConfig.from_dict({"lr": 1.0})
        Traceback (most recent call last):
        ...
        privasr.errors.ConfigError: unknown FedLM setting 'lr' (expected one of ['loss', 'threshold', 'local_epochs', 'batch_size', 'client_lr', 'grad_clip', 'clip_norm', 'weighting', 'server', 'compression'])
        """
        return config_from_dict(cls, d, "FedLM")


def target_weights(config: FedLmConfig, n_words: int, confidences: np.ndarray | None) -> np.ndarray:
    """The loss weights of the ``n_words + 1`` targets ``w_1 .. w_n, </s>`` of one utterance (eqs. 2-5).

    >>> c = np.array([1.0, 0.2])
    >>> [target_weights(FedLmConfig(loss=m), 2, c).tolist() for m in LOSSES]
    [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [0.6, 0.6, 0.6], [1.0, 0.2, 0.6]]
    >>> target_weights(FedLmConfig(loss="threshold", threshold=0.7), 2, c).tolist()
    [0.0, 0.0, 0.0]
    """
    c = np.ones(n_words) if confidences is None else np.asarray(confidences, dtype=np.float64)
    utt = float(c.mean())
    if config.loss == "all":
        return np.ones(n_words + 1)
    if config.loss == "threshold":
        return np.full(n_words + 1, 1.0 if utt >= config.threshold else 0.0)
    if config.loss == "utterance":
        return np.full(n_words + 1, utt)
    return np.append(c, utt)


# ---------------------------------------------------------------------------------------------------------------
# the algorithm
# ---------------------------------------------------------------------------------------------------------------
class FedLmAlgorithm(TorchModelAlgorithm):
    """Federated NNLM fine-tuning as a :class:`~privasr.federated.core.FederatedAlgorithm`.

    Server state: ``{"params": {name: float32 array}, "opt": the server optimiser's state}``. Payload: the
    parameters. Update: ``arrays = {name: float32 delta (client - global)}``, ``weight`` (words or 1),
    ``metrics = {"loss": weighted mean training loss, "tokens": targets with positive weight, "clipped": 0/1
    (with clip_norm)}`` With ``compression`` the arrays are the encoded delta
    (:mod:`privasr.federated.compression`: ``NAME#scales`` and ``NAME#codes``, or ``NAME#idx`` and ``NAME#val``),
    decoded by :meth:`accumulate`; with error feedback the client state is ``{"residual": {name: float32}}``.

    Args:
        config: the hyper-parameters.
        model_config: the network (``vocab_size`` 0 or ``len(vocab)``).
        vocab: the model's vocabulary (client ids index into it).
        init_state: pre-trained weights (name -> array, the model's parameter names and shapes) to fine-tune,
            or ``None`` to train from a fresh initialisation seeded from ``init``'s generator.

    Raises:
        ConfigError: a bad config or model config.
        InputError: ``init_state`` does not match the model.
    """

    name = "fedlm"
    dp_metrics = ("update_norm",)
    """The server metrics of a DP round: functions of the release only."""
    dp_unit = "client"
    """The unit of the DP guarantee: one client (its clipped delta)."""

    def __init__(self, config: FedLmConfig, model_config: NeuralLMConfig, vocab: Vocabulary,
                 init_state: Mapping[str, np.ndarray] | None = None) -> None:
        if not isinstance(config, FedLmConfig):
            raise ConfigError(f"FedLM config is a {type(config).__name__}", expected="a FedLmConfig")
        if not isinstance(model_config, NeuralLMConfig):
            raise ConfigError(f"model config is a {type(model_config).__name__}", expected="a NeuralLMConfig")
        if not isinstance(vocab, Vocabulary):
            raise ConfigError(f"vocabulary is a {type(vocab).__name__}", expected="a Vocabulary")
        if model_config.vocab_size == 0:
            model_config = model_config.replace(vocab_size=len(vocab))
        elif model_config.vocab_size != len(vocab):
            raise ConfigError(f"vocab_size={model_config.vocab_size} but the vocabulary has {len(vocab)} words")
        self.config = config
        self.model_config = model_config
        self.vocab = vocab
        self.optimizer = make_server_optimizer(config.server)
        self.init_state: dict[str, np.ndarray] | None = None
        if init_state is not None:
            self.init_state = self._check_params(init_state, "init_state")

    def config_dict(self) -> dict[str, Any]:
        """The configuration (part of the loop's checkpoint key)."""
        return {**self.config.to_dict(), "model": self.model_config.to_dict(), "vocab_size": len(self.vocab),
                "pretrained": self.init_state is not None}

    # -- model plumbing -------------------------------------------------------------------------------------

    def _build_model(self) -> torch.nn.Module:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            return build_model(self.model_config, self.vocab)

    def param_names(self) -> list[str]:
        """The model's trainable parameter names (the keys of the state's ``params`` and of every update)."""
        return [k for k, _ in self._get_model().named_parameters()]

    def _windows(self, client: FedLmClient) -> tuple[list[np.ndarray], list[np.ndarray], float]:
        """``<s> w .. </s>`` id windows with some positive target weight, their target weights, and the words
        of kept utterances (windows whose weights are all 0 are not batched: a mini-batch holds
        ``batch_size`` windows that count)."""
        v = len(self.vocab)
        max_len = self.model_config.max_len
        seqs: list[np.ndarray] = []
        wts: list[np.ndarray] = []
        words = 0
        for j, s in enumerate(client.sentences):
            if max(s) >= v:
                raise InputError(f"client {client.id!r}, utterance {j}: word id {max(s)} outside the vocabulary",
                                 expected=f"ids in [0, {v})")
            ids = np.array([self.vocab.bos_id, *s, self.vocab.eos_id], dtype=np.int64)
            tw = target_weights(self.config, len(s), None if client.weights is None else client.weights[j])
            if tw.sum() > 0:
                words += len(s)
            for start in range(0, len(ids) - 1, max_len):
                w = tw[start:start + max_len]
                if not w.any():  # a window with no weight (a dropped utterance) is left out of the batches
                    continue
                seqs.append(ids[start:start + max_len + 1])
                wts.append(w)
        return seqs, wts, float(words)

    # -- server ---------------------------------------------------------------------------------------------

    def init(self, rng: np.random.Generator) -> dict[str, Any]:
        """``{"params", "opt"}``: the pre-trained weights, or a fresh model seeded from ``rng``."""
        if self.init_state is not None:
            params = {k: v.copy() for k, v in self.init_state.items()}
        else:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(int(rng.integers(2 ** 63 - 1)))
                params = self.params_of(build_model(self.model_config, self.vocab))
        return {"params": params, "opt": self.optimizer.init(params)}

    def accumulate(self, acc: SumAccumulator | None, update: Update) -> SumAccumulator:
        """The weighted sum: ``acc + update.weight * delta`` (weights summed unscaled); a compressed update is
        decoded first."""
        acc = SumAccumulator.empty() if acc is None else acc
        return acc.add(self.decoded(update), scale=update.weight)

    def secure_bound(self, bound: float | None) -> float:
        """The bound of every coordinate of a delta under secure aggregation: ``bound``, by default
        ``clip_norm`` (an L2 bound is also one on every coordinate); secure aggregation needs ``clip_norm``."""
        if self.config.clip_norm is None:
            raise ConfigError("secure aggregation of fedlm deltas without clip_norm",
                              expected="clip_norm set: the deltas must be bounded to be quantised for SecAgg+")
        check_no_secagg(self.config.compression, "fedlm")
        return float(self.config.clip_norm if bound is None else bound)

    def secure_summand(self, update: Update, bound: float | None) -> Summand:
        """The clipped delta (uniform weighting, which ``clip_norm`` implies), the weight 1 and the token and
        clipping counts as scalars (the loss is not sent: a DP run does not publish it)."""
        b = self.secure_bound(bound)
        metrics = {k: (float(update.metrics.get(k, 0.0)), SCALAR_BOUND) for k in ("tokens", "clipped")}
        return summand_of(update.arrays, b, weight=(float(update.weight), 1.0), metrics=metrics)

    def from_secure_sum(self, arrays: Mapping[str, np.ndarray], scalars: Mapping[str, float],
                        count: int) -> SumAccumulator:
        """The accumulator :meth:`accumulate` would have built from the same clients."""
        return SumAccumulator(dict(arrays), float(scalars.get("weight", 0.0)), int(count),
                              {k: float(scalars.get(k, 0.0)) for k in ("tokens", "clipped")})

    def dp_bound(self) -> tuple[str, float]:
        """``("l2", clip_norm)``: one client moves the (unweighted) sum of deltas by at most ``clip_norm``.

        Raises:
            ConfigError: without ``clip_norm`` (an unclipped delta has no bound).
        """
        if self.config.clip_norm is None:
            raise ConfigError("differential privacy for fedlm without clip_norm",
                              expected="fedlm.clip_norm set (and weighting: uniform): the noise is calibrated to "
                                       "a sum of clipped, unweighted deltas")
        return "l2", float(self.config.clip_norm)

    def server_update(self, state: Mapping[str, Any], acc: SumAccumulator | None, round: int,
                      rng: np.random.Generator) -> tuple[dict[str, Any], dict[str, float]]:
        """``Delta = sum / weight`` (eq. 6), then one server optimiser step (eqs. 7-11 for Adam).

        Without accumulated weight (no client, or every client dropped all its utterances with word
        weighting) the parameters and optimiser state are kept. A DP release (``acc.is_release``) carries the
        loop's data-independent denominator as its weight and no count or metrics.
        """
        params = state["params"]
        count = 0 if acc is None else acc.count
        metrics: dict[str, float] = {}
        if acc is None or not acc.is_release:
            metrics["clients"] = float(count)
        # exact sums over clients are not covered by DP noise: with clipping they are not published
        if acc is not None and count and self.config.clip_norm is None:
            metrics["loss"] = acc.metrics.get("loss", 0.0) / count
            metrics["tokens"] = acc.metrics.get("tokens", 0.0)
        if acc is None or acc.weight <= 0:
            metrics["update_norm"] = 0.0
            return {"params": dict(params), "opt": state["opt"]}, metrics
        delta = acc.mean()
        metrics["update_norm"] = global_norm(delta)
        new, opt = self.optimizer.step(params, delta, state["opt"])
        return {"params": {k: np.asarray(v, dtype=np.float32) for k, v in new.items()}, "opt": opt}, metrics

    # -- client ---------------------------------------------------------------------------------------------

    def local_train(self, params: Mapping[str, np.ndarray], client: FedLmClient,
                    rng: np.random.Generator) -> tuple[dict[str, np.ndarray], dict[str, float]]:
        """``local_epochs`` epochs of SGD from ``params`` on ``client``; the trained parameters and metrics
        (``loss``, ``tokens``, ``words``, ``steps`` and, with ``grad_clip``, ``clipped_steps``: the steps whose
        gradient was scaled down). Only ``loss`` and ``tokens`` are uploaded (:meth:`client_update`).

        Each epoch shuffles the windows with ``rng`` and cuts them into batches of ``batch_size``; torch's
        generator (dropout) is seeded from ``rng`` inside a forked RNG state.
        """
        if not isinstance(client, FedLmClient):
            raise InputError(f"client is a {type(client).__name__}", expected="a FedLmClient")
        seqs, wts, words = self._windows(client)
        model = self.load(params)
        model.train()
        lr = self.config.client_lr
        bs = self.config.batch_size
        loss_sum, weight_sum = 0.0, 0.0
        steps = clipped = 0
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(rng.integers(2 ** 63 - 1)))
            for _ in range(self.config.local_epochs):
                order = rng.permutation(len(seqs))
                for lo in range(0, len(order), bs):
                    idx = order[lo:lo + bs]
                    x, y = make_batch([seqs[i] for i in idx])
                    w = np.zeros(y.shape, dtype=np.float32)
                    for r, i in enumerate(idx):
                        w[r, : len(wts[i])] = wts[i]
                    wt = torch.from_numpy(w)
                    total = float(wt.sum())
                    if total <= 0:
                        continue
                    logits, _ = model(x)
                    ce = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), ignore_index=_IGNORE,
                                         reduction="none")
                    loss = (ce * wt.flatten()).sum() / total
                    model.zero_grad(set_to_none=True)
                    loss.backward()
                    if self.config.grad_clip is not None:
                        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), self.config.grad_clip)
                        clipped += int(float(norm) > self.config.grad_clip)
                    steps += 1
                    with torch.no_grad():
                        for p in model.parameters():
                            if p.grad is not None:
                                p.add_(p.grad, alpha=-lr)
                    loss_sum += float(loss.detach()) * total
                    weight_sum += total
        model.eval()
        tokens = float(sum(int(np.count_nonzero(a > 0)) for a in wts))
        metrics = {"loss": loss_sum / weight_sum if weight_sum > 0 else 0.0, "tokens": tokens, "words": words,
                   "steps": steps, "clipped_steps": clipped}
        return self.params_of(model), metrics

    def client_update(self, payload: Mapping[str, np.ndarray], client: FedLmClient, client_state: Any,
                      rng: np.random.Generator) -> tuple[Update, Any]:
        """Train locally and send ``theta_i - theta_t`` (clipped to ``clip_norm`` when set, then compressed
        when ``compression`` is on); the client state is ``None``, or ``{"residual": ...}`` with error feedback
        (kept on the device, never sent)."""
        start = self._check_params(payload, "the broadcast parameters")
        trained, m = self.local_train(start, client, rng)
        delta = {k: trained[k] - start[k] for k in start}
        metrics = {"loss": m["loss"], "tokens": m["tokens"]}
        if self.config.clip_norm is not None:
            delta, clipped = _clip32(delta, self.config.clip_norm)
            metrics["clipped"] = float(clipped)
        weight = m["words"] if self.config.weighting == "words" else 1.0
        return self.encoded(delta, weight, metrics, client_state, rng, self.config.clip_norm)

    # -- evaluation -----------------------------------------------------------------------------------------

    @torch.no_grad()
    def perplexity(self, params: Mapping[str, np.ndarray], sentences: Sequence[Sequence[int]],
                   batch_size: int = 64) -> float:
        """Perplexity ``exp(mean CE)`` (natural log, per target incl. ``</s>``) of word-id ``sentences``.

        Raises:
            InputError: an id outside the vocabulary, an empty sentence, or parameters not of the model.
        """
        client = FedLmClient("evaluation", tuple(tuple(s) for s in sentences))
        seqs, _, _ = self._windows(client)
        model = self.load(self._check_params(params, "params"))
        model.eval()
        total, count = 0.0, 0
        for lo in range(0, len(seqs), batch_size):
            x, y = make_batch(seqs[lo:lo + batch_size])
            logits, _ = model(x)
            total += float(F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), ignore_index=_IGNORE,
                                           reduction="sum"))
            count += int((y != _IGNORE).sum())
        return math.exp(total / count) if count else math.nan


_clip32 = clip_float32
"""``delta`` clipped to L2 ``<= clip_norm`` as float32 (:func:`~privasr.privacy.dp.clip.clip_float32`)."""
