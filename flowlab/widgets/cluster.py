"""The live view of a LocalCluster: per task its status, pid, address and the faults set on it,
then the scheduled faults, the last fault events and the background training runs with their
restarts; buttons kill, restart, pause, resume or delay a task and show its log (faults, on
purpose, for teaching).

Built by ``flowlab._display.show(cluster)`` as ``ClusterView(cluster)``. Every tick reads one
:func:`panel_snapshot` (``cluster.snapshot()`` plus what it does not carry yet) and draws it with
the plain functions :func:`render_table` and :func:`render_activity`; the buttons call the
cluster's own ``kill``, ``restart``, ``pause``, ``resume``, ``delay``, ``clear_faults`` and ``logs``.
A button's error is shown in the view, never raised into the void.
"""
from __future__ import annotations

import html
import sys
import threading

import ipywidgets as w

__all__ = ["ClusterView", "panel_snapshot", "render_table", "render_activity", "describe_faults"]

# the colours of LocalCluster._repr_html_
_COLOURS = {"alive": "#2e7d32", "unresponsive": "#f9a825", "paused": "#1565c0", "dead": "#c62828",
            "starting": "#616161", "closed": "#616161"}
_RUN_COLOURS = {"running": "#1565c0", "restarting": "#f9a825", "done": "#2e7d32", "failed": "#c62828",
                "cancelled": "#616161"}
RECENT = 6           # fault events listed
_TASK_ATTRS = ("signal", "pid", "delay_ms", "drop", "corrupt", "seed", "type")


def describe_faults(faults: dict | None, paused: bool = False, scheduled=()) -> str:
    """One task's faults in words: ``delay 200 ms, drop 30%, paused, kill scheduled``; '' for none."""
    faults = faults or {}
    parts = []
    if faults.get("delay_ms"):
        parts.append(f"delay {faults['delay_ms']:g} ms")
    for name in ("drop", "corrupt"):
        if faults.get(name):
            parts.append(f"{name} {faults[name] * 100:g}%")
    if paused or faults.get("paused"):
        parts.append("paused")
    parts += [f"{action} scheduled" for action in scheduled]
    return ", ".join(parts)


def _exit_note(t) -> str:
    code = t.get("exitcode")
    if code is None or t["status"] != "dead":
        return ""
    return f" (signal {-code})" if code < 0 else f" (exit {code})"


def render_table(snap: dict) -> str:
    """The status table of a panel snapshot (or a plain ``cluster.snapshot()``), as HTML: task,
    status (coloured; ``paused`` blue), pid, address, faults."""
    scheduled: dict = {}
    for _, action, task in snap.get("scheduled") or ():
        scheduled.setdefault(task, []).append(action)
    rows = "".join(
        f"<tr><td><code>{html.escape(t['task'])}</code></td>"
        f"<td class='fl-status-{html.escape(t['status'])}' style='color:{_COLOURS.get(t['status'], '#000')}'>"
        f"&#9679; {html.escape(t['status'])}{_exit_note(t)}</td>"
        f"<td>{t['pid'] or '-'}</td><td><code>{html.escape(t['address'] or '-')}</code></td>"
        f"<td class='fl-faults'>{html.escape(describe_faults(t.get('faults'), t['status'] == 'paused', scheduled.get(t['task'], ())))}</td></tr>"
        for t in snap["tasks"])
    state = "closed" if snap.get("closed") else html.escape(snap.get("target") or "")
    return (f"<div class='fl-cluster-status'><b>cluster</b> <code>{state}</code><table>"
            f"<tr><th>task</th><th>status</th><th>pid</th><th>address</th><th>faults</th></tr>{rows}</table></div>")


def _event_line(e: dict) -> str:
    attrs = ", ".join(f"{k}={e['attrs'][k]}" for k in _TASK_ATTRS if e.get("attrs", {}).get(k) is not None)
    where = f" {e['task']}" if e.get("task") else ""
    return f"{e['ago']:6.1f} s ago  {e['name']}{where}{f' ({attrs})' if attrs else ''}"


def render_activity(snap: dict) -> str:
    """Below the table: the scheduled faults, the last fault events (newest first) and each
    background training run (``run_with_recovery(..., wait=False)``) with its restarts, as HTML;
    '' when there is none of these."""
    parts = []
    if snap.get("scheduled"):
        items = "".join(f"<li>{html.escape(action)} {html.escape(task)} at +{at:g} s</li>"
                        for at, action, task in snap["scheduled"])
        parts.append(f"<div class='fl-scheduled'><b>scheduled</b><ul>{items}</ul></div>")
    if snap.get("recent"):
        lines = "\n".join(html.escape(_event_line(e)) for e in reversed(snap["recent"][-RECENT:]))
        parts.append(f"<div class='fl-recent'><b>last faults</b><pre>{lines}</pre></div>")
    for run in snap.get("runs") or ():
        colour = _RUN_COLOURS.get(run["state"], "#000")
        restarts = "".join(f"<li>{html.escape(r)}</li>" for r in run["restarts"])
        error = f"<div><code>{html.escape(run['error'])}</code></div>" if run.get("error") else ""
        parts.append(f"<div class='fl-run fl-run-{html.escape(run['state'])}'><b>run_with_recovery("
                     f"{html.escape(run['what'])})</b> <span style='color:{colour}'>&#9679; {html.escape(run['state'])}"
                     f"</span> &middot; {run['seconds']:.1f} s &middot; "
                     f"<span class='fl-restarts'>{len(run['restarts'])} restart(s)</span>"
                     f"{'<ul>' + restarts + '</ul>' if restarts else ''}{error}</div>")
    return "".join(parts)


