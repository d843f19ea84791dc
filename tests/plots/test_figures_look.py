"""Every plot looks like a figure in a paper: a title, both axes labelled, legends without empty entries, a
colour-blind-safe palette, and the figure closed once saved. The checks read the drawn artists, not the pixels."""

from __future__ import annotations

import pytest

pytest.importorskip("matplotlib")

from privasr.plots import KINDS, pyplot  # noqa: E402

# matplotlib's 'tableau-colorblind10' cycle: the colours every plot draws with
COLORBLIND10 = ["#006ba4", "#ff800e", "#ababab", "#595959", "#5f9ed1", "#c85200", "#898989", "#a2c8ec", "#ffbc79",
                "#cfcfcf"]


@pytest.fixture()
def demo_like() -> dict:
    return {"config": {}, "seed": 0, "metrics": {"wer": 0.155, "wer_baseline": 0.21},
            "systems": [{"system": "first-pass 1-best", "wer": 0.2102}, {"system": "n-gram rescoring", "wer": 0.155},
                        {"system": "N-best oracle (upper bound)", "wer": 0.1185}],
            "per_client": [{"client": f"c{k}", "wer_1best": 0.2 + 0.01 * k, "wer_ngram_rescoring": 0.15 + 0.01 * k}
                           for k in range(6)]}


@pytest.fixture()
def ftl_like() -> dict:
    return {"config": {}, "seed": 0, "metrics": {"target_loss": 0.6, "wer_seed": 0.85, "cer_seed": 0.3},
            "runs": {"ftl": {"valid_loss": [0.7, 0.5, 0.45], "train_loss": [0.8, 0.6, 0.5], "wer": 0.8, "cer": 0.2},
                     "fedavg": {"valid_loss": [0.7, 0.6, 0.55], "train_loss": [0.8, 0.7, 0.6], "wer": 0.82,
                                "cer": 0.25}}}


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


@pytest.mark.parametrize("fixture", ["fedlm_results", "fmp_results", "audit_results", "demo_like", "ftl_like"])
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
