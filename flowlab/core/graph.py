"""Graphs: ops recorded as nodes instead of run, to be optimized, placed and run later.

While a ``Graph`` is the thread's default (``with graph.as_default():``, or while ``@fl.function``
traces), its ``GraphBuilder`` is the thread's innermost interpreter (core/interpreters.py), and
``execute`` hands every op to ``Graph.add_node``: it converts the inputs (eager tensors
and Python values become constants, a Variable becomes a read of its value *when the graph
runs*), checks them with the op's shape rule (so a shape error surfaces while tracing, naming
the user's line), and returns a symbolic ``GraphTensor``. Each node records its op, inputs,
attributes, output spec, device request and the user's source line.
"""
from __future__ import annotations

import contextlib
import itertools

import numpy as np

from . import dtypes as _dtypes
from ._context import state
from .errors import InvalidArgumentError, source_line
from .execute import NO_ATTRS, agreed_dtype, defop, op_error, record
from .interpreters import Interpreter, current, current_graph, interpreting
from .ops.variable_ops import ASSIGN, READ
from .shape import TensorShape
from .tensor import Tensor, Variable, _numpy_array, _python_array

__all__ = ["Graph", "GraphTensor", "GraphBuilder", "Node", "get_default_graph", "control_dependencies", "name_scope"]


class GraphTensor(Tensor):
    """A symbolic tensor: the output of a graph node. It has a shape (dimensions may be None) and a
    dtype, but no value until the graph runs."""

    __slots__ = ("graph", "node", "_shape", "_dtype")

    @property
    def dtype(self):
        return _dtypes.as_dtype(self._dtype)

    @property
    def shape(self):
        return TensorShape(self._shape)

    @property
    def ndim(self):
        return None if self._shape is None else len(self._shape)

    @property
    def device(self):
        return self.node.device or ""

    @property
    def name(self):
        return f"{self.node.name}:0"

    @property
    def op(self):
        return self.node

    def _no_value(self, what):
        raise TypeError(
            f"{what} needs a value, but {self.name} is a graph tensor: it has none until the graph runs. "
            "Inside @fl.function, Python `if`/`for` on tensors run once, while tracing; use fl.where for "
            "choices that depend on values, or return the tensor and look at it outside the function.")

    def numpy(self):
        self._no_value(".numpy()")

    def __array__(self, dtype=None, copy=None):
        self._no_value("converting to a numpy array")

    def __bool__(self):
        self._no_value("Python's `if`/`while`/`and`/`or`")

    def __float__(self):
        self._no_value("float()")

    def __int__(self):
        self._no_value("int()")

    def __index__(self):
        self._no_value("using a tensor as an index")

    def __len__(self):
        if not self._shape or self._shape[0] is None:
            self._no_value("len()")
        return self._shape[0]

    def __iter__(self):
        if not self._shape or self._shape[0] is None:
            self._no_value("iterating")
        return (self[i] for i in range(self._shape[0]))

    def __format__(self, spec):
        return repr(self)

    def __repr__(self):
        shape = "<unknown>" if self._shape is None else tuple(self._shape)
        return f"<fl.Tensor '{self.name}' shape={shape} dtype={self.dtype.name} (graph tensor)>"

    def __reduce__(self):
        raise TypeError(f"graph tensor {self.name} cannot be pickled; run the graph and pickle its value")


class Node:
    """One op in a graph: ``output = op(*inputs, **attrs)``, with where it runs and who wrote it.
    ``control_inputs``: nodes that must run before it (``Graph.control_dependencies``), whose
    values it does not read."""

    __slots__ = ("index", "op", "inputs", "attrs", "output", "name", "device", "source", "graph", "control_inputs")

    def __repr__(self):
        args = ['%' + str(t.node.index) for t in self.inputs] + ['^%' + str(c.index) for c in self.control_inputs]
        return f"<node %{self.index} {self.name} = {self.op.name}({', '.join(args)})>"


# -- the ops that only graphs have -------------------------------------------------------------
def _value_rule(*_, value):
    return value.shape, value.dtype


