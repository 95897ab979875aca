"""A pipeline's timeline: its recorded events (``stats.py``) laid out as bars, one row per stage lane.

``fl.data.timeline(events)`` turns "produce", "wait" and "autotune" events into a ``Timeline``: rows
from the source down to the consumer (a parallel map has one row per worker, and every buffered stage
a ``wait`` row showing when its consumer was blocked on it), bars with times in seconds from the first
event, and AUTOTUNE's decisions as marks. Events of any other kind (say, your training steps,
recorded with ``log.span("step", "train step")``) become rows of their own, below the pipeline's.
``fl.data.plot_timeline`` draws it with matplotlib, which is imported only when you call it.

>>> import time
>>> import flowlab as fl
>>> slow = lambda x: time.sleep(0.002) or x + 1          # the batch waits for every element
>>> ds = fl.data.Dataset.range(6).map(slow, num_parallel_calls=2).batch(3)
>>> _ = list(ds)
>>> tl = fl.data.timeline(ds.stats())
>>> tl.rows[0], tl.rows[1].startswith("map#1 worker"), tl.rows[-2:]
('range#0', True, ['map#1 wait', 'batch#2'])
>>> sorted({bar.kind for bar in tl.bars})
['produce', 'wait']
"""
from __future__ import annotations

import re
from typing import NamedTuple

__all__ = ["Bar", "Mark", "Timeline", "timeline", "plot_timeline"]

_COLORS = {"produce": "tab:blue", "wait": "tab:red"}
_OTHER = "tab:gray"


class Bar(NamedTuple):
    row: str
    kind: str            # "produce", "wait", or another kind of event (drawn gray)
    start: float         # seconds from the timeline's start
    end: float
    fill: int | None     # wait bars: elements in the buffer when the consumer asked
    capacity: int | None


class Mark(NamedTuple):
    row: str
    time: float
    text: str


class Timeline(NamedTuple):
    rows: list           # row labels, source first
    bars: list           # Bar
    marks: list          # Mark (AUTOTUNE decisions)
    origin: float        # the perf_counter time that is 0 here

    @property
    def seconds(self) -> float:
        return max((b.end for b in self.bars), default=0.0)

    def busy(self) -> dict:
        """{row: the share of the timeline its bars cover} (overlapping bars are not counted twice)."""
        total = self.seconds or 1.0
        out = {}
        for row in self.rows:
            covered, reach = 0.0, 0.0
            for bar in sorted((b for b in self.bars if b.row == row), key=lambda b: b.start):
                start = max(bar.start, reach)
                if bar.end > start:
                    covered += bar.end - start
                    reach = bar.end
            out[row] = covered / total
        return out

    def __repr__(self):
        return (f"<Timeline: {len(self.rows)} rows, {len(self.bars)} bars, {len(self.marks)} marks over "
                f"{self.seconds:.3f} s>")


def _order(name: str):
    match = re.search(r"#(\d+)$", name)
    return (int(match.group(1)) if match else 1 << 30, name)


def timeline(events) -> Timeline:
    """A ``Timeline`` from events: a list of ``Event``, or anything with ``events()`` (such as
    ``dataset.stats()``). Events of several pipeline runs get their run's id in the row names."""
    if hasattr(events, "events"):
        events = events.events()
    events = list(events)
    runs = {(e.attrs or {}).get("pipeline") for e in events} - {None}
    prefix = (lambda e: f"p{e.attrs['pipeline']} " if (e.attrs or {}).get("pipeline") is not None else "") \
        if len(runs) > 1 else (lambda e: "")
    origin = min((e.start for e in events), default=0.0)
    bars, marks, rows = [], [], {}
    for e in events:
        attrs = e.attrs or {}
        stage = prefix(e) + e.name
        if e.kind == "autotune":
            marks.append(Mark(stage, e.start - origin, f"{attrs.get('parameter')} {attrs.get('old')} -> "
                                                       f"{attrs.get('new')}"))
            continue
        if e.kind not in ("produce", "wait"):
            lane, rank = stage, 1 << 21           # not a pipeline stage: a row of its own, at the bottom
        elif e.kind == "wait":
            lane, rank = f"{stage} wait", 1 << 20
        elif "worker" in attrs:
            lane, rank = f"{stage} worker {attrs['worker']}", attrs["worker"]
        else:
            lane, rank = stage, 0
        order = _order(e.name) if e.kind in ("produce", "wait") else (1 << 31, e.name)
        rows.setdefault(lane, (order, rank, prefix(e)))
        bars.append(Bar(lane, e.kind, e.start - origin, e.end - origin, attrs.get("fill"), attrs.get("capacity")))
    ordered = sorted(rows, key=lambda lane: (rows[lane][2], rows[lane][0], rows[lane][1]))
    return Timeline(ordered, bars, sorted(marks, key=lambda m: m.time), origin)


def plot_timeline(data, ax=None, title: str | None = None, min_width: float = 0.0):
    """Draw a timeline (a ``Timeline``, events, or ``dataset.stats()``): blue bars where a stage
    produced, red where its consumer waited on it, gray for other events, a line per AUTOTUNE
    decision. ``min_width`` (s) hides shorter bars. Returns the matplotlib Axes."""
    import matplotlib.pyplot as plt     # here, so that importing flowlab never imports matplotlib

    tl = data if isinstance(data, Timeline) else timeline(data)
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 0.45 * len(tl.rows) + 1.2))
    index = {row: i for i, row in enumerate(tl.rows)}
    groups: dict = {}
    for b in tl.bars:
        if b.end - b.start >= min_width:
            groups.setdefault((b.row, _COLORS.get(b.kind, _OTHER)), []).append((b.start, b.end - b.start))
    for (row, color), spans in groups.items():
        ax.broken_barh(spans, (index[row] - 0.4, 0.8), facecolors=color, linewidth=0)
    for mark in tl.marks:
        y = index.get(next((r for r in tl.rows if r.startswith(mark.row + " ") or r == mark.row), ""), None)
        ax.axvline(mark.time, color="tab:green", linewidth=0.8, linestyle="--")
        if y is not None:
            ax.annotate(mark.text, (mark.time, y), fontsize=7, color="tab:green", xytext=(2, 6),
                        textcoords="offset points")
    ax.set_yticks(range(len(tl.rows)), tl.rows)
    ax.set_ylim(len(tl.rows) - 0.5, -0.5)        # the source at the top, the consumer at the bottom
    ax.set_xlabel("seconds")
    kinds = {b.kind for b in tl.bars}
    legend = [("produce", _COLORS["produce"]), ("wait (consumer blocked)", _COLORS["wait"])]
    legend += [(kind, _OTHER) for kind in sorted(kinds - set(_COLORS))]
    ax.legend([plt.Rectangle((0, 0), 1, 1, color=c) for _, c in legend], [name for name, _ in legend],
              loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=len(legend), fontsize=8, frameon=False)
    if title:
        ax.set_title(title, loc="left")
    return ax
