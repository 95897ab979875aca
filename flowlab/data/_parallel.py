"""The background threads of flowlab.data: a prefetcher and a parallel map, both stoppable.

Both have the same shape. The threads share a small state object (queues, a stop event, the thread
list) and never hold the iterator the user holds, so dropping that iterator lets a weakref finalizer
stop them. Exhaustion, an error and ``close()`` stop them too, and a stopping thread closes its own
upstream iterator (a generator may only be closed by the thread that runs it), so stopping one stage
stops every stage below it. No thread is left behind.

Why threads are enough for most work: numpy releases the GIL inside its kernels, so k map workers
doing array work really run on k cores. For Python-heavy functions each worker thread can drive a
child process instead (``_processes.py``); ordering, the in-flight bound and errors stay the same.

Both iterators can record (a ``StageRecorder``: produce and wait times, see ``stats.py``) and tune
themselves (a ``StageTuner``: more workers, a bigger buffer, see ``autotune.py``); with neither, the
per-element path is what it was without them.

The per-element path uses only primitives written in C (``queue.SimpleQueue``, raw locks): a
``threading.Event``, ``Queue`` or ``Semaphore`` costs 4-6 us per use in Python code holding the GIL,
more than the whole hand-off of an element here. Bounds are tokens: a thread takes a token from a
SimpleQueue before it may add an element, and the consumer puts one back for each element it takes
(a map's consumer a chunk's worth at a time, see ``ParallelMapIterator``).
"""
from __future__ import annotations

import _thread
import itertools
import queue
import threading
import traceback
import weakref

from ..core.events import now
from ..core.errors import OpError

__all__ = ["PipelineError", "PrefetchIterator", "ParallelMapIterator", "RemoteCallError", "call_failed",
           "close_iterator"]

POLL_S = 0.05          # how often a thread waiting for a token checks for "stop"
JOIN_TIMEOUT_S = 5.0   # close() waits this long per thread; a user function still running is left to finish
BLOCKED_S = 20e-6      # a wait longer than this counts as blocked (shorter ones are the hand-over itself)
CHUNK_S = 4e-3         # a map worker takes enough elements at once to work about this long...
MAX_CHUNK = 16         # ...but never more than this many
_VALUE, _END, _ERROR = "value", "end", "error"
_ids = itertools.count()


class PipelineError(OpError):
    """A user function inside a pipeline stage failed. ``stage`` ("map", "filter"...), ``index`` (the
    element's position in that stage's input) and the original exception as ``__cause__``; the message
    holds the original traceback too, because it happened in another thread (or process)."""

    def __init__(self, message, stage=None, index=None):
        super().__init__(message, op=stage)
        self.stage = stage
        self.index = index


def call_failed(stage: str, index: int, error: BaseException, text: str | None = None) -> PipelineError:
    """The error to raise for ``error`` raised by a user function on element ``index``: chained to it.
    ``text``: the traceback as text, when it happened where ``error.__traceback__`` cannot follow."""
    if text is None:
        text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    err = PipelineError(f"{stage}: the function failed on element {index} of its input: "
                        f"{type(error).__name__}: {error}\n\nOriginal traceback:\n{text}", stage, index)
    err.__cause__ = error            # as ``raise err from error``, but usable from another thread
    err.__suppress_context__ = True
    return err


class RemoteCallError(Exception):
    """Raised by a worker's ``call`` when the function failed somewhere else (a worker process):
    ``error`` is the exception as rebuilt here, ``text`` its original traceback."""

    def __init__(self, error: BaseException, text: str):
        super().__init__(str(error))
        self.error, self.text = error, text


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
        self.on_stop: list = []       # more non-blocking calls for shutdown (e.g. signal worker processes)
        self.stall_s = 0.0            # time a producer spent waiting for room in its output buffer
        self.flush: list = []         # recorders' event buffers to flush when the threads are done

    def start(self, target, *args, suffix=""):
        thread = threading.Thread(target=target, args=(self, *args), name=self.name + suffix, daemon=True)
        self.threads.append(thread)
        thread.start()

    def shutdown(self, join: bool) -> None:
        self.stop.set()
        self.wake()
        for call in list(self.on_stop):
            call()
        if join:   # not from a finalizer: garbage collection may run in any thread, even one of ours
            me = threading.current_thread()
            for thread in list(self.threads):
                if thread is not me:
                    thread.join(JOIN_TIMEOUT_S)


