"""``privasr anon eval-names``: planted names through a detector, written as a run (results.json, report.md, the
survival plot)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("faker")


def test_eval_names_writes_the_run(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from privasr.anon.name_shapes import CASINGS, SHAPES
    from privasr.cli.anon import app

    out = tmp_path / "names"
    r = CliRunner().invoke(app, ["eval-names", "--out", str(out), "--model", "patterns", "--n", "3"])
    assert r.exit_code == 0, r.output
    res = json.loads((out / "results.json").read_text())
    m = res["metrics"]
    assert res["runner"] == "name-eval" and res["config"]["model"] == "patterns" and res["seed"] == 0
    assert m["names"] == 3 * len(SHAPES) * len(CASINGS) and set(m["by_shape"]) == set(SHAPES)
    assert m["target"] == 0.02 and m["target_met"] == (m["worst_shape_survival"] <= 0.02)
    # the patterns alone know no "o'" names: that shape survives, and the report says the target is missed
    assert m["by_shape"]["apostrophe"]["survival"] > 0.5 and not m["target_met"]
    report = (out / "report.md").read_text()
    assert "| apostrophe | 9 |" in report and "not met" in report and "plots/name_survival.png" in report
    assert (out / "plots" / "name_survival.png").is_file()
    r = CliRunner().invoke(app, ["eval-names", "--out", str(tmp_path / "x"), "--n", "0"])
    assert r.exit_code != 0
