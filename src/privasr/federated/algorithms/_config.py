"""What the algorithms' configuration dataclasses and torch models share: strict number checks, dict configs,
and the parameter plumbing between numpy pytrees (what travels) and a torch model (what trains)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import fields
from typing import Any, TypeVar

import numpy as np

from privasr.config import from_mapping
from privasr.errors import ConfigError, InputError
from privasr.federated.compression import compress, decompress
from privasr.federated.core import SumAccumulator, Update

__all__ = ["config_from_dict", "is_real", "is_int", "check_params", "load_params", "params_of", "TorchModelAlgorithm"]

T = TypeVar("T")


def config_from_dict(cls: type[T], d: Any, what: str) -> T:
    """A frozen algorithm config dataclass from a mapping of its field names, through the one config system.

    The mapping and its keys are checked first, in the algorithm's own words (``unknown FMP setting 'x'``);
    :func:`privasr.config.from_mapping` then checks every value against the field's type (errors name the
    key) before the class's ``__post_init__`` checks the values' ranges and the rules between them.

    >>> from dataclasses import dataclass
    >>> @dataclass(frozen=True)
    ... class C:
    ...     a: int = 1
    >>> config_from_dict(C, {"a": 2}, "C").a
    2
    >>> config_from_dict(C, {"b": 2}, "C")
    Traceback (most recent call last):
    ...
    privasr.errors.ConfigError: unknown C setting 'b' (expected one of ['a'])
    >>> config_from_dict(C, {"a": "2"}, "C")
    Traceback (most recent call last):
    ...
    privasr.errors.ConfigError: config key 'a' is '2' (expected an integer)
    """
    if not isinstance(d, Mapping):
        raise ConfigError(f"{what} settings are a {type(d).__name__}", expected="a mapping")
    names = [f.name for f in fields(cls) if f.init]  # type: ignore[arg-type]
    for k in d:
        if k not in names:
            raise ConfigError(f"unknown {what} setting {k!r}", expected=f"one of {names}")
    return from_mapping(cls, d)


def is_real(v: Any) -> bool:
    """A finite real number that is not a bool.

    >>> is_real(1.5), is_real(True), is_real(float("nan"))
    (True, False, False)
    """
    return not isinstance(v, bool) and isinstance(v, int | float | np.integer | np.floating) and math.isfinite(v)


def is_int(v: Any) -> bool:
    """An integer that is not a bool.

    >>> is_int(3), is_int(3.0), is_int(False)
    (True, False, False)
    """
    return not isinstance(v, bool) and isinstance(v, int | np.integer)


def check_params(model: Any, params: Any, what: str) -> dict[str, np.ndarray]:
    """``params`` as float32 arrays with exactly ``model``'s parameter names and shapes, all finite.

    Raises:
        InputError: not a mapping, other names, a wrong shape or dtype, NaN or infinity (naming ``what``).
    """
    if not isinstance(params, Mapping):
        raise InputError(f"{what} is a {type(params).__name__}", expected="a name -> array mapping")
    want = {k: tuple(p.shape) for k, p in model.named_parameters()}
    if set(params) != set(want):
        raise InputError(f"{what} has parameters {sorted(params)[:6]}{'...' if len(params) > 6 else ''}",
                         expected=f"the model's {len(want)} parameters ({sorted(want)[:6]}...)")
    out = {}
    for k, shape in want.items():
        a = np.asarray(params[k])
        if a.shape != shape or a.dtype.kind not in "biuf":
            raise InputError(f"{what}[{k!r}] has shape {a.shape} and dtype {a.dtype}",
                             expected=f"a numeric array of shape {shape}")
        a = a.astype(np.float32)
        if not np.all(np.isfinite(a)):
            raise InputError(f"{what}[{k!r}] holds NaN or infinity", expected="finite values")
        out[k] = a
    return out


def load_params(model: Any, params: Mapping[str, np.ndarray]) -> Any:
    """Copy ``params`` (name -> array) into ``model``'s parameters in place; return the model."""
    import torch

    with torch.no_grad():
        for k, p in model.named_parameters():
            p.copy_(torch.from_numpy(np.ascontiguousarray(params[k], dtype=np.float32)))
    return model