def _take_token(shared: _Shared, tokens: queue.SimpleQueue) -> bool:
    """Take a token (room for one more element) unless asked to stop first; time waiting is a stall."""
    try:
        tokens.get_nowait()
        return not shared.stop.is_set()
    except queue.Empty:
        pass
    start = now()
    try:
        while not shared.stop.is_set():
            try:
                tokens.get(timeout=POLL_S)
                return not shared.stop.is_set()
            except queue.Empty:
                pass
        return False
    finally:
        shared.stall_s += now() - start


class _StoppableIterator:
    """Common ending: after the end, an error or close(), the threads are stopped and next() stops."""
    records_itself = True     # the pipeline does not wrap it in a timing generator

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
        for lane in self._shared.flush:
            lane.flush()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# -- prefetch: one thread fills a bounded buffer ahead of the consumer -----------------------------
def _prefetch_loop(shared: _Shared, source, items: queue.SimpleQueue, tokens: queue.SimpleQueue, lane) -> None:
    pull = source.__next__
    produce = lane.produce if lane is not None else None
    try:
        while _take_token(shared, tokens):
            start = now()
            try:
                element = pull()
            except StopIteration:
                items.put((_END, None))
                return
            if produce is not None:
                produce(start, now())
            items.put((_VALUE, element))
    except BaseException as e:   # an upstream error travels to the consumer, who raises it
        items.put((_ERROR, e))
    finally:
        close_iterator(source)
        if lane is not None:
            lane.flush()


class PrefetchIterator(_StoppableIterator):
    """Iterates ``source`` in a daemon thread, at most ``buffer_size`` elements ahead; same order.
    ``recorder``: a StageRecorder (or None); ``tune``: a function making this stage's StageTuner from
    its ``resize`` callback and a stall-time reader (or None)."""

    def __init__(self, source, buffer_size: int, stage: str = "prefetch", recorder=None, tune=None):
        super().__init__(_Shared(stage))
        self._items: queue.SimpleQueue = queue.SimpleQueue()
        self._tokens: queue.SimpleQueue = queue.SimpleQueue()
        self._size = 0
        self._resize(max(1, int(buffer_size)))
        tokens = self._tokens
        self._shared.wake = lambda: tokens.put(None)
        self._wait = recorder.waiter() if recorder is not None else None
        if self._wait is not None:
            self._shared.flush.append(self._wait)
        self._tuner = tune(self._resize, lambda shared=self._shared: shared.stall_s) if tune is not None else None
        if recorder is not None and recorder.buffer_size is None:
            recorder.buffer_size = self._size
        lane = recorder.producer() if recorder is not None else None
        self._plain = self._wait is None and self._tuner is None
        self._shared.start(_prefetch_loop, source, self._items, self._tokens, lane)

    def _resize(self, size: int) -> None:
        """Grow the buffer to ``size`` elements (it never shrinks)."""
        for _ in range(int(size) - self._size):
            self._tokens.put(None)
        self._size = max(self._size, int(size))

    def __next__(self):
        if self._done:
            raise StopIteration
        if self._plain:
            kind, payload = self._items.get()
        else:
            fill = self._items.qsize()
            start = now()
            kind, payload = self._items.get()
            end = now()
            if kind is _VALUE:
                if self._wait is not None:
                    self._wait(start, end, fill, self._size, not fill)
                if self._tuner is not None:
                    self._tuner.observe(end, end - start, payload)
        if kind is _VALUE:
            self._tokens.put(None)
            return payload
        self.close()
        if kind is _END:
            raise StopIteration
        raise payload


# -- parallel map: k workers pull chunks from upstream in turn; the consumer reads results in order --
class _Slot:
    __slots__ = ("index", "value", "error", "ready")

    def __init__(self, index, ready):
        self.index, self.value, self.error, self.ready = index, None, None, ready


