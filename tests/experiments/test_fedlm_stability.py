"""``privasr fedlm stability``: every client trained locally per learning rate and gradient bound; a rate far too
large diverges without clipping and stays finite with it, and the clipped share is counted."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from privasr.cli import main  # noqa: E402
from privasr.errors import InputError  # noqa: E402
from privasr.experiments.fedlm import load_fedlm_config  # noqa: E402
from privasr.experiments.fedlm_stability import run_stability  # noqa: E402

from .test_fedlm import _raw, corpus  # noqa: E402,F401


def test_clipping_keeps_a_diverging_rate_finite(corpus, tmp_path):  # noqa: F811
    cfg = load_fedlm_config(_raw(corpus, tmp_path))
    m = run_stability(cfg, tmp_path / "out", lrs=[0.5, 1e4], clips=[None, 0.5], draws=1)
    cells = {(c["client_lr"], c["grad_clip"]): c for c in m["cells"]}
    assert len(cells) == 4 and all(c["trainings"] == m["clients"] for c in cells.values())
    assert cells[(1e4, None)]["non_finite"] > 0 or cells[(1e4, None)]["max_loss"] > 100  # diverges
    assert cells[(1e4, 0.5)]["non_finite"] == 0  # a bounded step cannot overflow
    assert cells[(0.5, None)]["clipped_share"] is None and 0 < cells[(1e4, 0.5)]["clipped_share"] <= 1
    res = json.loads((tmp_path / "out" / "results.json").read_text())
    assert res["runner"] == "fedlm-stability"
    assert "| 10000 | 0.5 | pretrained |" in (tmp_path / "out" / "report.md").read_text()
    pytest.importorskip("matplotlib")
    assert (tmp_path / "out" / "plots" / "stability.png").is_file()


def test_bad_settings_and_a_foreign_checkpoint_are_clear_errors(corpus, tmp_path, capsys):  # noqa: F811
    cfg = load_fedlm_config(_raw(corpus, tmp_path))
    with pytest.raises(InputError, match="draws"):
        run_stability(cfg, tmp_path / "o", lrs=[1.0], clips=[None], draws=0)
    other = tmp_path / "other.pt"
    other.write_bytes(b"not a checkpoint")
    with pytest.raises(InputError):
        run_stability(cfg, tmp_path / "o2", lrs=[1.0], clips=[None], draws=1, starts=[other])
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps(_raw(corpus, tmp_path)))
    assert main(["fedlm", "stability", "--config", str(path), "--grad-clip", "big", "--out", str(tmp_path / "o3")]) == 2
    assert "--grad-clip 'big'" in capsys.readouterr().err
    assert main(["fedlm", "stability", "--config", str(path), "--grad-clip", "-1", "--out", str(tmp_path / "o4")]) == 2
    assert "grad_clip" in capsys.readouterr().err
