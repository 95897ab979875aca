"""``Layer``: a piece of a model that holds weights and turns input tensors into output tensors.

A layer creates its weights the first time it is called, when it knows the input's shape
(``build``), then runs ``call`` on every call. Layers assigned as attributes of another layer (or
model) are tracked: their weights count as the owner's weights, and a checkpoint saves them under
the attribute's name. Whether a call is training (dropout on, batch statistics used) is the
``training`` argument, passed down to nested layers unless they are given one of their own.
"""
from __future__ import annotations

import inspect
import itertools
import re
import threading
from collections import defaultdict

import numpy as np

from ....core import dtypes
from ....core.errors import InvalidArgumentError, describe, source_line
from ....core.graph import Graph
from ....core.ops import math_ops
from ....core.tensor import Tensor, Variable, convert_to_tensor
from .. import initializers
from ....core.interpreters import init_scope

__all__ = ["Layer", "InputLayer", "Input", "training_flag"]

_counters: dict = defaultdict(itertools.count)
_context = threading.local()


def unique_name(base: str) -> str:
    """'dense', then 'dense_1', 'dense_2'... (per process, as Keras names layers)."""
    n = next(_counters[base])
    return base if n == 0 else f"{base}_{n}"


def snake_case(name: str) -> str:
    """'BatchNormalization' -> 'batch_normalization', 'Conv2D' -> 'conv2d'."""
    name = re.sub(r"(.)([A-Z][a-z0-9]+)", r"\1_\2", name)
    return re.sub(r"([a-z])([A-Z])", r"\1_\2", name).lower()


def training_flag(training=None) -> bool:
    """``training`` if given, else the value of the enclosing layer call (False outside any)."""
    if training is not None:
        return bool(training)
    return getattr(_context, "training", False)


def _takes_training(cls) -> bool:
    found = cls.__dict__.get("_call_takes_training")
    if found is None:
        params = inspect.signature(cls.call).parameters
        found = "training" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())
        setattr(cls, "_call_takes_training", found)
    return found


def static_shape(x) -> tuple:
    return tuple(x.shape) if hasattr(x, "shape") else ()


