"""One collective call on one rank: the messages it sends and receives, checked and timed.

An :class:`Exchange` wraps a communicator for the length of one call. Algorithms call only
``send(peer, arrays, step, chunk)``, ``recv(peer, step, chunk)`` and ``reduced(...)``; this
module does the rest:

- Every message carries the call's signature (op, sequence number, algorithm, reduction, shape,
  dtype, root) plus its step, chunk and part. A received signature that differs from this rank's
  own is a mismatch: the error shows both calls. The signature travels as one compact string,
  made once per distinct call (not per message) and compared as a whole; it is parsed back into
  fields only for an error.
- Events (send, recv, reduce, one per call) are recorded with ``EventLog.record_fields``: a
  plain tuple per event, turned into an :class:`~flowlab.cluster.events.Event` when the log is read.
- ``recv`` takes messages from any peer and keeps those from other peers (or for later calls) in
  a per-peer stash, so each algorithm reads its peers in the order it wants.
- The call has a deadline. When it passes, this rank tells every peer ("abort") and listens a
  moment for the others' answers: ranks that answer are alive, and the ranks that someone was
  waiting for and that never answered are the missing ones named in the error.
- Any failure (deadline, lost peer, mismatch) is sent to every peer as an abort message, so
  every rank stops waiting and raises an error naming the same op and sequence number.
- A message from a call older than the current one is a leftover and is dropped: this rank took
  everything it needed from that call (it finished it) or gave the call up (it failed), so the
  group can go on with its next call. Ranks that disagree on the order of calls are still caught:
  they disagree first on a call with the same sequence number, where the signatures differ.
"""
from __future__ import annotations

import collections
import json
import math
import threading

from ..events import default_log, now
from .comm import PeerGone
from .errors import (CollectiveError, CollectiveMismatchError, CollectiveTimeoutError, PeerLostError,
                     describe_call)

_DEFAULT_TIMEOUT = [60.0]
_SIG_FIELDS = ("op", "seq", "alg", "reduce", "shape", "dtype", "root", "seg")


def default_timeout() -> float:
    """Seconds a collective may take when called without ``timeout`` (60 unless changed)."""
    return _DEFAULT_TIMEOUT[0]


def set_default_timeout(seconds: float) -> None:
    """Change the deadline of collectives called without ``timeout`` (``math.inf``: none)."""
    if not seconds > 0:
        raise ValueError(f"a timeout must be positive, got {seconds!r}")
    _DEFAULT_TIMEOUT[0] = float(seconds)


def grace_for(timeout: float) -> float:
    """How long a rank that timed out listens for the others' answers before naming the missing."""
    return 2.0 if math.isinf(timeout) else min(2.0, max(0.3, 0.1 * timeout))


class _CommState:
    """What the collective layer keeps per communicator between calls."""

    __slots__ = ("seq", "failed_seq", "stash", "aborts", "gone", "busy")

    def __init__(self):
        self.seq = 0                 # calls started on this communicator
        self.failed_seq = 0          # the last call that failed here (its leftovers are dropped)
        self.stash: dict = {}        # peer -> deque of (header, arrays) read early
        self.aborts: dict = {}       # seq -> (src, abort info) for calls this rank has not reached
        self.gone: dict = {}         # peer -> reason, for peers the transport reported gone
        self.busy = threading.Lock()


_states_lock = threading.Lock()


def comm_state(comm) -> _CommState:
    """What the collective layer keeps for ``comm`` between calls (its documented
    ``collective_state``, made on first use)."""
    st = comm.collective_state
    if st is None:
        with _states_lock:
            st = comm.collective_state
            if st is None:
                st = comm.collective_state = _CommState()
    return st


def resync(comm, to=None):
    """``[collectives started, native ones started]`` on this rank of ``comm``; None while a
    collective runs here. With ``to`` (the largest such pair over the group), first jump forward
    to it: every call up to there counts as given up, so the next collective has the same
    sequence number on every rank and the leftovers of the stopped calls (messages, aborts, box
    tickets) are dropped. The cluster client does this after it stopped a call on several tasks
    (a failure or an interrupt), when some ranks had entered a collective that others never reached."""
    st = comm_state(comm)
    if not st.busy.acquire(blocking=False):
        return None
    try:
        native = getattr(comm, "native", None)
        if to is not None:
            seq = int(to[0])
            if seq > st.seq or seq > st.failed_seq:
                st.seq = max(st.seq, seq)
                st.failed_seq = st.seq
                st.aborts = {k: v for k, v in st.aborts.items() if k > st.seq}
                for peer, q in list(st.stash.items()):
                    st.stash[peer] = collections.deque(m for m in q if m[0]["q"] > st.seq)
            if native is not None and int(to[1]) > native._calls:
                native._calls = int(to[1])
        return [st.seq, 0 if native is None else native._calls]
    finally:
        st.busy.release()


