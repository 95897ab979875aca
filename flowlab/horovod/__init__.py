"""``import flowlab.horovod as hvd``: the Horovod-style API (see :mod:`flowlab.distribute.horovod`).

``import flowlab.horovod.keras as hvd`` (as ``horovod.keras``),
``import flowlab.horovod.tensorflow as hvd`` (as ``horovod.tensorflow``) and
``import flowlab.horovod.tensorflow.keras as hvd`` (as ``horovod.tensorflow.keras``) give the same
names; ``hvd.callbacks`` holds the Keras callbacks. For TF1 graphs (``import flowlab.compat.v1 as
tf``): ``hvd.DistributedOptimizer(tf.train.<Optimizer>(...))``, ``hvd.BroadcastGlobalVariablesHook``
and ``hvd.broadcast_global_variables`` (:mod:`flowlab.horovod.graph`, loaded on first use).
``hvd.elastic`` (:mod:`flowlab.horovod.elastic`): ``hvd.elastic.run`` and its states commit in memory
and resume after a lost worker, which ``fl.distribute.run_with_recovery`` restarts.
"""
from ..distribute.horovod import *  # noqa: F401,F403
from ..distribute.horovod import __all__ as _names
from . import callbacks, elastic

_GRAPH_NAMES = ("BroadcastGlobalVariablesHook", "broadcast_global_variables")

__all__ = list(_names) + ["callbacks", "elastic"]   # (star imports leave the TF1 names to __getattr__)


def __getattr__(name):
    """The TF1 names, loaded on first use (they import flowlab.compat)."""
    if name in _GRAPH_NAMES:
        from . import graph
        return getattr(graph, name)
    from .._names import missing_attribute
    raise missing_attribute("flowlab.horovod", name, [*__all__, *_GRAPH_NAMES])
