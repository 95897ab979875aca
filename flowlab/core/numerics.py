"""Numerics debugging, as ``tf.debugging``: stop at the first op that makes a NaN or an Inf.

``check_numerics(x, message)`` is an op (so it works in graphs too); its gradient is the incoming
gradient, checked the same way. ``enable_check_numerics()`` checks every eager op's output, forward
and backward. Like TensorFlow's, that switch is process-wide: one hook pushed on every thread's
state (``_context.push_global``), counted once in ``ACTIVE``. While it is on, no op takes the eager
fast path (a few microseconds per op, plus one pass over its output); while off, nothing remains.
The error names the op, its NaN/+Inf/-Inf counts, its inputs' statistics (an input that already
held NaN or Inf is called out: the op passed it on), the op whose gradient was running, and the
user's line.
"""
from __future__ import annotations

import contextlib
import sys
import threading

import numpy as np

from ._context import pop_global, push_global
from .backends import to_numpy
from .errors import InvalidArgumentError, NumericsError, describe, source_line
from .execute import defop, execute
from .ops import _rules as R
from .tape import GradientTape

__all__ = ["check_numerics", "enable_check_numerics", "disable_check_numerics", "check_numerics_enabled",
           "all_finite", "enabled"]

_FAST_MIN = 4096   # from this size on, x·x (one BLAS pass) beats np.isfinite(x).all()
_BLAS_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def all_finite(a) -> bool:
    """Whether every element of a float array is finite."""
    # Fast path: x·x is NaN or Inf whenever an element is. It may also overflow with all elements
    # finite (one above ~1e19 in float32), so only a pass is trusted; a fail takes the exact check.
    if a.size >= _FAST_MIN and type(a) is np.ndarray and a.dtype in _BLAS_DTYPES and a.flags.c_contiguous:
        flat = a.reshape(-1)
        with np.errstate(over="ignore", invalid="ignore"):
            if np.isfinite(np.dot(flat, flat)):
                return True
    return bool(np.isfinite(a).all())


# -- the message ------------------------------------------------------------------------------
def _counts(a) -> tuple[int, int, int]:
    """(NaN, +Inf, -Inf) elements of a numpy array."""
    if a.dtype.kind != "f":
        return 0, 0, 0
    nan = int(np.isnan(a).sum())
    pos = int(np.isposinf(a).sum())
    return nan, pos, int(np.isinf(a).sum()) - pos


def _count_words(counts, every=False) -> str:
    """'1 NaN, 0 +Inf and 2 -Inf' (every=True), or only the non-zero ones: '1 NaN and 2 -Inf'."""
    words = [f"{n} {kind}" for n, kind in zip(counts, ("NaN", "+Inf", "-Inf")) if n or every]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def _num(v, integer=False) -> str:
    """4 significant digits; a float always looks like one (0.0, not 0)."""
    if integer:
        return str(int(v))
    s = f"{float(v):.4g}"
    return s + ".0" if s.lstrip("-").isdigit() else s


def _stats(a, counts) -> str:
    """'float32[3]  min -1.0  max 2.0  mean 0.3333', over the finite elements."""
    if a.dtype.kind not in "biuf" or a.size == 0:
        return describe(a)
    integer = a.dtype.kind in "biu"
    values = a[np.isfinite(a)] if any(counts) else a
    if a.size == 1:
        return f"{describe(a)}  value {_num(a.reshape(-1)[0], integer)}"
    if values.size == 0:
        return f"{describe(a)}  no finite element"
    return (f"{describe(a)}  min {_num(values.min(), integer)}  max {_num(values.max(), integer)}  "
            f"mean {_num(values.mean(dtype=np.float64))}" + ("  (of the finite elements)" if any(counts) else ""))


_BACKWARD_CODE = GradientTape._backward.__code__


