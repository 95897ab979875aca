"""Local multi-process clusters: ClusterSpec, Server, LocalCluster, transport, collectives, events.

>>> import flowlab as fl
>>> spec = fl.cluster.ClusterSpec({"worker": ["localhost:2222", "localhost:2223"]})
>>> spec.num_tasks("worker")
2

Importing this package is light: it never imports pyzmq or numpy (the transport is loaded when a
server or cluster starts). Each public
name below is imported from its module on first use.

- :mod:`.spec`: ``ClusterSpec``, ``config_from_env`` (``FLOWLAB_CONFIG``)
- :mod:`.server`: ``Server`` (one task's message loop), ``rank()``, ``world_size()``
- :mod:`.local`: ``LocalCluster`` (worker processes from a notebook cell), ``clusters()`` (the open
  ones of this process, oldest first)
- :mod:`.launch_form`: ``launcher()``, a form that starts a LocalCluster and becomes its panel
- :mod:`.client`: ``Client`` (signed requests to tasks)
- :mod:`.remote`: ``RemoteTensor``, eager ops placed on tasks (its ``RemoteInterpreter`` is registered
  with core while a cluster is open); :mod:`.partition`: graphs split across
  tasks (what ``Session(target)`` runs); :mod:`.task_exec`: what a task does with both
- :mod:`.magic`: the ``%%px`` cell magic (``%load_ext flowlab.cluster.magic``)
- :mod:`.protocol`, :mod:`.transport`, :mod:`.inproc`: the wire format and its two transports;
  :mod:`.schemes`: the registry that picks a transport by an address's scheme (tcp, inproc)
- :mod:`.liveness`: heartbeats and the process watch; :mod:`.errors`: what goes wrong
- :mod:`.collectives`: allreduce, broadcast, allgather, reduce_scatter, barrier (ring, tree, naive; MPI)
"""
import importlib

from .events import Event, EventLog, default_log  # noqa: F401

_HOME = {
    "ClusterSpec": ".spec", "ClusterConfig": ".spec", "config_from_env": ".spec",
    "Server": ".server", "rank": ".server", "world_size": ".server", "current_server": ".server",
    "LocalCluster": ".local", "latest_cluster": ".local", "clusters": ".local", "launcher": ".launch_form",
    "Client": ".client", "RemoteTensor": ".remote",
    "ClusterError": ".errors", "WorkerDiedError": ".errors", "WorkerUnresponsiveError": ".errors",
    "RemoteError": ".errors", "ClusterTimeoutError": ".errors", "ProtocolError": ".errors",
    "WorkerBusyError": ".errors", "Interrupted": ".errors", "WorkerPausedError": ".errors",
    "InprocTransport": ".inproc",
    **{name: ".collectives" for name in (
        "allreduce", "broadcast", "allgather", "reduce_scatter", "barrier", "LocalGroup", "CollectiveError",
        "CollectiveTimeoutError", "PeerLostError", "CollectiveMismatchError")},
}
__all__ = sorted([*_HOME, "Event", "EventLog", "default_log"])


def __getattr__(name):
    if name in _HOME:
        value = getattr(importlib.import_module(_HOME[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'flowlab.cluster' has no attribute {name!r}")


def __dir__():
    return __all__
