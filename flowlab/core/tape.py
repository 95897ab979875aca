"""GradientTape: reverse-mode autodiff over eager ops.

While a tape is open, ``execute`` shows it every op. The tape keeps an op only if one of its
inputs is watched (a watched tensor, a trainable Variable, or an output of a kept op), so work on
constants costs nothing. ``gradient`` walks the kept ops backwards, calling each op's gradient
rule. Rules are written with flowlab ops, so an outer tape records them: gradients of gradients.
"""
from __future__ import annotations

import enum

import numpy as np

from ._context import state
from .device import is_local
from .execute import NO_ATTRS, READ_VARIABLE, Call, OpDef, record
from .tensor import Tensor, Variable, convert_to_tensor

_NEEDS_ONE = (True,)

__all__ = ["GradientTape", "UnconnectedGradients", "custom_gradient", "record_gradient", "record_op", "recording"]


class UnconnectedGradients(enum.Enum):
    """What ``gradient`` returns for a source the target does not depend on."""
    NONE = "none"
    ZERO = "zero"


class GradientTape:
    """Records ops so that gradients can be computed.

    >>> import flowlab as fl
    >>> x = fl.Variable(3.0)
    >>> with fl.GradientTape() as tape:
    ...     y = x * x
    >>> float(tape.gradient(y, x))
    6.0
    """

    def __init__(self, persistent=False, watch_accessed_variables=True):
        self._persistent = persistent
        self._auto = watch_accessed_variables
        self._watched: dict[int, object] = {}    # id -> tensor; holds a reference so ids stay unique
        self._variables: dict[int, Variable] = {}
        self._entries: list = []                 # (op, inputs, attrs, output, needs), in run order
        self._state = None
        self._used = False

    # -- recording ------------------------------------------------------------------------------
    def __enter__(self):
        if self._state is not None:
            raise RuntimeError("this GradientTape is already recording; make a new tape instead")
        self._state = state()
        self._state.push("tapes", self)
        return self

    def __exit__(self, *exc):
        self._state.pop("tapes", self)
        self._state = None
        return False

    def stop_recording(self):
        """A context in which this tape records nothing (e.g. for metrics inside a training step)."""
        return _Paused(self)

    def reset(self):
        """Forget everything recorded so far (keeps watching nothing)."""
        self._watched.clear()
        self._variables.clear()
        self._entries.clear()
        self._used = False

    def watch(self, tensor):
        """Record ops on ``tensor`` (or a nested structure of tensors) from now on."""
        for t in _flatten(tensor):
            if not isinstance(t, Tensor):
                raise TypeError(f"GradientTape.watch takes tensors or variables, not {type(t).__name__}")
            self._watch(t)

    def _watch(self, t):
        self._watched[id(t)] = t
        if isinstance(t, Variable):
            self._variables[id(t)] = t

    def watched_variables(self):
        """The variables this tape watched, in the order it first saw them."""
        return tuple(self._variables.values())

    def _record(self, op, inputs, attrs, output):
        # called by execute() for ops that have a gradient; Variables arrive as reads (below)
        watched = self._watched
        needs = [id(t) in watched for t in inputs]
        if True in needs:
            self._entries.append((op, inputs, attrs, output, needs))
            watched[id(output)] = output

    def _record_read(self, variable, read):
        """An op read ``variable``: its value then is ``read``, and gradients flow to the variable."""
        if id(variable) not in self._watched:
            if not (self._auto and variable.trainable):
                return
            self._watch(variable)
        self._entries.append((READ_VARIABLE, (variable,), NO_ATTRS, read, _NEEDS_ONE))
        self._watched[id(read)] = read

    # -- differentiating -----------------------------------------------------------------------
    def gradient(self, target, sources, output_gradients=None,
                 unconnected_gradients=UnconnectedGradients.NONE):
        """d(target)/d(sources), shaped like ``sources`` (a tensor, variable, list or dict of them).

        A non-scalar target is summed (or weighted by ``output_gradients``); a list of targets is
        summed. A source the target does not depend on gives None (or zeros, with
        ``unconnected_gradients="zero"``); so does an integer source.
        """
        if self._used and not self._persistent:
            raise RuntimeError("a non-persistent GradientTape can compute gradients only once; "
                               "use GradientTape(persistent=True) to call gradient() several times")
        self._used = True
        unconnected = UnconnectedGradients(unconnected_gradients)
        targets = _flatten(target)
        flat_sources = _flatten(sources)
        for s in flat_sources:
            if not isinstance(s, Tensor):
                raise TypeError(f"gradient sources must be tensors or variables, not {type(s).__name__}")
        if output_gradients is None:
            seeds = [None] * len(targets)
        else:
            seeds = _flatten(output_gradients)
            if len(seeds) != len(targets):
                raise ValueError(f"got {len(seeds)} output_gradients for {len(targets)} targets")
        # The tape must not record its own backward pass (an outer tape may: that is how
        # higher-order gradients work).
        st = self._state
        paused = st is not None and st.pop("tapes", self)
        try:
            grads = self._backward(targets, seeds)
        finally:
            if paused:
                st.push("tapes", self)
        if not self._persistent:
            self._entries = []    # a spent tape lets go of every tensor it kept
            self._watched = dict(self._variables)
        result = []
        for s in flat_sources:
            g = grads.get(id(s))
            if g is not None and not s.dtype.is_floating:
                g = None    # integer and bool sources have no gradient
            if g is None and unconnected is UnconnectedGradients.ZERO:
                g = _fill_like(s, 0)
            result.append(g)
        return _unflatten(sources, result)

    def _backward(self, targets, seeds):
        grads: dict[int, Tensor] = {}
        for t, seed in zip(targets, seeds):
            if not isinstance(t, Tensor):
                raise TypeError(f"gradient target must be a tensor, not {type(t).__name__}")
            g = _fill_like(t, 1) if seed is None else convert_to_tensor(seed, dtype=t.dtype)
            prev = grads.get(id(t))
            grads[id(t)] = g if prev is None else prev + g
        for op, inputs, attrs, output, needs in reversed(self._entries):
            g = grads.get(id(output))
            if g is None:
                continue
            in_grads = op.grad(Call(inputs, attrs, output, needs), g)
            for x, gx, need in zip(inputs, in_grads, needs):
                if gx is None or not need:
                    continue
                k = id(x)
                prev = grads.get(k)
                grads[k] = gx if prev is None else prev + gx
        return grads


