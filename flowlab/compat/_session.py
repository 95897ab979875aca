"""``tf.Session``: runs the part of a graph that some fetches need, with values fed in.

``run(fetches, feed_dict)`` turns the fetches (any nesting of lists, tuples, namedtuples and dicts
of tensors, operations, variables and tensor names) into a list of graph tensors, and asks the
executor for a plan that computes them from the fed tensors: only the nodes the fetches need run
(TF1 semantics), in the order they were built. Plans are compiled once per (fetches, feeds) and
kept until the graph changes. Before a plan runs, the session checks that every TF1 variable it
reads has been initialized; after, it marks the variables the plan initialized.

Variables' values: a local session (no target) owns the values of the TF1 variables it runs, as
in TF1: two sessions on one graph each run their own initializer and hold their own values. The
session keeps them in ``_values`` and, around each run that touches variables, puts them into the
variables (a variable it has no value for holds its uninitialized stand-in), runs the plan, and
takes the results back; a lock per graph keeps two threads' sessions from mixing them. Between
runs a variable holds the value of the last local session that ran it with a value (a session
that has none puts back what was there). A cluster session leaves
values where they live, on the cluster's tasks, shared by every session connected to it. A
variable placed on a task is that task's variable of its name (``Variable.shared_name``), shared
with other client processes too: when this process has not initialized it, the session asks the
task whether some client has (``uninitialized_variables``), before it refuses to run.
"""
from __future__ import annotations

import collections.abc
import sys
import threading
import warnings

import numpy as np

from ..core.backends import to_numpy
from ..core.device import RemoteDeviceError, resolve
from ..core.errors import InvalidArgumentError
from ..core.executor import compile_plan
from ..core.graph import Graph as _CoreGraph
from ..core.graph import ASSIGN, GraphTensor, Node
from ..core.tensor import readonly_numpy
from ..core.tensor import Tensor
from ..core.tensor import Variable as _CoreVariable
from ._graphs import GroupOperation, get_default_graph, graph_info
from ._variables import Variable, global_variables, local_variables, uninitialized_error

__all__ = ["Session", "InteractiveSession", "get_default_session", "ConfigProto"]

GROWTH_WARNING = 20   # runs in a row, each after the graph grew: a loop that makes ops


class ConfigProto:
    """Session options: ``log_device_placement`` prints each node's device when a plan is built;
    ``allow_soft_placement`` runs nodes placed on a missing local device on the CPU instead of failing."""

    def __init__(self, log_device_placement=False, allow_soft_placement=False, **options):
        self.log_device_placement = bool(log_device_placement)
        self.allow_soft_placement = bool(allow_soft_placement)
        self.options = options

    def __repr__(self):
        return (f"ConfigProto(log_device_placement={self.log_device_placement}, "
                f"allow_soft_placement={self.allow_soft_placement})")


_local = threading.local()


def _session_stack():
    stack = getattr(_local, "sessions", None)
    if stack is None:
        stack = _local.sessions = []
    return stack


def get_default_session():
    """The session ``Tensor.eval()`` and ``Operation.run()`` use: the innermost ``with sess:`` or
    ``sess.as_default()`` of this thread, or an open InteractiveSession; None if there is none."""
    stack = _session_stack()
    return stack[-1] if stack else None


class _Compiled:
    """A plan with what the session checks around it: variables read before the plan sets them,
    and variables the plan initializes."""

    __slots__ = ("plan", "must_be_initialized", "initializes", "variables")

    def __init__(self, plan):
        self.plan = plan
        checks, sets, set_so_far, variables = [], [], set(), {}
        for node in _user_nodes(plan):
            v = node.attrs.get("variable") if node.attrs else None
            if not isinstance(v, Variable):
                continue
            variables[id(v)] = v
            if node.op is ASSIGN and node.attrs.get("mode") == "set":
                set_so_far.add(id(v))
                sets.append(v)
            elif id(v) not in set_so_far:
                checks.append((v, node))
        self.must_be_initialized, self.initializes = checks, sets
        self.variables = list(variables.values())   # the TF1 variables it reads or changes


