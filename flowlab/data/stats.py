"""What one run of a pipeline measured: per-stage counts and times, events, AUTOTUNE's decisions.

Every iteration of a dataset (``iter(ds)``, a ``for`` loop, ``fit``) gets a ``PipelineStats`` with one
``StageRecorder`` per stage, named by kind and position from the source up: ``range#0``, ``map#1``,
``batch#2``, ``prefetch#3``. ``dataset.stats()`` returns the stats of the dataset's latest iteration.

Events (``flowlab.cluster.events.Event``; attrs always hold ``pipeline``, the run's id):

``produce``   a stage made one element. A sequential stage (batch, filter...) records its whole
              ``next()`` call, so its bars contain the bars of the stages it pulls from, like a call
              stack. A parallel map records each call of the function in its worker (attrs
              ``worker``); a prefetch records its thread pulling one element from upstream.
``wait``      the consumer of a buffered stage (a parallel map or a prefetch) had to wait for an
              element (a prefetch buffer was empty, or a map's result took more than 20 us to
              come); the event spans the wait. attrs ``fill``: elements in the buffer when it asked
              (a map's buffer holds the elements in flight, done or not), and ``capacity``. Every
              request, waited for or not, is counted in the stats.
``autotune``  AUTOTUNE changed a stage (an instant): attrs ``parameter``, ``old``, ``new``, ``reason``.

Recording is kept off the hot path: per element, a thread appends one tuple to a list of its own (no
lock). Every ``CHUNK`` elements (and when the thread stops, or when stats or events are read) the
list is folded into the stage's totals and handed to the log as ``Event`` objects, so the log's lock
and the event objects cost per chunk, not per element. ``Options.stats`` turns events, or all
counting, off.
"""
from __future__ import annotations

import html
import itertools
import threading
from typing import NamedTuple

from ..cluster.events import Event, default_log, now

__all__ = ["PipelineStats", "StageRecorder", "Decision"]

_ids = itertools.count(1)
CHUNK = 256      # events a thread buffers before handing them to the log
_new = tuple.__new__     # builds an Event without its Python-level __new__: half the cost per event


class _Lane:
    """One producing thread of a stage: its "produce" spans are appended to a buffer (one list append
    per element) and folded into its totals, and handed to the log as events, ``CHUNK`` at a time."""
    __slots__ = ("count", "seconds", "last", "buffer", "_lock", "_recorder", "_attrs")

    def __init__(self, recorder: "StageRecorder", attrs: dict):
        self.count, self.seconds, self.last = 0, 0.0, 0.0     # folded in so far
        self.buffer: list = []                                  # (start, end) not folded in yet
        self._lock = threading.Lock()
        self._recorder = recorder
        self._attrs = {**attrs, "pipeline": recorder.pipeline.id}     # shared by its events: read-only

    def produce(self, start: float, end: float) -> None:
        buffer = self.buffer
        buffer.append((start, end))
        if len(buffer) >= CHUNK:
            self.flush()

    def flush(self) -> None:
        with self._lock:                      # the owner and a reader may flush at once
            n = len(self.buffer)
            spans = self.buffer[:n]
            del self.buffer[:n]
            if not spans:
                return
            self.count += n
            self.seconds += sum([e - s for s, e in spans])
            self.last = max(self.last, spans[-1][1])
        recorder = self._recorder
        if recorder._events:
            log, name, attrs = recorder._log, recorder.name, self._attrs
            task, rank = log.task, log.rank
            log.extend([_new(Event, ("produce", name, s, e, task, rank, 0, attrs)) for s, e in spans])

    def totals(self) -> tuple:
        """(elements, seconds, last end) so far, the buffered spans included."""
        spans = list(self.buffer)
        return (self.count + len(spans), self.seconds + sum([e - s for s, e in spans]),
                max(self.last, spans[-1][1]) if spans else self.last)


