"""TF1 variables: ``tf.Variable``, ``tf.get_variable`` with variable scopes, initializers.

A TF1 variable belongs to a graph and has no value until an initializer runs in a session. Here
it is a flowlab ``Variable`` whose initial value is a graph tensor: creating it adds two nodes,
``name`` (a read of its value, what ``sess.run(v)`` fetches) and ``name/Assign`` (its
initializer, which sets it to the initial value). Until some session has run the initializer, the
variable holds a read-only stand-in of the right shape and dtype, so graphs can be built on it,
and a session that would read it raises ``FailedPreconditionError`` naming it.

Each local session keeps its own values of the variables (as TF1 does): a new session must run
the initializer again, and two sessions on one graph train separate copies. Sessions connected to
a cluster share the values on its tasks (see ``_session.py``). A variable placed on a task
(``tf.device("/job:ps/task:0")``, ``replica_device_setter``) is that task's variable of its name
(``shared_name``): every client process whose graph has a variable of that name on that task uses
the same storage, as TensorFlow's between-graph replication does; one client initializes it.
"""
from __future__ import annotations

import contextlib
import math
import threading

import numpy as np

from ..core import dtypes as _dtypes
from ..core import random as _random
from ..core.device import current_device_spec, device, resolve
from ..core.errors import OpError
from ..core.execute import execute, get_op
from ..core.graph import GraphTensor
from ..core.ops.variable_ops import checked_value
from ..core.tensor import Tensor
from ..core.tensor import Variable as _CoreVariable
from ..core.tensor import constant as _constant
from ._graphs import (GraphKeys, add_to_collection, building, entered_graph, get_collection, get_default_graph,
                      graph_info, group, operators_in_own_graph)

__all__ = ["Variable", "FailedPreconditionError", "get_variable", "variable_scope", "get_variable_scope",
           "AUTO_REUSE", "global_variables", "trainable_variables", "local_variables",
           "global_variables_initializer", "variables_initializer", "local_variables_initializer",
           "assign", "assign_add", "assign_sub", "zeros_initializer", "ones_initializer", "constant_initializer",
           "random_normal_initializer", "random_uniform_initializer", "truncated_normal_initializer",
           "glorot_uniform_initializer", "glorot_normal_initializer"]


class FailedPreconditionError(OpError):
    """An op needed state that is not ready: most often a variable read before its initializer ran."""