class _MapState:
    """The map's upstream (read by one worker at a time, under ``lock``), its output, its tokens, and
    the chunk size: how many elements a worker takes at once (see ``ParallelMapIterator``)."""

    def __init__(self, source):
        self.source = source
        self.pull = source.__next__
        self.lock = _thread.allocate_lock()
        self.count = 0            # elements taken from upstream so far
        self.exhausted = False    # upstream ended or failed: no worker may pull again
        self.alive = 0            # workers started and not yet gone; the last one closes upstream
        self.workers = 0          # workers started
        self.out: queue.SimpleQueue = queue.SimpleQueue()
        self.tokens: queue.SimpleQueue = queue.SimpleQueue()
        self.chunk = 1            # elements per pull now
        self.largest = 1          # the largest chunk so far: the bound is 2 * workers * largest
        self.call_s = None        # running mean of one call's duration

    def add_tokens(self, n: int) -> None:
        for _ in range(n):
            self.tokens.put(None)

    def measured(self, calls: int, seconds: float) -> None:
        """A worker made ``calls`` calls in ``seconds``: update the mean and the chunk (under lock)."""
        per_call = seconds / calls
        self.call_s = per_call if self.call_s is None else 0.8 * self.call_s + 0.2 * per_call
        self.chunk = max(1, min(MAX_CHUNK, int(CHUNK_S / max(self.call_s, 1e-9))))
        if self.chunk > self.largest:
            self.add_tokens(2 * self.workers * (self.chunk - self.largest))
            self.largest = self.chunk


def _pull_chunk(state, n, deterministic):
    """Up to ``n`` elements and their slots (under ``state.lock``); None once upstream is done."""
    if state.exhausted:
        return None
    out = state.out
    ready = _thread.allocate_lock() if deterministic else None
    if ready is not None:
        ready.acquire()
    elements, slots = [], []
    for _ in range(n):
        try:
            element = state.pull()
        except StopIteration:
            state.exhausted = True
            marker = (_END, state.count)
            break
        except BaseException as e:   # an upstream error, passed on unchanged
            state.exhausted = True
            marker = (_ERROR, e)
            break
        slot = _Slot(state.count, ready)
        state.count += 1
        elements.append(element)
        slots.append(slot)
        if ready is not None:
            out.put(slot)
    else:
        return elements, slots, ready
    out.put(marker)                  # after this chunk's slots: in order, as the consumer expects
    return elements, slots, ready


def _map_worker(shared, state, make_call, number, stage, deterministic, lane):
    """Take tokens, pull a chunk (its indices fix its place), call on each element, publish; repeat.
    Deterministic: the chunk's slots enter ``out`` in input order when pulled and share one lock,
    released when the whole chunk is done. Otherwise each slot enters ``out`` when done, and the end
    marker carries the count to expect."""
    finish = None
    try:
        try:
            call, finish = make_call(number, shared)
        except Exception as e:  # noqa: BLE001 - e.g. a worker process that cannot start: every element fails
            def call(element, error=e):
                raise error
        produce = lane.produce if lane is not None else None
        out, lock, tokens = state.out, state.lock, state.tokens
        while _take_token(shared, tokens):
            n, want = 1, state.chunk
            while n < want:
                try:
                    tokens.get_nowait()
                    n += 1
                except queue.Empty:
                    break
            with lock:
                chunk = _pull_chunk(state, n, deterministic)
            if chunk is None:
                return
            elements, slots, ready = chunk
            began, stop = now(), shared.stop
            for slot, element in zip(slots, elements):
                if stop.is_set():        # nobody will read the rest of this chunk
                    return
                start = now()
                try:
                    slot.value = call(element)
                except RemoteCallError as e:
                    slot.error = call_failed(stage, slot.index, e.error, e.text)
                except BaseException as e:
                    slot.error = call_failed(stage, slot.index, e)
                if produce is not None:
                    produce(start, now())
                if ready is None:
                    out.put(slot)
            if ready is not None:
                ready.release()
            if slots:
                with lock:
                    state.measured(len(slots), now() - began)
            if state.exhausted and len(slots) < n:
                return
    finally:
        with state.lock:
            state.alive -= 1
            last = state.alive == 0
            if last:
                state.exhausted = True
        if last:
            close_iterator(state.source)
        if finish is not None:
            finish()
        if lane is not None:
            lane.flush()


