"""``tf.train.Coordinator``: one stop flag shared by a training loop and its helper threads.

Any thread may ``request_stop()`` (optionally with the exception that made it stop); every loop
asks ``should_stop()``. ``join(threads)`` waits for the registered threads and then raises the
first exception that was reported, so an error in a helper thread reaches the main program.
Reaching the end of the input (``StopIteration``, ``tf.errors.OutOfRangeError``) is a normal stop,
not an error. ``tf.train.Supervisor.coord`` is one of these.
"""
from __future__ import annotations

import contextlib
import sys
import threading
import time

from ..core.errors import OpError

__all__ = ["Coordinator", "OutOfRangeError"]


class OutOfRangeError(OpError):
    """The input has no more elements: a training loop that sees it ends normally."""


class Coordinator:
    """A stop flag for cooperating threads, with the first error any of them reported.

    >>> import flowlab.compat.v1 as tf
    >>> coord = tf.train.Coordinator()
    >>> coord.should_stop()
    False
    >>> coord.request_stop()
    >>> coord.should_stop()
    True
    """

    def __init__(self, clean_stop_exception_types=None):
        self._clean = tuple(clean_stop_exception_types or (OutOfRangeError, StopIteration))
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._error = None          # (type, value, traceback) of the first error reported
        self._threads: set = set()

    def request_stop(self, ex=None):
        """Ask every loop to stop. ``ex`` (an exception, or ``sys.exc_info()``) is kept, unless it
        is a clean end of input, and ``join`` raises it later; only the first one is kept."""
        with self._lock:
            if ex is not None and self._error is None:
                info = ex if isinstance(ex, tuple) else (type(ex), ex, ex.__traceback__)
                if not issubclass(info[0], self._clean):
                    self._error = info
            self._stopped.set()

    def clear_stop(self):
        """Forget the stop request and the error (to run the loops again)."""
        with self._lock:
            self._stopped.clear()
            self._error = None

    def should_stop(self) -> bool:
        return self._stopped.is_set()

    def wait_for_stop(self, timeout=None) -> bool:
        """Wait until a stop is requested or ``timeout`` seconds pass; True if it was requested."""
        return self._stopped.wait(timeout)

    @contextlib.contextmanager
    def stop_on_exception(self):
        """A block whose exception (any but a clean end) becomes ``request_stop(ex)`` instead of rising."""
        try:
            yield
        except Exception:
            self.request_stop(sys.exc_info())

    def register_thread(self, thread):
        with self._lock:
            self._threads.add(thread)

    def join(self, threads=None, stop_grace_period_secs=120, ignore_live_threads=False):
        """Wait for ``threads`` and the registered ones to end (a stop must have been requested or
        they must end on their own), then raise the first error reported. After the grace period,
        threads still running are a RuntimeError naming them (unless ``ignore_live_threads``)."""
        with self._lock:
            waiting = list(self._threads | set(threads or ()))
        deadline = None
        for thread in waiting:
            while thread.is_alive():
                if deadline is None and self.should_stop():
                    deadline = time.monotonic() + stop_grace_period_secs
                thread.join(0.1 if deadline is None else max(0.0, min(0.1, deadline - time.monotonic())))
                if deadline is not None and time.monotonic() >= deadline:
                    break
        alive = [t.name for t in waiting if t.is_alive()]
        with self._lock:
            self._threads.clear()
            error = self._error
        if error is not None:
            raise error[1].with_traceback(error[2])
        if alive and not ignore_live_threads:
            raise RuntimeError(f"Coordinator.join: threads {alive} still run {stop_grace_period_secs} s after the "
                               "stop request: make their loops check coord.should_stop()")

    def raise_requested_exception(self):
        """Raise the error reported with ``request_stop``, if there is one."""
        with self._lock:
            error = self._error
        if error is not None:
            raise error[1].with_traceback(error[2])

    def __repr__(self):
        return f"<tf.train.Coordinator {'stopping' if self.should_stop() else 'running'}>"
