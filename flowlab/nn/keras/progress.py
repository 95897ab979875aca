"""The progress of a fit: a plain object that a notebook shows as a live widget and a shell as text.

``ProgressBar`` holds where training is (epoch, step, the latest loss and metrics, finished
epochs with their time and throughput) and offers it as a JSON-safe ``snapshot()``. In a notebook,
``flowlab._display.show`` builds its view (``flowlab.widgets.progress:ProgressView``, named by
string: this layer never imports widgets); the view re-reads the snapshot on ``refresh()`` and
skips refreshes that come too fast, so a quick fit is not slowed by drawing. In a shell the bar
prints one line per epoch, Keras-style::

    Epoch 1/5 [==============================] 45/45 - 13ms - loss: 0.5123 - accuracy: 0.8711

Epoch times below a second print in milliseconds: a small model on small data trains an epoch in
a few ms, which one decimal of a second showed as ``0.0s``.

Costs: ``update`` (per batch) stores a step number and a reference to the batch's lazy logs, and
asks the view to refresh, which it does at most every ``min_interval`` seconds (epoch starts and
ends included: a fit of many short epochs would otherwise redraw twice per epoch; only the end of
training always redraws). Only when a live view redraws (``snapshot()``) or samples (``sample()``, a few times
more often) is the loss read, and each reading is kept as one point of the epoch's batch-loss curve
(at most ``BATCH_POINTS`` points, thinned by half when full), so the curve costs nothing per batch.
"""
from __future__ import annotations

import html
import math
import time

__all__ = ["ProgressBar", "format_values", "format_seconds", "format_rate"]

WIDTH = 30
BATCH_POINTS = 120       # the most points of an epoch's batch-loss curve a snapshot carries
SHOWN_EPOCHS = 200       # the most finished epochs a snapshot carries (the latest; the rest are counted)


def format_seconds(seconds: float) -> str:
    """'13ms', '0.4ms', '2.3s', '42s', '3m 05s'."""
    if seconds < 0.01:
        return f"{seconds * 1e3:.1f}ms"
    if seconds < 1:
        return f"{seconds * 1e3:.0f}ms"
    if seconds < 10:
        return f"{seconds:.1f}s"
    if seconds < 60:
        return f"{seconds:.0f}s"
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes}m {secs:02d}s"


def format_rate(per_s) -> str:
    """'1,234 samples/s', '12.5 samples/s', '-' when unknown."""
    if per_s is None or not math.isfinite(per_s):
        return "-"
    return f"{per_s:,.0f} samples/s" if per_s >= 100 else f"{per_s:.3g} samples/s"