class Session:
    """Runs graphs: ``sess.run(fetches, feed_dict)``.

    ``graph``: the graph to run (default: the default graph when the session is made). ``target``:
    where to run: "" or None, this process; a cluster's target (``cluster.target``, i.e.
    ``flowlab://127.0.0.1:PORT``, or ``grpc://host:port`` as TensorFlow material spells it, taken
    as an alias of flowlab's own protocol): the graph is split by task (``tf.device`` strings),
    each cross-task edge becomes a send/recv pair, and every task runs its part at once (see
    ``flowlab/cluster/partition.py``); nodes without a task run on the target's task. A ``with``
    block makes the session the default session and its graph the default graph, and closes it at
    the end.

    >>> import flowlab.compat.v1 as tf
    >>> g = tf.Graph()
    >>> with g.as_default():
    ...     x = tf.placeholder(tf.float32, [None], name="x")
    ...     total = tf.reduce_sum(x * 2.0)
    >>> with tf.Session(graph=g) as sess:
    ...     out = sess.run({"total": total, "x": x}, feed_dict={x: [1.0, 2.0]})
    >>> print(out["total"], out["x"])
    6.0 [1. 2.]
    """

    def __init__(self, target="", graph=None, config=None):
        self._remote = None
        if target not in (None, ""):
            if not isinstance(target, str):
                raise TypeError(f"Session(target) takes an address string such as cluster.target, not "
                                f"{type(target).__name__}")
            from ..cluster.partition import connect
            self._remote = connect(target)
        self.target = target or ""
        graph = graph if graph is not None else get_default_graph()
        if not isinstance(graph, _CoreGraph):
            raise TypeError(f"Session(graph=...) takes a tf.Graph, not {type(graph).__name__}")
        self.graph = graph
        self.config = config or ConfigProto()
        self._plans: dict = {}        # (fetched nodes, fed nodes) -> _Compiled, for graph version _plans_version
        self._plans_version = None
        self._reads: dict = {}        # plain fl.Variables fetched: one read node each
        self._closed = False
        self._entered: list = []
        self.plans_compiled = 0       # how many plans this session built (a steady loop builds none)
        self._seen_version = None
        self._growth = 0              # runs in a row that found the graph changed
        self._warned = False
        self._values: dict = {}       # a local session's TF1 variables -> their values in this session

    # -- the default session ----------------------------------------------------------------------
    def as_default(self):
        """A ``with`` block in which this is the default session (it stays open afterwards)."""
        return _AsDefault(self)

    def __enter__(self):
        graph_scope = self.graph.as_default()
        graph_scope.__enter__()
        _session_stack().append(self)
        self._entered.append(graph_scope)
        return self

    def __exit__(self, *exc):
        stack = _session_stack()
        if stack and stack[-1] is self:
            stack.pop()
        self._entered.pop().__exit__(*exc)
        self.close()
        return False

    def close(self):
        """Release the session's plans; running it afterwards is an error."""
        self._closed = True
        self._plans.clear()
        self._values.clear()
        if self._remote is not None:
            self._remote.close()

    # -- running ----------------------------------------------------------------------------------
    def run(self, fetches, feed_dict=None, options=None, run_metadata=None):
        """The values of ``fetches`` (numpy arrays and scalars, in the same structure; None for an
        operation), computing only what they need, with ``feed_dict`` {tensor: value} standing in
        for those tensors (placeholders or any other)."""
        if self._closed:
            raise RuntimeError("Attempted to use a closed Session.")
        if fetches.__class__ is UninitializedReport:
            return fetches.evaluate(self)
        self._watch_growth()
        targets: list = []
        template = self._structure(fetches, targets)
        feeds, arrays = self._feeds(feed_dict)
        if targets:
            compiled = self._compiled(targets, feeds)
            if compiled.variables and self._remote is None:
                with graph_info(self.graph).lock:
                    before = self._swap_in(compiled.variables)
                    try:
                        values = self._run(compiled, targets, arrays)
                    finally:
                        self._swap_out(compiled.variables, before)
            else:
                values = self._run(compiled, targets, arrays)
        else:
            values = ()
        return _rebuild(template, values)

    def _run(self, compiled, targets, arrays):
        for variable, node in compiled.must_be_initialized:
            if not variable._initialized and (self._remote is None or self._uninitialized([variable])):
                raise uninitialized_error(variable, f"needed by {_names(targets)} in this session", node)
        values = compiled.plan(*arrays)
        for variable in compiled.initializes:
            variable._initialized = True
        return values

    def _swap_in(self, variables):
        """Give each variable this session's value (or its stand-in: not initialized here); returns
        what they held."""
        own, before = self._values, []
        for v in variables:
            before.append((v._value, v._initialized))
            value = own.get(v)
            if value is None:
                v._value, v._initialized = v._stand_in, False
            else:
                v._value, v._initialized = value, True
        return before

    def _swap_out(self, variables, before):
        """Keep the values this run left; a variable this session has not initialized gets back
        what it held (another session's value, a cluster session's mark)."""
        own = self._values
        for v, (value, initialized) in zip(variables, before):
            if v._initialized:
                own[v] = v._value
            else:
                v._value, v._initialized = value, initialized

    def uninitialized_variables(self, var_list=None) -> list:
        """The variables of ``var_list`` (default: the graph's global and local variables) that have
        no value in this session yet. For a variable placed on a cluster task, that is whether any
        client has initialized it there (other worker processes included)."""
        if var_list is None:
            with self.graph.as_default():
                var_list = global_variables() + local_variables()
        return self._uninitialized(list(var_list))

    def _uninitialized(self, variables) -> list:
        if self._remote is None:
            return [v for v in variables if self._values.get(v) is None]
        missing, ask = [], {}
        for v in variables:
            if v._initialized:
                continue
            if v.shared_name is None:
                missing.append(v)
            else:
                from ..cluster.task_exec import owner_of
                ask.setdefault(owner_of(v._device), []).append(v)
        from ..cluster.task_exec import SHARED
        for task, vs in ask.items():
            uids = [SHARED + v.shared_name for v in vs]
            self._remote.ensure([task])
            reply = self._remote.client.request(task, "variables", {"uids": uids}, timeout=30.0)
            not_yet = set(reply.body["uninitialized"])
            for v, uid in zip(vs, uids):
                if uid in not_yet:
                    missing.append(v)
                else:
                    v._initialized = True    # some client initialized it there: it stays initialized
        return missing

    def variable_value(self, variable):
        """``variable``'s value in this session (a read-only array), without running anything;
        FailedPreconditionError if this session has not initialized it."""
        if self._remote is not None:
            return self.run(variable)
        value = self._values.get(variable)
        if value is None:
            raise uninitialized_error(variable, "in this session")
        return readonly_numpy(value)

    def _set_variable(self, variable, value):
        """Set ``variable``'s value in this session (``Variable.load``)."""
        if self._remote is None:
            with graph_info(self.graph).lock:
                self._values[variable] = value
        variable._value, variable._initialized = value, True

    def _structure(self, fetch, targets):
        """The fetch structure with each leaf replaced by its index in ``targets`` (which it fills),
        or by _OP for an operation (no value)."""
        cls = type(fetch)
        if cls is list:
            return [self._structure(v, targets) for v in fetch]
        if cls is tuple:
            return tuple([self._structure(v, targets) for v in fetch])
        if cls is dict:
            return {k: self._structure(v, targets) for k, v in fetch.items()}
        if isinstance(fetch, GraphTensor) and fetch.graph is self.graph:   # the common leaf, quickly
            targets.append(fetch)
            return len(targets) - 1
        if isinstance(fetch, tuple) and hasattr(fetch, "_fields"):
            return cls(*(self._structure(v, targets) for v in fetch))
        if isinstance(fetch, (list, tuple)):
            return cls(self._structure(v, targets) for v in fetch)
        if isinstance(fetch, collections.abc.Mapping):
            return cls((k, self._structure(v, targets)) for k, v in fetch.items())
        kind, tensors = self._fetch_target(fetch)
        targets.extend(tensors)
        return _OP if kind == "op" else len(targets) - 1

    def _fetch_target(self, fetch):
        """('value', [tensor]) for something with a value; ('op', tensors to run) for an operation."""
        if isinstance(fetch, str):
            fetch = _by_name(self.graph, fetch)
        if isinstance(fetch, GroupOperation):
            self._check_graph(fetch.graph, fetch.name)
            return "op", fetch.inputs
        kind, tensor = self._fetch_one(fetch)
        return kind, [tensor]

    def _fetch_one(self, fetch):
        graph = self.graph
        if isinstance(fetch, Node):
            self._check_graph(fetch.graph, fetch.name)
            return "op", fetch.output
        if isinstance(fetch, Variable) and fetch.graph is graph:
            return "value", fetch.value()
        if isinstance(fetch, GraphTensor):
            self._check_graph(fetch.graph, fetch.name)
            return "value", fetch
        if isinstance(fetch, _CoreVariable):
            if isinstance(fetch, Variable):
                self._check_graph(fetch.graph, fetch.name)
            read = self._reads.get(id(fetch))
            if read is None:
                read = self._reads[id(fetch)] = (graph.read(fetch), fetch)
            return "value", read[0]
        if isinstance(fetch, Tensor):
            return "value", graph.constant(fetch)
        raise TypeError(f"cannot fetch {fetch!r} ({type(fetch).__name__}): fetch tensors, operations, variables, "
                        "tensor names such as 'x:0', or lists, tuples and dicts of them")

    def _check_graph(self, graph, name):
        if graph is not self.graph:
            raise ValueError(f"{name} is not an element of this session's graph ({self.graph.name!r}; it belongs "
                             f"to {graph.name!r}): make the session with tf.Session(graph=...) or build the "
                             "tensor inside `with graph.as_default():`")

    def _feeds(self, feed_dict):
        if not feed_dict:
            return (), ()
        graph, pairs = self.graph, []
        for key, value in feed_dict.items():
            if not (isinstance(key, GraphTensor) and key.graph is graph):
                key = self._feed_key(key)
            pairs.append((key, _feed_value(graph, key, value)))
        if len(pairs) > 1:
            pairs.sort(key=_node_index)   # one plan per set of fed tensors, whatever the dict order
        feeds, arrays = zip(*pairs)
        return feeds, arrays

    def _feed_key(self, key):
        if isinstance(key, str):
            key = _by_name(self.graph, key)
        if isinstance(key, _CoreVariable):
            raise TypeError(f"cannot feed the variable {key.name}: feed placeholders or other tensors; to set a "
                            "variable, run v.assign(value) or call v.load(value, sess)")
        if isinstance(key, GroupOperation):
            raise TypeError(f"cannot feed the operation {key.name}: it has no value")
        if isinstance(key, Node):
            key = key.output
        if not isinstance(key, GraphTensor):
            raise TypeError(f"feed_dict keys must be graph tensors or their names, not {type(key).__name__}")
        self._check_graph(key.graph, key.name)
        return key

    def _watch_growth(self):
        version = self.graph.version
        self._growth = self._growth + 1 if version != self._seen_version else 0
        self._seen_version = version
        if self._growth >= GROWTH_WARNING and not self._warned:
            self._warned = True
            warnings.warn(f"the graph grew before each of the last {self._growth} runs, so each run compiled a new "
                          "plan and the graph keeps getting bigger: if a loop is making ops (tf.* calls, `x + 1`, "
                          "optimizer.minimize), build them once before it (graph.finalize() catches this)",
                          stacklevel=3)

    def _compiled(self, targets, feeds):
        if self._plans_version != self.graph.version:
            self._plans.clear()   # the graph changed: every plan is stale
            self._plans_version = self.graph.version
        key = (tuple(id(t.node) for t in targets), tuple(id(t.node) for t in feeds))
        entry = self._plans.get(key)
        if entry is not None:
            return entry
        if self._remote is not None:   # split across the cluster's tasks (it checks placements itself)
            plan = self._remote.plan(self.graph, targets, feeds, self.config.allow_soft_placement)
            self._log_partitions(plan)
            entry = self._plans[key] = _Compiled(plan)
            self.plans_compiled += 1
            return entry
        plan = compile_plan(self.graph, targets, feeds, run_stateful=False)
        self._check_placement(plan)
        entry = self._plans[key] = _Compiled(plan)
        self.plans_compiled += 1
        return entry

    def _check_placement(self, plan):
        soft, log = self.config.allow_soft_placement, self.config.log_device_placement
        for node in _user_nodes(plan):
            device = node.device
            if device is not None:
                try:
                    device = resolve(device)
                except RemoteDeviceError as e:
                    raise RemoteDeviceError(f"node {node.name} (made at {node.source}) is placed on another job "
                                            f"or task, and this session runs in this process only: {e}") from None
                except InvalidArgumentError as e:
                    if not soft:
                        raise InvalidArgumentError(f"node {node.name} (made at {node.source}): {e} (or make the "
                                                   "session with config=tf.ConfigProto(allow_soft_placement=True))",
                                                   op=node.op.name, source=node.source) from None
                    device = None
            if log:
                print(f"{node.name}: ({node.op.name}): {device or '/job:localhost/replica:0/task:0/device:CPU:0'}",
                      file=sys.stderr)

    def _log_partitions(self, plan):
        if self.config.log_device_placement:
            from ..cluster.partition import task_of
            for node in plan.nodes:
                task, dev = task_of(node, self._remote.master)
                print(f"{node.name}: ({node.op.name}): {task}{dev}", file=sys.stderr)

    def partitions(self, fetches, feed_dict=None) -> dict:
        """{task: [node names]}: how a distributed session splits the graph to compute ``fetches``
        (receives from other tasks shown as ``recv NAME from TASK``); {} in a local session."""
        if self._remote is None:
            return {}
        targets: list = []
        self._structure(fetches, targets)
        feeds, _ = self._feeds(feed_dict)
        return dict(self._compiled(targets, feeds).plan.partitions)

    def __repr__(self):
        where = f" at {self.target}" if self.target else ""
        return f"<tf.Session{where} on {self.graph!r}{' (closed)' if self._closed else ''}>"


