"""The ``ray`` backend: clients run on a pool of Ray actors, outcomes come back as they finish.

:class:`RayBackend` starts Ray (or connects to a cluster) on its first :meth:`~RayBackend.run`, quietly and
offline (no dashboard, no usage statistics, worker logs kept off the driver). It keeps ``num_workers`` actors;
each holds the algorithm once (it is shipped again only when :meth:`~RayBackend.run` is given a different
algorithm object). A client's data is put in Ray's object store once, the first time the client is sampled,
and later rounds pass the reference (clients are immutable); the payload is put once per round.

Tasks go to actors as actors free up and outcomes are yielded in arrival order, so the loop's sums are
accumulated in a different order than on the ``local`` backend: results agree up to floating-point summation
order, while sampling, every client's update and every client's state are identical (seeds are per round,
client and slot: :func:`~privasr.federated.core.client_seed`).

Failures are reported like the ``local`` backend's: a client that raises is ``"raised Type: message"``; one
that raises :class:`~privasr.federated.backends.local.ClientVanished`, or whose actor dies, is ``"vanished ..."``
(a dead actor is replaced); one still running ``timeout`` seconds after it started is ``"timed out ..."``, and
its actor is killed (Ray cannot interrupt a running actor task) and replaced.

Classes defined where other processes cannot import them (a script, a test module) are shipped by value
(:func:`ship_by_value`).

>>> RayBackend(num_workers=2).name
'ray'
>>> RayBackend(num_workers=0)
Traceback (most recent call last):
...
privasr.errors.ConfigError: num_workers=0 (expected an integer >= 1)
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
import warnings
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from privasr.errors import ConfigError
from privasr.federated.core import ClientOutcome, ClientTask, run_client

__all__ = ["RayBackend", "ship_by_value"]

log = logging.getLogger("privasr.federated")


def _importable_elsewhere(module_name: str) -> bool:
    """Whether a fresh interpreter with this ``sys.path`` could import ``module_name``'s top-level package."""
    top = module_name.split(".")[0]
    for finder in sys.meta_path:
        find_spec = getattr(finder, "find_spec", None)
        if find_spec is None:
            continue
        try:
            if find_spec(top, None) is not None:
                return True
        except Exception:  # a broken finder must not stop the run
            continue
    return False


def ship_by_value(*objects: Any) -> list[str]:
    """Have cloudpickle copy the code of ``objects``' classes when other processes cannot import their module.

    Ray and Flower pickle classes *by reference* (module and name), which fails in a worker when the class
    lives in a module the worker cannot import, such as a test module that pytest imported under a name
    outside ``sys.path``. Those modules are registered with ``cloudpickle.register_pickle_by_value``; modules
    found on ``sys.path`` (privasr itself, installed packages) and ``__main__`` (always shipped by value) are
    left alone. Returns the names of the modules registered now.

    >>> ship_by_value(1.0, [1, 2], "privasr")
    []
    """
    try:
        from ray import cloudpickle
    except ImportError:  # pragma: no cover - without Ray nothing ships by value
        return []
    done: list[str] = []
    for obj in objects:
        name = obj.__module__ if isinstance(obj, type) else type(obj).__module__
        module = sys.modules.get(name)
        if module is None or name == "__main__" or name in done or _importable_elsewhere(name):
            continue
        try:
            cloudpickle.register_pickle_by_value(module)
        except ValueError:  # already registered, or not registrable
            continue
        done.append(name)
    return done


class _Worker:
    """The actor: holds the algorithm and runs one client at a time."""

    def __init__(self) -> None:
        self._algorithm: Any = None

    def set_algorithm(self, algorithm: Any) -> None:
        self._algorithm = algorithm

    def run(self, payload: Any, slot: int, index: int, client: Any, state: Any,
            seed: tuple[int, ...]) -> tuple[Any, Any, str | None, float]:
        from privasr.federated.backends.local import describe_failure

        t0 = time.perf_counter()
        try:
            update, new_state = run_client(self._algorithm, payload, ClientTask(slot, index, client, state, seed))
        except Exception as e:  # reported, not raised: the round goes on without this client
            return None, None, describe_failure(e), time.perf_counter() - t0
        return update, new_state, None, time.perf_counter() - t0


