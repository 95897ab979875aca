"""The op table, split by topic. Each module defines its ops once: kernel, shape rule, gradient."""
from . import array_ops, logging_ops, math_ops, nn_ops, reduction_ops, variable_ops  # importing fills the table
from .array_ops import *  # noqa: F401,F403
from .logging_ops import *  # noqa: F401,F403
from .math_ops import *  # noqa: F401,F403
from .nn_ops import *  # noqa: F401,F403
from .reduction_ops import *  # noqa: F401,F403

__all__ = [*array_ops.__all__, *logging_ops.__all__, *math_ops.__all__, *nn_ops.__all__, *reduction_ops.__all__]
