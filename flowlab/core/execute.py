"""The op table and the one function that runs an op: ``execute``.

Every op is an ``OpDef``: its name, a kernel over backend arrays, a shape rule over specs (used
to build graphs and to explain errors), and a gradient rule written with flowlab ops (so gradients
of gradients work). ``execute`` is the only way an op runs. In eager mode it runs the kernel now
and lets every recording tape see the result; while a graph is being built it adds a node instead.

For the common case (plain eager tensors on the default device, no tape, no graph, no device
scope anywhere in the process) ``unary``/``binary`` build functions that skip straight to the
kernel; any exception there re-runs the op through ``execute`` to raise a proper error.
"""
from __future__ import annotations

import sys

import numpy as np

from . import device as _devices
from ._context import ACTIVE, state
from .dtypes import numpy_dtype
from .errors import InvalidArgumentError, OpError, describe, source_line
from .interpreters import _BOTTOM, Interpreter
from .tensor import Tensor, Variable, _numpy_array, _python_array

__all__ = ["OpDef", "defop", "execute", "record", "agreed_dtype", "EAGER", "get_op", "list_ops", "unary", "binary",
           "reflected"]

_new = object.__new__
_OPS: dict[str, "OpDef"] = {}
NO_ATTRS: dict = {}


class OpDef:
    """One op: ``kernel(*arrays, **attrs) -> array``; ``shape_rule(*specs, **attrs) -> (shape, dtype)``;
    ``grad(call, g) -> tuple of input gradients`` (None for no gradient). ``same_dtype``: input
    positions (or "all") that must share a dtype; Python values there take that dtype. ``strict``:
    the kernel would accept inputs the op must refuse (numpy's sqrt takes ints), so the shape rule
    is checked before every run. ``stateful``: it reads or changes state (variables, random
    generators), so graph passes never fold, merge, drop or reorder it. ``inplace_kernel``: the
    kernel again, but free to write into its first input's array (same results, bit for bit), for
    graph plans that own that array and no longer need it (core/passes/buffer_reuse.py).

    What the graph passes (core/passes) need of an op is here too, so that adding an op is one
    entry for them as well; no pass keeps a list of op names. All optional:

    - ``elementwise``: a function that computes exactly what the kernel computes (the same ufuncs
      in the same order: the same bits) and takes ``out=``, which may be one of its inputs (so it
      writes there only in its last ufunc); such an op, without attributes, is fused with its
      neighbours into one kernel (fusion.py).
    - ``c_expr``: the op in C, an expression of its arguments ``{a}`` and ``{b}`` in the C type
      ``{T}`` (float or double), for compiled fusion (_cfusion.py). ``c_block``: the name of a
      float32 function of the C prelude (passes/_cfusion_prelude.c) that also has a loop over a
      block, ``<name>_n``: the op then compiles in float32 only. ``c_bool``: where the op's result
      is bool its C expression gives 1 or 0 (comparisons, logical ops), so it may make a bool there.
    - ``fresh``: the kernel returns a new array that shares memory with nothing (for a result of
      rank 1 or more), so a later op may write into it once it is dead (buffer_reuse.py).
    - ``shape_only``: positions of inputs that the kernel reads only for their shape and dtype;
      constant folding takes such an input of fully known shape as a constant.
    - ``peers``: the op runs only with other tasks or ranks running their half: a collective
      (every rank of its group calls it: cluster/collectives/ops.py), or a partition's send and
      receive (cluster/sendrecv.py). The cluster layer defines such ops.

    ``eager``: the whole eager run of an op on state kept outside its inputs (a variable's read or
    assignment, an optimizer's update, a random draw), ``eager(inputs, attrs) -> Tensor``: it runs
    where that state is, so the eager interpreter calls it instead of converting the inputs, placing
    the op and calling the kernel (which graphs run). Tapes and hooks do not see it (no gradient)."""

    __slots__ = ("name", "kernel", "shape_rule", "grad", "same_dtype", "strict", "stateful", "kernels", "doc",
                 "inplace_kernel", "elementwise", "c_expr", "c_block", "c_bool", "fresh", "shape_only", "peers", "eager")

    def __init__(self, name, kernel, shape_rule, grad=None, same_dtype=(), strict=False, stateful=False, doc="",
                 inplace_kernel=None, elementwise=None, c_expr=None, c_block=None, c_bool=False, fresh=False,
                 shape_only=(), peers=False, eager=None):
        self.name, self.kernel, self.shape_rule, self.grad = name, kernel, shape_rule, grad
        self.same_dtype, self.strict, self.stateful, self.kernels, self.doc = same_dtype, strict, stateful, {}, doc
        self.inplace_kernel, self.elementwise, self.fresh = inplace_kernel, elementwise, fresh
        self.c_expr, self.c_block, self.c_bool, self.shape_only = c_expr, c_block, c_bool, shape_only
        self.peers, self.eager = peers, eager

    def __repr__(self):
        return f"<op {self.name}>"