class _Waiter:
    """The consumer side of a buffered stage: each request appended to a buffer, folded into totals
    ``CHUNK`` at a time, the ones that had to wait handed to the log as "wait" events."""
    __slots__ = ("requests", "wait_s", "blocked", "buffer", "_lock", "_recorder")

    def __init__(self, recorder: "StageRecorder"):
        self.requests, self.wait_s, self.blocked = 0, 0.0, 0
        self.buffer: list = []                  # (start, end, fill, capacity, blocked)
        self._lock = threading.Lock()
        self._recorder = recorder
        with recorder._lock:
            recorder._waiters.append(self)

    def __call__(self, start, end, fill, capacity, blocked) -> None:
        buffer = self.buffer
        buffer.append((start, end, fill, capacity, blocked))
        if len(buffer) >= CHUNK:
            self.flush()

    def flush(self) -> None:
        with self._lock:
            n = len(self.buffer)
            items = self.buffer[:n]
            del self.buffer[:n]
            if not items:
                return
            self.requests += n
            self.wait_s += sum([e - s for s, e, _, _, _ in items])
            self.blocked += sum([1 for item in items if item[4]])
        recorder = self._recorder
        if recorder._events:
            log, name, pipeline = recorder._log, recorder.name, recorder.pipeline.id
            task, rank = log.task, log.rank
            log.extend([_new(Event, ("wait", name, s, e, task, rank, 0,
                                     {"pipeline": pipeline, "fill": f, "capacity": c}))
                        for s, e, f, c, blocked in items if blocked])

    def totals(self) -> tuple:
        """(requests, wait seconds, blocked) so far, the buffered requests included."""
        items = list(self.buffer)
        return (self.requests + len(items), self.wait_s + sum([e - s for s, e, _, _, _ in items]),
                self.blocked + sum([1 for item in items if item[4]]))


class Decision(NamedTuple):
    """One AUTOTUNE change: when (s after the run started), which stage, what, and why."""
    time: float
    stage: str
    parameter: str       # "parallelism" or "buffer_size"
    old: int
    new: int
    reason: str

    def __repr__(self):
        return f"{self.time:7.3f}s  {self.stage} {self.parameter} {self.old} -> {self.new}: {self.reason}"


class StageRecorder:
    """The counters and event recording of one stage in one run. Each producing thread gets a lane of
    its own (``producer()``), so no lock is taken per element; the consumer side (``waiter()``) is
    one thread at a time."""

    def __init__(self, pipeline: "PipelineStats", name: str, kind: str):
        self.pipeline = pipeline
        self.name = name
        self.kind = kind
        self.counting = pipeline.counting
        self._log = pipeline.log
        self._events = pipeline.events_on
        self._producers: list[_Lane] = []      # one per producing thread
        self._waiters: list[_Waiter] = []      # one per consumer-side iterator
        self._lock = threading.Lock()
        self.parallelism = None    # workers now (parallel stages)
        self.buffer_size = None    # buffer capacity now, in elements (buffered stages)
        self.pids: list[int] = []  # worker processes started (process-pool map)
        self.decisions: list[Decision] = []

    # -- recording (hot path) -------------------------------------------------------------------
    def producer(self, **attrs) -> "_Lane | None":
        """A lane for one producing thread (``lane.produce(start, end)`` per element, ``lane.flush()``
        when the thread is done), or None if stats are off."""
        if not self.counting:
            return None
        lane = _Lane(self, attrs)
        with self._lock:
            self._producers.append(lane)
        return lane

    def waiter(self) -> "_Waiter | None":
        """A ``wait(start, end, fill, capacity, blocked)`` callable for the consumer (with a ``flush()``),
        or None if stats are off."""
        return _Waiter(self) if self.counting else None

    def decided(self, parameter: str, old: int, new: int, reason: str) -> Decision:
        """Log an AUTOTUNE change (always, whatever ``Options.stats`` says: decisions are rare)."""
        t = now()
        decision = Decision(round(t - self.pipeline.started, 6), self.name, parameter, old, new, reason)
        self.decisions.append(decision)
        self.pipeline.decisions.append(decision)
        if parameter == "parallelism":
            self.parallelism = new
        elif parameter == "buffer_size":
            self.buffer_size = new
        self.pipeline.log.record("autotune", self.name, t, t, pipeline=self.pipeline.id, parameter=parameter,
                                 old=old, new=new, reason=reason)
        return decision

    # -- reading ------------------------------------------------------------------------------------
    def _produced(self) -> tuple:
        totals = [lane.totals() for lane in list(self._producers)]
        return (sum(t[0] for t in totals), sum(t[1] for t in totals), max((t[2] for t in totals), default=0.0))

    def _waited(self) -> tuple:
        totals = [waiter.totals() for waiter in list(self._waiters)]
        return tuple(sum(t[i] for t in totals) for i in range(3))

    @property
    def elements(self) -> int:
        """Elements this stage made so far."""
        return self._produced()[0]

    @property
    def produce_s(self) -> float:
        """Time spent making them (summed over its threads)."""
        return self._produced()[1]

    @property
    def requests(self) -> int:
        """Elements its consumer took from it (buffered stages: a parallel map, a prefetch)."""
        return self._waited()[0]

    @property
    def wait_s(self) -> float:
        """Time its consumer spent waiting for them."""
        return self._waited()[1]

    @property
    def blocked(self) -> int:
        """Requests that found their element not ready yet."""
        return self._waited()[2]

    def flush(self) -> None:
        """Hand every buffered event of this stage to the log."""
        for lane in list(self._producers):
            lane.flush()
        for waiter in list(self._waiters):
            waiter.flush()

    def snapshot(self) -> dict:
        """The stage's numbers now, as a JSON-safe dict."""
        elements, produce_s, last = self._produced()
        requests, wait_s, blocked = self._waited()
        span = last - self.pipeline.started
        return {"name": self.name, "kind": self.kind, "elements": elements, "produce_s": produce_s,
                "requests": requests, "wait_s": wait_s, "blocked": blocked,
                "throughput": elements / span if elements and span > 0 else 0.0,
                "parallelism": self.parallelism, "buffer_size": self.buffer_size, "pids": list(self.pids),
                "autotune": [d._asdict() for d in self.decisions]}

    def __repr__(self):
        s = self.snapshot()
        return (f"<stage {self.name}: {s['elements']} elements, produce {s['produce_s']:.3f} s, "
                f"wait {s['wait_s']:.3f} s>")


