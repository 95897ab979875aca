"""Collectives (allreduce, broadcast, allgather, reduce_scatter, barrier) with ring, tree and naive
algorithms, written once against a small point-to-point :class:`Communicator` and run over threads
(:class:`LocalGroup`), MPI (:class:`MPICommunicator`, under ``mpiexec``) or the cluster's transport
(:class:`ZmqCommunicator`: between the worker processes of a LocalCluster or of ``flowlab run``).

Every message a collective sends or receives, and every reduction step, is an event in
``flowlab.cluster.events`` (kind ``send``/``recv``/``reduce``, attrs ``peer``, ``step``, ``chunk``,
``part``, ``seq``, ``alg``), plus one ``collective`` event per call. Nothing waits forever: each
call has a deadline, and failures raise a :class:`CollectiveError` on every rank.

Importing this package never imports mpi4py or pyzmq.
"""
from .api import ALGORITHMS, allgather, allreduce, barrier, broadcast, reduce_scatter  # noqa: F401
from ._exchange import default_timeout, set_default_timeout  # noqa: F401
from .cost import (AlphaBeta, algbw, busbw, busbw_factor, bytes_on_busiest_link,  # noqa: F401
                   fit_alpha_beta, predict)
from .comm import SELECTORS, Communicator, PeerGone, SelfCommunicator, current, scoped, set_default, use  # noqa: F401
from .errors import (CollectiveError, CollectiveMismatchError, CollectiveTimeoutError,  # noqa: F401
                     PeerLostError)
from .local import LocalCommunicator, LocalGroup  # noqa: F401
from .reductions import REDUCTIONS  # noqa: F401


def __getattr__(name):
    if name == "MPICommunicator":   # imported on first use only: it needs mpi4py
        from .mpi import MPICommunicator
        return MPICommunicator
    if name == "ZmqCommunicator":   # the cluster's transport between worker processes (pyzmq)
        from .zmq import ZmqCommunicator
        return ZmqCommunicator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# MPICommunicator is left out of __all__ on purpose: `import *` must not import mpi4py.
__all__ = ["allreduce", "broadcast", "allgather", "reduce_scatter", "barrier", "ALGORITHMS", "REDUCTIONS",
           "Communicator", "PeerGone", "SelfCommunicator", "LocalGroup", "LocalCommunicator",
           "current", "scoped", "use", "set_default", "SELECTORS", "default_timeout", "set_default_timeout",
           "CollectiveError", "CollectiveTimeoutError", "PeerLostError", "CollectiveMismatchError",
           "predict", "bytes_on_busiest_link", "busbw", "busbw_factor", "algbw", "AlphaBeta", "fit_alpha_beta"]
