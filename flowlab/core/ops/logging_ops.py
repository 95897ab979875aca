"""``fl.print``: print tensors' values when the op runs, eagerly or in every call of a traced graph."""
from __future__ import annotations

import sys

import numpy as np

from ..backends import to_numpy
from ..execute import defop, execute
from ..tensor import Tensor


def _stream(output_stream):
    if output_stream is None:            # looked up at run time: notebooks and pytest swap sys.stderr
        return sys.stderr
    if isinstance(output_stream, str):
        if not output_stream.startswith("file://"):
            raise ValueError(f"print: output_stream must be a file-like object or 'file://<path>', "
                             f"got {output_stream!r}")
        return open(output_stream[len("file://"):], "a", encoding="utf-8")  # noqa: SIM115 - closed below
    return output_stream


def _print_kernel(*values, parts, sep, end, stream, summarize):
    values = iter(values)
    edge = {"threshold": sys.maxsize} if summarize < 0 else {"threshold": 2 * summarize, "edgeitems": summarize}
    with np.printoptions(**edge):
        text = sep.join(str(to_numpy(next(values))) if p is None else p for p in parts) + end   # GPU: a copy
    out = _stream(stream)
    out.write(text)
    if out is not stream and out is not sys.stderr and out is not sys.stdout:
        out.close()
    elif hasattr(out, "flush"):
        out.flush()
    return np.zeros((), np.bool_)


# stateful: never folded or dropped, so a traced function prints at every call, not once at trace time
_print_op = defop("print", _print_kernel, lambda *xs, **attrs: ((), np.dtype(np.bool_)), stateful=True,
                  doc="Write the inputs' values (and fixed text) to a stream when the op runs.")


def print(*inputs, output_stream=None, summarize=3, sep=" ", end="\n", name=None):  # noqa: A001 - TF's name
    """Print the values of tensors (and any other objects, with ``str``) when this op *runs*: at once
    in eager mode, and at every call of an ``@fl.function`` (Python's ``print`` inside a traced
    function prints only while tracing). Writes to ``sys.stderr`` unless ``output_stream`` is a
    file-like object or ``"file://<path>"``; ``summarize`` elements are kept at each end of an axis
    (-1: all). Returns None eagerly, and the print node's output in a graph (for control_dependencies).

    >>> import flowlab as fl, sys
    >>> fl.print("x:", fl.constant([1, 2, 3]), output_stream=sys.stdout)
    x: [1 2 3]
    """
    tensors = [x for x in inputs if isinstance(x, Tensor)]
    parts = tuple(None if isinstance(x, Tensor) else str(x) for x in inputs)
    out = execute(_print_op, tensors, {"parts": parts, "sep": str(sep), "end": str(end), "stream": output_stream,
                                       "summarize": int(summarize)})
    return None if getattr(out, "_value", None) is not None else out


__all__ = ["print"]
