"""Worker processes for ``map(fn, num_parallel_calls=k, use_processes=True)``: for Python-heavy
functions, which hold the GIL and so gain nothing from threads.

Each worker thread of the parallel map (``_parallel.py``) owns one child process and talks to it over
a pipe: it sends one element (its tensors as numpy arrays, pickled), the child calls the function and
sends back the result, or the error with its traceback as text. Ordering, the in-flight bound and
error reporting are therefore the thread pool's.

Children are started with the "spawn" method: a fresh interpreter that imports flowlab, then the
function by name. Forking is unsafe here because the parent runs threads (a fork copies locks that
other threads hold). So the function must be picklable by reference: a ``def`` at the top level of an
importable module; not a lambda, a nested function, or a function typed into a notebook. A script
that maps in processes needs the usual ``if __name__ == "__main__":`` guard.

A child leaves when its pipe closes (the parent stopped or died), and a watchdog thread in it checks
the parent's pid every 0.2 s, so even a child stuck in a long call exits when its parent dies. When
the map stops (exhaustion, an error, ``close()``, the iterator dropped) the parent signals every
child at once, then each worker thread waits for its own child and reaps it.
"""
from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import sys
import threading
import time
import traceback

from ._parallel import RemoteCallError
from ._structure import call, from_wire, to_element, to_wire

__all__ = ["pickle_function", "ProcessWorkers"]

WATCHDOG_S = 0.2
_OK, _FAILED = "ok", "failed"
_HINT = ("define it with def at the top level of a .py module that the worker processes can import, "
         "and import it from there")


def pickle_function(fn, stage: str = "map") -> bytes:
    """``fn`` pickled for the worker processes, or a TypeError saying why it cannot be sent."""
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    where = f"{stage}(use_processes=True)"
    if getattr(fn, "__name__", None) == "<lambda>":
        raise TypeError(f"{where}: a lambda cannot be sent to worker processes (pickle stores functions by "
                        f"name, and a lambda has none); {_HINT}")
    if "<locals>" in name:
        raise TypeError(f"{where}: {name} is defined inside another function, so worker processes cannot "
                        f"import it by name; {_HINT}")
    main = sys.modules.get("__main__")
    if getattr(fn, "__module__", None) == "__main__" and not getattr(main, "__file__", None):
        raise TypeError(f"{where}: {name} is defined in an interactive session (a notebook or the REPL); "
                        f"worker processes start fresh and cannot import it; {_HINT}")
    try:
        return pickle.dumps(fn)
    except Exception as e:  # noqa: BLE001 - any pickling failure gets the same explanation
        raise TypeError(f"{where}: {name} cannot be pickled to send it to worker processes "
                        f"({type(e).__name__}: {e}); {_HINT}") from e


# -- the child ---------------------------------------------------------------------------------------
def _watch_parent(parent_pid: int) -> None:
    while True:
        time.sleep(WATCHDOG_S)
        if os.getppid() != parent_pid:
            os._exit(3)


def _failure(error: BaseException):
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    try:
        raw = pickle.dumps(error)
    except Exception:  # noqa: BLE001 - the text and type name still travel
        raw = None
    return type(error).__name__, str(error), text, raw


def _child_main(conn, payload: bytes, parent_pid: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)     # Ctrl-C is the parent's to handle; it stops us
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()
    try:
        fn = pickle.loads(payload)
    except BaseException as e:  # noqa: BLE001 - told to the parent as the answer to its first element
        conn.send((_FAILED, _failure(e)))
        return
    while True:
        try:
            element = conn.recv()
        except (EOFError, OSError):
            return
        try:
            reply = (_OK, to_wire(to_element(call(fn, from_wire(element)))))
        except BaseException as e:  # noqa: BLE001 - every failure goes back to the parent
            reply = (_FAILED, _failure(e))
        try:
            conn.send(reply)
        except (EOFError, OSError):
            return
        except Exception as e:  # noqa: BLE001 - e.g. a result that cannot be pickled
            conn.send((_FAILED, _failure(e)))


# -- the parent side ----------------------------------------------------------------------------------
class _Child:
    """One worker process and the pipe to it; used by one worker thread only."""

    def __init__(self, context, payload: bytes, name: str):
        self.conn, child_end = context.Pipe()
        self.process = context.Process(target=_child_main, args=(child_end, payload, os.getpid()), name=name,
                                       daemon=True)
        self.process.start()
        child_end.close()
        self.pid = self.process.pid

    def __call__(self, element):
        try:
            self.conn.send(to_wire(element))
            kind, value = self.conn.recv()
        except (EOFError, OSError):
            kind, value = self._last_words()
        if kind == _OK:
            return from_wire(value)
        type_name, message, text, raw = value
        try:
            error = pickle.loads(raw) if raw is not None else None
        except Exception:  # noqa: BLE001
            error = None
        if not isinstance(error, BaseException):
            error = RuntimeError(f"{type_name}: {message}")
        raise RemoteCallError(error, f"(in worker process pid {self.pid})\n{text}")

    def _last_words(self):
        """A failure the child sent before its pipe closed, else one saying that it died."""
        try:
            if self.conn.poll(0):
                return self.conn.recv()
        except (EOFError, OSError):
            pass
        self.process.join(1.0)
        code = self.process.exitcode
        how = "was stopped" if code is None else (f"was killed by signal {-code}" if code < 0 else
                                                 f"exited with code {code}")
        error = RuntimeError(f"worker process pid {self.pid} {how} before it answered")
        return _FAILED, (type(error).__name__, str(error), str(error) + "\n", pickle.dumps(error))

    def terminate(self) -> None:
        """Signal the child to stop now (non-blocking; any thread)."""
        try:
            self.process.terminate()
        except (OSError, ValueError, AttributeError):
            pass

    def close(self) -> None:
        """Stop and reap the child (its own worker thread only). An idle child leaves as soon as its
        pipe closes; a busy one is terminated, then killed."""
        self.conn.close()
        self.process.join(0.5)
        if self.process.exitcode is None:
            self.terminate()
            self.process.join(2.0)
        if self.process.exitcode is None:
            self.process.kill()
            self.process.join()
        self.process.close()


class ProcessWorkers:
    """``make_call`` for a ParallelMapIterator: each worker thread starts and drives one child."""

    def __init__(self, payload: bytes, stage: str, recorder=None):
        self._payload = payload
        self._stage = stage
        self._recorder = recorder
        self._context = multiprocessing.get_context("spawn")

    def __call__(self, number: int, shared):
        child = _Child(self._context, self._payload, f"flowlab-data-{self._stage}-process-{number}")
        shared.on_stop.append(child.terminate)
        if self._recorder is not None:
            self._recorder.pids.append(child.pid)
        if shared.stop.is_set():        # stopped while this child was starting
            child.terminate()
        return child, child.close
