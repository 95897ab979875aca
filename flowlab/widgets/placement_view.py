"""``PlacementView``: the live placement graph (flowlab.widgets.placement), drawn by placement.js.

Built by ``flowlab._display`` as ``PlacementView(obj)`` for a ``PlacementGraph``, or for a
``ConcreteFunction`` or ``compat.v1`` Graph shown as a cell's last expression (their ``_view``
names this class; the view makes their placement graph and keeps their own text and static HTML in
the display bundle). The front end draws the snapshot (node positions included) with hover,
click-to-inspect, pan and zoom; a click on a folded scope asks Python to ``unfold`` it (the layout
is Python's, so the static picture and the widget stay the same drawing).
"""
from __future__ import annotations

import traitlets

from ._view import SnapshotView, css, esm
from .placement import PlacementGraph, placement_graph

__all__ = ["PlacementView"]


class PlacementView(SnapshotView):
    """The widget of a :class:`~flowlab.widgets.placement.PlacementGraph`; actions ``unfold`` and
    ``fold`` (a scope name, or none: all) and ``inspect`` (a node's inputs and consumers)."""

    _esm = esm("placement.js")
    _css = css("placement.css")
    actions = ("unfold", "fold", "inspect")
    selected = traitlets.Unicode("").tag(sync=True)    # the node the user clicked, by name

    def __init__(self, obj, **kwargs):
        self.shown = obj                               # what the cell displayed (its repr stays)
        graph = obj if isinstance(obj, PlacementGraph) else placement_graph(obj)
        super().__init__(graph, **kwargs)

    def do_unfold(self, scope=None):
        self.obj.unfold(scope)
        return self.obj.folded

    def do_fold(self, scope=None):
        self.obj.fold(scope)
        return self.obj.folded

    def do_inspect(self, node):
        info = self.obj.node(node)
        self.selected = info["name"]
        return info

    def _repr_mimebundle_(self, **kwargs):
        bundle = super()._repr_mimebundle_(**kwargs)
        if bundle is not None and self.shown is not self.obj:
            data, _ = bundle
            data["text/plain"] = repr(self.shown)
            data["text/html"] = self.shown._repr_html_()
        return bundle

    def __repr__(self):
        return f"PlacementView({self.shown!r})"
