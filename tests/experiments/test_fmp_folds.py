"""Cross-validated FMP (``fmp run --folds K``): every meeting a test client once with settings tuned without it,
the NNLM built once, DP noise draws with the configured epsilon each."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from privasr.cli import main  # noqa: E402
from privasr.errors import ConfigError  # noqa: E402
from privasr.experiments import fmp_folds  # noqa: E402
from privasr.experiments.fmp import load_fmp_config, run_fmp  # noqa: E402
from privasr.experiments.fmp_folds import run_fmp_folds  # noqa: E402

from .test_fmp import _raw, corpus  # noqa: E402,F401


def test_each_meeting_is_tested_once_with_settings_tuned_without_it(corpus, tmp_path, monkeypatch):  # noqa: F811
    seen, builds = [], []
    real_tune, real_base = fmp_folds.tune_lam, fmp_folds.prepare_base

    def spy_tune(cfg, p, dev_clients, norm):
        seen.append(({nb.client for nb in p.dev}, {nb.client for nb in p.test}))
        return real_tune(cfg, p, dev_clients, norm)

    def spy_base(*a, **k):
        builds.append(1)
        return real_base(*a, **k)

    monkeypatch.setattr(fmp_folds, "tune_lam", spy_tune)
    monkeypatch.setattr(fmp_folds, "prepare_base", spy_base)
    m = run_fmp_folds(load_fmp_config(_raw(corpus, tmp_path, folds=2)), tmp_path / "out")
    assert len(builds) == 1 and len(seen) == 2
    for dev, test in seen:
        assert dev and test and not dev & test
    assert seen[0][1] | seen[1][1] == seen[0][0] | seen[0][1]  # the test sides cover every meeting
    res = json.loads((tmp_path / "out" / "results.json").read_text())
    assert res["runner"] == "fmp-folds" and len(res["folds"]) == 2
    assert m["test_utterances"] == sum(f["test_utterances"] for f in res["folds"])
    assert m["fold_rel_change_min"] <= m["fold_rel_change_max"] and "lam" in res["folds"][0]
    assert "| **pooled** |" in (tmp_path / "out" / "report.md").read_text()


def test_dp_draws_use_distinct_seeds_and_report_each_draws_epsilon(corpus, tmp_path):  # noqa: F811
    pytest.importorskip("dp_accounting")
    raw = _raw(corpus, tmp_path, folds=2, dp_draws=3, dp={"epsilon": 0.5, "unit": "utterance", "cap": 1.0})
    m = run_fmp_folds(load_fmp_config(raw), tmp_path / "out")
    res = json.loads((tmp_path / "out" / "results.json").read_text())
    assert m["dp_draws"] == 3 and len(m["draw_mapsswe_p"]) == 3
    assert m["epsilon"] == pytest.approx(0.5, rel=1e-3)  # per draw and per fold, not multiplied
    for f in res["folds"]:
        assert len(f["draws"]) == 3 and all(d["epsilon"] == pytest.approx(0.5, rel=1e-3) for d in f["draws"])
    # the draws' noise differs (distinct seeds): not every draw chooses the same words
    wers = {round(d["wer"], 12) for f in res["folds"] for d in f["draws"]}
    assert len(wers) > 1
    assert m["draw_wer_min"] <= m["wer"] <= m["draw_wer_max"]


@pytest.mark.parametrize(("over", "match"), [
    ({"folds": 2, "dp_draws": 2}, "dp_draws"),
    ({"dp_draws": 2, "dp": {"epsilon": 1.0}}, "dp_draws"),
    ({"folds": 2, "tables": {"rounds": [1]}}, "tables"),
    ({"folds": 1}, "folds"),
    ({"folds": 2, "fold_unit": "speaker"}, "fold_unit"),
])
def test_fold_config_errors(corpus, tmp_path, over, match):  # noqa: F811
    with pytest.raises(ConfigError, match=match):
        load_fmp_config(_raw(corpus, tmp_path, **over))


def test_plain_runs_refuse_folds_and_the_command_takes_them(corpus, tmp_path, capsys):  # noqa: F811
    with pytest.raises(ConfigError, match="run_fmp_folds"):
        run_fmp(load_fmp_config(_raw(corpus, tmp_path, folds=2)), tmp_path / "o")
    with pytest.raises(ConfigError, match="oracle_cache"):
        run_fmp_folds(load_fmp_config(_raw(corpus, tmp_path, folds=2, oracle_cache=True)), tmp_path / "o2")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(json.dumps(_raw(corpus, tmp_path)))
    assert main(["fmp", "run", "--config", str(cfg), "--folds", "2", "--out", str(tmp_path / "cli")]) == 0
    assert "pooled over 2 folds" in capsys.readouterr().out
