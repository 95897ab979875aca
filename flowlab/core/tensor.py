"""Tensor and Variable: immutable n-d arrays with a dtype and a device, and mutable state for training.

A Tensor wraps one backend array (numpy on the CPU, cupy on a GPU) that is never written to after
it is wrapped; every op makes a new array. That is why a tape can keep references to forward
values, and why ``Variable.assign`` replaces its array instead of writing into it.

Operator overloads (``+``, ``@``, ``[]``...) are attached by the op table entries that define them
(see ``core/ops/``), so each operator is defined once, next to its kernel and gradient.
"""
from __future__ import annotations

import contextlib
import itertools
import threading

import numpy as np

from . import dtypes as _dtypes
from ._context import ACTIVE, state
from .errors import InvalidArgumentError, source_line
from .interpreters import current
from .shape import TensorShape

__all__ = ["Tensor", "Variable", "convert_to_tensor", "constant", "is_tensor"]

_CPU0 = "/job:localhost/replica:0/task:0/device:CPU:0"
_new = object.__new__


class Tensor:
    """An immutable multi-dimensional array, as returned by every flowlab op.

    >>> import flowlab as fl
    >>> x = fl.constant([[1.0, 2.0], [3.0, 4.0]])
    >>> (x * 2 + 1).numpy().tolist()
    [[3.0, 5.0], [7.0, 9.0]]
    """

    __slots__ = ("_value", "_device", "__weakref__")
    # Make ``ndarray + tensor`` call Tensor.__radd__ (numpy defers to a higher priority).
    __array_priority__ = 100

    def __init__(self, value, device=None):
        self._value = value
        self._device = device

    # -- what it is -------------------------------------------------------------------------
    @property
    def dtype(self) -> _dtypes.DType:
        return _dtypes.as_dtype(self._value.dtype)

    @property
    def shape(self) -> TensorShape:
        return TensorShape(self._value.shape)

    @property
    def ndim(self) -> int:
        return self._value.ndim

    @property
    def device(self) -> str:
        return _CPU0 if self._device is None else str(self._device)

    def get_shape(self) -> TensorShape:
        return self.shape

    def numpy(self):
        """The value as a numpy array (a read-only view; a numpy scalar for a 0-d tensor)."""
        return readonly_numpy(self._value)

    def __array__(self, dtype=None, copy=None):
        value = _host(self._value)
        if dtype is not None or copy:
            return np.array(value, dtype=dtype, copy=True)
        view = np.asarray(value).view()
        view.flags.writeable = False   # a tensor never changes, even through np.asarray(t)
        return view

    def ref(self):
        """A hashable reference to this tensor (tensors compare elementwise, so are unhashable)."""
        return _Ref(self)

    # -- Python protocols -------------------------------------------------------------------
    __hash__ = None  # ``==`` is elementwise, as in TensorFlow; use ``t.ref()`` as a dict key

    def __bool__(self):
        return bool(self._value)

    def __len__(self):
        if self._value.ndim == 0:
            raise TypeError("len() of a 0-d tensor (a scalar) is undefined")
        return self._value.shape[0]

    def __iter__(self):
        if self._value.ndim == 0:
            raise TypeError("iterating over a 0-d tensor (a scalar) is not possible")
        return (self[i] for i in range(self._value.shape[0]))

    def __float__(self):
        return float(self._value)

    def __int__(self):
        return int(self._value)

    def __index__(self):
        if self._value.ndim != 0 or self._value.dtype.kind not in "iub":
            raise TypeError(f"only integer scalar tensors can be used as an index, not {self.dtype.name}{list(self.shape)}")
        return int(self._value)

    def __format__(self, spec):
        return format(self.numpy(), spec) if spec else repr(self)

    def __repr__(self):
        return f"<fl.Tensor: shape={tuple(self.shape)}, dtype={self.dtype.name}, numpy={_array_repr(self)}>"

    def __reduce__(self):
        return Tensor, (np.asarray(self),)


class _Ref:
    __slots__ = ("_tensor",)

    def __init__(self, tensor):
        self._tensor = tensor

    def deref(self):
        return self._tensor

    def __hash__(self):
        return id(self._tensor)

    def __eq__(self, other):
        return isinstance(other, _Ref) and other._tensor is self._tensor


def readonly_numpy(value):
    """A backend array as numpy: a read-only view (tensors never change, and the array may be a
    variable's own), or a numpy scalar for 0-d values."""
    if type(value) is not np.ndarray:
        if isinstance(value, np.generic):
            return value
        value = _host(value)
    if value.ndim == 0:
        return value[()]
    view = value.view()
    view.flags.writeable = False
    return view


def _host(value):
    if type(value) is np.ndarray or isinstance(value, np.generic):
        return value
    from .backends import to_numpy
    return to_numpy(value)


