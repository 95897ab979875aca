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

_pool = None    # CuPy's default memory pool, once flowlab counts its peaks (_count_memory)
_peak: dict = {}   # GPU index -> the most bytes the pool had in use at once since the last reset


def _count_memory():
    """Route CuPy's allocations through a counter (``cupy.cuda.set_allocator``) that still takes
    memory from CuPy's default pool, so the peak is real: the pool's bytes in use only grow when
    it hands out a block, so reading them right after each allocation finds every peak. Done once,
    the first time flowlab puts an array on a GPU."""
    global _pool
    if _pool is not None:
        return
    _pool = xp.get_default_memory_pool()
    malloc, used = _pool.malloc, _pool.used_bytes   # both act on the current device

    def counted(size):
        memory = malloc(size)
        now = used()
        if now > _peak.get(memory.device_id, 0):
            _peak[memory.device_id] = now
        return memory
    xp.cuda.set_allocator(counted)


def memory_info(gpu: int) -> dict:
    """Bytes of GPU ``gpu`` held by CuPy's pool for arrays now, and the most held at once since
    the allocator was installed or ``reset_memory_stats``."""
    _count_memory()
    with xp.cuda.Device(gpu):
        current = _pool.used_bytes()
    return {"current": current, "peak": max(_peak.get(gpu, 0), current)}


def reset_memory_stats(gpu: int) -> None:
    """Start the peak of GPU ``gpu`` again from what is held now."""
    _peak[gpu] = memory_info(gpu)["current"]


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
    if _pool is None:
        _count_memory()
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
    _count_memory()
    return xp.asarray(value, dtype=dtype)


def to_numpy(array):
    return xp.asnumpy(array)


_kernels_loaded = []


def kernel(op):
    _require()
    if not _kernels_loaded:   # the first GPU op registers op.kernels["cupy"] (fused softmax, cross-entropy)
        from . import cuda_kernels
        _kernels_loaded.append(cuda_kernels)
    return op.kernels.get(name, op.kernel)


def nccl():
    """CuPy's NCCL module (cupy.cuda.nccl) where it is usable, else None: collectives between
    GPU ranks (flowlab/cluster/collectives/nccl.py). ``cupy.cuda`` does not import it by itself."""
    if xp is None:
        return None
    try:
        from cupy.cuda import nccl as mod
    except Exception:  # noqa: BLE001 - CuPy built without NCCL
        return None
    return mod if getattr(mod, "available", True) else None
