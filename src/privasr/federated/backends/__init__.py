"""Where clients run: ``local`` (sequential, deterministic, the default), ``ray`` (an actor pool) and ``flower``.

Every backend has ``run(algorithm, payload, tasks, timeout) -> Iterator[ClientOutcome]`` (outcomes in arrival
order) and ``close()``. The loop (:func:`privasr.federated.loop.run_federated`) accumulates outcomes as they
arrive; seeds are per (round, client, slot), so results do not depend on the backend.

>>> make_backend("local").name
'local'
"""

from __future__ import annotations

from typing import Any

from privasr.errors import ConfigError

__all__ = ["make_backend", "run_on", "BACKENDS"]

BACKENDS = ("local", "ray", "flower")


def make_backend(name: str | None = None, **options: Any) -> Any:
    """The backend called ``name`` (``None``: local) with its ``options``."""
    name = name or "local"
    if name == "local":
        if options:
            raise ConfigError(f"the local backend takes no options, got {sorted(options)}")
        from privasr.federated.backends.local import LocalBackend

        return LocalBackend()
    if name == "ray":
        from privasr.federated.backends.ray import RayBackend

        return RayBackend(**options)
    if name == "flower":
        raise ConfigError("the flower backend runs the whole loop inside a Flower ServerApp",
                          expected="privasr.federated.backends.flower.run_flower(...)")
    raise ConfigError(f"unknown backend {name!r}", expected=f"one of {', '.join(BACKENDS)}")


def run_on(backend: Any, algorithm: Any, clients: Any, *, options: dict[str, Any] | None = None,
           checkpoint_dir: Any = None, on_round: Any = None, secagg: Any = None, **loop: Any) -> Any:
    """Run the federated loop on ``backend`` and return its :class:`~privasr.federated.loop.FederatedResult`.

    ``backend`` is ``"flower"`` (Flower's simulation engine runs the loop in a ServerApp:
    :func:`~privasr.federated.backends.flower.run_flower` with ``options``), a backend name or ``None`` (made by
    :func:`make_backend` with ``options`` and closed afterwards), or a backend object (used as is and left open).
    With ``checkpoint_dir`` the run checkpoints every round and resumes from it (on Flower the clients' states
    stay in files of their nodes, under ``checkpoint_dir/nodes`` unless ``options`` say otherwise). ``loop`` is
    the rest of :func:`~privasr.federated.loop.run_federated`'s arguments (``rounds``, ``sampler``, ``seed``,
    ``min_clients``, ``privacy``). ``secagg``: secure aggregation
    (:class:`~privasr.federated.secagg.SecAggSettings`), which only ``"flower"`` provides.
    """
    if backend == "flower":
        from privasr.federated.backends.flower import run_flower

        return run_flower(algorithm, list(clients), on_round=on_round, checkpoint_dir=checkpoint_dir,
                          resume=checkpoint_dir is not None, secagg=secagg, **loop,
                          **{"mode": "simulation", **(options or {})})
    if secagg is not None and getattr(secagg, "enabled", False):
        raise ConfigError(f"secure aggregation on the {backend or 'local'} backend",
                          expected="the flower backend (SecAgg+ runs between Flower's ServerApp and ClientApps)")
    from privasr.federated.loop import run_federated

    own = backend is None or isinstance(backend, str)
    b = make_backend(backend, **(options or {})) if own else backend
    try:
        return run_federated(algorithm, list(clients), backend=b, checkpoint_dir=checkpoint_dir,
                             resume=checkpoint_dir is not None, on_round=on_round, **loop)
    finally:
        if own:
            b.close()
