"""What one run of a pipeline measured: per-stage counts and times, events, AUTOTUNE's decisions.

Every iteration of a dataset (``iter(ds)``, a ``for`` loop, ``fit``) gets a ``PipelineStats`` with one
``StageRecorder`` per stage, named by kind and position from the source up: ``range#0``, ``map#1``,
``batch#2``, ``prefetch#3``. ``dataset.stats()`` returns the stats of the dataset's latest iteration.

Events (``flowlab.core.events.Event``; attrs always hold ``pipeline``, the run's id):

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

Over time: the same fold adds each element to a stage's ``_Series``, a bounded histogram of the run
(at most ``BUCKETS`` buckets; when the run outgrows them, neighbours merge and each covers twice the
time): elements made, and for a buffered stage its consumer's requests, time waited and the
buffer's fill (elements ready when it asked) against its capacity. ``snapshot()`` carries them, on
one bucket width for all stages, so the pipeline observatory (``flowlab.widgets.pipeline``) draws
throughput, waiting and buffer fill over time, live while the pipeline runs: a thread that stops
calls ``flush()`` on its lane or waiter, and once every one of the last stage's has, the run is
``finished``.
"""
from __future__ import annotations

import bisect
import html
import itertools
import threading
from typing import NamedTuple

from ..core.events import Event, default_log, now

__all__ = ["PipelineStats", "StageRecorder", "Decision"]

_ids = itertools.count(1)
CHUNK = 256      # events a thread buffers before handing them to the log
_new = tuple.__new__     # builds an Event without its Python-level __new__: half the cost per event
BUCKETS = 64     # the most time buckets a stage's series holds
BUCKET_S = 0.01  # a bucket's first width, in seconds (doubles each time the run outgrows the buckets)


class _Series:
    """Sums per time bucket since ``t0``: ``elements`` (made), ``requests``, ``wait_s``, ``fill``
    (summed over requests) and ``capacity`` (the largest seen). Bounded: ``BUCKETS`` buckets."""
    __slots__ = ("t0", "width", "elements", "requests", "wait_s", "fill", "capacity")

    def __init__(self, t0: float, width: float = BUCKET_S):
        self.t0, self.width = t0, width
        self.elements = [0] * BUCKETS
        self.requests = [0] * BUCKETS
        self.wait_s = [0.0] * BUCKETS
        self.fill = [0] * BUCKETS
        self.capacity = [0] * BUCKETS

    def copy(self) -> "_Series":
        new = _Series(self.t0, self.width)
        for name in ("elements", "requests", "wait_s", "fill", "capacity"):
            setattr(new, name, list(getattr(self, name)))
        return new

    def coarsen(self) -> None:
        """Merge neighbouring buckets: each now covers twice the time."""
        half = BUCKETS // 2
        for name in ("elements", "requests", "wait_s", "fill"):
            old = getattr(self, name)
            setattr(self, name, [old[2 * i] + old[2 * i + 1] for i in range(half)] + [0] * half)
        old = self.capacity
        self.capacity = [max(old[2 * i], old[2 * i + 1]) for i in range(half)] + [0] * half
        self.width *= 2

    def _fit(self, last: float) -> None:
        while last - self.t0 >= BUCKETS * self.width:
            self.coarsen()

    def _bounds(self, ends: list):
        """(bucket, lo, hi) for each bucket the sorted ``ends`` fall in: ``ends[lo:hi]`` are in it.
        A chunk of a thread's elements usually falls in one or two buckets, so this costs a list
        and a few bisections per chunk, not a division per element. Call ``_fit`` first."""
        t0, w = self.t0, self.width
        first = max(0, int((ends[0] - t0) / w))
        final = min(BUCKETS - 1, max(0, int((ends[-1] - t0) / w)))
        lo = 0
        for b in range(first, final):
            hi = bisect.bisect_left(ends, t0 + (b + 1) * w, lo)
            if hi > lo:
                yield b, lo, hi
                lo = hi
        if lo < len(ends):
            yield final, lo, len(ends)

    def add_spans(self, spans, ordered: bool = True) -> None:
        """Elements made: (start, end) spans, counted in the bucket of their end (``ordered``: by end)."""
        ends = [e for _, e in spans]
        if not ordered:
            ends.sort()
        self._fit(ends[-1])
        counts = self.elements
        for b, lo, hi in self._bounds(ends):
            counts[b] += hi - lo

    def add_requests(self, items, ordered: bool = True) -> None:
        """A consumer's requests: (start, end, fill, capacity, blocked), in the bucket of their end."""
        if not ordered:
            items = sorted(items, key=lambda item: item[1])
        self._fit(items[-1][1])
        requests, wait_s, fill, capacity = self.requests, self.wait_s, self.fill, self.capacity
        for b, lo, hi in self._bounds([item[1] for item in items]):
            part = items[lo:hi]
            requests[b] += hi - lo
            wait_s[b] += sum([e - s for s, e, _, _, _ in part])
            fill[b] += sum([item[2] for item in part])
            capacity[b] = max(capacity[b], part[0][3], part[-1][3])      # capacities only grow