def defop(name, kernel, shape_rule, grad=None, **facets) -> OpDef:
    """Add an op to the table (one entry per op; the name must be new). ``facets``: the rest of
    ``OpDef``'s fields, by keyword."""
    if name in _OPS:
        raise ValueError(f"op {name!r} is already defined")
    op = _OPS[name] = OpDef(name, kernel, shape_rule, grad, **facets)
    return op


def get_op(name: str) -> OpDef:
    return _OPS[name]


def list_ops() -> list[str]:
    return sorted(_OPS)


class Call:
    """What a gradient rule sees of the forward op: inputs, attrs, output, and which inputs need
    a gradient (a rule may skip the others)."""

    __slots__ = ("inputs", "attrs", "output", "needs")

    def __init__(self, inputs, attrs, output, needs):
        self.inputs, self.attrs, self.output, self.needs = inputs, attrs, output, needs


# -- the one dispatch ------------------------------------------------------------------------
def execute(op: OpDef, inputs, attrs=NO_ATTRS):
    """Run ``op`` on ``inputs`` (tensors or values convertible to tensors) with ``attrs``: hand it
    to this thread's innermost interpreter (core/interpreters.py), or run it now when none is
    pushed (the eager interpreter, inline)."""
    st = state()
    interp = st.interpreter
    if interp is not None:
        return interp.process(op, inputs, attrs)
    return _eager(st, op, inputs, attrs)


class _Eager(Interpreter):
    """The bottom interpreter: runs the op's kernel now. Pushed on top of a graph builder by
    ``init_scope``; with an empty stack ``execute`` runs ``_eager`` without it."""

    def process(self, op, inputs, attrs):
        return _eager(state(), op, inputs, attrs)

    def __repr__(self):
        return "<eager interpreter>"


EAGER = _Eager()
_BOTTOM.append(EAGER)


def _eager(st, op, inputs, attrs):
    if op.eager is not None:   # an op on state outside its inputs: it runs where that state is
        return op.eager(inputs, attrs)
    device = None
    for x in inputs:
        if not isinstance(x, Tensor):
            inputs = _prepare(op, inputs)
            device = _first_device(inputs)
            break
        if device is None:   # the first input's device that is not the default CPU
            device = x._device
    else:
        if op.same_dtype and len(inputs) > 1:
            _check_dtypes(op, inputs)
    if op.strict:
        try:
            op.shape_rule(*inputs, **attrs)
        except InvalidArgumentError as e:
            raise op_error(op, inputs, attrs, str(e)) from None
    kernel = op.kernel
    if device is not None or st.device_stack or _devices._log_placement:
        device, kernel = _devices.place(op, device, st.device_stack)
        if _devices._remote is not None and (kernel is _devices.REMOTE or _devices.has_remote(inputs)):
            return _devices._remote.process(op, inputs, attrs, device)   # a higher layer's interpreter
    try:
        if len(inputs) == 1:
            value = kernel(inputs[0]._value, **attrs)
        elif len(inputs) == 2:
            value = kernel(inputs[0]._value, inputs[1]._value, **attrs)
        else:
            value = kernel(*[t._value for t in inputs], **attrs)
    except OpError:
        raise            # a kernel that explains itself (check_numerics) is not wrapped again
    except Exception as e:  # noqa: BLE001 - every kernel failure becomes an error naming the op
        raise explain(op, inputs, attrs, e) from None
    out = _new(Tensor)
    out._value = value
    out._device = device
    if st.hooks:
        for hook in st.hooks:
            hook(op, inputs, attrs, out)
    if st.tapes:
        record(st.tapes, op, inputs, attrs, out)
    return out


