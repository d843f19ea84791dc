"""`privasr demo` (the tiny preset of tests/experiments/test_demo.py) writes its plots, and its sub-runs' plots,
as non-empty PNGs that the reports link."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("matplotlib")

from privasr.cli import main  # noqa: E402

from .conftest import PNG  # noqa: E402


def test_demo_writes_linked_pngs(tmp_path):
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--seed", "3", "--preset", "tiny"]) == 0
    expected = {out: {"systems", "clients"}}
    try:
        import torch  # noqa: F401
    except ImportError:
        pass
    else:  # the FedLM and FTL sub-runs need torch
        expected.update({out / "fedlm": {"systems", "rounds"}, out / "ftl": {"ftl_convergence", "ftl_wer"}})
    for run, names in expected.items():
        pngs = {p.stem: p for p in (run / "plots").glob("*.png")}
        assert names <= set(pngs), run
        for p in pngs.values():
            data = p.read_bytes()
            assert data.startswith(PNG) and len(data) > 1000, p
        report = (run / "report.md").read_text()
        links = set(re.findall(r"!\[[^\]]*\]\(plots/([a-z_]+)\.png\)", report))
        assert links == set(pngs), run


def test_every_demo_plot_looks_like_a_figure(tmp_path):
    """The acceptance of the demo's plots, on a real (tiny) demo run and its sub-runs: a title, both axes labelled,
    no empty legend entry (tests/plots/test_figures_look.py's checks)."""
    from privasr.plots import KINDS, pyplot, read_results

    from .test_figures_look import _looks

    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--seed", "2", "--preset", "tiny"]) == 0
    problems = []
    for run in (out, out / "fedlm", out / "ftl"):
        if not (run / "results.json").is_file():
            continue  # the sub-runs need torch
        for kind in KINDS:
            for plot in kind([("", read_results(run))]):
                problems += _looks(plot)
                pyplot().close(plot.figure)
    assert not problems, problems
