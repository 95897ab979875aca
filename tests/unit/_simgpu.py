"""A simulated GPU: a stand-in for CuPy, for testing flowlab's GPU paths on a machine without one.

``DeviceArray`` is an array in a simulated GPU's memory. It behaves as a CuPy array does where
flowlab could go wrong (read in CuPy's source: cupy/_core/core.pyx, cupy/lib/stride_tricks.py):

- it refuses to become a numpy array implicitly (``np.asarray(a)``: ``Implicit conversion to a
  NumPy array is not allowed``); ``float()``, ``int()`` and ``bool()`` of it work, as in CuPy;
- it refuses to be mixed with a numpy array in one operation (``Unsupported type``), except
  0-d numpy arrays in comparisons (CuPy's workaround for numpy/numpy#12142), numpy scalars, and
  numpy arrays used as indices (CuPy copies those to the device);
- its array module's ``lib.stride_tricks.as_strided(x, shape, strides)`` has no ``writeable``
  (nor ``subok``) keyword, and gives a writeable view, as CuPy's does;
- reductions give 0-d arrays on the device, never numpy scalars.

Device memory is counted per device (``SimulatedGPUs.memory``: bytes of live arrays that own
their memory, and the peak since the last reset), so flowlab's memory stats can be checked.

``SimulatedGPUs`` is a GPU backend (the contract in flowlab/core/backends/__init__.py) with n
devices. It stands in for CuPy, not for any part of flowlab: the ``gpus`` fixture (conftest.py)
puts it in the GPU backend's place, and flowlab's dispatch, placement and plans run unchanged.
"""
from __future__ import annotations

import types
import weakref

import numpy as np
from numpy.lib.mixins import NDArrayOperatorsMixin

_COMPARISONS = {"greater", "greater_equal", "less", "less_equal", "equal", "not_equal"}


class _Memory:
    """Bytes held on each simulated device now, and the most held since the last reset."""

    def __init__(self):
        self.current, self.peak, self._seen = {}, {}, set()

    def allocate(self, data, device):
        if data.base is not None or id(data) in self._seen:   # a view, or counted already
            return
        key, n = id(data), data.nbytes
        self._seen.add(key)
        now = self.current[device] = self.current.get(device, 0) + n
        self.peak[device] = max(self.peak.get(device, 0), now)
        weakref.finalize(data, self._free, key, device, n)

    def _free(self, key, device, n):
        self._seen.discard(key)
        self.current[device] -= n

    def reset_peak(self, device):
        self.peak[device] = self.current.get(device, 0)


MEMORY = _Memory()


