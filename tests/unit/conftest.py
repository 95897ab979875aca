import pytest

import flowlab as fl


@pytest.fixture
def cpus():
    """``cpus(n)`` splits this process into n logical CPU devices, undone after the test."""
    def make(n):
        fl.config.set_logical_devices("CPU", n)
    yield make
    fl.config.set_logical_devices("CPU", None)
