"""The privacy audit runner (``privasr audit``) on the tiny demo corpus."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("faker")
pytest.importorskip("spacy")

from privasr.cli import main  # noqa: E402
from privasr.errors import ConfigError  # noqa: E402
from privasr.experiments.audit import load_audit_config, run_audit  # noqa: E402


def test_anonymisation_audit_on_the_demo_corpus(tmp_path):
    cfg = load_audit_config({"name": "t", "seed": 1, "anon": {"data": "synth", "synth_preset": "tiny",
                                                              "detector": "patterns", "canaries": 20}})
    m = run_audit(cfg, tmp_path / "out")
    res = json.loads((tmp_path / "out" / "results.json").read_text())
    a = res["sections"]["anon"]
    assert a["canaries"]["unlisted"]["canaries"] == a["canaries"]["listed"]["canaries"] == 20
    # a gazetteer catches every listed name; made-up names get through a patterns-only detector
    assert m["anon_canary_leak_rate_listed"] < m["anon_canary_leak_rate_unlisted"]
    assert m["anon_canary_leak_rate_unlisted"] > 0.5
    assert 0.0 <= m["anon_leak_rate"] <= 1.0 and a["leak"]["all"]["mentions"] > 0
    assert "| unlisted | 20 |" in (tmp_path / "out" / "report.md").read_text()


def test_config_errors(tmp_path, capsys):
    with pytest.raises(ConfigError, match="no section to run"):
        load_audit_config({"name": "x"})
    with pytest.raises(ConfigError, match="anon.canaries"):
        load_audit_config({"anon": {"canaries": 0}})
    (tmp_path / "c.yaml").write_text("anon: {data: nowhere}\n")
    assert main(["audit", "--config", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "o")]) == 2
    assert "anon.data" in capsys.readouterr().err