def record(tapes, op, inputs, attrs, out, reads=None):
    """Show an op to every recording tape: the one place tapes learn of ops, in every mode. A
    Variable input is recorded as a read of its value at this moment (eagerly the ``read_variable``
    op; in a graph, ``reads``: the (variable, read node) pairs the builder made), so a later
    ``assign`` cannot change the gradient."""
    if op.grad is None:
        return
    if reads is not None:
        for tape in tapes:
            for variable, read in reads:
                tape._record_read(variable, read)
            tape._record(op, inputs, attrs, out)
        return
    for i, x in enumerate(inputs):
        if x.__class__ is not Tensor and isinstance(x, Variable):
            if inputs.__class__ is not list:
                inputs = list(inputs)
            read = _new(Tensor)
            read._value = x._value
            read._device = x._device
            for tape in tapes:
                tape._record_read(x, read)
            inputs[i] = read
    for tape in tapes:
        tape._record(op, inputs, attrs, out)


def _check_dtypes(op, tensors):
    if len(tensors) == 2 and tensors[0]._value.dtype is tensors[1]._value.dtype:
        return
    group = op.same_dtype
    first = tensors[0 if group == "all" else group[0]]._value.dtype
    for i in (range(1, len(tensors)) if group == "all" else group[1:]):
        if tensors[i]._value.dtype is not first and tensors[i]._value.dtype != first:
            _prepare(op, tensors)   # raises the error that names the dtypes


def _first_device(tensors):
    for t in tensors:
        if t._device is not None:
            return t._device
    return None


def agreed_dtype(op, inputs):
    """``(group, dtype)``: the input positions of ``op.same_dtype`` and the dtype its tensors share
    (None if none is a tensor); raises the op's error naming the dtypes when they differ. Eager
    inputs and graph inputs are checked here alike."""
    group = range(len(inputs)) if op.same_dtype == "all" else op.same_dtype
    dtype = None
    for i in group:
        x = inputs[i]
        if isinstance(x, Tensor):
            v = getattr(x, "_value", None)   # eager: its array's dtype; a graph tensor has no value
            d = v.dtype if v is not None else numpy_dtype(x.dtype)
            if dtype is None:
                dtype = d
            elif d != dtype:
                raise op_error(op, inputs, NO_ATTRS, "inputs must have the same dtype; use fl.cast to convert one")
    return group, dtype


def _prepare(op, inputs):
    """Convert inputs to tensors; inputs in ``op.same_dtype`` must agree (Python values adopt it)."""
    group, dtype = agreed_dtype(op, inputs)
    out = []
    for i, x in enumerate(inputs):
        if isinstance(x, Tensor):
            out.append(x)
            continue
        try:
            if dtype is not None and i in group and x.__class__ in _SCALARS:
                out.append(Tensor(_scalar(x, dtype)))
            elif isinstance(x, (np.ndarray, np.generic)):
                out.append(Tensor(_numpy_array(x, None) if dtype is None or i not in group else _numpy_to(x, dtype)))
            else:
                out.append(Tensor(_python_array(x, dtype if i in group else None)))
        except (TypeError, OverflowError, ValueError) as e:
            raise op_error(op, inputs, NO_ATTRS, f"input {i}: {e}") from None
    return out


_SCALARS = (float, int, bool)


def _scalar(x, dtype):
    """A Python number as a 0-d array of the partner tensor's dtype (never truncating a float)."""
    if dtype.kind in "iub" and x.__class__ is float and not x.is_integer():
        raise TypeError(f"cannot convert {x!r} to a tensor of dtype {dtype.name} without losing the fractional part")
    if dtype.kind == "b" and x.__class__ is not bool:
        raise TypeError(f"cannot combine the number {x!r} with a bool tensor; use fl.cast first")
    return np.array(x, dtype)


def _numpy_to(x, dtype):
    x = _numpy_array(x, None)
    if x.dtype != dtype:
        raise TypeError(f"inputs must have the same dtype, got a numpy {x.dtype} array next to a "
                        f"{np.dtype(dtype).name} tensor; use fl.cast or .astype to convert")
    return x


