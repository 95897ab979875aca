"""``tf.train``: TF1 optimizers, which add their update to the graph as an operation to run.

``minimize(loss)`` is ``compute_gradients`` (``tf.gradients`` for every trainable variable) then
``apply_gradients``, which adds the update nodes and returns one operation grouping them: each
``sess.run(train_op)`` is one step. ``GradientDescentOptimizer`` writes its update as plain graph
ops, ``var.assign_sub(learning_rate * grad)``, so ``g.pretty()`` shows it (and the learning rate
may be a tensor). The other optimizers run flowlab's own update rules (``fl.optimizers``) as
nodes; their state (momentum, Adam's moments) lives in the optimizer and needs no initializer.
"""
from __future__ import annotations

from ..core.dtypes import int64
from ..core.execute import execute, get_op
from ..core.graph import GraphTensor
from ..core.tensor import Tensor
from ..core.tensor import Variable as _CoreVariable
from ..nn import optimizers as _optimizers
from ._graphs import GraphKeys, building, entered_graph, get_collection, get_default_graph, group
from ._gradients import gradients
from ._monitored import (MonitoredSession, MonitoredTrainingSession, SessionManager, SessionRunArgs,  # noqa: F401
                         SessionRunContext, SessionRunHook, SessionRunValues, StopAtStepHook)
from ._coordinator import Coordinator  # noqa: F401
from ._saver import Saver, latest_checkpoint  # noqa: F401
from ._supervisor import Supervisor  # noqa: F401
from ._variables import Variable

__all__ = ["Optimizer", "GradientDescentOptimizer", "MomentumOptimizer", "AdamOptimizer", "AdadeltaOptimizer",
           "AdagradOptimizer", "get_global_step", "get_or_create_global_step", "create_global_step",
           "MonitoredTrainingSession",
           "MonitoredSession", "SessionManager", "SessionRunHook", "SessionRunArgs", "SessionRunContext",
           "SessionRunValues", "StopAtStepHook", "Supervisor", "Saver", "Coordinator", "latest_checkpoint"]


class Optimizer:
    """Base of the TF1 optimizers: ``compute_gradients``, ``apply_gradients``, ``minimize``."""

    def __init__(self, learning_rate, use_locking=False, name="Optimizer"):
        self.learning_rate = learning_rate
        self.name = name

    def compute_gradients(self, loss, var_list=None, **_unused):
        """[(gradient, variable)] for ``var_list`` (default: the trainable variables of the loss's graph)."""
        if not isinstance(loss, GraphTensor):
            raise TypeError(f"{self.name}: loss must be a graph tensor, not {type(loss).__name__} (in TF1 style, "
                            "build the loss from placeholders and variables)")
        if var_list is None:
            var_list = get_collection(GraphKeys.TRAINABLE_VARIABLES, graph=loss.graph)
        var_list = list(var_list)
        if not var_list:
            raise ValueError(f"{self.name}: no variables to optimize (make some with tf.Variable or tf.get_variable)")
        return list(zip(gradients(loss, var_list), var_list))

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        """One operation that updates every variable with its gradient (and adds 1 to ``global_step``)."""
        pairs = list(grads_and_vars)
        live = [(g, v) for g, v in pairs if g is not None]
        if not live:
            raise ValueError(f"{self.name}: no gradients for any of the variables {[v.name for _, v in pairs]}: "
                             "does the loss depend on them through ops that have gradients?")
        graph = entered_graph() or live[0][0].graph
        with building(graph) as graph:
            start = len(graph.nodes)
            self._apply(live)
            if global_step is not None:
                global_step.assign_add(1)
            updates = [n for n in graph.nodes[start:] if n.op.stateful]
            return group(*updates, name=name or self.name)

    def minimize(self, loss, global_step=None, var_list=None, name=None, **_unused):
        """``apply_gradients(compute_gradients(loss, var_list), global_step)``: the training step."""
        return self.apply_gradients(self.compute_gradients(loss, var_list), global_step, name)

    def _apply(self, pairs):
        raise NotImplementedError

    def __repr__(self):
        return f"{type(self).__name__}(learning_rate={self.learning_rate!r})"


