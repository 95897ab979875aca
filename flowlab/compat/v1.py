"""TF1-style graphs and sessions: ``import flowlab.compat.v1 as tf`` runs TensorFlow 1 code.

Every ``tf.*`` function here builds graph nodes (in the graph of its inputs, else the default
graph) instead of computing; a ``Session`` computes them::

    import numpy as np
    import flowlab.compat.v1 as tf

    x = tf.placeholder(tf.float32, [None, 3])
    w = tf.Variable(tf.random_normal([3, 1]))
    loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - 1.0))
    step = tf.train.GradientDescentOptimizer(0.1).minimize(loss)
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        for _ in range(100):
            sess.run(step, feed_dict={x: np.ones((4, 3))})

The pieces: graphs, names and collections (``_graphs.py``), variables, scopes and initializers
(``_variables.py``), sessions (``_session.py``), ``tf.gradients`` (``_gradients.py``), optimizers
(``v1_train.py``). The ops are flowlab's own op table (``flowlab/core/ops``), under TF1's names.

Where flowlab differs from TF1 (each explained where it is defined):

- ``tf.placeholder(dtype)`` without a shape has an unknown rank, as in TF1 (any value can be fed).
- As in TF1, each local ``Session()`` holds its own values of the variables (run the initializer in
  each); sessions on a cluster's target share the values on its tasks. The optimizer state of
  ``MomentumOptimizer``/``AdamOptimizer`` (slots) is shared by the sessions of a process.
- ``Session(cluster.target)`` runs a graph on a cluster's tasks (``grpc://host:port`` is accepted as
  another spelling of flowlab's own address); a ``Session()`` with no target runs it in this process
  only, and refuses nodes placed on other jobs or tasks. A variable placed on a task (e.g. by
  ``tf.train.replica_device_setter``) lives on that task when a cluster session runs it, under its
  name: every worker process whose graph has it shares it (between-graph replication); the chief
  initializes it and ``tf.train.MonitoredTrainingSession(is_chief=False)`` or
  ``tf.train.Supervisor(is_chief=False)`` waits for that.
- ``tf.train.Saver`` and ``Supervisor(logdir=...)`` write flowlab's checkpoint files
  (``<prefix>.npz``), not TensorFlow's; the Supervisor saves between steps of the training loop
  (in ``sv.should_stop()``) rather than from a thread, and once more at ``sv.stop()``.
- Values fetched by ``sess.run`` are read-only arrays (copy one with ``np.array(value)`` to write).
- ``tf.control_dependencies`` works as in TF1 (a fetch runs the control inputs of what it needs,
  first); more simply, nodes always run in the order they were built.
"""
from __future__ import annotations

import builtins
import types

import numpy as np

from ..core import ops as _ops
from ..core import random as _random
from ..core.device import DeviceSpec  # noqa: F401
from ._replica import device  # noqa: F401 - device strings, and replica_device_setter
from ..core.dtypes import (DType, as_dtype, bool_, float16, float32, float64, int8, int16, int32,  # noqa: F401
                           int64, numpy_dtype, uint8)
from ..core.errors import InvalidArgumentError, OpError
from ..core.graph import GraphTensor
from ..core.shape import TensorShape  # noqa: F401
from ..core.tensor import Tensor  # noqa: F401
from ..core.tensor import constant as _eager_constant
from . import v1_train as train  # noqa: F401
from ._gradients import gradients  # noqa: F401
from ._coordinator import OutOfRangeError
from ._monitored import DeadlineExceededError, report_uninitialized_variables  # noqa: F401
from ._graphs import (Graph, GraphKeys, GroupOperation, Operation, add_to_collection,  # noqa: F401
                      control_dependencies, get_collection, get_collection_ref, get_default_graph, graph_function,
                      graph_info, group, name_scope, no_op,
                      reset_default_graph)
from ._session import ConfigProto, InteractiveSession, Session, get_default_session  # noqa: F401
from ._variables import (AUTO_REUSE, FailedPreconditionError, Variable, VariableScope, assign,  # noqa: F401
                         assign_add, assign_sub, constant_initializer, get_variable, get_variable_scope,
                         global_variables, global_variables_initializer, glorot_normal_initializer,
                         glorot_uniform_initializer, initialize_all_variables, local_variables,
                         local_variables_initializer, ones_initializer, random_normal_initializer,
                         random_uniform_initializer, trainable_variables, truncated_normal_initializer,
                         variable_scope, variables_initializer, zeros_initializer)

