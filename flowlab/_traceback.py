"""Tracebacks for learners: in a notebook, flowlab's own frames are left out of tracebacks.

When an error comes out of flowlab (a shape mismatch deep inside an op, a failing graph node), the
frames that matter to a learner are their own: the cell and the functions they wrote. flowlab's
frames in between (dispatch, tracing, executors, cluster plumbing) are hidden, and one line says
how many were hidden and how to see them. The message itself is never changed.

How: inside a running IPython shell, ``import flowlab`` wraps the shell's traceback *formatter*
(``shell.InteractiveTB.structured_traceback``). Before formatting, it builds a copy of the
traceback without the frames whose file is inside the flowlab package (or is code flowlab
generated, ``<flowlab plan ...>``), for the exception and for every exception chained to it. The
exception itself keeps its full traceback, and so do ``sys.last_traceback`` / ``sys.last_exc``,
so ``%debug`` can still walk into flowlab's frames. ``%tb`` and ``%xmode`` go through the same
formatter, so they show the filtered form too.

Switches: ``fl.debugging.disable_traceback_filtering()`` / ``enable_traceback_filtering()`` /
``is_traceback_filtering_enabled()`` (TensorFlow's names), and ``FLOWLAB_TRACEBACK_FILTERING=0``
at start. Outside IPython nothing is installed: plain Python keeps
its normal traceback (flowlab's errors already name the user's line). This module never imports
IPython; it only looks at ``sys.modules``.
"""
from __future__ import annotations

import os
import sys
import types
import weakref

__all__ = ["install", "uninstall", "filter_traceback", "is_flowlab_frame", "set_enabled", "enabled"]

_PKG = os.path.dirname(os.path.abspath(__file__)) + os.sep
_GENERATED = "<flowlab "          # code flowlab compiles itself (graph plans)
_ORIGINALS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # our wrapper -> the shell's formatter
_enabled = os.environ.get("FLOWLAB_TRACEBACK_FILTERING", "1").strip().lower() not in ("0", "false", "no", "off")
NOTE = ("[{n} flowlab frame{s} hidden: fl.debugging.disable_traceback_filtering() shows them; "
        "%debug sees every frame]")


def set_enabled(on: bool) -> None:
    global _enabled
    _enabled = bool(on)


def enabled() -> bool:
    return _enabled


def is_flowlab_frame(frame) -> bool:
    """Whether ``frame`` runs flowlab's own code (a file of the package or a generated plan)."""
    filename = frame.f_code.co_filename
    return filename.startswith(_PKG) or filename.startswith(_GENERATED)


def filter_traceback(tb):
    """``(traceback without flowlab's frames, how many were dropped)``; the traceback given is not
    changed (a new chain of traceback objects is made when anything is dropped)."""
    kept, hidden, t = [], 0, tb
    while t is not None:
        if is_flowlab_frame(t.tb_frame):
            hidden += 1
        else:
            kept.append(t)
        t = t.tb_next
    if not hidden:
        return tb, 0
    new = None
    for t in reversed(kept):
        new = types.TracebackType(new, t.tb_frame, t.tb_lasti, t.tb_lineno)
    return new, hidden


def _chain(value):
    """``value`` and every exception shown chained to it (causes, unsuppressed contexts), each once."""
    seen, out, todo = set(), [], [value]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        out.append(e)
        todo += [e.__cause__, None if e.__suppress_context__ else e.__context__]
    return out


def _wrapper(original):
    def structured_traceback(etype, evalue, etb=None, tb_offset=None, *args, **kwargs):
        if not _enabled or not isinstance(evalue, BaseException):
            return original(etype, evalue, etb, tb_offset, *args, **kwargs)
        etb, hidden = filter_traceback(etb)
        swapped = []
        try:
            for e in _chain(evalue):
                tb, n = filter_traceback(e.__traceback__)
                if n:
                    swapped.append((e, e.__traceback__))
                    e.__traceback__ = tb
                    hidden += n if e is not evalue else 0
            stb = original(etype, evalue, etb, tb_offset, *args, **kwargs)
        finally:
            for e, tb in swapped:     # the exception keeps its whole traceback (%debug reads it)
                e.__traceback__ = tb
        if hidden and isinstance(stb, list):
            note = NOTE.format(n=hidden, s="" if hidden == 1 else "s")
            stb = stb[:-1] + [note] + stb[-1:] if stb else [note]
        return stb

    _ORIGINALS[structured_traceback] = original
    return structured_traceback


def _shell():
    ipython = sys.modules.get("IPython")        # only if the user's process has IPython running
    get = getattr(ipython, "get_ipython", None)
    try:
        return get() if get is not None else None
    except Exception:   # noqa: BLE001 - a half-imported IPython: no shell to install into
        return None


def install(shell=None) -> bool:
    """Wrap the traceback formatter of ``shell`` (default: the running IPython shell, if any).
    Idempotent; True when the filter is in place afterwards."""
    shell = shell if shell is not None else _shell()
    formatter = getattr(shell, "InteractiveTB", None)
    current = getattr(formatter, "structured_traceback", None)
    if current is None:
        return False
    if current not in _ORIGINALS:
        formatter.structured_traceback = _wrapper(current)
    return True


def uninstall(shell=None) -> None:
    """Put the shell's own formatter back."""
    shell = shell if shell is not None else _shell()
    formatter = getattr(shell, "InteractiveTB", None)
    current = getattr(formatter, "structured_traceback", None)
    original = _ORIGINALS.get(current) if current is not None else None
    if original is not None:
        formatter.structured_traceback = original
