"""flowlab's CUDA kernels: plain CUDA C files in ``core/backends/cuda/``, each readable from Python
(``source("matmul_tiled")``, or ``fl.gpu.source``), launched on a GPU through CuPy (``launch``), and
run by the ops they serve: importing this module sets ``op.kernels["cupy"]`` of softmax and the
sparse softmax cross-entropy (per example and its mean) with their gradients, so on a GPU they run
the fused kernels of ``softmax_xent.cu``; other shapes and dtypes keep the op's own kernel.

The same files compile without a GPU (``fl.gpu.compile_check``) and run on the CPU in the thread
simulator (``fl.gpu.Kernel.from_library(name).simulate(...)``): one source, three ways to run it.
"""
from __future__ import annotations

import difflib
import re
import threading
from pathlib import Path

import numpy as np

from ..execute import get_op
from ..ops import nn_ops  # noqa: F401 - defines the ops whose GPU kernels are registered below
from . import cupy_backend

__all__ = ["KERNEL_DIR", "kernel_names", "source", "file_of", "params", "parse_signatures", "launch", "launch_source",
           "op_kernels", "OP_KERNELS"]

KERNEL_DIR = Path(__file__).with_name("cuda")
BLOCK = 256                 # the largest block the row kernels take (their ``#define BLOCK``)
_SIGNATURE = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\(([^)]*)\)')
_SCALARS = {"int": np.int32, "int32_t": np.int32, "unsigned int": np.uint32, "unsigned": np.uint32,
            "uint32_t": np.uint32, "long long": np.int64, "int64_t": np.int64, "unsigned long long": np.uint64,
            "size_t": np.uint64, "float": np.float32, "double": np.float64, "bool": np.bool_, "char": np.int8, "unsigned char": np.uint8}
_index: dict = {}           # kernel name -> (its .cu file, its parameters, the file's text)
_compiled: dict = {}        # (source, name) -> cupy.RawKernel (which caches its binary per device)


def parse_signatures(text: str) -> dict:
    """``{kernel: [(param, ctype, is_pointer), ...]}`` for each ``extern "C" __global__`` function of
    CUDA C ``text``; ``ctype`` without ``const`` or ``*`` (``"float"``)."""
    out = {}
    for name, plist in _SIGNATURE.findall(text):
        params = []
        for p in filter(None, (p.strip() for p in plist.split(","))):
            words = p.replace("*", " * ").split()
            ctype = " ".join(w for w in words[:-1] if w not in ("const", "*", "__restrict__"))
            params.append((words[-1], ctype, "*" in words))
        out[name] = params
    return out


def _kernels() -> dict:
    if not _index:
        for path in sorted(KERNEL_DIR.glob("*.cu")):
            text = path.read_text()
            for name, plist in parse_signatures(text).items():
                _index[name] = (path, plist, text)
    return _index


def kernel_names() -> list:
    """The names of the library's kernels, sorted."""
    return sorted(_kernels())


