"""Where a plain object meets the notebook: ``show(obj)`` displays its live widget in a Jupyter kernel.

Lower layers never import widgets. An object that has a live view names it by string in a class
attribute, ``_view = "flowlab.widgets.progress:ProgressView"``, and keeps a JSON-safe
``snapshot()``; ``show`` imports the view only inside a kernel with ipywidgets installed. A view is
built as ``View(obj)`` and re-reads ``obj.snapshot()`` on ``refresh()``. Outside a kernel (a shell,
a test, a script) ``show`` returns None and the object prints as text instead.
"""
from __future__ import annotations

import importlib
import sys

__all__ = ["in_kernel", "show"]


def in_kernel() -> bool:
    """True inside a Jupyter kernel (IPython with a kernel attached), without importing IPython."""
    ipy = sys.modules.get("IPython")
    if ipy is None:
        return False
    shell = ipy.get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def show(obj, *, force: bool = False):
    """Display ``obj``'s live view and return it (call ``view.refresh()`` after ``obj`` changes),
    or None outside a kernel. ``force=True`` builds the view even outside a kernel (for tests)."""
    if not (force or in_kernel()):
        return None
    try:
        module, name = type(obj)._view.split(":")
        view = getattr(importlib.import_module(module), name)(obj)
    except ImportError:   # no ipywidgets: the notebook still shows the object's HTML repr
        if force:
            raise
        from IPython.display import display
        display(obj)
        return None
    if not force:
        from IPython.display import display
        display(view)
    return view
