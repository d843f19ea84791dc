"""Cross-validated anonymised-LM runs (``anon run --folds K``): every N-best meeting tested once, by models whose
development text and rescoring weights never saw it; what does not depend on development text built once."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

from privasr.corpus.folds import Fold  # noqa: E402
from privasr.errors import ConfigError, InputError  # noqa: E402
from privasr.experiments import anon_folds  # noqa: E402
from privasr.experiments.anon import load_anon_config, run_anon  # noqa: E402
from privasr.experiments.anon_folds import (  # noqa: E402
    development_turns,
    fold_development_text,
    run_anon_folds,
)

from .test_anon_experiment import FakeDetector, _meeting, _raw, data  # noqa: E402,F401

LISTED = ("DV1", "TS1", "TS2")  # the meetings of the fixture's N-best lists


def _write(folder: Path, name: str, meetings: list[dict]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with gzip.open(folder / name, "wt", encoding="utf-8") as f:
        for m in meetings:
            f.write(json.dumps(m) + "\n")


@pytest.fixture(scope="module")
def fold_data(data, tmp_path_factory) -> Path:  # noqa: F811
    """The anon fixture plus transcripts of the listed meetings (dev/ DV1, test/ TS1 TS2) and of a meeting with no
    lists (test/ XT9)."""
    d = tmp_path_factory.mktemp("ami-folds")
    shutil.copytree(data, d, dirs_exist_ok=True)
    rng = np.random.default_rng(7)
    _write(d / "AMI_proprec" / "dev", "split_1.jsonl.gz", [_meeting("DV1", rng, 12)])
    _write(d / "AMI_proprec" / "test", "split_0.jsonl.gz", [_meeting(m, rng, 12) for m in ("TS1", "TS2", "XT9")])
    return d


@pytest.fixture(scope="module")
def fold_run(fold_data, tmp_path_factory):
    """One 3-fold run through the command line (export_arpa on in the file: --folds drops it), spying on each
    fold's development text and on the models each fold builds."""
    import yaml

    from privasr.cli import main

    tmp = tmp_path_factory.mktemp("fold-run")
    seen: list[tuple[Fold, list[str]]] = []
    built: list[tuple[set[str], set[str], int]] = []
    real_text, real_build = anon_folds.fold_development_text, anon_folds._build_models

    def spy_text(turns, fold, unit="meeting"):
        text, meetings = real_text(turns, fold, unit)
        seen.append((fold, meetings))
        return text, meetings

    def spy_build(cfg, fdata, texts, models, clock):
        real_build(cfg, fdata, texts, models, clock)
        built.append(({nb.client for nb in fdata.dev_nb}, {nb.client for nb in fdata.test_nb}, len(fdata.dev_text)))

    cfg = tmp / "anon.yaml"
    cfg.write_text(yaml.safe_dump(_raw(fold_data, tmp)), encoding="utf-8")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(anon_folds, "fold_development_text", spy_text)
        mp.setattr(anon_folds, "_build_models", spy_build)
        mp.setattr("privasr.experiments.anon._load_detector", lambda spec: (FakeDetector(), FakeDetector.name))
        code = main(["anon", "run", "--config", str(cfg), "--folds", "3", "--out", str(tmp / "out")])
    assert code == 0
    return tmp, json.loads((tmp / "out" / "results.json").read_text()), seen, built


def test_each_meeting_is_tested_once_by_models_tuned_without_it(fold_run):
    _, res, seen, built = fold_run
    assert res["runner"] == "anon-folds" and len(res["folds"]) == 3 and len(seen) == 3 and len(built) == 3
    tested = [m for f, _ in seen for m in f.test]
    assert sorted(tested) == sorted(LISTED)  # a partition of the listed meetings
    for (f, meetings), (dev_nb, test_nb, n_text) in zip(seen, built, strict=True):
        assert not set(meetings) & set(f.test)  # the development text never holds a tested meeting
        assert "XT9" in meetings and set(f.dev) <= set(meetings)  # unlisted and tuning meetings are in it
        assert dev_nb == set(f.dev) and test_nb == set(f.test) and n_text > 0
    for row, (f, meetings) in zip(res["folds"], seen, strict=True):
        assert row["dev_text_meetings"] == meetings and row["test_clients"] == list(f.test)


