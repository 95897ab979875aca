"""Errors raised by flowlab ops (``fl.errors.InvalidArgumentError``, as in ``tf.errors``)."""
from .core.errors import DataLossError, InvalidArgumentError, NumericsError, OpError  # noqa: F401
