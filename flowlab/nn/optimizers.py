"""Optimizers: SGD (with momentum), Adam, Adadelta and RMSprop, with ``apply_gradients`` and ``minimize``.

Each optimizer's update rule is one pure function over arrays (``_sgd``, ``_adam``, ``_adadelta``...)
that returns the new value and new slots; the classes only keep state. Tensors read earlier never
change: an update writes into a variable's array only when nothing but the variable holds it (no
tensor, view, fetched value or graph value refers to it) and no other thread runs, and otherwise
gives the variable a new array (see ``Optimizer._apply_one``).
"""
from __future__ import annotations

import math
import sys
import threading
import warnings

import numpy as np

from ..core import dtypes
from ..core.backends import array_module, to_device_of
from ..core.errors import InvalidArgumentError, source_line
from ..core.execute import defop, execute
from ..core.tape import GradientTape
from ..core.tensor import Tensor, Variable, convert_to_tensor

__all__ = ["Optimizer", "SGD", "Adam", "Adadelta", "RMSprop", "Adagrad", "get"]


class _Holder:
    __slots__ = ("_value",)


def _calibrate() -> int:
    """What ``sys.getrefcount`` says, in ``_apply_one``, of an array that only its variable holds:
    the variable's reference, the local ``value`` and the call's own argument (measured the same
    way, so it holds whatever the interpreter counts)."""
    holder = _Holder()
    holder._value = np.empty(1)
    value = holder._value
    return sys.getrefcount(value)


_ONLY_THE_VARIABLE = _calibrate() if hasattr(sys, "getrefcount") else -1

_replica_hook = None   # set by flowlab.distribute: hook(optimizer, grads_and_vars, apply) -> result


def set_replica_hook(hook) -> None:
    """Route every ``apply_gradients`` through ``hook(optimizer, grads_and_vars, apply)``, which calls
    ``apply(optimizer, grads_and_vars)`` itself (after an all-reduce, in a replica); None removes it."""
    global _replica_hook
    _replica_hook = hook


