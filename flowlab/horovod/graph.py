"""Horovod for TF1 graphs (``import flowlab.compat.v1 as tf``), as ``horovod.tensorflow`` has it:

- ``hvd.DistributedOptimizer(tf.train.AdamOptimizer(0.001 * hvd.size()))``: its ``minimize`` (or
  ``apply_gradients``) puts the gradient average into the graph, as the all-reduce node the
  strategies and the TF2 path use (flowlab/distribute/_traced.py);
- :func:`broadcast_global_variables`: an operation that gives every global variable the value it
  has on ``root_rank``, when a session runs it;
- :class:`BroadcastGlobalVariablesHook`: that operation, run once when a
  ``tf.train.MonitoredTrainingSession`` has made (and initialized) its session, so every rank
  starts from root's variables.

Each rank runs its own session (``MonitoredTrainingSession()`` with no ``master``): the ranks
share no variables, only the collectives. Loaded on first use of those names (it imports compat).
"""
from __future__ import annotations

import flowlab.compat.v1 as _tf
from flowlab.core.graph import READ
from flowlab.distribute.horovod import broadcast_variables, size

__all__ = ["broadcast_global_variables", "BroadcastGlobalVariablesHook"]


def broadcast_global_variables(root_rank: int = 0):
    """An operation of the default graph that, when run, sets every global variable (model
    weights, the global step...) to its value on rank ``root_rank``. Every rank must run it (it is
    a collective), after the variables are initialized."""
    graph = _tf.get_default_graph()
    variables = _tf.global_variables()
    if not variables:
        raise ValueError("hvd.broadcast_global_variables: the default graph has no global variables yet; build "
                         "the model (and the optimizer's minimize) first, then make this operation")
    with graph.as_default():
        start = len(graph.nodes)
        broadcast_variables(variables, root_rank)
        updates = [n for n in graph.nodes[start:] if n.op.stateful and n.op is not READ]
        return _tf.group(*updates, name="broadcast_global_variables") if updates else \
            _tf.no_op(name="broadcast_global_variables")


class BroadcastGlobalVariablesHook(_tf.train.SessionRunHook):
    """Pass it to ``tf.train.MonitoredTrainingSession(hooks=[...])``: once the session is made and
    its variables initialized, every global variable takes rank ``root_rank``'s value. Its
    operation is built in ``begin()``, before the graph is finalized, so make the model and the
    training op before the session."""

    def __init__(self, root_rank: int = 0, device=""):
        super().__init__()
        if not 0 <= root_rank < size():
            raise ValueError(f"BroadcastGlobalVariablesHook: root_rank {root_rank} is not a rank of this group of "
                             f"{size()} (ranks 0..{size() - 1}); call hvd.init() first")
        self.root_rank = root_rank
        self.bcast_op = None

    def begin(self):
        if self.bcast_op is None or self.bcast_op.graph is not _tf.get_default_graph():
            self.bcast_op = broadcast_global_variables(self.root_rank)

    def after_create_session(self, session, coord):
        session.run(self.bcast_op)
