"""Cross-validation folds over clients (meetings): which meetings tune a system and which test it.

Every reported figure of a dev/test split rests on one choice of meetings. :func:`client_folds` rotates it: the
distinct client ids (sorted, then permuted by the seed) are cut into ``K`` groups of near-equal size; fold ``k``
tests on group ``k`` and tunes on the other groups. Every client is tested in exactly one fold and never tunes
the fold that tests it, so the folds' test outputs pool into one test set of every utterance, each scored by a
system tuned without its meeting.

>>> folds = client_folds(["m1", "m2", "m3", "m4", "m5"], 2, seed=0)
>>> [len(f.test) for f in folds], sorted(m for f in folds for m in f.test)
([3, 2], ['m1', 'm2', 'm3', 'm4', 'm5'])
>>> all(not set(f.dev) & set(f.test) for f in folds)
True
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from privasr.corpus.records import NBest, Transcript
from privasr.errors import ConfigError, InputError

__all__ = ["Fold", "UNITS", "client_folds", "series_of", "split_fold"]

U = TypeVar("U", NBest, Transcript)


@dataclass(frozen=True)
class Fold:
    """One fold: its index (0-based), the clients that tune (``dev``) and the clients that test (``test``),
    each sorted."""

    index: int
    dev: tuple[str, ...]
    test: tuple[str, ...]

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form."""
        return {"fold": self.index, "dev": list(self.dev), "test": list(self.test)}


UNITS = ("meeting", "series")
"""What a fold is made of: single meetings (clients), or whole meeting series (:func:`series_of`)."""

_SERIES = re.compile(r"^(.*\d)[a-z]$")


def series_of(client: str) -> str:
    """An AMI-style meeting's series: the id without its trailing session letter (``ES2004a`` -> ``ES2004``; the
    four meetings of a series share their speakers and their design task). Ids without one are their own series.

    >>> series_of("ES2004a"), series_of("IS1009d"), series_of("call-17")
    ('ES2004', 'IS1009', 'call-17')
    """
    m = _SERIES.match(client)
    return m.group(1) if m else client


def client_folds(clients: Iterable[str], k: int, *, seed: int, unit: str = "meeting") -> tuple[Fold, ...]:
    """``k`` folds over the distinct ``clients``: a seeded permutation of the sorted units (clients, or with
    ``unit="series"`` their :func:`series_of`) cut into ``k`` groups (sizes differ by at most one unit, larger
    groups first); fold ``i`` tests the clients of group ``i`` and tunes on the rest. Folds by series keep a
    series's meetings on one side, as a dev/test split of AMI by series does.

    Deterministic in ``(set(clients), k, seed, unit)``.

    Raises:
        ConfigError: ``k`` is not an integer >= 2, ``unit`` is unknown, or there are fewer than ``k`` units.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 2:
        raise ConfigError(f"folds={k!r}", expected="an integer >= 2")
    if unit not in UNITS:
        raise ConfigError(f"fold unit {unit!r}", expected=f"one of {', '.join(UNITS)}")
    ids = sorted(set(clients))
    key = series_of if unit == "series" else (lambda c: c)
    units = sorted({key(c) for c in ids})
    if len(units) < k:
        what = "series" if unit == "series" else "clients"
        raise ConfigError(f"{k} folds over {len(units)} {what}", expected=f"at least {k} distinct {what}")
    perm = np.random.default_rng([int(seed), 42]).permutation(len(units))
    parts = [{units[int(i)] for i in part} for part in np.array_split(perm, k)]
    groups = [sorted(c for c in ids if key(c) in part) for part in parts]
    return tuple(Fold(i, tuple(sorted(c for j, g in enumerate(groups) if j != i for c in g)), tuple(g))
                 for i, g in enumerate(groups))


def split_fold(records: Sequence[U], fold: Fold, *, what: str = "records") -> tuple[list[U], list[U]]:
    """``(dev, test)``: the records of ``fold``'s tuning clients and of its test clients, in their given order.

    Raises:
        InputError: a record has no client, or a client belongs to neither side (not one of the fold's ids).
    """
    dev_ids, test_ids = set(fold.dev), set(fold.test)
    dev: list[U] = []
    test: list[U] = []
    for r in records:
        if r.client is None:
            raise InputError(f"utterance {r.utt_id} of the {what} has no client (meeting)",
                             expected="a client on every utterance: folds are made of clients")
        if r.client in test_ids:
            test.append(r)
        elif r.client in dev_ids:
            dev.append(r)
        else:
            raise InputError(f"utterance {r.utt_id} belongs to client {r.client!r}, which no fold has",
                             expected="folds made from these records' clients")
    return dev, test
