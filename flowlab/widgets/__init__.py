"""Notebook widgets: anywidget views over plain objects' ``snapshot()``, the only package that imports
ipywidgets or anywidget. A lower layer never imports this package: an object names its view as a
string (``_view = "flowlab.widgets.<module>:<Class>"``) and ``flowlab._display`` builds it inside a
kernel. Every view is a :class:`flowlab.widgets._view.SnapshotView`: built as ``View(obj)``, one
synced ``snapshot`` trait, user actions as ``do_<name>`` methods, JavaScript and CSS in files here.

The plain objects are re-exported here, imported on first use (importing this package imports no
widget library; their views load only in a kernel):

- :func:`placement_graph` / :class:`PlacementGraph`: where each op of a traced function or graph runs;
- :func:`replay` / :class:`CollectiveReplay`: a recorded collective, step by step, beside its cost model;
- :class:`Timeline`: one lane per rank and thread, sends joined to receives, ``export_trace(path)``;
- :func:`launcher`: a form that starts a LocalCluster and becomes its panel.
"""
import importlib

_HOME = {"PlacementGraph": ".placement", "placement_graph": ".placement",
         "CollectiveReplay": ".replay", "replay": ".replay",
         "Timeline": ".timeline", "plot_timeline": ".timeline",
         "launcher": "flowlab.cluster.launch_form"}
__all__ = sorted(_HOME)


def __getattr__(name):
    if name in _HOME:
        return getattr(importlib.import_module(_HOME[name], __name__), name)
    raise AttributeError(f"module 'flowlab.widgets' has no attribute {name!r}")
