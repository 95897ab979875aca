"""Where an op goes: the stack of interpreters, one stack per thread.

``execute(op, inputs, attrs)`` (core/execute.py) hands every op to the innermost interpreter of
its thread, as JAX's ``bind`` does:

- the eager interpreter is the bottom one, implied while the stack is empty: it runs the op's
  kernel now (``execute.EAGER``; with nothing on the stack ``execute`` runs it inline);
- a graph builder adds a node to its graph instead (``graph.GraphBuilder``; ``with
  g.as_default():`` and ``@fl.function`` push one);
- a higher layer may push its own (anything with ``process(op, inputs, attrs)``).

What code above ``core`` needs of the stack is a function here, never a look at thread state:
:func:`current` (ask the innermost interpreter for what differs between running and building:
control dependencies, name scopes, whether a traced function called now runs inline, whether a new
tensor moves to the device scope's device), :func:`current_graph` (the graph ops are being added
to, or None: for code that adds nodes itself), and :func:`init_scope` (run ops now, even while a
graph is traced: where layers make their weights, as ``tf.init_scope``).
"""
from __future__ import annotations

import contextlib

from ._context import ACTIVE, state

__all__ = ["Interpreter", "interpreting", "current", "current_graph", "init_scope"]


class Interpreter:
    """Takes each op of its thread while it is the innermost: ``process(op, inputs, attrs)`` returns
    the op's output. ``graph``: the Graph it adds nodes to, if it builds one (else None). The rest
    is what callers ask of the innermost one; the defaults are the eager interpreter's (ops run now).

    - ``inline_calls``: a traced function called now runs its Python body, so that its ops come
      here (a graph builder: the call becomes part of the graph), instead of its own graph.
    - ``moves_new_tensors``: a tensor made now (``fl.constant``, a random draw) moves to the device
      of the enclosing ``fl.device`` scope at once (a graph builder places the node that uses it).
    - ``control_dependencies(inputs)``, ``name_scope(name)``: the context managers of
      ``fl.control_dependencies`` and ``fl.name_scope`` (ops that run now run in program order and
      have no names: nothing to do)."""

    graph = None
    inline_calls = False
    moves_new_tensors = True

    def process(self, op, inputs, attrs):
        raise NotImplementedError

    def control_dependencies(self, control_inputs):
        return contextlib.nullcontext()

    def name_scope(self, name):
        return contextlib.nullcontext(name)


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


_BOTTOM: list = []   # [the eager interpreter]: core/execute.py puts it here when it makes it


def current() -> Interpreter:
    """The innermost interpreter of this thread (the eager one when none is pushed)."""
    interp = state().interpreter
    return interp if interp is not None else _BOTTOM[0]


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
    return interpreting(_BOTTOM[0])