class Layer:
    """Base class of every layer. Subclasses give ``build(input_shape)`` (create weights with
    ``add_weight``) and ``call(inputs, training=None)``.

    >>> import flowlab as fl
    >>> class Scale(fl.keras.layers.Layer):
    ...     def build(self, input_shape):
    ...         self.w = self.add_weight("w", (input_shape[-1],), initializer="ones")
    ...     def call(self, x):
    ...         return x * self.w
    >>> Scale()(fl.ones([2, 3])).shape
    TensorShape([2, 3])
    """

    def __init__(self, trainable=True, name=None, dtype="float32", input_shape=None, batch_input_shape=None,
                 input_dim=None, **kwargs):
        if kwargs:
            raise TypeError(f"{type(self).__name__}: unexpected keyword argument(s) {sorted(kwargs)}")
        object.__setattr__(self, "_children", {})     # attribute name -> tracked layer or variable
        self._name = name or unique_name(snake_case(type(self).__name__))
        self._trainable = bool(trainable)
        self._dtype = dtypes.as_dtype(dtype)
        self.built = False
        self._output_shape = None
        if input_dim is not None:
            input_shape = (input_dim,)
        if batch_input_shape is not None:
            self._batch_input_shape = tuple(batch_input_shape)
        elif input_shape is not None:
            self._batch_input_shape = (None, *tuple(input_shape))
        else:
            self._batch_input_shape = None

    # -- what it holds ---------------------------------------------------------------------------
    def __setattr__(self, name, value):
        children = self.__dict__.get("_children")
        if children is not None and not name.startswith("_"):
            if isinstance(value, (Layer, Variable)):
                if not any(c is value for c in children.values()):
                    children[name] = value
            elif isinstance(value, (list, tuple)) and value and all(isinstance(v, Layer) for v in value):
                for i, v in enumerate(value):
                    children[f"{name}/{i}"] = v
        object.__setattr__(self, name, value)

    @property
    def name(self) -> str:
        return self._name

    @property
    def dtype(self):
        return self._dtype

    @property
    def trainable(self) -> bool:
        return self._trainable

    @trainable.setter
    def trainable(self, value):
        """A frozen layer (``trainable = False``) keeps its weights through training."""
        self._trainable = bool(value)

    def _sublayers(self):
        return [c for c in self._children.values() if isinstance(c, Layer)]

    @property
    def layers(self):
        """The layers tracked directly by this one, in the order they were assigned."""
        return self._sublayers()

    def _own_weights(self):
        return [c for c in self._children.values() if isinstance(c, Variable)]

    def _collect(self, trainable):
        out, seen = [], set()

        def visit(layer, frozen):
            frozen = frozen or not layer.trainable
            for w in layer._own_weights():
                if id(w) in seen:
                    continue
                want = (trainable is None or (trainable and w.trainable and not frozen)
                        or (not trainable and (not w.trainable or frozen)))
                if want:
                    seen.add(id(w))
                    out.append(w)
            for sub in layer._sublayers():
                visit(sub, frozen)

        visit(self, False)
        return out

    @property
    def weights(self):
        """Every variable of this layer and the layers it holds (trainable first, as Keras lists them)."""
        return self.trainable_weights + self.non_trainable_weights

    @property
    def trainable_weights(self):
        return self._collect(True)

    @property
    def non_trainable_weights(self):
        return self._collect(False)

    trainable_variables = trainable_weights
    non_trainable_variables = non_trainable_weights
    variables = weights

    def count_params(self) -> int:
        return int(sum(int(np.prod(w.shape)) for w in self._collect(None)))

    def get_weights(self):
        """Copies of every weight, as numpy arrays (in the order of ``weights``)."""
        return [np.array(w) for w in self.weights]

    def set_weights(self, arrays):
        """Assign ``arrays`` (in the order of ``weights``) to the weights."""
        weights = self.weights
        arrays = list(arrays)
        if len(arrays) != len(weights):
            raise ValueError(f"{self.name}.set_weights: the layer has {len(weights)} weights, got {len(arrays)} arrays")
        for w, a in zip(weights, arrays):
            a = np.asarray(a)
            if tuple(a.shape) != tuple(w.shape):
                raise ValueError(f"{self.name}.set_weights: {w.name} has shape {tuple(w.shape)}, got {a.shape}")
            w.assign(a.astype(w.dtype.as_numpy_dtype))

    def add_weight(self, name, shape, initializer="glorot_uniform", trainable=True, dtype=None):
        """Create a Variable of ``shape``, initialized now, tracked under ``name``."""
        dtype = dtypes.as_dtype(dtype or self._dtype)
        with init_scope():
            value = initializers.get(initializer)(tuple(int(d) for d in shape), dtype.name)
            var = Variable(np.asarray(value, dtype=dtype.as_numpy_dtype), trainable=trainable,
                           name=f"{self.name}/{name}")
        self._children[name] = var
        return var

    def _checkpoint_children(self) -> dict:
        return dict(self._children)

    # -- calling ---------------------------------------------------------------------------------
    def build(self, input_shape):
        """Create the weights for inputs of ``input_shape`` (a tuple; None for the batch size)."""
        self.built = True

    def _build_on_call(self, input_shape):
        with init_scope():
            self.build(input_shape)

    def call(self, inputs, *args, **kwargs):
        return inputs

    def compute_output_shape(self, input_shape):
        """The output shape for ``input_shape``, found by running the layer on a symbolic input."""
        with Graph(f"{self.name}_shape").as_default() as g:
            out = self(g.placeholder(self._dtype, tuple(input_shape)))
        return tuple(out.shape)

    def _convert(self, x):
        if isinstance(x, InputLayer):
            raise NotImplementedError(
                f"{type(self).__name__} layer {self.name!r} was called on an Input: flowlab has no functional API "
                "(Model(inputs, outputs)); put the Input first in a Sequential, or subclass Model")
        if isinstance(x, Tensor):
            t = x
        elif isinstance(x, (np.ndarray, np.generic, list, float, int)):
            t = convert_to_tensor(np.asarray(x))
        else:
            return x      # a structure of several inputs: the layer's call deals with it
        if t.dtype.is_floating and t.dtype != self._dtype:   # Keras casts float inputs to the layer's dtype
            t = math_ops.cast(t, self._dtype)
        return t

    def __call__(self, inputs, *args, training=None, **kwargs):
        inputs = self._convert(inputs)
        if not self.built:
            shape = static_shape(inputs) if isinstance(inputs, Tensor) else None
            if shape is not None:
                self._check_input(inputs)
            self._build_on_call(shape)
            self.built = True
        elif isinstance(inputs, Tensor):
            self._check_input(inputs)
        outer = getattr(_context, "training", False)
        flag = outer if training is None else bool(training)
        _context.training = flag
        try:
            if _takes_training(type(self)):
                out = self.call(inputs, *args, training=flag, **kwargs)
            else:
                out = self.call(inputs, *args, **kwargs)
        except InvalidArgumentError as e:
            raise self._annotate(e) from None
        finally:
            _context.training = outer
        if isinstance(out, Tensor):
            self._output_shape = (None, *static_shape(out)[1:]) if static_shape(out) else ()
        return out

    def _annotate(self, error):
        """An op error raised inside this layer's call, with the layer named (the innermost layer only)."""
        if getattr(error, "_layer", None) is not None:
            return error
        new = InvalidArgumentError(f"layer {self.name!r} ({type(self).__name__}): {error}", op=error.op,
                                   source=error.source)
        new._layer = self.name
        return new

    def _check_input(self, x):
        """Refuse inputs this layer cannot take (subclasses: ``input_rank``, ``_check_shape``)."""

    def input_error(self, x, message) -> InvalidArgumentError:
        """The error for an input this layer cannot take: the layer, what it got, and the user's line."""
        where = source_line()
        err = InvalidArgumentError(
            f"{type(self).__name__} layer {self.name!r}: {message}; got {describe(x)}"
            + (f"\n  at {where}" if where else ""), op=self.name, source=where)
        err._layer = self.name
        return err

    @property
    def output_shape(self):
        """The output shape of the last call (None for the batch size), or None before any."""
        return self._output_shape

    def get_config(self) -> dict:
        return {"name": self.name, "trainable": self.trainable, "dtype": self._dtype.name}

    def __repr__(self):
        return f"<{type(self).__name__} {self.name!r}{'' if self.built else ' (not built)'}>"


class InputLayer(Layer):
    """Declares the shape of a model's input (``shape`` without the batch size); passes inputs through."""

    def __init__(self, shape=None, batch_size=None, dtype="float32", name=None, input_shape=None, **kwargs):
        shape = shape if shape is not None else input_shape
        if shape is None:
            raise ValueError("InputLayer needs shape=(...), the shape of one example (without the batch size)")
        super().__init__(name=name, dtype=dtype, batch_input_shape=(batch_size, *tuple(shape)), **kwargs)

    @property
    def batch_input_shape(self):
        return self._batch_input_shape


def Input(shape, batch_size=None, dtype="float32", name=None):  # noqa: N802 - Keras's name
    """The input of a Sequential model: ``Sequential([Input(shape=(64,)), Dense(10)])``."""
    return InputLayer(shape=shape, batch_size=batch_size, dtype=dtype, name=name)