_SIGS: dict = {}          # (op, alg, reduce, shape, dtype, root, seg) -> (text, dict without seq)
_SIGS_MAX = 4096
_EVENT_KEYS = ("peer", "step", "chunk", "part", "seq", "alg")
_CALL_KEYS = ("seq", "alg", "ok")


def _signature(op, alg, reduce, shape, dtype, root, seg):
    """(text, fields) of a call's signature, made once per distinct call: ``text`` (compact JSON,
    no sequence number) travels in every message and is compared as one string; ``fields`` is the
    dict that errors show."""
    key = (op, alg, reduce, shape, dtype, root, seg)
    got = _SIGS.get(key)
    if got is None:
        fields = {"op": op, "alg": alg, "reduce": reduce,
                  "shape": None if shape is None else [int(d) for d in shape],
                  "dtype": None if dtype is None else str(dtype), "root": root, "seg": seg}
        got = (json.dumps(fields, separators=(",", ":")), fields)
        if len(_SIGS) >= _SIGS_MAX:
            _SIGS.clear()
        _SIGS[key] = got
    return got


def _their_sig(header: dict) -> dict:
    """The full signature (with ``seq``) a peer's message carries."""
    try:
        fields = json.loads(header["s"])
    except (KeyError, TypeError, ValueError):
        fields = {}
    return {"op": fields.get("op"), "seq": header.get("q"), **{k: fields.get(k) for k in _SIG_FIELDS[2:]}}


