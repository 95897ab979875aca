"""Errors raised by flowlab ops (``fl.errors.InvalidArgumentError``, as in ``tf.errors``)."""
from .core.errors import InvalidArgumentError, OpError  # noqa: F401
