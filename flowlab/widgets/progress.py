"""``ProgressView``: the live widget of a fit's ``ProgressBar`` (flowlab.nn.keras.progress).

It draws the bar's ``snapshot()``: a title ("Epoch 3/10"), a bar over the epoch's steps, the
latest loss and metrics, and a table of finished epochs. ``refresh()`` re-reads the snapshot at
most every ``min_interval`` seconds (calls in between return at once), so a fit that runs
thousands of steps a second spends almost nothing on drawing; ``refresh(force=True)`` always
draws (the fit asks for it at the end of every epoch and of training).
"""
from __future__ import annotations

import html
import time

import ipywidgets as widgets

__all__ = ["ProgressView"]

_STYLE = {"running": "info", "done": "success", "stopped": "warning", "failed": "danger"}


def _fmt(v):
    if isinstance(v, str):
        return v
    return f"{v:.4g}" if abs(v) >= 1e4 or (v and abs(v) < 1e-3) else f"{v:.4f}"


class ProgressView(widgets.VBox):
    """Built as ``ProgressView(bar)`` by ``flowlab._display.show``; call ``refresh()`` after the bar changes."""

    min_interval = 0.2

    def __init__(self, bar, clock=time.monotonic):
        self._bar = bar
        self._clock = clock
        self._last = None
        self.draws = 0                    # how many times the snapshot was drawn (for tests and curiosity)
        self._title = widgets.HTML()
        self._progress = widgets.IntProgress(min=0, max=1, value=0, bar_style="info",
                                             layout=widgets.Layout(width="320px"))
        self._count = widgets.HTML()
        self._values = widgets.HTML()
        self._table = widgets.HTML()
        super().__init__([widgets.HBox([self._title, self._progress, self._count]), self._values, self._table])
        self.refresh(force=True)

    def __repr__(self):
        return f"ProgressView({self._bar.text()})"

    def refresh(self, force=False) -> bool:
        """Redraw from the bar's snapshot; skipped (False) if the last draw was under ``min_interval``
        seconds ago, unless ``force``."""
        now = self._clock()
        if not force and self._last is not None and now - self._last < self.min_interval:
            return False
        self._last = now
        self._draw(self._bar.snapshot())
        self.draws += 1
        return True

    def _draw(self, snap):
        title = snap["title"] or "Evaluating"
        self._title.value = f"<b>{html.escape(title)} {snap['epoch']}/{snap['epochs']}</b>&nbsp;"
        steps = snap["steps"] or max(snap["step"], 1)
        self._progress.max = max(int(steps), 1)
        self._progress.value = min(int(snap["step"]), self._progress.max)
        self._progress.bar_style = _STYLE.get(snap["status"], "info")
        self._count.value = (f"&nbsp;{snap['step']}/{snap['steps'] or '?'} &middot; {snap['elapsed']:.1f}s"
                             + (f" &middot; {snap['status']}" if snap["status"] not in ("running", "waiting") else ""))
        self._values.value = " &nbsp; ".join(f"{html.escape(k)}: <code>{_fmt(v)}</code>"
                                             for k, v in snap["values"].items())
        finished = snap["finished"]
        if not finished:
            self._table.value = ""
            return
        names = list(finished[-1]["values"])
        cell = "style='padding:0 10px 0 0;line-height:1.3;text-align:right'"
        head = "".join(f"<th {cell}>{html.escape(n)}</th>" for n in ["epoch", *names, "time"])
        rows = "".join(f"<tr><td {cell}>{r['epoch']}</td>" + "".join(
            f"<td {cell}>{_fmt(r['values'][n]) if n in r['values'] else ''}</td>" for n in names)
            + f"<td {cell}>{r['seconds']:.1f}s</td></tr>" for r in finished[-12:])
        self._table.value = (f"<table style='font-family:monospace;font-size:90%;border-collapse:collapse'>"
                             f"<tr>{head}</tr>{rows}</table>")
