"""The GPU twin of compiled fusion: a fused group of elementwise ops becomes ONE generated CUDA
kernel, so a chain of N ops costs one launch instead of N (on a GPU, launches and the trips through
global memory between them are the cost; the arithmetic is nearly free).

``cuda_source(fname, steps, inputs)`` writes the kernel as a plain CUDA C file: one thread per element
(a grid-stride loop, so any grid covers any n), each step one line from its op's ``c_expr``, the
prelude's helpers spelled out in CUDA's own functions (``expf``, ``tanhf``...; ``exp``, ``tanh`` in
double). The same text compiles with NVRTC (``flowlab.gpu.compile_check``), runs on the CPU in
flowlab's simulator, and is what CuPy's ``RawKernel`` launches. Arithmetic is compiled with
``--fmad=false`` (no fused multiply-add), so +, -, *, / and comparisons give numpy's bits; exp, log,
tanh and sigmoid are CUDA's (within 2 ULP in float32), not the CPU's.

``gpu_kernel(...)`` is what a fused node runs on a GPU (``OpDef.kernels["cupy"]``, chosen once per
plan by the backend of the node's device): its inputs of another dtype, laid out otherwise (not
contiguous) or broadcast another way go to the group's numpy-written kernel, which CuPy also runs.
"""
from __future__ import annotations

import re

import numpy as np

from ..execute import get_op
from . import _cfusion

__all__ = ["cuda_source", "cuda_compilable", "gpu_kernel", "fused_cuda_sources", "THREADS", "MAX_BLOCKS",
           "OPTIONS", "stats"]

THREADS, MAX_BLOCKS = 256, 4096     # threads per block; blocks per launch at most (the loop strides on)
OPTIONS = ("--fmad=false",)         # NVRTC options: a * b + c rounds twice, as numpy's does
stats = {"launches": 0, "fallbacks": 0}   # generated kernels launched, calls sent to the numpy kernel

# The C prelude's helpers (and an op's c_block function) in CUDA C: {0}, {1} are the arguments,
# {T} the C type, {f} "f" for float ("expf") and "" for double ("exp"). NaN rules as numpy's.
_CUDA = {"FL_MAX": "({0} != {0} ? {0} : {1} != {1} ? {1} : {0} > {1} ? {0} : {1})",
         "FL_MIN": "({0} != {0} ? {0} : {1} != {1} ? {1} : {0} < {1} ? {0} : {1})",
         "FL_ABS_float": "fabsf({0})", "FL_ABS_double": "fabs({0})",
         "FL_SQRT_float": "sqrtf({0})", "FL_SQRT_double": "sqrt({0})",
         "fl_expf": "exp{f}({0})", "fl_logf": "log{f}({0})", "fl_tanhf": "tanh{f}({0})",
         "fl_sigmoidf": "({T})1 / (({T})1 + exp{f}(-{0}))"}
_CALL = re.compile(r"\b((?:FL|fl)_\w+)\(")


def _spell(text, ctype):
    """``text`` (a formatted ``c_expr``) with each prelude call replaced by its CUDA C (KeyError: unknown)."""
    m = _CALL.search(text)
    if m is None:
        return text
    args, depth, start, i = [], 0, m.end(), m.end()
    for i in range(m.end(), len(text)):
        c = text[i]
        if c in ",)" and depth == 0:
            args.append(_spell(text[start:i].strip(), ctype))
            start = i + 1
            if c == ")":
                break
        depth += (c == "(") - (c == ")")
    call = _CUDA[m.group(1)].format(*args, T=ctype, f="f" if ctype == "float" else "")
    return text[:m.start()] + call + _spell(text[i + 1:], ctype)


def _expr(name, args, ctype):
    a, b = (list(args) + [None, None])[:2]
    return _spell(get_op(name).c_expr.format(a=a, b=b, T=ctype), ctype)


def cuda_compilable(steps, inputs) -> bool:
    """Whether a fused group compiles to one CUDA kernel: ``_cfusion.compilable``'s rules without its
    minimum length (every chain of 2 ops or more saves launches), and float64 groups may hold exp,
    log, tanh and sigmoid (CUDA has them in double)."""
    if len(steps) < 2 or not _cfusion.compilable(steps, inputs, min_ops=2, blocks_in_double=True):
        return False
    try:
        for name, args, _, _ in steps:
            _expr(name, args, "float")
    except (KeyError, IndexError):   # an op whose C uses a helper with no CUDA spelling here
        return False
    return True


