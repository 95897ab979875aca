"""The background threads of flowlab.data: a prefetcher and a parallel map, both stoppable.

Both have the same shape. The threads share a small state object (queues, a stop event, the thread
list) and never hold the iterator the user holds, so dropping that iterator lets a weakref finalizer
stop them. Exhaustion, an error and ``close()`` stop them too, and a stopping thread closes its own
upstream iterator (a generator may only be closed by the thread that runs it), so stopping one stage
stops every stage below it. No thread is left behind.

Why threads are enough: numpy releases the GIL inside its kernels, so k map workers doing array work
really run on k cores. Python-heavy functions need processes (not here yet).
"""
from __future__ import annotations

import itertools
import queue
import threading
import traceback
import weakref

from ..core.errors import OpError

__all__ = ["PipelineError", "PrefetchIterator", "ParallelMapIterator", "call_failed", "close_iterator"]

POLL_S = 0.05          # how often a thread blocked on a full queue or a semaphore checks for "stop"
JOIN_TIMEOUT_S = 5.0   # close() waits this long per thread; a user function still running is left to finish
_VALUE, _SLOT, _END, _ERROR = "value", "slot", "end", "error"
_ids = itertools.count()


class PipelineError(OpError):
    """A user function inside a pipeline stage failed. ``stage`` ("map", "filter"...), ``index`` (the
    element's position in that stage's input) and the original exception as ``__cause__``; the message
    holds the original traceback too, because it happened in another thread."""

    def __init__(self, message, stage=None, index=None):
        super().__init__(message, op=stage)
        self.stage = stage
        self.index = index


def call_failed(stage: str, index: int, error: BaseException) -> PipelineError:
    """The error to raise for ``error`` raised by a user function on element ``index``: chained to it."""
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    err = PipelineError(f"{stage}: the function failed on element {index} of its input: "
                        f"{type(error).__name__}: {error}\n\nOriginal traceback:\n{text}", stage, index)
    err.__cause__ = error            # as ``raise err from error``, but usable from another thread
    err.__suppress_context__ = True
    return err


def close_iterator(iterator) -> None:
    close = getattr(iterator, "close", None)
    if close is not None:
        close()


class _Shared:
    """What the threads of one iterator share: never the iterator itself (see the module docstring)."""

    def __init__(self, stage: str):
        self.name = f"flowlab-data-{stage}-{next(_ids)}"
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.wake = lambda: None      # unblocks threads that wait without polling

    def start(self, target, *args, suffix=""):
        thread = threading.Thread(target=target, args=(self, *args), name=self.name + suffix, daemon=True)
        self.threads.append(thread)
        thread.start()

    def shutdown(self, join: bool) -> None:
        self.stop.set()
        self.wake()
        if join:   # not from a finalizer: garbage collection may run in any thread, even one of ours
            me = threading.current_thread()
            for thread in self.threads:
                if thread is not me:
                    thread.join(JOIN_TIMEOUT_S)


def _put(shared: _Shared, q: queue.Queue, item) -> bool:
    """Put unless asked to stop first; False if stopped."""
    while not shared.stop.is_set():
        try:
            q.put(item, timeout=POLL_S)
            return True
        except queue.Full:
            pass
    return False