def test_what_needs_no_development_text_is_built_once(fold_run):
    _, res, _, _ = fold_run
    rows = res["folds"]
    assert "m1_anon" in rows[0]["trained"] and "m2class_anon" in rows[0]["trained"]
    for r in rows[1:]:  # the n-grams come from the cache; M4 is trained again on the fold's text
        assert {"m1_anon", "m1_orig", "m2class_anon", "m2class_orig"} <= set(r["cache_hits"])
        assert {"m4_anon", "m4_orig", "m3_anon"} <= set(r["trained"])
    assert res["metrics"]["cache_hits"] == sum(len(r["cache_hits"]) for r in rows) >= 8


def test_the_pooled_figures_cover_every_utterance_once(fold_run):
    tmp, res, _, _ = fold_run
    m, rows = res["metrics"], res["folds"]
    assert m["folds"] == 3 and m["test_utterances"] == sum(r["test_utterances"] for r in rows) == 45
    for k in ("ppl", "ppl_baseline", "ppl_original"):
        assert min(r[k] for r in rows) <= m[k] <= max(r[k] for r in rows)
    errs = sum(c["errors_system"] for c in res["per_client"])
    assert m["wer"] == pytest.approx(errs / m["test_ref_words"])
    assert sorted(c["client"] for c in res["per_client"]) == sorted(LISTED)
    for k in ("wer_original", "recovered_fraction", "meeting_bootstrap_ci_low", "fold_rel_change_min",
              "mapsswe_p", "wer_first_pass"):
        assert k in m
    t4 = res["tables"]["table4"]
    assert len(t4) == 3 and all(len(r["eq2_by_fold"]) == 3 for r in t4)
    assert len(res["systems"]["mix_wc_m4"]["weights"]) == 3  # each fold's rescoring weights
    report = (tmp / "out" / "report.md").read_text()
    assert "| **pooled** |" in report and "## Table 4" in report and "3-fold cross-validation" in report
    assert not (tmp / "out" / "arpa").exists()


def test_plain_runs_refuse_folds_and_fold_runs_need_them(fold_data, tmp_path):
    with pytest.raises(ConfigError, match="export_arpa"):
        load_anon_config(_raw(fold_data, tmp_path, folds=2))
    cfg = load_anon_config(_raw(fold_data, tmp_path, folds=2, export_arpa=False))
    with pytest.raises(ConfigError, match="run_anon_folds"):
        run_anon(cfg, tmp_path / "o")
    with pytest.raises(ConfigError, match="needs folds"):
        run_anon_folds(load_anon_config(_raw(fold_data, tmp_path)), tmp_path / "o2")
    for over, key in (({"folds": 1}, "folds"), ({"folds": 2, "fold_unit": "speaker"}, "fold_unit")):
        with pytest.raises(ConfigError, match=key):
            load_anon_config(_raw(fold_data, tmp_path, export_arpa=False, **over))
    with pytest.raises(ConfigError, match="4 folds over 3"):
        run_anon_folds(load_anon_config(_raw(fold_data, tmp_path, folds=4, export_arpa=False)), tmp_path / "o3",
                       detector=FakeDetector())


def test_development_text_errors_name_the_problem(fold_data, tmp_path):
    from privasr.text.normalize import Normalizer

    cfg = load_anon_config(_raw(fold_data, tmp_path))
    turns = development_turns(cfg, Normalizer.preset("ami"))
    assert set(turns) == {"DEV00", "DEV01", "DV1", "TS1", "TS2", "XT9"}
    with pytest.raises(InputError, match="fold 0 has no development text"):
        fold_development_text({"TS1": [("a",)]}, Fold(0, ("DV1",), ("TS1",)))
    bad = tmp_path / "bad"
    shutil.copytree(fold_data, bad)
    _write(bad / "AMI_proprec" / "test", "split_9.jsonl.gz", [_meeting("DV1", np.random.default_rng(0), 2)])
    with pytest.raises(InputError, match="'DV1' is in both"):
        development_turns(load_anon_config(_raw(bad, tmp_path)), Normalizer.preset("ami"))


def test_the_command_checks_the_output_path_before_any_work(fold_data, tmp_path, capsys):
    import yaml

    from privasr.cli import main

    cfg = tmp_path / "anon.yaml"
    cfg.write_text(yaml.safe_dump(_raw(fold_data, tmp_path)), encoding="utf-8")
    taken = tmp_path / "taken"
    taken.write_text("x", encoding="utf-8")
    for extra in ([], ["--folds", "2"]):
        assert main(["anon", "run", "--config", str(cfg), *extra, "--out", str(taken)]) == 2
        assert "error:" in capsys.readouterr().err
    assert taken.read_text(encoding="utf-8") == "x" and not (tmp_path / "cache").exists()
