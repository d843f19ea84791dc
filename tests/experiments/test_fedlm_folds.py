"""Cross-validated fedlm (``fedlm run --folds K``): every meeting tested once by a model fine-tuned on the other
meetings only, the NNLM built once, token weighting compared with all utterances pooled."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from privasr.cli import main  # noqa: E402
from privasr.errors import ConfigError  # noqa: E402
from privasr.experiments import fedlm_folds  # noqa: E402
from privasr.experiments.fedlm import load_fedlm_config, run_fedlm  # noqa: E402
from privasr.experiments.fedlm_folds import run_fedlm_folds  # noqa: E402

from .test_fedlm import _raw, corpus  # noqa: E402,F401


def test_each_meeting_is_tested_once_by_a_model_trained_without_it(corpus, tmp_path, monkeypatch):  # noqa: F811
    seen, builds = [], []
    real_data, real_build = fedlm_folds.nbest_data, fedlm_folds.build_model

    def spy_data(cfg, dev, test):
        data = real_data(cfg, dev, test)
        seen.append(({c for c, _ in data.clients}, {nb.client for nb in test}, {nb.client for nb in dev}))
        return data

    def spy_build(*a, **k):
        builds.append(1)
        return real_build(*a, **k)

    monkeypatch.setattr(fedlm_folds, "nbest_data", spy_data)
    monkeypatch.setattr(fedlm_folds, "build_model", spy_build)
    m = run_fedlm_folds(load_fedlm_config(_raw(corpus, tmp_path, folds=2, rounds=1)), tmp_path / "out")
    assert len(builds) == 1 and len(seen) == 2
    for clients, test, dev in seen:
        assert clients and test and clients == dev and not clients & test  # clients are the fold's dev meetings
    assert seen[0][1] | seen[1][1] == seen[0][1] | seen[0][2]  # the test sides cover every meeting
    assert not seen[0][1] & seen[1][1]
    res = json.loads((tmp_path / "out" / "results.json").read_text())
    assert res["runner"] == "fedlm-folds" and len(res["folds"]) == 2
    assert m["test_utterances"] == sum(f["test_utterances"] for f in res["folds"])
    ppls = [f["ppl"] for f in res["folds"]]
    assert min(ppls) <= m["ppl"] <= max(ppls)
    # token weighting against all utterances, pooled (compare_all is on)
    for k in ("wer_all", "vs_all_rel_change", "vs_all_mapsswe_p", "ppl_all_utts", "all_meeting_ci_low"):
        assert k in m
    assert m["dropped_updates"] == 0 and all(f["dropped_updates"] == 0 for f in res["folds"])
    report = (tmp_path / "out" / "report.md").read_text()
    assert "| **pooled** |" in report and "token loss against all utterances" in report


@pytest.mark.parametrize(("over", "match"), [
    ({"folds": 2, "tables": {"loss": ["all"]}}, "tables"),
    ({"folds": 2, "data.client_text": "reference"}, "client_text"),
    ({"folds": 1}, "folds"),
    ({"folds": 2, "fold_unit": "speaker"}, "fold_unit"),
])
def test_fold_config_errors(corpus, tmp_path, over, match):  # noqa: F811
    with pytest.raises(ConfigError, match=match):
        load_fedlm_config(_raw(corpus, tmp_path, **over))


def test_plain_runs_refuse_folds_folds_refuse_dp_and_the_command_takes_them(corpus, tmp_path, capsys):  # noqa: F811
    with pytest.raises(ConfigError, match="run_fedlm_folds"):
        run_fedlm(load_fedlm_config(_raw(corpus, tmp_path, folds=2)), tmp_path / "o")
    dp = _raw(corpus, tmp_path, folds=2, dp={"noise_multiplier": 1.0},
              fedlm={"clip_norm": 0.5, "weighting": "uniform"})
    with pytest.raises(ConfigError, match="compose"):
        run_fedlm_folds(load_fedlm_config(dp), tmp_path / "o2")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(json.dumps(_raw(corpus, tmp_path, rounds=1, compare_all=False)))
    assert main(["fedlm", "run", "--config", str(cfg), "--folds", "2", "--out", str(tmp_path / "cli")]) == 0
    out = capsys.readouterr().out
    assert "pooled over 2 folds" in out and "0 client updates dropped" in out
