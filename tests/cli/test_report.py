"""``privasr report``: redraw one run's plots, overlay several, and one-line errors (exit 2)."""

from __future__ import annotations

import json
import sys

import pytest

pytest.importorskip("matplotlib")

from privasr.cli import main  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"


def _run(folder, seed: int, wer: float):
    folder.mkdir(parents=True)
    res = {"config": {}, "seed": seed, "metrics": {"wer": wer, "wer_baseline": 0.2},
           "history": [{"round": r, "metrics": {"loss": 5.0 - r - seed, "eval_ppl": 100.0 - r}} for r in range(3)],
           "tables": {"rounds": [{"T": t, "wer": wer + 0.01 * t} for t in (1, 2, 5)]}}
    (folder / "results.json").write_text(json.dumps(res))
    return folder


def test_overlay_two_runs(tmp_path, capsys):
    a, b = _run(tmp_path / "seed0", 0, 0.15), _run(tmp_path / "seed1", 1, 0.16)
    out = tmp_path / "both"
    assert main(["report", str(a), str(b / "results.json"), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    report = (out / "report.md").read_text()
    assert "- seed0, seed 0 (unknown): `" in report and "- seed1, seed 1 (unknown): `" in report
    for name in ("systems", "rounds", "table_rounds"):
        png = out / "plots" / f"{name}.png"
        assert png.read_bytes().startswith(PNG) and png.stat().st_size > 1000
        assert f"](plots/{name}.png)" in report and str(png) in printed
    assert not (a / "plots").exists()  # the runs themselves are left alone


def test_overlay_puts_each_run_in_the_legend(tmp_path):
    from privasr.plots import draw, read_results

    runs = [(n, read_results(_run(tmp_path / n, i, 0.15))) for i, n in enumerate(("x", "y"))]
    drawn = {p.name: p for p, _ in draw(runs, tmp_path / "plots")}
    ax = drawn["rounds"].figure.axes[0]
    assert [ln.get_label() for ln in ax.get_lines()] == ["x", "y"]


def test_one_run_redraws_its_plots(tmp_path):
    a = _run(tmp_path / "run", 0, 0.15)
    assert main(["report", str(a)]) == 0
    assert sorted(p.name for p in (a / "plots").iterdir()) == ["rounds.png", "systems.png", "table_rounds.png"]
    assert not (a / "report.md").exists()


@pytest.mark.parametrize("case", ["missing", "several without --out", "nothing to draw", "not json"])
def test_errors_are_one_line_exit_2(tmp_path, capsys, case):
    a = _run(tmp_path / "a", 0, 0.15)
    if case == "missing":
        argv, says = ["report", str(tmp_path / "nope")], "nope/results.json: no such file"
    elif case == "several without --out":
        argv, says = ["report", str(a), str(a)], "2 runs and no --out"
    elif case == "nothing to draw":
        (a / "results.json").write_text('{"metrics": {"wer": 0.1}}')
        argv, says = ["report", str(a)], "nothing to draw"
    else:
        (a / "results.json").write_text("{")
        argv, says = ["report", str(a)], "results.json:1: not JSON"
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and says in err and "\n" not in err and "Traceback" not in err


def test_without_matplotlib_names_the_extra(tmp_path, capsys, monkeypatch):
    a = _run(tmp_path / "a", 0, 0.15)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main(["report", str(a)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: plots need matplotlib") and "'plots' extra" in err and "\n" not in err
    assert not (a / "plots").exists()


def test_runs_of_different_runners_are_not_overlaid_unless_asked(tmp_path, capsys):
    a, b = _run(tmp_path / "a", 0, 0.15), _run(tmp_path / "b", 1, 0.16)
    for folder, runner in ((a, "fedlm"), (b, "ftl")):
        res = json.loads((folder / "results.json").read_text())
        (folder / "results.json").write_text(json.dumps({"runner": runner, **res}))
    out = tmp_path / "both"
    assert main(["report", str(a), str(b), "--out", str(out)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "runs of different runners" in err and "(fedlm)" in err and "(ftl)" in err and "--mixed" in err
    assert main(["report", str(a), str(b), "--out", str(out), "--mixed"]) == 0
    assert "(fedlm)" in (out / "report.md").read_text()

