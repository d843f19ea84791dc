"""Fixtures of the neural LM tests."""

import pytest


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    """Every neural LM test runs torch on one thread (see ``one_torch_thread``)."""
    yield
