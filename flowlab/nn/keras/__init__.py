"""``fl.keras``: layers, models and their training loop, shaped like ``tf.keras`` (also importable as
``flowlab.keras``: ``from flowlab.keras import layers``).

>>> import flowlab as fl
>>> model = fl.keras.Sequential([fl.keras.layers.Dense(16, activation="relu", input_shape=(4,)),
...                              fl.keras.layers.Dense(3)])
>>> model.compile(optimizer="adam", loss=fl.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
...               metrics=["accuracy"])
>>> history = model.fit(fl.ones([8, 4]), [0, 1, 2, 0, 1, 2, 0, 1], epochs=2, verbose=0)
>>> sorted(history.history)
['accuracy', 'loss']
"""
from .. import optimizers  # noqa: F401
from . import activations, backend, callbacks, initializers, layers, losses, metrics, models  # noqa: F401
from .callbacks import History  # noqa: F401
from .layers import Input  # noqa: F401
from .model import Model, Sequential  # noqa: F401
from .progress import ProgressBar  # noqa: F401

__all__ = ["Model", "Sequential", "Input", "History", "ProgressBar", "layers", "losses", "metrics", "callbacks",
           "optimizers", "initializers", "activations", "backend", "models"]