class UninitializedReport:
    """What ``tf.report_uninitialized_variables()`` returns: ``sess.run`` of it gives the names of
    the variables that have no value yet (a numpy array of bytes, as TensorFlow's)."""

    def __init__(self, var_list, graph):
        self.var_list, self.graph = var_list, graph

    def evaluate(self, session) -> np.ndarray:
        var_list = self.var_list
        if var_list is None:
            with self.graph.as_default():
                var_list = global_variables() + local_variables()
        names = [v._name.encode() for v in session.uninitialized_variables(var_list)]
        return np.array(names, dtype=object if not names else None)

    def __repr__(self):
        return "<tf.report_uninitialized_variables()>"


class InteractiveSession(Session):
    """A session that makes itself the default session until ``close()``, for notebooks and shells:
    ``t.eval()`` and ``op.run()`` work without a ``with`` block. (Unlike TF1, it does not make its
    graph the default: TF1 functions build in the default graph anyway, and flowlab's own eager
    ops keep running eagerly.)"""

    def __init__(self, target="", graph=None, config=None):
        super().__init__(target, graph, config)
        _session_stack().append(self)

    def close(self):
        stack = _session_stack()
        if self in stack:
            stack.remove(self)
        super().close()


class _AsDefault:
    def __init__(self, session):
        self.session = session

    def __enter__(self):
        _session_stack().append(self.session)
        return self.session

    def __exit__(self, *exc):
        stack = _session_stack()
        if stack and stack[-1] is self.session:
            stack.pop()
        return False