class Optimizer:
    """Base class: keeps per-variable slots and the step count; subclasses give ``_update``."""

    _slot_names: tuple = ()
    _slot_start = 0.0     # every slot's value before the first step

    def __init__(self, learning_rate, name):
        self.name = name
        self.iterations = Variable(0, dtype=dtypes.int64, trainable=False, name=f"{name}/iterations")
        self._lr_variable = None
        self._schedule = None
        self.learning_rate = learning_rate
        self._slots: dict[int, dict] = {}
        self._slot_vars: dict[int, Variable] = {}
        self._plain_sgd = False   # SGD without momentum: no slots, one fast path

    @property
    def learning_rate(self):
        """The learning rate: a float64 Variable, read each time an update runs, so assigning to it
        (``opt.learning_rate = 0.01``, or ``.assign``) takes effect at once, also inside a traced
        ``@fl.function`` (nothing is retraced); or the schedule, a function of the step, if one was given."""
        return self._schedule if self._schedule is not None else self._lr_variable

    @learning_rate.setter
    def learning_rate(self, value):
        if callable(value) and not isinstance(value, Tensor):
            self._schedule = value
            return
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise TypeError(f"{self.name}: learning_rate must be a number or a function of the step, "
                            f"got {type(value).__name__}") from None
        self._schedule = None
        if self._lr_variable is None:
            self._lr_variable = Variable(number, dtype=dtypes.float64, trainable=False,
                                         name=f"{self.name}/learning_rate")
        else:
            self._lr_variable.assign(number)

    def _lr(self, step):
        if self._schedule is not None:
            return float(self._schedule(step))
        return float(self._lr_variable._value)

    def apply_gradients(self, grads_and_vars):
        """Apply one step: ``grads_and_vars`` is an iterable of (gradient, variable). Pairs whose
        gradient is None are skipped (with a warning if every gradient is None). Inside
        ``@fl.function`` each update becomes a node that runs when the graph runs. Inside a
        distribution strategy's replica, the strategy combines the replicas' gradients first."""
        if _replica_hook is not None:
            return _replica_hook(self, grads_and_vars, Optimizer._apply)
        return self._apply(grads_and_vars)

    def _apply(self, grads_and_vars):
        pairs = list(grads_and_vars)
        live = [(g, v) for g, v in pairs if g is not None]
        if pairs and not live:
            warnings.warn(f"{self.name}: no gradients for any variable ({[v.name for _, v in pairs]}); "
                          "is the loss computed from them inside the GradientTape?", stacklevel=3)
        for g, v in live:
            if not isinstance(v, Variable):
                raise TypeError(f"{self.name}.apply_gradients: expected a Variable, got {type(v).__name__}; "
                                "only fl.Variable can be updated")
        for g, v in live:   # ops: eagerly they run now, inside @fl.function they are nodes
            execute(_UPDATE, (g,), {"optimizer": self, "variable": v})
        execute(_ADVANCE, (), {"optimizer": self})
        return self.iterations

    def _apply_one(self, v, garr, lr, step, donated=False):
        # NOTE: this runs once per variable per training step (also as a graph node): keep it lean
        value = v._value
        if garr.shape != value.shape:
            raise InvalidArgumentError(
                f"{self.name}.apply_gradients: gradient of shape {garr.shape} does not match variable "
                f"{v.name!r} of shape {value.shape}\n  at {source_line()}", op="apply_gradients")
        if garr.dtype is not value.dtype and garr.dtype != value.dtype:
            garr = garr.astype(value.dtype)
        # The variable's array may be written into when no one else can see it: its reference count
        # is that of an array held by the variable alone (a tensor, a view, a value a graph fetched
        # or still uses: each holds a reference), it is a writable numpy array that owns its memory,
        # and no other thread runs (one could take the array while numpy writes it, GIL released:
        # a parameter-server task serves reads and updates at once). Same arithmetic, same bits.
        own = (value.__class__ is np.ndarray and sys.getrefcount(value) == _ONLY_THE_VARIABLE
               and value.base is None and value.flags.writeable and threading.active_count() == 1)
        if self._plain_sgd and not self.momentum:   # the common case: no slots to keep
            new = _sgd_plain(value, garr, lr, own, donated)
        else:
            slots = self._slots.get(id(v))
            if slots is None:
                slots = self._slots[id(v)] = {s: np.full_like(value, self._slot_start) for s in self._slot_names}
                self._slot_vars[id(v)] = v
            new, new_slots = self._update(value, garr, slots, lr, step, own)
            if new_slots:
                slots.update(new_slots)
        v._value = new
        return new

    def minimize(self, loss, var_list, tape=None):
        """Compute gradients of ``loss`` (a callable, or a tensor recorded on ``tape``) with respect
        to ``var_list`` (a list, or a callable returning one) and apply them."""
        if tape is None:
            if not callable(loss):
                raise TypeError("minimize: without a tape, loss must be a callable that computes the loss")
            with GradientTape() as tape:
                loss_value = loss()
                variables = var_list() if callable(var_list) else var_list
        else:
            loss_value = loss() if callable(loss) else loss
            variables = var_list() if callable(var_list) else var_list
        variables = list(variables)
        grads = tape.gradient(loss_value, variables)
        return self.apply_gradients(zip(grads, variables))

    def get_slot(self, var, slot_name):
        """The slot ``slot_name`` (e.g. "m", "momentum") kept for ``var``, as a tensor."""
        if slot_name not in self._slot_names:
            raise KeyError(f"{self.name} has slots {list(self._slot_names)}, not {slot_name!r}")
        return Tensor(self._slots[id(var)][slot_name])

    def get_slot_names(self):
        return list(self._slot_names)

    def variables(self):
        """The optimizer's own state: the step count and every slot, as variables (copies)."""
        out = [self.iterations]
        for key, slots in self._slots.items():
            out.extend(Variable(slots[s], trainable=False, name=f"{self._slot_vars[key]._name}/{s}")
                       for s in self._slot_names)
        return out

    # -- what a checkpoint saves (flowlab.nn.checkpoint) -----------------------------------------
    def _checkpoint_children(self) -> dict:
        """The optimizer's own variables, by name; slots are saved per variable (``_slot_items``)."""
        children = {"iterations": self.iterations}
        if self._lr_variable is not None and self._schedule is None:
            children["learning_rate"] = self._lr_variable
        return children

    def _slot_items(self):
        """(variable, slot name, array) for every slot made so far."""
        return [(self._slot_vars[key], name, value) for key, slots in self._slots.items()
                for name, value in slots.items()]

    def _restore_slot(self, var, slot_name, value):
        """Set ``var``'s slot ``slot_name`` (made now if no step has run yet) to a copy of ``value``."""
        if slot_name not in self._slot_names:
            raise KeyError(f"{self.name} has slots {list(self._slot_names)}, not {slot_name!r}")
        want = tuple(var._value.shape)
        if tuple(value.shape) != want:
            raise ValueError(f"{self.name}: slot {slot_name!r} of {var.name!r} has shape {want}, "
                             f"the saved value {tuple(value.shape)}")
        slots = self._slots.get(id(var))
        if slots is None:
            slots = self._slots[id(var)] = {s: np.full_like(var._value, self._slot_start) for s in self._slot_names}
            self._slot_vars[id(var)] = var
        slots[slot_name] = np.array(value, dtype=var._value.dtype)

    def get_config(self) -> dict:
        lr = self._schedule if self._schedule is not None else float(self._lr_variable._value)
        return {"name": self.name, "learning_rate": lr}

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items() if k != "name")
        return f"{type(self).__name__}({args})"


