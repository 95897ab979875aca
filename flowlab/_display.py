"""Where a plain object meets the notebook: its live view in a Jupyter kernel, its text and HTML elsewhere.

Lower layers never import widgets. An object that has a live view names it by string in a class
attribute, ``_view = "flowlab.widgets.progress:ProgressView"``, and keeps a JSON-safe
``snapshot()``; the view is imported only inside a kernel with anywidget installed. A view is built
as ``View(obj)`` and re-reads ``obj.snapshot()`` on ``refresh()`` (and, for live objects, from a
background thread). Outside a kernel (a shell, a test, a script) the object prints as text instead.

Two ways in:

- ``mimebundle(obj)``, returned by the object's ``_repr_mimebundle_``: the object *is* its widget
  when it is a cell's last expression, shown once, with its text and static HTML in the same bundle
  (what GitHub and a notebook opened without a kernel show);
- ``show(obj)``: display the view now and return it (a fit's progress bar, drawn as it runs).
"""
from __future__ import annotations

import importlib
import sys

__all__ = ["in_kernel", "show", "view", "mimebundle", "static_html"]


def in_kernel() -> bool:
    """True inside a Jupyter kernel (IPython with a kernel attached), without importing IPython."""
    ipy = sys.modules.get("IPython")
    if ipy is None:
        return False
    shell = ipy.get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def view(obj):
    """``obj``'s live view, built once per object and reused while it is open (every display of
    the object shows the same widget model). Raises ImportError without the widget libraries."""
    cached = getattr(obj, "_live_view", None)
    if cached is not None and getattr(cached, "comm", None) is not None:
        return cached
    module, name = type(obj)._view.split(":")
    built = getattr(importlib.import_module(module), name)(obj)
    try:
        obj._live_view = built
    except AttributeError:     # __slots__ or a read-only object: a new view each time
        pass
    return built


def static_html(obj) -> str:
    """``obj``'s static picture (HTML with an inline SVG), drawn by the function its class names in
    ``_static = "module:function"``: how a lower layer's object (a ConcreteFunction, a v1 Graph)
    gets the picture an upper layer draws, without importing it."""
    module, name = type(obj)._static.split(":")
    return getattr(importlib.import_module(module), name)(obj)


def mimebundle(obj, include=None, exclude=None):
    """For an object's ``_repr_mimebundle_``: in a kernel with anywidget, its live view's bundle
    (widget, text and static HTML); otherwise None, and IPython uses ``_repr_html_``/``__repr__``."""
    if not in_kernel():
        return None
    try:
        live = view(obj)
    except ImportError:        # no anywidget: the notebook shows the object's HTML repr
        return None
    return live._repr_mimebundle_(include=include, exclude=exclude)


def show(obj, *, force: bool = False):
    """Display ``obj``'s live view and return it (call ``view.refresh()`` after ``obj`` changes),
    or None outside a kernel. ``force=True`` builds the view even outside a kernel (for tests)."""
    if not (force or in_kernel()):
        return None
    try:
        live = view(obj)
    except ImportError:   # no widget library: the notebook still shows the object's HTML repr
        if force:
            raise
        from IPython.display import display
        display(obj)
        return None
    if not force:
        from IPython.display import display
        display(live)
    return live
