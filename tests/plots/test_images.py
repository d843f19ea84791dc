"""One image comparison per kind of plot (matplotlib's ``compare_images``, RMS tolerance): a change that moves,
drops or restyles what a plot draws shows up here. The baselines are ``tests/plots/baseline/<name>.png``; after an
intended change, regenerate them with ``PRIVASR_UPDATE_BASELINES=1 pytest tests/plots/test_images.py`` and look
at them before committing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from privasr.plots import KINDS  # noqa: E402

BASELINE = Path(__file__).parent / "baseline"
TOLERANCE = 2.0  # RMS over 0-255 pixel values: fonts and antialiasing may differ a little between builds
UPDATE = os.environ.get("PRIVASR_UPDATE_BASELINES") == "1"

# (fixture, plot name): one plot of every kind
CASES = [("names_like", "name_survival"), ("demo_like", "systems"), ("demo_like", "clients"), ("fedlm_results", "rounds"),
         ("ftl_like", "ftl_convergence"), ("ftl_like", "ftl_wer"), ("fmp_results", "table_hyper"),
         ("fedlm_results", "table_loss"), ("fedlm_results", "reliability"), ("audit_results", "audit_roc"),
         ("audit_results", "audit_exposure"), ("audit_results", "audit_epsilon"), ("compare_like", "compare")]


@pytest.mark.parametrize(("fixture", "name"), CASES)
def test_plot_matches_its_baseline_image(request, tmp_path, fixture, name):
    from matplotlib.testing.compare import compare_images

    res = request.getfixturevalue(fixture)
    drawn = {p.name: p for kind in KINDS for p in kind([("", res)])}
    assert name in drawn, sorted(drawn)
    for other in set(drawn) - {name}:
        import matplotlib.pyplot as plt

        plt.close(drawn[other].figure)
    actual = drawn[name].save(tmp_path)
    expected = BASELINE / f"{name}.png"
    if UPDATE:
        BASELINE.mkdir(exist_ok=True)
        expected.write_bytes(actual.read_bytes())
        pytest.skip(f"baseline written: {expected}")
    assert expected.is_file(), f"no baseline image {expected} (see this module's docstring)"
    diff = compare_images(str(expected), str(actual), tol=TOLERANCE)
    assert diff is None, diff
