"""Array backends. A backend is one file meeting this contract:

- ``name``: "numpy" or "cupy"; ``available()``: can it run here? ``device_count()``: its devices.
- ``xp``: its array module; ``asarray(value, dtype)``; ``to_numpy(array)`` (a host copy);
  ``owns(array)``: is this one of its arrays? ``device_of(array)``: which of its devices holds it.
- ``kernel(op)``: the kernel to run ``op`` with; by default ``op.kernel``, which is written with
  numpy calls that CuPy also accepts (NumPy's ``__array_function__``/``__array_ufunc__`` protocols
  send them to CuPy), unless the backend registered its own in ``op.kernels``.
- GPU backends also: ``put(array, gpu)``: the array in GPU ``gpu``'s memory (itself if there);
  ``memory_info(gpu)``: ``{"current": bytes held for arrays now, "peak": the most held at once}``,
  a real peak (counted at each allocation); ``reset_memory_stats(gpu)``: the peak starts again.

Every copy this module makes between memories (``put`` to a GPU, ``to_numpy`` back) is recorded
in core's event log as a ``copy`` event with its bytes and ``attrs`` ``{"src", "dst"}`` (device
names such as "CPU:0", "GPU:1"), so a timeline shows them; only where a GPU is visible.

The copy rule (TensorFlow's): an op runs on one device, and its inputs are copied there first:
arrays from the host or another GPU, and Python or numpy constants too. ``kernel_for_device`` is
the one place that applies it, for eager ops, graph plans and variable updates alike. Where no GPU
is visible every array is a numpy array, and kernels are returned as they are: no copy checks.

CuPy is imported only inside ``cupy_backend``; importing flowlab never needs a GPU.
"""
from __future__ import annotations

import numpy as np

from ..events import default_log, now
from . import numpy_backend

__all__ = ["numpy_backend", "backend_for_device", "kernel_for_device", "gpu_count", "visible_gpus", "to_numpy",
           "device_of_array", "array_module", "to_device_of", "to_device", "memory_info", "reset_memory_stats"]

_gpu = None         # the GPU backend: cupy_backend, unless a test put a stand-in device in (_use_gpu_backend)
_count = None       # how many GPUs it has (asked once)
_visible = None     # the real GPUs this process uses (fl.config.set_visible_devices); None: all of them
_every = None       # all of them, as visible_gpus gives them


def _cupy():
    from . import cupy_backend
    return cupy_backend


def gpu_backend():
    global _gpu
    if _gpu is None:
        _gpu = _cupy()
    return _gpu


def _use_gpu_backend(backend) -> None:
    """Put ``backend`` in the GPU's place (None: CuPy again). For tests that check the copy rule
    without a GPU, with an array type that, like CuPy's, refuses to be mixed with numpy's."""
    global _gpu, _count, _visible, _every
    _gpu, _count, _visible, _every = backend, None, None, None
    from .. import config
    config._devices_changed()


def gpu_count() -> int:
    """How many real GPUs the machine has (CuPy sees): 0 without CuPy, a driver or a device."""
    global _count
    if _count is None:
        try:
            _count = int(gpu_backend().device_count())
        except Exception:  # noqa: BLE001 - no driver or no device: no GPU
            _count = 0
    return _count


def visible_gpus() -> tuple:
    """The real GPUs this process may use, by index (all of them unless set_visible_devices hid some)."""
    global _every
    if _visible is not None:
        return _visible
    if _every is None:   # asked on every op: the tuple is made once
        _every = tuple(range(gpu_count()))
    return _every


def array_module(array):
    """numpy or cupy, whichever ``array`` belongs to: for kernels that create arrays (zeros, arange)."""
    if type(array) is np.ndarray or isinstance(array, np.generic):
        return np
    return gpu_backend().xp


def backend_for_device(device):
    """The backend that runs ops placed on ``device`` (a DeviceSpec, a device string or None):
    CuPy for a GPU where the process sees a real one; numpy for CPUs, and for the logical GPUs
    (``fl.config.set_logical_devices``) of a process that sees none."""
    kind = getattr(device, "device_type", None) or (
        "GPU" if "GPU" in str(device).upper().rpartition("/")[2] else "CPU")
    return gpu_backend() if kind == "GPU" and visible_gpus() else numpy_backend


def kernel_for_device(op, device):
    """``op``'s kernel on ``device``, which copies its input arrays into that device's memory first
    (the copy rule). ``device`` None: the device of its first input that is on a GPU, else the host
    (an op of a graph that no scope placed). Logical GPU N is visible GPU N mod their count. Where no
    GPU is visible the kernel is returned as it is: every array is a numpy array already."""
    visible = visible_gpus()
    if not visible:
        return numpy_backend.kernel(op)
    key = (op, device)
    kernel = _placed.get(key)
    if kernel is None:   # built once per op and device (an eager op on a GPU pays a dict lookup)
        if len(_placed) > 4096:
            _placed.clear()
        kernel = _placed[key] = _placed_kernel(op, device, visible)
    return kernel


_placed = {}   # (op, device) -> its kernel there; emptied when the devices change (forget_placed)


def forget_placed() -> None:
    """Drop the kernels built for devices: the GPU backend or the visible GPUs changed (config)."""
    _placed.clear()


