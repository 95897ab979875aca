"""Is what the learner ran what the grader will grade?

A notebook's kernel remembers cells run out of order, cells since deleted and edits never saved; the
grader runs the *saved* file top to bottom in a fresh kernel. So the in-place check (``check``) says
when the answer it just checked is not the one in the saved notebook (:func:`saved_note`), and
``check(..., clean=True)`` (or the widget's button) grades the saved notebook the way ``flowlab grade``
does, in a process of its own with a fresh kernel, for that one exercise (:func:`clean_run`).

The kernel knows its notebook's file from ``JPY_SESSION_NAME``, which Jupyter's server sets when it
starts a kernel for a notebook; a kernel started otherwise (nbclient, a console) has no notebook, and
then neither is done.
"""
from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ._cells import defined_names, read_cells

__all__ = ["notebook_path", "saved_note", "clean_run", "CLEAN_TIMEOUT_S"]

CLEAN_TIMEOUT_S = 300.0


def notebook_path():
    """The saved notebook this kernel runs (a Path), or None: not started by Jupyter's server for a
    notebook, the file is gone, or this is the grader's own kernel."""
    if os.environ.get("FLOWLAB_GRADER"):
        return None
    path = os.environ.get("JPY_SESSION_NAME", "")
    if not path.endswith(".ipynb"):
        return None
    p = Path(path)
    return p if p.is_file() else None


def _cell_source(answer):
    """The source of ``answer`` if it is a function defined in a notebook cell, else None."""
    fn = answer
    for attr in ("python_function", "__wrapped__"):      # @fl.function, functools.wraps
        fn = getattr(fn, attr, None) or fn
    code = getattr(fn, "__code__", None)
    if code is None or not ("ipykernel_" in code.co_filename or code.co_filename.startswith("<")):
        return None
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        return None


def _lines(text: str) -> list:
    return [line.rstrip() for line in text.splitlines() if line.strip()]


def _contains(cell: list, part: list) -> bool:
    n = len(part)
    return n > 0 and any(cell[i:i + n] == part for i in range(len(cell) - n + 1))


def saved_note(answer_name: str, answer, notebook) -> str:
    """A line for the learner when the saved ``notebook`` would not give the grader this ``answer``:
    no cell of it defines ``answer_name``, or (for a function) the last cell that does holds other
    code than the function that ran. "" when they agree or it cannot tell."""
    name = answer_name.split(".")[0]
    try:
        cells = read_cells(Path(notebook))
    except (OSError, ValueError):
        return ""
    defining = [(k, src) for k, src in cells if name in defined_names(src)]
    file = Path(notebook).name
    if not defining:
        return (f"the saved {file} has no cell that defines {name}: the grader runs the saved file, so save "
                f"it (Ctrl+S)")
    ran = _cell_source(answer)
    number, source = defining[-1]
    if ran is not None and not _contains(_lines(source), _lines(ran)):
        return (f"the {name} that ran is not the one in the saved {file} (cell {number}): the grader runs the "
                f"saved file top to bottom, so save it (Ctrl+S) or re-run that cell")
    return ""


def clean_run(ex_id: str, exercises, notebook, timeout: float = CLEAN_TIMEOUT_S) -> dict:
    """Grade exercise ``ex_id`` of the saved ``notebook`` as ``flowlab grade`` does: a process of its
    own (``python -m flowlab.grading.grader --only``), a fresh kernel running the file top to bottom,
    then every case of ``exercises``' checks (hidden ones too where the folder has them). Returns
    ``{"status", "points", "max", "reason", "errors": [(cell, error)], "seconds"}``; a grader that
    fails or runs past ``timeout`` gives ``status: "error"`` with the reason."""
    from .grader import _end
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="flowlab-clean-") as tmp:
        result = Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", "flowlab.grading.grader", str(notebook), "--source", str(exercises),
               "--result", str(result), "--only", ex_id]
        env = {k: v for k, v in os.environ.items() if not k.startswith("JPY_")}
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                env=env, start_new_session=True)
        try:
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _end(proc)
            return {"status": "error", "points": 0, "max": None, "errors": [],
                    "reason": f"the clean run took longer than {timeout:g} s", "seconds": round(timeout, 1)}
        try:
            graded = json.loads(result.read_text(encoding="utf-8"))
            row = next(r for r in graded["rows"] if r["exercise"] == ex_id)
        except (OSError, ValueError, KeyError, StopIteration):
            tail = (err or b"").decode(errors="replace").strip().splitlines()[-1:]
            return {"status": "error", "points": 0, "max": None, "errors": [],
                    "seconds": round(time.monotonic() - t0, 1),
                    "reason": "the clean run gave no result" + (f": {tail[0]}" if tail else "")}
    errors = [(e["cell"], e["error"]) for nb in graded.get("notebooks", {}).values() for e in nb.get("errors", [])]
    return {"status": row["status"], "points": row["points"], "max": row["max"], "reason": row["reason"],
            "errors": errors[:5], "seconds": round(time.monotonic() - t0, 1)}
