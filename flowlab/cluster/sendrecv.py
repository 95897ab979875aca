"""``send`` and ``recv``: the table ops that a graph's cross-task edges become.

Partitioning a graph across tasks (:mod:`.partition`) is a graph pass: on the task that computes
a value another task needs, a ``send`` node after it; on the task that needs it, a ``recv`` node
before its first reader. Each task then runs its partition as any graph is run, through core's
executor (``compile_plan``), so a partition is one more graph for the one runner.

Both ops are ``stateful`` (no pass folds, merges, drops or reorders them) and need ``peers`` (each
runs only with the other task running its half). Their attributes name
the edge (``key``: the producing node's index in the client's graph; ``to`` / ``source``: the
other task); what changes from run to run (the run's id, the task's server and peers, the timeout)
is the run's context, :func:`running`, which the task's ``partition`` handler opens around the
plan's call. ``send`` posts its input to the peer (its ``value`` handler stores it for that run)
and returns it; ``recv`` waits for it in the task's store, stopping early if the run is aborted.
"""
from __future__ import annotations

import threading
import time

import numpy as np

from ..core.backends import to_numpy
from ..core.dtypes import numpy_dtype
from ..core.execute import defop
from . import events as _events
from .errors import ClusterError

__all__ = ["SEND", "RECV", "RunContext", "running", "wait_value"]


class RunContext:
    """What ``send`` and ``recv`` kernels need of the run in progress on this thread."""

    __slots__ = ("server", "run", "timeout", "ids", "peers")

    def __init__(self, server, run: str, timeout: float, ids=None):
        self.server, self.run, self.timeout, self.ids, self.peers = server, run, timeout, ids or {}, None


_LOCAL = threading.local()


class running:
    """``with running(ctx):`` the send/recv kernels of this thread belong to the run ``ctx``."""

    __slots__ = ("ctx", "_outer")

    def __init__(self, ctx: RunContext):
        self.ctx = ctx

    def __enter__(self) -> RunContext:
        self._outer = getattr(_LOCAL, "ctx", None)
        _LOCAL.ctx = self.ctx
        return self.ctx

    def __exit__(self, *exc):
        _LOCAL.ctx = self._outer


def current() -> RunContext:
    ctx = getattr(_LOCAL, "ctx", None)
    if ctx is None:
        raise ClusterError("send and recv run only inside a task's partition (cluster/task_exec.py)")
    return ctx


def wait_value(server, run, key, source, timeout):
    """A value another task sends for this run; stops early if the run is aborted."""
    deadline = time.monotonic() + timeout
    store = server.store
    while True:
        try:
            return store.wait(key, 0.2)
        except TimeoutError:
            why = store.pop(f"abort/{run}")
            if why is not None:
                raise ClusterError(f"{server.name}: the run was stopped while waiting for {key} from {source} "
                                   f"({why})") from None
            if time.monotonic() > deadline:
                raise ClusterError(f"{server.name} waited {timeout:g} s for {key} from {source}, which never "
                                   f"came") from None


def _send_kernel(value, *, key, to, name):
    ctx = current()
    server = ctx.server
    peers = ctx.peers
    if peers is None:
        peers = ctx.peers = server.peers()
    want = ctx.ids.get(to)   # a task restarted on its address has a new server id
    if to not in peers or (want is not None and peers.server_id(to) != want):
        peers.add(to, server.spec.address_of(to), server_id=want)
    host = value if isinstance(value, np.ndarray) else to_numpy(value)
    start = _events.now()
    peers.request(to, "value", {"key": f"{ctx.run}/{key}", "name": name, "from_task": server.name, "sent": start},
                  [host], timeout=ctx.timeout)
    server.log.record("send", name, start, _events.now(), bytes=int(host.nbytes), task=server.name,
                      rank=server.task_index, peer=to, run=ctx.run)
    return value


def _recv_kernel(*, key, source, shape, dtype):
    ctx = current()
    return wait_value(ctx.server, ctx.run, f"{ctx.run}/{key}", source, ctx.timeout)


SEND = defop("send", _send_kernel, lambda x, *, key, to, name: (tuple(x.shape), numpy_dtype(x.dtype)),
             stateful=True, peers=True, doc="Post the input to task ``to`` for the run in progress (cluster partitions); "
                                "returns it.")
RECV = defop("recv", _recv_kernel, lambda *, key, source, shape, dtype: (shape, np.dtype(dtype)), stateful=True,
             peers=True, doc="The value task ``source`` sends for the run in progress (cluster partitions).")
