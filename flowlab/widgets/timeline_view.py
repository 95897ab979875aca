"""The live view of a :class:`flowlab.widgets.timeline.Timeline`: lanes of bars coloured by kind,
wheel to zoom, drag to pan, hover for an event's details, arrows from sends to receives, a legend.

The front end (``timeline.js``) zooms and pans the bars it has at once, then asks for the window's
detail with the action ``zoom(t0, t1)``: the view re-decimates that window (``Timeline.snapshot``),
so a zoomed-in range shows its real events however many the whole run holds. ``reset`` shows the
whole run again; ``export`` writes the trace (``Timeline.export_trace``) and returns its path.
"""
from __future__ import annotations

from pathlib import Path

from ._view import SnapshotView, css, esm, json_safe

__all__ = ["TimelineView"]


class TimelineView(SnapshotView):
    _esm = esm("timeline.js")
    _css = css("timeline.css")
    actions = ("zoom", "reset", "export")

    def __init__(self, obj, **kwargs):
        self.window = None          # (t0, t1) seconds from the first event; None: the whole run
        super().__init__(obj, **kwargs)

    def read(self) -> dict:
        return json_safe(self.obj.snapshot(window=self.window))

    def do_zoom(self, t0, t1) -> dict:
        """Show ``t0``..``t1`` (seconds from the first event) in detail; returns the bar count."""
        t0, t1 = float(t0), float(t1)
        if not t1 > t0:
            raise ValueError(f"zoom: t1 ({t1}) must be after t0 ({t0})")
        self.window = (max(t0, 0.0), t1)
        return {"window": list(self.window)}

    def do_reset(self) -> dict:
        self.window = None
        return {"window": None}

    def do_export(self, path: str | None = None) -> dict:
        """Write the Chrome trace (``timeline-<n>.json`` in the kernel's folder unless ``path``)."""
        if path is None:
            n = 1
            while Path(f"timeline-{n}.json").exists():
                n += 1
            path = f"timeline-{n}.json"
        info = self.obj.export_trace(path)
        return {"path": str(Path(info.path).resolve()), "name": Path(info.path).name, "slices": info.slices,
                "flows": info.flows}
