"""The plot kinds draw what results.json holds, overlay several runs, and say once when matplotlib is missing."""

from __future__ import annotations

import json
import logging
import sys

import numpy as np
import pytest

pytest.importorskip("matplotlib")

import privasr.plots as plots  # noqa: E402
from privasr.errors import InputError  # noqa: E402
from privasr.plots import draw, plots_section, read_results  # noqa: E402
from privasr.plots.audit import epsilon_bounds, exposure_curves, roc_curves  # noqa: E402
from privasr.plots.curves import round_curves  # noqa: E402
from privasr.plots.reliability import reliability_diagram  # noqa: E402
from privasr.plots.sweeps import table_sweeps  # noqa: E402

from .conftest import PNG  # noqa: E402


def _lines(plot, panel: int = 0) -> list[str]:
    """The labels of the lines drawn on one panel (matplotlib's own labels for unlabelled ones start with _)."""
    return [ln.get_label() for ln in plot.figure.axes[panel].get_lines()]


def test_round_curves_one_panel_per_varying_metric_and_one_line_per_run(fedlm_results, fmp_results):
    (p,) = round_curves([("", fedlm_results)])
    titles = [ax.get_title() for ax in p.figure.axes]
    assert titles == ["eval ppl", "loss", "update norm"]  # 'clients' is constant bookkeeping
    (both,) = round_curves([("seed0", fedlm_results), ("seed1", fedlm_results)])
    assert _lines(both) == ["seed0", "seed1"]
    (f,) = round_curves([("", fmp_results)])
    assert [ax.get_title() for ax in f.figure.axes] == ["changed", "qbar mass"]
    line = f.figure.axes[1].get_lines()[0]
    assert list(line.get_xdata()) == [1, 2, 3, 4] and list(line.get_ydata()) == [3000.0, 6000.0, 9000.0, 12000.0]


def test_table_sweeps_axes_groups_and_baseline(fmp_results, fedlm_results):
    by_name = {p.name: p for p in table_sweeps([("", fmp_results)])}
    assert set(by_name) == {"table_rounds", "table_hyper", "table_epsilon"}
    rounds = by_name["table_rounds"].figure.axes[0]
    assert list(rounds.get_lines()[0].get_xdata()) == [1, 2, 5, 10]
    assert list(rounds.get_lines()[0].get_ydata()) == pytest.approx([100 * (0.17 - 0.0005 * t) for t in (1, 2, 5, 10)])
    assert "baseline: generic NNLM rescoring" in _lines(by_name["table_rounds"])
    # sigma sweeps per (alpha, beta): the 4-point group is a line, its x axis is logarithmic
    hyper = by_name["table_hyper"].figure.axes[0]
    assert "alpha 0.5, beta 0.25" in _lines(by_name["table_hyper"]) and hyper.get_xscale() == "log"
    noise = {p.name: p for p in table_sweeps([("", fedlm_results)])}
    assert set(noise) == {"table_loss", "table_noise"}
    wer_panel, ppl_panel = noise["table_noise"].figure.axes
    assert list(wer_panel.get_lines()[0].get_xdata()) == [3.8, 27.8]  # finite epsilons, sorted
    assert "no noise (epsilon inf)" in _lines(noise["table_noise"]) and ppl_panel.get_ylabel() == "test perplexity"


def test_reliability_diagram_skips_empty_bins(fedlm_results):
    (p,) = reliability_diagram([("", fedlm_results)])
    ax = p.figure.axes[0]
    curve = [ln for ln in ax.get_lines() if ln.get_label().startswith("ECE")][0]
    assert curve.get_label() == "ECE 0.019"
    assert list(curve.get_xdata()) == [0.4, 0.63, 0.9] and list(curve.get_ydata()) == [0.45, 0.6, 0.91]
    assert [b.get_height() for b in p.figure.axes[1].patches] == [0, 120, 300, 900]


def test_audit_plots(audit_results):
    runs = [("", audit_results)]
    (roc,) = roc_curves(runs)
    labels = _lines(roc)
    assert "FMP checkpoint (AUC 0.900)" in labels and "FedLM checkpoint, loss attack (AUC 0.670)" in labels
    assert "FMP game aggregate" in " ".join(labels)
    (exp,) = exposure_curves(runs)
    assert "DP, z=1, epsilon=9" in _lines(exp)
    assert list(exp.figure.axes[0].get_lines()[0].get_xdata()) == [1.0, 4.0, 16.0]
    (eps,) = epsilon_bounds(runs)
    assert [b.get_height() for b in eps.figure.axes[0].patches] == [2.59, 0.0]