# -- helpers ------------------------------------------------------------------------------------------
def _user_nodes(plan):
    """The graph's own nodes a plan runs (the passes may have replaced them by optimized copies)."""
    return getattr(plan, "traced_nodes", plan.nodes)


_OP = object()   # the place of an operation in a fetch structure: its value is None


def _node_index(pair):
    return pair[0].node.index


def _rebuild(template, values):
    cls = type(template)
    if cls is int:
        return _result(values[template])
    if template is _OP:
        return None
    if cls is list:
        return [_rebuild(v, values) for v in template]
    if cls is tuple:
        return tuple([_rebuild(v, values) for v in template])
    if cls is dict:
        return {k: _rebuild(v, values) for k, v in template.items()}
    if isinstance(template, tuple) and hasattr(template, "_fields"):
        return cls(*(_rebuild(v, values) for v in template))
    if isinstance(template, collections.abc.Mapping):
        return cls((k, _rebuild(v, values)) for k, v in template.items())
    return cls(_rebuild(v, values) for v in template)


def _result(value):
    """A fetched value as TF1 gives it: a numpy scalar for 0-d, else a read-only array."""
    return readonly_numpy(value)


def _names(targets):
    return ", ".join(t.name for t in targets[:3]) + (" ..." if len(targets) > 3 else "")


