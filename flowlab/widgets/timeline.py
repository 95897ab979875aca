"""Timelines drawn from the event log: one row per rank (or task), one bar per send, receive and
reduction, and an arrow from each send to the receive that took its message.

Everything drawn is a real event (``flowlab.cluster.events``): a LocalGroup's ``group.events``,
a LocalCluster's ``cluster.events()`` or any list of :class:`~flowlab.cluster.events.Event`.

>>> from flowlab.cluster.collectives import LocalGroup, allreduce
>>> from flowlab.widgets.timeline import rows, plot_timeline
>>> with LocalGroup(2) as group:
...     _ = group.run(lambda comm: allreduce([1.0, 2.0]))
>>> {rank: [e.kind for e in evs] for rank, evs in rows(group.events.events(), kinds=("send",)).items()}
{0: ['send', 'send'], 1: ['send', 'send']}

:class:`Timeline` is the same record as a notebook widget (``flowlab.widgets.timeline_view``):
one lane per rank or task and thread, for ops, collectives, sends, receives, reductions and an
input pipeline's stages; zoom, pan, hover and an arrow from each send to its receive; a static SVG
of the whole run as its HTML (what GitHub shows); ``export_trace(path)`` for Perfetto.

>>> tl = Timeline.from_(group)
>>> tl
<Timeline: 12 events (collective 2, send 4, recv 4, reduce 2) on rank 0, rank 1>
>>> [lane["process"] for lane in tl.snapshot()["lanes"]]
['rank 0', 'rank 1']

matplotlib is imported inside :func:`plot_timeline` only, so importing this module (or flowlab)
never imports it, nor does it import any widget library.
"""
from __future__ import annotations

import html as _html
import math

from ..cluster import trace as _trace

__all__ = ["KINDS", "COLORS", "KIND_COLOURS", "rows", "messages", "plot_timeline", "Timeline"]

KINDS = ("send", "recv", "reduce", "copy")   # copy: host <-> GPU, by the copy rule (core/backends)
COLORS = {"send": "tab:blue", "recv": "tab:orange", "reduce": "tab:green", "copy": "tab:purple"}
_LABELS = {"send": "send", "recv": "recv (waiting included)", "reduce": "reduce", "copy": "copy host <-> GPU"}
_UNITS = {"s": 1.0, "ms": 1e3, "us": 1e6}


def _row_key(e):
    return e.rank if e.rank is not None else e.task


def _sort_key(key):
    return (0, key, "") if isinstance(key, int) else (1, 0, str(key))


def rows(events, kinds=KINDS, seq=None) -> dict:
    """The events of the given ``kinds`` grouped by rank (or by task for events without a rank),
    rows in rank order, each row in start order. ``seq``: keep only that collective call
    (the ``seq`` attribute that every collective event carries)."""
    out: dict = {}
    for e in events:
        if e.kind not in kinds:
            continue
        if seq is not None and (e.attrs or {}).get("seq") != seq:
            continue
        out.setdefault(_row_key(e), []).append(e)
    return {k: sorted(out[k], key=lambda e: e.start) for k in sorted(out, key=_sort_key)}


def messages(events) -> list:
    """``(send, recv)`` pairs: each send event with the receive event that took its message
    (matched on call, sender, receiver, step, chunk and part). Sends nobody received are left out.
    (:func:`flowlab.cluster.trace.messages`, which the trace export draws as flows.)"""
    return _trace.messages(list(events))


