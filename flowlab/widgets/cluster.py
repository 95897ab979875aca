"""The cluster panel: the live view of a LocalCluster (``ClusterView``, an anywidget).

One row per task: a status dot (starting, idle, busy, unresponsive, paused, dead with its exit code
or signal), pid, address, CPU and memory, what it runs, messages and bytes in and out, a sparkline
of its activity and its faults, with buttons Kill, Pause/Resume, Restart, Stack and Log; below
them Add worker, Stop cluster, Delay and Clear faults, the scheduled faults, the last fault events
and the background recovery runs. What an action returns (a stack, a log, an error) shows in a box
in the view. It draws :func:`panel_snapshot` (``cluster.snapshot()`` plus the background runs),
re-read every ``every`` seconds by a daemon thread that stops once the cluster is closed.

The buttons are ``do_<action>`` methods (``flowlab.widgets._view.SnapshotView``). In JupyterLab 4.4+
with ipykernel 7 a click is handled on a kernel subshell, in another thread, while a cell runs
(once the kernel was idle after the panel appeared): each method only signals a process or asks a
task over its own connection, which LocalCluster allows from any thread.

:func:`render_table` and :func:`render_activity` draw the same snapshot as static HTML (what
:func:`static_html` joins, for a page without a kernel); the front end is ``cluster.js``.
"""
from __future__ import annotations

import html
import sys

from ._view import SnapshotView, css, esm, json_safe

__all__ = ["ClusterView", "panel_snapshot", "render_table", "render_activity", "describe_faults",
           "static_html", "state_of"]

# the colours of LocalCluster._repr_html_ (and of cluster.css)
_COLOURS = {"alive": "#2e7d32", "idle": "#2e7d32", "busy": "#ef6c00", "unresponsive": "#f9a825",
            "paused": "#1565c0", "dead": "#c62828", "starting": "#616161", "closed": "#616161"}
_RUN_COLOURS = {"running": "#1565c0", "restarting": "#f9a825", "done": "#2e7d32", "failed": "#c62828",
                "cancelled": "#616161"}
RECENT = 6           # fault events listed
LOG_LINES = 40       # lines the Log button shows
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


def state_of(task: dict) -> str:
    """The state a row shows: ``idle``/``busy`` for a live task whose activity is known, else its
    status (``alive`` where the activity is not known, ``starting``, ``unresponsive``, ``paused``,
    ``dead``, ``closed``)."""
    status = task.get("status") or "starting"
    if status == "alive" and task.get("activity") in ("idle", "busy"):
        return task["activity"]
    return status


def _exit_note(t) -> str:
    code = t.get("exitcode")
    if code is None or t.get("status") != "dead":
        return ""
    return f" (signal {-code})" if code < 0 else f" (exit {code})"


def _scheduled_by_task(snap) -> dict:
    out: dict = {}
    for _, action, task in snap.get("scheduled") or ():
        out.setdefault(task, []).append(action)
    return out


def render_table(snap: dict) -> str:
    """The status table of a panel snapshot (or a plain ``cluster.snapshot()``), as HTML: task,
    state (coloured: idle green, busy orange, paused blue, dead red with its signal), pid, address,
    faults."""
    scheduled = _scheduled_by_task(snap)
    rows = []
    for t in snap["tasks"]:
        state = state_of(t)
        faults = describe_faults(t.get("faults"), t.get("status") == "paused", scheduled.get(t["task"], ()))
        rows.append(
            f"<tr><td><code>{html.escape(t['task'])}</code></td>"
            f"<td class='fl-status-{html.escape(state)}' style='color:{_COLOURS.get(state, '#000')}'>"
            f"&#9679; {html.escape(state)}{_exit_note(t)}</td>"
            f"<td>{t.get('pid') or '-'}</td><td><code>{html.escape(t.get('address') or '-')}</code></td>"
            f"<td class='fl-faults'>{html.escape(faults)}</td></tr>")
    state = "closed" if snap.get("closed") else html.escape(snap.get("target") or "")
    return (f"<div class='fl-cluster-status'><b>cluster</b> <code>{state}</code><table>"
            f"<tr><th>task</th><th>status</th><th>pid</th><th>address</th><th>faults</th></tr>"
            f"{''.join(rows)}</table></div>")


def _event_line(e: dict) -> str:
    attrs = ", ".join(f"{k}={e['attrs'][k]}" for k in _TASK_ATTRS if (e.get("attrs") or {}).get(k) is not None)
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


def static_html(snap: dict) -> str:
    """A panel snapshot as one static HTML block (table, then activity)."""
    return render_table(snap) + render_activity(snap)


def panel_snapshot(cluster) -> dict:
    """What the panel draws, read once: ``cluster.snapshot()`` (tasks, ``scheduled`` faults,
    ``recent`` fault events) plus ``runs`` (the background recovery runs on this cluster) and
    ``workers``/``ps`` (how many of each), JSON-safe."""
    snap = dict(cluster.snapshot())
    recovery = sys.modules.get("flowlab.distribute._recovery")   # loaded once a run was started
    snap["runs"] = [r.snapshot() for r in recovery.runs_on(cluster)][-2:] if recovery is not None else []
    names = [t["task"] for t in snap.get("tasks", ())]
    snap["workers"] = sum(n.startswith("/job:worker/") for n in names)
    snap["ps"] = sum(n.startswith("/job:ps/") for n in names)
    return json_safe(snap)


def _int(value, what, lo, hi):
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a whole number, not {value!r}") from None
    if not lo <= n <= hi:
        raise ValueError(f"{what} must be between {lo} and {hi} (got {n})")
    return n


class ClusterView(SnapshotView):
    """The panel of one LocalCluster. Every action names the task it acts on (``task=``, a task
    name or index as the cluster accepts it) where it needs one; ``act("kill", task=1)`` does from
    Python what the Kill button does."""

    _esm = esm("cluster.js") + "\nexport default { render: renderClusterView };\n"
    _css = css("cluster.css")
    every = 0.5
    actions = ("kill", "pause", "resume", "restart", "stack", "log", "add_worker", "stop", "delay",
               "clear_faults")

    @property
    def cluster(self):
        """The cluster the actions act on."""
        return self.obj

    def read(self) -> dict:
        return {"mode": "cluster", **panel_snapshot(self.cluster)}

    def do_kill(self, task):
        self.cluster.kill(task)
        return f"killed {task}"

    def do_pause(self, task):
        self.cluster.pause(task)
        return f"paused {task}"

    def do_resume(self, task):
        self.cluster.resume(task)
        return f"resumed {task}"

    def do_restart(self, task):
        self.cluster.restart(task)
        return f"restarted {task} (pid {self.cluster.pid(task)})"

    def do_stack(self, task):
        return {"title": f"stack of {task}", "text": self.cluster.stack(task)}

    def do_log(self, task, lines=LOG_LINES):
        text = self.cluster.logs(task, _int(lines, "lines", 1, 1000))
        return {"title": f"log of {task} (last {lines} lines)", "text": text or "(the log is empty)"}

    def do_add_worker(self):
        return f"added {self.cluster.add_worker()}"

    def do_stop(self):
        self.cluster.close()
        return "cluster stopped"

    def do_delay(self, task, ms):
        ms = _int(ms, "delay (ms)", 0, 60_000)
        self.cluster.delay(task, ms)
        return f"{task}: every message delayed by {ms} ms" if ms else f"{task}: delay removed"

    def do_clear_faults(self):
        self.cluster.clear_faults()
        return "faults cleared"
