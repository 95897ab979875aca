"""Where an op goes: the stack of interpreters, one stack per thread.

``execute(op, inputs, attrs)`` (core/execute.py) hands every op to the innermost interpreter of
its thread, as JAX's ``bind`` does:

- the eager interpreter is the bottom one, implied while the stack is empty: it runs the op's
  kernel now (``execute.EAGER``; with nothing on the stack ``execute`` runs it inline);
- a graph builder adds a node to its graph instead (``graph.GraphBuilder``; ``with
  g.as_default():`` and ``@fl.function`` push one);
- a higher layer may push its own (anything with ``process(op, inputs, attrs)``).

What code above ``core`` needs of the stack is a function here, never a look at thread state:
:func:`current_graph` (the graph ops are being added to, or None), and :func:`init_scope` (run ops
now, even while a graph is traced: where layers make their weights, as ``tf.init_scope``).
"""
from __future__ import annotations

from ._context import ACTIVE, state

__all__ = ["Interpreter", "interpreting", "current", "current_graph", "init_scope"]


class Interpreter:
    """Takes each op of its thread while it is the innermost: ``process(op, inputs, attrs)`` returns
    the op's output. ``graph``: the Graph it adds nodes to, if it builds one (else None)."""

    graph = None

    def process(self, op, inputs, attrs):
        raise NotImplementedError


def _push(interp) -> None:
    st = state()
    st.interpreters.append(interp)
    ACTIVE.add(1)                      # while any is pushed, ops skip the eager fast paths
    st.interpreter, st.graph = interp, interp.graph


def _pop(interp) -> None:
    st = state()
    stack = st.interpreters
    for i in range(len(stack) - 1, -1, -1):      # the exact one: scopes may close out of order
        if stack[i] is interp:
            del stack[i]
            ACTIVE.add(-1)
            break
    top = stack[-1] if stack else None
    st.interpreter, st.graph = top, (top.graph if top is not None else None)


class interpreting:
    """``with interpreting(interp):`` ops of this thread go to ``interp`` inside the block."""

    __slots__ = ("interp",)

    def __init__(self, interp):
        self.interp = interp

    def __enter__(self):
        _push(self.interp)
        return self.interp

    def __exit__(self, *exc):
        _pop(self.interp)
        return False


def current() -> Interpreter:
    """The innermost interpreter of this thread (the eager one when none is pushed)."""
    interp = state().interpreter
    if interp is None:
        from .execute import EAGER
        return EAGER
    return interp


def current_graph():
    """The Graph the ops of this thread are being added to (``@fl.function`` tracing, ``with
    g.as_default():``), or None when they run now."""
    return state().graph


class _Nothing:
    __slots__ = ()

    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


_NOTHING = _Nothing()


def init_scope():
    """``with fl.init_scope():`` ops inside run now, even while a graph is being traced (weights a
    model makes when it is first called inside ``@fl.function`` get real initial values). Where ops
    run now already, it changes nothing."""
    if state().interpreter is None:
        return _NOTHING
    from .execute import EAGER
    return interpreting(EAGER)