class PipelineStats:
    """The stats of one run of a pipeline: ``id``, ``started`` (its ``perf_counter`` time), ``stages``
    (source first), ``decisions`` (AUTOTUNE's, in order), ``stage(name)``, ``events()`` and
    ``snapshot()``. It prints as a table."""

    def __init__(self, stage_names, counting: bool = True, events: bool = True, log=None):
        self.id = next(_ids)
        self.log = log if log is not None else default_log()
        self.counting = bool(counting)
        self.events_on = bool(counting and events)
        self.started = now()
        self.decisions: list[Decision] = []
        self.stages = [StageRecorder(self, name, kind) for name, kind in stage_names]
        self._by_name = {s.name: s for s in self.stages}

    def stage(self, name: str) -> StageRecorder:
        """The recorder of stage ``name`` (e.g. "map#1")."""
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"no stage {name!r} in this pipeline; stages: {', '.join(self._by_name)}") from None

    def __getitem__(self, name: str) -> dict:
        return self.stage(name).snapshot()

    def flush(self) -> None:
        """Hand the events still buffered by running stages to the log (``events()`` does it)."""
        for stage in self.stages:
            stage.flush()

    def events(self, kind: str | None = None) -> list:
        """This run's events still held by the log (a bounded ring: the oldest may have fallen off), in
        the order they reached it: each thread hands its events over in chunks, so sort by ``start``
        if you need time order."""
        self.flush()
        pid = self.id
        return [e for e in self.log.events(kind=kind, since=self.started)
                if e.attrs is not None and e.attrs.get("pipeline") == pid]

    def snapshot(self) -> dict:
        """JSON-safe: ``{"pipeline", "seconds", "stages": [...], "autotune": [...]}``."""
        return {"pipeline": self.id, "seconds": now() - self.started,
                "stages": [s.snapshot() for s in self.stages],
                "autotune": [d._asdict() for d in self.decisions]}

    def _rows(self):
        head = ("stage", "elements", "produce s", "wait s", "blocked", "elements/s", "workers", "buffer")
        rows = []
        for s in (st.snapshot() for st in self.stages):
            buffered = s["requests"] > 0
            rows.append((s["name"], str(s["elements"]), f"{s['produce_s']:.3f}",
                         f"{s['wait_s']:.3f}" if buffered else "-", str(s["blocked"]) if buffered else "-",
                         f"{s['throughput']:.1f}", "-" if s["parallelism"] is None else str(s["parallelism"]),
                         "-" if s["buffer_size"] is None else str(s["buffer_size"])))
        return head, rows

    def __repr__(self):
        head, rows = self._rows()
        widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
        fmt = lambda r: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
        lines = [f"pipeline {self.id}: {len(self.stages)} stages, {now() - self.started:.3f} s since it started"
                 + ("" if self.counting else " (stats off: Options.stats.enabled is False)"),
                 fmt(head), *map(fmt, rows)]
        if self.decisions:
            lines.append(f"autotune ({len(self.decisions)} decisions):")
            lines += [f"  {d!r}" for d in self.decisions]
        return "\n".join(lines)

    def _repr_html_(self):
        head, rows = self._rows()
        cell = lambda tag, c: f"<{tag}>{html.escape(c)}</{tag}>"
        table = ("<table><tr>" + "".join(cell("th", h) for h in head) + "</tr>"
                 + "".join("<tr>" + "".join(cell("td", c) for c in r) + "</tr>" for r in rows) + "</table>")
        decisions = "".join(f"<li>{html.escape(repr(d))}</li>" for d in self.decisions)
        return (f"<div><b>pipeline {self.id}</b>{table}"
                + (f"<details><summary>autotune: {len(self.decisions)} decisions</summary><ul>{decisions}</ul>"
                   "</details>" if decisions else "") + "</div>")