def _array_repr(t) -> str:
    value = np.asarray(_host(t._value))
    if value.ndim == 0:
        return str(value[()])          # numpy=9.0, as TensorFlow shows scalars
    text = np.array_repr(value)
    return ("\n" + text) if "\n" in text else text


_variable_ids = itertools.count()


class Variable(Tensor):
    """A mutable tensor: model weights and optimizer state.

    Ops read its current value. Inside a ``GradientTape``, trainable variables are watched
    automatically. ``assign`` keeps the dtype and shape fixed.

    >>> import flowlab as fl
    >>> v = fl.Variable([1.0, 2.0])
    >>> _ = v.assign_add([0.5, 0.5])
    >>> v.numpy().tolist()
    [1.5, 2.5]
    """

    __slots__ = ("trainable", "_name", "_id")

    def __init__(self, initial_value, trainable=True, name=None, dtype=None):
        if callable(initial_value):
            initial_value = initial_value()
        if isinstance(initial_value, Tensor) and getattr(initial_value, "_value", None) is None:
            value = None
        else:
            t = convert_to_tensor(initial_value, dtype=dtype)
            value = t._value
        if value is None:
            raise ValueError("a Variable needs a concrete initial value, but got a graph tensor: create "
                             "variables outside @fl.function (or from eager values such as fl.zeros)")
        self._value = np.array(value) if type(value) is np.ndarray or isinstance(value, np.generic) else value.copy()
        self._device = t._device
        self._place_in_scope()
        self.trainable = bool(trainable)
        self._id = next(_variable_ids)
        self._name = name or "Variable"
        creators = getattr(_creators, "stack", None)
        if creators and creators[-1] is not None:   # a strategy's scope sees (and may adjust) each one
            creators[-1](self)

    @property
    def name(self) -> str:
        return f"{self._name}:0"

    def _place_in_scope(self):
        """A variable made inside ``fl.device(...)`` lives there; ops that read or update it are
        placed with it (colocation) unless a scope says otherwise."""
        if ACTIVE.count:
            st = state()
            if st.device_stack and st.device_stack[-1]:
                _move_to(self, st.device_stack[-1])

    def _assign(self, value, mode):
        execute, _, assign = _ops or _variable_ops()
        if not isinstance(value, Tensor):   # Python and numpy values take its dtype
            t = convert_to_tensor(value, dtype=self._value.dtype)
            value = Tensor(value.copy(), t._device) if t._value is value else t   # never the caller's own array
        execute(assign, (value,), {"variable": self, "mode": mode})

    def assign(self, value, read_value=True):
        """Replace the value (same shape and dtype). Returns the variable. Inside a graph (as
        ``assign_add`` and ``assign_sub``): a node that assigns when the graph runs, in program order."""
        self._assign(value, "set")
        return self if read_value else None

    def assign_add(self, delta, read_value=True):
        self._assign(delta, "add")
        return self if read_value else None

    def assign_sub(self, delta, read_value=True):
        self._assign(delta, "sub")
        return self if read_value else None

    def read_value(self) -> Tensor:
        """A tensor holding the current value (later assignments do not change it). Inside a
        graph: the value when the graph runs, at this point of the program."""
        execute, read, _ = _ops or _variable_ops()
        return execute(read, (), {"variable": self})

    def value(self) -> Tensor:
        return self.read_value()

    def __repr__(self):
        return (f"<fl.Variable '{self.name}' shape={tuple(self.shape)} dtype={self.dtype.name}, "
                f"numpy={_array_repr(self)}>")

    def __reduce__(self):
        return Variable, (np.asarray(self), self.trainable, self._name)


_ops = None   # (execute, READ, ASSIGN), looked up on first use: execute.py imports this module


def _variable_ops():
    global _ops
    from .execute import execute
    from .ops.variable_ops import ASSIGN, READ
    _ops = (execute, READ, ASSIGN)
    return _ops


def is_tensor(x) -> bool:
    return isinstance(x, Tensor)


def _python_array(value, dtype):
    """Convert Python scalars and (nested) lists as TensorFlow does: floats default to float32,
    ints to int32, and a float is never silently truncated to an integer dtype."""
    try:
        arr = np.asarray(value)
    except (ValueError, TypeError) as e:
        raise TypeError(f"cannot convert {value!r} to a tensor: {e}") from None
    if arr.dtype == object or arr.dtype.kind in "USV":
        raise TypeError(f"cannot convert {value!r} to a tensor: flowlab tensors hold numbers and booleans, "
                        f"not {type(value).__name__} of {arr.dtype}")
    if dtype is None:
        if arr.dtype == np.float64:
            return arr.astype(np.float32)
        if arr.dtype == np.int64:
            if arr.size and (arr.max() > np.iinfo(np.int32).max or arr.min() < np.iinfo(np.int32).min):
                return arr
            return arr.astype(np.int32)
        return arr
    if dtype.kind in "iub" and arr.dtype.kind == "f" and arr.size and not np.all(np.mod(arr, 1) == 0):
        raise TypeError(f"cannot convert {value!r} to a tensor of dtype {_dtypes.as_dtype(dtype).name} "
                        f"without losing the fractional part")
    return arr.astype(dtype, copy=False)


