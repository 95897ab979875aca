"""``Model``: layers plus training (``compile``, ``fit``, ``evaluate``, ``predict``), and
``Sequential``, a model that is a stack of layers.

Subclass ``Model`` to write the forward pass yourself: create layers in ``__init__`` (as
attributes, so they are tracked) and use them in ``call(inputs, training=False)``. The training
step is ``train_step(data)``; override it to change what one step does, as in Keras.
"""
from __future__ import annotations


from ...core.errors import InvalidArgumentError, source_line
from ...core.graph import Graph
from ...core.tape import GradientTape
from .. import optimizers as _optimizers
from ..checkpoint import Checkpoint
from . import _training
from . import losses as _losses
from . import metrics as _metrics
from .callbacks import FitState
from .distribution import scope_strategy
from .layers.base import InputLayer, Layer

__all__ = ["Model", "Sequential"]


def unpack(data):
    """(x, y, sample_weight) from a batch that is x, (x,), (x, y) or (x, y, sample_weight)."""
    if isinstance(data, tuple):
        return (tuple(data) + (None, None))[:3] if len(data) <= 3 else data
    return data, None, None


class Model(Layer):
    """A layer that can be trained. See the module docstring.

    >>> import flowlab as fl
    >>> class TwoLayers(fl.keras.Model):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.hidden = fl.keras.layers.Dense(8, activation="relu")
    ...         self.out = fl.keras.layers.Dense(2)
    ...     def call(self, x, training=False):
    ...         return self.out(self.hidden(x))
    >>> TwoLayers()(fl.ones([3, 4])).shape
    TensorShape([3, 2])
    """

    def __init__(self, *args, **kwargs):
        if args or "inputs" in kwargs or "outputs" in kwargs:
            raise NotImplementedError("flowlab has no functional API (Model(inputs, outputs)); use Sequential, "
                                      "or subclass Model and write call()")
        super().__init__(**kwargs)
        self.optimizer = None
        self.loss = None
        self.stop_training = False
        self._compiled_metrics = []
        self._loss_tracker = None
        self._run_eagerly = False
        self._functions = {}
        self._distribute_strategy = None
        self._fit_state = FitState()

    # -- building --------------------------------------------------------------------------------
    def _build_on_call(self, input_shape):
        if type(self).build is not Model.build and type(self).build is not Sequential.build:
            super()._build_on_call(input_shape)      # a build() of the user's own

    def build(self, input_shape, dtype="float32"):
        """Create every weight for inputs of ``input_shape`` (None for the batch size), by calling the
        model once on a symbolic input."""
        self.built = True
        try:
            self._symbolic_call(input_shape, dtype)
        except BaseException:
            self.built = False
            raise

    def _symbolic_call(self, input_shape, dtype):
        with Graph(f"{self.name}_build").as_default() as g:
            self(g.placeholder(dtype, tuple(input_shape)))

    def _ensure_built(self, shape, dtype):
        """Build from the data's shape (a ``build`` of the user's own runs as on a first call)."""
        if not self.built or not self._weights_ready():
            self._symbolic_call(shape, dtype)

    def _weights_ready(self):
        return all(layer.built for layer in self._all_layers())

    def _all_layers(self):
        out = []
        for layer in self._sublayers():
            out.append(layer)
            if isinstance(layer, Model):
                out.extend(layer._all_layers())
        return out

    # -- compile ---------------------------------------------------------------------------------
    def compile(self, optimizer="rmsprop", loss=None, metrics=None, run_eagerly=False, **kwargs):
        """Choose the optimizer, the loss (a name, a Loss or a function) and the metrics to report.
        The training step runs as a traced ``@fl.function`` graph unless ``run_eagerly=True``."""
        # accepted and without effect: jit_compile, steps_per_execution, and Horovod's Keras examples'
        # experimental_run_tf_function=False (the step is one traced graph either way)
        unsupported = set(kwargs) - {"jit_compile", "steps_per_execution", "experimental_run_tf_function"}
        if unsupported:
            raise TypeError(f"compile: unexpected keyword argument(s) {sorted(unsupported)}")
        if loss is None:
            raise ValueError("compile needs a loss, e.g. loss='sparse_categorical_crossentropy'")
        self.optimizer = _optimizers.get(optimizer)
        self.loss = _losses.get(loss)
        self._loss_tracker = _metrics.Mean(name="loss")
        if metrics is not None and not isinstance(metrics, (list, tuple)):
            metrics = [metrics]
        self._compiled_metrics = [_metrics.get(m, self.loss) for m in (metrics or [])]
        names = [m.name for m in self.metrics]
        if len(set(names)) != len(names):
            raise ValueError(f"compile: two metrics have the same name in {names}")
        self._run_eagerly = bool(run_eagerly)
        self._functions = {}
        # fit and evaluate distribute over the strategy whose scope this compile runs in
        self._distribute_strategy = scope_strategy()

    @property
    def distribute_strategy(self):
        """The distribution strategy whose scope ``compile`` ran in (fit and evaluate distribute over it:
        see :mod:`.distribution`), or None."""
        return self._distribute_strategy

    def __getstate__(self):
        """A copy (e.g. shipped to a worker by a parameter-server fit) leaves the traced steps
        behind: they hold locks and plans of this process, and are made again where needed."""
        state = self.__dict__.copy()
        state["_functions"] = {}
        return state

    @property
    def run_eagerly(self) -> bool:
        return self._run_eagerly

    @run_eagerly.setter
    def run_eagerly(self, value):
        self._run_eagerly = bool(value)
        self._functions = {}

    @property
    def metrics(self):
        """The loss tracker and the compiled metrics (after ``compile``), in the order they are logged."""
        return ([self._loss_tracker] if self._loss_tracker is not None else []) + list(self._compiled_metrics)

    @property
    def metrics_names(self):
        return [m.name for m in self.metrics]

    def reset_metrics(self):
        for m in self.metrics:
            m.reset_state()

    def _assert_compiled(self, what):
        if self.optimizer is None or self.loss is None:
            where = source_line()
            raise RuntimeError(f"{what}: the model {self.name!r} must be compiled first: "
                               "model.compile(optimizer=..., loss=...)" + (f"\n  at {where}" if where else ""))

    # -- one step (override to customize training, as in Keras) -------------------------------
    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None):
        """The compiled loss of this batch; also adds it to the "loss" metric."""
        if y is None:
            where = source_line()
            raise InvalidArgumentError(f"{self.name}: the loss needs targets y, but the data has none (give fit y=, "
                                       "or dataset elements (x, y))" + (f"\n  at {where}" if where else ""))
        loss = self.loss(y, y_pred, sample_weight)
        self._loss_tracker.update_state(loss, sample_weight=_training.batch_size_of(y_pred))
        return loss

    def compute_metrics(self, x, y, y_pred, sample_weight=None):
        """Update every compiled metric with this batch; returns extra values to log (none here)."""
        for m in self._compiled_metrics:
            m.update_state(y, y_pred, sample_weight)
        return {}

    def train_step(self, data):
        """One step: forward pass under a tape, loss, gradients, optimizer update, metrics. Returns a
        dict of extra values to log (the metrics are logged anyway)."""
        x, y, sample_weight = unpack(data)
        with GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(x, y, y_pred, sample_weight)
        variables = self.trainable_variables
        grads = tape.gradient(loss, variables)
        self.optimizer.apply_gradients(zip(grads, variables))
        return self.compute_metrics(x, y, y_pred, sample_weight)

    def test_step(self, data):
        x, y, sample_weight = unpack(data)
        y_pred = self(x, training=False)
        self.compute_loss(x, y, y_pred, sample_weight)
        return self.compute_metrics(x, y, y_pred, sample_weight)

    def predict_step(self, data):
        x, _, _ = unpack(data)
        return self(x, training=False)

    # -- loops -----------------------------------------------------------------------------------
    def fit(self, x=None, y=None, batch_size=None, epochs=1, verbose="auto", callbacks=None, validation_split=0.0,
            validation_data=None, shuffle=True, initial_epoch=0, sample_weight=None, validation_freq=1,
            validation_batch_size=None, steps_per_epoch=None, validation_steps=None):
        """Train for ``epochs`` passes over ``x`` and ``y`` (arrays) or over ``x``, a ``fl.data.Dataset``
        of (x, y) batches. ``verbose``: "auto"/1 a live progress bar (a widget in a notebook, one text
        line per epoch elsewhere), 2 text lines, 0 nothing. Returns the ``History``.

        ``steps_per_epoch``: an epoch is that many batches, taken from one stream that goes on across
        epochs (a dataset that repeats, ``dataset.repeat()``, never runs out; one that does ends the
        fit with a warning). ``validation_steps``: at most that many batches of ``validation_data``."""
        return _training.fit(self, x, y, batch_size=batch_size, epochs=epochs, verbose=verbose, callbacks=callbacks,
                             validation_split=validation_split, validation_data=validation_data, shuffle=shuffle,
                             initial_epoch=initial_epoch, sample_weight=sample_weight,
                             validation_freq=validation_freq, validation_batch_size=validation_batch_size,
                             steps_per_epoch=steps_per_epoch, validation_steps=validation_steps)

    def evaluate(self, x=None, y=None, batch_size=None, verbose="auto", sample_weight=None, steps=None,
                 callbacks=None, return_dict=False):
        """The loss and metrics over ``x``, ``y``: a number (no metrics), a list [loss, *metrics], or
        with ``return_dict`` a dict. ``steps``: at most that many batches (needed for a dataset that
        repeats forever)."""
        logs = _training.evaluate(self, x, y, batch_size=batch_size, verbose=verbose, sample_weight=sample_weight,
                                  callbacks=callbacks, steps=steps)
        if return_dict:
            return logs
        values = list(logs.values())
        return values[0] if len(values) == 1 else values

    def predict(self, x, batch_size=None, verbose=0, steps=None, callbacks=None):
        """The model's outputs for ``x`` (arrays or a dataset), as one numpy array; ``steps``: at most
        that many batches."""
        return _training.predict(self, x, batch_size=batch_size, verbose=verbose, callbacks=callbacks, steps=steps)

    def train_on_batch(self, x, y=None, sample_weight=None):
        """One training step on one batch; returns the loss (and metrics) of that batch."""
        return _training.train_on_batch(self, x, y, sample_weight)

    # -- looking and saving -----------------------------------------------------------------------
    def summary(self, print_fn=None):
        """Print each layer with its output shape and number of weights, and the totals."""
        from .summary import summary_lines
        for line in summary_lines(self):
            (print_fn or print)(line)

    def save_weights(self, filepath):
        """Write every weight to a checkpoint at ``filepath`` (".npz" is added); see ``fl.train.Checkpoint``."""
        if not self.built:
            raise ValueError(f"save_weights: the model {self.name!r} has no weights yet; build it first")
        return Checkpoint(model=self).write(filepath)

    def load_weights(self, filepath):
        """Restore every weight from a checkpoint written by ``save_weights`` (or ``ModelCheckpoint``)."""
        if not self.built:
            raise ValueError(f"load_weights: build the model {self.name!r} first (call it on data, or "
                             "model.build(input_shape)), so that its weights exist to be restored")
        return Checkpoint(model=self).restore(filepath).assert_existing_objects_matched()

    def get_config(self):
        return {"name": self.name}


