"""The live view of a LocalCluster: per task its status, pid and address, refreshed while it runs,
with buttons to kill or restart a task and to read its log (faults, on purpose, for teaching).

Built by ``flowlab._display.show(cluster)`` as ``ClusterView(cluster)``; it reads only
``cluster.snapshot()`` and calls ``kill``, ``restart`` and ``logs``.
"""
from __future__ import annotations

import html
import threading

import ipywidgets as w

__all__ = ["ClusterView", "render_table"]

_COLOURS = {"alive": "#2e7d32", "unresponsive": "#f9a825", "dead": "#c62828", "starting": "#616161",
            "closed": "#616161"}


def render_table(snap: dict) -> str:
    """The status table of a cluster snapshot, as HTML."""
    rows = "".join(
        f"<tr><td><code>{html.escape(t['task'])}</code></td>"
        f"<td style='color:{_COLOURS.get(t['status'], '#000')}'>&#9679; {html.escape(t['status'])}"
        f"{'' if t.get('exitcode') is None else ' (exit ' + str(t['exitcode']) + ')'}</td>"
        f"<td>{t['pid'] or '-'}</td><td><code>{html.escape(t['address'] or '-')}</code></td></tr>"
        for t in snap["tasks"])
    state = "closed" if snap.get("closed") else html.escape(snap.get("target") or "")
    return (f"<div class='fl-cluster-status'><b>cluster</b> <code>{state}</code><table>"
            f"<tr><th>task</th><th>status</th><th>pid</th><th>address</th></tr>{rows}</table></div>")


class ClusterView(w.VBox):
    """Status table plus kill / restart / log buttons; ``refresh()`` redraws from the snapshot.
    A daemon thread refreshes every ``every`` seconds until the cluster closes."""

    def __init__(self, cluster, every: float = 0.5):
        self._stop = threading.Event()
        self.cluster = cluster
        self.table = w.HTML()
        self.table.add_class("fl-cluster-table")
        snap = cluster.snapshot()
        self.task = w.Dropdown(options=[t["task"] for t in snap["tasks"]], description="task")
        self.kill_button = w.Button(description="Kill", button_style="danger", tooltip="SIGKILL this task")
        self.restart_button = w.Button(description="Restart", tooltip="start this task again")
        self.log_button = w.Button(description="Log", tooltip="show the last lines of its log")
        self.log_box = w.HTML()
        for b in (self.kill_button, self.restart_button, self.log_button):
            b.add_class("fl-cluster-" + b.description.lower())
        self.kill_button.on_click(lambda _: self._act(lambda t: self.cluster.kill(t)))
        self.restart_button.on_click(lambda _: self._act(lambda t: self.cluster.restart(t)))
        self.log_button.on_click(lambda _: self._act(self._show_log))
        super().__init__([self.table, w.HBox([self.task, self.kill_button, self.restart_button, self.log_button]),
                          self.log_box])
        self.refresh()
        if every:
            threading.Thread(target=self._tick, args=(every,), daemon=True, name="flowlab-cluster-view").start()

    def refresh(self) -> None:
        snap = self.cluster.snapshot()
        self.table.value = render_table(snap)
        closed = bool(snap.get("closed"))
        for b in (self.kill_button, self.restart_button):
            b.disabled = closed

    def _act(self, fn):
        try:
            if self.task.value:
                fn(self.task.value)
        except Exception as e:   # shown in the view: a button must not raise into the void
            self.log_box.value = f"<pre>{html.escape(type(e).__name__ + ': ' + str(e))}</pre>"
        self.refresh()

    def _show_log(self, task):
        self.log_box.value = f"<pre>{html.escape(self.cluster.logs(task, 30))}</pre>"

    def _tick(self, every):
        while not self._stop.wait(every):
            try:
                self.refresh()
            except Exception:
                return
            if self.cluster.snapshot().get("closed"):
                return

    def close(self):
        if hasattr(self, "_stop"):
            self._stop.set()
        super().close()
