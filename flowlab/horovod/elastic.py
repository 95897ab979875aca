"""``hvd.elastic``: training that resumes from an in-memory commit after a lost worker.

``hvd.elastic.run(func)`` decorates ``func(state, *args)``; ``ObjectState(**values)``,
``TensorFlowKerasState(model, optimizer=None, **values)`` and ``TensorFlowState(variables,
**values)`` hold what is kept; ``state.commit()`` keeps it in this process, ``restore()`` puts it
back, ``sync()`` gives every rank the newest commit, ``register_reset_callbacks`` adds functions to
call when a try resumes. ``check_host_updates()`` does nothing: flowlab's ranks do not change
while training runs, and a lost one is restarted in place by ``fl.distribute.run_with_recovery``, which runs
the training function again on every worker (the retry Horovod's own ``run`` makes inside the
process). See :mod:`flowlab.horovod._elastic` for how the ranks agree on a commit.

What elastic Horovod has for ranks that join and leave (host discovery, ``KerasState`` and the
Keras elastic callbacks) is not in flowlab: those names raise ``NotInFlowlabError`` saying what to
use instead.
"""
from flowlab._names import NotInFlowlabError

from ._elastic import ObjectState, State, TensorFlowKerasState, TensorFlowState, run

__all__ = ["run", "State", "ObjectState", "TensorFlowKerasState", "TensorFlowState"]

_INSTEAD = ("is not in flowlab: a group's ranks do not change while training runs, so there are no hosts to "
            "discover and no ranks that join (cluster.add_worker() grows a cluster between runs). What flowlab has: hvd.elastic.run with hvd.elastic.ObjectState, "
            "TensorFlowKerasState(model, optimizer, **values) or TensorFlowState(variables, **values), commit "
            "after each step, and fl.distribute.run_with_recovery(cluster, train_fn) to restart a lost worker; "
            "with Keras fit, use fl.keras.callbacks.BackupAndRestore instead")


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    raise NotInFlowlabError(f"hvd.elastic.{name} {_INSTEAD}")
