"""``@fl.function``: trace a Python function into a graph once per input signature, then run the
graph.

The first call with a new signature (each tensor argument's shape and dtype, each Python value
itself) runs the Python function with symbolic tensors, which records every op into a ``Graph``;
Python ``if``/``for`` run at that moment, once. Later calls with the same signature skip Python
and run the compiled graph. Variables are captured by reference: the graph reads their value
each time it runs, and assignments to them happen when it runs, in program order.
"""
from __future__ import annotations

import functools
import warnings

import numpy as np

from .._display import mimebundle, static_html   # an object meets the notebook (imports nothing of flowlab)
from . import dtypes as _dtypes
from ._context import state
from .executor import compile_plan
from .graph import READ, Graph, GraphTensor
from .interpreters import current
from .execute import OpDef
from .backends import device_of_array
from .device import RemoteDeviceError, _remote_message, is_local, resolve
from .execute import _new
from .execute import record as record_on_tapes
from .shape import TensorShape
from .tape import GradientTape
from .tensor import Tensor, Variable

__all__ = ["function", "Function", "ConcreteFunction", "TensorSpec"]

RETRACE_WARNING = 5


class TensorSpec:
    """The shape and dtype a tensor argument must have; None dimensions match any size.

    >>> import flowlab as fl
    >>> fl.TensorSpec([None, 3], fl.float32).is_compatible_with(fl.zeros([5, 3]))
    True
    """

    __slots__ = ("shape", "dtype", "name")

    def __init__(self, shape, dtype=_dtypes.float32, name=None):
        self.shape = TensorShape(shape)
        self.dtype = _dtypes.as_dtype(dtype)
        self.name = name

    @classmethod
    def from_tensor(cls, tensor, name=None):
        return cls(tensor.shape, tensor.dtype, name)

    def is_compatible_with(self, value) -> bool:
        shape = tuple(value.shape)
        return (_dtypes.as_dtype(value.dtype) == self.dtype and len(shape) == len(self.shape)
                and all(a is None or b is None or a == b for a, b in zip(self.shape, shape)))

    def __eq__(self, other):
        return isinstance(other, TensorSpec) and (self.shape, self.dtype) == (other.shape, other.dtype)

    def __hash__(self):
        return hash((tuple(self.shape), self.dtype))

    def __repr__(self):
        return f"TensorSpec(shape={tuple(self.shape)}, dtype={self.dtype!r}" + (f", name={self.name!r})" if self.name else ")")


# -- argument structures -----------------------------------------------------------------------
def _is_tensor_like(x):
    return (isinstance(x, (Tensor, np.ndarray)) and not isinstance(x, Variable)) or isinstance(x, np.generic)


def _components(x):
    """The parts of a composite argument whose class defines ``_flowlab_components_(self)`` (and
    the classmethod ``_flowlab_from_components_(parts)`` to rebuild one): a function takes its parts
    apart like a tuple's, without the class having to be a tuple (a strategy's PerReplica: one
    value per replica, which must not unpack like a pair). None for anything else."""
    get = getattr(type(x), "_flowlab_components_", None)
    return None if get is None else get(x)


def _flatten(x, out):
    if isinstance(x, (list, tuple)):
        for item in x:
            _flatten(item, out)
    elif isinstance(x, dict):
        for k in sorted(x):
            _flatten(x[k], out)
    elif (parts := _components(x)) is not None:
        for item in parts:
            _flatten(item, out)
    else:
        out.append(x)
    return out


def _rebuild(template, leaves):
    it = iter(leaves)

    def build(x):
        if isinstance(x, (list, tuple)):
            items = [build(v) for v in x]
            return type(x)(*items) if hasattr(x, "_fields") else type(x)(items)
        if isinstance(x, dict):
            return {k: build(x[k]) for k in sorted(x)}
        parts = _components(x)
        if parts is not None:
            return type(x)._flowlab_from_components_([build(v) for v in parts])
        return next(it)

    return build(template)


def _key_of(leaf):
    """What makes two calls share a trace: tensors by shape and dtype, variables by identity,
    Python values by value (a new number means a new trace, as in TensorFlow)."""
    if _is_tensor_like(leaf):
        return ("T", tuple(np.shape(leaf) if not isinstance(leaf, Tensor) else leaf.shape),
                str(_dtypes.as_dtype(leaf.dtype).name))
    if isinstance(leaf, Variable):
        return ("V", id(leaf))
    try:
        hash(leaf)
    except TypeError:
        return ("O", id(leaf))
    return ("P", type(leaf).__name__, leaf)