class ParallelMapIterator(_StoppableIterator):
    """``fn`` over ``source`` in ``num_workers`` daemon threads. Input order unless
    ``deterministic=False``, which returns whatever finishes first. An error in ``fn`` raises a
    PipelineError from next(), in order.

    Chunks: handing one element from thread to thread costs tens of microseconds (a sleeping thread
    must be woken, then win the GIL), more than many map functions. So a worker takes ``c``
    consecutive elements at once, enough calls to fill about ``CHUNK_S`` by the measured mean call
    (1 for slow functions, up to ``MAX_CHUNK`` for fast ones), and publishes them together. At most
    ``2 * num_workers * c`` elements are in flight (taken from upstream, not yet returned), with
    ``c`` the largest chunk so far.

    ``make_call(i, shared) -> (call, finish)`` replaces ``fn`` per worker thread when given: thread ``i``
    calls ``call(element)`` and, when it stops, ``finish()`` (how a thread drives its worker process).
    ``recorder``/``tune``: as for PrefetchIterator; the tuner adds workers with ``grow``."""

    def __init__(self, source, fn, num_workers: int, deterministic: bool = True, stage: str = "map",
                 recorder=None, tune=None, make_call=None):
        super().__init__(_Shared(stage))
        self._stage = stage
        self._make_call = make_call or (lambda number, shared: (fn, None))
        self._deterministic = deterministic
        self._recorder = recorder
        self._state = _MapState(source)
        self._workers = 0
        self._received, self._total = 0, None
        self._owed = 0                                            # tokens not yet given back
        self._wait = recorder.waiter() if recorder is not None else None
        if self._wait is not None:
            self._shared.flush.append(self._wait)
        self._plain = self._wait is None and tune is None
        state = self._state
        self._shared.wake = lambda: [state.tokens.put(None) for _ in range(state.alive + 1)]
        self.grow(max(1, int(num_workers)))
        self._tuner = tune(self.grow, lambda: 2 * state.largest) if tune is not None else None

    def grow(self, num_workers: int) -> None:
        """Start workers until there are ``num_workers`` (each allows two more chunks in flight)."""
        state = self._state
        with state.lock:               # count them all first: the first may finish upstream at once
            if state.exhausted or self._shared.stop.is_set():
                return
            numbers = range(self._workers, max(self._workers, num_workers))
            state.alive += len(numbers)
            self._workers = state.workers = self._workers + len(numbers)
            state.add_tokens(2 * state.largest * len(numbers))
        for number in numbers:
            lane = self._recorder.producer(worker=number) if self._recorder is not None else None
            self._shared.start(_map_worker, state, self._make_call, number, self._stage, self._deterministic, lane,
                               suffix=f"-worker-{number}")
        if self._recorder is not None:
            self._recorder.parallelism = self._workers

    @property
    def num_workers(self) -> int:
        return self._workers

    def _take(self):
        """The next item of ``out``: a slot whose result is ready, or a marker."""
        item = self._state.out.get()
        if type(item) is _Slot and item.ready is not None:
            item.ready.acquire()     # the chunk's lock: released once when the chunk is done...
            item.ready.release()     # ...and left open for the chunk's other slots
        return item

    def _give_token(self):
        """Return a token for an element taken; a chunk's worth at a time, so that a worker blocked on
        the bound wakes once per chunk."""
        self._owed += 1
        if self._owed >= self._state.chunk:
            self._state.add_tokens(self._owed)
            self._owed = 0

    def __next__(self):
        while not self._done:
            if self._total is not None and self._received >= self._total:
                self.close()
                break
            if self._plain:
                item = self._take()
            else:
                fill = self._state.out.qsize()
                start = now()
                item = self._take()
                if type(item) is _Slot:
                    end = now()
                    if self._wait is not None:
                        self._wait(start, end, fill, 2 * self._workers * self._state.largest, end - start > BLOCKED_S)
                    if self._tuner is not None and item.error is None:
                        self._tuner.observe(end, end - start, item.value)
            if type(item) is _Slot:
                self._give_token()
                self._received += 1
                if item.error is not None:
                    self.close()
                    raise item.error
                return item.value
            kind, payload = item
            if kind is _ERROR:
                self.close()
                raise payload
            self._total = payload          # _END: with deterministic=False, slots may still be coming
        raise StopIteration
