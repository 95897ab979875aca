"""The point-to-point contract every collective algorithm is written against.

A :class:`Communicator` is one rank's connection to a group of ``size`` ranks. It moves messages,
each a small header (a JSON-safe dict) plus a list of numpy arrays, and nothing else: ring, tree
and naive collectives, sequence numbers, mismatch checks and deadlines all live above it. Three
transports implement it: :class:`~.local.LocalGroup` (threads in one process, for fast tests),
:class:`~.mpi.MPICommunicator` (mpi4py, under ``mpiexec``) and the cluster's transport
(:mod:`.zmq`: shared memory between ranks on one host, ZeroMQ between hosts).

The contract, exactly::

    rank: int        # this rank, 0 <= rank < size (fixed for the communicator's life)
    size: int        # ranks in the group
    send(peer: int, header: dict, arrays: Sequence[np.ndarray]) -> None
    recv(timeout: float | None) -> tuple[int, dict, list[np.ndarray]]   # (source, header, arrays)
    close() -> None  # optional; the base class's does nothing

1. Order: messages from one sender to one receiver arrive in the order they were sent. Nothing
   is promised between different senders; ``recv`` returns whichever message is next.
2. ``send`` never waits for the receiver to call ``recv`` (it may wait briefly for buffer space).
   When it returns, the caller may overwrite ``arrays``: the transport has copied them or is done
   with them (a zero-copy socket send must therefore copy first, or wait until the bytes left).
   Sending to yourself is never done.
3. Arrays arrive with their dtype and shape (any dtype flowlab has: bool, int8-64, uint8,
   float16-64), C-contiguous, and never change afterwards (not shared with a sender that may
   write to its buffers). They may be read-only views of the transport's own receive buffers:
   the collective layer only reads them and lets go of them once used. Sent arrays are
   C-contiguous; a message may carry zero arrays, and arrays may be empty.
4. Headers hold str, int, float, bool, None and lists/dicts of those (never tuples), and arrive
   equal (``==``) to what was sent; the receiver does not modify them (a transport in one process
   may hand over the very same dict). Transports never interpret headers.
5. ``recv(timeout)`` raises ``TimeoutError`` when no message arrives within ``timeout`` seconds
   (``None``: wait without limit). When the transport learns that peers are gone (process
   exited, heartbeats stopped), it raises :class:`PeerGone` naming them, once, after delivering
   the messages they had sent; later calls go on delivering the others' messages. When this
   rank itself can no longer communicate (communicator closed, rank killed), every call raises
   ``PeerGone`` naming this rank. Sends to a gone peer are dropped silently.
6. One thread uses a communicator at a time (the collective layer enforces this).

Optional: ``flush(deadline)``, called as each collective ends, to wait (until ``deadline``, a
``time.perf_counter()`` value) for this rank's sends to leave, for transports whose messages move
only while the sender is inside the library (MPI); an attribute ``native`` with the transport's own collectives (MPI's), used by
``algorithm="native"``; ``events`` (an :class:`~flowlab.cluster.events.EventLog`) where this
rank's collective events go instead of the process's default log; ``segment_bytes``, the size
that large messages are cut into for pipelining; ``formed`` False with a method
``form(timeout, op, seq)``, for a transport that connects its group on first use: every
collective calls it first, within its own deadline (the cluster's transport, :mod:`.zmq`).

Which communicator a collective uses when none is passed (:func:`current`): the first answer
of the selectors in ``SELECTORS``, tried in order (each a small function: "does this apply here?
then this communicator, else None"; see the list below).
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import Sequence

import numpy as np

__all__ = ["Communicator", "PeerGone", "SelfCommunicator", "SELECTORS", "current", "scoped", "use",
           "set_default"]


class PeerGone(ConnectionError):
    """Raised by a transport's ``recv`` when ``peers`` are known to be gone; ``reason`` says how."""

    def __init__(self, peers, reason: str = "gone"):
        self.peers = sorted(set(peers))
        self.reason = reason
        super().__init__(f"rank{'s' if len(self.peers) != 1 else ''} "
                         f"{', '.join(map(str, self.peers))} {reason}")


class Communicator:
    """Base class of transports (see the module docstring for the contract)."""

    rank: int = 0
    size: int = 1
    formed: bool = True     # False until ``form(timeout, op, seq)`` connected the group (see above)
    collective_state = None  # what the collective layer keeps for it between calls (_exchange.comm_state)

    def send(self, peer: int, header: dict, arrays: Sequence[np.ndarray]) -> None:
        raise NotImplementedError

    def recv(self, timeout: float | None) -> tuple[int, dict, list]:
        raise NotImplementedError

    def poll(self) -> tuple[int, dict, list] | None:
        """A message that is already here, else None, without waiting (a transport may do this
        without ``recv``'s spinning; this default asks ``recv`` for an instant)."""
        try:
            return self.recv(0.0)
        except TimeoutError:
            return None

    def close(self) -> None:
        pass

    def __repr__(self):
        return f"<{type(self).__name__} rank {self.rank} of {self.size}>"