def params_of(model: Any) -> dict[str, np.ndarray]:
    """A model's parameters as float32 numpy arrays (copies, on the CPU)."""
    return {k: p.detach().cpu().numpy().astype(np.float32, copy=True) for k, p in model.named_parameters()}


class TorchModelAlgorithm:
    """What the algorithms that train a torch model share: one model per process, built on demand by
    :meth:`_build_model` (subclasses define it) and never pickled (a backend ships the algorithm to its workers
    without it); the parameters travel as numpy pytrees, checked against it (:meth:`_check_params`), loaded into
    it (:meth:`load`) and read out of it (:meth:`params_of`); the broadcast is the server's parameters."""

    _model: Any = None

    def _build_model(self) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def _get_model(self) -> Any:
        if self._model is None:
            self._model = self._build_model()
        return self._model

    def __getstate__(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d.pop("_model", None)  # one model per process, rebuilt on demand
        return d

    def _check_params(self, params: Any, what: str) -> dict[str, np.ndarray]:
        return check_params(self._get_model(), params, what)

    def load(self, params: Mapping[str, np.ndarray]) -> Any:
        """The (shared, per-process) model holding ``params``."""
        return load_params(self._get_model(), params)

    @staticmethod
    def params_of(model: Any) -> dict[str, np.ndarray]:
        """A model's parameters as float32 numpy arrays (copies)."""
        return params_of(model)

    def broadcast(self, state: Mapping[str, Any], round: int) -> dict[str, np.ndarray]:
        """The global parameters."""
        return dict(state["params"])

    def zero_sum(self, state: Mapping[str, Any]) -> SumAccumulator:
        """The sum of no delta (zeros of the parameters' shapes): what a DP round nobody reported releases,
        noised (:func:`~privasr.federated.loop.run_federated`)."""
        return SumAccumulator({k: np.zeros(np.shape(v)) for k, v in state["params"].items()})

    # -- compressed deltas (the subclass's ``config.compression``, privasr.federated.compression) -----------

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """The model's parameter names and shapes (the dense arrays of a delta)."""
        return {k: tuple(p.shape) for k, p in self._get_model().named_parameters()}

    def raw_update_bytes(self) -> int:
        """The bytes of an uncompressed update's arrays: the float32 delta of every parameter."""
        return 4 * sum(int(np.prod(s, dtype=np.int64)) for s in self.param_shapes().values())

    def encoded(self, delta: dict[str, np.ndarray], weight: float, metrics: dict[str, float], client_state: Any,
                rng: np.random.Generator, clip_norm: float | None = None) -> tuple[Update, Any]:
        """A client's ``(update, new client state)`` for its (clipped) ``delta``: the delta itself and no state
        without compression; else the encoded delta and, with error feedback, ``{"residual": ...}`` (kept on the
        device, never sent). ``clip_norm``: the bound the decoded delta must keep (DP)."""
        compression = self.config.compression  # type: ignore[attr-defined]
        if not compression.enabled:
            return Update(arrays=delta, weight=weight, metrics=metrics), None
        residual = client_state.get("residual") if isinstance(client_state, Mapping) else None
        sent, residual = compress(delta, compression, rng, residual, clip_norm)
        return Update(arrays=sent, weight=weight, metrics=metrics), \
            (None if residual is None else {"residual": residual})

    def decoded(self, update: Update) -> Update:
        """``update`` with its compressed arrays decoded into the dense delta (the update itself without
        compression)."""
        compression = self.config.compression  # type: ignore[attr-defined]
        if not compression.enabled:
            return update
        return Update(decompress(update.arrays, self.param_shapes(), compression), update.weight, update.metrics)
