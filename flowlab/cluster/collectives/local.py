"""An in-process group: ``LocalGroup(n)`` gives ``n`` communicators that talk through queues, one
per rank, for running collectives on threads (fast, deterministic tests; notebooks without
processes).

"On the wire" a message is a copy of the sent arrays, made in ``send`` (as a network transport's
copy into its buffers would be), so the receiver owns what it gets and the sender may overwrite
its buffers at once. Faults can be injected, as a teacher would on a real cluster:

- ``kill(rank)``: the rank is gone; everyone else's ``recv`` raises ``PeerGone`` (once) after the
  messages it had sent are read, and the killed rank's own calls raise too.
- ``stop(rank)`` / ``resume(rank)``: the rank freezes (its sends are held back and its ``recv``
  waits) as a process under SIGSTOP would; the others see silence, then a deadline.
- ``delay(rank, seconds)``: every message that rank sends leaves that much later (a slow link).
- ``drop(rank)``: messages from that rank vanish (a broken link): silence again.

And two switches for graders (:mod:`flowlab.grading.properties`), both off by default (then the
first costs nothing and the second one attribute test per send):

- ``LocalGroup(n, reorder_seed=k)``: deliveries are reordered on purpose. ``recv`` waits a moment
  (``reorder_window`` seconds) for more messages, then hands out the oldest message of a sender
  chosen by a random generator seeded with ``k`` and the rank: messages from one sender still
  arrive in order (the contract), but between senders the order follows the seed, not the clock.
  ``group.deliveries[r]`` lists the senders of what rank r received, in order.
- ``LocalGroup(n, message_events=True)``: every message the transport carries is an event of
  kind ``message`` (name ``inproc``, ``rank`` the sender, attr ``peer`` the receiver, its
  ``bytes``), so raw ``comm.send`` calls, not only collectives, can be counted from ``events``.

>>> from flowlab.cluster.collectives import LocalGroup, allreduce
>>> with LocalGroup(3) as group:
...     group.run(lambda comm: allreduce([comm.rank, 1]).tolist())
[[3, 3], [3, 3], [3, 3]]
"""
from __future__ import annotations

import queue
import random
import threading
import time

import numpy as np

from ..events import EventLog, now
from .comm import Communicator, PeerGone, use

__all__ = ["LocalGroup", "LocalCommunicator"]

_WAKE = object()   # put into inboxes when a rank dies, resumes or the group closes