class _Lane:
    """One producing thread of a stage: its "produce" spans are appended to a buffer (one list append
    per element) and folded into its totals, and handed to the log as events, ``CHUNK`` at a time."""
    __slots__ = ("count", "seconds", "last", "buffer", "done", "_lock", "_recorder", "_attrs")

    def __init__(self, recorder: "StageRecorder", attrs: dict):
        self.count, self.seconds, self.last = 0, 0.0, 0.0     # folded in so far
        self.buffer: list = []                                  # (start, end) not folded in yet
        self.done = False                                       # its thread has stopped (called flush)
        self._lock = threading.Lock()
        self._recorder = recorder
        self._attrs = {**attrs, "pipeline": recorder.pipeline.id}     # shared by its events: read-only

    def produce(self, start: float, end: float) -> None:
        buffer = self.buffer
        buffer.append((start, end))
        if len(buffer) >= CHUNK:
            self.fold()

    def flush(self) -> None:
        """The producing thread is done: fold in what is left."""
        self.done = True
        self.fold()
        self._recorder.pipeline._check_finished()

    def fold(self) -> None:
        with self._lock:                      # the owner and a reader may fold at once
            n = len(self.buffer)
            spans = self.buffer[:n]
            del self.buffer[:n]
            if not spans:
                return
            self.count += n
            self.seconds += sum([e - s for s, e in spans])
            self.last = max(self.last, spans[-1][1])
            recorder = self._recorder
            with recorder._lock:              # inside: a reader never misses spans between the two
                recorder._series.add_spans(spans)
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
    __slots__ = ("requests", "wait_s", "blocked", "buffer", "done", "_lock", "_recorder")

    def __init__(self, recorder: "StageRecorder"):
        self.requests, self.wait_s, self.blocked = 0, 0.0, 0
        self.buffer: list = []                  # (start, end, fill, capacity, blocked)
        self.done = False                       # its iterator has closed (called flush)
        self._lock = threading.Lock()
        self._recorder = recorder
        with recorder._lock:
            recorder._waiters.append(self)

    def __call__(self, start, end, fill, capacity, blocked) -> None:
        buffer = self.buffer
        buffer.append((start, end, fill, capacity, blocked))
        if len(buffer) >= CHUNK:
            self.fold()

    def flush(self) -> None:
        """The consumer's iterator is closed: fold in what is left."""
        self.done = True
        self.fold()
        self._recorder.pipeline._check_finished()

    def fold(self) -> None:
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
            with recorder._lock:
                recorder._series.add_requests(items)
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
        self._series = _Series(pipeline.started)   # folded chunks over time (under _lock)
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
        """Hand every buffered event of this stage to the log (the threads keep running)."""
        for lane in list(self._producers):
            lane.fold()
        for waiter in list(self._waiters):
            waiter.fold()

    @property
    def finished(self) -> bool:
        """Every thread of this stage (producers, consumer) has stopped."""
        parts = list(self._producers) + list(self._waiters)
        return bool(parts) and all(p.done for p in parts)

    def series(self) -> _Series:
        """This stage's series so far, the elements still buffered by its threads included (a copy)."""
        with self._lock:
            series = self._series.copy()
        spans = [span for lane in list(self._producers) for span in list(lane.buffer)]
        if spans:
            series.add_spans(spans, ordered=False)
        items = [item for waiter in list(self._waiters) for item in list(waiter.buffer)]
        if items:
            series.add_requests(items, ordered=False)
        return series

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
    ``snapshot()``. It prints as a table; in a notebook it is the pipeline observatory, a live
    widget (``flowlab.widgets.pipeline``) that follows the run until it finishes, with a static
    picture of each stage over time as its HTML."""

    _view = "flowlab.widgets.pipeline:PipelineView"

    def __init__(self, stage_names, counting: bool = True, events: bool = True, log=None):
        self.id = next(_ids)
        self.log = log if log is not None else default_log()
        self.counting = bool(counting)
        self.events_on = bool(counting and events)
        self.started = now()
        self.decisions: list[Decision] = []
        self._on_finish: list = []            # callbacks for when the run finishes (a live view)
        self._notified = False
        self._finish_lock = threading.Lock()
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

    @property
    def finished(self) -> bool:
        """The run is over: every thread of its last stage has stopped (or nothing is counted)."""
        if not self.counting or not self.stages:
            return True
        return self.stages[-1].finished

    def when_finished(self, callback) -> None:
        """Call ``callback()`` once the run has finished (now, if it has), on the thread that stopped
        last; a callback that raises is dropped."""
        with self._finish_lock:
            if not self._notified and not self.finished:
                self._on_finish.append(callback)
                return
        callback()

    def _check_finished(self) -> None:
        if not self.finished:
            return
        with self._finish_lock:
            if self._notified:
                return
            self._notified = True
            callbacks, self._on_finish = self._on_finish, []
        for callback in callbacks:
            try:
                callback()
            except Exception:   # noqa: BLE001 - a view must never break the pipeline
                pass

    def snapshot(self) -> dict:
        """JSON-safe: ``{"pipeline", "seconds", "running", "closed", "stages": [...], "autotune": [...],
        "bucket_s"}``. Each stage also has ``series``: per time bucket (``bucket_s`` seconds each,
        from the start of the run) ``elements`` made, and for a buffered stage its consumer's
        ``requests``, ``wait_s``, mean ``fill`` (None where it asked nothing) and ``capacity``.
        ``seconds``: from the start to the latest element made (or AUTOTUNE decision), so an idle run
        is not re-sent; ``closed`` (= finished): a live view stops re-reading."""
        finished = self.finished
        stages = [(st._produced()[2], st.snapshot(), st.series()) for st in self.stages]
        width = max((series.width for _, _, series in stages), default=BUCKET_S)
        for _, _, series in stages:
            while series.width < width:
                series.coarsen()
        last = max([t for t, _, _ in stages] + [d.time + self.started for d in self.decisions] + [self.started])
        seconds = last - self.started        # to the latest element: an idle run's snapshot stays the same
        n = min(BUCKETS, max(1, int(seconds / width) + 1))
        out = []
        for _, snap_, series in stages:
            requests = series.requests[:n]
            snap_["series"] = {"elements": series.elements[:n]}
            if any(requests) or snap_["requests"]:
                snap_["series"].update(
                    requests=requests, wait_s=[round(w, 6) for w in series.wait_s[:n]],
                    fill=[round(f / r, 3) if r else None for f, r in zip(series.fill[:n], requests)],
                    capacity=series.capacity[:n])
            out.append(snap_)
        return {"pipeline": self.id, "seconds": seconds, "running": not finished, "closed": finished,
                "counting": self.counting, "bucket_s": width, "stages": out,
                "autotune": [d._asdict() for d in self.decisions]}

    def _repr_mimebundle_(self, include=None, exclude=None):
        from .._display import mimebundle
        return mimebundle(self, include, exclude)

    def _ipython_display_(self):
        """In a kernel: the live view, displayed with a display id so that it can show the finished
        run once it ends (IPython calls this only where IPython is loaded)."""
        from IPython.display import display

        from .._display import in_kernel, view
        live = None
        if in_kernel():
            try:
                live = view(self)
            except ImportError:       # no widget library: the text and the static picture
                live = None
        if live is not None and hasattr(live, "_ipython_display_"):
            live._ipython_display_()
            return
        display({"text/plain": repr(self), "text/html": self._repr_html_()}, raw=True)

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
        if self.counting and self.finished:
            last = max([st._produced()[2] for st in self.stages] + [self.started])
            when = f"finished after {last - self.started:.3f} s"
        else:
            when = f"{now() - self.started:.3f} s since it started"
        lines = [f"pipeline {self.id}: {len(self.stages)} stages, {when}"
                 + ("" if self.counting else " (stats off: Options.stats.enabled is False)"),
                 fmt(head), *map(fmt, rows)]
        if self.decisions:
            lines.append(f"autotune ({len(self.decisions)} decisions):")
            lines += [f"  {d!r}" for d in self.decisions]
        return "\n".join(lines)

    def _repr_html_(self):
        """A static picture of the run (each stage over time, as the live view draws it), the table,
        and AUTOTUNE's decisions."""
        head, rows = self._rows()
        cell = lambda tag, c: f"<{tag}>{html.escape(c)}</{tag}>"  # noqa: E731
        table = ("<table><tr>" + "".join(cell("th", h) for h in head) + "</tr>"
                 + "".join("<tr>" + "".join(cell("td", c) for c in r) + "</tr>" for r in rows) + "</table>")
        decisions = "".join(f"<li>{html.escape(repr(d))}</li>" for d in self.decisions)
        return (f"<div><div><b>pipeline {self.id}</b></div><div>{observatory_svg(self.snapshot())}</div>{table}"
                + (f"<details open><summary>autotune: {len(self.decisions)} decisions</summary><ul>{decisions}"
                   "</ul></details>" if decisions else "") + "</div>")


