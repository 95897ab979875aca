"""Neural-network building blocks: activation, loss, convolution and pooling ops (``fl.nn.relu``,
``fl.nn.conv2d``), loss scaling under strategies (``fl.nn.compute_average_loss``), optimizers,
checkpoints (``flowlab.nn.checkpoint``) and Keras (``fl.keras``, imported on first use)."""
from ..core.ops.math_ops import relu, sigmoid, softplus, tanh  # noqa: F401
from ..core.ops.nn_ops import (conv2d, dropout, log_softmax, max_pool2d, softmax,  # noqa: F401
                               softmax_cross_entropy_with_logits, sparse_softmax_cross_entropy_with_logits)
from ..core.ops.reduction_ops import top_k  # noqa: F401
from . import optimizers  # noqa: F401
from .replica_losses import compute_average_loss, scale_regularization_loss  # noqa: F401
