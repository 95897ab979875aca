"""AUTOTUNE: stages that size themselves from what they measure while they run.

A stage given ``fl.data.AUTOTUNE`` starts small: a map with 1 worker, a prefetch with a 1-element
buffer. Each time its consumer takes an element it adds how long it was blocked to a window, and
every ``INTERVAL`` seconds (once the window holds a few requests) the window is judged:

* a **map** gets one more worker when its consumer spent more than ``WAIT_THRESHOLD`` of the window
  waiting on it, it is below its limit (``Options.autotune.cpu_budget``, else one worker per core,
  and ``threading.private_threadpool_size``), the process left a core idle (its CPU time over the
  window is below ``cores - 0.5`` cores) and the extra elements in flight fit the RAM budget;
* a **prefetch** buffer doubles when, in the same window, its consumer waited on it *and* its producer
  was held up by the full buffer, each for more than ``WAIT_THRESHOLD`` of the window: both sides sat
  idle at different moments, so more room would have kept both busy. A buffer that never fills means
  the producer is simply slower; a bigger one would not help (the map below it should grow instead).
  Bounded by ``max_buffer_size`` and the RAM budget (``ram_budget``, shared by the pipeline's
  stages; element sizes are measured).

Stages only grow. Every change is a ``Decision`` with its reason, kept in ``dataset.stats()`` and
recorded as an event of kind "autotune". The rules are plain functions of the measured numbers
(``decide_parallelism``, ``decide_buffer``), so they can be checked with made-up windows.
"""
from __future__ import annotations

import math
import time
from typing import NamedTuple

from ._structure import nbytes

__all__ = ["Window", "Change", "decide_parallelism", "decide_buffer", "Budget", "StageTuner",
           "INTERVAL", "WAIT_THRESHOLD", "MIN_REQUESTS"]

INTERVAL = 0.05         # seconds between judgements
WAIT_THRESHOLD = 0.05   # the share of a window the consumer must have waited before a stage grows
MIN_REQUESTS = 2        # a window is judged only once the consumer asked this many times
IDLE_CORE = 0.5         # a core counts as free if the process left this much of one unused


class Window(NamedTuple):
    """What a stage's consumer saw over one window."""
    seconds: float      # wall time the window covers
    requests: int       # elements the consumer took
    wait_s: float       # time the consumer was blocked on the stage
    cpu_s: float        # CPU time the whole process used over the window
    stall_s: float = 0.0  # time the stage's producer was held up by a full buffer


class Change(NamedTuple):
    new: int
    reason: str


def _waited(window: Window) -> float | None:
    """The share of the window the consumer waited, or None if the window is too thin to judge."""
    if window.requests < MIN_REQUESTS or window.seconds <= 0:
        return None
    return window.wait_s / window.seconds


def decide_parallelism(window: Window, current: int, limit: int, cores: int,
                       worker_bytes: int = 0, ram_left: float = math.inf) -> Change | None:
    """One more worker for a map, or None (see the module docstring for the rule). ``worker_bytes``:
    what one more worker's elements in flight would hold."""
    waited = _waited(window)
    if waited is None or waited < WAIT_THRESHOLD or current >= limit:
        return None
    busy = window.cpu_s / window.seconds
    if busy > cores - IDLE_CORE:
        return None
    if worker_bytes > ram_left:
        return None
    return Change(current + 1, f"its consumer waited {waited:.0%} of the last {window.seconds * 1e3:.0f} ms "
                               f"and the process used {busy:.1f} of {cores} cores")


def decide_buffer(window: Window, current: int, limit: int, element_bytes: int = 0,
                  ram_left: float = math.inf) -> Change | None:
    """A bigger prefetch buffer, or None (see the module docstring for the rule)."""
    waited = _waited(window)
    if waited is None or waited < WAIT_THRESHOLD or current >= limit:
        return None
    stalled = window.stall_s / window.seconds
    if stalled < WAIT_THRESHOLD:
        return None
    new = min(limit, max(current * 2, current + 1))
    if element_bytes:
        new = min(new, current + int(ram_left // element_bytes))
    if new <= current:
        return None
    return Change(new, f"its consumer waited {waited:.0%} and its producer was held up by the full buffer "
                       f"{stalled:.0%} of the last {window.seconds * 1e3:.0f} ms")


class Budget:
    """What the AUTOTUNE stages of one pipeline share: the cores and the RAM budget."""

    def __init__(self, cores: int, ram: int):
        self.cores = cores
        self.ram = ram
        self._held: dict[str, int] = {}     # stage name -> bytes its buffers may hold at their size now

    def hold(self, stage: str, nbytes_: int) -> None:
        self._held[stage] = nbytes_

    def ram_left(self, stage: str) -> float:
        return self.ram - sum(v for k, v in list(self._held.items()) if k != stage)


class StageTuner:
    """Drives AUTOTUNE for one stage: its consumer calls ``observe`` per element (cheap: two adds and
    a comparison); every INTERVAL the window is judged and a change applied with ``apply(new)``.

    ``parameter``: "parallelism" (a map) or "buffer_size" (a prefetch). ``held()``: the elements one
    unit may hold (a map worker: two chunks; a buffer slot: 1). ``stalls``: a callable giving the
    seconds the producer has spent held up by a full buffer so far."""

    def __init__(self, recorder, budget: Budget, parameter: str, value: int, limit: int, apply, stalls=None,
                 interval: float = INTERVAL, held=None):
        self.recorder = recorder
        self.budget = budget
        self.parameter = parameter
        self.value = value
        self.limit = limit
        self._apply = apply
        self._stalls = stalls
        self._held = held or (lambda: 2 if parameter == "parallelism" else 1)   # elements per unit
        self._interval = interval
        self._last_stalls = 0.0
        self._begin(time.perf_counter())
        if parameter == "parallelism":
            recorder.parallelism = value
        else:
            recorder.buffer_size = value

    def _begin(self, t):
        self.requests, self.wait_s = 0, 0.0
        self._start, self._cpu = t, time.process_time()
        self.due = t + self._interval
        if self._stalls is not None:
            self._last_stalls = self._stalls()

    def observe(self, t: float, waited: float, element) -> None:
        self.requests += 1
        self.wait_s += waited
        if t >= self.due:
            self._judge(t, element)

    def _judge(self, t, element):
        if self.requests < MIN_REQUESTS:       # too thin to judge: the next request closes the window
            return
        stalls = self._stalls() - self._last_stalls if self._stalls is not None else 0.0
        window = Window(t - self._start, self.requests, self.wait_s, time.process_time() - self._cpu, stalls)
        name, per_unit = self.recorder.name, self._held()
        size = nbytes(element)
        self.budget.hold(name, size * self.value * per_unit)
        left = self.budget.ram_left(name) - size * self.value * per_unit
        if self.parameter == "parallelism":
            change = decide_parallelism(window, self.value, self.limit, self.budget.cores, size * per_unit, left)
        else:
            change = decide_buffer(window, self.value, self.limit, size, left)
        if change is not None:
            old, self.value = self.value, change.new
            self._apply(change.new)
            self.budget.hold(name, size * self.value * per_unit)
            self.recorder.decided(self.parameter, old, change.new, change.reason)
        if self.value >= self.limit:
            self.due = math.inf         # nothing left to decide
        else:
            self._begin(time.perf_counter())