def plot_timeline(events, ax=None, kinds=KINDS, seq=None, arrows: bool = True, unit: str = "ms",
                  title: str | None = None):
    """Draw ``events`` on ``ax`` (a new figure when None): a row per rank, rank 0 on top, a bar per
    event of ``kinds`` (send blue, recv orange, reduce green), and with ``arrows`` a grey arrow
    from each send to the receive that took its message. Time runs from the first bar, in
    ``unit`` ("s", "ms" or "us"). Returns the Axes.

    A recv bar starts when the rank began waiting for the message, so it shows waiting time too.
    """
    if unit not in _UNITS:
        raise ValueError(f"unit must be one of {sorted(_UNITS)}, got {unit!r}")
    events = list(events)
    by_row = rows(events, kinds, seq)
    if ax is None:
        import matplotlib.pyplot as plt
        _, ax = plt.subplots(figsize=(9, 0.5 + 0.55 * max(1, len(by_row))))
    scale = _UNITS[unit]
    shown = [e for evs in by_row.values() for e in evs]
    t0 = min((e.start for e in shown), default=0.0)
    y = {key: i for i, key in enumerate(by_row)}
    for kind in kinds:
        ys, lefts, widths = [], [], []
        for key, evs in by_row.items():
            for e in evs:
                if e.kind == kind:
                    ys.append(y[key])
                    lefts.append((e.start - t0) * scale)
                    widths.append(max(e.end - e.start, 0.0) * scale)
        if ys:
            ax.barh(ys, widths, left=lefts, height=0.6, color=COLORS.get(kind, "tab:gray"),
                    alpha=0.55 if kind == "recv" else 0.9, label=_LABELS.get(kind, kind),
                    edgecolor="none")
    if arrows and "send" in kinds and "recv" in kinds:
        for snd, rcv in messages(shown):
            ax.annotate("", xy=((rcv.end - t0) * scale, y[_row_key(rcv)]),
                        xytext=((snd.start - t0) * scale, y[_row_key(snd)]),
                        arrowprops=dict(arrowstyle="->", color="0.35", lw=0.6, shrinkA=0, shrinkB=0))
    ax.set_yticks(range(len(by_row)))
    ax.set_yticklabels([f"rank {k}" if isinstance(k, int) else str(k) for k in by_row])
    ax.set_ylim(max(len(by_row), 1) - 0.5, -0.5)      # rank 0 on top
    ax.set_xlabel(f"time ({'µs' if unit == 'us' else unit})")
    if title:
        ax.set_title(title)
    if shown:
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small", frameon=False)
    return ax


# -- the widget's record ---------------------------------------------------------------------------
KIND_COLOURS = {"op": "#76b7b2", "collective": "#bab0ac", "send": "#4e79a7", "recv": "#f28e2b",
                "reduce": "#59a14f", "produce": "#b07aa1", "wait": "#e15759", "step": "#edc948",
                "fault": "#c62828", "autotune": "#2e7d32", "copy": "#8e44ad"}
_OTHER_COLOUR = "#9c755f"
_KIND_ORDER = ("op", "step", "collective", "send", "recv", "reduce", "copy", "produce", "wait", "autotune", "fault")


def _r(t: float) -> float:
    return round(t, 7)         # 0.1 µs: what a snapshot carries