# -- update rules: (value, grad, slots, lr, step, own) -> (new value, new slots) -----------------
# ``own``: the rule may write the new value into ``value`` (only the variable holds it, see
# ``_apply_one``); otherwise it must leave ``value`` unchanged. Either way the arithmetic is the
# same, so the bits are. NOTE: ``np.subtract(value, step, out=step)`` writes into the temporary
# ``step`` (never into a ``value`` that tensors may share): one allocation per update, not two.
_NO_SLOTS: dict = {}


def _sgd_plain(value, grad, lr, own, donated=False):
    """``value - grad * lr``: into ``value`` if ``own``; ``donated``: ``grad`` may be written into."""
    if donated and grad.__class__ is np.ndarray and grad.dtype.kind == "f":
        step = np.multiply(grad, lr, out=grad)
    else:
        step = grad * lr
    if step.__class__ is not np.ndarray:   # a 0-d input gives a numpy scalar (or a cupy array)
        step = np.asarray(step) if isinstance(step, np.generic) else step
        if step.__class__ is not np.ndarray:
            return value - step
    return np.subtract(value, step, out=value if own and value.shape == step.shape and value.dtype == step.dtype
                       else step)


def _sgd(value, grad, slots, lr, momentum, nesterov, own=False):
    if not momentum:
        return _sgd_plain(value, grad, lr, own), _NO_SLOTS
    velocity = momentum * slots["momentum"] - lr * grad
    if nesterov:
        return value + momentum * velocity - lr * grad, {"momentum": velocity}
    return value + velocity, {"momentum": velocity}


def _adam(value, grad, slots, lr, step, beta_1, beta_2, epsilon, own=False):
    m = beta_1 * slots["m"] + (1 - beta_1) * grad
    v = beta_2 * slots["v"] + (1 - beta_2) * (grad * grad)
    # bias correction folded into the step size, as in the Adam paper's efficient form
    alpha = lr * math.sqrt(1 - beta_2 ** step) / (1 - beta_1 ** step)
    update = array_module(v).asarray(np.sqrt(v))   # an array (sqrt of a 0-d one is a scalar), on v's device
    update += epsilon
    np.divide(m, update, out=update)
    update *= alpha
    into = value if own and value.shape == update.shape and value.dtype == update.dtype else update
    return np.subtract(value, update, out=into), {"m": m, "v": v}