CONST = defop("const", lambda *, value: value, _value_rule, doc="A value baked into the graph.")
PLACEHOLDER = defop("placeholder", lambda **_: None, lambda *, shape, dtype, name: (shape, dtype),
                    doc="A graph input, fed when the graph runs.")
_VALUES = (CONST, PLACEHOLDER)


# -- the graph ---------------------------------------------------------------------------------
class Graph:
    """A program of ops. Build it with ``with g.as_default():`` (or let ``@fl.function`` build one),
    look at it with ``g.pretty()``, run it with a session or a traced function."""

    _ids = itertools.count()
    tensor_class = GraphTensor     # what nodes output and what they are: subclasses may refine them
    node_class = Node

    def __init__(self, name: str = "graph"):
        self.name = name
        self.nodes: list[Node] = []
        self.placeholders: list[GraphTensor] = []
        self._counts: dict[str, int] = {}
        self._consts: dict[int, GraphTensor] = {}
        self._keep: list = []         # eager tensors made into constants: kept alive so ids stay unique
        self.collections: dict[str, list] = {}
        self.version = 0              # bumped on every change: compiled plans check it
        self._names: set = set()      # every name given out (unique_name)
        self._scopes: list = []       # name scope prefixes ("layer/"), innermost last
        self._controls: list = []     # control_dependencies blocks: lists of nodes, innermost last
        self._finalized = False

    # -- building --------------------------------------------------------------------------------
    def as_default(self):
        """Make this the graph that ops are added to, in this thread, inside the ``with`` block."""
        return _DefaultGraph(self)

    # -- names ---------------------------------------------------------------------------------
    def unique_name(self, name: str, mark_as_used: bool = True) -> str:
        """``name``, or ``name_1``, ``name_2``... (the first not given out yet): a name for a new
        node, reserved unless ``mark_as_used=False``. No name scope is added (see ``name_scope``)."""
        if name in self._names:
            n = self._counts.get(name, 0)
            while True:
                n += 1
                candidate = f"{name}_{n}"
                if candidate not in self._names:
                    break
            self._counts[name] = n
            name = candidate
        if mark_as_used:
            self._names.add(name)
        return name

    @contextlib.contextmanager
    def name_scope(self, name):
        """Prefix the names of the nodes made inside with ``name/`` (nested scopes add up, as in
        TensorFlow). A name ending in ``/`` is a whole prefix (``"outer/inner/"``: re-enter a scope
        exactly); None or ``""`` means no prefix (the top level). Yields the prefix."""
        if not name:
            prefix = ""
        elif name.endswith("/"):
            prefix = name
        else:
            prefix = f"{self.scope_prefix()}{name}/"
        self._scopes.append(prefix)
        try:
            yield prefix
        finally:
            self._scopes.pop()

    def scope_prefix(self) -> str:
        """The current name scope's prefix (``"layer/"``), or ``""`` at the top level."""
        return self._scopes[-1] if self._scopes else ""

    def rename(self, node, name: str, scoped: bool = True) -> str:
        """Give ``node`` the name ``name`` (under the current name scope unless ``scoped=False``),
        made unique: for API layers that name the result of a composite function once it is built
        (``tf.add(a, b, name="total")``). Returns the name given. Its old name stays taken."""
        self._check_mutable(f"renaming {node.name}")
        node.name = self.unique_name((self.scope_prefix() if scoped else "") + name)
        self.version += 1
        return node.name

    # -- control dependencies ---------------------------------------------------------------------
    @contextlib.contextmanager
    def control_dependencies(self, control_inputs):
        """Inside the block, every node made in this graph runs after ``control_inputs`` (graph
        tensors or nodes of this graph) and runs them when it runs, though it reads no value from
        them: ``with g.control_dependencies([update]): after = fl.identity(loss)``. Blocks nest and
        add up; ``control_dependencies(None)`` starts afresh (no control inputs inside)."""
        nodes = None
        if control_inputs is not None:
            nodes = []
            for x in control_inputs:
                node = self._control_node(x)
                if node is not None and all(node is not n for n in nodes):
                    nodes.append(node)
        self._controls.append(nodes)
        try:
            yield
        finally:
            self._controls.pop()

    def _control_node(self, x):
        if isinstance(x, Variable):   # what ``v.assign_add(...)`` returns inside a graph: its latest assignment
            node = next((n for n in reversed(self.nodes) if n.op is ASSIGN and n.attrs["variable"] is x), None)
            if node is None:
                raise ValueError(f"control_dependencies: nothing assigns variable {x.name!r} in graph {self.name!r} "
                                 f"yet; pass the tensor or node to wait for")
            return node
        node = x.node if isinstance(x, GraphTensor) else x if isinstance(x, Node) else None
        if node is None:
            raise TypeError(f"control_dependencies takes graph tensors, nodes and assigned variables, "
                            f"not {type(x).__name__}")
        if node.graph is not self:
            raise ValueError(f"control_dependencies: {node.name} belongs to graph {node.graph.name!r}, not "
                             f"{self.name!r}")
        return node

    def current_control_inputs(self) -> list:
        """The nodes a node made now would get as control inputs (the enclosing blocks' nodes)."""
        out: list = []
        for nodes in reversed(self._controls):
            if nodes is None:
                break
            out.extend(n for n in nodes if all(n is not m for m in out))
        return out

    # -- building ----------------------------------------------------------------------------------
    def finalize(self):
        """Forbid adding nodes from now on (catches a training loop that keeps making ops)."""
        self._finalized = True

    @property
    def finalized(self) -> bool:
        return self._finalized

    def _check_mutable(self, what):
        if self._finalized:
            raise RuntimeError(f"graph {self.name!r} is finalized and cannot be modified ({what}): build every "
                               "op before the training loop")

    def _append(self, op, inputs, attrs, shape, dtype, name=None, scoped=True):
        if self._finalized:
            self._check_mutable(f"it would get a {op.name} node")
        st = state()
        node = self.node_class()
        node.index = len(self.nodes)
        node.op, node.inputs, node.attrs = op, list(inputs), dict(attrs)
        node.name = self.unique_name(((self._scopes[-1] if self._scopes and scoped else "")) + (name or op.name))
        # a constant or placeholder runs nothing: its readers made inside the block carry the edges
        node.control_inputs = self.current_control_inputs() if self._controls and op not in _VALUES else []
        node.device = st.device_stack[-1] if st.device_stack else None
        variable = attrs.get("variable")
        if not node.device and variable is not None and variable._device is not None:
            from .device import as_spec
            node.device = as_spec(variable._device)   # colocated with the variable it reads or updates
        if not node.device:   # as in eager mode: an op with no scope runs where its first placed input is
            node.device = next((t.node.device for t in inputs if t.node.device), None)
        node.source = source_line()
        node.graph = self
        out = object.__new__(self.tensor_class)
        out._device = None
        out.graph, out.node = self, node
        out._shape = None if shape is None else tuple(None if d is None else int(d) for d in shape)
        out._dtype = np.dtype(dtype)
        node.output = out
        self.nodes.append(node)
        self.version += 1
        return out

    def nodes_for(self, fetches, feeds=(), also=()) -> list:
        """The nodes to run, in program order, to compute ``fetches`` from ``feeds`` (plus the nodes
        ``also`` names and what they need, and every node's control inputs). A placeholder among
        them that is not fed is an error."""
        fed = {id(t.node) for t in feeds}
        needed, stack = set(), [t.node for t in fetches] + list(also)
        while stack:
            node = stack.pop()
            if node.index in needed:
                continue
            needed.add(node.index)
            if id(node) not in fed:
                stack.extend(t.node for t in node.inputs)
                stack.extend(node.control_inputs)
        nodes = [n for n in self.nodes if n.index in needed and id(n) not in fed]
        for n in nodes:
            if n.op is PLACEHOLDER:
                raise InvalidArgumentError(
                    f"placeholder {n.output.name} must be fed a value (it is needed for "
                    f"{', '.join(t.name for t in fetches)}): pass it in feed_dict", op="placeholder")
        return nodes

    def placeholder(self, dtype, shape=None, name=None) -> GraphTensor:
        """A graph input of ``dtype`` and ``shape`` (None dims: any size; ``TensorShape(None)``: any
        rank), fed when the graph runs; named ``name`` (under the name scope; default ``placeholder``)."""
        if shape is None:
            raise ValueError("placeholder: give a shape (None for dimensions of any size, "
                             "fl.TensorShape(None) for any rank)")
        shape = TensorShape(shape)
        shape = None if shape.rank is None else tuple(shape)
        dtype = _dtypes.numpy_dtype(dtype)
        t = self._append(PLACEHOLDER, (), {"shape": shape, "dtype": dtype, "name": name or "placeholder"},
                         shape, dtype, name or "placeholder")
        self.placeholders.append(t)
        return t

    def constant(self, value, dtype=None, name=None) -> GraphTensor:
        """A node holding ``value`` (an eager tensor becomes one constant node however often it is
        used, unless it is given a ``name``: then a node of its own with that name)."""
        if isinstance(value, GraphTensor):
            return value
        if isinstance(value, Tensor):
            found = self._consts.get(id(value)) if name is None else None
            if found is not None:
                return found
            self._keep.append(value)
            array = np.asarray(value)
        elif isinstance(value, (np.ndarray, np.generic)):
            array = _numpy_array(value, dtype)
        else:
            array = _python_array(value, dtype)
        t = self._append(CONST, (), {"value": array}, array.shape, array.dtype, name)
        if isinstance(value, Tensor) and name is None:
            self._consts[id(value)] = t
        return t

    def read(self, variable: Variable, name=None) -> GraphTensor:
        """A node that reads ``variable`` when the graph runs (its value at that point of the
        program), named ``name`` under the name scope, else after the variable (no scope added:
        a variable's name is already complete)."""
        return self._append(READ, (), {"variable": variable}, variable._value.shape, variable._value.dtype,
                            name or variable._name.replace(":", "_"), scoped=name is not None)

    def add_node(self, op, inputs, attrs=NO_ATTRS, name=None):
        """What ``execute`` calls in graph mode: add ``op`` and return its symbolic output. The node
        is named ``name`` (default: the op's name), under the current name scope, made unique."""
        if op is READ and name is None:   # a variable's read is named after the variable
            return self.read(attrs["variable"])
        tensors, reads = self._inputs(op, inputs)
        try:
            if any(t._shape is None for t in tensors):
                shape, dtype = _rule_for_unknown_ranks(op, tensors, attrs)
            else:
                shape, dtype = op.shape_rule(*tensors, **attrs)
        except InvalidArgumentError as e:
            raise op_error(op, tensors, attrs, str(e)) from None
        out = self._append(op, tensors, attrs, shape, dtype, name)
        st = state()
        if st.tapes:
            record(st.tapes, op, tensors, attrs, out, reads)
        return out

    def _inputs(self, op, inputs):
        """Graph tensors of this graph for every input; and the (variable, read) pairs made."""
        group, dtype = agreed_dtype(op, inputs)
        out, reads = [], []
        for i, x in enumerate(inputs):
            if isinstance(x, GraphTensor):
                if x.graph is not self:
                    raise op_error(op, inputs, NO_ATTRS,
                                   f"input {i} ({x.name}) belongs to another graph ({x.graph.name}); a graph can "
                                   "only use its own tensors (pass values in as arguments instead)")
                out.append(x)
            elif isinstance(x, Variable):
                read = self.read(x)
                reads.append((x, read))
                out.append(read)
            else:
                try:
                    out.append(self.constant(x, dtype if (i in group and not isinstance(x, Tensor)) else None))
                except (TypeError, ValueError, OverflowError) as e:
                    raise op_error(op, inputs, NO_ATTRS, f"input {i}: {e}") from None
        return out, reads

    # -- looking at it ---------------------------------------------------------------------------
    def get_operations(self):
        return list(self.nodes)

    def get_tensor_by_name(self, name: str) -> GraphTensor:
        base = name[:-2] if name.endswith(":0") else name
        for node in self.nodes:
            if node.name == base:
                return node.output
        raise KeyError(f"graph {self.name!r} has no tensor {name!r}")

    def pretty(self, outputs=None) -> str:
        """A readable listing: one line per node with its op, inputs, output spec, device and source."""
        from .graph_text import listing
        return listing(self, outputs)

    def to_svg(self, outputs=None) -> str:
        """The graph drawn as a self-contained SVG: boxes filled by device (see graph_svg.py)."""
        from .graph_svg import render
        return render(self, outputs)

    def _repr_svg_(self):
        return self.to_svg()

    def __repr__(self):
        return f"<fl.Graph {self.name!r}: {len(self.nodes)} nodes>"

    def _repr_pretty_(self, p, cycle):
        p.text(self.pretty())


