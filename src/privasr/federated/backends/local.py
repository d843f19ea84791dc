"""The ``local`` backend: clients run one after another in this process (deterministic; the default).

A client that raises is reported as failed with the exception's message; one that takes longer than the
round's ``timeout`` is dropped after it returns (a sequential backend cannot interrupt it); a client that
raises :class:`ClientVanished` is treated as a device that went away.

>>> import numpy as np
>>> from privasr.federated.core import ClientTask, Update
>>> class Count:
...     def client_update(self, payload, client, state, rng):
...         return Update({"n": np.array([len(client)])}), None
>>> out = list(LocalBackend().run(Count(), None, [ClientTask(0, 0, "abc", None, (0,))]))
>>> out[0].ok, out[0].update.arrays["n"].tolist()
(True, [3])
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

from privasr.federated.core import ClientOutcome, ClientTask, run_client

__all__ = ["LocalBackend", "ClientVanished", "describe_failure"]


class ClientVanished(Exception):
    """Raised (in simulation) by a client that disappears mid-round, like a device that went offline."""


def describe_failure(e: BaseException, *, with_message: bool = True) -> str:
    """One line naming what went wrong on a client.

    With ``with_message=False`` only the exception's type is named: that is what crosses the network from a
    real device (Flower), since an exception's message could quote the client's data.

    >>> describe_failure(ValueError("bad word 'secret'")), describe_failure(ValueError("x"), with_message=False)
    ("raised ValueError: bad word 'secret'", 'raised ValueError')
    """
    if isinstance(e, ClientVanished):
        return f"vanished: {e}" if str(e) and with_message else "vanished"
    msg = str(e).splitlines()[0] if str(e) and with_message else ""
    return f"raised {type(e).__name__}: {msg}" if msg else f"raised {type(e).__name__}"


class LocalBackend:
    """Run every client sequentially, in sample order (see the module docstring)."""

    name = "local"

    def run(self, algorithm: Any, payload: Any, tasks: Sequence[ClientTask],
            timeout: float | None = None) -> Iterator[ClientOutcome]:
        """Yield one :class:`ClientOutcome` per task, in order."""
        for task in tasks:
            t0 = time.perf_counter()
            try:
                update, state = run_client(algorithm, payload, task)
            except Exception as e:  # a failing client must not stop the round
                yield ClientOutcome(task.slot, task.index, error=describe_failure(e),
                                    seconds=time.perf_counter() - t0)
                continue
            dt = time.perf_counter() - t0
            if timeout is not None and dt > timeout:
                yield ClientOutcome(task.slot, task.index, error=f"timed out ({dt:.3g} s > {timeout:g} s)", seconds=dt)
            else:
                yield ClientOutcome(task.slot, task.index, update, state, seconds=dt)

    def close(self) -> None:
        """Nothing to release."""