def _entry(name):
    try:
        return _kernels()[name]
    except KeyError:
        close = difflib.get_close_matches(str(name), _kernels(), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise KeyError(f"no CUDA kernel named {name!r}{hint} (kernels: {', '.join(kernel_names())})") from None


def file_of(name: str) -> Path:
    """The ``.cu`` file that defines kernel ``name``."""
    return _entry(name)[0]


def source(name: str) -> str:
    """The whole text of the ``.cu`` file that defines kernel ``name`` (what CuPy compiles)."""
    return _entry(name)[2]


def params(name: str) -> list:
    """Kernel ``name``'s parameters: ``[(param, ctype, is_pointer), ...]``."""
    return list(_entry(name)[1])


def _argument(kernel, param, value):
    pname, ctype, pointer = param
    if not pointer:
        if ctype in _SCALARS:
            return _SCALARS[ctype](value)
        if isinstance(value, np.generic):
            return value
        raise TypeError(f"{kernel}: pass parameter {ctype} {pname} as a numpy scalar of that C type")
    xp = cupy_backend.xp
    if not isinstance(value, xp.ndarray):
        raise TypeError(f"{kernel}: parameter {ctype}* {pname} needs a CuPy array, got {type(value).__name__}")
    want = _SCALARS.get(ctype)
    if want is not None and value.dtype != want:
        raise TypeError(f"{kernel}: parameter {ctype}* {pname} needs {np.dtype(want).name}, got {value.dtype}")
    if not value.flags.c_contiguous:
        raise ValueError(f"{kernel}: parameter {pname} must be C-contiguous (kernels index memory directly)")
    return value


def launch_source(text, name, grid, block, args, shared_mem=0, signature=None):
    """Compile kernel ``name`` of CUDA C ``text`` once (a ``cupy.RawKernel``, cached) and launch it on
    the current GPU with ``args``: CuPy arrays for pointers (checked against the C types) and
    numbers for scalars, converted to the parameter's C type (CuPy would pass a Python int as a
    64-bit integer). Returns when the launch is queued, as CUDA does."""
    signature = signature if signature is not None else parse_signatures(text).get(name)
    if signature is None:
        raise KeyError(f"no extern \"C\" __global__ kernel named {name!r} in the source "
                       "(CuPy finds a kernel by its C name: declare it extern \"C\" __global__ void ...)")
    if len(args) != len(signature):
        raise TypeError(f"{name} takes {len(signature)} arguments "
                        f"({', '.join(p for p, _, _ in signature)}), got {len(args)}")
    kernel = _compiled.get((text, name))
    if kernel is None:
        kernel = _compiled[(text, name)] = cupy_backend.xp.RawKernel(text, name)
    grid, block = (tuple(int(d) for d in np.atleast_1d(dims)) for dims in (grid, block))
    kernel(grid, block, tuple(_argument(name, p, a) for p, a in zip(signature, args)), shared_mem=int(shared_mem))


def launch(name, grid, block, args, shared_mem=0):
    """Launch library kernel ``name`` on the current GPU (see ``launch_source``)."""
    _, signature, text = _entry(name)
    launch_source(text, name, grid, block, args, shared_mem, signature)


# -- the ops' GPU kernels ---------------------------------------------------------------------------
_softmax_slot = threading.local()   # (logits, probs) of the last forward, for its backward (as nn_ops does)


def _rows(logits, axis=-1):
    """(rows, cols) when the fused kernels take ``logits``: a CuPy array (not a test's stand-in GPU
    array), float32, softmax along the last axis."""
    if not cupy_backend.owns(logits) or logits.dtype != np.float32 or not logits.size:
        return None
    if axis not in (-1, logits.ndim - 1):
        return None
    return logits.size // logits.shape[-1], logits.shape[-1]


def _block_for(cols):
    return int(min(BLOCK, max(32, 1 << (int(cols) - 1).bit_length())))   # a power of two, a warp at least


def _labels32(labels):
    xp = cupy_backend.xp
    return xp.ascontiguousarray(labels.reshape(-1), dtype=xp.int32)


def _softmax(logits, axis):
    shape = _rows(logits, axis)
    if shape is None:
        return _SOFTMAX.kernel(logits, axis=axis)
    xp = cupy_backend.xp
    x = xp.ascontiguousarray(logits)
    probs = xp.empty_like(x)
    with x.device:
        launch("softmax_rows", (shape[0],), (_block_for(shape[1]),), (x, probs, *shape))
    return probs


def _xent_forward(op, mean):
    def forward(labels, logits):
        shape = _rows(logits)
        if shape is None:
            return op.kernel(labels, logits)
        xp = cupy_backend.xp
        x = xp.ascontiguousarray(logits)
        probs, loss = xp.empty_like(x), xp.empty(logits.shape[:-1], xp.float32)
        with x.device:
            launch("softmax_xent_forward", (shape[0],), (_block_for(shape[1]),),
                   (x, _labels32(labels), probs, loss, *shape))
        _softmax_slot.value = (logits, probs)
        return loss.mean() if mean else loss
    return forward


def _xent_backward(op, mean):
    def backward(g, labels, logits):
        shape = _rows(logits)
        if shape is None:
            return op.kernel(g, labels, logits)
        xp = cupy_backend.xp
        cached = getattr(_softmax_slot, "value", None)
        _softmax_slot.value = None
        probs = cached[1] if cached is not None and cached[0] is logits else _softmax(logits, -1)
        if mean:   # one dloss for all rows: g / N
            dloss = xp.empty(shape[0], xp.float32)
            dloss[...] = g / max(shape[0], 1)
        else:
            dloss = xp.ascontiguousarray(g.reshape(-1), dtype=xp.float32)
        with probs.device:   # in place: each thread reads probs[i] before it writes dlogits[i]
            launch("softmax_xent_backward", (shape[0],), (_block_for(shape[1]),),
                   (probs, _labels32(labels), dloss, probs, *shape))
        return probs.reshape(logits.shape)
    return backward


_SOFTMAX = get_op("softmax")
_OPS = {  # op -> (its GPU kernel, the library kernels it launches)
    "softmax": (_softmax, ("softmax_rows",)),
    "sparse_softmax_cross_entropy_with_logits": (
        _xent_forward(get_op("sparse_softmax_cross_entropy_with_logits"), False), ("softmax_xent_forward",)),
    "sparse_softmax_cross_entropy_mean": (
        _xent_forward(get_op("sparse_softmax_cross_entropy_mean"), True), ("softmax_xent_forward",)),
    "sparse_softmax_cross_entropy_grad": (
        _xent_backward(get_op("sparse_softmax_cross_entropy_grad"), False), ("softmax_xent_backward",)),
    "sparse_softmax_cross_entropy_mean_grad": (
        _xent_backward(get_op("sparse_softmax_cross_entropy_mean_grad"), True), ("softmax_xent_backward",)),
}
for _name, (_kernel, _) in _OPS.items():
    get_op(_name).kernels[cupy_backend.name] = _kernel
OP_KERNELS = {name: launched for name, (_, launched) in _OPS.items()}   # op -> the library kernels it runs


def op_kernels(op) -> tuple:
    """The library kernels that op ``op`` (a name or an OpDef) runs on a GPU; () for none."""
    return OP_KERNELS.get(getattr(op, "name", op), ())
