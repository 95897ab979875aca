"""What goes wrong in a collective, as errors that say which op, which call and which ranks.

Every error here is a :class:`CollectiveError` and carries ``op`` (``"allreduce"``...), ``seq``
(the call's sequence number on its communicator: the 1st, 2nd... collective it ran), ``rank``
(where it was raised) and ``missing`` (the ranks it blames, possibly empty):

- :class:`CollectiveTimeoutError`: the call's deadline passed (forming the group included: the
  first collective on a cluster connects to its peers within its own deadline); ``missing`` are
  the ranks that sent nothing in time (also a ``TimeoutError``).
- :class:`PeerLostError`: the transport reported ranks gone (process died, heartbeats stopped, or
  the cluster's monitor sent word that the task died: then at once, with its exit code or signal).
- :class:`CollectiveMismatchError`: ranks called different collectives (name, shape, dtype,
  algorithm or order); ``mine`` and ``theirs`` are the two calls, and the message shows both.
"""
from __future__ import annotations

from ..errors import ClusterError

__all__ = ["CollectiveError", "CollectiveTimeoutError", "PeerLostError", "CollectiveMismatchError",
           "NativeUnavailableError", "describe_call"]


class CollectiveError(ClusterError):
    """A collective failed on this rank. Every rank of the group raises one (each names the same
    op and sequence number), so no rank waits forever for the others."""

    def __init__(self, message: str, op: str | None = None, seq: int | None = None,
                 rank: int | None = None, missing=()):
        super().__init__(message)
        self.op, self.seq, self.rank, self.missing = op, seq, rank, sorted(missing)


class CollectiveTimeoutError(CollectiveError, TimeoutError):
    """The deadline passed; ``missing`` lists the ranks nobody heard from, ``waited`` the seconds."""

    def __init__(self, message, op=None, seq=None, rank=None, missing=(), waited: float | None = None):
        super().__init__(message, op, seq, rank, missing)
        self.waited = waited


class PeerLostError(CollectiveError):
    """Ranks in ``missing`` are gone (their process died, was killed, or stopped answering)."""


class CollectiveMismatchError(CollectiveError):
    """Two ranks called different collectives. ``mine`` is what this rank called (a dict: op,
    seq, algorithm, reduction, shape, dtype, root), ``theirs`` what ``peer`` called."""

    def __init__(self, message, op=None, seq=None, rank=None, peer=None, mine=None, theirs=None):
        super().__init__(message, op, seq, rank, ())
        self.peer, self.mine, self.theirs = peer, mine, theirs


class NativeUnavailableError(CollectiveError, ValueError):
    """``algorithm="native"`` was asked for on a rank whose group has no native collectives (a
    cluster's need every peer on shared memory); ``missing`` are the peers on ZeroMQ, and the
    message says why each is."""


def describe_call(sig: dict | None) -> str:
    """One line for a call signature: ``allreduce #3 (sum, ring) float32[4, 5]``."""
    if not sig:
        return "nothing (no collective running)"
    extra = [v for v in (sig.get("reduce"), sig.get("alg")) if v]
    if sig.get("root") is not None:
        extra.insert(0, f"root {sig['root']}")
    shape = "" if sig.get("shape") is None else f" {sig.get('dtype')}[{', '.join(map(str, sig['shape']))}]"
    return f"{sig.get('op')} #{sig.get('seq')} ({', '.join(extra)}){shape}"