class RayBackend:
    """Run clients on ``num_workers`` Ray actors (see the module docstring).

    Args:
        num_workers: actors in the pool (clients running at once).
        num_cpus_per_worker: CPUs Ray reserves for each actor.
        address: a Ray cluster to connect to (``"auto"``, ``"ray://host:port"``); ``None`` starts a local Ray
            with ``ceil(num_workers * num_cpus_per_worker)`` CPUs unless Ray is already running in this process.
        init_kwargs: further ``ray.init`` arguments (they override the quiet defaults).
    """

    name = "ray"

    def __init__(self, num_workers: int = 2, num_cpus_per_worker: float = 1, address: str | None = None,
                 init_kwargs: Mapping[str, Any] | None = None) -> None:
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise ConfigError(f"num_workers={num_workers!r}", expected="an integer >= 1")
        if isinstance(num_cpus_per_worker, bool) or not isinstance(num_cpus_per_worker, int | float) \
                or not num_cpus_per_worker > 0:
            raise ConfigError(f"num_cpus_per_worker={num_cpus_per_worker!r}", expected="a number > 0")
        self.num_workers = num_workers
        self.num_cpus_per_worker = float(num_cpus_per_worker)
        self.address = address
        self.init_kwargs = dict(init_kwargs or {})
        self._started_ray = False
        self._actor_cls: Any = None
        self._actors: list[Any] = []
        self._algorithm: Any = None  # kept alive so that its id() stays unique
        self._algorithm_ref: Any = None
        self._client_refs: dict[int, tuple[Any, Any]] = {}  # id(client) -> (client, ObjectRef)
        self.algorithm_puts = 0
        self.replaced_workers = 0

    # -- Ray session and actors ---------------------------------------------------------------------------

    def _ensure_ray(self) -> Any:
        try:
            import ray
        except ImportError as e:
            raise ConfigError("the ray backend needs Ray", expected="pip install 'privasr[federated]'") from e
        if not ray.is_initialized():
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                                      "logging_level": logging.ERROR, "configure_logging": True}
            if self.address is None:
                kwargs["num_cpus"] = max(1, math.ceil(self.num_workers * self.num_cpus_per_worker))
            else:
                kwargs["address"] = self.address
            kwargs.update(self.init_kwargs)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                ray.init(**kwargs)
            self._started_ray = True
        if self._actor_cls is None:
            self._actor_cls = ray.remote(num_cpus=self.num_cpus_per_worker, max_restarts=0)(_Worker)
        return ray

    def _new_actor(self) -> Any:
        actor = self._actor_cls.remote()
        if self._algorithm_ref is not None:
            actor.set_algorithm.remote(self._algorithm_ref)
        return actor

    def _set_algorithm(self, ray: Any, algorithm: Any) -> None:
        if algorithm is self._algorithm and self._algorithm_ref is not None:
            return
        ship_by_value(algorithm)
        self._algorithm = algorithm
        self._algorithm_ref = ray.put(algorithm)
        self.algorithm_puts += 1
        for actor in self._actors:  # actor calls run in submission order: later tasks see this algorithm
            actor.set_algorithm.remote(self._algorithm_ref)

    def _replace(self, ray: Any, actor: Any) -> Any:
        try:
            ray.kill(actor)
        except Exception:  # already dead
            pass
        self.replaced_workers += 1
        new = self._new_actor()
        self._actors[self._actors.index(actor)] = new
        return new

    def _client_ref(self, ray: Any, client: Any) -> Any:
        hit = self._client_refs.get(id(client))
        if hit is None or hit[0] is not client:
            ship_by_value(client)
            hit = (client, ray.put(client))
            self._client_refs[id(client)] = hit
        return hit[1]

    # -- the backend interface ----------------------------------------------------------------------------

    def run(self, algorithm: Any, payload: Any, tasks: Sequence[ClientTask],
            timeout: float | None = None) -> Iterator[ClientOutcome]:
        """Yield one :class:`ClientOutcome` per task, in the order the clients finish."""
        if not tasks:
            return
        ray = self._ensure_ray()
        self._set_algorithm(ray, algorithm)
        while len(self._actors) < self.num_workers:
            self._actors.append(self._new_actor())
        payload_ref = ray.put(payload)
        queue = deque(tasks)
        idle = deque(self._actors)
        running: dict[Any, tuple[ClientTask, Any, float]] = {}  # ObjectRef -> (task, actor, start)
        try:
            while queue or running:
                while queue and idle:
                    task, actor = queue.popleft(), idle.popleft()
                    ref = actor.run.remote(payload_ref, task.slot, task.index, self._client_ref(ray, task.client),
                                           task.state, task.seed)
                    running[ref] = (task, actor, time.perf_counter())
                wait_s = None
                if timeout is not None:
                    first = min(start for _, _, start in running.values())
                    wait_s = max(0.0, first + timeout - time.perf_counter())
                ready, _ = ray.wait(list(running), num_returns=1, timeout=wait_s)
                for ref in ready:
                    task, actor, start = running.pop(ref)
                    out, actor = self._collect(ray, ref, task, actor, start)
                    idle.append(actor)
                    yield out
                if timeout is not None:
                    now = time.perf_counter()
                    for ref, (task, actor, start) in list(running.items()):
                        if now - start >= timeout:
                            del running[ref]
                            idle.append(self._replace(ray, actor))
                            dt = now - start
                            yield ClientOutcome(task.slot, task.index, seconds=dt,
                                                error=f"timed out ({dt:.3g} s > {timeout:g} s)")
        finally:
            for _, actor, _ in running.values():  # abandoned (the caller stopped early): free the actors
                self._replace(ray, actor)

    def _collect(self, ray: Any, ref: Any, task: ClientTask, actor: Any,
                 start: float) -> tuple[ClientOutcome, Any]:
        from ray.exceptions import RayActorError, RayTaskError

        from privasr.federated.backends.local import describe_failure

        try:
            update, state, error, seconds = ray.get(ref)
        except RayActorError as e:
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            return (ClientOutcome(task.slot, task.index, error=f"vanished: its Ray worker died ({msg})",
                                  seconds=time.perf_counter() - start), self._replace(ray, actor))
        except RayTaskError as e:  # the worker could not send the result back (e.g. an unpicklable state)
            cause = getattr(e, "cause", None)
            return (ClientOutcome(task.slot, task.index, error=describe_failure(cause if cause is not None else e),
                                  seconds=time.perf_counter() - start), actor)
        except Exception as e:  # e.g. the result could not be unpickled here
            return (ClientOutcome(task.slot, task.index, error=describe_failure(e),
                                  seconds=time.perf_counter() - start), actor)
        if error is not None:
            return ClientOutcome(task.slot, task.index, error=error, seconds=seconds), actor
        return ClientOutcome(task.slot, task.index, update, state, seconds=seconds), actor

    def close(self) -> None:
        """Kill the actors, forget the cached references, and shut Ray down if this backend started it."""
        try:
            import ray
        except ImportError:  # pragma: no cover
            return
        if ray.is_initialized():
            for actor in self._actors:
                try:
                    ray.kill(actor)
                except Exception:
                    pass
        self._actors = []
        self._client_refs = {}
        self._algorithm = self._algorithm_ref = None
        if self._started_ray and ray.is_initialized():
            ray.shutdown()
        self._started_ray = False
        self._actor_cls = None