class DeviceArray(NDArrayOperatorsMixin):
    """An array in the memory of simulated GPU ``device``."""

    __array_priority__ = 200

    def __init__(self, data, device):
        self._data, self.device = data, device
        MEMORY.allocate(data, device)

    shape = property(lambda self: self._data.shape)
    dtype = property(lambda self: self._data.dtype)
    ndim = property(lambda self: self._data.ndim)
    size = property(lambda self: self._data.size)
    nbytes = property(lambda self: self._data.nbytes)
    strides = property(lambda self: self._data.strides)
    T = property(lambda self: DeviceArray(self._data.T, self.device))
    flags = property(lambda self: self._data.flags)

    def __array__(self, *args, **kwargs):
        raise TypeError("Implicit conversion to a NumPy array is not allowed. "
                        "Please use `.get()` to construct a NumPy array explicitly. (simulated GPU array)")

    def get(self):
        return self._data.copy()

    def _unwrap(self, x, host_ok=False):
        if isinstance(x, DeviceArray):
            if x.device != self.device:
                raise ValueError(f"arrays on simulated GPUs {self.device} and {x.device} in one operation")
            return x._data
        if isinstance(x, (list, tuple)):
            return type(x)(self._unwrap(v, host_ok) for v in x)
        if isinstance(x, np.ndarray) and not host_ok:
            raise TypeError(f"Unsupported type {type(x)}")
        return x

    def _wrap(self, x):
        if isinstance(x, (np.ndarray, np.generic)):
            return DeviceArray(np.asarray(x), self.device)
        if isinstance(x, tuple):
            return tuple(self._wrap(v) for v in x)
        return x

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if "out" in kwargs:
            kwargs["out"] = self._unwrap(kwargs["out"])
        if ufunc.__name__ in _COMPARISONS:   # CuPy takes 0-d numpy arrays there (numpy/numpy#12142)
            inputs = tuple(x.item() if isinstance(x, np.ndarray) and x.ndim == 0 else x for x in inputs)
        return self._wrap(getattr(ufunc, method)(*self._unwrap(inputs), **kwargs))

    def __array_function__(self, func, types, args, kwargs):
        return self._wrap(func(*self._unwrap(args), **{k: self._unwrap(v) for k, v in kwargs.items()}))

    def __getattr__(self, name):   # methods: reshape, astype, sum, copy, ...
        if name.startswith("__"):   # never __array_interface__: no way into numpy but .get()
            raise AttributeError(name)
        attr = getattr(self._data, name)
        if not callable(attr):
            return attr
        return lambda *a, **k: self._wrap(attr(*self._unwrap(a), **{n: self._unwrap(v) for n, v in k.items()}))

    def __getitem__(self, index):   # CuPy copies numpy index arrays to the device (_routines_indexing.pyx)
        return self._wrap(self._data[self._unwrap(index, host_ok=True)])

    def __setitem__(self, index, value):
        self._data[self._unwrap(index, host_ok=True)] = self._unwrap(value)

    def __float__(self):
        return float(self._data)

    def __int__(self):
        return int(self._data)

    def __bool__(self):
        return bool(self._data)

    def __len__(self):
        return len(self._data)

    def __repr__(self):
        return f"DeviceArray({self._data!r}, device={self.device})"


def _as_strided(x, shape=None, strides=None):
    """CuPy's ``cupy.lib.stride_tricks.as_strided``: no ``writeable``, no ``subok``."""
    if not isinstance(x, DeviceArray):
        raise TypeError(f"Unsupported type {type(x)}")
    view = np.lib.stride_tricks.as_strided(x._data, shape, strides)
    return DeviceArray(view, x.device)


class _Module:
    """The simulated GPU's array module (``array_module(x).zeros(...)`` in kernels)."""

    lib = types.SimpleNamespace(stride_tricks=types.SimpleNamespace(as_strided=_as_strided))

    def __getattr__(self, name):
        fn = getattr(np, name)
        if not callable(fn):
            return fn

        def call(*args, **kwargs):   # like cupy.asarray, cupy.zeros: takes host values, gives device arrays
            device = next((a.device for a in args if isinstance(a, DeviceArray)), 0)
            args = [a._data if isinstance(a, DeviceArray) else a for a in args]
            return DeviceArray(np.asarray(fn(*args, **kwargs)), device)
        return call


class SimulatedGPUs:
    """A GPU backend (the contract in flowlab/core/backends/__init__.py) with ``n`` devices;
    ``copies`` counts host<->device and device<->device copies."""

    name = "simgpu"

    def __init__(self, n):
        self.n, self.xp, self.copies = n, _Module(), 0
        self.memory = MEMORY

    def available(self):
        return True

    def device_count(self):
        return self.n

    def owns(self, array):
        return array.__class__ is DeviceArray

    def device_of(self, array):
        return array.device

    def put(self, array, gpu):
        if array.__class__ is DeviceArray and array.device == gpu:
            return array
        self.copies += 1
        data = array._data if array.__class__ is DeviceArray else np.asarray(array)
        return DeviceArray(np.array(data), gpu)

    def asarray(self, value, dtype=None):
        return self.put(np.asarray(value, dtype=dtype), 0)

    def to_numpy(self, array):
        self.copies += 1
        return array._data.copy()

    def kernel(self, op):
        return op.kernels.get("cupy", op.kernel)

    def memory_info(self, gpu):
        return {"current": MEMORY.current.get(gpu, 0), "peak": MEMORY.peak.get(gpu, 0)}

    def reset_memory_stats(self, gpu):
        MEMORY.reset_peak(gpu)