class Timeline:
    """A run's events as lanes of bars: one lane per rank (a LocalGroup), task (a LocalCluster) or
    input pipeline stage, and per thread within it; a bar per event, nested bars (a collective's
    sends inside the collective) one row deeper, an arrow from each send to its receive.

    ``Timeline(events)`` or ``Timeline.from_(group_or_cluster_or_stats)``. In a notebook it shows as
    a widget (wheel to zoom, drag to pan, hover a bar, double-click to see everything); elsewhere as
    text and a static SVG. :meth:`snapshot` stays bounded: bars shorter than a pixel that touch are
    merged (and counted) until at most ``max_bars`` are left, for the whole run or for a zoomed
    window (``snapshot(window=(t0, t1))``, in seconds from the first event)."""

    _view = "flowlab.widgets.timeline_view:TimelineView"
    WIDTH = 1000          # pixels a snapshot is decimated for
    MAX_BARS = 2000
    MAX_ARROWS = 500

    def __init__(self, events, title: str | None = None, kinds=None):
        evs = _trace.events_of(events)
        if kinds is not None:
            evs = [e for e in evs if e.kind in kinds]
        self.events = sorted(evs, key=lambda e: e.start)
        self.title = title
        self.origin = self.events[0].start if self.events else 0.0
        self.span = max((e.end for e in self.events), default=self.origin) - self.origin
        placed = _trace.layout(self.events, self.origin)
        lanes: dict = {}
        for p in placed:
            key = (p.process, p.lane, p.thread)
            lanes[key] = max(lanes.get(key, 0), p.depth + 1)
        self._lane_index = {key: i for i, key in enumerate(lanes)}
        self.lanes = [{"process": proc, "label": (lane or "") + (f" (overlap {thread})" if thread else ""),
                       "depth": depth} for (proc, lane, thread), depth in lanes.items()]
        where = {}
        bars = []
        for p in placed:
            e = p.event
            lane = self._lane_index[(p.process, p.lane, p.thread)]
            where[id(e)] = (lane, p.depth)
            peer = (e.attrs or {}).get("peer")
            bars.append((lane, p.depth, e.start - self.origin, max(e.end, e.start) - self.origin, e.kind, e.name,
                         e.bytes, peer if isinstance(peer, (int, str)) else None))
        self._bars = sorted(bars, key=lambda b: (b[0], b[1], b[2]))
        self._arrows = sorted(((*where[id(s)], s.start - self.origin, *where[id(r)], r.end - self.origin, s.bytes)
                               for s, r in _trace.messages(self.events)), key=lambda a: a[2])
        counts: dict = {}
        for e in self.events:
            counts[e.kind] = counts.get(e.kind, 0) + 1
        self.counts = dict(sorted(counts.items(), key=lambda kv: (_KIND_ORDER.index(kv[0])
                                                                   if kv[0] in _KIND_ORDER else 99, kv[0])))

    @classmethod
    def from_(cls, source, title: str | None = None, kinds=None) -> "Timeline":
        """The timeline of a LocalGroup (``group.events``), a LocalCluster (``cluster.events()``),
        an EventLog, a dataset or its ``stats()``, or a list of events."""
        return cls(source, title=title, kinds=kinds)

    @property
    def processes(self) -> list:
        return list(dict.fromkeys(lane["process"] for lane in self.lanes))

    def messages(self) -> list:
        """``(send, recv)`` event pairs: what the arrows join."""
        return _trace.messages(self.events)

    # -- the snapshot --------------------------------------------------------------------------
    def snapshot(self, window=None, width: int | None = None, max_bars: int | None = None) -> dict:
        """What the view draws, bounded: lanes; ``bars`` as ``[lane, depth, start, end, kind, name,
        n, bytes, peer]`` (seconds from the first event; ``n`` > 1 for bars merged from ``n`` events
        shorter than a pixel); ``arrows`` as ``[lane, depth, t, lane, depth, t, bytes]`` (send's start
        to receive's end); ``window`` (None: everything) and what was left out."""
        width = width or self.WIDTH
        max_bars = max_bars or self.MAX_BARS
        lo, hi = (0.0, self.span or 1e-6) if window is None else (float(window[0]), float(window[1]))
        if not hi > lo:
            raise ValueError(f"Timeline.snapshot: window must run forward, got {window!r}")
        items = [b for b in self._bars if b[3] >= lo and b[2] <= hi]
        pixel = (hi - lo) / width
        bars, merged = _decimate(items, pixel)
        while len(bars) > max_bars:
            pixel *= 2
            bars, merged = _decimate(items, pixel)
        arrows = [a for a in self._arrows if max(a[2], a[5]) >= lo and min(a[2], a[5]) <= hi]
        left_out = 0
        if len(arrows) > self.MAX_ARROWS:
            step = math.ceil(len(arrows) / self.MAX_ARROWS)
            left_out = len(arrows) - len(arrows[::step])
            arrows = arrows[::step]
        kinds = list(self.counts)
        return {
            "title": self.title, "span": _r(self.span), "window": None if window is None else [_r(lo), _r(hi)],
            "lanes": self.lanes, "kinds": kinds,
            "colours": {k: KIND_COLOURS.get(k, _OTHER_COLOUR) for k in kinds},
            "counts": self.counts, "events": len(self.events), "in_window": len(items),
            "bars": [[b[0], b[1], _r(b[2]), _r(b[3]), b[4], b[5], b[6], b[7], b[8]] for b in bars],
            "merged": merged, "pixel": pixel,
            "arrows": [[a[0], a[1], _r(a[2]), a[3], a[4], _r(a[5]), a[6]] for a in arrows],
            "arrows_left_out": left_out, "messages": len(self._arrows),
        }

    # -- export --------------------------------------------------------------------------------
    def export_trace(self, path):
        """Write the events as Chrome trace JSON for https://ui.perfetto.dev or chrome://tracing
        (:func:`flowlab.cluster.trace.export_trace`, time 0 at this timeline's first event)."""
        return _trace.export_trace(self.events, path, base=self.origin)

    # -- display -------------------------------------------------------------------------------
    def __repr__(self):
        kinds = list(self.counts.items())
        shown = ", ".join(f"{k} {n}" for k, n in kinds[:4])
        more = ", ..." if len(kinds) > 4 else ""
        procs = self.processes
        where = ", ".join(procs[:6]) + (f" and {len(procs) - 6} more" if len(procs) > 6 else "")
        return f"<Timeline: {len(self.events)} events ({shown}{more}) on {where or 'nothing'}>"

    def _repr_mimebundle_(self, include=None, exclude=None):
        from .._display import mimebundle
        return mimebundle(self, include, exclude)

    def _repr_html_(self) -> str:
        return render_svg(self.snapshot(width=700, max_bars=1500))


