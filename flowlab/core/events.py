"""The event log: every op, send, receive, reduction step and pipeline stage leaves one event.

It lives in core, below everything that records into it (ops, pipelines, collectives); the
cluster's view of it is :mod:`flowlab.cluster.events`. An event is a small named tuple; a log is a
bounded ring (old events fall off the front and are counted in ``dropped``). Times are
``time.perf_counter()`` seconds: the host's monotonic clock, so events from processes on one host
line up on one timeline.

>>> log = EventLog(task="/job:worker/task:0")
>>> with log.span("op", "matmul", bytes=64):
...     pass
>>> [(e.kind, e.name, e.bytes, e.task) for e in log.events()]
[('op', 'matmul', 64, '/job:worker/task:0')]
"""
from __future__ import annotations

import collections
import threading
import time
from typing import Any, Iterable, NamedTuple

__all__ = ["Event", "EventLog", "default_log", "now", "set_trace_exporter"]

now = time.perf_counter   # the clock every event uses


class Event(NamedTuple):
    """One thing that happened: ``kind`` (send, recv, op, reduce, produce, wait...), ``name`` (the op,
    stage or collective), ``start``/``end`` in ``perf_counter`` seconds, where (``task``, ``rank``),
    how many ``bytes`` moved, and any other ``attrs`` (peer, chunk, buffer fill...)."""
    kind: str
    name: str
    start: float
    end: float
    task: str = "local"
    rank: int | None = None
    bytes: int = 0
    attrs: dict | None = None

    @property
    def duration(self) -> float:
        return self.end - self.start

    def to_dict(self) -> dict:
        """A JSON-safe dict (for ``snapshot()`` and for shipping a remote log to the client)."""
        d = self._asdict()
        if d["attrs"] is None:
            del d["attrs"]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Event":
        return cls(d["kind"], d["name"], float(d["start"]), float(d["end"]), d.get("task", "local"),
                   d.get("rank"), int(d.get("bytes", 0)), d.get("attrs"))


class _Span:
    __slots__ = ("log", "kind", "name", "fields", "start")

    def __init__(self, log, kind, name, fields):
        self.log, self.kind, self.name, self.fields = log, kind, name, fields

    def __enter__(self):
        self.start = now()
        return self

    def __exit__(self, *exc):
        self.log.record(self.kind, self.name, self.start, now(), **self.fields)
        return False


class EventLog:
    """A thread-safe bounded log of :class:`Event` s. ``record`` is cheap (one tuple, one deque
    append), so hot paths may call it per element; ``record_fields`` is cheaper still (the
    :class:`Event` is built only when someone reads the log); ``enabled = False`` turns recording
    off."""

    def __init__(self, maxlen: int = 65536, task: str = "local", rank: int | None = None):
        self._events: collections.deque = collections.deque(maxlen=maxlen)
        self._lock = threading.Lock()
        self.maxlen = maxlen
        self.task = task
        self.rank = rank
        self.enabled = True
        self.dropped = 0

    def record(self, kind: str, name: str, start: float, end: float, *, bytes: int = 0,
               task: str | None = None, rank: int | None = None, **attrs: Any) -> Event | None:
        if not self.enabled:
            return None
        ev = Event(kind, name, start, end, self.task if task is None else task,
                   self.rank if rank is None else rank, bytes, attrs or None)
        with self._lock:
            if len(self._events) == self.maxlen:
                self.dropped += 1
            self._events.append(ev)
        return ev

    def record_fields(self, kind: str, name: str, start: float, end: float, bytes: int, rank,
                      keys: tuple, values: tuple) -> None:
        """Record an event whose ``attrs`` are ``dict(zip(keys, values))``, for hot paths: only a
        plain tuple is stored, and the :class:`Event` is made when the log is read (``keys`` is
        meant to be one constant tuple per call site)."""
        if self.enabled:
            raw = (kind, name, start, end, self.task, self.rank if rank is None else rank, bytes, keys, values)
            with self._lock:
                if len(self._events) == self.maxlen:
                    self.dropped += 1
                self._events.append(raw)

    def span(self, kind: str, name: str, **fields: Any) -> _Span:
        """``with log.span("op", "matmul"):`` records one event covering the block."""
        return _Span(self, kind, name, fields)

    def extend(self, events: Iterable[Event | dict]) -> None:
        """Merge events from elsewhere (a remote task's log, as events or dicts)."""
        evs = [e if isinstance(e, Event) else Event.from_dict(e) for e in events]
        with self._lock:
            over = len(self._events) + len(evs) - self.maxlen
            if over > 0:
                self.dropped += over
            self._events.extend(evs)

    def events(self, kind: str | None = None, name: str | None = None, since: float | None = None) -> list[Event]:
        """The events held now, oldest first, optionally only one ``kind``/``name`` or those ending
        after ``since``."""
        with self._lock:
            evs = list(self._events)
        evs = [e if type(e) is Event else _build(e) for e in evs]
        return [e for e in evs if (kind is None or e.kind == kind) and (name is None or e.name == name)
                and (since is None or e.end >= since)]

    def export_trace(self, path, **kwargs):
        """Write the events held now as Chrome trace JSON, for https://ui.perfetto.dev or
        chrome://tracing (:func:`flowlab.cluster.trace.export_trace`); returns what was written."""
        if _exporter is None:
            raise RuntimeError("EventLog.export_trace needs the trace writer of flowlab.cluster: "
                               "import flowlab.cluster first")
        return _exporter(self.events(), path, **kwargs)

    def clear(self) -> None:
        with self._lock:
            self._events.clear()
            self.dropped = 0

    def __len__(self) -> int:
        return len(self._events)

    def __bool__(self) -> bool:   # an empty log is still a log (``log or default_log()`` keeps it)
        return True

    def __repr__(self) -> str:
        return f"<EventLog task={self.task!r} events={len(self)} dropped={self.dropped}>"


def _build(raw: tuple) -> Event:
    kind, name, start, end, task, rank, nbytes, keys, values = raw
    return Event(kind, name, start, end, task, rank, nbytes, dict(zip(keys, values)) or None)


_default = EventLog()
_exporter = None   # export_trace(events, path, **kwargs), registered by flowlab.cluster.events


def default_log() -> EventLog:
    """The process's own log: what this process did (a worker's remote ops, a pipeline's stages)."""
    return _default


def set_trace_exporter(fn) -> None:
    """Hook: the function ``EventLog.export_trace`` writes with (the cluster registers its Chrome
    trace writer when it is imported)."""
    global _exporter
    _exporter = fn