def cuda_source(fname, steps, inputs, sources=None) -> str:
    """The CUDA C file of one kernel ``fname(const T* x0, ..., T* out, long long n)`` computing the
    group's ``steps`` (see fusion.elementwise_kernel) for ``n`` elements; ``inputs``: (shape, dtype) of
    each input, one-element ones read once as ``x[0]`` (broadcast). ``sources``: the user's line of
    each step, written in its comment. T is float, or double for a float64 group."""
    ctype = "float" if steps[-1][3] == np.float32 else "double"
    kinds = [_cfusion._kind(shape, steps[-1][2]) for shape, _ in inputs]
    value = {f"x{k}": f"v{k}" for k in range(len(inputs))}
    ops = [s[0] for s in steps]
    params = [f"const {ctype}* __restrict__ x{k}" for k in range(len(inputs))]
    lines = [f"// flowlab: {len(steps)} elementwise ops fused into one kernel ({ctype}): {', '.join(ops)}",
             "// one thread per element; the grid-stride loop lets any grid cover any n",
             f'extern "C" __global__ void {fname}({", ".join(params)}, {ctype}* __restrict__ out, long long n) {{']
    lines += [f"    const {ctype} v{k} = x{k}[0];   // one value, the same for every element"
              for k, kind in enumerate(kinds) if kind == "scalar"]
    body, once = [], {f"x{k}" for k, kind in enumerate(kinds) if kind == "scalar"}
    for j, (name, args, _, dtype) in enumerate(steps):
        where = (sources or [None] * len(steps))[j]
        note = f"// {name}" + (" (as 0 or 1)" if dtype == np.bool_ else "") + (
            f": {' '.join(str(where).split()).rstrip(chr(92))}" if where else "")
        line = f"const {ctype} t{j} = {_expr(name, [value.get(a, a) for a in args], ctype)};"
        if all(a in once for a in args) and j < len(steps) - 1:
            once.add(f"t{j}")
            lines += [f"    {note}", f"    {line}"]
        else:
            body += [f"        {note}", f"        {line}"]
    lines += ["    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;"
              " i += (long long)blockDim.x * gridDim.x) {"]
    lines += [f"        const {ctype} v{k} = x{k}[i];" for k, kind in enumerate(kinds) if kind == "full"]
    lines += body + [f"        out[i] = t{len(steps) - 1};", "    }", "}"]
    return "\n".join(lines) + "\n"


_xp: list = []        # cupy (or None), looked up at the first GPU call: importing flowlab never imports it
_raw: dict = {}       # source text -> cupy.RawKernel (CuPy compiles it at its first launch, per device)


class FusedCudaKernel:
    """``kernel(*xs)``: a fused group's generated CUDA kernel, launched through CuPy on the device of
    its inputs (THREADS per block, at most MAX_BLOCKS blocks), into an output it allocates. Inputs that
    are not CuPy arrays of the group's dtype, contiguous, full-size ones of one shape and one-element
    ones, go to ``fallback``: the group's numpy-written kernel (which CuPy runs, op by op)."""

    __slots__ = ("fname", "steps", "inputs", "sources", "fallback", "dtype", "full", "scalars", "_source", "_raw")

    def __init__(self, fname, steps, inputs, fallback, sources=None):
        self.fname, self.steps, self.inputs, self.sources, self.fallback = fname, steps, inputs, sources, fallback
        self.dtype = steps[-1][3]
        kinds = [_cfusion._kind(shape, steps[-1][2]) for shape, _ in inputs]
        self.full = [k for k, kind in enumerate(kinds) if kind == "full"]
        self.scalars = [k for k, kind in enumerate(kinds) if kind == "scalar"]
        self._source = self._raw = None

    @property
    def source(self) -> str:
        if self._source is None:
            self._source = cuda_source(self.fname, self.steps, self.inputs, self.sources)
        return self._source

    def __call__(self, *xs):
        if not _xp:
            from ..backends import cupy_backend
            _xp.append(cupy_backend.xp)
        xp, x, dtype = _xp[0], xs[self.full[0]], self.dtype
        if xp is None or x.__class__ is not xp.ndarray:
            return self._fall_back(xs)
        shape, device = x.shape, x.device.id
        for k in self.full:
            a = xs[k]
            if (a.__class__ is not xp.ndarray or a.shape != shape or a.dtype != dtype or not a.flags.c_contiguous
                    or a.device.id != device):
                return self._fall_back(xs)
        for k in self.scalars:
            a = xs[k]
            if a.__class__ is not xp.ndarray or a.size != 1 or a.dtype != dtype or a.ndim > len(shape) \
                    or a.device.id != device:
                return self._fall_back(xs)
        if device != xp.cuda.runtime.getDevice():
            with x.device:
                return self._launch(xp, xs, shape)
        return self._launch(xp, xs, shape)

    def _launch(self, xp, xs, shape):
        out = xp.empty(shape, self.dtype)
        n = out.size
        if n:
            raw = self._raw
            if raw is None:
                raw = self._raw = _raw.get(self.source) or _raw.setdefault(
                    self.source, xp.RawKernel(self.source, self.fname, options=OPTIONS))
            raw((min(MAX_BLOCKS, -(-n // THREADS)),), (THREADS,), (*xs, out, np.int64(n)))
            stats["launches"] += 1
        return out

    def _fall_back(self, xs):
        stats["fallbacks"] += 1
        return self.fallback(*xs)


def gpu_kernel(fname, steps, inputs, fallback, sources=None):
    """What a fused group runs on a GPU: its ``FusedCudaKernel`` when it compiles to one, else
    ``fallback`` (its numpy-written kernel, never a CPU-compiled one: CuPy runs that one)."""
    if cuda_compilable(steps, inputs):
        return FusedCudaKernel(fname, steps, inputs, fallback, sources)
    return fallback


def fused_cuda_sources(function) -> list:
    """The generated CUDA sources of a traced function's fused groups, in plan order: of its latest
    trace for an ``fl.function`` (call it once first), or of a ConcreteFunction or a Plan."""
    from ..executor import Plan
    from ..function import ConcreteFunction, Function
    if isinstance(function, Function):
        if not function._cache:
            raise ValueError(f"{function!r} has not been traced yet: call it (or get_concrete_function) first")
        function = list(function._cache.values())[-1]
    plan = function._plan if isinstance(function, ConcreteFunction) else function
    if not isinstance(plan, Plan):
        raise TypeError(f"fused_cuda_sources needs an fl.function, a ConcreteFunction or a Plan, not {function!r}"
                        " (a function with ops on other tasks runs partitions: they have no one plan)")
    kernels = [n.op.kernels.get("cupy") for n in plan.nodes]
    return [k.source for k in kernels if isinstance(k, FusedCudaKernel)]
