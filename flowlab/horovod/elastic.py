"""``hvd.elastic``: elastic Horovod (ranks that join and leave while training) is not in flowlab.

A flowlab group's ranks are fixed when it starts, so every name of ``horovod.tensorflow.elastic``
(``hvd.elastic.run``, ``TensorFlowKerasState``, ``ObjectState``...) raises an error that says so and
what to do instead."""
from flowlab._names import NotInFlowlabError

__all__: list = []

_INSTEAD = ("elastic Horovod (ranks joining and leaving while training) is not in flowlab: a group's ranks "
            "are fixed when it starts. Run a fixed number of ranks (LocalCluster(workers=N), or "
            "`flowlab run -np N script.py`) and, to survive a lost rank, save with fl.train.Checkpoint on rank 0 "
            "and restart every rank from fl.train.latest_checkpoint(...)")


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    raise NotInFlowlabError(f"hvd.elastic.{name}: {_INSTEAD}")
