"""GPU kernels for learners: CUDA C that you can read, compile-check, run on the CPU in a simulator
that executes every thread, and launch on a real GPU through CuPy, with the same source.

- ``kernels()`` / ``source(what)``: flowlab's own kernels (``.cu`` files), the kernel an op runs on a
  GPU (``source("softmax")``), or the kernels generated for a traced function's fused chains.
- ``Kernel(source, name)``: ``.compile()``, ``.simulate(grid, block, args)``, ``.launch(...)`` (on a
  GPU where one is visible, else simulated; numpy arrays are written in place either way).
- ``simulate(source, name, grid, block, args)``: every thread on the CPU, ``__syncthreads`` a real
  barrier; raises ``OutOfBoundsError``, ``DivergentBarrierError``, ``KernelTimeoutError`` with the
  thread and the line, and returns a ``SimReport`` (memory access counts, races).
- ``compile_check(source)``: NVRTC (from PyPI, no GPU needed) compiles it and reports registers,
  shared memory and barriers per kernel.
"""
from ._nvrtc import CompileReport, CudaCompileError, KernelUsage, compile_check, nvrtc_available  # noqa: F401
from ._sim import (DivergentBarrierError, KernelArgumentError, KernelFault, KernelSourceError,  # noqa: F401
                   KernelTimeoutError, OutOfBoundsError, Race, RaceError, SimReport, WarpSyncError,
                   parse_kernels, simulate)
from ._kernels import Kernel, kernels, source  # noqa: F401
