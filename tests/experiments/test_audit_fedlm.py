"""The fedlm stages of the privacy audit on the tiny synthetic corpus: word sets and canary exposure."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from privasr.errors import ConfigError  # noqa: E402
from privasr.experiments.audit_fedlm import (  # noqa: E402
    audit_exposure,
    audit_wordsets,
    canary_format,
    exposure_report,
    load_fedlm_audit_settings,
    prepare_fedlm,
    wordsets_report,
)
from privasr.lm.neural.vocab import Vocabulary  # noqa: E402
from privasr.privacy.audit import DIGIT_WORDS  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    from privasr.synth import SynthConfig, generate

    d = tmp_path_factory.mktemp("synth")
    generate(SynthConfig.preset("tiny", seed=1)).write(d)
    return d


def _fedlm_config(corpus: Path, cache: Path) -> dict:
    """A tiny fedlm runner config (tests/experiments/test_fedlm.py's): the tiny corpus's 3 test clients, a
    tiny-transformer pre-trained one epoch on the background text; FedAvg with a large client step so that 2
    rounds memorise what a client repeats."""
    background = str(corpus / "text" / "background.txt")
    return {"name": "audit-fedlm-test", "seed": 0,
            "data": {"kind": "nbest", "dev": str(corpus / "nbest" / "test.jsonl"),
                     "test": str(corpus / "nbest" / "dev.jsonl")},
            "clients": {"key": "client"},
            "nnlm": {"neural": {"train": {"text": background, "valid": background, "preset": "tiny-transformer",
                                          "seed": 0, "options": {"max_epochs": 1, "batch_size": 32, "lr": 0.01,
                                                                 "patience": 0, "amp": False}}}},
            "cache_dir": str(cache),
            "fedlm": {"loss": "token", "batch_size": 8, "client_lr": 0.5, "server": {"name": "adam", "lr": 0.01}},
            "rounds": 2, "federated": {"backend": "local", "sampler": "all"}}


def _section(corpus: Path, cache: Path, **over) -> dict:
    return {"config": _fedlm_config(corpus, cache), "set": {"fedlm": {"server": "fedavg", "client_lr": 1.0}},
            "canaries": {"n": 3, "repetitions": [1, 8], "candidates": 200}, "noise_multipliers": [0.0, 1.0],
            "cohort": 2, **over}


@pytest.fixture(scope="module")
def prepared(corpus, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("audit")
    torch.set_num_threads(1)
    s = load_fedlm_audit_settings(_section(corpus, tmp / "cache"))
    fed, vocab, info = prepare_fedlm(s, tmp / "out", 0)
    return s, fed, vocab, info


def test_prepare_applies_the_overrides_and_the_audit_seed(prepared):
    s, fed, vocab, info = prepared
    assert s.clip_norm == 0.5  # the config sets no fedlm.clip_norm: the default
    assert fed.algorithm.config.server == {"name": "fedavg"} and fed.algorithm.config.client_lr == 1.0
    assert fed.seed == 0 and fed.rounds == 2 and len(fed.clients) == info["clients"] == 3
    assert info["vocab_size"] == len(vocab) and info["fedlm_config"]["fedlm"]["server"] == "fedavg"
    json.dumps(info, allow_nan=False)


def test_word_sets_are_read_exactly_without_noise_and_not_under_it(prepared):
    s, fed, _, _ = prepared
    w = audit_wordsets(fed, s, 0)
    json.dumps(w, allow_nan=False)
    p = w["per_client"]
    assert w["clients"] == 3
    assert (p["precision_min"], p["recall_min"], p["full_recall_share"]) == (1.0, 1.0, 1.0)
    co = w["cohort"]  # 3 clients, cohorts of 2: one cohort; the sum reveals the union, not who said what
    assert (co["size"], co["cohorts"]) == (2, 1)
    assert (co["union_precision"], co["union_recall"]) == (1.0, 1.0)
    assert 0.0 < co["attribution_precision"] < 1.0
    # one noisy release of a lone client (z = 1 at C = 0.5, a 3-sd read-off) hides most of its words
    [noisy] = w["noisy"]
    assert noisy["noise_multiplier"] == 1.0 and noisy["clip_norm"] == 0.5
    assert noisy["recall_mean"] < 0.5
    assert "| each client's own delta (3 clients) | 1.000 (min 1.000) |" in "\n".join(wordsets_report(w))


def test_exposure_rises_with_repetitions_without_dp_and_dp_rows_report_epsilon(prepared):
    s, fed, vocab, _ = prepared
    e = audit_exposure(fed, s, 0)
    json.dumps(e, allow_nan=False)
    # the tiny corpus's vocabulary has no digit words: the slots take 10 of its words
    f = e["format"]
    assert f["source"] == "vocabulary" and len(f["alphabet"]) == 10 and all(w in vocab for w in f["alphabet"])
    assert f["space_size"] == 10**6 and f["oov_template_words"] == ["pin"]
    assert len(e["members"]) == 1 and e["max_exposure"] == pytest.approx(math.log2(201))
    assert [r["setting"] for r in e["rows"]] == ["no DP", "clipping only", "DP"]
    no_dp, clip, dp = e["rows"]
    # measured (audit seeds 0-5): 8 copies reach 6.3-7.7 bits of at most 7.65, 1 copy 1.0-2.4, baseline 0.4-1.4
    assert no_dp["exposure"]["8"] > no_dp["baseline"] + 3.0
    assert no_dp["exposure"]["8"] > no_dp["exposure"]["1"] + 2.0
    assert all(len(v) == 3 for v in no_dp["per_canary"].values())
    assert (no_dp["epsilon"], no_dp["delta"], no_dp["clip_norm"]) == (None, None, None)
    assert clip["epsilon"] == "inf" and clip["noise_multiplier"] == 0.0
    assert 0 < dp["epsilon"] < 100 and dp["delta"] == 1e-5 and dp["clip_norm"] == 0.5
    # the noise drowns the model's memory of the canaries
    assert dp["exposure"]["8"] < no_dp["exposure"]["8"] - 2.0
    table = exposure_report(e)
    assert table[2] == "| setting | clip | noise | epsilon | 1x | 8x | baseline |"
    assert table[-2].startswith(f"| DP | 0.5 | 1 | {dp['epsilon']:.3g} (delta 1e-05) |")


def test_canary_slots_are_digit_words_when_the_vocabulary_has_them():
    rng = np.random.default_rng(0)
    fmt, source = canary_format(Vocabulary.build([["my", "pin", "is", *DIGIT_WORDS, "x"]]), "my pin is {} {}", rng)
    assert source == "digits" and fmt.alphabet == DIGIT_WORDS
    # one digit word missing: ten ordinary words, none special nor of the template
    words = ["my", "is", *DIGIT_WORDS[1:], "x", "y"]
    fmt, source = canary_format(Vocabulary.build([words]), "my pin is {} {}", rng)
    assert source == "vocabulary" and len(set(fmt.alphabet)) == 10
    assert set(fmt.alphabet) <= set(words) - {"my", "is"}
    with pytest.raises(ConfigError, match="canary slots"):
        canary_format(Vocabulary.build([list("abcdefgh")]), "{}", rng)


def test_bad_settings_name_the_key(corpus, tmp_path, prepared):
    cache = tmp_path / "cache"
    cases = {
        "fedlm.canaries.repetitions": {"canaries": {"repetitions": [0, 4]}},
        "fedlm.canaries.template": {"canaries": {"template": "my pin is"}},
        "fedlm.canaries.candidates": {"canaries": {"template": "pin {} {}", "candidates": 99}},
        "fedlm.canaries.n": {"canaries": {"n": 0}},
        "fedlm.noise_multipliers": {"noise_multipliers": [-1.0]},
        "fedlm.backend": {"backend": "cloud"},
        "fedlm.cohort": {"cohort": 0},
        "fedlm.clip_norm": {"clip_norm": 0},
        "fedlm.canaries.size": {"canaries": {"size": 3}},
    }
    for key, over in cases.items():
        with pytest.raises(ConfigError, match=f"'{key}'"):
            load_fedlm_audit_settings(_section(corpus, cache, **over))
    with pytest.raises(ConfigError, match="'fedlm.noise_multipliers' is empty and no_dp is false"):
        load_fedlm_audit_settings(_section(corpus, cache, noise_multipliers=[], no_dp=False))
    # the fedlm config: its own errors, under this section's key, and a missing file by its path
    with pytest.raises(ConfigError, match=r"config key 'fedlm.config': config key 'rounds' is 0"):
        load_fedlm_audit_settings(_section(corpus, cache, set={"rounds": 0}))
    with pytest.raises(ConfigError, match="no such config file"):
        load_fedlm_audit_settings(_section(corpus, cache, config=str(tmp_path / "none.yaml")))
    with pytest.raises(ConfigError, match="'fedlm.config' is 3"):
        load_fedlm_audit_settings(_section(corpus, cache, config=3))
    with pytest.raises(ConfigError, match="'fedlm.config' is missing"):
        load_fedlm_audit_settings({})
    # a YAML file with dotted and nested overrides; the section's clip_norm wins over the config's
    import yaml

    (tmp_path / "fedlm.yaml").write_text(yaml.safe_dump(_fedlm_config(corpus, cache)))
    s = load_fedlm_audit_settings(_section(corpus, cache, config=str(tmp_path / "fedlm.yaml"),
                                           set={"fedlm.clip_norm": 2.0, "fedlm": {"weighting": "uniform"}}))
    assert s.clip_norm == 2.0
    assert load_fedlm_audit_settings({**_section(corpus, cache), "clip_norm": 0.1}).clip_norm == 0.1
    # more member clients than the federation has
    _, fed, _, _ = prepared
    s = load_fedlm_audit_settings(_section(corpus, cache, canaries={"clients": 4}))
    with pytest.raises(ConfigError, match=r"'fedlm.canaries.clients' is 4 but the federation has 3 clients"):
        audit_exposure(fed, s, 0)


@pytest.mark.slow
def test_word_sets_on_ray_match_local(prepared):
    pytest.importorskip("ray")
    s, fed, _, _ = prepared
    from dataclasses import replace

    local = audit_wordsets(fed, s, 0)
    ray = audit_wordsets(fed, replace(s, backend="ray", backend_options={"num_workers": 1}), 0)
    for k in ("per_client", "cohort", "noisy"):
        assert ray[k] == local[k]