def _adadelta(value, grad, slots, lr, rho, epsilon):
    accum_grad = rho * slots["accum_grad"] + (1 - rho) * (grad * grad)
    delta = np.sqrt(slots["accum_var"] + epsilon) / np.sqrt(accum_grad + epsilon) * grad
    accum_var = rho * slots["accum_var"] + (1 - rho) * (delta * delta)
    return value - lr * delta, {"accum_grad": accum_grad, "accum_var": accum_var}


def _rmsprop(value, grad, slots, lr, rho, momentum, epsilon):
    rms = rho * slots["rms"] + (1 - rho) * (grad * grad)
    step = lr * grad / (np.sqrt(rms) + epsilon)
    if not momentum:
        return value - step, {"rms": rms}
    velocity = momentum * slots["momentum"] + step
    return value - velocity, {"rms": rms, "momentum": velocity}


def _adagrad(value, grad, slots, lr, epsilon):
    accumulator = slots["accumulator"] + grad * grad
    return value - lr * grad / (np.sqrt(accumulator) + epsilon), {"accumulator": accumulator}


# -- apply_gradients as ops: one update per variable, then one that counts the step --------------
def _update_kernel(grad, *, optimizer, variable, donated=False):
    done = int(optimizer.iterations._value)
    lr = float(optimizer._lr_variable._value) if optimizer._schedule is None else float(optimizer._schedule(done))
    return optimizer._apply_one(variable, grad, lr, done + 1, donated)


def _update_kernel_donated(grad, *, optimizer, variable):
    """The update when the graph plan gives up ``grad`` (buffer reuse): it may scale it in place."""
    return _update_kernel(grad, optimizer=optimizer, variable=variable, donated=True)


def _update_eager(inputs, attrs):
    """The update now: the gradient copied to the variable's device if it is elsewhere."""
    optimizer, v, g = attrs["optimizer"], attrs["variable"], inputs[0]
    garr = g._value if g.__class__ is Tensor else convert_to_tensor(g)._value
    if garr.__class__ is not v._value.__class__:
        garr = to_device_of(v._value, garr)
    done = int(optimizer.iterations._value)
    return Tensor(optimizer._apply_one(v, garr, optimizer._lr(done), done + 1), v._device)


def _update_rule(grad, *, optimizer, variable):
    return variable._value.shape, variable._value.dtype


def _advance_kernel(*, optimizer):
    optimizer.iterations._value = optimizer.iterations._value + 1
    return optimizer.iterations._value


_UPDATE = defop("optimizer_update", _update_kernel, _update_rule, stateful=True, eager=_update_eager,
                doc="One optimizer step for one variable.", inplace_kernel=_update_kernel_donated)
_ADVANCE = defop("optimizer_advance", _advance_kernel, lambda *, optimizer: ((), np.dtype(np.int64)),
                 stateful=True, eager=lambda inputs, attrs: Tensor(_advance_kernel(**attrs)),   # never placed
                 doc="Count one optimizer step, after its updates.")


class SGD(Optimizer):
    """Gradient descent: ``v = momentum * v - lr * g; w += v`` (plain ``w -= lr * g`` without momentum).

    >>> import flowlab as fl
    >>> w = fl.Variable(1.0)
    >>> _ = fl.optimizers.SGD(0.1).apply_gradients([(fl.constant(2.0), w)])
    >>> round(float(w), 6)
    0.8
    """

    def __init__(self, learning_rate=0.01, momentum=0.0, nesterov=False, name="SGD"):
        if not 0 <= momentum <= 1:
            raise ValueError(f"SGD: momentum must be in [0, 1], got {momentum}")
        super().__init__(learning_rate, name)
        self.momentum, self.nesterov = float(momentum), bool(nesterov)
        self._slot_names = ("momentum",) if self.momentum else ()
        self._plain_sgd = type(self)._update is SGD._update and not self.momentum

    def _update(self, value, grad, slots, lr, step, own=False):
        return _sgd(value, grad, slots, lr, self.momentum, self.nesterov, own)

    def get_config(self):
        return {**super().get_config(), "momentum": self.momentum, "nesterov": self.nesterov}


