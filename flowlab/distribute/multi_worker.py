"""``MultiWorkerMirroredStrategy``: one replica per process, gradients summed with an all-reduce
over the processes' communicator.

Which processes form the group, in this order:

1. ``comm=`` given: that communicator's ranks.
2. ``cluster_resolver=`` given: the chief and worker tasks it lists. This process serves its own
   task's address and joins the others (see :mod:`._worker_group`).
3. Inside a cluster task (a LocalCluster worker in ``cluster.run``, a rank of ``flowlab run``):
   the tasks of its job.
4. ``TF_CONFIG`` (or ``FLOWLAB_CONFIG``) set, as for a script started by hand once per task: the
   tasks it lists, as in 2 (:class:`~.cluster_resolver.TFConfigClusterResolver`).
5. Otherwise the communicator collectives use by default: MPI's world under ``mpiexec``, else this
   process alone (one replica).

``communication_options`` (a :class:`~.collective_options.CommunicationOptions`) or the older
``communication=`` (a ``CommunicationImplementation``) choose the all-reduce and its deadline
(see :mod:`.collective_options`).
"""
from __future__ import annotations

import sys

from .strategy import Strategy

__all__ = ["MultiWorkerMirroredStrategy"]


class MultiWorkerMirroredStrategy(Strategy):
    """One replica per worker process (see the module docstring for where the workers come from).
    Every worker must construct it and call ``run``/``reduce`` in the same order (they are
    collectives).

    TensorFlow's arguments: ``cluster_resolver``, ``communication_options`` (and the older
    ``communication``). flowlab's own, by keyword: ``comm`` (a communicator), ``algorithm``
    (``"ring"``, ``"tree"``, ``"naive"``, ``"native"``; overrides the options' choice), ``timeout``
    (seconds per collective; overrides ``timeout_seconds``), ``connect_timeout`` (seconds to wait
    for the other tasks of a TF_CONFIG cluster to start)."""

    def __init__(self, cluster_resolver=None, communication_options=None, *, communication=None, comm=None,
                 algorithm: str | None = None, timeout: float | None = None, connect_timeout: float = 60.0):
        from .cluster_resolver import ClusterResolver
        from .collective_options import CommunicationImplementation, CommunicationOptions, algorithm_for, \
            communication_options as options_of
        # TensorFlow 2.0-2.3 had (communication, cluster_resolver): accept the options first too
        if isinstance(cluster_resolver, (CommunicationOptions, CommunicationImplementation)) and \
                (communication_options is None or isinstance(communication_options, ClusterResolver)):
            cluster_resolver, communication_options = communication_options, cluster_resolver
        if cluster_resolver is not None and not isinstance(cluster_resolver, ClusterResolver):
            raise TypeError(f"cluster_resolver must be a fl.distribute.cluster_resolver resolver "
                            f"(TFConfigClusterResolver(), SimpleClusterResolver(spec, task_type=, task_id=)), got "
                            f"{type(cluster_resolver).__name__}")
        options = options_of(communication_options, communication)
        chosen = algorithm_for(options.implementation, "MultiWorkerMirroredStrategy(CommunicationImplementation.NCCL)")
        timeout = timeout if timeout is not None else options.timeout_seconds
        if comm is None:
            comm, cluster_resolver = _group(cluster_resolver, connect_timeout)
        super().__init__(["/cpu:0"], comm=comm, algorithm=algorithm or chosen, timeout=timeout)
        self._cluster_resolver = cluster_resolver
        self._communication_options = options

    @property
    def communication_options(self):
        """The CommunicationOptions this strategy runs with."""
        return self._communication_options


def _group(resolver, connect_timeout):
    """``(communicator, resolver)`` for a strategy made without ``comm`` (the module docstring's
    order, from 2 on)."""
    from ..cluster.collectives import SelfCommunicator, current
    from .cluster_resolver import SimpleClusterResolver, TFConfigClusterResolver
    if resolver is None:
        server_mod = sys.modules.get("flowlab.cluster.server")
        srv = server_mod.current_server() if server_mod is not None else None
        if srv is not None and srv.spec is not None:         # 3: a task of a running cluster
            return current(), SimpleClusterResolver(srv.spec, task_type=srv.job_name, task_id=srv.task_index)
        resolver = TFConfigClusterResolver()
        source = resolver.variable()
        if source is None:                                   # 5: MPI's world, or alone
            comm = current()
            if comm.size > 1:
                return comm, SimpleClusterResolver({}, task_type="worker", task_id=comm.rank)
            return comm, resolver
    else:
        source = getattr(resolver, "variable", lambda: None)() or f"the {type(resolver).__name__}"
    from ._worker_group import join, place
    spec = resolver.cluster_spec()
    members, rank = place(spec, resolver.task_type, resolver.task_id, source)
    if rank is None or len(members) <= 1:
        return SelfCommunicator(), resolver
    return join(spec, members, rank, connect_timeout, source), resolver