@operators_in_own_graph
class Variable(_CoreVariable):
    """A TF1 variable: part of a graph, uninitialized until its initializer runs.

    ``initial_value`` may be a graph tensor (``tf.random_normal([3, 2])``), a Python or numpy
    value, or a callable returning one. Fetch it with ``sess.run(v)``; change it with ``v.assign``
    (a node, like every TF1 change) or ``v.load(value, sess)`` (now).

    >>> import flowlab.compat.v1 as tf
    >>> g = tf.Graph()
    >>> with g.as_default():
    ...     w = tf.Variable(tf.ones([2]), name="w")
    ...     double = w.assign(w * 2.0)
    >>> with tf.Session(graph=g) as sess:
    ...     sess.run(w.initializer)
    ...     print(sess.run(double), sess.run(w))
    [2. 2.] [2. 2.]
    """

    __slots__ = ("graph", "initializer", "_initial_value", "_snapshot", "_initialized", "_placement", "_stand_in")

    def __init__(self, initial_value=None, trainable=True, collections=None, validate_shape=True,
                 caching_device=None, name=None, variable_def=None, dtype=None, **_unused):
        if initial_value is None:
            raise ValueError("tf.Variable needs an initial_value (a tensor, a value, or a callable returning one)")
        graph = entered_graph() or (initial_value.graph if isinstance(initial_value, GraphTensor) else None) \
            or get_default_graph()
        info = graph_info(graph)
        from ._replica import variable_device
        with variable_device(name) or contextlib.nullcontext():   # a replica setter: the next ps task
            self._build(graph, info, initial_value, trainable, name, dtype)
        keys = [GraphKeys.GLOBAL_VARIABLES] if collections is None else list(collections)
        if trainable and GraphKeys.TRAINABLE_VARIABLES not in keys:
            keys.append(GraphKeys.TRAINABLE_VARIABLES)
        for key in keys:
            add_to_collection(key, self, graph=graph)

    def _build(self, graph, info, initial_value, trainable, name, dtype):
        with building(graph) as graph:
            init = _initial_tensor(graph, initial_value, dtype)
            if init._shape is None or None in init._shape:
                raise ValueError(f"tf.Variable: the initial value has shape {init.shape}; a variable's "
                                 "shape must be fully known (give the initial value a static shape)")
            full = _unique_variable_name(info, _scoped(name or "Variable"))
            stand_in = np.broadcast_to(np.zeros((), init._dtype), init._shape)   # read-only, no memory
            placement = current_device_spec()
            remote = resolve(placement, allow_remote=True) if placement else None
            if remote is not None and remote.startswith("/job:localhost/replica:0/task:0/"):
                remote = None
            with device(None) if remote else contextlib.nullcontext():   # it lives on that task, not here
                super().__init__(stand_in, trainable=trainable, name=full)
            if remote:
                self._device = remote    # ops that read or update it are placed with it
            self._value = self._stand_in = stand_in
            self.graph = graph
            self._initialized = False
            self._initial_value = init
            self._placement = current_device_spec()
            with graph.control_dependencies(None):   # a variable's own nodes wait for nothing (as in TF1)
                self._snapshot = graph.read(self)
                with graph.name_scope(f"{full}/"):
                    out = graph.add_node(get_op("assign"), (init,), {"variable": self, "mode": "set"}, name="Assign")
            self.initializer = out.node

    # -- what it is --------------------------------------------------------------------------------
    @property
    def device(self) -> str:
        return self._placement.to_string()

    @property
    def op(self):
        return self._snapshot.node

    @property
    def shared_name(self):
        """The name the task it is placed on keeps it under: every client process whose graph has a
        variable of this name on that task shares it (TensorFlow's between-graph replication). None
        for a variable of this process (no task given)."""
        d = self._device
        return self._name if isinstance(d, str) and not d.startswith("/job:localhost/") else None

    @property
    def initial_value(self):
        return self._initial_value

    def initialized_value(self):
        """Its value right after initialization: the initializer's output (which runs it)."""
        return self.initializer.output

    def value(self):
        """The graph tensor that reads it (what ``sess.run(v)`` fetches)."""
        return self._snapshot

    def read_value(self):
        """A new node reading its value at that point of the graph."""
        with building(self.graph) as graph:
            return graph.read(self)

    def eval(self, session=None):
        from ._session import get_default_session
        sess = session or get_default_session()
        if sess is None:
            raise ValueError(f"{self.name}.eval() needs a default session: use `with tf.Session() as sess:`")
        return sess.run(self)

    # -- changing it: nodes, as in TF1 --------------------------------------------------------------
    def _update_node(self, value, mode):
        with building(self.graph) as graph:
            if not isinstance(value, Tensor):
                value = graph.constant(_constant(value, dtype=self.dtype))   # Python values take its dtype
            return execute(get_op("assign"), (value,), {"variable": self, "mode": mode})

    def assign(self, value, use_locking=None, name=None, read_value=True):
        """A node that sets the variable when run; its value is the new value."""
        return self._update_node(value, "set")

    def assign_add(self, delta, use_locking=None, name=None, read_value=True):
        return self._update_node(delta, "add")

    def assign_sub(self, delta, use_locking=None, name=None, read_value=True):
        return self._update_node(delta, "sub")

    def load(self, value, session=None):
        """Set the value now, in ``session`` (default: the default session), without a node."""
        from ._session import get_default_session
        sess = session or get_default_session()
        value = np.array(checked_value(self, value, "load"))
        if sess is None:
            raise ValueError(f"{self.name}.load() needs a session: pass session= or call it inside "
                             "`with tf.Session() as sess:`")
        sess._set_variable(self, value)

    # -- eager looks at it -------------------------------------------------------------------------
    def _check_initialized(self, what):
        if not self._initialized:
            raise uninitialized_error(self, what)

    def numpy(self):
        self._check_initialized(".numpy()")
        return super().numpy()

    def __array__(self, dtype=None, copy=None):
        self._check_initialized("converting it to a numpy array")
        return super().__array__(dtype, copy)

    def __repr__(self):
        return f"<tf.Variable '{self.name}' shape={tuple(self.shape)} dtype={self.dtype.name}>"

    def __reduce__(self):
        raise TypeError(f"TF1 variable {self.name} cannot be pickled; pickle sess.run(v) instead")