def _decimate(items, pixel):
    """Merge, per lane and depth, runs of bars shorter than ``pixel`` that lie within a pixel of
    each other (up to 4 pixels wide, so that a busy stretch still shows its gaps) into one bar
    ``[..., kind (the commonest), "N events: ...", N, bytes, None]``.
    ``items`` are sorted by lane, depth, start. Returns (bars, events merged)."""
    out, merged = [], 0
    cur = None       # [lane, depth, start, end, kind, name, n, bytes, peer, short, {kind: n}]
    for b in items:
        short = b[3] - b[2] < pixel
        if (cur is not None and short and cur[9] and cur[0] == b[0] and cur[1] == b[1]
                and b[2] - cur[3] < pixel and b[3] - cur[2] <= 4 * pixel):
            cur[3] = max(cur[3], b[3])
            cur[6] += 1
            cur[7] += b[6]
            cur[10][b[4]] = cur[10].get(b[4], 0) + 1
            continue
        if cur is not None:
            out.append(_close(cur))
            merged += cur[6] if cur[6] > 1 else 0
        cur = [b[0], b[1], b[2], b[3], b[4], b[5], 1, b[6], b[7], short, {b[4]: 1}]
    if cur is not None:
        out.append(_close(cur))
        merged += cur[6] if cur[6] > 1 else 0
    return out, merged


def _close(cur):
    if cur[6] == 1:
        return cur[:9]
    kinds = sorted(cur[10].items(), key=lambda kv: -kv[1])
    name = f"{cur[6]} events: " + ", ".join(f"{k} {n}" for k, n in kinds)
    return [cur[0], cur[1], cur[2], cur[3], kinds[0][0], name, cur[6], cur[7], None]


def _ticks(lo, hi, n=6):
    """Round tick values between lo and hi (seconds) and a unit to print them in."""
    span = hi - lo
    if span <= 0:
        return [], "ms", 1e3
    raw = span / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    unit, scale = ("s", 1.0) if step >= 0.5 else ("ms", 1e3) if step >= 5e-4 else ("µs", 1e6)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step) + 1)], unit, scale