class _Probe:
    __slots__ = ("shape", "dtype")

    def __init__(self, shape, dtype):
        self.shape, self.dtype = shape, dtype


def _rule_for_unknown_ranks(op, tensors, attrs):
    """The output spec of ``op`` when inputs have unknown rank. Its rule is asked with each such
    input given each rank up to 7 (all dimensions unknown); the output has the dimensions that all
    the accepted answers agree on, and unknown rank if their ranks differ (so an elementwise op
    gives unknown rank, a full reduction a scalar, ``tf.shape`` a vector). No rank accepted: the
    op cannot work whatever is fed, and the last rank's error is raised now."""
    unknown = [i for i, t in enumerate(tensors) if t._shape is None]
    outs, error = [], None
    for ranks in itertools.product(range({1: 8, 2: 6}.get(len(unknown), 4)), repeat=len(unknown)):
        specs = list(tensors)
        for i, r in zip(unknown, ranks):
            specs[i] = _Probe((None,) * r, tensors[i]._dtype)
        try:
            outs.append(op.shape_rule(*specs, **attrs))
        except (ValueError, TypeError, IndexError) as e:
            error = e
    if not outs:
        names = ", ".join(tensors[i].name for i in unknown)
        raise InvalidArgumentError(f"{error} ({names}: unknown rank, and no rank it could be fed would do)")
    shapes = {tuple(s) for s, _ in outs}
    if len({len(s) for s in shapes}) > 1:
        return None, outs[0][1]
    return tuple(ds[0] if len(set(ds)) == 1 else None for ds in zip(*shapes)), outs[0][1]


