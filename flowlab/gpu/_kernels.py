"""A CUDA kernel a learner holds: read it, compile-check it, simulate it on the CPU, launch it on a GPU,
all from one source text.

    k = fl.gpu.Kernel.from_library("vector_add")      # or fl.gpu.Kernel(my_source, "my_kernel")
    print(k)                                          # its source, with line numbers
    k.compile()                                       # NVRTC, no GPU needed: registers, shared memory
    c = np.zeros(1000, np.float32)
    k((4,), (256,), (a, b, c, 1000))                  # on a GPU if one is visible, else simulated
    # c now holds a + b either way: results are written into the caller's arrays

``fl.gpu.source("softmax")`` shows the CUDA source an op runs on a GPU; ``fl.gpu.kernels()`` lists
flowlab's own kernels (core/backends/cuda/*.cu).
"""
from __future__ import annotations

import html

import numpy as np

from ..core.backends import cuda_kernels, cupy_backend, visible_gpus
from ._nvrtc import DEFAULT_ARCH, compile_check

__all__ = ["Kernel", "kernels", "source"]


def kernels() -> list:
    """The names of flowlab's CUDA kernels (the files in flowlab/core/backends/cuda/), sorted."""
    return cuda_kernels.kernel_names()


def source(what) -> str:
    """The CUDA source of ``what``: a kernel's name (``"matmul_tiled"``), or an op (its name, like
    ``"softmax"``, or its OpDef) that runs one of flowlab's kernels on a GPU: the whole ``.cu`` file;
    or a traced function (``@fl.function``, called at least once): the kernels generated for its
    fused elementwise chains, one per chain, as a GPU would run them."""
    if callable(what) and not isinstance(what, str) and hasattr(what, "get_concrete_function"):
        from ..core.passes.cuda_fusion import fused_cuda_sources
        return "\n".join(fused_cuda_sources(what))
    name = getattr(what, "name", what)
    if isinstance(name, str):
        if name in cuda_kernels.kernel_names():
            return cuda_kernels.source(name)
        launched = cuda_kernels.op_kernels(name)
        if launched:
            return cuda_kernels.source(launched[0])
    raise KeyError(f"no CUDA kernel for {what!r}: give a kernel ({', '.join(kernels())}) or an op that "
                   f"runs one on a GPU ({', '.join(sorted(cuda_kernels.OP_KERNELS))})")


def _gpu():
    """The GPU a launch runs on (the first visible one), or None to simulate."""
    gpus = visible_gpus() if cupy_backend.available() else ()
    return gpus[0] if gpus else None


class Kernel:
    """One ``__global__`` function ``name`` of CUDA C ``source`` (which may define several).

    ``params``: ``[(param, ctype, is_pointer), ...]``. ``compile(arch)`` checks it with NVRTC;
    ``simulate(grid, block, args)`` runs every thread on the CPU and returns a ``SimReport``;
    ``launch(grid, block, args)`` (or calling the kernel) runs it on a GPU where one is visible and
    simulates it elsewhere. Arrays are numpy arrays, written in place either way."""

    def __init__(self, source: str, name: str, *, filename: str | None = None):
        from ._sim import parse_kernels
        found = parse_kernels(source)
        if name not in found:
            raise KeyError(f"no __global__ kernel named {name!r} in this source "
                           f"(it defines: {', '.join(found) or 'none'})")
        self.source, self.name, self.params = source, name, found[name]
        self.filename = filename or f"{name}.cu"

    @classmethod
    def from_library(cls, name: str) -> "Kernel":
        """flowlab's kernel ``name`` (see ``kernels()``), from its ``.cu`` file."""
        return cls(cuda_kernels.source(name), name, filename=cuda_kernels.file_of(name).name)

    def compile(self, arch: str = DEFAULT_ARCH):
        """NVRTC's report for this kernel (registers, shared memory, barriers), compiled here without
        a GPU; raises CudaCompileError with the file's line numbers if it does not compile."""
        report = compile_check(self.source, self.filename, arch=arch)
        report.kernels = {k: v for k, v in report.kernels.items() if k == self.name}
        return report

    def simulate(self, grid, block, args, **options):
        """Run every thread on the CPU (flowlab.gpu's simulator): results go into the numpy arrays
        in ``args``; returns the SimReport (access counts, races). ``options``: ``simulate``'s."""
        from ._sim import simulate
        return simulate(self.source, self.name, grid, block, args, **options)

    def launch(self, grid, block, args, shared_mem: int = 0):
        """Run on the first visible GPU through CuPy: numpy arrays are copied to it, the kernel
        runs, and each writeable numpy array gets the device's result back, so code reads the same
        with and without a GPU. Where none is visible, simulates instead and returns the SimReport
        (on a GPU: None). CuPy arrays are passed as they are."""
        gpu = _gpu()
        if gpu is None:
            return self.simulate(grid, block, self._typed(args), shared_mem=shared_mem)
        xp = cupy_backend.xp
        if len(args) != len(self.params):
            raise TypeError(f"{self.name} takes {len(self.params)} arguments "
                            f"({', '.join(p[0] for p in self.params)}), got {len(args)}")
        with xp.cuda.Device(gpu):
            on_device, copies = [], []
            for (pname, _, pointer), value in zip(self.params, args):
                if pointer and isinstance(value, np.ndarray):
                    if not value.flags.c_contiguous:
                        raise ValueError(f"{self.name}: parameter {pname} must be a C-contiguous array")
                    value, host = xp.asarray(value), value
                    if host.flags.writeable:
                        copies.append((host, value))
                on_device.append(value)
            cuda_kernels.launch_source(self.source, self.name, grid, block, on_device, shared_mem)
            for host, device in copies:
                host[...] = xp.asnumpy(device)   # waits for the kernel, as reading device memory does
        return None

    __call__ = launch

    def _typed(self, args):
        """Python numbers as their parameters' C types, as the GPU path converts them (so a learner's
        ``k(grid, block, [x, y, 2.0, n])`` runs the same in both); ``simulate`` itself takes what CuPy
        would be given, and says so when a bare Python float would be read as the wrong bytes."""
        from ._sim import _DTYPES
        if len(args) != len(self.params):
            return args     # simulate names the kernel's parameters in its error
        return [np.dtype(_DTYPES[ctype][0]).type(value)
                if not pointer and ctype in _DTYPES and isinstance(value, (int, float)) and not isinstance(value, bool)
                else value for (_, ctype, pointer), value in zip(self.params, args)]

    def _lines(self):
        return self.source.rstrip().splitlines()   # line 1 stays line 1, as in error messages

    def __repr__(self):
        lines = self._lines()
        width = len(str(len(lines)))
        body = "\n".join(f"{i:>{width}} | {line}" for i, line in enumerate(lines, 1))
        return f"<Kernel {self.name} ({self.filename})>\n{body}"

    def _repr_html_(self):
        lines = self._lines()
        rows = "\n".join(f"<span style='color:#888'>{i:>{len(str(len(lines)))}}</span>  {html.escape(line)}"
                         for i, line in enumerate(lines, 1))
        return f"<div><b>Kernel {html.escape(self.name)}</b> ({html.escape(self.filename)})<pre>{rows}</pre></div>"
