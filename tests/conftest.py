"""Shared test fixtures.

Real data and golden outputs live beside the project in ``../shared`` (data may be pointed to with
``$PRIVASR_DATA``). Tests that need them use the fixtures below and skip cleanly when they are absent.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from privasr.paths import data_dir, golden_dir

REPO = Path(__file__).resolve().parents[1]
TEST_DATA = Path(__file__).resolve().parent / "data"


shared_data_dir = data_dir


@pytest.fixture
def one_torch_thread():
    """torch on one thread for the test: tiny models run fastest so, and far faster than on two when the
    machine is busy (``pytestmark = pytest.mark.usefixtures("one_torch_thread")`` for a whole module)."""
    torch = pytest.importorskip("torch")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """Path to ../shared/data (or $PRIVASR_DATA); skips the test when absent."""
    p = shared_data_dir()
    if p is None:
        pytest.skip("shared data not available (../shared/data or $PRIVASR_DATA)")
    return p


@pytest.fixture(scope="session")
def golden() -> Path:
    """Path to ../shared/golden; skips the test when absent."""
    p = golden_dir()
    if p is None:
        pytest.skip("golden outputs not available (../shared/golden)")
    return p


@pytest.fixture(scope="session")
def test_data() -> Path:
    """Path to tests/data, the project's own small fixtures."""
    return TEST_DATA


@pytest.fixture(scope="session")
def fsdd_recordings(shared_data: Path) -> Path:
    """The FSDD ``recordings/`` folder of the shared data; skips the test when absent."""
    p = shared_data / "fsdd-digits" / "recordings"
    if not p.is_dir():
        pytest.skip("shared fsdd-digits data not present")
    return p


def sphinx_tools_missing() -> str | None:
    """Why the TTS and acoustic-adaptation tests cannot run here (``None`` when they can): they need espeak-ng,
    sox, sphinx_fe (sphinxbase-utils), pocketsphinx_mdef_convert (Debian pocketsphinx) and SphinxTrain's ``bw``,
    which ``make test`` installs."""
    import shutil

    from privasr.errors import ConfigError

    missing = [p for p in ("espeak-ng", "sox", "sphinx_fe", "pocketsphinx_mdef_convert") if shutil.which(p) is None]
    try:
        from privasr.asr.adapt import sphinxtrain_program

        sphinxtrain_program("bw")
    except ConfigError:
        missing.append("sphinxtrain")
    return f"not installed: {', '.join(missing)} (make test installs them)" if missing else None


@pytest.fixture(scope="session")
def sphinx_tools() -> None:
    """Skips the test when the TTS / SphinxTrain programs are missing (:func:`sphinx_tools_missing`)."""
    why = sphinx_tools_missing()
    if why is not None:
        pytest.skip(why)