class GraphBuilder(Interpreter):
    """The interpreter that adds each op to ``graph`` (``Graph.add_node``) instead of running it."""

    __slots__ = ("graph",)

    def __init__(self, graph):
        self.graph = graph

    inline_calls = True          # a traced function called while building becomes part of this graph
    moves_new_tensors = False    # the node a new tensor becomes is placed instead

    def process(self, op, inputs, attrs):
        return self.graph.add_node(op, inputs, attrs)

    def control_dependencies(self, control_inputs):
        return self.graph.control_dependencies(control_inputs)

    def name_scope(self, name):
        return self.graph.name_scope(name)

    def __repr__(self):
        return f"<graph builder of {self.graph.name!r}>"


class _DefaultGraph(interpreting):
    __slots__ = ()

    def __init__(self, graph):
        super().__init__(GraphBuilder(graph))

    def __enter__(self):
        return super().__enter__().graph


get_default_graph = current_graph    # the graph ops are being added to in this thread, or None


def control_dependencies(control_inputs):
    """``with fl.control_dependencies([op]):``: while a graph is being built (``@fl.function``,
    ``with g.as_default():``), the nodes made inside run after ``control_inputs`` (see
    ``Graph.control_dependencies``). In eager mode ops run in program order already: nothing to do.

    >>> import flowlab as fl
    >>> from flowlab.core.executor import compile_plan
    >>> g = fl.Graph("demo")
    >>> with g.as_default():
    ...     x = g.placeholder(fl.float32, [], name="x")
    ...     check = fl.debugging.check_numerics(x, "x is not finite")
    ...     with control_dependencies([check]):
    ...         y = x * 2.0
    >>> y.op
    <node %3 multiply = multiply(%0, %2, ^%1)>
    >>> [n.op.name for n in compile_plan(g, [y], [x]).nodes]   # fetching y runs the check first
    ['check_numerics', 'const', 'multiply']
    """
    return current().control_dependencies(control_inputs)


def name_scope(name):
    """``with fl.name_scope("layer"):``: prefix the names of graph nodes made inside with
    ``layer/`` (see ``Graph.name_scope``); in eager mode, nothing to do."""
    return current().name_scope(name)
