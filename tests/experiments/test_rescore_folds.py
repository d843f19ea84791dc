"""Cross-validated rescoring (``rescore run --folds K``): every utterance rescored once by weights tuned without
its meeting, LMs built once for all folds, pooled figures and their spread."""

from __future__ import annotations

import dataclasses
import json

import pytest

from privasr.cli import main
from privasr.config import apply_overrides
from privasr.corpus.formats.nbest_jsonl import write_nbest
from privasr.errors import ConfigError, InputError
from privasr.experiments import rescore_folds
from privasr.experiments.rescore import load_config, run_rescore
from privasr.experiments.rescore_folds import run_rescore_folds

from .conftest import make_task, write_toy_arpa


@pytest.fixture()
def files(tmp_path):
    """dev: 3 meetings, test: 5 meetings (distinct ids), and a toy unigram preferring the right words."""
    for part, seed, n, meetings in (("dev", 1, 60, 3), ("test", 2, 100, 5)):
        recs = [dataclasses.replace(nb, client=f"{part}{nb.order % meetings}")
                for nb in make_task(seed, n, prefix=part[0])]
        write_nbest(tmp_path / f"{part}.jsonl", recs)
    write_toy_arpa(tmp_path / "toy.arpa")
    return tmp_path


def _raw(d, **over):
    raw = {"name": "folds-test", "data": {"dev": str(d / "dev.jsonl"), "test": str(d / "test.jsonl")},
           "lms": {"toy": str(d / "toy.arpa")}, "folds": 4,
           "search": {"ranges": {"lm": [0, 2, 1], "toy": [0, 10, 0.5], "word_penalty": [-3, 3, 1]}},
           "eval": {"bootstrap_resamples": 100}}
    return apply_overrides(raw, over)


def test_every_utterance_is_rescored_once_by_weights_tuned_without_its_meeting(files, tmp_path, monkeypatch):
    seen = []
    real_tune, real_build = rescore_folds.tune_weights, rescore_folds.build_lms
    builds = []

    def spy_tune(cfg, data, scores, have_lms):
        seen.append(({nb.client for nb in data.dev}, {nb.client for nb in data.test}))
        return real_tune(cfg, data, scores, have_lms)

    def spy_build(*a, **k):
        builds.append(1)
        return real_build(*a, **k)

    monkeypatch.setattr(rescore_folds, "tune_weights", spy_tune)
    monkeypatch.setattr(rescore_folds, "build_lms", spy_build)
    m = run_rescore_folds(load_config(_raw(files)), tmp_path / "out")
    assert len(builds) == 1  # the LMs are built once for every fold
    assert len(seen) == 4
    for dev, test in seen:
        assert dev and test and not dev & test and len(dev | test) == 8
    assert sorted(c for _, t in seen for c in t) == sorted({f"dev{i}" for i in range(3)} |
                                                           {f"test{i}" for i in range(5)})
    assert m["test_utterances"] == 160 and m["test_clients"] == 8 and m["folds"] == 4
    res = json.loads((tmp_path / "out" / "results.json").read_text())
    assert res["runner"] == "rescore-folds" and len(res["folds"]) == 4
    assert sum(r["test_utterances"] for r in res["folds"]) == 160
    assert m["fold_rel_change_min"] <= m["wer_rel_change"] <= m["fold_rel_change_max"]
    assert m["wer"] < m["wer_baseline"] and m["folds_improved"] >= 3  # the toy LM knows the right words
    assert m["meeting_bootstrap_ci_low"] <= m["bootstrap_diff"] <= m["meeting_bootstrap_ci_high"]
    assert len(res["per_client"]) == 8
    # each meeting's headroom: its N-best oracle is never above what either system chose
    assert all(r["wer_oracle"] <= min(r["wer_system"], r["wer_baseline"]) for r in res["per_client"])
    assert m["wer_oracle"] <= m["wer"]
    report = (tmp_path / "out" / "report.md").read_text()
    assert "| **pooled** |" in report and "plots/folds.png" in report
    # deterministic from the seed; another seed draws other folds
    again = run_rescore_folds(load_config(_raw(files)), tmp_path / "again")
    assert again["wer"] == m["wer"]
    other = json.loads((tmp_path / "again" / "results.json").read_text())["fold_split"]
    assert other == res["fold_split"]
    run_rescore_folds(load_config(_raw(files, seed=3)), tmp_path / "seed3")
    assert json.loads((tmp_path / "seed3" / "results.json").read_text())["fold_split"] != res["fold_split"]


def test_bad_fold_settings_and_data_are_clear_errors(files, tmp_path):
    with pytest.raises(ConfigError, match="folds"):
        load_config(_raw(files, folds=1))
    with pytest.raises(ConfigError, match="at least 9 distinct clients"):
        run_rescore_folds(load_config(_raw(files, folds=9)), tmp_path / "o")
    with pytest.raises(ConfigError, match="run_rescore_folds"):
        run_rescore(load_config(_raw(files)), tmp_path / "o2")
    with pytest.raises(InputError, match="both dev and test"):
        run_rescore_folds(load_config(_raw(files, **{"data.dev": str(files / "test.jsonl")})), tmp_path / "o3")


def test_the_command_takes_folds(files, tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    raw = _raw(files)
    del raw["folds"]
    cfg.write_text(json.dumps(raw))
    assert main(["rescore", "run", "--config", str(cfg), "--folds", "3", "--out", str(tmp_path / "cli")]) == 0
    assert "pooled over 3 folds" in capsys.readouterr().out
    assert json.loads((tmp_path / "cli" / "results.json").read_text())["metrics"]["folds"] == 3
