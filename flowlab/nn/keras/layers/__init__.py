"""``fl.keras.layers``: the building blocks of models."""
from .base import Input, InputLayer, Layer  # noqa: F401
from .conv import Conv2D, MaxPool2D, MaxPooling2D  # noqa: F401
from .core import Activation, Dense, Dropout, Flatten, Reshape  # noqa: F401
from .normalization import BatchNormalization  # noqa: F401

__all__ = ["Layer", "Input", "InputLayer", "Dense", "Activation", "Flatten", "Reshape", "Dropout", "Conv2D",
           "MaxPool2D", "MaxPooling2D", "BatchNormalization"]
