"""docs/own-data.md, run as a user would: its ``sh`` blocks in order, from an empty folder, then the figures
the page quotes checked against what the commands wrote."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "own-data.md"


def _script() -> str:
    blocks = re.findall(r"```sh\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)
    assert len(blocks) >= 6, "the walkthrough lost its commands"
    return "set -euo pipefail\n" + "\n".join(blocks)


def _pct(text: str) -> set[str]:
    return set(re.findall(r"\*\*[^*]*?(\d+\.\d\d)%\*\*", text))


@pytest.mark.timeout(600)
def test_the_walkthrough_runs_from_an_empty_folder_and_its_figures_are_true(tmp_path: Path) -> None:
    pytest.importorskip("spacy")
    privasr = shutil.which("privasr", path=str(Path(sys.executable).parent)) or shutil.which("privasr")
    if privasr is None:
        pytest.skip("the privasr command is not installed")
    env = {**os.environ, "PATH": f"{Path(privasr).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "PRIVASR_QUIET": "1"}
    res = subprocess.run(["bash", "-c", _script()], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=580)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "Traceback" not in res.stderr
    work = tmp_path / "work"

    def metrics(rel: str) -> dict:
        return json.loads((work / rel).read_text())["metrics"]

    inspect = metrics("inspect-test.json")
    first = metrics("first-pass-wer.json")
    rescore = metrics("rescore/results.json")
    fmp, fmp_dp = metrics("fmp/results.json"), metrics("fmp-dp/results.json")
    doc = " ".join(DOC.read_text(encoding="utf-8").split())
    assert f"{inspect['utterances']} utterances of {inspect['speakers']} speakers" in doc
    assert f"oracle WER {100 * inspect['wer_oracle']:.2f}%" in doc
    figures = {f"{100 * x:.2f}" for x in (inspect["wer_1best"], first["wer"], rescore["wer"], fmp["wer"])}
    assert figures == _pct(doc), (figures, _pct(doc))
    assert f"the test WER is {100 * fmp_dp['wer']:.2f}%" in doc and fmp_dp["epsilon"] == pytest.approx(1.0, rel=1e-3)
    for png in ("rescore/plots", "fmp/plots", "report/plots"):
        assert any(p.stat().st_size > 1000 for p in (work / png).glob("*.png")), png
    assert (work / "test-anon.jsonl").stat().st_size > 0
