"""Recording collectives on gradient tapes, so that ``tape.gradient`` runs through them: each
collective shows the tapes one op whose gradient is another collective (core's
``record_gradient``, the hook behind ``fl.custom_gradient``).
"""
from __future__ import annotations

from flowlab.core._context import ACTIVE, state
from flowlab.core.tape import record_gradient

__all__ = ["recording", "record"]


def recording() -> bool:
    """Is a GradientTape recording in this thread?"""
    return bool(ACTIVE.count) and bool(state().tapes)


def record(name: str, x, out, grad_fn) -> None:
    """Tell this thread's tapes that ``out`` was computed from the tensor ``x`` by a collective whose
    input gradient, given the output gradient ``g`` (a Tensor), is ``grad_fn(g)``."""
    record_gradient(name, [x], out, grad_fn)


def in_graph() -> bool:
    """Is this thread building a graph (inside ``@fl.function`` tracing)?"""
    return bool(ACTIVE.count) and state().graph is not None