def test_roc_points_match_sklearn_and_are_thinned():
    sklearn = pytest.importorskip("sklearn.metrics")
    from privasr.experiments.audit_runs import roc_points

    rng = np.random.default_rng(0)
    s_in, s_out = rng.normal(1, 1, 40), rng.normal(0, 1, 50)
    r = roc_points(s_in, s_out)
    # the corners of sklearn's curve: points of it, and the same area (only collinear points dropped)
    labels, scores = np.r_[np.ones(40), np.zeros(50)], np.r_[s_in, s_out]
    fpr, tpr, _ = sklearn.roc_curve(labels, scores, drop_intermediate=False)
    full = {(round(f, 6), round(t, 6)) for f, t in zip(fpr.tolist(), tpr.tolist(), strict=True)}
    assert set(zip(r["fpr"], r["tpr"], strict=True)) <= full and len(r["fpr"]) < len(full)
    assert np.trapezoid(r["tpr"], r["fpr"]) == pytest.approx(sklearn.roc_auc_score(labels, scores), abs=1e-5)
    big = roc_points(rng.normal(1, 1, 3000), rng.normal(0, 1, 3000))
    assert 50 <= len(big["fpr"]) <= 100 and (big["fpr"][0], big["tpr"][0]) == (0.0, 0.0)
    assert (big["fpr"][-1], big["tpr"][-1]) == (1.0, 1.0) and big["fpr"] == sorted(big["fpr"])
    assert roc_points([3.0, 2.0, 1.0], np.zeros(500)) == {"fpr": [0.0, 0.0, 1.0], "tpr": [0.0, 1.0, 1.0]}


def test_plots_section_draws_and_links(tmp_path, fmp_results):
    (tmp_path / "results.json").write_text(json.dumps(fmp_results))
    md = plots_section(tmp_path)
    assert md.startswith("\n## Plots\n")
    for name in ("systems", "rounds", "table_rounds", "table_hyper", "table_epsilon"):
        data = (tmp_path / "plots" / f"{name}.png").read_bytes()
        assert data.startswith(PNG) and len(data) > 1000
        assert f"](plots/{name}.png)" in md


def test_nothing_to_draw_gives_no_section(tmp_path):
    (tmp_path / "results.json").write_text(json.dumps({"metrics": {"wer": 0.1}}))
    assert plots_section(tmp_path) == "" and draw([("", {"metrics": {}})], tmp_path / "p") == []


def test_without_matplotlib_a_warning_line_logged_once(tmp_path, fmp_results, monkeypatch, caplog):
    (tmp_path / "results.json").write_text(json.dumps(fmp_results))
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    monkeypatch.setattr(plots, "_warned", False)
    with caplog.at_level(logging.WARNING, logger="privasr.plots"):
        first, second = plots_section(tmp_path), plots_section(tmp_path)
    assert first == second and first.count("\n> Warning: plots were skipped") == 1
    assert "privasr[plots]" in first and f"privasr report {tmp_path}" in first
    assert len([r for r in caplog.records if r.name == "privasr.plots"]) == 1
    assert not (tmp_path / "plots").exists()


def test_read_results_errors_name_the_file(tmp_path):
    with pytest.raises(InputError, match="results.json: no such file"):
        read_results(tmp_path)
    (tmp_path / "results.json").write_text('{"metrics": 1,\n oops}')
    with pytest.raises(InputError, match=r"results.json:2: not JSON"):
        read_results(tmp_path)
    (tmp_path / "results.json").write_text("[1, 2]")
    with pytest.raises(InputError, match="a JSON list, not an object"):
        read_results(tmp_path / "results.json")


def test_system_wers_name_each_system_once_with_reference_lines():
    """A rescoring run whose baseline is the first pass: one bar (the run's system), the first pass and the oracle
    as reference lines, not three bars of which two are the same 20.15%."""
    from privasr.plots.systems import system_wers

    res = {"config": {"name": "AMI trigram rescoring"},
           "metrics": {"wer": 0.1702, "wer_baseline": 0.2015, "wer_first_pass": 0.2015, "wer_oracle": 0.1206,
                       "bootstrap_ci_low": -0.035, "bootstrap_ci_high": -0.028}}
    (p,) = system_wers([("", res)])
    ax = p.figure.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["AMI trigram rescoring"]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "first-pass 1-best (20.15%)" in legend and "N-best oracle (12.06%)" in legend
    lo, hi = ax.get_xlim()
    assert 5 < lo < 12.06 and 20.15 < hi < 30  # zoomed to the data, not from 0
    res["metrics"]["baseline"] = "rescoring with lm, bg3 (tuned on dev)"
    res["metrics"].update(wer_baseline=0.18, bootstrap_ci_low=-0.012, bootstrap_ci_high=-0.008)
    (p,) = system_wers([("", res)])
    assert [t.get_text() for t in p.figure.axes[0].get_yticklabels()] == [
        "baseline: rescoring with lm, bg3 (tuned on dev)", "AMI trigram rescoring"]
