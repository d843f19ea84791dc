"""Fixtures of the neural LM tests."""

import pytest


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models run fastest on one thread, and far faster than on two when the machine is busy."""
    torch = pytest.importorskip("torch")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
