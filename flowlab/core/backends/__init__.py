"""Array backends. A backend is one file meeting this contract:

- ``name``: "numpy" or "cupy"; ``available()``: can it run here?
- ``xp``: its array module; ``asarray(value, dtype)``; ``to_numpy(array)`` (a host copy).
- ``kernel(op)``: the kernel to run ``op`` with; by default ``op.kernel``, which is written with
  numpy calls that CuPy also accepts (NumPy's ``__array_function__``/``__array_ufunc__`` protocols
  send them to CuPy), unless the backend registered its own in ``op.kernels``.

CuPy is imported only inside ``cupy_backend``; importing flowlab never needs a GPU.
"""
from __future__ import annotations

import functools

import numpy as np

from . import numpy_backend

__all__ = ["numpy_backend", "backend_for_device", "kernel_for_device", "gpu_count", "to_numpy",
           "device_of_array", "array_module"]


def array_module(array):
    """numpy or cupy, whichever ``array`` belongs to: for kernels that create arrays (zeros, arange)."""
    if type(array) is np.ndarray or isinstance(array, np.generic):
        return np
    return _cupy().xp


def _cupy():
    from . import cupy_backend
    return cupy_backend


@functools.cache
def gpu_count() -> int:
    """How many real GPUs CuPy sees here: 0 without CuPy, a driver or a device. Asked once."""
    try:
        return _cupy().xp.cuda.runtime.getDeviceCount() if _cupy().xp is not None else 0
    except Exception:  # noqa: BLE001 - no driver or no device: no GPU
        return 0


def backend_for_device(device):
    """The backend that runs ops placed on ``device`` (a DeviceSpec, a device string or None):
    CuPy for a GPU where the machine has a real one; numpy for CPUs, and for the logical GPUs
    (``fl.config.set_logical_devices``) of a machine without one."""
    kind = getattr(device, "device_type", None) or (
        "GPU" if "GPU" in str(device).upper().rpartition("/")[2] else "CPU")
    return _cupy() if kind == "GPU" and gpu_count() else numpy_backend


def kernel_for_device(op, device):
    """``op``'s kernel on ``device``, moving its input arrays into that device's memory first.
    Without a real GPU every array is a numpy array already, and the kernel is returned as it is.
    Logical GPU N is real GPU N mod the number of real GPUs."""
    if not gpu_count():
        return numpy_backend.kernel(op)
    backend = backend_for_device(device)
    kernel = backend.kernel(op)
    if backend is numpy_backend:
        return lambda *arrays, **attrs: kernel(*[to_numpy(a) for a in arrays], **attrs)
    xp, gpu = backend.xp, _gpu_index(device) % gpu_count()

    def on_gpu(*arrays, **attrs):
        with xp.cuda.Device(gpu):   # NOTE: asarray copies an array that lives on another GPU
            return kernel(*[xp.asarray(a) for a in arrays], **attrs)
    return on_gpu


def _gpu_index(device) -> int:
    if isinstance(device, str):
        index = device.rpartition(":")[2]
        return int(index) if index.isdigit() else 0
    return device.device_index or 0


def to_numpy(array):
    """A numpy array for any backend array (copies device memory to the host)."""
    if hasattr(array, "__cuda_array_interface__"):
        return _cupy().to_numpy(array)
    return numpy_backend.to_numpy(array)


def device_of_array(array):
    if hasattr(array, "__cuda_array_interface__"):
        return f"/job:localhost/replica:0/task:0/device:GPU:{array.device.id}"
    return None
