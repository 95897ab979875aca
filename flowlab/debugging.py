"""Debugging tools (``fl.debugging``, as ``tf.debugging``): see DESIGN.md, "core"."""
# Numerics: stop at the first op that makes NaN or Inf (flowlab/core/numerics.py).
from .core.numerics import (check_numerics, check_numerics_enabled, disable_check_numerics,  # noqa: F401
                            enable_check_numerics)
# Devices: log where each op runs (flowlab/core/device.py).
from .core.device import get_log_device_placement, set_log_device_placement  # noqa: F401,E402
from . import _traceback  # noqa: E402


# Tracebacks: in a notebook, flowlab's own frames are hidden (flowlab/_traceback.py).
def enable_traceback_filtering() -> None:
    """Hide flowlab's own frames from tracebacks shown in a notebook (the default): the cell, your
    own functions and the message stay, and one line says how many frames were hidden."""
    _traceback.set_enabled(True)
    _traceback.install()


def disable_traceback_filtering() -> None:
    """Show every frame, flowlab's included (for flowlab's developers; ``FLOWLAB_TRACEBACK_FILTERING=0``
    does the same from the start)."""
    _traceback.set_enabled(False)


def is_traceback_filtering_enabled() -> bool:
    """Whether tracebacks in a notebook hide flowlab's own frames."""
    return _traceback.enabled()


# Placement: where each op of a traced function or a graph runs (flowlab/widgets/placement.py).
def placement_graph(fn_or_graph, *args, **kwargs):
    """The placement graph of an ``@fl.function`` (traced for ``*args``, ``**kwargs``), a
    ``ConcreteFunction`` or a ``Graph`` (``tf.get_default_graph()`` of ``flowlab.compat.v1``): nodes
    coloured by task and device, copies between devices labelled with the bytes they move, hover for
    a node's op, shapes, device and source line, name scopes folded in large graphs. A cell's last
    expression shows it as a widget; ``repr``/``to_svg()`` elsewhere."""
    from .widgets.placement import placement_graph as build
    return build(fn_or_graph, *args, **kwargs)
