"""Array backends. A backend is one file meeting this contract:

- ``name``: "numpy" or "cupy"; ``available()``: can it run here?
- ``xp``: its array module; ``asarray(value, dtype)``; ``to_numpy(array)`` (a host copy).
- ``kernel(op)``: the kernel to run ``op`` with; by default ``op.kernel``, which is written with
  numpy calls that CuPy also accepts (NumPy's ``__array_function__``/``__array_ufunc__`` protocols
  send them to CuPy), unless the backend registered its own in ``op.kernels``.

CuPy is imported only inside ``cupy_backend``; importing flowlab never needs a GPU.
"""
from __future__ import annotations

from . import numpy_backend

import numpy as np

__all__ = ["numpy_backend", "backend_for_device", "to_numpy", "device_of_array", "array_module"]


def array_module(array):
    """numpy or cupy, whichever ``array`` belongs to: for kernels that create arrays (zeros, arange)."""
    if type(array) is np.ndarray or isinstance(array, np.generic):
        return np
    return _cupy().xp


def _cupy():
    from . import cupy_backend
    return cupy_backend


def backend_for_device(device):
    """The backend that runs ops placed on ``device`` (a DeviceSpec, a device string or None)."""
    kind = getattr(device, "device_type", None) or ("GPU" if "GPU" in str(device).upper() else "CPU")
    return _cupy() if kind == "GPU" else numpy_backend


def to_numpy(array):
    """A numpy array for any backend array (copies device memory to the host)."""
    if hasattr(array, "__cuda_array_interface__"):
        return _cupy().to_numpy(array)
    return numpy_backend.to_numpy(array)


def device_of_array(array):
    if hasattr(array, "__cuda_array_interface__"):
        return f"/job:localhost/replica:0/task:0/device:GPU:{array.device.id}"
    return None
