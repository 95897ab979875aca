"""``fl.keras.models``: the model classes under the module name Keras code imports them from
(``from flowlab.keras.models import Sequential``)."""
from .model import Model, Sequential

__all__ = ["Model", "Sequential"]