def _backward_of() -> str | None:
    """The op whose gradient rule is running, when we are inside GradientTape's backward pass."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code is not _BACKWARD_CODE:
        frame = frame.f_back
    return frame and getattr(frame.f_locals.get("op"), "name", None)


def _raise(op_name, header, body, counts):
    """Finish the message with where it happened (backward pass, user's line) and raise it."""
    lines = [header, *body]
    grad_of = _backward_of()
    if grad_of is not None:
        lines.append(f"  in the backward pass, computing the gradient of {grad_of}")
    where = source_line()
    if where:
        lines.append(f"  at {where}")
    raise NumericsError("\n".join(lines), op=op_name, source=where, counts=counts)


def _op_produced(op, inputs, value):
    """Raise the error for ``op``, whose output ``value`` is not all finite."""
    value = to_numpy(value)
    counts = _counts(value)
    header = (f"{op.name} produced {_count_words(counts, every=True)} among the {value.size} elements "
              f"of its {describe(value)} output")
    body, passed_on = [], []
    for i, x in enumerate(inputs):
        a = to_numpy(x._value)
        had = _counts(a)
        body.append(f"  input {i}: {_stats(a, had)}")
        if any(had):
            body[-1] += f"; it already contained {_count_words(had)}"
            passed_on.append(str(i))
    if passed_on:
        body.append(f"  input {', '.join(passed_on)} already contained NaN/Inf, so {op.name} passed it on "
                    f"rather than causing it: look at where that input was made")
    _raise(op.name, header, body, counts)


# -- enable_check_numerics: a hook on every eager op -------------------------------------------
def _check_output(op, inputs, attrs, out):
    value = out._value
    if value.dtype.kind == "f" and not all_finite(value):
        _op_produced(op, inputs, value)


_switch = threading.Lock()
_on = False


def enabled() -> bool:
    """Whether ``enable_check_numerics`` is in force."""
    return _on


def enable_check_numerics():
    """Until ``disable_check_numerics()``, the first eager op (in any thread, backward passes too)
    whose floating-point output has a NaN or an Inf raises ``fl.errors.NumericsError`` naming it,
    its inputs' statistics and your line. Enabling twice is the same as once.

    >>> import flowlab as fl
    >>> fl.debugging.enable_check_numerics()
    >>> fl.log(fl.constant([1.0, -1.0]))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    flowlab.core.errors.NumericsError: log produced 1 NaN, 0 +Inf and 0 -Inf among the 2 elements ...
    >>> fl.debugging.disable_check_numerics()
    """
    global _on
    with _switch:
        if not _on:
            push_global(_check_output)
            _on = True


def disable_check_numerics():
    """Stop checking every op (a no-op when checking is off)."""
    global _on
    with _switch:
        if _on:
            pop_global(_check_output)
            _on = False


@contextlib.contextmanager
def check_numerics_enabled():
    """``enable_check_numerics()`` for the ``with`` block; on leaving, checking is as it was before.

    >>> import flowlab as fl
    >>> with fl.debugging.check_numerics_enabled():
    ...     y = fl.sqrt(fl.constant([4.0]))
    >>> y.numpy().tolist()
    [2.0]
    """
    was_on = _on
    enable_check_numerics()
    try:
        yield
    finally:
        if not was_on:
            disable_check_numerics()


# -- check_numerics: an op ---------------------------------------------------------------------
def _check_kernel(x, message):
    if x.dtype.kind == "f" and not all_finite(x):
        a = to_numpy(x)
        counts = _counts(a)
        _raise("check_numerics", f"{message}: check_numerics found {_count_words(counts, every=True)} among "
               f"the {a.size} elements of a {describe(a)} tensor", [f"  tensor: {_stats(a, counts)}"], counts)
    return x


CHECK_NUMERICS = defop(
    "check_numerics", _check_kernel, R.same,
    # the gradient passes through, checked (TensorFlow's CheckNumerics gradient does the same)
    lambda c, g: (check_numerics(g, c.attrs["message"] + " (gradient)"),),
    doc="``x`` unchanged if it is all finite; else NumericsError. Integer tensors pass through.")


def check_numerics(tensor, message, name=None):
    """``tensor`` unchanged if none of its elements is NaN or Inf, else ``fl.errors.NumericsError``
    with ``message``, the counts and statistics, and your line. Only floating-point tensors are
    checked. Its gradient is the incoming gradient, checked with ``message + " (gradient)"``.

    >>> import flowlab as fl
    >>> fl.debugging.check_numerics(fl.constant([1.0, 2.0]), "weights").numpy().tolist()
    [1.0, 2.0]
    """
    return execute(CHECK_NUMERICS, (tensor,), {"message": str(message)})   # its NumericsError passes through