def _placed_kernel(op, device, visible):
    if device is None:
        return _follow_inputs(op)
    backend = backend_for_device(device)
    kernel = backend.kernel(op)
    if backend is numpy_backend:
        return _on_host(kernel)
    return _on_gpu(backend, kernel, visible[_gpu_index(device) % len(visible)])


def _where(array) -> str:
    gpu = _gpu
    return f"GPU:{gpu.device_of(array)}" if gpu is not None and gpu.owns(array) else "CPU:0"


def _put(put, array, gpu):
    """``put(array, gpu)``, recorded as a copy event when it copied."""
    start = now()
    out = put(array, gpu)
    if out is not array:
        default_log().record("copy", "to GPU", start, now(), bytes=int(out.nbytes),
                             src=_where(array), dst=f"GPU:{gpu}")
    return out


def _on_host(kernel):
    owns = gpu_backend().owns

    def on_host(*arrays, **attrs):
        for a in arrays:
            if owns(a):
                arrays = [to_numpy(a) for a in arrays]
                break
        return kernel(*arrays, **attrs)
    return on_host


def _on_gpu(backend, kernel, gpu):
    put = backend.put

    def on_gpu(*arrays, **attrs):
        return kernel(*[_put(put, a, gpu) for a in arrays], **attrs)
    return on_gpu


def _follow_inputs(op):
    gpu = gpu_backend()
    host, owns = op.kernel, gpu.owns

    def follow(*arrays, **attrs):
        for a in arrays:
            if owns(a):
                index = gpu.device_of(a)
                return gpu.kernel(op)(*[_put(gpu.put, b, index) for b in arrays], **attrs)
        return host(*arrays, **attrs)
    return follow


def _gpu_index(device) -> int:
    if isinstance(device, str):
        index = device.rpartition(":")[2]
        return int(index) if index.isdigit() else 0
    return device.device_index or 0


def to_numpy(array):
    """A numpy array for any backend array (copies device memory to the host)."""
    if type(array) is np.ndarray or isinstance(array, np.generic):
        return array
    if _gpu is not None and _gpu.owns(array):
        start = now()
        out = _gpu.to_numpy(array)
        default_log().record("copy", "to host", start, now(), bytes=int(out.nbytes),
                             src=_where(array), dst="CPU:0")
        return out
    if hasattr(array, "__cuda_array_interface__"):
        return _cupy().to_numpy(array)
    return numpy_backend.to_numpy(array)


def to_device_of(like, array):
    """``array`` in the memory where ``like`` lives (a gradient for a variable on a GPU): itself
    when both are numpy arrays, else a copy (to the host, or to ``like``'s GPU)."""
    if type(like) is np.ndarray or isinstance(like, np.generic):
        return array if type(array) is np.ndarray else to_numpy(array)
    gpu = gpu_backend()
    return _put(gpu.put, array, gpu.device_of(like))


def to_device(array, device):
    """``array`` in the memory of ``device`` (a local device's full name): copied to the GPU that
    runs it, or to the host for a CPU and for logical GPUs where no GPU is visible."""
    visible = visible_gpus()
    if backend_for_device(device) is numpy_backend:
        return to_numpy(array)
    return _put(gpu_backend().put, array, visible[_gpu_index(device) % len(visible)])


def device_of_array(array):
    """The full device name of a GPU array (None for host arrays: the default CPU)."""
    if type(array) is np.ndarray or isinstance(array, np.generic):
        return None
    gpu = gpu_backend()
    if gpu.owns(array):
        real = gpu.device_of(array)
        visible = visible_gpus()
        index = visible.index(real) if real in visible else real
        return f"/job:localhost/replica:0/task:0/device:GPU:{index}"
    return None


def _memory_gpu(device: str) -> int:
    """The visible GPU that holds the memory of ``device`` ("GPU:1", "/gpu:1" or a full name)."""
    visible = visible_gpus()
    kind, _, index = str(device).upper().rpartition("/")[2].replace("DEVICE:", "").partition(":")
    if kind != "GPU" or not index.isdigit():
        raise ValueError(f"memory is counted for GPUs, as 'GPU:<index>'; got {device!r}")
    if not visible:
        raise ValueError(f"no GPU memory to count for {device!r}: this process has no GPU ({no_gpu_reason()}); "
                         f"logical GPUs (fl.config.set_logical_devices(\"GPU\", 2)) use the host's memory")
    return visible[int(index) % len(visible)]


def memory_info(device: str) -> dict:
    """``{"current": bytes, "peak": bytes}`` of a GPU's memory held for arrays (logical GPUs share
    the memory of the GPU they run on)."""
    return dict(gpu_backend().memory_info(_memory_gpu(device)))


def reset_memory_stats(device: str) -> None:
    gpu_backend().reset_memory_stats(_memory_gpu(device))


def no_gpu_reason() -> str:
    """Why this process has no GPU: no CuPy, no device, or all of them hidden."""
    if gpu_count() and not visible_gpus():
        return "all GPUs are hidden (fl.config.set_visible_devices)"
    reason = getattr(gpu_backend(), "why_unavailable", None)
    return reason() if reason is not None else "the GPU backend has no device"