def _structure_key(x):
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, tuple(_structure_key(v) for v in x))
    if isinstance(x, dict):
        return ("dict", tuple((k, _structure_key(x[k])) for k in sorted(x)))
    parts = _components(x)
    if parts is not None:
        return (type(x).__name__, tuple(_structure_key(v) for v in parts))
    return _key_of(x)


# -- traces that place ops on other tasks ------------------------------------------------------
_partitioner = None    # set by a cluster while one is open: see set_graph_partitioner


def set_graph_partitioner(partitioner) -> None:
    """Let a cluster run traces with nodes on other tasks (core knows no cluster; for eager ops it
    registers ``device.set_remote_interpreter``): ``partitioner(graph, fetches, feeds, {node index:
    device})`` returns ``plan(*arrays) -> tuple of arrays``. ``None`` removes it: such traces raise
    RemoteDeviceError."""
    global _partitioner
    _partitioner = partitioner


def _partitioned(graph, fetches, feeds):
    """The plan of a trace with nodes on other tasks (the partitioner's, made on first call), or None
    when it has none. A node that reads or updates a variable runs where its value is: here."""
    elsewhere = {n.index: d for n in graph.nodes if n.device and "variable" not in n.attrs
                 for d in [resolve(n.device, allow_remote=True)] if not is_local(d)}
    made = []

    def run(*arrays):
        if _partitioner is None:
            node = graph.nodes[next(iter(elsewhere))]
            raise RemoteDeviceError(f"{node.op.name} (node {node.name} of the traced function {graph.name}, made "
                                    f"at {node.source}): " + _remote_message(elsewhere[node.index]))
        if not made:
            made.append(_partitioner(graph, fetches, feeds, elsewhere))
        return made[0](*arrays)
    return run if elsewhere else None


class ConcreteFunction:
    """One trace: a graph with placeholders for the tensor arguments, and its compiled plan."""

    def __init__(self, graph, placeholders, outputs, tensor_positions):
        self.graph = graph
        self.inputs = placeholders
        self.structured_outputs = outputs
        flat = _flatten(outputs, [])
        self._out_positions = [i for i, o in enumerate(flat) if isinstance(o, GraphTensor)]
        self._flat_outputs = flat
        self.outputs = [flat[i] for i in self._out_positions]
        self._tensor_positions = tensor_positions
        # decided once per trace: a trace with no node on another task keeps the compiled plan
        self._plan = (_partitioned(graph, self.outputs, placeholders)
                      or compile_plan(graph, self.outputs, placeholders, run_stateful=True))
        self._backward: dict = {}    # output position -> gradient rule, for tapes outside the function
        self._single = isinstance(outputs, GraphTensor)   # f returns one tensor: no structure to rebuild

    def _call_flat(self, arrays):
        results = self._plan(*arrays)
        if self._single:
            t = _new(Tensor)
            value = results[0]
            t._value, t._device = value, None if value.__class__ is np.ndarray else device_of_array(value)
            return t
        flat = list(self._flat_outputs)
        for pos, value in zip(self._out_positions, results):
            t = _new(Tensor)
            t._value, t._device = value, None if value.__class__ is np.ndarray else device_of_array(value)
            flat[pos] = t
        return _rebuild(self.structured_outputs, flat)

    def __call__(self, *args):
        """Call with the tensor arguments only, in order; each must fit its placeholder."""
        if len(args) != len(self.inputs):
            raise TypeError(f"{self.graph.name} takes {len(self.inputs)} tensor arguments, got {len(args)}")
        arrays = []
        for i, (a, p) in enumerate(zip(args, self.inputs)):
            a = a._value if isinstance(a, Tensor) else np.asarray(a) if isinstance(a, np.ndarray) else np.asarray(a, dtype=p._dtype)
            if a.dtype != p._dtype or len(a.shape) != len(p._shape) or any(
                    d is not None and d != n for d, n in zip(p._shape, a.shape)):
                raise TypeError(f"{self.graph.name}: argument {i} is {a.dtype.name}{list(a.shape)}, but this "
                                f"function was traced for {p._dtype.name}{['?' if d is None else d for d in p._shape]}")
            arrays.append(a)
        return self._call_flat(arrays)

    def unchecked_call(self, *arrays):
        """The fast path, for callers that promise the signature: ``arrays`` are numpy arrays (not
        tensors, not lists), one per tensor argument, in order, each of exactly the dtype of its
        placeholder and a shape that fits it (``self.inputs``). Nothing is checked or converted,
        and the outputs come back as a tuple of numpy arrays in the order of ``self.outputs`` (no
        Tensor wrapping, no output structure), read-only by promise: do not write into them.
        A wrong argument gives an error from inside the graph (naming the node that failed) or,
        worse, a wrong result; use it where the arrays were checked once up front (``Model.fit``
        checks its data once, then calls this for every batch), and call the function itself
        everywhere else. It saves the per-call checks and wrapping (about 10 us a call)."""
        return self._plan(*arrays)

    def pretty(self) -> str:
        return self.graph.pretty(self.outputs)

    _view = "flowlab.widgets.placement_view:PlacementView"   # in a notebook: the live placement graph
    _static = "flowlab.widgets.placement:static_html"        # and its static picture (flowlab._display)

    def _repr_svg_(self):
        return self.graph.to_svg(self.outputs)

    def _repr_html_(self):   # the static placement graph, as GitHub shows it
        return static_html(self)

    def _repr_mimebundle_(self, include=None, exclude=None):
        return mimebundle(self, include, exclude)

    def __repr__(self):
        return f"<ConcreteFunction {self.graph.name}: {len(self.graph.nodes)} nodes>"