def _fill_like(t, value):
    """Ones or zeros shaped like ``t``: eager, or as graph ops for a graph tensor (or an op where ``t``'s
    value is: on another task)."""
    if getattr(t, "_value", None) is not None:
        if is_local(t._device):
            return Tensor((np.ones_like if value else np.zeros_like)(t._value), t._device)
    elif t._shape is not None and None not in t._shape:   # a graph tensor of known shape: a constant, not an op run every step
        return t.graph.constant((np.ones if value else np.zeros)(t._shape, t._dtype))
    from .ops import math_ops
    return (math_ops.ones_like if value else math_ops.zeros_like)(t)


class _Paused:
    def __init__(self, tape):
        self._tape = tape

    def __enter__(self):
        if self._tape._state is None:
            raise RuntimeError("stop_recording() needs the tape to be recording (inside its `with` block)")
        self._paused = self._tape._state.pop("tapes", self._tape)

    def __exit__(self, *exc):
        if self._paused:
            self._tape._state.push("tapes", self._tape)
        return False


def _flatten(x):
    if isinstance(x, dict):
        return [v for k in sorted(x) for v in _flatten(x[k])]
    if isinstance(x, (list, tuple)):
        return [v for item in x for v in _flatten(item)]
    return [x]


def _unflatten(structure, flat):
    it = iter(flat)

    def build(s):
        if isinstance(s, dict):
            return {k: build(s[k]) for k in sorted(s)}
        if isinstance(s, (list, tuple)):
            return type(s)(build(v) for v in s)
        return next(it)

    return build(structure)


# -- gradients you write yourself -------------------------------------------------------------------
def record_gradient(name, inputs, output, grad_fn):
    """Show the recording tapes ``output`` as one op of the tensors ``inputs`` whose gradients, given
    the output's gradient ``g``, are ``grad_fn(g)`` (one per input, None where none flows). For
    code above the engine that computes a value its own way (a collective, a custom kernel)."""
    st = state()
    if not st.tapes:
        return
    n = len(inputs)

    def rule(call, g):
        grads = grad_fn(g)
        grads = tuple(grads) if isinstance(grads, (list, tuple)) else (grads,)
        if len(grads) != n:
            raise ValueError(f"the gradient function of {name} returned {len(grads)} gradients for {n} inputs")
        return grads

    record(st.tapes, OpDef(name, None, None, rule), list(inputs), NO_ATTRS, output)


def record_op(op, inputs, attrs, output) -> None:
    """Show this thread's tapes an op that an interpreter above core ran (cluster/remote.py)."""
    tapes = state().tapes
    if tapes:
        record(tapes, op, inputs, attrs, output)


def custom_gradient(f):
    """Decorator: ``f(*args)`` returns ``(y, grad_fn)``; tapes see ``y`` as one op of ``f``'s tensor
    arguments, differentiated by ``grad_fn(dy)`` (one gradient per tensor argument) instead of
    through the ops inside ``f``, which are not recorded.

    >>> import flowlab as fl
    >>> @fl.custom_gradient
    ... def clip_grad(x):
    ...     return fl.identity(x), lambda g: fl.minimum(fl.maximum(g, -1.0), 1.0)
    >>> x = fl.constant([3.0])
    >>> with fl.GradientTape() as tape:
    ...     tape.watch(x)
    ...     y = clip_grad(x) * 5.0
    >>> tape.gradient(y, x).numpy().tolist()
    [1.0]
    """
    def call(*args, **kwargs):
        st = state()
        tapes = st.tapes
        if not tapes:
            return f(*args, **kwargs)[0]
        st.tapes = []              # the ops inside f are not the gradient: keep them off the tapes
        try:
            y, grad_fn = f(*args, **kwargs)
        finally:
            st.tapes = tapes
        inputs = [a for a in args if isinstance(a, Tensor)]
        record_gradient(f"custom_gradient {getattr(f, '__name__', 'f')}", inputs, y, grad_fn)
        return y

    call.__name__ = getattr(f, "__name__", "custom_gradient")
    call.__doc__ = getattr(f, "__doc__", None)
    call.__wrapped__ = f
    return call


def recording() -> bool:
    """Is a GradientTape recording in this thread (one open and not paused by ``stop_recording``)?"""
    return bool(state().tapes)