def _fmt_tick(v, scale):
    x = v * scale
    return f"{x:.0f}" if abs(x - round(x)) < 1e-6 else f"{x:.3g}"


_MERGED = " opacity='0.6'"


def render_svg(snap: dict, width: int = 760) -> str:
    """A snapshot as a static picture (inline SVG, times rounded): what a notebook shows before it
    runs, and GitHub always."""
    label_w, row_h, top = 150, 9, 34
    plot_w = width - label_w - 10
    lanes = snap["lanes"]
    y, ys = top, []
    for lane in lanes:
        ys.append(y)
        y += lane["depth"] * row_h + 6
    height = y + 8
    lo, hi = snap["window"] or (0.0, snap["span"] or 1e-9)
    hi = hi if hi > lo else lo + 1e-9
    x = lambda t: label_w + (min(max(t, lo), hi) - lo) / (hi - lo) * plot_w      # noqa: E731
    e = _html.escape
    parts = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
             f"viewBox='0 0 {width} {height}' font-family='sans-serif' font-size='10'>"]
    title = snap.get("title") or "timeline"
    parts.append(f"<text x='0' y='11' font-weight='bold'>{e(title)}</text>")
    lx = label_w
    for kind in snap["kinds"]:
        parts.append(f"<rect x='{lx}' y='3' width='9' height='9' fill='{snap['colours'][kind]}'/>"
                     f"<text x='{lx + 12}' y='11'>{e(kind)}</text>")
        lx += 18 + 6 * len(kind)
    ticks, unit, scale = _ticks(lo, hi)
    for t in ticks:
        parts.append(f"<line x1='{x(t):.1f}' x2='{x(t):.1f}' y1='{top - 6}' y2='{height - 6}' stroke='#e4e4e4'/>"
                     f"<text x='{x(t):.1f}' y='{top - 8}' text-anchor='middle' fill='#666'>"
                     f"{_fmt_tick(t, scale)}</text>")
    parts.append(f"<text x='{width - 4}' y='{top - 8}' text-anchor='end' fill='#666'>{unit}</text>")
    last = None
    for i, lane in enumerate(lanes):
        name = lane["process"] if lane["process"] != last else ""
        last = lane["process"]
        label = f"{name} {lane['label']}".strip() if name else lane["label"]
        parts.append(f"<text x='0' y='{ys[i] + row_h}' fill='#333'>{e(label[:28])}</text>")
        if name and i:
            parts.append(f"<line x1='0' x2='{width}' y1='{ys[i] - 3}' y2='{ys[i] - 3}' stroke='#ccc'/>")
    for b in snap["bars"]:
        lane, depth, s, t, kind = b[0], b[1], b[2], b[3], b[4]
        x0, x1 = x(s), x(t)
        parts.append(f"<rect x='{x0:.1f}' y='{ys[lane] + depth * row_h}' width='{max(x1 - x0, 0.8):.1f}' "
                     f"height='{row_h - 1}' fill='{snap['colours'].get(kind, _OTHER_COLOUR)}'"
                     f"{_MERGED if b[6] > 1 else ''}/>")
    for a in snap["arrows"][:300]:
        parts.append(f"<line x1='{x(a[2]):.1f}' y1='{ys[a[0]] + a[1] * row_h + row_h / 2:.1f}' x2='{x(a[5]):.1f}' "
                     f"y2='{ys[a[3]] + a[4] * row_h + row_h / 2:.1f}' stroke='#555' stroke-width='0.6' opacity='0.6'/>")
    parts.append("</svg>")
    note = (f"{snap['events']} events, {len(snap['bars'])} bars"
            + (f" ({snap['merged']} short events merged)" if snap["merged"] else "")
            + f", {snap['messages']} messages")
    return (f"<div class='fl-timeline-static'>{''.join(parts)}"
            f"<div style='font-size:11px;color:#666'>{e(note)}</div></div>")