def panel_snapshot(cluster) -> dict:
    """What the panel draws, read once: ``cluster.snapshot()`` (tasks, ``scheduled`` faults,
    ``recent`` fault events) plus ``runs`` (the background recovery runs on this cluster)."""
    snap = dict(cluster.snapshot())
    recovery = sys.modules.get("flowlab.distribute._recovery")   # loaded once a run was started
    snap["runs"] = [r.snapshot() for r in recovery.runs_on(cluster)][-2:] if recovery is not None else []
    return snap


class ClusterView(w.VBox):
    """Status table, activity, and a row of buttons acting on the chosen task; ``refresh()``
    redraws from one :func:`panel_snapshot`. A daemon thread refreshes every ``every`` seconds
    until the cluster closes or the view is closed."""

    def __init__(self, cluster, every: float = 0.5):
        self._stop = threading.Event()
        self.cluster = cluster
        self.table = w.HTML()
        self.table.add_class("fl-cluster-table")
        self.activity = w.HTML()
        self.activity.add_class("fl-cluster-activity")
        snap = cluster.snapshot()
        self.task = w.Dropdown(options=[t["task"] for t in snap["tasks"]], description="task")
        self.delay_ms = w.BoundedIntText(value=200, min=0, max=60_000, step=50, description="ms",
                                         layout=w.Layout(width="160px"))
        self.kill_button = self._button("Kill", "SIGKILL this task", lambda t: cluster.kill(t), "danger")
        self.restart_button = self._button("Restart", "start this task again", lambda t: cluster.restart(t))
        self.pause_button = self._button("Pause", "freeze this task (SIGSTOP)", lambda t: cluster.pause(t), "info")
        self.resume_button = self._button("Resume", "wake this task (SIGCONT)", lambda t: cluster.resume(t))
        self.delay_button = self._button("Delay", "delay every message this task handles by the ms given "
                                                  "(0 removes the delay)",
                                         lambda t: cluster.delay(t, self.delay_ms.value), "warning")
        self.clear_button = self._button("Clear faults", "resume paused tasks, remove delays, drops and "
                                                         "scheduled faults", lambda t: cluster.clear_faults())
        self.log_button = self._button("Log", "show the last lines of its log", self._show_log)
        self.message = w.HTML()
        self.message.add_class("fl-cluster-message")
        self.log_box = self.message           # the name older code used
        self._acting = [self.kill_button, self.restart_button, self.pause_button, self.resume_button,
                        self.delay_button, self.clear_button]
        super().__init__([self.table, w.HBox([self.task, self.kill_button, self.restart_button, self.pause_button,
                                              self.resume_button]),
                          w.HBox([self.delay_ms, self.delay_button, self.clear_button, self.log_button]),
                          self.message, self.activity])
        self.refresh()
        if every:
            threading.Thread(target=self._tick, args=(every,), daemon=True, name="flowlab-cluster-view").start()

    def _button(self, label, tooltip, act, style=""):
        b = w.Button(description=label, tooltip=tooltip, button_style=style)
        b.add_class("fl-cluster-" + label.split()[0].lower())
        b.on_click(lambda _: self._act(label, act))
        return b

    def refresh(self) -> dict:
        """Redraw from one snapshot; returns it."""
        snap = panel_snapshot(self.cluster)
        self.table.value = render_table(snap)
        self.activity.value = render_activity(snap)
        names = tuple(t["task"] for t in snap["tasks"])
        if tuple(self.task.options) != names:      # a worker was added
            self.task.options = names
        closed = bool(snap.get("closed"))
        for b in self._acting:
            b.disabled = closed
        return snap

    def _act(self, label, fn):
        task = self.task.value
        try:
            if task:
                fn(task)
                if label != "Log":
                    self.message.value = f"<code>{html.escape(label.lower())}</code> {html.escape(task)}: done"
        except Exception as e:   # noqa: BLE001 - shown in the view: a button must not raise into the void
            self.message.value = (f"<pre class='fl-error'>{html.escape(label)} {html.escape(task or '')} failed: "
                                  f"{html.escape(type(e).__name__ + ': ' + str(e))}</pre>")
        try:
            self.refresh()
        except Exception:   # noqa: BLE001 - a cluster closed under the view: the next tick stops
            pass

    def _show_log(self, task):
        self.message.value = f"<pre>{html.escape(self.cluster.logs(task, 30))}</pre>"

    def _tick(self, every):
        while not self._stop.wait(every):
            try:
                if self.refresh().get("closed"):
                    return
            except Exception:   # noqa: BLE001 - the widget or the cluster is gone
                return

    def close(self):
        if hasattr(self, "_stop"):
            self._stop.set()
        super().close()