class Sequential(Model):
    """A model that runs its layers one after another.

    >>> import flowlab as fl
    >>> model = fl.keras.Sequential([fl.keras.Input(shape=(64,)),
    ...                              fl.keras.layers.Dense(32, activation="relu"),
    ...                              fl.keras.layers.Dense(10)])
    >>> model.count_params()
    2410
    """

    def __init__(self, layers=None, name=None, trainable=True):
        super().__init__(name=name, trainable=trainable)
        self._stack = []
        for layer in layers or ():
            self.add(layer)

    @property
    def layers(self):
        return list(self._stack)

    def add(self, layer):
        """Append ``layer`` (an ``Input``/``InputLayer`` first sets the input shape instead)."""
        if isinstance(layer, InputLayer):
            if self._stack:
                raise ValueError("Sequential: an Input must come before every other layer")
            self._batch_input_shape = layer.batch_input_shape
            self._input_dtype = layer.dtype.name
            return
        if not isinstance(layer, Layer):
            raise TypeError(f"Sequential.add takes a layer, got {type(layer).__name__}")
        if not self._stack and self._batch_input_shape is None and layer._batch_input_shape is not None:
            self._batch_input_shape = layer._batch_input_shape
        self._stack.append(layer)
        self._children[f"layers/{len(self._stack) - 1}"] = layer
        if self._batch_input_shape is not None:
            self.build(self._batch_input_shape, getattr(self, "_input_dtype", "float32"))

    def pop(self):
        """Remove the last layer."""
        if not self._stack:
            raise ValueError("Sequential.pop: there are no layers")
        layer = self._stack.pop()
        del self._children[f"layers/{len(self._stack)}"]
        return layer

    def build(self, input_shape=None, dtype="float32"):
        input_shape = input_shape if input_shape is not None else self._batch_input_shape
        if input_shape is None:
            raise ValueError(f"Sequential {self.name!r}: the input shape is unknown; give the first layer "
                             "input_shape=(...), start with fl.keras.Input(shape=(...)), or call build((None, ...))")
        self._batch_input_shape = tuple(input_shape)
        super().build(input_shape, dtype)

    def call(self, inputs, training=None):
        x = inputs
        for layer in self._stack:
            x = layer(x, training=training)
        return x
