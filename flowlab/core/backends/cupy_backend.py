"""The GPU backend: CuPy arrays. Ops run their numpy-written kernels, which CuPy's array protocols
route to GPU kernels, unless a CUDA kernel is registered for them here (``op.kernels["cupy"]``)."""
from __future__ import annotations

name = "cupy"

try:  # NOTE: the only place flowlab imports CuPy
    import cupy as xp
    _error = None
except Exception as e:  # noqa: BLE001 - no CuPy, no driver or no device: all mean "not here"
    xp = None
    _error = e


def available() -> bool:
    if xp is None:
        return False
    try:
        return xp.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001
        return False


def device_count() -> int:
    return xp.cuda.runtime.getDeviceCount() if xp is not None else 0


def owns(array) -> bool:
    return xp is not None and array.__class__ is xp.ndarray


def device_of(array) -> int:
    return array.device.id


def put(array, gpu: int):
    """``array`` in the memory of GPU ``gpu``: itself if it is there, else a copy (from the host or
    another GPU)."""
    if array.__class__ is xp.ndarray and array.device.id == gpu:
        return array
    with xp.cuda.Device(gpu):
        return xp.asarray(array)


def why_unavailable() -> str:
    if xp is None:
        return f"CuPy is not importable ({type(_error).__name__}: {_error}); install flowlab[gpu]"
    return "CuPy is installed but no CUDA device is visible"


def _require():
    if not available():
        raise RuntimeError(f"the GPU backend cannot run here: {why_unavailable()}")


def asarray(value, dtype=None):
    _require()
    return xp.asarray(value, dtype=dtype)


def to_numpy(array):
    return xp.asnumpy(array)


def kernel(op):
    _require()
    return op.kernels.get(name, op.kernel)
