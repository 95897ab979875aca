"""``ProgressView``: the training monitor, the live widget of a fit's ``ProgressBar``
(flowlab.nn.keras.progress), drawn by ``progress.js`` from the bar's ``snapshot()``.

It shows the epoch's bar, the latest loss and metrics, a line chart of the loss (and val_loss) per
epoch, a sparkline of the running epoch's mean loss so far (as the fit logs it), the throughput in
samples/s, each epoch's time, and the replica count under a distribution strategy.

``refresh()`` re-reads the snapshot at most every ``min_interval`` seconds (calls in between return
at once, after one clock read; every ``sample_interval`` seconds one of them reads the loss for the
epoch's curve), so a fit that runs thousands of steps a second spends almost nothing on drawing;
``refresh(force=True)`` always reads (the fit asks for it when training ends). When training ends
the view also replaces its display's text and static HTML with the final state, so a saved
notebook shows the finished run, not "Epoch 0/10 (not started)".
"""
from __future__ import annotations

import time

from ._view import FinalDisplay, SnapshotView, css, esm

__all__ = ["ProgressView"]

_FINAL = ("done", "stopped", "failed")


class ProgressView(FinalDisplay, SnapshotView):
    """Built as ``ProgressView(bar)`` by ``flowlab._display.show``; the fit calls ``refresh()``."""

    _esm = esm("progress.js")
    _css = css("progress.css")
    min_interval = 0.2
    sample_interval = 0.05       # between redraws, the loss is read for the epoch's curve this often

    def __init__(self, bar, clock=time.monotonic, **kwargs):
        self._clock = clock
        self._last = None
        self._sampled = None
        self.draws = 0               # snapshots read (not skipped by the throttle)
        super().__init__(bar, **kwargs)
        self._last = clock()
        self.draws = 1

    def __repr__(self):
        return f"ProgressView({self.obj.text()})"

    def refresh(self, force=False) -> bool:
        """Re-read the bar's snapshot (sent if it changed); skipped (False) if the last read was
        under ``min_interval`` seconds ago, unless ``force``."""
        now = self._clock()
        if not force and self._last is not None and now - self._last < self.min_interval:
            if now - (self._sampled or self._last) >= self.sample_interval:
                self._sampled = now
                self.obj.sample()
            return False
        self._last = self._sampled = now
        snap = super().refresh()
        self.draws += 1
        if snap.get("status") in _FINAL:
            self.show_final()
        return True