class Adam(Optimizer):
    """Adam: running means of the gradient (m) and its square (v), with bias correction."""

    _slot_names = ("m", "v")

    def __init__(self, learning_rate=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-7, name="Adam"):
        super().__init__(learning_rate, name)
        self.beta_1, self.beta_2, self.epsilon = float(beta_1), float(beta_2), float(epsilon)

    def _update(self, value, grad, slots, lr, step, own=False):
        return _adam(value, grad, slots, lr, step, self.beta_1, self.beta_2, self.epsilon, own)

    def get_config(self):
        return {**super().get_config(), "beta_1": self.beta_1, "beta_2": self.beta_2, "epsilon": self.epsilon}


class Adadelta(Optimizer):
    """Adadelta: scales each step by the ratio of running RMS of past updates to past gradients."""

    _slot_names = ("accum_grad", "accum_var")

    def __init__(self, learning_rate=0.001, rho=0.95, epsilon=1e-7, name="Adadelta"):
        super().__init__(learning_rate, name)
        self.rho, self.epsilon = float(rho), float(epsilon)

    def _update(self, value, grad, slots, lr, step, own=False):
        return _adadelta(value, grad, slots, lr, self.rho, self.epsilon)

    def get_config(self):
        return {**super().get_config(), "rho": self.rho, "epsilon": self.epsilon}


class RMSprop(Optimizer):
    """RMSprop: divides each step by a running root-mean-square of recent gradients (Keras's default)."""

    def __init__(self, learning_rate=0.001, rho=0.9, momentum=0.0, epsilon=1e-7, name="RMSprop"):
        if not 0 <= momentum <= 1:
            raise ValueError(f"RMSprop: momentum must be in [0, 1], got {momentum}")
        super().__init__(learning_rate, name)
        self.rho, self.momentum, self.epsilon = float(rho), float(momentum), float(epsilon)
        self._slot_names = ("rms", "momentum") if self.momentum else ("rms",)

    def _update(self, value, grad, slots, lr, step, own=False):
        return _rmsprop(value, grad, slots, lr, self.rho, self.momentum, self.epsilon)

    def get_config(self):
        return {**super().get_config(), "rho": self.rho, "momentum": self.momentum, "epsilon": self.epsilon}


class Adagrad(Optimizer):
    """Adagrad: divides each step by the root of the sum of all past squared gradients (per
    weight), which starts at ``initial_accumulator_value``."""

    _slot_names = ("accumulator",)

    def __init__(self, learning_rate=0.001, initial_accumulator_value=0.1, epsilon=1e-7, name="Adagrad"):
        super().__init__(learning_rate, name)
        self._slot_start, self.epsilon = float(initial_accumulator_value), float(epsilon)

    def _update(self, value, grad, slots, lr, step, own=False):
        return _adagrad(value, grad, slots, lr, self.epsilon)

    def get_config(self):
        return {**super().get_config(), "initial_accumulator_value": self._slot_start, "epsilon": self.epsilon}


_BY_NAME = {"sgd": SGD, "adam": Adam, "adadelta": Adadelta, "rmsprop": RMSprop, "adagrad": Adagrad}


def get(identifier) -> Optimizer:
    """An optimizer from a name ("sgd", "adam", "adadelta", "rmsprop", "adagrad": default settings) or an instance."""
    if isinstance(identifier, Optimizer):
        return identifier
    if isinstance(identifier, str) and identifier.lower() in _BY_NAME:
        return _BY_NAME[identifier.lower()]()
    raise ValueError(f"unknown optimizer {identifier!r}; use one of {sorted(_BY_NAME)} or an optimizer instance")
