"""TF1 graphs on top of flowlab's: one process-wide default graph, tensors that work outside
``with g.as_default():``, names and name scopes, collections, ``tf.group``.

In TF1 every op builds a graph node: there is always a default graph. flowlab is eager unless a
graph is the thread's default, so the TF1 functions of ``flowlab.compat.v1`` enter a graph for
the duration of the call: the graph of their tensor inputs, else ``get_default_graph()``.

A ``tf.Graph`` is a flowlab ``Graph`` whose tensors behave as TF1's graph tensors do: hashable,
with ``==`` meaning "the same tensor" (so they can key a ``feed_dict``), and whose operators
(``x + 1``, ``a @ b``, ``x[0]``) add to the tensor's own graph even when no graph is the default.
Its nodes are ``tf.Operation``s, which have ``run()``.
"""
from __future__ import annotations

import contextlib
import functools
import threading
import weakref

from ..core import graph as _core_graph
from ..core.interpreters import current_graph
from ..core.graph import GraphTensor, Node
from ..core.tensor import Tensor
from ..core.tensor import Variable as _CoreVariable

__all__ = ["Graph", "Operation", "GroupOperation", "get_default_graph", "reset_default_graph", "graph_function",
           "building", "entered_graph", "name_scope", "scope_prefix", "control_dependencies", "group", "no_op", "GraphKeys",
           "get_collection", "add_to_collection", "get_collection_ref", "graph_info"]


class GraphKeys:
    """The names of the standard collections (``graph.collections[key]``), as TF1 spells them."""
    GLOBAL_VARIABLES = "variables"
    TRAINABLE_VARIABLES = "trainable_variables"
    LOCAL_VARIABLES = "local_variables"
    GLOBAL_STEP = "global_step"
    UPDATE_OPS = "update_ops"
    LOSSES = "losses"
    TRAIN_OP = "train_op"


# -- tensors and operations of a tf.Graph ---------------------------------------------------------
class Operation(Node):
    """A node of a ``tf.Graph``: ``name``, ``type``, ``inputs``, ``outputs``, ``device``, and
    ``run()``, which runs it in the default session (TF1 ops have no value: running one returns None)."""

    __slots__ = ()

    @property
    def type(self) -> str:
        return self.op.name

    @property
    def outputs(self):
        return [self.output]

    def values(self):
        return (self.output,)

    def run(self, feed_dict=None, session=None):
        """Run this operation (and what it needs) in ``session`` or the default session."""
        from ._session import get_default_session
        sess = session or get_default_session()
        if sess is None:
            raise ValueError(f"{self.name}.run() needs a default session: use `with tf.Session() as sess:` "
                             "or pass session=")
        sess.run(self, feed_dict=feed_dict)


_OPERATORS = ("add", "radd", "sub", "rsub", "mul", "rmul", "truediv", "rtruediv", "floordiv", "rfloordiv",
              "mod", "rmod", "pow", "rpow", "matmul", "rmatmul", "neg", "pos", "abs", "invert",
              "and", "rand", "or", "ror", "lt", "le", "gt", "ge", "getitem")


def _in_own_graph(dunder):
    """``Tensor.<dunder>`` (the op table's), with the object's graph made the default if none is."""
    def operator(self, *args):
        method = getattr(Tensor, dunder)   # looked up on each call: the op table owns it
        if entered_graph() is not None:
            return method(self, *args)
        with self.graph.as_default():
            return method(self, *args)
    operator.__name__ = dunder
    return operator


def operators_in_own_graph(cls):
    """Give ``cls`` (which has ``.graph``) the operators of a TF1 graph tensor; identity equality."""
    for name in _OPERATORS:
        if hasattr(Tensor, f"__{name}__"):
            setattr(cls, f"__{name}__", _in_own_graph(f"__{name}__"))
    cls.__eq__ = lambda self, other: self is other   # TF1: `==` compares identity; use tf.equal for values
    cls.__ne__ = lambda self, other: self is not other
    cls.__hash__ = object.__hash__
    return cls


@operators_in_own_graph
class _Tensor(GraphTensor):
    """The output of a node of a ``tf.Graph`` (see the module docstring)."""

    __slots__ = ()

    @property
    def device(self) -> str:
        """The device its node was placed on, as a string ("" if none was asked for), as in TF1."""
        spec = self.node.device
        return spec.to_string() if hasattr(spec, "to_string") else (spec or "")

    def eval(self, feed_dict=None, session=None):
        """Its value, computed in ``session`` or the default session."""
        from ._session import get_default_session
        sess = session or get_default_session()
        if sess is None:
            raise ValueError(f"{self.name}.eval() needs a default session: use `with tf.Session() as sess:` "
                             "or pass session=")
        return sess.run(self, feed_dict=feed_dict)