class LocalCommunicator(Communicator):
    """One rank of a :class:`LocalGroup` (see :mod:`.comm` for the contract)."""

    def __init__(self, group: "LocalGroup", rank: int):
        self.group, self.rank, self.size = group, rank, group.size
        self.events = group.events
        self.segment_bytes = group.segment_bytes
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._told: set = set()     # dead peers already reported by recv
        if group.reorder_seed is not None:   # reordered deliveries: messages taken in, not yet handed out
            self._held: list = []
            self._rng = random.Random(f"flowlab-reorder:{group.reorder_seed}:{rank}")
            self.recv = self._recv_reordered      # only then: the plain path stays as it was

    def send(self, peer, header, arrays):
        g = self.group
        self._check_alive()
        if self.rank in g._stopped:
            g._wait_resumed(self.rank)
            self._check_alive()
        delay = g._delays.get(self.rank)
        if delay:
            time.sleep(delay)
        if self.rank in g._dropping or peer in g._dead:
            return
        if not 0 <= peer < self.size or peer == self.rank:
            raise ValueError(f"rank {self.rank} cannot send to rank {peer} in a group of {self.size}")
        # the copy is the wire: the receiver owns what it gets, the sender may reuse its buffers
        copies = [np.array(a, copy=True, order="C") for a in arrays]
        if g.message_events:
            t = now()
            g.events.record_fields("message", "inproc", t, t, sum(a.nbytes for a in copies), self.rank,
                                   ("peer",), (peer,))
        g._comms[peer]._inbox.put((self.rank, header, copies))

    def _recv_reordered(self, timeout):
        """The next message in the seeded order (see the module docstring): one sender's messages
        keep their order; which sender's comes next is the seeded generator's choice among those
        that arrived within ``reorder_window`` seconds."""
        held, inbox = self._held, self._inbox
        if not held:
            held.append(LocalCommunicator.recv(self, timeout))   # waits, raises TimeoutError/PeerGone as usual
            window = self.group.reorder_window
            if timeout is not None:
                window = min(window, max(0.0, timeout))
            end = time.perf_counter() + window
            while True:
                left = end - time.perf_counter()
                try:
                    item = inbox.get(timeout=left) if left > 0 else inbox.get_nowait()
                except queue.Empty:
                    break
                if item is _WAKE:
                    break                         # a fault or a close: let the next call see it
                held.append(item)
        else:
            self._check_alive()
            if self.rank in self.group._stopped:
                self.group._wait_resumed(self.rank, None if timeout is None else time.perf_counter() + timeout)
                self._check_alive()
            while True:                           # whatever else is here now joins the choice
                try:
                    item = inbox.get_nowait()
                except queue.Empty:
                    break
                if item is _WAKE:
                    break
                held.append(item)
        senders = sorted({item[0] for item in held})
        src = senders[self._rng.randrange(len(senders))] if len(senders) > 1 else senders[0]
        for i, item in enumerate(held):
            if item[0] == src:
                del held[i]
                self.group.deliveries[self.rank].append(src)
                return item

    def recv(self, timeout):
        g = self.group
        deadline = None if timeout is None else time.perf_counter() + timeout
        inbox = self._inbox
        while True:
            self._check_alive()
            if self.rank in g._stopped:
                g._wait_resumed(self.rank, deadline)
                continue
            try:
                item = inbox.get_nowait()
            except queue.Empty:
                gone = g._dead - {self.rank} - self._told
                if gone:
                    self._told |= gone
                    raise PeerGone(gone, "killed (fault injection)") from None
                left = None if deadline is None else deadline - time.perf_counter()
                if left is not None and left <= 0:
                    raise TimeoutError(f"rank {self.rank}: no message within {timeout:.3g} s") from None
                try:
                    item = inbox.get(timeout=left)
                except queue.Empty:
                    raise TimeoutError(f"rank {self.rank}: no message within {timeout:.3g} s") from None
            if item is not _WAKE:
                return item

    def _check_alive(self):
        g = self.group
        if g._closed:
            raise PeerGone([self.rank], "closed (its LocalGroup was closed)")
        if self.rank in g._dead:
            raise PeerGone([self.rank], "killed (fault injection)")


