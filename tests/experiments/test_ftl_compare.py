"""Seed-pooled comparison of FTL runs (privasr ftl compare)."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("torch")

from privasr.asr.synth_an4 import synthetic_corpus  # noqa: E402
from privasr.cli import main  # noqa: E402
from privasr.errors import InputError  # noqa: E402
from privasr.experiments.ftl import load_ftl_config, run_ftl  # noqa: E402
from privasr.experiments.ftl_compare import compare_runs, pooled_difference  # noqa: E402
from privasr.metrics import wer  # noqa: E402
from privasr.metrics.bootstrap import paired_bootstrap  # noqa: E402


def _cfg(**over):
    raw = {"name": "t", "seed": 1,
           "data": {"kind": "synthetic", "speakers": 6, "utterances": 6, "test_speakers": 2, "valid_every": 3},
           "model": {"preset": "tiny", "arch": "ctc"}, "seed_model": {"epochs": 2, "lr": 0.005, "batch_size": 8},
           "rounds": 2, "federated": {"sampler": {"kind": "with_replacement", "n": 2}}, "tables": {},
           "ftl": {"client_optimizer": {"name": "sgd", "lr": 0.3}, "server": {"name": "adam", "lr": 0.005}}}
    raw.update(over)
    return load_ftl_config(raw)


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("ftl-runs")
    run_ftl(_cfg(), d / "r1")
    run_ftl(_cfg(rounds=3), d / "r2")  # the same test set (same data seed), other training
    run_ftl(_cfg(seed=2), d / "other")  # a synthetic corpus of another seed: other test utterances
    return d


def test_pooled_difference_sums_each_utterances_errors_over_the_runs():
    r = pooled_difference([[1, 0, 3], [2, 1, 0]], [[0, 0, 1], [1, 1, 1]], [4, 2, 5], resamples=300, seed=3)
    assert r["wer_a"] == pytest.approx(7 / 22) and r["wer_b"] == pytest.approx(4 / 22)
    bs = paired_bootstrap([3, 1, 3], [1, 1, 2], [8, 4, 10], resamples=300, seed=3)
    assert (r["ci_low"], r["ci_high"], r["prob_a_better"]) == (bs.ci_low, bs.ci_high, bs.prob_a_better)
    with pytest.raises(InputError, match="one count per run"):
        pooled_difference([[1, 2]], [[1, 2], [0, 0]], [3, 3])


def test_compare_runs_reports_each_run_and_the_pooled_difference(two_runs):
    r = compare_runs([two_runs / "r1", two_runs / "r2"], resamples=200)
    test = synthetic_corpus(6, 6, 2, seed=1)[1]
    refs = [u.words for u in test]
    errs = {}
    for s in ("ftl", "baseline"):
        errs[s] = [wer(refs, [h.split() for h in json.loads((two_runs / n / "results.json").read_text())["runs"][s]
                              ["hypotheses"]]) for n in ("r1", "r2")]
    m1 = json.loads((two_runs / "r1" / "results.json").read_text())["metrics"]
    assert r["per_run"][0]["wer_a"] == m1["wer"] and r["per_run"][0]["mapsswe_p"] == m1["mapsswe_p"]
    total = 2 * sum(len(w) for w in refs)
    assert r["pooled"]["wer_a"] == pytest.approx(sum(w.errors for w in errs["ftl"]) / total)
    assert r["pooled"]["wer_b"] == pytest.approx(sum(w.errors for w in errs["baseline"]) / total)
    assert r["pooled"]["ci_low"] <= r["pooled"]["difference"] <= r["pooled"]["ci_high"]
    # a system against itself: no difference at all
    same = compare_runs([two_runs / "r1"], "baseline", "baseline", resamples=50)["pooled"]
    assert same["difference"] == 0.0 and same["ci_low"] == same["ci_high"] == 0.0
    assert np.isclose(same["wer_a"], m1["wer_baseline"])


def test_compare_runs_refuses_mismatched_or_foreign_runs(two_runs, tmp_path):
    with pytest.raises(InputError, match="test utterances differ"):
        compare_runs([two_runs / "r1", two_runs / "other"])
    with pytest.raises(InputError, match="no system 'replay'"):
        compare_runs([two_runs / "r1"], "replay")
    with pytest.raises(InputError, match="no such file"):
        compare_runs([tmp_path / "missing"])
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "results.json").write_text("{not json")
    with pytest.raises(InputError, match="cannot read"):
        compare_runs([tmp_path / "bad"])
    (tmp_path / "bad" / "results.json").write_text('{"metrics": {}}')
    with pytest.raises(InputError, match="no 'runs'"):
        compare_runs([tmp_path / "bad"])


def test_cli_prints_and_writes_results(two_runs, tmp_path, capsys):
    assert main(["ftl", "compare", str(two_runs / "r1"), str(two_runs / "r2"), "--out", str(tmp_path / "c"),
                 "--resamples", "100"]) == 0
    assert "over 2 runs" in capsys.readouterr().out
    res = json.loads((tmp_path / "c" / "results.json").read_text())
    assert res["metrics"]["runs"] == 2 and res["config"]["a"] == "ftl" and res["seed"] == 0
    assert main(["ftl", "compare", str(two_runs / "r1"), "--b", "nope"]) == 2
