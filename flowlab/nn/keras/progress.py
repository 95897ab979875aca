"""The progress of a fit: a plain object that a notebook shows as a live widget and a shell as text.

``ProgressBar`` holds where training is (epoch, step, the latest loss and metrics, finished
epochs) and offers it as a JSON-safe ``snapshot()``. In a notebook, ``flowlab._display.show``
builds its view (``flowlab.widgets.progress:ProgressView``, named by string: this layer never
imports widgets); the view re-reads the snapshot on ``refresh()`` and skips refreshes that come
too fast, so a quick fit is not slowed by drawing. In a shell the bar prints one line per epoch,
Keras-style::

    Epoch 1/5 [==============================] 45/45 - 0.3s - loss: 0.5123 - accuracy: 0.8711
"""
from __future__ import annotations

import html
import math
import time

__all__ = ["ProgressBar", "format_values", "format_seconds"]

WIDTH = 30


def format_seconds(seconds: float) -> str:
    if seconds < 10:
        return f"{seconds:.1f}s"
    if seconds < 60:
        return f"{seconds:.0f}s"
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes}m {secs:02d}s"


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
    reference to the logs); values are read from the logs only when shown."""

    _view = "flowlab.widgets.progress:ProgressView"

    def __init__(self, epochs=1, steps=None, title="Epoch", stream=None, clock=time.perf_counter):
        self.epochs, self.steps, self.title = int(epochs), steps, title
        self.stream = stream
        self._clock = clock
        self.epoch = 0                 # 1-based once started
        self.step = 0
        self._logs = {}
        self.values: dict = {}
        self.finished: list = []       # one dict per finished epoch: epoch, seconds, values
        self.status = "waiting"
        self._start = self._epoch_start = None
        self._end = None
        self.view = None

    # -- driven by the training loop ----------------------------------------------------------
    def start(self):
        self.status = "running"
        self._start = self._clock()
        return self

    def start_epoch(self, epoch, steps=None, first_step=0):
        """Epoch ``epoch`` (0-based, as callbacks count) begins, at ``first_step`` if resumed."""
        self.epoch = int(epoch) + 1
        self.step = int(first_step)
        if steps is not None:
            self.steps = steps
        self._logs = {}
        self._epoch_start = self._clock()
        self._refresh(force=True)

    def update(self, step, logs=None):
        """``step`` steps of this epoch are done; ``logs`` maps names to the latest values (read lazily)."""
        self.step = step
        if logs is not None:
            self._logs = logs
        if self.view is not None:
            self.view.refresh()

    def end_epoch(self, values):
        """The epoch is over: record its final values (plain floats) and print its line in text mode."""
        self.values = {k: _number(v) for k, v in values.items()}
        if self.steps is None:
            self.steps = self.step
        seconds = self._clock() - (self._epoch_start or self._clock())
        self.finished.append({"epoch": self.epoch, "steps": self.step, "seconds": seconds, "values": dict(self.values)})
        self._logs = {}
        if self.stream is not None:
            print(self.epoch_line(self.finished[-1]), file=self.stream, flush=True)
        self._refresh(force=True)

    def finish(self, status="done"):
        """Training ended: ``status`` is "done", "stopped" (early stopping) or "failed"."""
        self.status = status
        self._end = self._clock()
        self._refresh(force=True)

    def _refresh(self, force=False):
        if self.view is not None:
            self.view.refresh(force=force)

    # -- what it shows --------------------------------------------------------------------------
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

    def epoch_line(self, record) -> str:
        step = record.get("steps", self.step)
        steps = self.steps or step
        head = f"{self.title} {record['epoch']}/{self.epochs} " if self.title else ""
        values = format_values(record["values"])
        return (f"{head}{_bar(step, steps)} {step}/{steps} - {format_seconds(record['seconds'])}"
                + (f" - {values}" if values else ""))

    def snapshot(self) -> dict:
        """JSON-safe state: what a view draws."""
        return {
            "title": self.title, "epoch": self.epoch, "epochs": self.epochs, "step": self.step, "steps": self.steps,
            "values": {k: _json_number(v) for k, v in self.current_values().items()},
            "finished": [{"epoch": r["epoch"], "steps": r["steps"], "seconds": round(r["seconds"], 3),
                          "values": {k: _json_number(v) for k, v in r["values"].items()}} for r in self.finished],
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

    def _repr_html_(self):
        rows = "".join(f"<div><code>{html.escape(self.epoch_line(r))}</code></div>" for r in self.finished)
        return rows or f"<code>{html.escape(self.text())}</code>"