class LocalGroup:
    """``n`` in-process ranks. ``group[r]`` is rank r's communicator; ``run(fn, *args)`` calls
    ``fn(comm, *args)`` on one thread per rank (each with its communicator made current) and
    returns the results in rank order. ``events``: the log every rank records into (a fresh one
    unless given). ``segment_bytes``: how large messages are cut for pipelining. ``reorder_seed``,
    ``reorder_window`` and ``message_events``: see the module docstring."""

    def __init__(self, n: int, events: EventLog | None = None, segment_bytes: int | None = None,
                 reorder_seed: int | None = None, reorder_window: float = 0.003, message_events: bool = False):
        if n < 1:
            raise ValueError(f"a group needs at least one rank, got {n}")
        if reorder_seed is not None and not isinstance(reorder_seed, (int, np.integer)):
            raise TypeError(f"LocalGroup: reorder_seed must be an int or None, got {reorder_seed!r}")
        if not reorder_window >= 0:
            raise ValueError(f"LocalGroup: reorder_window must be >= 0 seconds, got {reorder_window!r}")
        self.size = n
        self.reorder_seed = None if reorder_seed is None else int(reorder_seed)
        self.reorder_window = float(reorder_window)
        self.message_events = bool(message_events)
        # with reorder_seed: per rank, the senders of the messages it received, in delivery order
        self.deliveries = None if reorder_seed is None else [[] for _ in range(n)]
        self.events = events if events is not None else EventLog(task="local-group")
        self.segment_bytes = segment_bytes
        self._dead: set = set()
        self._stopped: set = set()
        self._dropping: set = set()
        self._delays: dict = {}
        self._closed = False
        self._cond = threading.Condition()
        self._threads: list = []
        self._comms = [LocalCommunicator(self, r) for r in range(n)]

    def __getitem__(self, rank) -> LocalCommunicator:
        return self._comms[rank]

    def __len__(self):
        return self.size

    def __iter__(self):
        return iter(self._comms)

    # -- running code on every rank -------------------------------------------------------------
    def run(self, fn, *args, return_exceptions: bool = False, join_timeout: float | None = 120.0):
        """``fn(comm, *args)`` on a thread per rank; the list of results in rank order. If a rank
        raises, the lowest such rank's exception is raised (after every thread ended), or with
        ``return_exceptions=True`` it takes that rank's place in the list."""
        results: list = [None] * self.size
        failed = [False] * self.size

        def body(rank):
            try:
                with use(self._comms[rank]):
                    results[rank] = fn(self._comms[rank], *args)
            except BaseException as e:  # noqa: BLE001 - handed back to the caller
                results[rank], failed[rank] = e, True

        threads = [threading.Thread(target=body, args=(r,), name=f"flowlab-rank-{r}", daemon=True)
                   for r in range(self.size)]
        self._threads.extend(threads)
        for t in threads:
            t.start()
        end = None if join_timeout is None else time.perf_counter() + join_timeout
        for t in threads:
            t.join(None if end is None else max(0.0, end - time.perf_counter()))
        alive = [r for r, t in enumerate(threads) if t.is_alive()]
        if alive:
            self.close()   # makes every rank's next send/recv raise, so the threads end
            for t in threads:
                t.join(5.0)
            raise RuntimeError(f"ranks {alive} were still running after {join_timeout} s; the group was closed")
        self._threads = [t for t in self._threads if t.is_alive()]
        if not return_exceptions:
            for r in range(self.size):
                if failed[r]:
                    raise results[r]
        return results

    # -- faults ---------------------------------------------------------------------------------
    def kill(self, rank: int) -> None:
        """Rank ``rank`` is gone for good."""
        with self._cond:
            self._dead.add(rank)
            self._stopped.discard(rank)
            self._cond.notify_all()
        self._wake_all()

    def stop(self, rank: int) -> None:
        """Freeze ``rank`` (like SIGSTOP) until :meth:`resume`."""
        with self._cond:
            self._stopped.add(rank)

    def resume(self, rank: int) -> None:
        with self._cond:
            self._stopped.discard(rank)
            self._cond.notify_all()
        self._comms[rank]._inbox.put(_WAKE)

    def delay(self, rank: int, seconds: float) -> None:
        """Every later message from ``rank`` leaves ``seconds`` late (0 to undo)."""
        self._delays[rank] = float(seconds)

    def drop(self, rank: int, on: bool = True) -> None:
        """Messages from ``rank`` vanish (until ``drop(rank, False)``)."""
        (self._dropping.add if on else self._dropping.discard)(rank)

    def _wait_resumed(self, rank, deadline=None):
        with self._cond:
            while rank in self._stopped and not self._closed and rank not in self._dead:
                left = None if deadline is None else deadline - time.perf_counter()
                if left is not None and left <= 0:
                    raise TimeoutError(f"rank {rank} is stopped")
                self._cond.wait(left)

    def _wake_all(self):
        for c in self._comms:
            c._inbox.put(_WAKE)

    # -- lifetime -------------------------------------------------------------------------------
    def close(self) -> None:
        """End the group: every rank's next call raises, stopped ranks wake up."""
        with self._cond:
            self._closed = True
            self._stopped.clear()
            self._cond.notify_all()
        self._wake_all()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        for t in self._threads:
            t.join(5.0)
        return False

    def __repr__(self):
        state = "closed" if self._closed else f"dead {sorted(self._dead)}" if self._dead else "running"
        return f"<LocalGroup {self.size} ranks, {state}>"