class GradientDescentOptimizer(Optimizer):
    """``var -= learning_rate * grad`` for each variable (``learning_rate``: a number or a scalar tensor).

    >>> import flowlab.compat.v1 as tf
    >>> g = tf.Graph()
    >>> with g.as_default():
    ...     w = tf.Variable(3.0)
    ...     step = tf.train.GradientDescentOptimizer(0.25).minimize(w * w)   # d(w^2)/dw = 2w
    ...     init = tf.global_variables_initializer()
    >>> with tf.Session(graph=g) as sess:
    ...     sess.run(init)
    ...     sess.run(step)
    ...     print(sess.run(w))
    1.5
    """

    def __init__(self, learning_rate, use_locking=False, name="GradientDescent"):
        super().__init__(learning_rate, use_locking, name)

    def _apply(self, pairs):
        assign = get_op("assign")
        for grad, var in pairs:
            lr = self.learning_rate
            if isinstance(lr, Tensor) and lr.dtype != var.dtype:
                raise TypeError(f"{self.name}: the learning rate is {lr.dtype.name}, variable {var.name} is "
                                f"{var.dtype.name}; use tf.cast")
            execute(assign, (grad * lr,), {"variable": var, "mode": "sub"})


class _FlowlabOptimizer(Optimizer):
    """A TF1 optimizer running an ``fl.optimizers`` update rule as graph nodes."""

    def __init__(self, learning_rate, name, make):
        if isinstance(learning_rate, Tensor):
            raise TypeError(f"{name}Optimizer takes a Python number as learning_rate in flowlab (a tensor works "
                            "with GradientDescentOptimizer)")
        super().__init__(learning_rate, name=name)
        self._optimizer = make()

    def _apply(self, pairs):
        for _, var in pairs:
            if not isinstance(var, _CoreVariable):
                raise TypeError(f"{self.name}: {var!r} is not a variable")
        self._optimizer.apply_gradients(pairs)


class MomentumOptimizer(_FlowlabOptimizer):
    """``accum = momentum * accum + grad; var -= learning_rate * accum`` (Nesterov's form if asked)."""

    def __init__(self, learning_rate, momentum, use_locking=False, name="Momentum", use_nesterov=False):
        super().__init__(learning_rate, name, lambda: _optimizers.SGD(learning_rate, momentum=momentum,
                                                                      nesterov=use_nesterov, name=name))


class AdamOptimizer(_FlowlabOptimizer):
    """Adam, with TF1's defaults (epsilon 1e-8)."""

    def __init__(self, learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-8, use_locking=False, name="Adam"):
        super().__init__(learning_rate, name, lambda: _optimizers.Adam(learning_rate, beta1, beta2, epsilon, name=name))


class AdadeltaOptimizer(_FlowlabOptimizer):
    def __init__(self, learning_rate=0.001, rho=0.95, epsilon=1e-8, use_locking=False, name="Adadelta"):
        super().__init__(learning_rate, name, lambda: _optimizers.Adadelta(learning_rate, rho, epsilon, name=name))


class AdagradOptimizer(_FlowlabOptimizer):
    """Adagrad, with TF1's form: ``accum += grad**2; var -= learning_rate * grad / sqrt(accum)``."""

    def __init__(self, learning_rate, initial_accumulator_value=0.1, use_locking=False, name="Adagrad"):
        super().__init__(learning_rate, name, lambda: _optimizers.Adagrad(learning_rate, initial_accumulator_value,
                                                                          epsilon=0.0, name=name))


# -- the global step ----------------------------------------------------------------------------
def get_global_step(graph=None):
    """The graph's global step variable, or None."""
    found = get_collection(GraphKeys.GLOBAL_STEP, graph=graph or get_default_graph())
    return found[0] if found else None


def create_global_step(graph=None):
    graph = graph or get_default_graph()
    if get_global_step(graph) is not None:
        raise ValueError("the graph already has a global step")
    with building(graph):
        return Variable(0, trainable=False, name="global_step", dtype=int64,
                        collections=[GraphKeys.GLOBAL_VARIABLES, GraphKeys.GLOBAL_STEP])


def get_or_create_global_step(graph=None):
    """The int64 step counter that ``minimize(loss, global_step=...)`` adds one to at each step."""
    return get_global_step(graph) or create_global_step(graph)


_CLUSTER_NAMES = {"ClusterSpec": "flowlab.cluster.spec", "Server": "flowlab.cluster.server",
                  "replica_device_setter": "flowlab.compat._replica"}


def __getattr__(name):
    """``tf.train.ClusterSpec``, ``tf.train.Server`` and ``tf.train.replica_device_setter``, loaded
    on first use (so ``import flowlab.compat.v1`` does not load the cluster package)."""
    if name in _CLUSTER_NAMES:
        import importlib
        value = getattr(importlib.import_module(_CLUSTER_NAMES[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'flowlab.compat.v1.train' has no attribute {name!r}")
