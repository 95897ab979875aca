"""Comparing in a process of its own: ``python -m flowlab.grading.compare`` reads
``{"pairs": [[expected, received, {"rtol": .., "atol": .., "loose_types": ..}], ...]}`` (plain data,
see :mod:`flowlab.grading.plain`) as JSON on stdin and writes a JSON list of ``[ok, why]``, one per
pair, on stdout. :func:`compare_elsewhere` runs it: a student's code never shares a process with the
comparison, so no ``__eq__`` or monkeypatch of theirs can take part in it.

``compare_elsewhere`` starts this file as a script in isolated mode (``python -I .../compare.py``:
no PYTHONPATH, no user site, no current directory on the path), which imports ``plain.py`` by its
path and numpy, not the whole flowlab package: about half a second less per check.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

__all__ = ["compare_elsewhere", "compare_pairs", "main"]

_HERE = os.path.dirname(os.path.abspath(__file__))


def _compare_function():
    if __package__:
        from .plain import compare
        return compare
    import importlib.util                      # run as a script: plain.py by its path
    spec = importlib.util.spec_from_file_location("_flowlab_grading_plain", os.path.join(_HERE, "plain.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.compare


def compare_pairs(pairs) -> list:
    """``[[ok, why], ...]`` for ``[[expected, received, tolerance], ...]``, compared in this process."""
    compare = _compare_function()
    out = []
    for pair in pairs:
        expected, received = pair[0], pair[1]
        tol = pair[2] if len(pair) > 2 and isinstance(pair[2], dict) else {}
        out.append(list(compare(expected, received, rtol=tol.get("rtol", 1e-6), atol=tol.get("atol", 0.0),
                                loose_types=tol.get("loose_types", False))))
    return out


def compare_elsewhere(pairs, *, timeout: float = 60.0, python: str | None = None, with_pid: bool = False):
    """``[[ok, why], ...]`` for ``pairs`` of ``(expected, received, tolerance)`` plain data, compared in
    a fresh, isolated Python process (``with_pid=True``: ``(results, pid)``, the pid of the process
    that compared). Raises RuntimeError if that process fails."""
    pairs = [list(p) for p in pairs]
    payload = json.dumps({"pairs": pairs, "pid": True})
    proc = subprocess.run([python or sys.executable, "-I", os.path.join(_HERE, "compare.py")], input=payload,
                          capture_output=True, text=True, timeout=timeout, cwd=_HERE)
    if proc.returncode != 0:
        raise RuntimeError(f"the comparing process (flowlab/grading/compare.py) failed with exit code "
                           f"{proc.returncode}: {proc.stderr.strip()[-2000:]}")
    result = json.loads(proc.stdout)
    pid = result.pop()[1] if isinstance(result, list) and result and result[-1][:1] == ["pid"] else None
    if not isinstance(result, list) or len(result) != len(pairs):
        raise RuntimeError(f"the comparing process answered {len(result) if isinstance(result, list) else result!r} "
                           f"results for {len(pairs)} pairs")
    return (result, pid) if with_pid else result


def main(argv=None) -> int:
    """Read the pairs on stdin, write ``[[ok, why], ...]`` on stdout (``"pid": true`` in the input adds
    this process's pid as a last element ``["pid", n]``)."""
    data = json.loads(sys.stdin.read() or "{}")
    out = compare_pairs(data.get("pairs", []))
    if data.get("pid"):
        out.append(["pid", os.getpid()])
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
