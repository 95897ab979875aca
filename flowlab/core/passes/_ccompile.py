"""Compiling generated C for this machine's CPU: find a C compiler, build a shared library, keep it
in a disk cache, load it with ctypes (whose calls release the GIL).

The cache (``$FLOWLAB_CACHE_DIR/kernels``, default ``~/.cache/flowlab/kernels``) holds one library
per source: its name is a hash of the source, the compiler's version, the flags and the CPU model
and features, so a library is only ever loaded on the kind of machine it was built for. A build
writes to a temporary name in the same folder and renames it into place (atomic), so processes that
build the same source at once never load a half-written file. Nothing here runs at import (nor
imports subprocess): the compiler is looked for the first time a library is wanted.
"""
from __future__ import annotations

import os
import threading
import warnings

# -O3 -march=native: vectorised loops for this CPU (in 256-bit vectors where it has them: gcc's
# tuning for some AMD CPUs prefers 128, which halves the lanes). -ffp-contract=off: no fused multiply-adds, so a
# product then a sum rounds twice, as numpy's does, and the vector loop and its scalar remainder give
# the same bits. No -ffast-math (it would reorder arithmetic and ignore NaN). -fno-math-errno only
# lets sqrt be one instruction (numpy sets no errno either) and -fno-trapping-math lets a loop with
# selects (a ? b : c) be vectorised (no code relies on floating-point traps); neither changes a result.
FLAGS = ("-O3", "-march=native", "-mprefer-vector-width=256", "-fPIC", "-shared", "-ffp-contract=off",
         "-fno-math-errno", "-fno-trapping-math")
_ENV = "FLOWLAB_COMPILED_FUSION"
_lock = threading.Lock()
_state = {"enabled": os.environ.get(_ENV, "1").strip().lower() not in ("0", "false", "no", "off"),
          "compiler": None, "warned": False}
stats = {"compiled": 0, "loaded": 0, "failed": 0}   # libraries built, found in the cache, failed


def set_enabled(flag: bool) -> None:
    _state["enabled"] = bool(flag)


def enabled() -> bool:
    return _state["enabled"]


def cache_dir() -> str:
    root = os.environ.get("FLOWLAB_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "flowlab")
    return os.path.join(root, "kernels")


def compiler():
    """``(path, version line)`` of the C compiler (``$CC``, else gcc, else cc), or None."""
    import shutil
    import subprocess
    if _state["compiler"] is None:
        found = ()
        for name in (os.environ.get("CC"), "gcc", "cc"):
            path = name and shutil.which(name)
            if path:
                try:
                    out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
                    found = (path, (out.stdout.splitlines() or ["?"])[0]) if out.returncode == 0 else ()
                except (OSError, subprocess.SubprocessError):
                    found = ()
                break
        _state["compiler"] = found
    return _state["compiler"] or None


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            lines = [ln for ln in f.read().splitlines() if ln.startswith(("model name", "flags"))]
        return "\n".join(lines[:2])
    except OSError:
        import platform
        return platform.processor() + platform.machine()


def load(source: str):
    """The ctypes library built from C ``source`` (from the cache when it is there), or None when
    compiling is switched off, there is no compiler, or the build fails (warned once)."""
    import ctypes
    import hashlib
    import subprocess
    import tempfile
    cc = compiler() if enabled() else None
    if cc is None:
        if enabled() and not _state["warned"]:
            _state["warned"] = True
            import logging
            logging.getLogger("flowlab").info("compiled fusion: no C compiler ($CC, gcc, cc) found; fused ops "
                                              "use numpy kernels")
        return None
    key = hashlib.sha256("\0".join((source, cc[1], " ".join(FLAGS), _cpu())).encode()).hexdigest()[:32]
    folder = cache_dir()
    path = os.path.join(folder, f"flowlab_{key}.so")
    with _lock:
        try:
            if os.path.exists(path):
                try:
                    lib = ctypes.CDLL(path)
                    stats["loaded"] += 1
                    return lib
                except OSError:   # a damaged file (a disk full, say): build it again
                    os.remove(path)
            os.makedirs(folder, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=folder, prefix=".build-") as tmp:
                src, so = os.path.join(tmp, "kernels.c"), os.path.join(tmp, "kernels.so")
                with open(src, "w") as f:
                    f.write(source)
                out = subprocess.run([cc[0], *FLAGS, "-o", so, src], capture_output=True, text=True, timeout=300)
                if out.returncode != 0:
                    raise RuntimeError(f"{os.path.basename(cc[0])} failed: {out.stderr.strip()[-800:]}")
                os.replace(so, path)   # atomic: another process sees the old state or the whole file
            lib = ctypes.CDLL(path)
            stats["compiled"] += 1
            return lib
        except (OSError, RuntimeError, subprocess.SubprocessError) as e:
            stats["failed"] += 1
            if not _state["warned"]:
                _state["warned"] = True
                warnings.warn(f"flowlab: compiled fusion is unavailable, fused ops use numpy kernels ({e})",
                              RuntimeWarning, stacklevel=2)
            return None


def info() -> dict:
    """What ``fl.config.compiled_fusion_info()`` shows."""
    cc = compiler() if enabled() else None
    return {"enabled": enabled(), "available": cc is not None if enabled() else None,
            "compiler": cc[0] if cc else None, "compiler_version": cc[1] if cc else None,
            "flags": " ".join(FLAGS), "cache_dir": cache_dir(), **stats}
