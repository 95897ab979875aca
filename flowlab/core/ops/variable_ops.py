"""The ops on variables: ``read`` (a Variable's value at this point of the program) and ``assign``
(set it, add to it or subtract from it). ``Variable.read_value`` and ``assign*`` run them through
``execute`` whatever the mode, and the innermost interpreter decides: the eager one runs their
``eager`` form now, where the variable lives (no device scope moves a variable's state); a graph
builder adds a node that runs when the graph runs (the kernel). Either way the checks are the same:
the variable's shape and dtype, named in the error with the user's line."""
from __future__ import annotations

import numpy as np

from ..dtypes import numpy_dtype
from ..errors import InvalidArgumentError, source_line
from ..execute import defop
from ..tensor import Tensor, convert_to_tensor

__all__ = ["checked_value"]

_NAMES = {"set": "assign", "add": "assign_add", "sub": "assign_sub"}


def _read_eager(inputs, attrs):
    # NOTE: the variable's array itself: assignments replace it and never write into it (an update
    # writes in place only when nothing else holds the array: see nn/optimizers.py), so the tensor
    # keeps the value it has now
    v = attrs["variable"]
    return Tensor(v._value, v._device)


READ = defop("read", lambda *, variable: variable._value,
             lambda *, variable: (variable._value.shape, variable._value.dtype), stateful=True, eager=_read_eager,
             doc="The value of a Variable at this point of the program (in a graph: when the graph runs).")


def _assign_kernel(value, *, variable, mode):
    if mode == "add":
        value = variable._value + value
    elif mode == "sub":
        value = variable._value - value
    variable._value = value
    return value


def checked_value(variable, x, op: str):
    """``x`` (a tensor or a value) as an array for ``variable``: of its dtype (Python and numpy values
    are converted), on its device (the copy rule); a shape other than its own is an error naming
    ``op``, the variable and the user's line."""
    current = variable._value
    if x.__class__ is Tensor and x._value.dtype is current.dtype:
        value = x._value
    else:
        value = convert_to_tensor(x, dtype=current.dtype)._value
    if value.shape != current.shape:
        raise InvalidArgumentError(
            f"{op}: variable {variable.name!r} has shape {tuple(current.shape)} but the value has shape "
            f"{tuple(value.shape)}\n  at {source_line()}", op=op)
    if value.__class__ is not current.__class__:   # from the host to a GPU, or back (the copy rule)
        from ..backends import to_device_of
        value = to_device_of(current, value)
    return value


def _assign_eager(inputs, attrs):
    variable, mode, x = attrs["variable"], attrs["mode"], inputs[0]
    value = checked_value(variable, x, _NAMES[mode])
    if value is x and mode == "set":   # a numpy array of the caller's, who may change it later
        value = value.copy()
    return Tensor(_assign_kernel(value, variable=variable, mode=mode), variable._device)


def _assign_rule(value, *, variable, mode):
    shape, dtype = tuple(value.shape), numpy_dtype(value.dtype)
    want = variable._value.shape
    if len(shape) != len(want) or any(a is not None and a != b for a, b in zip(shape, want)):
        raise InvalidArgumentError(f"variable {variable.name!r} has shape {tuple(want)}, the value {tuple(shape)}")
    if dtype != variable._value.dtype:
        raise InvalidArgumentError(f"variable {variable.name!r} is {variable.dtype.name}, the value {np.dtype(dtype).name}")
    return want, dtype


ASSIGN = defop("assign", _assign_kernel, _assign_rule, stateful=True, eager=_assign_eager,
               doc="Set (mode 'set'), add to ('add') or subtract from ('sub') a Variable.")