class _StoppableIterator:
    """Common ending: after the end, an error or close(), the threads are stopped and next() stops."""

    def __init__(self, shared: _Shared):
        self._shared = shared
        self._done = False
        self._finalizer = weakref.finalize(self, shared.shutdown, False)

    def __iter__(self):
        return self

    def close(self) -> None:
        """Stop the threads and wait for them (a running user function is allowed to finish)."""
        self._done = True
        self._finalizer.detach()
        self._shared.shutdown(join=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# -- prefetch: one thread fills a bounded queue ahead of the consumer ------------------------------
def _prefetch_loop(shared: _Shared, source, q: queue.Queue) -> None:
    try:
        while not shared.stop.is_set():
            try:
                element = next(source)
            except StopIteration:
                _put(shared, q, (_END, None))
                return
            if not _put(shared, q, (_VALUE, element)):
                return
    except BaseException as e:   # an upstream error travels to the consumer, who raises it
        _put(shared, q, (_ERROR, e))
    finally:
        close_iterator(source)


class PrefetchIterator(_StoppableIterator):
    """Iterates ``source`` in a daemon thread, at most ``buffer_size`` elements ahead; same order."""

    def __init__(self, source, buffer_size: int, stage: str = "prefetch"):
        super().__init__(_Shared(stage))
        self._queue = queue.Queue(max(1, int(buffer_size)))
        self._shared.start(_prefetch_loop, source, self._queue)

    def __next__(self):
        if self._done:
            raise StopIteration
        kind, payload = self._queue.get()
        if kind is _VALUE:
            return payload
        self.close()
        if kind is _END:
            raise StopIteration
        raise payload


# -- parallel map: a runner thread feeds k workers; the consumer reads results in order -------------
class _Slot:
    __slots__ = ("index", "element", "value", "error", "done")

    def __init__(self, index, element):
        self.index, self.element, self.value, self.error = index, element, None, None
        self.done = threading.Event()


def _map_runner(shared, source, work, out, in_flight, deterministic, num_workers):
    """Pull from upstream while fewer than the limit are in flight; hand each element to the workers.
    Deterministic: slots enter ``out`` in input order now and are waited on there. Otherwise the
    workers put finished slots into ``out``, and the end marker carries the count to expect."""
    index = 0
    try:
        while True:
            while not in_flight.acquire(timeout=POLL_S):
                if shared.stop.is_set():
                    return
            if shared.stop.is_set():
                return
            try:
                element = next(source)
            except StopIteration:
                out.put((_END, index))
                return
            except BaseException as e:
                out.put((_ERROR, e))
                return
            slot = _Slot(index, element)
            index += 1
            if deterministic:
                out.put((_SLOT, slot))
            work.put(slot)
    finally:
        for _ in range(num_workers):
            work.put(None)    # each worker leaves at a None, after the work queued before it
        close_iterator(source)


def _map_worker(shared, fn, stage, work, out, deterministic):
    while True:
        slot = work.get()
        if slot is None or shared.stop.is_set():
            return
        try:
            slot.value = fn(slot.element)
        except BaseException as e:
            slot.error = call_failed(stage, slot.index, e)
        slot.element = None
        slot.done.set()
        if not deterministic:
            out.put((_SLOT, slot))


class ParallelMapIterator(_StoppableIterator):
    """``fn`` over ``source`` in ``num_workers`` daemon threads, at most ``2 * num_workers`` elements
    in flight (taken from upstream but not yet returned). Input order unless ``deterministic=False``,
    which returns whatever finishes first. An error in ``fn`` raises a PipelineError from next()."""

    def __init__(self, source, fn, num_workers: int, deterministic: bool = True, stage: str = "map"):
        super().__init__(_Shared(stage))
        num_workers = max(1, int(num_workers))
        self._in_flight = threading.Semaphore(2 * num_workers)
        self._out: queue.Queue = queue.Queue()      # bounded by the semaphore
        work: queue.Queue = queue.Queue()
        self._received, self._total = 0, None
        self._shared.wake = lambda: [work.put(None) for _ in range(num_workers)]
        for i in range(num_workers):
            self._shared.start(_map_worker, fn, stage, work, self._out, deterministic, suffix=f"-worker-{i}")
        self._shared.start(_map_runner, source, work, self._out, self._in_flight, deterministic, num_workers,
                           suffix="-runner")

    def __next__(self):
        while not self._done:
            if self._total is not None and self._received >= self._total:
                self.close()
                break
            kind, payload = self._out.get()
            if kind is _SLOT:
                payload.done.wait()
                self._in_flight.release()
                self._received += 1
                if payload.error is not None:
                    self.close()
                    raise payload.error
                return payload.value
            if kind is _ERROR:
                self.close()
                raise payload
            self._total = payload          # _END: with deterministic=False, slots may still be coming
        raise StopIteration