def observatory_svg(snap: dict, width: int = 780) -> str:
    """Each stage of a ``PipelineStats.snapshot()`` as one row of an SVG: its name and elements/s,
    elements made per time bucket (bars), its consumer's wait, and its buffer's mean fill against its
    capacity; AUTOTUNE's decisions as dashed marks on the stage's bars."""
    stages = snap["stages"]
    if not stages:
        return ""
    row_h, name_w, chart_w, gap = 40, 150, 250, 14
    fill_x = name_w + chart_w + gap + 150
    bucket = snap["bucket_s"] or BUCKET_S
    esc = html.escape
    height = row_h * len(stages) + 18
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="fl-pipeline-static" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="10">',
           f'<text x="{name_w}" y="10" fill="#777">elements made over time (one bar = {bucket * 1e3:g} ms)</text>',
           f'<text x="{name_w + chart_w + gap}" y="10" fill="#777">consumer waited</text>',
           f'<text x="{fill_x}" y="10" fill="#777">buffer: ready when asked / capacity</text>']
    for k, st in enumerate(stages):
        y0 = 16 + k * row_h
        series = st["series"]
        out.append(f'<line x1="0" x2="{width}" y1="{y0}" y2="{y0}" stroke="#e0e0e0"/>')
        out.append(f'<text x="0" y="{y0 + 14}" font-weight="bold" font-size="11">{esc(st["name"])}</text>')
        out.append(f'<text x="0" y="{y0 + 28}" fill="#555">{st["throughput"]:,.1f} elements/s, '
                   f'{st["elements"]:,}</text>')
        counts = series["elements"]
        top = max(counts) or 1
        bw = chart_w / max(len(counts), 1)
        for i, c in enumerate(counts):
            if c:
                bh = max(1.0, (row_h - 10) * c / top)
                out.append(f'<rect x="{name_w + i * bw:.1f}" y="{y0 + row_h - 4 - bh:.1f}" '
                           f'width="{max(bw - 0.5, 0.5):.1f}" height="{bh:.1f}" fill="#4e79a7"/>')
        for d in st["autotune"]:
            x = name_w + min(chart_w - 1, d["time"] / bucket * bw)
            out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y0 + 2}" y2="{y0 + row_h - 4}" stroke="#f28e2b" '
                       f'stroke-width="1.5" stroke-dasharray="3 2"><title>{esc(repr(Decision(**d)))}</title></line>')
        wx = name_w + chart_w + gap
        if "requests" in series:
            share = min(1.0, st["wait_s"] / snap["seconds"]) if snap["seconds"] > 0 else 0.0
            out.append(f'<rect x="{wx}" y="{y0 + 8}" width="130" height="8" fill="#e4e4e4"/>'
                       f'<rect x="{wx}" y="{y0 + 8}" width="{130 * share:.1f}" height="8" fill="#e15759"/>'
                       f'<text x="{wx}" y="{y0 + 30}" fill="#555">{st["wait_s"]:.3f} s ({share:.0%}), '
                       f'{st["blocked"]}/{st["requests"]} blocked</text>')
            fill, cap = series["fill"], series["capacity"]
            peak = max([1] + [c for c in cap if c] + [f for f in fill if f is not None])
            fw = (width - fill_x) / max(len(fill), 1)
            y = lambda v: y0 + row_h - 4 - (row_h - 10) * v / peak  # noqa: E731
            for i, f in enumerate(fill):
                if f is not None:
                    out.append(f'<rect x="{fill_x + i * fw:.1f}" y="{y(f):.1f}" width="{max(fw - 0.5, 0.5):.1f}" '
                               f'height="{y(0) - y(f):.1f}" fill="#76b7b2"/>')
            pts = " ".join(f"{fill_x + i * fw:.1f},{y(c):.1f} {fill_x + (i + 1) * fw:.1f},{y(c):.1f}"
                           for i, c in enumerate(cap) if c)
            if pts:
                out.append(f'<polyline points="{pts}" fill="none" stroke="#b07aa1" stroke-width="1.2"/>')
        else:
            out.append(f'<text x="{wx}" y="{y0 + 18}" fill="#999">sequential stage</text>')
    out.append("</svg>")
    return "".join(out)