def _number(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _json_number(v: float):
    """A float as JSON allows it: NaN and infinities become the strings 'nan', 'inf', '-inf'."""
    return v if math.isfinite(v) else str(v)


def _format(v: float) -> str:
    if not math.isfinite(v):
        return str(v)
    return f"{v:.4g}" if abs(v) >= 1e4 or (v and abs(v) < 1e-3) else f"{v:.4f}"


def format_values(values: dict) -> str:
    """'loss: 0.5123 - accuracy: 0.8711' (4 decimals, as Keras prints)."""
    return " - ".join(f"{name}: {_format(_number(value))}" for name, value in values.items())


def _bar(step, steps, width=WIDTH):
    if not steps:
        return "[" + "." * width + "]"
    done = min(width, int(width * step / steps))
    if done < width and step:
        return "[" + "=" * max(done - 1, 0) + ">" + "." * (width - done) + "]"
    return "[" + "=" * done + "." * (width - done) + "]"


class ProgressBar:
    """Where a fit (or an evaluation) is. ``update`` is cheap (it stores a step number and a
    reference to the logs); values are read from the logs only when shown.

    ``samples``: examples in one pass over the data, if known (arrays); ``batch_size``: examples
    per step (the last step of a pass may hold fewer); with either, each epoch's throughput is
    counted in samples/s. ``replicas``/``strategy``: the distribution strategy's replica count
    and name, shown by the view (the loss a fit logs is already the mean over the replicas)."""

    _view = "flowlab.widgets.progress:ProgressView"

    def __init__(self, epochs=1, steps=None, title="Epoch", stream=None, clock=time.perf_counter,
                 samples=None, batch_size=None, replicas=1, strategy=None):
        self.epochs, self.steps, self.title = int(epochs), steps, title
        self.stream = stream
        self._clock = clock
        self.samples, self.batch_size = samples, batch_size
        self.replicas, self.strategy = int(replicas or 1), strategy
        self.epoch = 0                 # 1-based once started
        self.step = 0
        self._first_step = 0           # where this epoch started (a resumed fit starts mid-epoch)
        self._logs = {}
        self.values: dict = {}
        self.finished: list = []       # one dict per finished epoch: epoch, steps, seconds, samples, values
        self.status = "waiting"
        self._start = self._epoch_start = None
        self._end = None
        self._batch: list = []         # (step, loss) read when a live view redrew, this epoch
        self._batch_every = 1          # keep every n-th reading (doubles when the list is full)
        self._batch_seen = 0
        self.view = None

    # -- driven by the training loop ----------------------------------------------------------
    def start(self):
        self.status = "running"
        self._start = self._clock()
        return self

    def start_epoch(self, epoch, steps=None, first_step=0):
        """Epoch ``epoch`` (0-based, as callbacks count) begins, at ``first_step`` if resumed."""
        self.epoch = int(epoch) + 1
        self.step = self._first_step = int(first_step)
        if steps is not None:
            self.steps = steps
        self._logs = {}
        self._batch, self._batch_every, self._batch_seen = [], 1, 0
        self._epoch_start = self._clock()
        self._refresh()

    def update(self, step, logs=None):
        """``step`` steps of this epoch are done; ``logs`` maps names to the latest values (read lazily)."""
        self.step = step
        if logs is not None:
            self._logs = logs
        if self.view is not None:
            self.view.refresh()

    def end_epoch(self, values, workers=None):
        """The epoch is over: record its final values (plain floats), time and throughput, and print
        its line in text mode. ``workers``: {name: [each worker's value]} before the fit averaged
        them (MultiWorkerMirroredStrategy), if known."""
        self.values = {k: _number(v) for k, v in values.items()}
        if self.steps is None:
            self.steps = self.step
        seconds = self._clock() - (self._epoch_start if self._epoch_start is not None else self._clock())
        samples = self.samples_between(self._first_step, self.step)
        self.finished.append({"epoch": self.epoch, "steps": self.step, "seconds": seconds, "samples": samples,
                              "values": dict(self.values), "workers": workers})
        self._logs = {}
        if self.stream is not None:
            print(self.epoch_line(self.finished[-1]), file=self.stream, flush=True)
        self._refresh()

    def finish(self, status="done"):
        """Training ended: ``status`` is "done", "stopped" (early stopping) or "failed"."""
        self.status = status
        self._end = self._clock()
        self._refresh(force=True)

    def _refresh(self, force=False):
        if self.view is not None:
            self.view.refresh(force=force)

    # -- what it shows --------------------------------------------------------------------------
    def samples_between(self, first_step, last_step):
        """Examples in steps ``first_step`` to ``last_step`` of an epoch, or None if unknown."""
        if self.batch_size is None:
            return None
        bs = int(self.batch_size)
        if self.samples is None:
            return (last_step - first_step) * bs
        n = int(self.samples)
        return min(last_step * bs, n) - min(first_step * bs, n)

    def current_values(self) -> dict:
        """The latest values: read from the live logs during an epoch, else the last epoch's."""
        if self._logs:
            try:
                return {k: _number(v) for k, v in self._logs.items()}
            except Exception:  # noqa: BLE001 - a view must never break training
                return dict(self.values)
        return dict(self.values)

    def elapsed(self) -> float:
        if self._start is None:
            return 0.0
        return (self._end if self._end is not None else self._clock()) - self._start

    def epoch_seconds(self) -> float:
        """Seconds since this epoch began (0 before the first)."""
        if self._epoch_start is None or self.status != "running":
            return 0.0
        return self._clock() - self._epoch_start

    @staticmethod
    def rate(record) -> float | None:
        """A finished epoch's samples/s, or None."""
        if record.get("samples") is None or not record.get("seconds"):
            return None
        return record["samples"] / record["seconds"]

    def epoch_line(self, record) -> str:
        step = record.get("steps", self.step)
        steps = self.steps or step
        head = f"{self.title} {record['epoch']}/{self.epochs} " if self.title else ""
        values = format_values(record["values"])
        return (f"{head}{_bar(step, steps)} {step}/{steps} - {format_seconds(record['seconds'])}"
                + (f" - {values}" if values else ""))

    def sample(self):
        """Keep the running epoch's loss now as a point of its batch-loss curve (a live view calls
        this between redraws, a few times more often than it redraws; it reads the loss only)."""
        if not self._logs or "loss" not in self._logs:
            return
        try:
            loss = _number(self._logs["loss"])
        except Exception:  # noqa: BLE001 - a view must never break training
            return
        self._sample_batch_loss({"loss": loss})

    def _sample_batch_loss(self, values):
        """Keep the loss read now as one point of this epoch's batch curve (bounded: thinned by half
        when full)."""
        loss = values.get("loss")
        if loss is None or self.status != "running" or self.step <= self._first_step:
            return
        if self._batch and self._batch[-1][0] == self.step:
            return
        self._batch_seen += 1
        if self._batch_seen % self._batch_every:
            return
        self._batch.append((self.step, loss))
        if len(self._batch) >= BATCH_POINTS:
            self._batch = self._batch[1::2]
            self._batch_every *= 2

    def snapshot(self) -> dict:
        """JSON-safe state: what a view draws. While an epoch runs, the loss read here is also kept
        as a point of the epoch's batch-loss curve (``batch``)."""
        values = self.current_values()
        self._sample_batch_loss(values)
        seconds = self.epoch_seconds()
        done = self.samples_between(self._first_step, self.step)
        shown = self.finished[-SHOWN_EPOCHS:]
        return {
            "title": self.title, "epoch": self.epoch, "epochs": self.epochs, "step": self.step, "steps": self.steps,
            "values": {k: _json_number(v) for k, v in values.items()},
            "finished": [{"epoch": r["epoch"], "steps": r["steps"], "seconds": round(r["seconds"], 4),
                          "samples": r.get("samples"),
                          "samples_per_s": None if self.rate(r) is None else round(self.rate(r), 1),
                          "values": {k: _json_number(v) for k, v in r["values"].items()},
                          "workers": None if not r.get("workers") else
                          {k: [_json_number(v) for v in vs] for k, vs in r["workers"].items()}} for r in shown],
            "finished_left_out": len(self.finished) - len(shown),
            "batch": {"epoch": self.epoch, "every": self._batch_every,
                      "points": [[s, _json_number(v)] for s, v in self._batch]},
            "epoch_seconds": round(seconds, 3),
            "samples_per_s": round(done / seconds, 1) if done and seconds > 0 else None,
            "replicas": self.replicas, "strategy": self.strategy,
            "status": self.status, "elapsed": round(self.elapsed(), 3), "line": self.text(),
        }

    def text(self) -> str:
        """One line: the current epoch's bar and values (or the last finished epoch's)."""
        if self.status in ("waiting",) or self.epoch == 0:
            return f"{self.title} 0/{self.epochs} (not started)"
        steps = self.steps
        values = format_values(self.current_values())
        head = f"{self.title} {self.epoch}/{self.epochs} " if self.title else ""
        count = f"{self.step}/{steps}" if steps else f"{self.step}"
        tail = "" if self.status == "running" else f" ({self.status})"
        return f"{head}{_bar(self.step, steps)} {count}" + (f" - {values}" if values else "") + tail

    def __repr__(self):
        return "\n".join([self.epoch_line(r) for r in self.finished] or [self.text()])

    def _repr_mimebundle_(self, include=None, exclude=None):
        from ..._display import mimebundle
        return mimebundle(self, include, exclude)

    def _repr_html_(self):
        """A static picture: the last line, the loss per epoch as an SVG chart, and the epochs' table."""
        if not self.finished:
            return f"<code>{html.escape(self.text())}</code>"
        snap = self.snapshot()
        return ('<div class="fl-progress-static" style="font-family:sans-serif;font-size:12px">'
                f"<div><code>{html.escape(self.text())}</code>{_replica_note(snap)}</div>"
                f"{loss_chart_svg(snap['finished'])}{_epoch_table(snap)}</div>")


# -- the static picture (the view's front end draws the same from the same snapshot) -------------
def _replica_note(snap) -> str:
    if (snap.get("replicas") or 1) <= 1:
        return ""
    last = snap["finished"][-1] if snap["finished"] else {}
    per_worker = (last.get("workers") or {}).get("loss")
    return (f" <span>&middot; {snap['replicas']} replicas in sync"
            f"{' (' + html.escape(str(snap['strategy'])) + ')' if snap.get('strategy') else ''}"
            + (", loss per worker: " + " / ".join(_format(_number(v)) for v in per_worker) if per_worker else "")
            + "</span>")


def chart_series(finished) -> dict:
    """{name: [value per epoch]} for the loss-like logs (``loss``, ``val_loss``...), finite values or None."""
    names = []
    for r in finished:
        for k in r["values"]:
            if "loss" in k and k not in names:
                names.append(k)
    out = {}
    for k in names:
        vals = [r["values"].get(k) for r in finished]
        out[k] = [v if isinstance(v, (int, float)) and math.isfinite(v) else None for v in vals]
    return out


_COLOURS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#b07aa1"]


def loss_chart_svg(finished, width=360, height=150) -> str:
    """The loss (and val_loss...) per epoch as a small SVG line chart."""
    series = chart_series(finished)
    values = [v for vs in series.values() for v in vs if v is not None]
    if not values:
        return ""
    left, right, top, bottom = 44, 10, 10, 24
    lo, hi = min(values), max(values)
    if hi == lo:
        hi = lo + 1
    n = len(finished)
    x = lambda i: left + (i * (width - left - right) / (n - 1) if n > 1 else (width - left - right) / 2)  # noqa: E731
    y = lambda v: top + (hi - v) * (height - top - bottom) / (hi - lo)  # noqa: E731
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="fl-loss-chart" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" font-size="10" font-family="sans-serif">',
             f'<line x1="{left}" y1="{top}" x2="{left}" y2="{height - bottom}" stroke="#999"/>',
             f'<line x1="{left}" y1="{height - bottom}" x2="{width - right}" y2="{height - bottom}" stroke="#999"/>',
             f'<text x="{left - 4}" y="{top + 4}" text-anchor="end">{_format(hi)}</text>',
             f'<text x="{left - 4}" y="{height - bottom}" text-anchor="end">{_format(lo)}</text>',
             f'<text x="{left}" y="{height - 6}" text-anchor="middle">{finished[0]["epoch"]}</text>',
             f'<text x="{x(n - 1)}" y="{height - 6}" text-anchor="middle">{finished[-1]["epoch"]}</text>',
             f'<text x="{(left + width - right) / 2}" y="{height - 6}" text-anchor="middle">epoch</text>']
    for i, (name, vals) in enumerate(series.items()):
        colour = _COLOURS[i % len(_COLOURS)]
        pts = " ".join(f"{x(j):.1f},{y(v):.1f}" for j, v in enumerate(vals) if v is not None)
        dash = ' stroke-dasharray="4 2"' if name.startswith("val_") else ""
        parts.append(f'<polyline points="{pts}" fill="none" stroke="{colour}" stroke-width="1.5"{dash}/>')
        parts += [f'<circle cx="{x(j):.1f}" cy="{y(v):.1f}" r="2" fill="{colour}"/>'
                  for j, v in enumerate(vals) if v is not None]
        parts.append(f'<text x="{width - right}" y="{top + 10 + 12 * i}" text-anchor="end" fill="{colour}">'
                     f'{html.escape(name)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _epoch_table(snap) -> str:
    rows = snap["finished"]
    names = list(rows[-1]["values"])
    cell = "style='padding:0 10px 0 0;text-align:right'"
    head = "".join(f"<th {cell}>{html.escape(n)}</th>" for n in ["epoch", *names, "time", "samples/s"])
    body = "".join(
        f"<tr><td {cell}>{r['epoch']}</td>"
        + "".join(f"<td {cell}>{_format(_number(r['values'][n])) if n in r['values'] else ''}</td>" for n in names)
        + f"<td {cell}>{format_seconds(r['seconds'])}</td>"
        + f"<td {cell}>{'-' if r['samples_per_s'] is None else format_rate(r['samples_per_s']).split()[0]}</td></tr>"
        for r in rows[-12:])
    more = len(rows) - 12 + snap.get("finished_left_out", 0)
    return (f"<table style='font-family:monospace;font-size:90%;border-collapse:collapse'><tr>{head}</tr>{body}"
            "</table>" + (f"<div>({more} earlier epochs not shown)</div>" if more > 0 else ""))
