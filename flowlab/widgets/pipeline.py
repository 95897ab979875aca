"""``PipelineView``: the pipeline observatory, the live widget of an ``fl.data`` run's
``PipelineStats`` (what ``dataset.stats()`` and ``iterator.stats()`` return), drawn by
``pipeline.js`` from its ``snapshot()``.

One row per stage, source first: elements made and elements/s, a bar per time bucket of elements
made, how long its consumer waited on it (buffered stages: a parallel map, a prefetch), its buffer's
fill when asked against its capacity over time, and AUTOTUNE's decisions, marked on the charts and
listed with their reasons. A background thread re-reads the stats every ``every`` seconds while the
pipeline runs (the main thread iterates meanwhile), and stops once the run has finished.
"""
from __future__ import annotations

from ._view import FinalDisplay, SnapshotView, css, esm

__all__ = ["PipelineView"]


class PipelineView(FinalDisplay, SnapshotView):
    """Built as ``PipelineView(stats)`` by ``flowlab._display``; live until the run finishes, when
    the stats call it back (on the thread that stopped last, usually the one that iterated): it
    sends the final snapshot and updates its display's text and static HTML to the finished run."""

    _esm = esm("pipeline.js")
    _css = css("pipeline.css")
    every = 0.25

    def __init__(self, stats, **kwargs):
        super().__init__(stats, **kwargs)
        stats.when_finished(self._finished)

    def _finished(self):
        try:
            self.refresh()
        except Exception:   # noqa: BLE001 - the comm may be closed: the pipeline must not fail for it
            return
        self.show_final()

    def __repr__(self):
        return f"PipelineView(pipeline {self.obj.id})"
