"""Process-wide settings: BLAS threads, logical devices and compiled fusion.

Small matmuls run 2 to 3 times faster with one BLAS thread than with two on a 2-core machine
(threads spin up and synchronise for microseconds of work), and worker processes that share a
machine should not each start a full thread pool. So importing flowlab sets BLAS to
``FLOWLAB_BLAS_THREADS`` threads (default 1); ``set_blas_threads`` changes it at any time.

Compiled fusion (``set_compiled_fusion``, ``compiled_fusion_info``): where a C compiler works,
long fused chains of elementwise ops in ``@fl.function`` graphs run as C compiled for this CPU.

Logical devices let one process act as several (``set_logical_devices``): placement lessons and
mirrored strategies run on a laptop. Where they run is in ``backends.backend_for_device``.
"""
from __future__ import annotations

import numbers
import os
import types
from collections import namedtuple

import numpy as np

from . import backends as _backends
from .backends import gpu_count

__all__ = ["set_blas_threads", "get_blas_threads", "blas_info", "set_logical_devices", "list_logical_devices",
           "list_physical_devices", "set_visible_devices", "get_visible_devices", "LogicalDevice", "PhysicalDevice", "set_compiled_fusion",
           "compiled_fusion_info", "experimental"]

_DEFAULT = "FLOWLAB_BLAS_THREADS"
_limiter = None


def _controller():
    from threadpoolctl import ThreadpoolController  # imported lazily: it scans loaded libraries
    return ThreadpoolController()


def set_blas_threads(n: int) -> None:
    """Use ``n`` threads in every BLAS library numpy has loaded (OpenBLAS, MKL, BLIS)."""
    global _limiter
    n = int(n)
    if n < 1:
        raise ValueError(f"set_blas_threads needs at least 1 thread, got {n}")
    _limiter = _controller().limit(limits=n, user_api="blas")


def get_blas_threads() -> int:
    """The thread count of numpy's BLAS (the largest, if several BLAS libraries are loaded)."""
    info = blas_info()
    return max((lib["num_threads"] for lib in info), default=1)


def blas_info() -> list[dict]:
    """What threadpoolctl reports for each loaded BLAS library."""
    return [lib for lib in _controller().info() if lib.get("user_api") == "blas"]


def apply_environment() -> None:
    """Apply FLOWLAB_BLAS_THREADS (default 1) and warm BLAS up: ``import flowlab`` calls it once."""
    value = os.environ.get(_DEFAULT, "1")
    try:
        set_blas_threads(int(value))
    except ValueError:
        raise ValueError(f"{_DEFAULT} must be a whole number of threads >= 1, got {value!r}") from None
    _warm_blas()


def _warm_blas() -> None:
    """Run one mid-sized float32 matmul. Measured on the 2-core EPYC machines flowlab is tested on:
    until OpenBLAS has run one such product in a process, small single-threaded matmuls (32x256 @
    256x256) take 2.5 to 3 times longer (380 vs 136 us). It costs about 3 ms, once, at import."""
    np.ones((128, 256), np.float32) @ np.ones((256, 512), np.float32)


# -- compiled fusion --------------------------------------------------------------------------
def set_compiled_fusion(enabled: bool) -> None:
    """Compile fused groups of elementwise ops to C (True, the default where a C compiler works;
    ``FLOWLAB_COMPILED_FUSION=0`` makes it False at start) or run them with numpy (False).

    It applies to plans built afterwards (a function traced before keeps its kernels). A group
    compiles when it has at least 8 ops, all float32 or all float64, and its inputs are full-size
    arrays or single values (core/passes/_cfusion.py). Arithmetic, comparisons and logical ops give
    the same bits as numpy. exp, log, sigmoid and tanh use flowlab's own float32 code: within 1 ULP
    (2 for tanh) of the correctly rounded value, so a graph with them can differ from eager by
    that much per op (deterministic: the same bits in every run and process, unless compiling
    fails in one of them, which warns). Compiled libraries are cached in
    ``$FLOWLAB_CACHE_DIR/kernels`` (default ``~/.cache/flowlab/kernels``).

    >>> import flowlab as fl
    >>> fl.config.set_compiled_fusion(False)
    >>> fl.config.compiled_fusion_info()["enabled"]
    False
    >>> fl.config.set_compiled_fusion(True)
    """
    from .passes import _ccompile
    _ccompile.set_enabled(enabled)


def compiled_fusion_info() -> dict:
    """Whether compiled fusion is on (``enabled``) and works here (``available``: a C compiler
    was found; None while off), the ``compiler`` and its version, the ``flags``, the
    ``cache_dir``, and counts of libraries ``compiled``, ``loaded`` from the cache and ``failed``
    in this process."""
    from .passes import _ccompile
    return _ccompile.info()


# -- logical devices --------------------------------------------------------------------------
LogicalDevice = namedtuple("LogicalDevice", "name device_type")
PhysicalDevice = namedtuple("PhysicalDevice", "name device_type")
_logical = {"CPU": 1, "GPU": None}   # None: one logical GPU per real GPU
_version = 0                         # bumped by every change: cached placements are redone