def uninitialized_error(variable, what, node=None):
    where = node.source if node is not None and node.source else None
    return FailedPreconditionError(
        f"Attempting to use uninitialized value {variable._name} ({what}): run its initializer first, e.g. "
        f"sess.run(tf.global_variables_initializer()) after building the graph"
        + (f"\n  read by node {node.name}, created at {where}" if where else ""),
        op=node.name if node is not None else None, source=where)


def _initial_tensor(graph, value, dtype):
    if callable(value) and not isinstance(value, Tensor):
        value = value()
    want = _dtypes.numpy_dtype(dtype) if dtype is not None else None
    if isinstance(value, GraphTensor):
        if value.graph is not graph:
            raise ValueError(f"tf.Variable: the initial value {value.name} belongs to graph {value.graph.name!r}, "
                             f"the variable to {graph.name!r}")
        if want is not None and value._dtype != want:
            raise TypeError(f"tf.Variable: the initial value is {value.dtype.name}, but dtype={_dtypes.as_dtype(want).name}"
                            "; use tf.cast on the initial value")
        return value
    if isinstance(value, _CoreVariable):
        raise TypeError("tf.Variable: use another variable's initialized_value() (or a tensor computed from "
                        "it) as the initial value, not the variable itself")
    return graph.constant(_constant(value, dtype=want))


def _unique_variable_name(info, name):
    base, n, full = name, 0, name
    while full in info.variable_names:
        n += 1
        full = f"{base}_{n}"
    info.variable_names.add(full)
    return full


# -- variable scopes and get_variable ----------------------------------------------------------------
class _ReuseAuto:
    def __repr__(self):
        return "tf.AUTO_REUSE"


AUTO_REUSE = _ReuseAuto()
_var_scopes = threading.local()


class VariableScope:
    """Where get_variable looks: a name prefix, whether variables are reused, a default initializer."""

    def __init__(self, name="", reuse=None, initializer=None):
        self.name, self.reuse, self.initializer = name, reuse, initializer

    @property
    def original_name_scope(self):
        return f"{self.name}/" if self.name else ""

    def reuse_variables(self):
        self.reuse = True

    def __repr__(self):
        return f"<tf.VariableScope {self.name!r} reuse={self.reuse!r}>"


def _scope_stack():
    stack = getattr(_var_scopes, "stack", None)
    if stack is None:
        stack = _var_scopes.stack = [VariableScope()]
    return stack


def get_variable_scope() -> VariableScope:
    return _scope_stack()[-1]


def _scoped(name):
    from ._graphs import scope_prefix
    return scope_prefix() + name


@contextlib.contextmanager
def variable_scope(name_or_scope, default_name=None, values=None, initializer=None, reuse=None, **_unused):
    """Prefix get_variable names with ``name/`` (and node names too); ``reuse=True`` returns existing
    variables (and refuses to make new ones), ``reuse=tf.AUTO_REUSE`` makes them once then reuses."""
    from ._graphs import name_scope
    outer = get_variable_scope()
    if isinstance(name_or_scope, VariableScope):
        name = name_or_scope.name
        reuse = name_or_scope.reuse if reuse is None else reuse
    else:
        name = name_or_scope or default_name
        name = f"{outer.name}/{name}" if outer.name and name else (name or outer.name)
    if reuse is None or reuse is False:
        reuse = outer.reuse if outer.reuse in (True, AUTO_REUSE) else reuse   # inner scopes inherit reuse
    scope = VariableScope(name, reuse, initializer if initializer is not None else outer.initializer)
    stack = _scope_stack()
    stack.append(scope)
    try:
        leaf = name.rsplit("/", 1)[-1] if name else None
        with name_scope(leaf):
            yield scope
    finally:
        stack.pop()


