"""A serve kit of FMP on the tiny synthetic corpus (the operator's side, run once per session) and helpers that
make device folders from the test clients' N-best lists."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("flwr")


def fmp_config(corpus: Path, cache: Path, **extra):
    from privasr.bench.device_round import synthetic_fmp_config

    config = synthetic_fmp_config(corpus, cache, name="fmp-devices", rounds=2)
    config.update(extra)
    return config


@pytest.fixture(scope="session")
def synth_corpus(tmp_path_factory):
    from privasr.synth import SynthConfig, generate

    corpus = tmp_path_factory.mktemp("device-corpus")
    generate(SynthConfig.preset("tiny", seed=1)).write(corpus)
    return corpus


@pytest.fixture(scope="session")
def serve_kit(synth_corpus, tmp_path_factory):
    """``privasr serve fmp`` of the synthetic corpus, in this process: (kit folder, federation, kit.json, the
    test N-best lists)."""
    from privasr.corpus.load import load_nbest
    from privasr.experiments.fmp import load_fmp_config, operator_side
    from privasr.federated.backends.flower_serve import write_serve_kit

    root = tmp_path_factory.mktemp("serve")
    cfg = load_fmp_config(fmp_config(synth_corpus, root / "cache"))
    test = load_nbest(synth_corpus / "nbest" / "test.jsonl")
    from privasr.corpus.records import Population

    n = len(Population.group(test, key="client"))
    federation, write = operator_side(cfg, root / "prepare", n)
    kit = write_serve_kit(root / "kit", federation, write)
    return kit, federation, json.loads((kit / "kit.json").read_text()), test
