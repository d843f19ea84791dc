"""Acceptance: a real deployment (SuperLink and SuperNodes as processes, started and stopped here) with TLS,
authenticated nodes and SecAgg+ runs FMP and fedlm on the demo corpus to the local backend's result within the
quantisation error. Slow (real processes: a ClientApp process per message): ``pytest -m slow`` on this file.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("flwr")

from privasr.federated.backends.flower import run_flower  # noqa: E402
from privasr.federated.loop import run_federated  # noqa: E402
from privasr.federated.sampling import AllClients  # noqa: E402
from privasr.federated.secagg import SecAggSettings  # noqa: E402

SECURE = SecAggSettings(enabled=True)


def _slow(request, what):
    if "slow" not in (request.config.getoption("markexpr") or ""):
        pytest.skip(f"{what}: run with -m slow")


def _demo_corpus():
    from privasr.synth import SynthConfig, generate

    return generate(SynthConfig.preset("tiny", seed=0))


def fmp_on_demo(rounds: int = 2):
    """FMP's algorithm and test clients from the demo corpus, as the demo builds them (first-pass totals)."""
    from privasr.federated.algorithms.fmp import FmpAlgorithm, FmpConfig
    from privasr.federated.algorithms.fmp_data import WordIds, background_unigram, build_clients
    from privasr.rescore import Combination, score_table

    corpus = _demo_corpus()
    text = [tuple(s.split()) for s in corpus.background if s.strip()]
    vocab = WordIds.build(text)
    comb = Combination(prior="am", lms=("lm",))
    table = score_table(corpus.test, {})
    clients = build_clients(corpus.test, comb.totals(table, {"lm": 1.0, "word_penalty": 0.0}), table.offsets, vocab, "client", rounds)
    alg = FmpAlgorithm(FmpConfig.from_dict({"alpha": 0.5, "beta": 0.25, "sigma": 1.0, "smoothing": 1.0,
                                            "lam": 1.0}), background_unigram(text, vocab))
    return alg, clients


def fedlm_on_demo():
    """fedlm (DP-FedAvg's clipping, FedAvg server) of a tiny transformer on the demo corpus's test transcripts."""
    from privasr.federated.algorithms.fedlm import FedLmAlgorithm, FedLmClient, FedLmConfig
    from privasr.lm.neural.models import NeuralLMConfig
    from privasr.lm.neural.vocab import Vocabulary

    corpus = _demo_corpus()
    vocab = Vocabulary.build([s.split() for s in corpus.background])
    by_client: dict[str, list[tuple[int, ...]]] = {}
    for nb in corpus.test:
        ids = tuple(vocab.encode(list(nb.ref or ())))
        if ids:
            by_client.setdefault(str(nb.client), []).append(ids)
    clients = [FedLmClient(c, tuple(s)) for c, s in sorted(by_client.items())]
    alg = FedLmAlgorithm(FedLmConfig(clip_norm=0.5, weighting="uniform", server="fedavg", local_epochs=1),
                         NeuralLMConfig.preset("tiny-transformer"), vocab)
    return alg, clients


def _compare(kind, result, local, bound):
    n = len(local.client_states) or 3
    step = 2 * bound / 2 ** SECURE.quantization_bits
    if kind == "fmp":
        assert np.allclose(result.state["sum"], local.state["sum"], rtol=0, atol=len(result.history) * n * step)
        for i, st in local.client_states.items():
            assert result.client_states[i]["chosen"] == st["chosen"]
    else:
        for k, v in local.state["params"].items():  # one FedAvg step: the mean of n errors below a step each
            assert np.allclose(result.state["params"][k], v, rtol=0, atol=step + 1e-7), k


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["fmp", "fedlm"])
def test_secure_deployment_matches_local(request, kind):
    _slow(request, "a deployment with TLS, node authentication and SecAgg+ (minutes)")
    alg, clients = fmp_on_demo() if kind == "fmp" else fedlm_on_demo()
    rounds = 2 if kind == "fmp" else 1
    kw = dict(rounds=rounds, sampler=AllClients(), seed=3)
    local = run_federated(alg, clients, **kw)
    result = run_flower(alg, clients, mode="deployment", secagg=SECURE, run_timeout=900, **kw)
    assert [h.reported for h in result.history] == [len(clients)] * rounds
    assert all(h.metrics["secagg_clipped"] == 0 for h in result.history)
    _compare(kind, result, local, alg.secure_bound(None))


@pytest.mark.slow
def test_secure_deployment_killed_and_resumed_matches_local(request, tmp_path):
    """FMP stopped after round 1 and resumed with new SuperLink and SuperNode processes: the nodes reload
    their caches from their own folders, and the result is the uninterrupted local one."""
    _slow(request, "two deployments with TLS, node authentication and SecAgg+ (minutes)")
    alg, clients = fmp_on_demo(rounds=2)
    kw = dict(sampler=AllClients(), seed=3)
    local = run_federated(alg, clients, rounds=3, **kw)
    ck, nodes = tmp_path / "ck", tmp_path / "devices"
    first = run_flower(alg, clients, rounds=1, mode="deployment", secagg=SECURE, run_timeout=900,
                       checkpoint_dir=ck, node_state_dir=nodes, collect_client_states=False, **kw)
    assert len(first.history) == 1 and first.client_states == {}
    resumed = run_flower(alg, clients, rounds=3, mode="deployment", secagg=SECURE, run_timeout=900,
                         checkpoint_dir=ck, resume=True, node_state_dir=nodes, **kw)
    assert resumed.resumed_from == 1 and [h.round for h in resumed.history] == [0, 1, 2]
    _compare("fmp", resumed, local, alg.secure_bound(None))
