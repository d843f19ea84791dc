"""Small clients shared by the Flower backend's tests."""

from __future__ import annotations

import numpy as np


def fmp_toy(n_clients=3, n_groups=3, v=40, seed=15):
    """FMP (paper 000) over random N-best clients: its clients keep caches and their choices as state."""
    from privasr.federated.algorithms import FmpAlgorithm, FmpClient, FmpConfig, FmpUtterance

    rng = np.random.default_rng(seed)
    clients = []
    for c in range(n_clients):
        groups = []
        for g in range(n_groups):
            utts = []
            for k in range(3):
                hyps = tuple(rng.integers(0, v, size=int(rng.integers(0, 7))) for _ in range(5))
                utts.append(FmpUtterance(f"c{c}g{g}u{k}", hyps, np.sort(rng.normal(size=5))[::-1], 0.7))
            groups.append(tuple(utts))
        clients.append(FmpClient(f"client{c}", tuple(groups)))
    u = np.random.default_rng(0).uniform(0.5, 2.0, size=v)
    return FmpAlgorithm(FmpConfig(), u / u.sum()), clients
