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