def explain(op, tensors, attrs, error) -> InvalidArgumentError:
    """Turn a kernel failure into an error that names the op, its inputs and the user's line."""
    reason = None
    try:
        op.shape_rule(*tensors, **attrs)
    except InvalidArgumentError as e:
        reason = str(e)
    except Exception:  # noqa: BLE001 - the shape rule is only asked for a better message
        pass
    return op_error(op, tensors, attrs, reason or f"{type(error).__name__}: {error}")


def op_error(op, inputs, attrs, reason: str) -> InvalidArgumentError:
    """The standard error: op name, reason, inputs as dtype[shape], attributes, the user's line."""
    name = op if isinstance(op, str) else op.name
    args = ", ".join(describe(t) + _on_device(t) for t in inputs)
    shown = {k: v for k, v in attrs.items() if not isinstance(v, np.ndarray)}
    where = source_line()
    return InvalidArgumentError(
        f"{name}: {reason}\n  inputs: {args}" + (f"\n  attrs: {shown}" if shown else "") +
        (f"\n  at {where}" if where else ""), op=name, source=where)


def _on_device(t) -> str:
    """' on GPU:0' for an input that lives on a GPU (errors only: inputs on the host say nothing)."""
    device = getattr(t, "_device", None)
    value = getattr(t, "_value", None)
    if device is None and value is not None and not isinstance(value, (np.ndarray, np.generic)):
        from .backends import device_of_array
        device = device_of_array(value)
    return f" on {device.rpartition('/device:')[2]}" if device else ""


READ_VARIABLE = defop("read_variable", lambda v: v, lambda v: (tuple(v.shape), numpy_dtype(v.dtype)), lambda c, g: (g,),
                      doc="The value of a Variable at the moment an op read it (recorded by tapes).")


# -- fast eager paths -------------------------------------------------------------------------
def unary(op: OpDef, kinds: str = "biuf"):
    """The public function for a one-input op with no attributes: ``f(x)``. Inputs whose dtype
    kind is not in ``kinds`` go through ``execute``, which checks a strict op's rule."""
    kernel = op.kernel

    def fn(x, name=None):
        if not ACTIVE.count and x.__class__ is Tensor and x._device is None and x._value.dtype.kind in kinds:
            try:
                out = _new(Tensor)
                out._value = kernel(x._value)
                out._device = None
                return out
            except Exception:  # noqa: BLE001 - fall through to execute(), which explains it
                pass
        return execute(op, (x,))

    _public(fn, op)
    return fn


def _public(fn, op) -> None:
    """Name ``fn`` after its op, as a function of the module that defines it (the caller of
    ``unary``/``binary``), so that pickle finds it there by reference."""
    fn.__name__ = fn.__qualname__ = op.name
    fn.__module__ = sys._getframe(2).f_globals.get("__name__", fn.__module__)
    fn.__doc__ = op.doc


def binary(op: OpDef):
    """The public function for a two-input op with no attributes: ``f(x, y)``; also ``x.__op__(y)``.
    A Python float (int) next to a float (number) tensor takes the tensor's dtype, as in TensorFlow."""
    kernel = op.kernel
    if op.strict:
        def strict_fn(x, y, name=None):
            return execute(op, (x, y))
        _public(strict_fn, op)
        return strict_fn

    def fn(x, y, name=None):
        if not ACTIVE.count:
            xc = x.__class__
            yc = y.__class__
            if xc is Tensor and x._device is None:
                a = x._value
                if yc is Tensor and y._device is None:
                    b = y._value
                    ok = a.dtype is b.dtype
                else:
                    b = y
                    ok = (yc is float and a.dtype.kind == "f") or (yc is int and a.dtype.kind in "fiu")
            elif yc is Tensor and y._device is None:
                a = x
                b = y._value
                ok = (xc is float and b.dtype.kind == "f") or (xc is int and b.dtype.kind in "fiu")
            else:
                ok = False
            if ok:
                try:
                    # NOTE: relies on NumPy 2 (NEP 50): a Python scalar never changes the array's dtype
                    out = _new(Tensor)
                    out._value = kernel(a, b)
                    out._device = None
                    return out
                except Exception:  # noqa: BLE001 - fall through to execute(), which explains it
                    pass
        return execute(op, (x, y))

    _public(fn, op)
    return fn


def reflected(fn):
    """``x.__rop__(y)`` calls ``fn(y, x)``."""
    def rfn(x, y):
        return fn(y, x)
    return rfn