bool = bool_  # noqa: A001 - ``tf.bool``; this module calls builtins.bool for Python's


def _namespace(name, doc, **members):
    module = types.ModuleType(f"{__name__}.{name}", doc)
    module.__dict__.update(members)
    return module


# -- the op table under TF1's names: each call builds a node ----------------------------------------
for _name in _ops.__all__:
    globals()[_name] = graph_function(getattr(_ops, _name))


def placeholder(dtype, shape=None, name=None):
    """A graph input of ``dtype`` and ``shape`` that each ``sess.run`` must feed.

    ``shape``: a list with None for dimensions of any size (``[None, 784]``), or an int for a
    vector. Without a shape (or ``shape=None``) its rank is unknown too, as in TF1: any value can
    be fed, and the ops built on it learn their shapes when the session runs.
    """
    if isinstance(shape, (int, np.integer)):
        shape = (int(shape),)
    return get_default_graph().placeholder(dtype, TensorShape(shape), name=name or "Placeholder")


def constant(value, dtype=None, shape=None, name=None, verify_shape=False):
    """A value baked into the graph (optionally cast to ``dtype`` and broadcast to ``shape``)."""
    graph = get_default_graph()
    with graph.as_default():   # the value belongs to a graph node, which the device scope places
        value = _eager_constant(value, dtype=dtype, shape=shape)
    return graph.constant(value, name=name)


cast = graph_function(_ops.cast)
to_float = graph_function(lambda x: _ops.cast(x, float32), "to_float")
to_double = graph_function(lambda x: _ops.cast(x, float64), "to_double")
to_int32 = graph_function(lambda x: _ops.cast(x, int32), "to_int32")
to_int64 = graph_function(lambda x: _ops.cast(x, int64), "to_int64")


def _size(input, out_type=int32):  # noqa: A002 - TF's signature
    if isinstance(input, GraphTensor) and (input._shape is None or None in input._shape):   # fl.size needs them now
        return _ops.reduce_prod(_ops.shape(input, out_type=out_type))
    return _ops.size(input, out_type=out_type)


size = graph_function(_size, "size")


def _reduction(fn):
    def reduce(input_tensor, axis=None, keepdims=None, name=None, reduction_indices=None, keep_dims=None):
        axis = reduction_indices if axis is None else axis
        keepdims = builtins.bool(keep_dims if keepdims is None else keepdims)
        return fn(input_tensor, axis=axis, keepdims=keepdims)
    return graph_function(reduce, fn.__name__)


reduce_sum = _reduction(_ops.reduce_sum)
reduce_mean = _reduction(_ops.reduce_mean)
reduce_max = _reduction(_ops.reduce_max)
reduce_min = _reduction(_ops.reduce_min)
reduce_prod = _reduction(_ops.reduce_prod)


def _arg(fn):
    def arg(input, axis=None, name=None, dimension=None, output_type=int64):  # noqa: A002 - TF's signature
        return fn(input, axis=dimension if axis is None else axis, output_type=output_type)
    return graph_function(arg, fn.__name__)


argmax = _arg(_ops.argmax)
argmin = _arg(_ops.argmin)
mod = graph_function(_ops.floormod, "mod")
truediv = graph_function(_ops.divide, "truediv")
random_normal = graph_function(_random.normal, "random_normal")
random_uniform = graph_function(_random.uniform, "random_uniform")
truncated_normal = graph_function(_random.truncated_normal, "truncated_normal")
set_random_seed = _random.set_seed
random = _namespace("random", "Random tensors (TF1.15's tf.random).", normal=random_normal,
                    uniform=random_uniform, truncated_normal=truncated_normal, set_random_seed=_random.set_seed)


def disable_eager_execution():
    """Nothing to do: ``flowlab.compat.v1`` always builds graphs (``import flowlab as fl`` is eager)."""


_said_eager = False


def enable_eager_execution(config=None, device_policy=None, execution_mode=None):
    """Changes nothing, and says so once: ``import flowlab as fl`` runs ops eagerly already (as
    TensorFlow 2 does), while the functions of ``flowlab.compat.v1`` always build graph nodes for a
    ``Session``. For eager code, call the same functions on ``fl`` (``fl.constant(2) + 3``)."""
    global _said_eager
    if not _said_eager:
        _said_eager = True
        import warnings
        warnings.warn("tf.compat.v1.enable_eager_execution(): nothing changed. flowlab is eager by default: "
                      "`import flowlab as fl` runs ops at once (fl.constant(2) + 3 has a value); "
                      "flowlab.compat.v1 always builds graphs for a tf.Session. Remove the call, and use fl.* "
                      "for eager code", stacklevel=2)


