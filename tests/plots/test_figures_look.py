"""Every plot looks like a figure in a paper: a title, both axes labelled, legends without empty entries, a
colour-blind-safe palette, and the figure closed once saved. The checks read the drawn artists, not the pixels."""

from __future__ import annotations

import pytest

pytest.importorskip("matplotlib")

from privasr.plots import KINDS, pyplot  # noqa: E402

# matplotlib's 'tableau-colorblind10' cycle: the colours every plot draws with
COLORBLIND10 = ["#006ba4", "#ff800e", "#ababab", "#595959", "#5f9ed1", "#c85200", "#898989", "#a2c8ec", "#ffbc79",
                "#cfcfcf"]


def _looks(plot) -> list[str]:
    fig = plot.figure
    problems = []
    suptitle = fig._suptitle.get_text() if fig._suptitle is not None else ""
    axes = [a for a in fig.axes if a.get_visible() and (a.has_data() or a.lines or a.patches or a.collections)]
    if not axes:
        return [f"{plot.name}: no axes with data"]
    for a in axes:
        where = f"{plot.name}/{a.get_title() or 'axes'}"
        if not (suptitle or a.get_title()):
            problems.append(f"{where}: no title")
        if not a.get_xlabel():
            problems.append(f"{where}: no x-axis label")
        if not a.get_ylabel():
            problems.append(f"{where}: no y-axis label")
        leg = a.get_legend()
        if leg is not None:
            for t in leg.get_texts():
                if not t.get_text().strip() or t.get_text().startswith("_"):
                    problems.append(f"{where}: an empty legend entry")
    return problems


@pytest.mark.parametrize("fixture", ["fedlm_results", "fmp_results", "audit_results", "demo_like", "ftl_like",
                                     "compare_like", "names_like"])
def test_every_plot_has_a_title_labelled_axes_and_a_full_legend(request, fixture):
    res = request.getfixturevalue(fixture)
    drawn = [p for kind in KINDS for p in kind([("", res)])]
    assert drawn, fixture
    problems = [msg for p in drawn for msg in _looks(p)]
    for p in drawn:
        pyplot().close(p.figure)
    assert not problems, problems


def test_the_palette_is_colour_blind_safe():
    import matplotlib

    pyplot()
    cycle = [c.lower() for c in matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]]
    assert cycle == COLORBLIND10


def test_saving_closes_the_figure(tmp_path, fmp_results):
    plt = pyplot()
    before = set(plt.get_fignums())
    for kind in KINDS:
        for p in kind([("", fmp_results)]):
            p.save(tmp_path)
    assert set(plt.get_fignums()) == before


def test_sweeps_draw_the_bootstrap_interval_and_name_the_baseline(fmp_results, fedlm_results):
    from privasr.plots.sweeps import table_sweeps

    plots = {p.name: p for p in table_sweeps([("", fmp_results)])}
    ax = plots["table_rounds"].figure.axes[0]
    bars = [c for c in ax.containers if type(c).__name__ == "ErrorbarContainer"]
    assert len(bars) == 1  # one interval per point of the rounds line
    segments = bars[0].lines[2][0].get_segments()
    assert len(segments) == 4
    # T = 1: WER 16.95%, interval [-0.40, -0.20] points around the baseline's 17.35%: 16.95% .. 17.15%
    (x0, lo), (_, hi) = segments[0]
    assert x0 == 1 and lo == pytest.approx(16.95) and hi == pytest.approx(17.15)
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "baseline: generic NNLM rescoring" in legend
    texts = [t.get_text() for t in plots["table_rounds"].figure.texts]
    assert any("95% paired-bootstrap interval" in t for t in texts)
    hyper = [t.get_text() for t in plots["table_hyper"].figure.texts]
    assert not any("bootstrap" in t for t in hyper)  # rows without intervals: no bars, no note
    loss = {p.name: p for p in table_sweeps([("", fedlm_results)])}["table_loss"]
    assert any(type(c).__name__ == "ErrorbarContainer" for c in loss.figure.axes[0].containers)
    for p in [*plots.values(), loss]:
        pyplot().close(p.figure)


def test_ftl_plots_name_the_runs(ftl_like):
    from privasr.plots.curves import ftl_convergence

    conv, bars = ftl_convergence([("", ftl_like)])
    legend = [t.get_text() for t in conv.figure.axes[0].get_legend().get_texts()]
    assert "FTL (client SGD + server Adam, softmax weighting)" in legend
    assert "FedAvg (client SGD, count weighting)" in legend
    ticks = [t.get_text().replace("\n", " ") for t in bars.figure.axes[0].get_xticklabels()]
    assert ticks == ["seed model", "FTL (client SGD + server Adam, softmax weighting)",
                     "FedAvg (client SGD, count weighting)"]
    for p in (conv, bars):
        pyplot().close(p.figure)
