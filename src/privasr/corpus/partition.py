"""Partitioning utterances into clients and rounds.

* :func:`by_key` -- group by a real key (meeting, speaker, call, chapter): a :class:`~privasr.corpus.Population`.
* :func:`zipf_devices` -- simulated devices: every utterance gets a random device label drawn from a
  truncated Zipf distribution, so a few devices hold many utterances and most hold few (paper 001 assigns
  about 8K devices this way).
* :func:`time_rounds` -- a client's utterances, in time order, split evenly into ``T + 1`` groups; group
  ``t`` (1-based) is received and processed in federated round ``t - 1`` (paper 000, section 3.2).

>>> from privasr.corpus.records import Transcript
>>> us = [Transcript(f"u{i}", ("w",), client="m1", order=i) for i in range(7)]
>>> [len(g) for g in time_rounds(us, 2)]
[3, 2, 2]
>>> pop = zipf_devices(us, n_devices=3, exponent=1.0, seed=0)
>>> sum(len(c) for c in pop) == 7
True
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import replace
from typing import TypeVar

import numpy as np

from privasr.corpus.records import NBest, Population, Transcript, Utterance, order_key
from privasr.errors import ConfigError, InputError

__all__ = ["by_key", "split_by_key", "zipf_devices", "zipf_probabilities", "time_rounds", "KEYS"]

U = TypeVar("U", NBest, Transcript)

KEYS = ("client", "speaker", "utterance")
"""Named keys :func:`by_key` accepts (a function works too)."""


def by_key(
    utterances: Iterable[Utterance],
    key: str | Callable[[Utterance], Hashable | None] = "client",
    *,
    missing: str = "error",
) -> Population:
    """Group utterances into clients by ``key`` and order each client's utterances by their order key.

    ``key`` is ``"client"``, ``"speaker"``, ``"utterance"``, ``"meta:NAME"`` (a field of the record's
    ``meta``, e.g. ``"meta:chapter"``), or a function of the record.

    >>> from privasr.corpus.records import Transcript
    >>> us = [Transcript("a", ("x",), speaker="s1", meta={"chapter": "c1"}),
    ...       Transcript("b", ("y",), speaker="s2", meta={"chapter": "c1"})]
    >>> [c.id for c in by_key(us, "meta:chapter")]
    ['c1']
    """
    if isinstance(key, str) and key.startswith("meta:"):
        name = key[5:]

        def fn(u: Utterance) -> Hashable | None:
            v = u.meta.get(name)
            return None if v is None else str(v)

        return Population.group(utterances, fn, missing=missing)
    if isinstance(key, str) and key not in KEYS:
        raise ConfigError(f"unknown partition key {key!r}", expected=f"one of {list(KEYS)} or 'meta:NAME'")
    return Population.group(utterances, key, missing=missing)


def zipf_probabilities(n_devices: int, exponent: float) -> np.ndarray:
    """Truncated Zipf probabilities ``p_k`` proportional to ``k ** -exponent`` for ``k = 1..n_devices``.

    >>> zipf_probabilities(3, 1.0).round(3).tolist()
    [0.545, 0.273, 0.182]
    """
    if not isinstance(n_devices, int) or isinstance(n_devices, bool) or n_devices < 1:
        raise ConfigError(f"n_devices must be a positive integer, got {n_devices!r}")
    if not np.isfinite(exponent) or exponent < 0:
        raise ConfigError(f"Zipf exponent must be a finite number >= 0, got {exponent!r}")
    w = np.arange(1, n_devices + 1, dtype=np.float64) ** -float(exponent)
    return w / w.sum()


def zipf_devices(
    utterances: Sequence[U],
    *,
    n_devices: int,
    exponent: float = 1.0,
    seed: int = 0,
    prefix: str = "dev",
) -> Population:
    """Assign every utterance to a simulated device drawn from a truncated Zipf distribution.

    Each utterance independently gets device ``k`` with probability proportional to ``k ** -exponent``
    (``k = 1..n_devices``); devices that receive no utterance do not appear. The records are copied with
    ``client`` set to ``f"{prefix}{k:0Nd}"`` (the inputs are not modified); within a device, utterances keep
    their order keys. The same seed always gives the same assignment.

    Args:
        utterances: N-best lists or transcripts.
        n_devices: size of the device-id space (the number of non-empty devices is at most this).
        exponent: Zipf exponent ``s >= 0`` (``0`` = uniform; larger = more skewed).
        seed: random seed.
        prefix: device-id prefix.
    """
    probs = zipf_probabilities(n_devices, exponent)
    rng = np.random.default_rng(seed)
    labels = rng.choice(n_devices, size=len(utterances), p=probs)
    width = len(str(n_devices))
    relabelled = [replace(u, client=f"{prefix}{int(k) + 1:0{width}d}") for u, k in zip(utterances, labels, strict=True)]
    return Population.group(relabelled, "client")


def time_rounds(utterances: Iterable[U], n_rounds: int) -> list[tuple[U, ...]]:
    """Split one client's utterances, sorted by order key, evenly into ``n_rounds + 1`` contiguous groups.

    Group ``t`` (``t = 1..T+1``, list index ``t - 1``) holds the utterances received and processed in
    federated round ``t - 1``: group 1 is decoded with the initial model, group ``T + 1`` after the last
    round. Sizes differ by at most one, earlier groups larger (``numpy.array_split``); with fewer
    utterances than groups, the last groups are empty.
    """
    if not isinstance(n_rounds, int) or isinstance(n_rounds, bool) or n_rounds < 0:
        raise ConfigError(f"number of rounds must be an integer >= 0, got {n_rounds!r}")
    ordered = sorted(utterances, key=order_key)
    bounds = np.array_split(np.arange(len(ordered)), n_rounds + 1)
    return [tuple(ordered[int(b[0]) : int(b[-1]) + 1]) if len(b) else () for b in bounds]


def split_by_key(records: Sequence[NBest], key: str = "speaker", dev: str = "even") -> tuple[list[NBest], list[NBest],
                                                                                            list[str], list[str]]:
    """Split N-best lists by speaker (or client): sort the distinct keys (numbers numerically), the keys at
    even (``dev="even"``) or odd positions form dev, the others test. Returns ``(dev, test, dev_keys,
    test_keys)``; records keep their order.

    >>> recs = [NBest(f"u{i}", (), speaker=s) for i, s in enumerate(["10", "9", "10", "2"])]
    >>> d, t, dk, tk = split_by_key(recs)
    >>> [r.utt_id for r in d], dk, tk
    (['u0', 'u2', 'u3'], ['2', '10'], ['9'])
    """
    from privasr.corpus.formats._common import natural_key

    vals = []
    for r in records:
        v = r.speaker if key == "speaker" else r.client
        if v is None:
            raise InputError(f"utterance {r.utt_id} has no {key}", expected=f"a {key} on every utterance to split by")
        vals.append(v)
    keys = sorted(set(vals), key=natural_key)
    want = 0 if dev == "even" else 1
    dev_keys = [k for i, k in enumerate(keys) if i % 2 == want]
    dk = set(dev_keys)
    d = [r for r, v in zip(records, vals, strict=True) if v in dk]
    t = [r for r, v in zip(records, vals, strict=True) if v not in dk]
    return d, t, dev_keys, [k for k in keys if k not in dk]
