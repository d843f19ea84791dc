"""``privasr bench deployment``: registered; the quick run with real processes is slow (minutes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("flwr")

from privasr.bench import BENCHMARKS, get  # noqa: E402


def test_deployment_is_registered() -> None:
    assert BENCHMARKS["deployment"] == "privasr.bench.deployment:run"


@pytest.mark.slow
def test_deployment_quick(tmp_path: Path) -> None:
    m = get("deployment")(tmp_path / "b", quick=True, seed=0)
    assert m["devices"] == 3 and m["serve"]["round_s"] > 0 and m["fed_split"]["round_s"] > 0
    assert m["speedup_per_round"] > 0 and isinstance(m["target_met"], bool)
    res = json.loads((tmp_path / "b" / "results.json").read_text())
    assert res["config"]["benchmark"] == "deployment"
    assert "privasr bench deployment" in (tmp_path / "b" / "report.md").read_text()