def set_logical_devices(device_type: str, count: int | None) -> None:
    """Give this process ``count`` logical devices of ``device_type`` ("CPU" or "GPU"); None
    restores the default (1 CPU; as many GPUs as the machine has, 0 without one).

    A logical GPU runs on the numpy backend where there is no real GPU, so ``/gpu:1`` works on a
    laptop; with real GPUs, logical GPU N runs with CuPy on real GPU N mod their count (TensorFlow's
    virtual GPUs also share one GPU). TensorFlow refuses to change this once its runtime has
    started; flowlab allows it at any time, because a notebook's cells are re-run and edited
    out of order. Tensors placed before keep their device and values, and ops on them still run;
    only ``fl.device`` scopes opened on a device that is gone fail, naming the devices there are.

    >>> import flowlab as fl
    >>> fl.config.set_logical_devices("GPU", 2)
    >>> [d.name[-5:] for d in fl.config.list_logical_devices("GPU")]
    ['GPU:0', 'GPU:1']
    >>> fl.config.set_logical_devices("GPU", None)
    """
    global _version
    kind = _kind(device_type)
    least = 1 if kind == "CPU" else 0   # a process always has CPU:0
    if count is not None and (not isinstance(count, numbers.Integral) or isinstance(count, bool) or count < least):
        raise ValueError(f"set_logical_devices: need a whole number of {kind} devices, at least {least}, "
                         f"or None for the default; got {count!r}")
    _logical[kind] = (1 if kind == "CPU" else None) if count is None else int(count)
    _version += 1


def logical_device_count(device_type: str) -> int:
    n = _logical[_kind(device_type)]
    return len(_backends.visible_gpus()) if n is None else n


def list_logical_devices(device_type: str | None = None) -> list:
    """This process's devices, as ``LogicalDevice(name, device_type)`` with full names."""
    kinds = ("CPU", "GPU") if device_type is None else (_kind(device_type),)
    return [LogicalDevice(f"/job:localhost/replica:0/task:0/device:{k}:{i}", k)
            for k in kinds for i in range(logical_device_count(k))]


def list_physical_devices(device_type: str | None = None) -> list:
    """The machine's devices: one CPU, and each GPU that CuPy sees."""
    kinds = ("CPU", "GPU") if device_type is None else (_kind(device_type),)
    return [PhysicalDevice(f"/physical_device:{k}:{i}", k) for k in kinds for i in range(1 if k == "CPU" else gpu_count())]


def set_visible_devices(devices, device_type: str = "GPU") -> None:
    """Use only ``devices`` (from ``list_physical_devices``) of ``device_type``, as TensorFlow's
    ``tf.config.set_visible_devices``; ``set_visible_devices([], "GPU")`` hides every GPU, so that
    ops and strategies use the CPU on a machine that has GPUs. The CPU always stays visible. Unlike
    TensorFlow, flowlab allows this at any time (notebook cells are re-run).

    >>> import flowlab as fl
    >>> fl.config.set_visible_devices([], "GPU")
    >>> fl.config.list_logical_devices("GPU")
    []
    >>> fl.config.set_visible_devices(fl.config.list_physical_devices("GPU"), "GPU")   # all again
    """
    kind, have = _kind(device_type), list_physical_devices(device_type)
    devices = [devices] if isinstance(devices, PhysicalDevice) else list(devices)
    wrong = [d for d in devices if d not in have]
    if wrong or (kind == "CPU" and devices != have):
        raise ValueError(f"set_visible_devices: {'the CPU cannot be hidden; ' if kind == 'CPU' else ''}"
                         f"{wrong or devices} are not among this machine's {kind} devices {have}: pass "
                         f"devices from fl.config.list_physical_devices({kind!r})")
    if kind == "GPU":
        indices = tuple(sorted({int(d.name.rpartition(":")[2]) for d in devices}))
        _backends._visible = None if indices == tuple(range(gpu_count())) else indices
        _devices_changed()


def get_visible_devices(device_type: str | None = None) -> list:
    """The physical devices this process uses (``set_visible_devices``)."""
    kinds = ("CPU", "GPU") if device_type is None else (_kind(device_type),)
    return [PhysicalDevice(f"/physical_device:{k}:{i}", k) for k in kinds
            for i in ((0,) if k == "CPU" else _backends.visible_gpus())]


def _devices_changed() -> None:
    global _version
    _version += 1
    _backends.forget_placed()


def devices_version() -> int:
    return _version


def _kind(device_type) -> str:
    kind = str(device_type).upper()
    if kind not in ("CPU", "GPU"):
        raise ValueError(f"device_type must be \"CPU\" or \"GPU\", not {device_type!r}")
    return kind


def get_memory_info(device: str) -> dict:
    """``{"current": bytes, "peak": bytes}``: GPU memory held for arrays now, and the most held at
    once since the start or ``reset_memory_stats`` (``device``: "GPU:0"), as TensorFlow's
    ``tf.config.experimental.get_memory_info``."""
    return _backends.memory_info(device)


def reset_memory_stats(device: str) -> None:
    """Start ``device``'s peak again from what it holds now."""
    _backends.reset_memory_stats(device)


experimental = types.SimpleNamespace(get_memory_info=get_memory_info, reset_memory_stats=reset_memory_stats)
