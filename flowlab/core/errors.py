"""Errors that name the op, the shapes and dtypes involved, and the user's own source line."""
from __future__ import annotations

import linecache
import os
import sys

__all__ = ["OpError", "InvalidArgumentError", "NumericsError", "user_frame", "describe", "did_you_mean"]

_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # .../flowlab


class OpError(Exception):
    """Base of errors raised while running an op. Attributes: ``op``, ``source`` ("file:line")."""

    def __init__(self, message: str, op: str | None = None, source: str | None = None):
        super().__init__(message)
        self.op = op
        self.source = source


class InvalidArgumentError(OpError, ValueError):
    """An op got inputs it cannot compute with: mismatched shapes or dtypes, bad indices or attributes."""


class NumericsError(InvalidArgumentError):
    """An op produced NaN or Inf while numerics were checked (``fl.debugging``). An
    InvalidArgumentError, as TensorFlow's CheckNumerics raises. ``counts``: (NaN, +Inf, -Inf)."""

    def __init__(self, message: str, op: str | None = None, source: str | None = None, counts=(0, 0, 0)):
        super().__init__(message, op, source)
        self.counts = counts


def user_frame(skip_dirs=(_PKG_DIR,)):
    """The innermost stack frame that is not flowlab's (nor numpy's): where the user called us."""
    f = sys._getframe(1)
    while f is not None:
        fn = f.f_code.co_filename
        if not fn.startswith(skip_dirs) and "/numpy/" not in fn and not fn.startswith("<frozen"):
            return f
        f = f.f_back
    return None


def source_line(frame=None) -> str | None:
    """'file:line: code' for the user's frame, or None when there is no such frame. While a graph
    runs node by node, it is the line that created the node."""
    if frame is None:
        from ._context import state
        node = state().node
        if node is not None and node.source:
            return f"{node.source} (graph node {node.name})"
    frame = frame or user_frame()
    if frame is None:
        return None
    fn, line = frame.f_code.co_filename, frame.f_lineno
    code = linecache.getline(fn, line, frame.f_globals).strip()
    place = f"{_cell_name(fn)}, line {line}" if _cell_name(fn) else f"{fn}:{line}"
    return f"{place}: {code}" if code else place


def _cell_name(filename: str) -> str | None:
    """'Cell In[3]' when ``filename`` is a notebook cell compiled by IPython, else None."""
    ipython = sys.modules.get("IPython")
    shell = ipython and ipython.get_ipython()
    if shell is None:
        return None
    try:
        kind, name = shell.compile.format_code_name(filename)
    except Exception:  # noqa: BLE001 - not a cell, or an IPython without this helper
        return None
    return f"{kind} {name}"


def did_you_mean(asked: str, choices) -> str:
    """``"; did you mean '/cpu:1'?"``: the choice closest to ``asked`` (difflib), or "." if none is close."""
    import difflib
    match = difflib.get_close_matches(asked, [str(c) for c in choices], n=1, cutoff=0.4)
    return f"; did you mean {match[0]!r}?" if match else "."


def describe(value) -> str:
    """'float32[3,4]' for anything with a shape and dtype (tensors, arrays, specs)."""
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is None:
        return f"{type(value).__name__} {value!r}"
    name = getattr(dtype, "name", str(dtype))
    if getattr(shape, "rank", 0) is None:
        return f"{name}[<unknown>]"
    return f"{name}[{','.join('?' if d is None else str(d) for d in shape)}]"


class DataLossError(OpError):
    """A record file is corrupted or truncated (as ``tf.errors.DataLossError``).

    Attributes: ``filename``, ``offset`` (byte offset of the bad record, or of the header),
    ``index`` (the record's position in its file, counting from 0; None for the file header) and
    ``reason`` (a short phrase such as "payload CRC mismatch").
    """

    def __init__(self, message: str, filename=None, offset=None, index=None, reason=None,
                 op: str | None = None, source: str | None = None):
        super().__init__(message, op, source)
        self.filename = filename
        self.offset = offset
        self.index = index
        self.reason = reason

    def __reduce__(self):   # picklable, so it can cross a process pool
        return (type(self), (self.args[0], self.filename, self.offset, self.index, self.reason,
                             self.op, self.source))