class Exchange:
    """One collective call on one rank (a context manager: entering starts the call).

    A message's header is ``{"s": signature text, "q": sequence number, "t": step, "c": chunk,
    "p": part}``, plus ``"x"`` (a CRC-32 of the arrays, checked on receipt) while the sender has an
    injected corrupt fault (:func:`flowlab.cluster.faults.shm_send`); an abort is ``{"abort": info}``.
    ``sig`` is the full signature as a dict (made when asked for: errors and the native MPI check)."""

    __slots__ = ("comm", "rank", "size", "seq", "name", "alg", "timeout", "deadline", "log",
                 "st", "segment_bytes", "nbytes", "start", "text", "fields", "faults", "dropped")

    def __init__(self, comm, op: str, alg: str, shape=None, dtype=None, reduce=None, root=None,
                 timeout=None, segment_bytes=None, nbytes: int = 0):
        self.comm, self.rank, self.size = comm, comm.rank, comm.size
        self.name, self.alg = op, alg
        if timeout is None:
            self.timeout = _DEFAULT_TIMEOUT[0]
        else:
            self.timeout = float(timeout)
            if not self.timeout > 0:
                raise ValueError(f"a timeout must be positive, got {timeout!r}")
        self.st = comm_state(comm)
        log = getattr(comm, "events", None)
        self.log = default_log() if log is None else log   # (an empty log is falsy: no `or` here)
        self.segment_bytes = segment_bytes
        self.text, self.fields = _signature(op, alg, reduce, None if shape is None else tuple(shape), dtype,
                                            root, segment_bytes)
        self.seq = 0
        self.nbytes = nbytes
        # injected faults of this task (cluster.delay/drop/corrupt): None unless set, so a send pays
        # one attribute test; they reach the shared-memory channels here (see flowlab.cluster.faults)
        server = getattr(comm, "server", None)
        self.faults = None if server is None else server.faults
        self.dropped = 0

    @property
    def sig(self) -> dict:
        """This call's signature: op, seq, alg, reduce, shape, dtype, root, seg."""
        f = self.fields
        return {"op": f["op"], "seq": self.seq, **{k: f[k] for k in _SIG_FIELDS[2:]}}

    def __enter__(self):
        st = self.st
        if not st.busy.acquire(blocking=False):
            raise RuntimeError(f"rank {self.rank}: another collective is running on this communicator "
                               f"(in another thread); calls on one communicator must not overlap")
        st.seq += 1
        self.seq = seq = st.seq
        self.start = now()
        self.deadline = self.start + self.timeout
        try:
            if st.aborts:
                pending = st.aborts.pop(seq, None)
                for k in [k for k in st.aborts if k < seq]:
                    del st.aborts[k]
                if pending is not None:
                    self._on_abort(*pending)
            if st.gone:   # every collective needs every rank: one that is gone fails them all
                self._lost(PeerGone(st.gone, _reasons(st.gone)))
        except BaseException:
            st.busy.release()
            raise
        return self

    def __exit__(self, kind, err, tb):
        try:
            if err is not None and not isinstance(err, CollectiveError):
                self._fail_quietly()   # e.g. a KeyboardInterrupt: let the peers stop waiting too
            if err is None:
                flush = getattr(self.comm, "flush", None)
                if flush is not None:
                    flush(self.deadline)
        finally:
            self.st.busy.release()
            self.log.record_fields("collective", self.name, self.start, now(), self.nbytes, self.rank,
                                   _CALL_KEYS, (self.seq, self.alg, err is None))
        return False

    # -- what algorithms call --------------------------------------------------------------------
    def send(self, peer: int, arrays, step: int, chunk=0, part: int = 0) -> None:
        t0 = now()
        header = {"s": self.text, "q": self.seq, "t": step, "c": chunk, "p": part}
        if self.faults is not None:
            from ..faults import shm_send
            arrays = shm_send(self, peer, header, arrays)
            if arrays is None:          # dropped on purpose: the peer never sees it
                return
        try:
            self.comm.send(peer, header, arrays)
        except PeerGone as e:
            self._lost(e)
        nbytes = 0
        for a in arrays:
            nbytes += a.nbytes
        self.log.record_fields("send", self.name, t0, now(), nbytes, self.rank, _EVENT_KEYS,
                               (peer, step, chunk, part, self.seq, self.alg))

    def recv(self, peer: int, step: int, chunk=0, part: int = 0) -> list:
        """The next message of this call from ``peer`` (its arrays), checked against this call."""
        t0 = now()
        header, arrays = self._next_from(peer)
        if len(header) > 5:             # a checksum: the peer has a corrupt fault set (faults.shm_send)
            self._check_sum(peer, header, arrays)
        if header["s"] != self.text or header["q"] != self.seq:
            self._mismatch(peer, _their_sig(header))
        if header["t"] != step or header["c"] != chunk or header["p"] != part:
            self._mismatch(peer, _their_sig(header),
                           f"rank {self.rank} expected step {step} chunk {chunk} part {part}, rank {peer} "
                           f"sent step {header['t']} chunk {header['c']} part {header['p']}")
        nbytes = 0
        for a in arrays:
            nbytes += a.nbytes
        self.log.record_fields("recv", self.name, t0, now(), nbytes, self.rank, _EVENT_KEYS,
                               (peer, step, chunk, part, self.seq, self.alg))
        return arrays

    def _check_sum(self, peer, header, arrays) -> None:
        from ..faults import checksum
        want = header.get("x")
        if want is not None and checksum(arrays) != want:
            why = (f"the data rank {peer} sent arrived corrupted (CRC-32 mismatch; rank {peer} has an injected "
                   f"corrupt fault, and its shared-memory chunks carry a checksum while it does)")
            self._fail(CollectiveError(f"{self._call()} ({self.alg}) on rank {self.rank} failed: {why}",
                                       self.name, self.seq, self.rank, (peer,)), {"kind": "error", "message": why})

    def reduced(self, t0: float, nbytes: int, peer: int, step: int, chunk=0, part: int = 0) -> None:
        """Record a reduction step that began at ``t0`` (``events.now()``)."""
        self.log.record_fields("reduce", self.name, t0, now(), nbytes, self.rank, _EVENT_KEYS,
                               (peer, step, chunk, part, self.seq, self.alg))

    def check(self, peer: int) -> None:
        """For an algorithm that waits on something other than messages (a shared-memory box, see
        :mod:`.direct`): raise as ``recv`` would if the deadline has passed (blaming ``peer``), a
        peer is gone, another rank gave the call up, or a message of this call came with another
        signature. Messages already here are read without waiting (``comm.poll()``) and kept for
        ``recv``."""
        st = self.st
        if st.gone and peer in st.gone:
            self._lost(PeerGone(st.gone, _reasons(st.gone)))
        if now() > self.deadline:
            self._timed_out(peer)
        oldest = max(self.seq, st.failed_seq + 1)
        while True:
            try:
                item = self.comm.poll()
            except PeerGone as e:
                self._note_gone(e)
                if peer in e.peers:
                    self._lost(e)
                continue
            if item is None:
                return
            src, header, arrays = item
            q = header.get("q")
            if q is None:
                self._heard_abort(src, header, peer)
                continue
            if q == self.seq and header["s"] != self.text:
                self._mismatch(src, _their_sig(header))
            if q >= oldest:
                st.stash.setdefault(src, collections.deque()).append((header, arrays))

    def their_sig(self, text: str, seq) -> dict:
        """A peer's signature from its signature text and sequence number (for :meth:`_mismatch`)."""
        return _their_sig({"s": text, "q": seq})

    # -- receiving ------------------------------------------------------------------------------
    def _next_from(self, peer):
        st = self.st
        oldest = max(self.seq, st.failed_seq + 1)   # older ones are leftovers (module docstring)
        q = st.stash.get(peer)
        while q:
            header, arrays = q.popleft()
            if header["q"] >= oldest:
                return header, arrays
        comm, deadline = self.comm, self.deadline
        while True:
            if st.gone and peer in st.gone:
                self._lost(PeerGone(st.gone, _reasons(st.gone)))
            left = deadline - now()
            if left <= 0:
                self._timed_out(peer)
            try:
                src, header, arrays = comm.recv(None if left == math.inf else left)
            except TimeoutError:
                self._timed_out(peer)
            except PeerGone as e:
                self._note_gone(e)     # keep waiting for ``peer``: if it needs the lost one, it tells us
                continue
            q = header.get("q")
            if q is None:
                self._heard_abort(src, header, peer)
                continue
            if q < oldest:
                continue   # a leftover: nobody will read it (see the module docstring)
            if src == peer:
                return header, arrays
            st.stash.setdefault(src, collections.deque()).append((header, arrays))

    def _note_gone(self, e: PeerGone) -> None:
        """The transport says ``e.peers`` are gone: fail if this rank is one of them, else remember them."""
        if self.rank in e.peers:
            self._lost(e)
        for p in e.peers:
            self.st.gone.setdefault(p, e.reason)

    def _heard_abort(self, src, header, waiting) -> None:
        """A message without a sequence number: an abort (raise here), or nothing this call needs."""
        abort = header.get("abort")
        if abort is not None:
            self._on_abort(src, abort, waiting)

    # -- failing, on every rank -----------------------------------------------------------------
    def _broadcast_abort(self, info: dict, skip=()) -> None:
        """Tell every peer this call failed (best effort: a dead peer cannot hear it)."""
        header = {"abort": info}
        for peer in range(self.size):
            if peer != self.rank and peer not in skip:
                try:
                    self.comm.send(peer, header, [])
                except Exception:  # noqa: BLE001 - the peer may be the one that is gone
                    pass

    def _fail(self, err: CollectiveError, info: dict | None = None, skip=()):
        self.st.failed_seq = max(self.st.failed_seq, self.seq)
        if info is not None:
            self._broadcast_abort({"seq": self.seq, "op": self.name, "from": self.rank, **info}, skip)
        raise err

    def _fail_quietly(self):
        self.st.failed_seq = max(self.st.failed_seq, self.seq)
        self._broadcast_abort({"seq": self.seq, "op": self.name, "from": self.rank, "kind": "interrupted",
                               "message": f"rank {self.rank} was interrupted in {self._call()}"})

    def _call(self) -> str:
        return f"{self.name} #{self.seq}"

    def _timed_out(self, peer):
        self._gather_timeouts({peer})

    def _gather_timeouts(self, waiting_for: set, first=None):
        """Tell the peers this call timed out, listen a moment for their answers, and raise: a
        mismatch if some rank answered from a different call (ranks waiting on each other in
        different collectives), else a timeout naming the ranks waited for that never answered."""
        alive, suspects, sigs = {self.rank}, set(waiting_for), {}
        dropped = {self.rank: self.dropped} if self.dropped else {}    # messages dropped on purpose
        if first is not None:
            alive.add(first[0])
            suspects.update(first[1].get("waiting_for", ()))
            sigs[first[0]] = first[1].get("sig")
            if first[1].get("dropped"):
                dropped[first[0]] = first[1]["dropped"]
        self.st.failed_seq = max(self.st.failed_seq, self.seq)
        info = {"seq": self.seq, "op": self.name, "from": self.rank, "kind": "timeout",
                "waiting_for": sorted(waiting_for), "sig": self.sig}
        if self.dropped:
            info["dropped"] = self.dropped
        self._broadcast_abort(info)
        end, gone = now() + grace_for(self.timeout), set()
        while True:
            left = end - now()
            if left <= 0:
                break
            try:
                src, header, arrays = self.comm.recv(left)
            except TimeoutError:
                break
            except PeerGone as e:
                gone.update(e.peers)
                for p in e.peers:
                    self.st.gone.setdefault(p, e.reason)
                if self.rank in e.peers:
                    break
                continue
            abort = header.get("abort")
            if abort is None:
                if (header.get("q") or 0) > self.seq:   # a later call's message: keep it for then
                    self.st.stash.setdefault(src, collections.deque()).append((header, arrays))
                continue
            if abort["seq"] == self.seq:
                alive.add(src)
                suspects.update(abort.get("waiting_for", ()))
                suspects.update(abort.get("missing", ()))
                sigs.setdefault(src, abort.get("sig"))
                if abort.get("dropped"):
                    dropped[src] = abort["dropped"]
            elif abort["seq"] > self.seq:
                self.st.aborts[abort["seq"]] = (src, abort)
        for peer in sorted(sigs):
            theirs = sigs[peer]
            if theirs is not None and theirs != self.sig:
                self._mismatch(peer, theirs, "the ranks waited for each other until the deadline", tell=False)
        missing = sorted((suspects | gone) - alive)
        head = f"{self._call()} ({self.alg}) on rank {self.rank} timed out after {self.timeout:g} s: "
        if missing:
            who = ", ".join(map(str, missing))
            text = (f"no word from rank{'s' if len(missing) != 1 else ''} {who} (dead, stopped, or not "
                    f"calling {self.name}); ranks that answered: {sorted(alive)}")
        else:
            missing = sorted(waiting_for)
            text = (f"every rank answered ({sorted(alive)}) but the call did not finish: too slow for "
                    f"the deadline, or messages were lost")
        if dropped:
            text += "; " + ", ".join(f"rank {r} dropped {n} message{'s' if n != 1 else ''} of this call"
                                     for r, n in sorted(dropped.items()))
            text += " on purpose (an injected drop fault: cluster.drop; cluster.clear_faults() removes it)"
        raise CollectiveTimeoutError(head + text, self.name, self.seq, self.rank, missing, self.timeout)

    def _lost(self, e: PeerGone):
        if self.rank in e.peers:
            self.st.failed_seq = max(self.st.failed_seq, self.seq)
            raise PeerLostError(f"{self._call()} ({self.alg}) on rank {self.rank} failed: this rank is "
                                f"{e.reason}", self.name, self.seq, self.rank, e.peers) from None
        who = ", ".join(map(str, e.peers))
        err = PeerLostError(f"{self._call()} ({self.alg}) on rank {self.rank} failed: rank"
                            f"{'s' if len(e.peers) != 1 else ''} {who} {e.reason}",
                            self.name, self.seq, self.rank, e.peers)
        self._fail(err, {"kind": "lost", "missing": e.peers, "reason": e.reason}, skip=e.peers)

    def _mismatch(self, peer, theirs, detail=None, tell=True):
        mine = self.sig
        diff = [f"{k}: {mine.get(k)!r} on rank {self.rank}, {theirs.get(k)!r} on rank {peer}"
                for k in _SIG_FIELDS if mine.get(k) != theirs.get(k)]
        if detail:
            diff.append(detail)
        text = _mismatch_text(self.rank, mine, peer, theirs, diff)
        err = CollectiveMismatchError(text, self.name, self.seq, self.rank, peer, dict(mine), dict(theirs))
        self._fail(err, {"kind": "mismatch", "peer": peer, "mine": dict(mine), "theirs": dict(theirs),
                         "diff": diff} if tell else None)

    def _on_abort(self, src: int, info: dict, waiting: int | None = None):
        """A peer says a call failed: raise the matching error here (or keep it for a later call)."""
        st, seq = self.st, info["seq"]
        if seq <= st.failed_seq:
            return                                   # old news: that call already failed here
        if seq > self.seq:
            st.aborts[seq] = (src, info)             # a rank ahead of us failed in a later call
            return
        kind, here = info.get("kind"), f"{self._call()} on rank {self.rank}"
        where = "" if seq == self.seq else f" (in its {info.get('op')} #{seq}, which this rank had finished)"
        if kind == "timeout":
            if seq == self.seq:
                self._gather_timeouts(set() if waiting is None else {waiting}, first=(src, info))
            # a call this rank had finished: answer "alive" to the ranks collecting answers for it,
            # then fail this call too (the group is broken: its peers may be waiting on this rank)
            self._broadcast_abort({"seq": seq, "op": info.get("op"), "from": self.rank, "kind": "timeout",
                                   "waiting_for": []})
            blamed = info.get("waiting_for", [])
            err = CollectiveTimeoutError(f"{here} failed: rank {src} timed out{where} waiting for rank(s) "
                                         f"{blamed}", self.name, self.seq, self.rank, blamed, self.timeout)
            self._fail(err, {"kind": "timeout", "waiting_for": blamed})
        if kind == "lost":
            missing = info.get("missing", ())
            for p in missing:
                st.gone.setdefault(p, info.get("reason", "gone"))
            who = ", ".join(map(str, missing))
            err = PeerLostError(f"{here} failed: rank{'s' if len(missing) != 1 else ''} {who} "
                                f"{info.get('reason', 'gone')} (reported by rank {src}{where})",
                                self.name, self.seq, self.rank, missing)
        elif kind == "mismatch":
            det, peer = info["from"], info["peer"]
            text = _mismatch_text(det, info["mine"], peer, info["theirs"], info.get("diff", []))
            err = CollectiveMismatchError(f"{here} failed: {text}\n  (detected by rank {det}{where}; "
                                          f"this rank called {describe_call(self.sig)})",
                                          self.name, self.seq, self.rank, peer, info["mine"], info["theirs"])
        else:
            err = CollectiveError(f"{here} failed: {info.get('message', f'rank {src} gave up')}",
                                  self.name, self.seq, self.rank, (src,))
        self._fail(err)