def _numpy_array(value, want):
    """A numpy array or scalar as a tensor value: a supported dtype, in native byte order."""
    arr = np.asarray(value)
    if want is not None:
        return arr.astype(want, copy=False)
    dtype = _dtypes.as_dtype(arr.dtype).as_numpy_dtype   # raises TypeError for str, object, complex...
    return arr if arr.dtype == dtype else arr.astype(dtype)   # e.g. big-endian '>f4' -> float32


def convert_to_tensor(value, dtype=None, dtype_hint=None) -> Tensor:
    """Turn a Tensor, numpy array, Python number or nested list into a Tensor.

    ``dtype`` is required to match (tensors) or is converted to (Python values and arrays);
    ``dtype_hint`` is used only when the value itself does not say.
    """
    want = _dtypes.numpy_dtype(dtype)
    if isinstance(value, Tensor):
        if want is not None and value.dtype.as_numpy_dtype != want:
            raise InvalidArgumentError(
                f"expected a {_dtypes.as_dtype(want).name} tensor but got {value.dtype.name}; "
                f"use fl.cast(x, {_dtypes.as_dtype(want).name}) to convert\n  at {source_line()}")
        return value
    if isinstance(value, np.ndarray) or isinstance(value, np.generic):
        return Tensor(_numpy_array(value, want))
    if hasattr(value, "__cuda_array_interface__"):
        from .backends import device_of_array
        return Tensor(value, device_of_array(value))
    return Tensor(_python_array(value, want if want is not None else _dtypes.numpy_dtype(dtype_hint)))


_creators = threading.local()


@contextlib.contextmanager
def variable_creator_scope(fn):
    """Inside the block, ``fn(variable)`` runs after each Variable this thread creates (the innermost
    scope's ``fn`` only). Distribution strategies use it to mirror or place variables; ``fn=None``
    makes plain local variables even inside a strategy's scope (a metric's accumulators)."""
    stack = _creators.__dict__.setdefault("stack", [])
    stack.append(fn)
    try:
        yield
    finally:
        stack.pop()


def in_scope(t: Tensor) -> Tensor:
    """Move a newly made tensor (a constant, fl.zeros, a random draw, a Variable's value) to the
    device of the enclosing ``fl.device(...)`` scope, as ops made there are placed. No scope: as is."""
    if not ACTIVE.count:   # no scope, tape or graph anywhere in the process: nothing to look up
        return t
    stack = state().device_stack
    if stack and stack[-1] and current().moves_new_tensors:   # in a graph, the node is placed
        _move_to(t, stack[-1])
    return t


def _move_to(t: Tensor, scope) -> None:
    """Tag ``t`` with the scope's device. A local device gets the value now; a task of a running
    cluster keeps it here, and it travels with each op that runs there."""
    from .backends import to_device
    from .device import DEFAULT_DEVICE, is_local, remote_interpreter, resolve
    where = resolve(scope, allow_remote=remote_interpreter() is not None)
    t._device = None if where == DEFAULT_DEVICE else where
    if is_local(where):
        t._value = to_device(t._value, where)


def constant(value, dtype=None, shape=None, name=None) -> Tensor:
    """A tensor holding a copy of ``value`` (optionally cast to ``dtype`` and broadcast to ``shape``).

    >>> import flowlab as fl
    >>> fl.constant(0.0, shape=[2]).numpy().tolist()
    [0.0, 0.0]
    """
    if isinstance(value, Tensor):
        t = value if dtype is None else Tensor(value._value.astype(_dtypes.numpy_dtype(dtype)), value._device)
    else:
        t = convert_to_tensor(value, dtype=dtype)
        if isinstance(value, np.ndarray) and t._value is value:
            t = Tensor(value.copy())
    if shape is not None:
        shape = tuple(int(d) for d in shape)
        if t._value.shape != shape:
            if t._value.size == 1:
                t = Tensor(np.full(shape, t._value.reshape(()), dtype=t._value.dtype))
            elif t._value.size == int(np.prod(shape)):
                t = Tensor(t._value.reshape(shape))
            else:
                raise InvalidArgumentError(f"constant: cannot make a tensor of shape {shape} from a value of "
                                           f"shape {t._value.shape}\n  at {source_line()}", op="constant")
    if t is value:   # fl.constant(tensor) made no new tensor: never move the caller's
        return t
    return in_scope(t)
