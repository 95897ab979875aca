import pytest

import flowlab as fl
from flowlab.core.backends import cupy_backend


@pytest.fixture
def cp():
    """CuPy, where a GPU is visible (else the test is skipped, saying why); logical devices reset after."""
    if not cupy_backend.available():
        pytest.skip(cupy_backend.why_unavailable())
    yield cupy_backend.xp
    fl.config.set_logical_devices("GPU", None)
    fl.config.set_logical_devices("CPU", None)