disable_v2_behavior = disable_eager_execution


def executing_eagerly():
    return False


# -- tf.nn and tf.losses -------------------------------------------------------------------------------
def _softmax(fn):
    def softmax(logits, axis=None, name=None, dim=None):
        axis = dim if axis is None else axis
        return fn(logits, -1 if axis is None else axis)
    return graph_function(softmax, fn.__name__)


def _xent_v2(labels=None, logits=None, axis=-1, dim=None):
    return _ops.softmax_cross_entropy_with_logits(labels, logits, axis=dim if dim is not None else axis)


def _xent_v1(_sentinel=None, labels=None, logits=None, dim=-1):
    """TF1's first cross-entropy: no gradient flows into ``labels`` (the _v2 one lets it)."""
    if _sentinel is not None:
        raise ValueError("softmax_cross_entropy_with_logits takes keyword arguments only: labels=..., logits=...")
    return _ops.softmax_cross_entropy_with_logits(_ops.stop_gradient(labels), logits, axis=dim)


def _sparse_xent(_sentinel=None, labels=None, logits=None):
    if _sentinel is not None:
        raise ValueError("sparse_softmax_cross_entropy_with_logits takes keyword arguments only: labels=..., logits=...")
    return _ops.sparse_softmax_cross_entropy_with_logits(labels, logits)


def _sigmoid_xent(_sentinel=None, labels=None, logits=None):
    # max(x, 0) - x * z + log(1 + exp(-|x|)): the stable form of -z log(sig(x)) - (1-z) log(1-sig(x))
    return (_ops.maximum(logits, 0.0) - logits * labels
            + _ops.log(1.0 + _ops.exp(-_ops.abs(logits))))


nn = _namespace(
    "nn", "Activations and losses over logits (TF1's tf.nn).",
    relu=graph_function(_ops.relu), sigmoid=graph_function(_ops.sigmoid), tanh=graph_function(_ops.tanh),
    softmax=_softmax(_ops.softmax), log_softmax=_softmax(_ops.log_softmax),
    softmax_cross_entropy_with_logits=graph_function(_xent_v1, "softmax_cross_entropy_with_logits"),
    softmax_cross_entropy_with_logits_v2=graph_function(_xent_v2, "softmax_cross_entropy_with_logits_v2"),
    sparse_softmax_cross_entropy_with_logits=graph_function(_sparse_xent, "sparse_softmax_cross_entropy_with_logits"),
    sigmoid_cross_entropy_with_logits=graph_function(_sigmoid_xent, "sigmoid_cross_entropy_with_logits"),
    bias_add=graph_function(lambda value, bias: _ops.add(value, bias), "bias_add"),
    l2_loss=graph_function(lambda t: _ops.reduce_sum(_ops.square(t)) / 2.0, "l2_loss"),
)


def _mean_loss(per_example):
    def loss(*args, weights=1.0, **kwargs):
        values = per_example(*args, **kwargs)
        if not (isinstance(weights, (int, float)) and weights == 1):
            values = values * weights
        return _ops.reduce_mean(values)
    return loss


losses = _namespace(
    "losses", "Losses averaged over a batch (TF1's tf.losses).",
    mean_squared_error=graph_function(_mean_loss(lambda labels, predictions: _ops.square(predictions - labels)),
                                      "mean_squared_error"),
    absolute_difference=graph_function(_mean_loss(lambda labels, predictions: _ops.abs(predictions - labels)),
                                       "absolute_difference"),
    softmax_cross_entropy=graph_function(_mean_loss(lambda onehot_labels, logits: _ops.softmax_cross_entropy_with_logits(
        onehot_labels, logits)), "softmax_cross_entropy"),
    sparse_softmax_cross_entropy=graph_function(_mean_loss(
        lambda labels, logits: _ops.sparse_softmax_cross_entropy_with_logits(labels, logits)),
        "sparse_softmax_cross_entropy"),
)

errors = _namespace("errors", "The errors sessions raise (TF1's tf.errors).", OpError=OpError,
                    InvalidArgumentError=InvalidArgumentError, FailedPreconditionError=FailedPreconditionError,
                    DeadlineExceededError=DeadlineExceededError, OutOfRangeError=OutOfRangeError)

del _name
