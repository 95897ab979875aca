"""Execution state: which tapes record, which graph is being built, which device scope applies.

State is per thread (a data pipeline's worker thread must not record on the main thread's tape or
add nodes to a graph being traced there). ``ACTIVE.count`` is process-wide and counts every tape,
graph, device scope and debug hook open in any thread: while it is zero, ops take the eager fast
path without looking at thread state at all.
"""
from __future__ import annotations

import threading

__all__ = ["ACTIVE", "state", "ThreadState"]


class _Active:
    __slots__ = ("count", "lock")

    def __init__(self):
        self.count = 0
        self.lock = threading.Lock()

    def add(self, n: int) -> None:
        with self.lock:
            self.count += n


ACTIVE = _Active()
_local = threading.local()


class ThreadState:
    __slots__ = ("tapes", "graph", "device_stack", "hooks")

    def __init__(self):
        self.tapes: list = []          # GradientTapes recording in this thread, innermost last
        self.graph = None              # the Graph being built, or None in eager mode
        self.device_stack: list = []   # DeviceSpecs from enclosing fl.device() scopes
        self.hooks: list = []          # callables run on every eager op result (numerics checks)

    def push(self, attr: str, item) -> None:
        getattr(self, attr).append(item)
        ACTIVE.add(1)

    def pop(self, attr: str, item) -> bool:
        """Remove ``item``; False if it was not there (e.g. a tape paused by stop_recording)."""
        stack = getattr(self, attr)
        # NOTE: remove the exact item, not the last one: tapes may exit out of order.
        for i in range(len(stack) - 1, -1, -1):
            if stack[i] is item:
                del stack[i]
                ACTIVE.add(-1)
                return True
        return False


def state() -> ThreadState:
    try:
        return _local.state
    except AttributeError:
        _local.state = ThreadState()
        return _local.state