class Graph(_core_graph.Graph):
    """flowlab's ``Graph`` with TF1 manners: see the module docstring. Names, name scopes,
    ``control_dependencies`` and ``finalize()`` (read-only: catches a training loop that keeps
    adding nodes) are the core Graph's.

    >>> import flowlab.compat.v1 as tf
    >>> g = tf.Graph()
    >>> with g.as_default():
    ...     x = tf.placeholder(tf.float32, [2], name="x")
    >>> y = x * 2.0                      # no `with` needed: x knows its graph
    >>> y.graph is g, y in {x: 0, y: 1}  # tensors are hashable (feed_dict keys)
    (True, True)
    """

    tensor_class = _Tensor    # hashable tensors with .eval(), nodes with .run(), as in TF1
    node_class = Operation

    def get_operation_by_name(self, name: str):
        for node in self.nodes:
            if node.name == name:
                return node
        if name in graph_info(self).groups:
            return graph_info(self).groups[name]
        raise KeyError(f"graph {self.name!r} has no operation {name!r}")

    def get_collection(self, key, scope=None):
        return get_collection(key, scope, graph=self)

    def add_to_collection(self, name, value):
        add_to_collection(name, value, graph=self)

    def device(self, device_name):
        from ..core.device import device
        return device(device_name)

    # -- in a notebook: the placement graph (flowlab/widgets/placement.py) ---------------------------
    _view = "flowlab.widgets.placement_view:PlacementView"
    _static = "flowlab.widgets.placement:static_html"

    def _repr_html_(self):
        from .._display import static_html
        return static_html(self)

    def _repr_mimebundle_(self, include=None, exclude=None):
        from .._display import mimebundle
        return mimebundle(self, include, exclude)


# -- the process's default graph: where compat asks core --------------------------------------------
_process_default = Graph("default")


def entered_graph():
    """The graph of this thread's innermost ``with g.as_default():`` (or session block), or None:
    the one place compat asks core which graph ops go to."""
    return current_graph()


def get_default_graph():
    """The graph ops are added to: the innermost ``with g.as_default():`` of this thread, else the
    process-wide default graph (TF1 always has one)."""
    g = entered_graph()
    return g if g is not None else _process_default


def reset_default_graph():
    """Replace the process-wide default graph by an empty one (tensors of the old graph stay in it)."""
    global _process_default
    if entered_graph() is not None:
        raise RuntimeError("reset_default_graph() was called inside `with graph.as_default():` (or a "
                           "session's `with` block); leave the block first, or make a new tf.Graph()")
    _process_default = Graph("default")


_INFO: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # core Graph -> compat's notes on it


def graph_info(graph):
    """compat's own notes on a graph: variable names, the get_variable store, tf.group operations
    (kept here, beside the graph, as long as the graph lives)."""
    info = _INFO.get(graph)
    if info is None:
        info = _INFO[graph] = _GraphInfo()
    return info


class _GraphInfo:
    __slots__ = ("variable_names", "store", "groups", "lock")

    def __init__(self):
        self.lock = threading.RLock()      # held while a local session's values are in the variables
        self.groups: dict = {}             # tf.group operations by name (they are not nodes)
        self.variable_names: set = set()   # names of tf.Variables (unique within the graph)
        self.store: dict = {}              # get_variable: full name -> Variable


# -- building from outside a `with` ---------------------------------------------------------------
def graph_of(args, kwargs=None):
    """The graph of the first graph tensor or TF1 variable among the arguments (one level deep)."""
    for value in (*args, *(kwargs or {}).values()):
        items = value if isinstance(value, (list, tuple)) else (value,)
        for x in items:
            if isinstance(x, GraphTensor):
                return x.graph
            g = getattr(x, "graph", None) if isinstance(x, _CoreVariable) else None
            if g is not None:
                return g
    return None


def building(graph):
    """``graph.as_default()`` unless some graph already is the default (then add to that one)."""
    return graph.as_default() if entered_graph() is None else contextlib.nullcontext(entered_graph())


def as_graph_value(graph, value):
    """An eager tensor made into a constant of ``graph``: every TF1 function returns graph tensors."""
    if isinstance(value, Tensor) and not isinstance(value, (GraphTensor, _CoreVariable)):
        return graph.constant(value)
    if isinstance(value, list):
        return [as_graph_value(graph, v) for v in value]
    return value


def graph_function(fn, tf_name=None):
    """``fn`` as a TF1 function: it builds nodes (in its inputs' graph, else the default graph),
    always returns graph tensors, and names its result when given ``name=``."""
    @functools.wraps(fn)
    def build(*args, name=None, **kwargs):
        graph = entered_graph() or graph_of(args, kwargs) or get_default_graph()
        with building(graph) as graph:
            out = as_graph_value(graph, fn(*args, **kwargs))
        if name and isinstance(out, GraphTensor):
            out.graph.rename(out.node, name)
        return out
    if tf_name:
        build.__name__ = build.__qualname__ = tf_name
    return build


