"""``launcher()``: a form that starts a LocalCluster (workers, parameter servers, transport) and
then becomes that cluster's panel; it also lists the clusters this process started earlier, each
with a Show button.

``Launcher`` is a plain object (no widget library here): ``snapshot()`` holds the form's defaults,
the transport choices and the open clusters (:func:`flowlab.cluster.clusters`); ``start()`` and
``show()`` pick the cluster the panel draws. Its live view is
``flowlab.widgets.launcher_view:LauncherView``, shown when the launcher is a cell's last expression.
"""
from __future__ import annotations

import html
import weakref

__all__ = ["Launcher", "launcher", "TRANSPORTS"]

# transport -> (what it is, the workers' environment that selects it). LocalCluster has no
# transport argument: its tasks take the local lane (Unix sockets) wherever they can, and
# FLOWLAB_LOCAL_LANE=0 in their environment makes them take ZeroMQ over TCP only.
TRANSPORTS = {
    "unix+tcp": ("Unix sockets between processes of this machine, ZeroMQ over TCP otherwise", {}),
    "tcp": ("ZeroMQ over TCP on 127.0.0.1 only (FLOWLAB_LOCAL_LANE=0), as between machines",
            {"FLOWLAB_LOCAL_LANE": "0"}),
}
MAX_TASKS = 16
_STARTED_WITH: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # cluster -> transport


def _describe(cluster) -> dict:
    tasks = cluster.tasks
    return {"target": cluster.target, "transport": _STARTED_WITH.get(cluster),
            "workers": sum(t.startswith("/job:worker/") for t in tasks),
            "ps": sum(t.startswith("/job:ps/") for t in tasks), "closed": bool(cluster.closed)}


class Launcher:
    """The form's state: defaults for a new cluster, and which cluster (if any) it shows now."""

    _view = "flowlab.widgets.launcher_view:LauncherView"

    def __init__(self, workers: int = 2, ps: int = 0, transport: str = "unix+tcp"):
        self.defaults = {"workers": int(workers), "ps": int(ps), "transport": transport}
        self._check(workers, ps, transport)
        self.current = None            # the LocalCluster it shows, or None (the form)
        self.started = []              # the clusters it started (held: "All clusters" must not end them)

    @staticmethod
    def _check(workers, ps, transport):
        if transport not in TRANSPORTS:
            raise ValueError(f"launcher: unknown transport {transport!r}; choose one of {', '.join(TRANSPORTS)}")
        if not (1 <= int(workers) <= MAX_TASKS and 0 <= int(ps) <= MAX_TASKS):
            raise ValueError(f"launcher: workers must be 1 to {MAX_TASKS} and ps 0 to {MAX_TASKS} "
                             f"(got workers={workers}, ps={ps})")

    @staticmethod
    def clusters() -> list:
        """The open LocalClusters of this process, oldest first."""
        from .local import clusters
        return clusters()

    def start(self, workers: int | None = None, ps: int | None = None, transport: str | None = None):
        """Start a LocalCluster with these settings (the defaults where None), show it, return it."""
        from .local import LocalCluster
        workers = self.defaults["workers"] if workers is None else int(workers)
        ps = self.defaults["ps"] if ps is None else int(ps)
        transport = transport or self.defaults["transport"]
        self._check(workers, ps, transport)
        cluster = LocalCluster(workers=workers, ps=ps, env=dict(TRANSPORTS[transport][1]))
        _STARTED_WITH[cluster] = transport
        self.started.append(cluster)
        self.defaults.update(workers=workers, ps=ps, transport=transport)
        self.current = cluster
        return cluster

    def show(self, index: int):
        """Show the ``index``-th open cluster (as :meth:`clusters` lists them); returns it."""
        open_ = self.clusters()
        try:
            self.current = open_[int(index)]
        except (IndexError, ValueError, TypeError):
            raise ValueError(f"launcher: no open cluster #{index}; there are {len(open_)}") from None
        return self.current

    def back(self) -> None:
        """Back to the form."""
        self.current = None

    def snapshot(self) -> dict:
        """``defaults``, ``transports`` ({name: what it is}), ``clusters`` (each ``target``,
        ``workers``, ``ps``, ``transport``, ``closed``) and ``current`` (the index of the one shown, or None)."""
        open_ = self.clusters()
        current = next((i for i, c in enumerate(open_) if c is self.current), None)
        return {"defaults": dict(self.defaults), "transports": {k: v[0] for k, v in TRANSPORTS.items()},
                "clusters": [_describe(c) for c in open_], "current": current, "max_tasks": MAX_TASKS}

    def __repr__(self) -> str:
        snap = self.snapshot()
        d = snap["defaults"]
        lines = [f"Launcher(workers={d['workers']}, ps={d['ps']}, transport={d['transport']!r}): "
                 f"{len(snap['clusters'])} open cluster(s)"]
        lines += [f"  #{i} {c['workers']} worker(s), {c['ps']} ps" for i, c in enumerate(snap["clusters"])]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        snap = self.snapshot()
        d = snap["defaults"]
        options = "".join(f"<li><code>{html.escape(k)}</code>: {html.escape(v)}</li>"
                          for k, v in snap["transports"].items())
        return ("<div class='flowlab-launcher'><b>Start a LocalCluster</b> (run this cell in Jupyter for the form)"
                f"<table><tr><th>workers</th><td>{d['workers']}</td></tr><tr><th>parameter servers</th>"
                f"<td>{d['ps']}</td></tr><tr><th>transport</th><td><code>{html.escape(d['transport'])}</code>"
                f"</td></tr></table><ul>{options}</ul></div>")

    def _repr_mimebundle_(self, include=None, exclude=None):
        from .._display import mimebundle
        return mimebundle(self, include, exclude)


def launcher(workers: int = 2, ps: int = 0, transport: str = "unix+tcp") -> Launcher:
    """A form that starts a LocalCluster and becomes its panel (show it: make it a cell's last
    expression). ``launcher().start()`` does from code what the Start button does."""
    return Launcher(workers, ps, transport)
