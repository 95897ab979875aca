"""``MultiWorkerMirroredStrategy``: one replica per process, gradients summed with a ring
all-reduce over the processes' communicator."""
from __future__ import annotations

from .strategy import Strategy

__all__ = ["MultiWorkerMirroredStrategy"]


class MultiWorkerMirroredStrategy(Strategy):
    """One replica per worker process: in the workers of a LocalCluster (inside ``cluster.run``),
    under ``flowlab run`` or ``mpiexec`` (``comm``: the communicator, by default the one
    collectives use here). Alone, it is a strategy of one replica. Every worker must construct it
    and call ``run``/``reduce`` in the same order (they are collectives)."""

    def __init__(self, communication_options=None, cluster_resolver=None, *, comm=None, algorithm: str = "ring",
                 timeout: float | None = None):
        from ..cluster.collectives import current
        comm = current() if comm is None else comm
        super().__init__(["/cpu:0"], comm=comm, algorithm=algorithm, timeout=timeout)
