import pytest


def _no_gpu_reason():
    """Why the gpu tier cannot run here (None: it can): CuPy's own reason, through flowlab's backend."""
    from flowlab.core.backends import cupy_backend
    if cupy_backend.available():
        return None
    return (f"no GPU here: {cupy_backend.why_unavailable()}; flowlab's GPU paths are checked on a simulated GPU "
            "in tests/unit (test_gpu_standin_ops.py), and lessons use logical GPUs "
            "(fl.config.set_logical_devices(\"GPU\", 2)), which run on the CPU")


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    why = _no_gpu_reason() if gpu_items else None
    if why is not None:
        skip = pytest.mark.skip(reason=why)
        for item in gpu_items:
            item.add_marker(skip)
