"""Execution state: which tapes record, which interpreter takes ops (core/interpreters.py), which
device scope applies.

State is per thread (a data pipeline's worker thread must not record on the main thread's tape or
add nodes to a graph being traced there). ``ACTIVE.count`` is process-wide and counts every tape,
graph, device scope and debug hook open in any thread: while it is zero, ops take the eager fast
path without looking at thread state at all.

A few hooks apply to every thread (``fl.debugging.enable_check_numerics``): ``push_global`` adds
one to each live thread's ``hooks`` and to every thread state made later, and counts once in
``ACTIVE``.
"""
from __future__ import annotations

import threading
import weakref

__all__ = ["ACTIVE", "state", "ThreadState", "push_global", "pop_global"]


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
    __slots__ = ("tapes", "graph", "interpreters", "interpreter", "device_stack", "hooks", "node", "__weakref__")

    def __init__(self):
        self.tapes: list = []          # GradientTapes recording in this thread, innermost last
        self.interpreters: list = []   # interpreters above the eager one, innermost last (interpreters.py;
        #                                counted in ACTIVE: no fast paths while any is pushed)
        self.interpreter = None        # the innermost of them, or None: ops run eagerly
        self.graph = None              # the Graph the innermost interpreter builds, or None (kept with it)
        self.node = None               # the graph node a graph interpreter is running (for errors)
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


_global_hooks: list = []       # hooks every thread runs, in the order they were pushed
_states = weakref.WeakSet()    # every live thread's state (a thread's state dies with it)
_global_lock = threading.Lock()


def state() -> ThreadState:
    try:
        return _local.state
    except AttributeError:
        st = _local.state = ThreadState()
        with _global_lock:
            st.hooks.extend(_global_hooks)
            _states.add(st)
        return st


def push_global(hook) -> None:
    """Run ``hook`` on every eager op in every thread, those running now and those started later."""
    with _global_lock:
        _global_hooks.append(hook)
        for st in list(_states):
            st.hooks.append(hook)   # in place (atomic): the thread may be pushing its own hooks
    ACTIVE.add(1)


def pop_global(hook) -> bool:
    """Undo ``push_global(hook)``; False if it was not pushed."""
    with _global_lock:
        if not any(h is hook for h in _global_hooks):
            return False
        _global_hooks.remove(hook)
        for st in list(_states):
            if hook in st.hooks:
                st.hooks.remove(hook)
    ACTIVE.add(-1)
    return True
