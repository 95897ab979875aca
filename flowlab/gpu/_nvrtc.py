"""Compile checks for CUDA C without a GPU or a CUDA install: NVRTC, NVIDIA's runtime compiler, from
its PyPI wheel (``nvidia-cuda-nvrtc``), called through ctypes. NVRTC compiles to a cubin for a chosen
architecture with no driver and no device; ptxas, run inside it with ``-v``, reports each kernel's
registers, shared memory, barriers and spills, which ``compile_check`` returns.

Where the library is found, in order: ``$FLOWLAB_NVRTC`` (a path to libnvrtc), the ``nvidia`` wheels
(``nvidia/cu13/lib``, ``nvidia/cuda_nvrtc/lib``), then the system's (``ctypes.util.find_library``).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import re
import threading
from dataclasses import dataclass, field

__all__ = ["compile_check", "CompileReport", "KernelUsage", "CudaCompileError", "nvrtc_available",
           "nvrtc_version", "DEFAULT_ARCH"]

DEFAULT_ARCH = "sm_90"   # Hopper (H100, H200); any sm_XX that this NVRTC knows works
_lib = []
_lock = threading.Lock()


class CudaCompileError(Exception):
    """NVRTC rejected the source: ``log`` is its message, with the kernel file's own line numbers."""

    def __init__(self, name, log):
        self.name, self.log = name, log
        super().__init__(f"CUDA compile error in {name}:\n{log.strip()}")


@dataclass
class KernelUsage:
    """What ptxas reported for one kernel (``__global__`` function)."""
    name: str
    registers: int = 0          # per thread
    shared_bytes: int = 0       # static shared memory per block
    barriers: int = 0
    stack_bytes: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    constant_bytes: int = 0


@dataclass
class CompileReport:
    """The result of ``compile_check``: per kernel its ``KernelUsage``, the cubin's size, the log."""
    source_name: str
    arch: str
    kernels: dict = field(default_factory=dict)   # name -> KernelUsage
    cubin_bytes: int = 0
    log: str = ""

    def __str__(self):
        rows = [f"{self.source_name} for {self.arch}: {self.cubin_bytes} bytes of cubin"]
        for k in self.kernels.values():
            spill = f", spills {k.spill_stores} B stored / {k.spill_loads} B loaded" if (k.spill_stores or k.spill_loads) else ""
            rows.append(f"  {k.name}: {k.registers} registers/thread, {k.shared_bytes} B shared memory/block, "
                        f"{k.barriers} barrier(s){spill}")
        return "\n".join(rows)

    def _repr_pretty_(self, p, cycle):
        p.text(str(self))


def _candidates():
    env = os.environ.get("FLOWLAB_NVRTC")
    if env:
        yield env
    try:
        import nvidia  # the namespace package of NVIDIA's PyPI wheels
        for root in list(nvidia.__path__):
            for pattern in ("cu*/lib/libnvrtc.so.*", "cuda_nvrtc/lib/libnvrtc.so.*", "cu*/bin/nvrtc64_*.dll",
                            "cuda_nvrtc/bin/nvrtc64_*.dll"):
                for path in sorted(glob.glob(os.path.join(root, pattern)), reverse=True):
                    if "builtins" not in os.path.basename(path) and "alt" not in os.path.basename(path):
                        yield path
    except ImportError:
        pass
    found = ctypes.util.find_library("nvrtc")
    if found:
        yield found


def _load():
    with _lock:
        if not _lib:
            lib, why = None, "no libnvrtc found (pip install nvidia-cuda-nvrtc, or set FLOWLAB_NVRTC)"
            for path in _candidates():
                try:
                    lib = ctypes.CDLL(path)
                    break
                except OSError as e:
                    why = f"{path}: {e}"
            if lib is not None:
                lib.nvrtcGetErrorString.restype = ctypes.c_char_p
            _lib.append((lib, why))
        return _lib[0]


def nvrtc_available() -> bool:
    """Whether NVRTC can be loaded here (no GPU is needed)."""
    return _load()[0] is not None


def nvrtc_version() -> tuple:
    lib, why = _load()
    if lib is None:
        raise RuntimeError(f"NVRTC is not available: {why}")
    major, minor = ctypes.c_int(), ctypes.c_int()
    lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return major.value, minor.value


def _check(lib, code, what):
    if code != 0:
        raise RuntimeError(f"NVRTC {what} failed: {lib.nvrtcGetErrorString(code).decode()}")


_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_USED = re.compile(r"Used (\d+) registers(?:, used (\d+) barriers)?(?:, (\d+) bytes smem)?(?:, (\d+) bytes cmem\[0\])?")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


def _parse_usage(log):
    kernels, current = {}, None
    for line in log.splitlines():
        m = _ENTRY.search(line)
        if m:
            current = kernels.setdefault(m.group(1), KernelUsage(m.group(1)))
            continue
        if current is None:
            continue
        m = _FRAME.search(line)
        if m:
            current.stack_bytes, current.spill_stores, current.spill_loads = map(int, m.groups())
            continue
        m = _USED.search(line)
        if m:
            current.registers = int(m.group(1))
            current.barriers = int(m.group(2) or 0)
            current.shared_bytes = int(m.group(3) or 0)
            current.constant_bytes = int(m.group(4) or 0)
    return kernels


def compile_check(source: str, name: str = "kernel.cu", *, arch: str = DEFAULT_ARCH, options=()) -> CompileReport:
    """Compile CUDA C ``source`` (the text of a ``.cu`` file) for ``arch`` with NVRTC, here, with no
    GPU. Returns what each kernel uses; raises ``CudaCompileError`` with NVRTC's messages (lines
    counted in ``source``) when it does not compile, and RuntimeError when NVRTC is missing."""
    lib, why = _load()
    if lib is None:
        raise RuntimeError(f"NVRTC is not available: {why}")
    prog = ctypes.c_void_p()
    _check(lib, lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None, None),
           "nvrtcCreateProgram")
    try:
        opts = [f"-arch={arch}".encode(), b"-Xptxas=-v", b"-default-device"] + [o.encode() for o in options]
        code = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
        size = ctypes.c_size_t()
        _check(lib, lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size)), "nvrtcGetProgramLogSize")
        buf = ctypes.create_string_buffer(size.value)
        _check(lib, lib.nvrtcGetProgramLog(prog, buf), "nvrtcGetProgramLog")
        log = buf.value.decode(errors="replace")
        if code != 0:
            raise CudaCompileError(name, log or lib.nvrtcGetErrorString(code).decode())
        cubin = ctypes.c_size_t()
        _check(lib, lib.nvrtcGetCUBINSize(prog, ctypes.byref(cubin)), "nvrtcGetCUBINSize")
        return CompileReport(name, arch, _parse_usage(log), cubin.value, log)
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
