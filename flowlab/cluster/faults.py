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
message is one attribute test. Shared-memory channels between workers do not pass through the
server, so these faults reach collectives only where they travel as messages (``channels`` says
which); ``kill`` and ``pause`` reach everything.

Killing, pausing and resuming are done by the cluster's process with signals; see
:meth:`LocalCluster.pause` and :func:`random_plan` for a reproducible schedule of them.
"""
from __future__ import annotations

import random
import time

__all__ = ["Faults", "control", "random_plan", "flip_byte", "ACTIONS"]

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


def control(server, body: dict) -> dict:
    """The ``fault`` message's handler: set (or with ``clear``, remove) ``server``'s faults and
    record the change as a ``fault`` event in its log; returns what is set now."""
    from . import events

    old = server._faults
    if body.get("clear"):
        new = None
    else:
        base = old.describe() if old is not None else {}
        pick = {k: body[k] if body.get(k) is not None else base.get(k, 0.0) for k in ("delay_ms", "drop", "corrupt")}
        seed = body["seed"] if "seed" in body else base.get("seed")
        new = Faults(pick["delay_ms"], pick["drop"], pick["corrupt"], seed)
        if not new.active:
            new = None
    server._faults = new
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
