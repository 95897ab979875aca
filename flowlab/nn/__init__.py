"""Neural-network building blocks: activation and loss ops (``fl.nn.relu``), optimizers."""
from ..core.ops.math_ops import relu, sigmoid, tanh  # noqa: F401
from ..core.ops.nn_ops import (log_softmax, softmax, softmax_cross_entropy_with_logits,  # noqa: F401
                               sparse_softmax_cross_entropy_with_logits)
from . import optimizers  # noqa: F401