def get_variable(name, shape=None, dtype=None, initializer=None, regularizer=None, trainable=True,
                 collections=None, **_unused):
    """The variable ``scope/name``: made (with ``initializer``) if the scope does not reuse, found if it does.

    ``initializer``: an initializer (``tf.zeros_initializer()``...), a callable ``(shape, dtype)``,
    or a value/tensor (then ``shape`` is its shape). Default: Glorot-uniform for floats, zeros otherwise.
    """
    scope = get_variable_scope()
    full = f"{scope.name}/{name}" if scope.name else name
    graph = get_default_graph()
    store = graph_info(graph).store
    found = store.get(full)
    if found is not None:
        if scope.reuse is None or scope.reuse is False:
            raise ValueError(f"Variable {full} already exists; to use it again, open its scope with "
                             f"tf.variable_scope(..., reuse=True) (or reuse=tf.AUTO_REUSE)")
        if shape is not None and tuple(shape) != tuple(found.shape):
            raise ValueError(f"Variable {full} has shape {tuple(found.shape)}, but get_variable asked for "
                             f"{tuple(shape)}")
        if dtype is not None and _dtypes.as_dtype(dtype) != found.dtype:
            raise ValueError(f"Variable {full} is {found.dtype.name}, but get_variable asked for "
                             f"{_dtypes.as_dtype(dtype).name}")
        return found
    if scope.reuse is True:
        raise ValueError(f"Variable {full} does not exist, or was not made by tf.get_variable; reuse=True "
                         f"only finds existing variables (use reuse=tf.AUTO_REUSE to make it if missing)")
    if full in graph_info(graph).variable_names:
        raise ValueError(f"a tf.Variable named {full} already exists in this graph; pick another name")
    initializer = initializer if initializer is not None else scope.initializer
    dtype = _dtypes.as_dtype(dtype or (initializer.dtype if isinstance(initializer, Tensor) else _dtypes.float32))
    if isinstance(initializer, (Tensor, np.ndarray, list, float, int)) and not callable(initializer):
        value = initializer
    else:
        if shape is None:
            raise ValueError(f"get_variable({full!r}) needs a shape when the initializer is not a value")
        shape = tuple(int(d) for d in shape)
        if initializer is None:
            initializer = glorot_uniform_initializer() if dtype.is_floating else zeros_initializer()
        value = lambda: initializer(shape, dtype=dtype)   # noqa: E731 - called inside the graph
    with building(graph):
        with graph.name_scope(None):   # get_variable names are the variable scope's, not the name scope's
            v = Variable(value, trainable=trainable, collections=collections, name=full,
                         dtype=dtype if not isinstance(value, GraphTensor) else None)
    if shape is not None and tuple(v.shape) != tuple(shape):
        raise ValueError(f"get_variable({full!r}): the initializer gave shape {tuple(v.shape)}, not {tuple(shape)}")
    store[full] = v
    return v


# -- collections of variables and their initializers ------------------------------------------------
def global_variables(scope=None):
    return get_collection(GraphKeys.GLOBAL_VARIABLES, scope)


def trainable_variables(scope=None):
    return get_collection(GraphKeys.TRAINABLE_VARIABLES, scope)


def local_variables(scope=None):
    return get_collection(GraphKeys.LOCAL_VARIABLES, scope)


def variables_initializer(var_list, name="init"):
    """One operation that runs the initializers of ``var_list``."""
    return group(*[v.initializer for v in var_list], name=name)


def global_variables_initializer():
    """One operation that initializes every variable made so far in the default graph. Make it
    after the whole model (optimizer included): variables made later are not in it."""
    return variables_initializer(global_variables())


def local_variables_initializer():
    return variables_initializer(local_variables(), name="init_local")


def initialize_all_variables():
    return global_variables_initializer()


def assign(ref, value, validate_shape=None, use_locking=None, name=None):
    return ref.assign(value)


def assign_add(ref, value, use_locking=None, name=None):
    return ref.assign_add(value)