class SelfCommunicator(Communicator):
    """A group of one: every collective returns its input (as a new array). Nothing is sent."""

    rank, size = 0, 1

    def send(self, peer, header, arrays):
        raise ValueError(f"a group of one has no peer {peer}")

    def recv(self, timeout):
        raise ValueError("a group of one has nobody to receive from")


# -- which communicator a call uses -------------------------------------------------------------
class _Local(threading.local):
    stack = ()      # a default: looking up a missing attribute raises inside (microseconds)


_local = _Local()
_default: Communicator | None = None
_default_lock = threading.Lock()
_MPI_SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS")


@contextlib.contextmanager
def use(comm: Communicator):
    """Make ``comm`` the current communicator of this thread inside the block."""
    stack = _local.__dict__.setdefault("stack", [])
    stack.append(comm)
    try:
        yield comm
    finally:
        stack.pop()


def scoped() -> Communicator | None:
    """The communicator of this thread's innermost :func:`use` scope (a ``LocalGroup`` rank's
    thread), or None outside any."""
    stack = _local.stack
    return stack[-1] if stack else None


def set_default(comm: Communicator | None) -> None:
    """Set (or with None, forget) the process's default communicator, for threads without :func:`use`."""
    global _default
    with _default_lock:
        _default = comm


# -- the selectors, in the order current() tries them ------------------------------------------------
def _thread_scope():
    """1. Threads: the communicator of this thread's innermost :func:`use` (a ``LocalGroup`` rank)."""
    stack = _local.stack
    return stack[-1] if stack else None


def _process_default():
    """2. The process default from :func:`set_default` (``hvd.init(comm)``, a test's fixture)."""
    return _default


def _cluster_task():
    """3. Shared memory and ZeroMQ: in a task of a cluster (a LocalCluster worker, a rank of ``flowlab
    run``), the communicator among the tasks of its job (:mod:`.zmq`; each pair of ranks takes shared
    memory on one host, ZeroMQ otherwise). Not when ``FLOWLAB_COMM`` is ``self`` or ``mpi``."""
    mod = sys.modules.get("flowlab.cluster.server")
    if mod is None:
        return None
    srv = mod.current_server()
    last = _last_cluster
    if srv is not None and srv is last[0] and srv.spec is last[1] and not last[2]._closed:
        return last[2]      # the same task and layout as last time (FLOWLAB_COMM read then)
    srv = _cluster_server()
    if srv is None:
        return None
    from .zmq import for_server
    comm = for_server(srv, formed=False)    # the first collective forms it, by its own deadline
    _last_cluster[:] = [srv, srv.spec, comm]
    return comm


def _mpi_world():
    """4. MPI: MPI's world, when ``mpiexec`` started this process with several ranks (or
    ``FLOWLAB_COMM=mpi``). Decided once per process."""
    world = _world_comm if _world_comm is not None else _decide_world()
    return None if isinstance(world, SelfCommunicator) else world


def _group_of_one():
    """5. Otherwise a group of one: this process alone (also with ``FLOWLAB_COMM=self``)."""
    return _world_comm if _world_comm is not None else _decide_world()


SELECTORS = (_thread_scope, _process_default, _cluster_task, _mpi_world, _group_of_one)


def current() -> Communicator:
    """The communicator a collective uses when it is given none: the first of ``SELECTORS`` that
    answers (the last always does)."""
    for select in SELECTORS:
        comm = select()
        if comm is not None:
            return comm
    raise AssertionError("the last selector always answers")


def _decide_world() -> Communicator:
    global _world_comm
    with _default_lock:
        if _world_comm is None:
            _world_comm = _world()
        return _world_comm


_world_comm: Communicator | None = None
_last_cluster: list = [None, None, None]    # (server, its ClusterSpec, the communicator) of the last lookup


def _cluster_server():
    """The server of the cluster task this code runs in (one that knows its cluster), else None."""
    mod = sys.modules.get("flowlab.cluster.server")
    if mod is None:
        return None
    srv = mod.current_server()
    if srv is None or srv.spec is None or os.environ.get("FLOWLAB_COMM", "").lower() in ("self", "mpi"):
        return None
    return srv


def _world() -> Communicator:
    """MPI's world if ``mpiexec`` started this process with several ranks, else a group of one."""
    forced = os.environ.get("FLOWLAB_COMM", "").lower()
    if forced == "self":
        return SelfCommunicator()
    sizes = [os.environ.get(v) for v in _MPI_SIZE_VARS]
    if forced == "mpi" or any(s and s.isdigit() and int(s) > 1 for s in sizes):
        from .mpi import MPICommunicator
        return MPICommunicator()
    return SelfCommunicator()