def _by_name(graph, name):
    """'x:0' is the tensor x; 'x' is the operation x (as in TF1)."""
    if ":" in name:
        base, index = name.rsplit(":", 1)
        if index != "0":
            raise ValueError(f"{name!r}: flowlab ops have one output, {base}:0")
        return graph.get_tensor_by_name(name)
    for node in graph.nodes:
        if node.name == name:
            return node
    if name in graph_info(graph).groups:
        return graph_info(graph).groups[name]
    raise KeyError(f"graph {graph.name!r} has no operation named {name!r}")


def _feed_value(graph, tensor, value):
    """``value`` as an array of ``tensor``'s dtype, checked against its shape (a copy: the graph keeps it)."""
    want = tensor._dtype
    if type(value) is np.ndarray and value.dtype == want:
        array = value
    else:
        array = _converted(tensor, value, want)
    shape = tensor._shape    # None: unknown rank, any shape fits
    fits = shape is None or array.ndim == len(shape)
    if fits and shape is not None:
        for d, a in zip(shape, array.shape):
            if d is not None and d != a:
                fits = False
    if not fits:
        declared = "[" + ", ".join("None" if d is None else str(d) for d in shape) + "]"
        raise ValueError(f"cannot feed a value of shape {tuple(array.shape)} to {tensor.name}, which has shape "
                         f"{declared} (None: any size there); feed a value of that shape, or declare the "
                         "placeholder with None where sizes vary (no shape at all: any rank)")
    return array.copy() if array.dtype == want else array.astype(want)


def _converted(tensor, value, want):
    if isinstance(value, GraphTensor):
        raise TypeError(f"the value fed to {tensor.name} is a graph tensor ({value.name}); feed numbers, lists or "
                        "numpy arrays (run the tensor first to get its value)")
    if isinstance(value, Tensor):
        value = to_numpy(value._value)
    try:
        array = np.asarray(value)
    except (ValueError, TypeError) as e:
        raise TypeError(f"cannot feed {value!r} to {tensor.name}: {e}") from None
    if array.dtype.kind not in "biuf":
        raise TypeError(f"cannot feed {type(value).__name__} of {array.dtype} to {tensor.name} "
                        f"({want.name}): feed numbers")
    if want.kind in "iub" and array.dtype.kind == "f" and array.size and not np.all(np.mod(array, 1) == 0):
        raise TypeError(f"cannot feed {array.dtype} values with fractions to {tensor.name}, which is {want.name}; "
                        "round or cast them first")
    return array
