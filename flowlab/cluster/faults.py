"""Fault injection inside a task: slow, lossy or corrupting message handling, on purpose.

A LocalCluster sets a task's faults with a signed ``fault`` control message
(``cluster.delay(1, 50)``, ``cluster.drop(1, 0.3)``, ``cluster.corrupt(1, 0.1)``,
``cluster.clear_faults()``). The task's :class:`~flowlab.cluster.server.Server` then keeps a
:class:`Faults` object and, for every message it *receives* (requests, the collectives' one-way
``coll`` messages from its peers) and every reply it *sends*:

- waits ``delay`` seconds before handling a received message;
- drops a ``drop`` fraction of them (a dropped request is never answered, a dropped reply never
  arrives: the caller's deadline says so);
- flips one byte of the signed first frame of a ``corrupt`` fraction, so the receiver's own
  signature check rejects it (the task's ``stats["dropped"]`` counts the ones it received, a
  client's ``dropped`` the replies).

The choices come from ``random.Random(seed)``, so a test that gives a seed sees the same messages
dropped on every run. ``fault`` messages themselves and their replies are never touched, so
``clear_faults`` always gets through. With no fault set the server holds ``None`` and the cost per
message is one attribute test.

**Shared-memory channels.** Collectives between workers of one host travel through shared-memory
rings (:mod:`.collectives.shm`), not through the server. There the same faults act on what the task
*sends* (:func:`shm_send`, called by the collective's ``Exchange.send``, which looks at the task's
faults once per call and pays one attribute test per send when none is set):

- ``delay``: the task waits ``delay`` before each chunk it sends, so every collective it joins
  takes at least that long, and gives the right value;
- ``drop``: the chunk is never written, so the peer waiting for it fails at the call's deadline
  with :class:`~.collectives.errors.CollectiveTimeoutError` naming the task's rank (and saying it
  dropped messages on purpose), never a hang and never a wrong value;
- ``corrupt``: shared memory carries no signature, so a flipped byte would be summed in silently.
  While a corrupt fault is set, every chunk the task sends carries a CRC-32 of its arrays in its
  header; a ``corrupt`` fraction of chunks has one byte flipped after the checksum was taken. The
  receiver checks every chunk that carries a checksum and fails the call on every rank with a
  :class:`~.collectives.errors.CollectiveError` naming the sender: a corrupted chunk is always
  caught, never reduced. Native collectives (``algorithm="native"``) share their tensors through
  windows and boxes, not chunks: their small messages take the same faults (so delay and drop work
  there too), and a box whose tensor a corrupt roll hits fails the call at once on every rank with
  a :class:`~.collectives.errors.CollectiveError` saying so.

Aborts (the messages that tell peers a call failed) are never dropped, delayed or corrupted.
``kill`` and ``pause`` reach everything.

Killing, pausing and resuming are done by the cluster's process with signals; see
:meth:`LocalCluster.pause` and :func:`random_plan` for a reproducible schedule of them.
"""
from __future__ import annotations

import random
import time

__all__ = ["Faults", "control", "random_plan", "flip_byte", "shm_send", "checksum", "ACTIONS"]

ACTIONS = ("kill", "pause", "resume", "restart", "delay", "drop", "corrupt", "clear")


class Faults:
    """One task's injected faults: ``delay`` (seconds), ``drop`` and ``corrupt`` (fractions, 0..1),
    drawn from ``random.Random(seed)``. ``counts``: how many messages each fault has hit."""
    __slots__ = ("delay", "drop", "corrupt", "seed", "rng", "counts")

    def __init__(self, delay_ms: float = 0.0, drop: float = 0.0, corrupt: float = 0.0, seed=None):
        for name, value in (("drop", drop), ("corrupt", corrupt)):
            if not 0.0 <= float(value) <= 1.0:
                raise ValueError(f"{name} is a fraction of messages between 0 and 1, got {value!r}")
        if float(delay_ms) < 0:
            raise ValueError(f"delay is in milliseconds and cannot be negative, got {delay_ms!r}")
        self.delay, self.drop, self.corrupt = float(delay_ms) / 1000.0, float(drop), float(corrupt)
        self.seed = seed
        self.rng = random.Random(seed)
        self.counts = {"delayed": 0, "dropped": 0, "corrupted": 0}

    @property
    def active(self) -> bool:
        return bool(self.delay or self.drop or self.corrupt)

    def roll(self) -> str | None:
        """What happens to the next message: ``"drop"``, ``"corrupt"`` or None (it goes through)."""
        if self.drop and self.rng.random() < self.drop:
            self.counts["dropped"] += 1
            return "drop"
        if self.corrupt and self.rng.random() < self.corrupt:
            self.counts["corrupted"] += 1
            return "corrupt"
        return None

    def wait(self) -> None:
        if self.delay:
            self.counts["delayed"] += 1
            time.sleep(self.delay)

    def describe(self) -> dict:
        return {"delay_ms": self.delay * 1000.0, "drop": self.drop, "corrupt": self.corrupt, "seed": self.seed,
                **self.counts}


