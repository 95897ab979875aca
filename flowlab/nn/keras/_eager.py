"""``eager()``: run ops now, even while a graph is being traced (as ``tf.init_scope``). Layers
create their weights inside it, so a model first called inside ``@fl.function`` still gets
real initial values."""
from __future__ import annotations

import contextlib

from ...core._context import state


@contextlib.contextmanager
def eager():
    st = state()
    graph = st.graph
    if graph is None:
        yield
        return
    st.graph = None
    try:
        yield
    finally:
        st.graph = graph