# -- name scopes and control dependencies: the default graph's ----------------------------------
def name_scope(name, default_name=None, values=None):
    """Prefix the names of the nodes made inside with ``name/`` (nested scopes add up; see
    ``Graph.name_scope``): a scope of the graph of ``values`` if given, else of the default graph."""
    graph = graph_of([values] if values is not None else ()) or get_default_graph()
    return graph.name_scope(name or default_name)


def scope_prefix(graph=None) -> str:
    """The name prefix of the current name scope of ``graph`` (default: the default graph)."""
    return (graph or get_default_graph()).scope_prefix()


def control_nodes(x) -> list:
    """The nodes a control dependency on ``x`` waits for: a tf.group's inputs, an operation, a
    tensor's node, a variable's read."""
    if isinstance(x, GroupOperation):
        return [t.node for t in x.inputs]
    if isinstance(x, Node):
        return [x]
    if isinstance(x, GraphTensor):
        return [x.node]
    if isinstance(x, _CoreVariable) and getattr(x, "graph", None) is not None:
        return [x.value().node]
    raise TypeError(f"tf.control_dependencies takes operations and tensors, not {type(x).__name__}")


def control_dependencies(control_inputs):
    """``with tf.control_dependencies([train_op]): after = tf.identity(loss)``: the ops made inside
    run only after ``control_inputs`` (operations, tensors, tf.group results), and running one of
    them runs those first. ``None`` clears the enclosing blocks' dependencies inside.

    >>> import flowlab.compat.v1 as tf
    >>> with tf.Graph().as_default():
    ...     w = tf.Variable(1.0)
    ...     step = tf.assign_add(w, 1.0)
    ...     with tf.control_dependencies([step]):
    ...         after = tf.identity(w)
    ...     with tf.Session() as sess:
    ...         sess.run(w.initializer)
    ...         print(sess.run(after), sess.run(after))
    2.0 3.0
    """
    graph = entered_graph() or get_default_graph()
    if control_inputs is None:
        return graph.control_dependencies(None)
    nodes = []
    for x in control_inputs:
        nodes.extend(control_nodes(x))
    graph = nodes[0].graph if nodes and entered_graph() is None else graph
    return graph.control_dependencies(nodes)


# -- grouping and collections ---------------------------------------------------------------------
class GroupOperation:
    """What ``tf.group`` returns: one operation that, when run, runs all of its inputs (and what they
    need). It has no value: ``sess.run(op)`` gives None. (It is not a node of the graph: the nodes it
    groups are.)"""

    type = "NoOp"
    device = None
    outputs: list = []

    def __init__(self, graph, tensors, name):
        self.graph, self.inputs, self.name = graph, tensors, name

    def run(self, feed_dict=None, session=None):
        Operation.run(self, feed_dict, session)

    def __repr__(self):
        return f"<tf.Operation '{self.name}' type=NoOp, runs {len(self.inputs)} node(s)>"


def _fetchables(x):
    if isinstance(x, GroupOperation):
        return list(x.inputs)
    if isinstance(x, Node):
        return [x.output]
    if isinstance(x, _CoreVariable) and getattr(x, "graph", None) is not None:
        return [x.value()]
    if isinstance(x, GraphTensor):
        return [x]
    raise TypeError(f"tf.group takes operations and tensors, not {type(x).__name__}")


def group(*inputs, name=None):
    """One operation that, when run, runs all of ``inputs`` (operations, tensors, or lists of them)."""
    tensors = []
    for x in inputs:
        for item in (x if isinstance(x, (list, tuple)) else [x]):
            tensors.extend(t for t in _fetchables(item) if not any(t is u for u in tensors))
    graph = entered_graph() or graph_of(tensors) or get_default_graph()
    for c in graph.current_control_inputs():   # made in a control_dependencies block: runs those too
        if not any(c.output is u for u in tensors):
            tensors.append(c.output)
    for t in tensors:
        if t.graph is not graph:
            raise ValueError(f"tf.group: {t.name} belongs to graph {t.graph.name!r}, not {graph.name!r}")
    name = graph.unique_name(graph.scope_prefix() + (name or "group_deps"))
    op = GroupOperation(graph, tensors, name)
    graph_info(graph).groups[name] = op
    return op


def no_op(name=None):
    """An operation that does nothing."""
    return group(name=name or "NoOp")


def add_to_collection(name, value, graph=None):
    (graph or get_default_graph()).collections.setdefault(name, []).append(value)


def get_collection_ref(key, graph=None):
    return (graph or get_default_graph()).collections.setdefault(key, [])


def get_collection(key, scope=None, graph=None):
    """A copy of the collection ``key`` (only items whose name starts with ``scope``, if given)."""
    items = list((graph or get_default_graph()).collections.get(key, []))
    if scope:
        items = [x for x in items if str(getattr(x, "name", "")).startswith(scope)]
    return items
