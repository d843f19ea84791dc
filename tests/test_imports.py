"""The core package and its command line import without the optional extras (torch, flwr, spaCy, ...)."""

import subprocess
import sys

HEAVY = ("torch", "flwr", "ray", "spacy", "dp_accounting", "sentencepiece")


def test_core_imports_without_heavy_extras():
    code = (
        "import sys, privasr, privasr.cli, privasr.corpus.load, privasr.metrics, privasr.synth;"
        f"loaded = [m for m in {HEAVY!r} if m in sys.modules];"
        "assert not loaded, loaded"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_cli_help_and_version():
    out = subprocess.run([sys.executable, "-m", "privasr", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("privasr ")
    for args in (["--help"], ["data", "--help"], ["score", "compare", "--help"], ["demo", "--help"],
                 ["bench", "--help"], ["data", "inspect", "--help"]):
        r = subprocess.run([sys.executable, "-m", "privasr", *args], capture_output=True, text=True)
        assert r.returncode == 0, (args, r.stderr)
        assert "Usage" in r.stdout