def assign_sub(ref, value, use_locking=None, name=None):
    return ref.assign_sub(value)


# -- initializers: callables (shape, dtype) -> a graph tensor --------------------------------------
class _Initializer:
    def __init__(self, dtype=_dtypes.float32):
        self.dtype = _dtypes.as_dtype(dtype)

    def _dtype(self, dtype):
        return _dtypes.as_dtype(dtype) if dtype is not None else self.dtype


class zeros_initializer(_Initializer):  # noqa: N801 - TF1's name
    def __call__(self, shape, dtype=None, partition_info=None):
        return _constant(np.zeros(shape, self._dtype(dtype).as_numpy_dtype))


class ones_initializer(_Initializer):  # noqa: N801 - TF1's name
    def __call__(self, shape, dtype=None, partition_info=None):
        return _constant(np.ones(shape, self._dtype(dtype).as_numpy_dtype))


class constant_initializer(_Initializer):  # noqa: N801 - TF1's name
    """Every element ``value`` (a number), or the elements of ``value`` (a list of the right size)."""

    def __init__(self, value=0, dtype=_dtypes.float32):
        super().__init__(dtype)
        self.value = value

    def __call__(self, shape, dtype=None, partition_info=None):
        value = np.asarray(self.value, self._dtype(dtype).as_numpy_dtype)
        if value.size == 1:
            return _constant(np.full(shape, value.reshape(()), value.dtype))
        if value.size != int(np.prod(shape)):
            raise ValueError(f"constant_initializer: {value.size} values cannot fill shape {tuple(shape)}")
        return _constant(value.reshape(shape))


class random_normal_initializer(_Initializer):  # noqa: N801 - TF1's name
    def __init__(self, mean=0.0, stddev=1.0, seed=None, dtype=_dtypes.float32):
        super().__init__(dtype)
        self.mean, self.stddev, self.seed = mean, stddev, seed

    def __call__(self, shape, dtype=None, partition_info=None):
        return _random.normal(shape, self.mean, self.stddev, self._dtype(dtype), self.seed)


class truncated_normal_initializer(random_normal_initializer):  # noqa: N801 - TF1's name
    def __call__(self, shape, dtype=None, partition_info=None):
        return _random.truncated_normal(shape, self.mean, self.stddev, self._dtype(dtype), self.seed)


class random_uniform_initializer(_Initializer):  # noqa: N801 - TF1's name
    def __init__(self, minval=0.0, maxval=None, seed=None, dtype=_dtypes.float32):
        super().__init__(dtype)
        self.minval, self.maxval, self.seed = minval, maxval, seed

    def __call__(self, shape, dtype=None, partition_info=None):
        return _random.uniform(shape, self.minval, self.maxval, self._dtype(dtype), self.seed)


def _fans(shape):
    if len(shape) < 1:
        return 1, 1
    if len(shape) == 1:
        return shape[0], shape[0]
    receptive = int(np.prod(shape[:-2])) if len(shape) > 2 else 1
    return shape[-2] * receptive, shape[-1] * receptive


class glorot_uniform_initializer(_Initializer):  # noqa: N801 - TF1's name
    """Uniform in [-limit, limit], limit = sqrt(6 / (fan_in + fan_out)): get_variable's default."""

    def __init__(self, seed=None, dtype=_dtypes.float32):
        super().__init__(dtype)
        self.seed = seed

    def __call__(self, shape, dtype=None, partition_info=None):
        fan_in, fan_out = _fans(tuple(shape))
        limit = math.sqrt(6.0 / max(1, fan_in + fan_out))
        return _random.uniform(shape, -limit, limit, self._dtype(dtype), self.seed)


class glorot_normal_initializer(glorot_uniform_initializer):  # noqa: N801 - TF1's name
    def __call__(self, shape, dtype=None, partition_info=None):
        fan_in, fan_out = _fans(tuple(shape))
        stddev = math.sqrt(2.0 / max(1, fan_in + fan_out))
        return _random.truncated_normal(shape, 0.0, stddev / 0.8796256610342398, self._dtype(dtype), self.seed)
