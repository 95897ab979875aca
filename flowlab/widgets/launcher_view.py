"""``LauncherView``: the live view of ``flowlab.cluster.launcher()``: a form (workers, parameter
servers, transport) with Start, and the clusters this kernel started earlier, each with Show.
Start and Show turn the same widget into that cluster's panel (the drawing and the buttons of
:class:`flowlab.widgets.cluster.ClusterView`, whose JavaScript it shares: ``cluster.js`` then
``launcher.js``); "All clusters" goes back to the form.
"""
from __future__ import annotations

from ._view import css, esm
from .cluster import ClusterView, panel_snapshot

__all__ = ["LauncherView"]


class LauncherView(ClusterView):
    """Built as ``LauncherView(launcher)``. In form mode its snapshot is ``{"mode": "launcher",
    ...launcher.snapshot()}``; once a cluster is chosen, ``{"mode": "cluster", ...panel snapshot}``
    with ``launcher`` (the form's state) added, and every ClusterView action acts on that cluster."""

    _esm = esm("cluster.js", "launcher.js")
    _css = css("cluster.css")
    actions = ClusterView.actions + ("start", "show", "back")

    @property
    def cluster(self):
        current = self.obj.current
        if current is None:
            raise ValueError("no cluster is shown: start one, or show one of the list")
        return current

    def read(self) -> dict:
        form = self.obj.snapshot()
        current = self.obj.current
        if current is None:
            return {"mode": "launcher", **form}
        return {"mode": "cluster", **panel_snapshot(current), "launcher": form}

    def _tick(self, every):
        # a launcher outlives the clusters it shows: keep refreshing until the view is closed
        while not self._stop.wait(every):
            try:
                self.refresh()
            except Exception:   # noqa: BLE001 - the comm is gone: stop quietly
                return

    def do_start(self, workers=None, ps=None, transport=None):
        cluster = self.obj.start(workers, ps, transport)
        return f"started {len(cluster.workers)} worker(s), {len(cluster.tasks) - len(cluster.workers)} ps"

    def do_show(self, index):
        return f"showing {self.obj.show(index).target}"

    def do_back(self):
        self.obj.back()
        return "all clusters"