def flip_byte(frames, rng) -> list:
    """A copy of ``frames`` with one byte of the first frame (signature and signed header) flipped:
    a message no receiver's signature check accepts."""
    first = bytearray(frames[0])
    if first:
        first[rng.randrange(len(first))] ^= 0xFF
    return [bytes(first), *frames[1:]]


def checksum(arrays) -> int:
    """CRC-32 over the bytes of ``arrays`` in order (what a chunk carries while a corrupt fault is set)."""
    import zlib

    import numpy as np

    crc = 0
    for a in arrays:
        if a.nbytes:
            crc = zlib.crc32(np.ascontiguousarray(a).reshape(-1).view(np.uint8), crc)
    return crc


def _corrupted(arrays, rng) -> list:
    """A copy of ``arrays`` with one byte of one non-empty array flipped (the originals are untouched)."""
    import numpy as np

    full = [i for i, a in enumerate(arrays) if a.nbytes]
    out = list(arrays)
    if full:
        i = full[rng.randrange(len(full))]
        raw = np.array(arrays[i], copy=True, order="C")
        flat = raw.reshape(-1).view(np.uint8)
        flat[rng.randrange(flat.size)] ^= 0xFF
        out[i] = raw
    return out


def shm_send(ex, peer: int, header: dict, arrays):
    """Apply this task's faults to a collective chunk for ``peer`` (``ex``: the call's Exchange):
    the arrays to send (perhaps a corrupted copy, with ``header["x"]`` set to the checksum), or
    None when the chunk is dropped. Only shared-memory channels are touched here: a chunk on a
    ZeroMQ channel is a signed message, which the receiving server's own faults act on."""
    channels = getattr(ex.comm, "channels", None)
    if channels is None or channels[peer] != "shm":
        return arrays
    faults = ex.faults
    hit = _roll(ex, peer, "shm")
    if hit == "drop":
        return None
    if faults.corrupt:
        header["x"] = checksum(arrays)
        if hit == "corrupt":
            arrays = _corrupted(arrays, faults.rng)
    return arrays


def box_fault(ex, peer: int) -> str | None:
    """Apply this task's faults to a native call's box for ``peer`` (:mod:`.collectives.direct`):
    waits out a delay; ``"drop"`` (leave the box unwritten) or ``"corrupt"`` (boxes carry no
    checksum of the tensor, so the caller fails the call rather than hand out a flipped byte) or None."""
    return _roll(ex, peer, "shm-box")


def _roll(ex, peer: int, channel: str) -> str | None:
    """Wait out the task's delay, then roll its drop and corrupt dice for one send to ``peer``:
    ``"drop"``, ``"corrupt"`` or None; a hit is recorded as a ``fault`` event and a drop counted."""
    faults = ex.faults
    faults.wait()
    hit = faults.roll()
    if hit is not None:
        from . import events
        t = events.now()
        ex.log.record("fault", "dropped" if hit == "drop" else "corrupted", t, t, rank=ex.rank, peer=peer,
                      op=ex.name, seq=ex.seq, channel=channel, direction="out")
        if hit == "drop":
            ex.dropped += 1
    return hit


def control(server, body: dict) -> dict:
    """The ``fault`` message's handler: set (or with ``clear``, remove) ``server``'s faults and
    record the change as a ``fault`` event in its log; returns what is set now."""
    from . import events

    old = server.faults
    if body.get("clear"):
        new = None
    else:
        base = old.describe() if old is not None else {}
        pick = {k: body[k] if body.get(k) is not None else base.get(k, 0.0) for k in ("delay_ms", "drop", "corrupt")}
        seed = body["seed"] if "seed" in body else base.get("seed")
        new = Faults(pick["delay_ms"], pick["drop"], pick["corrupt"], seed)
        if not new.active:
            new = None
    server.faults = new
    now = events.now()
    state = new.describe() if new is not None else {"delay_ms": 0.0, "drop": 0.0, "corrupt": 0.0}
    shown = {k: state[k] for k in ("delay_ms", "drop", "corrupt")}
    server.log.record("fault", "clear" if new is None else "set", now, now, task=server.name,
                      rank=server.task_index, **shown)
    counts = old.counts if old is not None else {}
    return {"task": server.name, "faults": state, "hit_before": counts}


def random_plan(tasks, duration: float, n: int, actions=("kill", "pause"), seed=None, pause_for: float = 1.0) -> list:
    """``n`` faults at random times within ``duration`` seconds, reproducible from ``seed``: a list
    of ``(after_s, action, task)`` sorted by time, for :meth:`LocalCluster.schedule_faults`. Each
    ``pause`` is followed ``pause_for`` seconds later by the ``resume`` of the same task."""
    rng = random.Random(seed)
    tasks = list(tasks)
    plan = []
    for _ in range(n):
        at, action, task = round(rng.uniform(0, duration), 3), rng.choice(list(actions)), rng.choice(tasks)
        plan.append((at, action, task))
        if action == "pause":
            plan.append((round(at + pause_for, 3), "resume", task))
    return sorted(plan, key=lambda x: x[0])
