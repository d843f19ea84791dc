"""The headline check (``privasr headlines``): a rerun that matches its recorded figures passes, a drift beyond the
tolerance or a failing command fails with exit status 1, and the report says which metric moved."""

from __future__ import annotations

import dataclasses
import json

import pytest

from privasr.cli import main
from privasr.config import apply_overrides
from privasr.corpus.formats.nbest_jsonl import write_nbest
from privasr.errors import ConfigError
from privasr.experiments.headlines import load_headlines, run_headlines

from .conftest import make_task, write_toy_arpa


@pytest.fixture()
def rescore_config(tmp_path):
    for part, seed, n in (("dev", 1, 40), ("test", 2, 40)):
        recs = [dataclasses.replace(nb, client=f"{part}{nb.order % 2}") for nb in make_task(seed, n, prefix=part[0])]
        write_nbest(tmp_path / f"{part}.jsonl", recs)
    write_toy_arpa(tmp_path / "toy.arpa")
    raw = {"name": "headline-test", "data": {"dev": str(tmp_path / "dev.jsonl"), "test": str(tmp_path / "test.jsonl")},
           "lms": {"toy": str(tmp_path / "toy.arpa")},
           "search": {"ranges": {"lm": [0, 2, 1], "toy": [0, 10, 0.5], "word_penalty": [-3, 3, 1]}},
           "eval": {"bootstrap_resamples": 50}}
    path = tmp_path / "rescore.yaml"
    path.write_text(json.dumps(raw))
    return path


def _headlines(config, wer, **over):
    raw = {"tolerance": {"wer": 0.001},
           "headlines": [{"name": "toy", "command": ["rescore", "run", "--config", str(config)],
                          "cache": "output.lm_cache", "commit": "abc1234", "metrics": {"wer": wer}}]}
    return apply_overrides(raw, over)


def test_a_matching_rerun_passes_and_a_drift_fails(rescore_config, tmp_path):
    first = run_headlines(load_headlines(_headlines(rescore_config, 0.5)), tmp_path / "probe")
    got = json.loads((tmp_path / "probe" / "toy" / "results.json").read_text())["metrics"]["wer"]
    assert first["drifted"] == 1  # 0.5 was not the figure
    m = run_headlines(load_headlines(_headlines(rescore_config, got + 0.0009)), tmp_path / "same")
    assert m["drifted"] == 0 and m["failed_commands"] == 0
    res = json.loads((tmp_path / "same" / "results.json").read_text())
    row = res["runs"][0]["rows"][0]
    assert row["ok"] and row["got"] == pytest.approx(got) and row["tolerance"] == 0.001
    assert (tmp_path / "same" / "cache").is_dir() or res["cache"].endswith("cache")  # a fresh cache by default
    # the CLI exits 1 on drift and names the metric in the report
    cfg = tmp_path / "h.yaml"
    cfg.write_text(json.dumps(_headlines(rescore_config, got + 0.01)))
    assert main(["headlines", "--config", str(cfg), "--out", str(tmp_path / "cli")]) == 1
    assert "| toy | wer |" in (tmp_path / "cli" / "report.md").read_text()
    assert "DRIFT" in (tmp_path / "cli" / "report.md").read_text()


def test_a_failing_command_is_drift_with_its_output(tmp_path):
    raw = {"headlines": [{"name": "bad", "command": ["rescore", "run", "--config", str(tmp_path / "none.yaml")],
                          "metrics": {"wer": 0.2}}]}
    m = run_headlines(load_headlines(raw), tmp_path / "out")
    assert m["drifted"] == 1 and m["failed_commands"] == 1
    res = json.loads((tmp_path / "out" / "results.json").read_text())
    assert res["runs"][0]["exit_status"] != 0 and "none.yaml" in res["runs"][0]["output_tail"]


@pytest.mark.parametrize(("raw", "match"), [
    ({"headlines": []}, "empty"),
    ({"headlines": [{"name": "a", "command": ["x"], "metrics": {}}]}, "metrics"),
    ({"headlines": [{"name": "a/b", "command": ["x"], "metrics": {"wer": 1}}]}, "name"),
    ({"headlines": [{"name": "a", "command": ["x"], "metrics": {"wer": 1}}] * 2}, "repeats"),
    ({"tolerance": {"wer": -1}, "headlines": [{"name": "a", "command": ["x"], "metrics": {"wer": 1}}]}, "tolerance"),
])
def test_bad_headline_files(raw, match):
    with pytest.raises(ConfigError, match=match):
        load_headlines(raw)


def test_only_names_a_headline(rescore_config, tmp_path):
    with pytest.raises(ConfigError, match="no such headline"):
        run_headlines(load_headlines(_headlines(rescore_config, 0.2)), tmp_path / "o", only=["other"])


def test_the_shipped_headlines_file_validates_and_names_shipped_configs():
    from pathlib import Path

    from privasr.config import read_config

    root = Path(__file__).resolve().parents[2]
    cfg = load_headlines(read_config(root / "configs" / "headlines.yaml"))
    for h in cfg.headlines:
        config = h.command[h.command.index("--config") + 1]
        assert (root / config).is_file(), config
        assert h.commit and h.cache in ("cache_dir", "output.lm_cache")
        assert all(cfg.tolerance_of(h, k) > 0 for k in h.metrics)