def _reasons(gone: dict) -> str:
    reasons = sorted(set(gone.values()))
    return reasons[0] if len(reasons) == 1 else "gone (" + "; ".join(reasons) + ")"


def _mismatch_text(rank, mine, peer, theirs, diff) -> str:
    if mine.get("seq") != theirs.get("seq"):
        # the counts differ: after a failed, timed-out or cancelled call, one rank may have entered
        # (and counted) a collective the other never reached, although both run the same code
        lines = [f"ranks {rank} and {peer} are out of step: rank {peer} is at its collective "
                 f"#{theirs.get('seq')}, rank {rank} at #{mine.get('seq')}",
                 f"  rank {rank} called {describe_call(mine)}",
                 f"  rank {peer} called {describe_call(theirs)}",
                 "  their counts of collectives drifted apart, most likely after a failed or cancelled call "
                 "(else one rank skipped or added a call). After a call a cluster stopped, it brings the ranks "
                 "back in step, and the next call works; if it keeps failing, cluster.restart(i) of one task "
                 "forms the group afresh"]
    else:
        lines = [f"ranks {rank} and {peer} called different collectives as their collective #{mine.get('seq')}:",
                 f"  rank {rank} called {describe_call(mine)}",
                 f"  rank {peer} called {describe_call(theirs)}"]
    lines += [f"  differs: {d}" for d in diff if not d.startswith("seq:")]
    if mine.get("seq") == theirs.get("seq"):
        # the same count, different calls: rank-dependent code, or two ranks in different calls of
        # the same code (the counts start again after a restart and are evened out after a failure)
        lines.append(f"  either the code differs between ranks (every rank must make the same collective calls in "
                     f"the same order, with the same shape, dtype, reduction and algorithm), or ranks {rank} and "
                     f"{peer} are out of step: one is still in, or has just begun, a call the other gave up (after a "
                     f"cluster.restart every rank counts from #1 again, and after a failed or cancelled call the "
                     f"counts are evened out, so the numbers can match while the calls do not). If the code is the "
                     f"same, call again: this call was given up on every rank and the next one works; if it keeps "
                     f"failing, cluster.restart(i) of one task forms the group afresh")
    return "\n".join(lines)