class Function:
    """A Python function that runs as a graph. Make one with ``@fl.function``."""

    def __init__(self, python_function, input_signature=None, name=None):
        functools.update_wrapper(self, python_function)
        self.python_function = python_function
        self.input_signature = None if input_signature is None else [
            s if isinstance(s, TensorSpec) else TensorSpec(*s) for s in input_signature]
        self._name = name or getattr(python_function, "__name__", "function")
        self._cache: dict = {}
        self._fast: dict = {}   # (shape, dtype) of each argument -> trace, for calls with eager tensors only
        self._trace_count = 0
        self._warned = False

    def __get__(self, instance, owner):
        if instance is None:
            return self
        bound = functools.partial(self.__call__, instance)   # a method: `self` is a Python value
        bound.get_concrete_function = functools.partial(self.get_concrete_function, instance)
        return bound

    def experimental_get_tracing_count(self) -> int:
        """How many times the Python function has been traced."""
        return self._trace_count

    def __call__(self, *args, **kwargs):
        if current().inline_calls:
            return self.python_function(*args, **kwargs)   # inside another trace: its ops join that graph
        st = state()
        if st.tapes:
            return self._call_under_tape(st, args, kwargs)
        if not kwargs:   # the common call, f(x, y) with eager tensors: a key from shapes and dtypes only
            arrays = [a._value for a in args if a.__class__ is Tensor]
            key = tuple([(a.shape, a.dtype) for a in arrays])
            if len(key) == len(args):
                concrete = self._fast.get(key)
                if concrete is not None:
                    return concrete._call_flat(arrays)
                concrete, _ = self._concrete(args, kwargs)
                if list(concrete._tensor_positions) == list(range(len(args))):
                    self._fast[key] = concrete
                return concrete._call_flat([a._value for a in args])
        concrete, leaves = self._concrete(args, kwargs)
        arrays = [leaves[i]._value if isinstance(leaves[i], Tensor) else np.asarray(leaves[i])
                  for i in concrete._tensor_positions]
        return concrete._call_flat(arrays)

    def _call_under_tape(self, st, args, kwargs):
        """Run the graph, and show each float output to the open tapes as one op whose gradient is
        a traced backward function. A function with side effects (assignments, optimizer updates,
        random draws) runs eagerly instead: its backward trace would repeat them."""
        tapes = list(st.tapes)
        for tape in tapes:                  # tracing must not record graph nodes on eager tapes
            st.pop("tapes", tape)
        try:
            concrete, leaves = self._concrete(args, kwargs)
            if any(n.op.stateful and n.op is not READ for n in concrete.graph.nodes):
                concrete = None
            else:
                inputs = [leaves[i] if isinstance(leaves[i], Tensor) else Tensor(np.asarray(leaves[i]))
                          for i in concrete._tensor_positions]
                result = concrete._call_flat([t._value for t in inputs])
        finally:
            for tape in tapes:
                st.push("tapes", tape)
        if concrete is None:
            return self.python_function(*args, **kwargs)
        variables = []
        for n in concrete.graph.nodes:
            v = n.attrs.get("variable") if n.op is READ else None
            if v is not None and v.trainable and all(v is not w for w in variables):
                variables.append(v)
        flat = _flatten(result, [])
        for k, pos in enumerate(concrete._out_positions):
            if flat[pos].dtype.is_floating:
                op = OpDef(f"call {self._name}", None, None,
                           self._gradient_rule(args, kwargs, concrete, pos, len(inputs), variables))
                record_on_tapes(st.tapes, op, inputs + variables, {}, flat[pos])
        return result

    def _gradient_rule(self, args, kwargs, concrete, position, n_inputs, variables):
        """d(output at ``position``)/d(tensor arguments and captured variables), as a traced function
        (one per trace and output, kept with the trace: later steps reuse its graph)."""
        cached = concrete._backward.get(position)
        if cached is not None:
            return cached
        leaves, positions, fn = _flatten((args, kwargs), []), concrete._tensor_positions, self.python_function

        def backward(*inputs_and_grad):
            xs, g = list(inputs_and_grad[:n_inputs]), inputs_and_grad[-1]
            new_leaves = list(leaves)
            for p, x in zip(positions, xs):
                new_leaves[p] = x
            call_args, call_kwargs = _rebuild((args, kwargs), new_leaves)
            with GradientTape() as tape:
                tape.watch(xs)
                target = _flatten(fn(*call_args, **call_kwargs), [])[position]
            return tape.gradient(target, xs + variables, output_gradients=g)

        backward_function = Function(backward, name=f"{self._name}_grad")
        rule = concrete._backward[position] = lambda call, g: tuple(backward_function(*call.inputs[:n_inputs], g))
        return rule

    def get_concrete_function(self, *args, **kwargs) -> ConcreteFunction:
        """The trace for these arguments (traced now if needed). With no arguments, the one for
        ``input_signature``."""
        if not args and not kwargs and self.input_signature is not None:
            args = tuple(self.input_signature)
        return self._concrete(args, kwargs)[0]

    def _concrete(self, args, kwargs):
        if self.input_signature is not None:
            args = self._check_signature(args, kwargs)
            key = "signature"
        else:
            key = _structure_key((args, kwargs))
        leaves = _flatten((args, kwargs), [])
        concrete = self._cache.get(key)
        if concrete is None:
            concrete = self._cache[key] = self._trace(args, kwargs, leaves)
        return concrete, leaves

    def _check_signature(self, args, kwargs):
        """Each argument as a tensor of its spec's dtype (lists and arrays are converted)."""
        specs = self.input_signature
        if kwargs or len(args) != len(specs):
            raise TypeError(f"{self._name} was declared with input_signature of {len(specs)} tensors, "
                            f"but got {len(args)} positional and {len(kwargs)} keyword arguments")
        out = []
        for i, (arg, spec) in enumerate(zip(args, specs)):
            if isinstance(arg, TensorSpec):
                out.append(arg)
                continue
            value = arg if isinstance(arg, Tensor) else Tensor(np.asarray(arg, dtype=spec.dtype.as_numpy_dtype))
            if not spec.is_compatible_with(value):
                raise TypeError(f"{self._name}: argument {i} is {value.dtype.name}{list(value.shape)}, which does "
                                f"not fit its input_signature {spec}")
            out.append(value)
        return tuple(out)

    def _trace(self, args, kwargs, leaves):
        self._trace_count += 1
        if self._trace_count > RETRACE_WARNING and not self._warned:
            self._warned = True
            warnings.warn(
                f"{self._name} has been traced {self._trace_count} times. Each new Python value or new "
                "tensor shape starts a new trace, which is slow: pass numbers as tensors "
                "(fl.constant(x)), or give input_signature=[fl.TensorSpec([None, ...])] for varying sizes.",
                stacklevel=4)
        graph = Graph(self._name)
        placeholders, positions, symbolic = [], [], []
        with graph.as_default():
            specs = self.input_signature or [None] * len(leaves)
            for i, leaf in enumerate(leaves):
                spec = specs[i] if self.input_signature is not None else None
                if spec is not None or _is_tensor_like(leaf) or isinstance(leaf, TensorSpec):
                    spec = spec or (leaf if isinstance(leaf, TensorSpec) else TensorSpec(
                        np.shape(leaf) if not isinstance(leaf, Tensor) else leaf.shape, leaf.dtype))
                    p = graph.placeholder(spec.dtype, spec.shape, name=spec.name or f"arg{i}")
                    placeholders.append(p)
                    positions.append(i)
                    symbolic.append(p)
                else:
                    symbolic.append(leaf)
            call_args, call_kwargs = _rebuild((args, kwargs), symbolic)
            result = self.python_function(*call_args, **call_kwargs)
            flat = [graph.read(o) if isinstance(o, Variable) else
                    graph.constant(o) if isinstance(o, Tensor) and not isinstance(o, GraphTensor) else o
                    for o in _flatten(result, [])]
            result = _rebuild(result, flat)
        return ConcreteFunction(graph, placeholders, result, positions)

    def __repr__(self):
        return f"<fl.function {self._name}: {self._trace_count} trace(s)>"


def function(func=None, input_signature=None, name=None, **_options):
    """Compile a Python function into a graph on its first call for each input signature.

    >>> import flowlab as fl
    >>> @fl.function
    ... def f(x):
    ...     return x * x + 1.0
    >>> float(f(fl.constant(3.0)))
    10.0
    """
    if func is None:
        return lambda f: Function(f, input_signature, name)
    return Function(func, input_signature, name)
