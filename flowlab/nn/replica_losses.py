"""Loss scaling for custom training loops under a distribution strategy (``fl.nn.compute_average_loss``,
``fl.nn.scale_regularization_loss``).

A strategy *sums* the replicas' gradients. So each replica divides its summed per-example loss by
the *global* batch size (all replicas' examples together), not by its own batch: the sum of the
replicas' gradients is then the gradient of the mean loss over the whole global batch. nn knows
nothing of strategies (a layer above it): ``flowlab.distribute`` registers, through
:func:`set_replica_hook`, the function that says how many replicas there are where the call runs.
"""
from __future__ import annotations

from ..core import dtypes
from ..core.ops import add_n, cast, reduce_sum, shape
from ..core.tensor import convert_to_tensor

__all__ = ["compute_average_loss", "scale_regularization_loss", "set_replica_hook"]

_replica_hook = None   # set by flowlab.distribute: fn() -> (num_replicas_in_sync, in_cross_replica_context)


def set_replica_hook(fn) -> None:
    """``fn()`` returns ``(num_replicas_in_sync, in_cross_replica_context)`` for the code calling it
    (``(1, False)`` outside any strategy); None removes it."""
    global _replica_hook
    _replica_hook = fn


def _num_replicas(what):
    replicas, cross = _replica_hook() if _replica_hook is not None else (1, False)
    if cross:
        raise RuntimeError(f"{what} was called in cross-replica context (inside strategy.scope() but outside "
                           f"strategy.run): call it in the function that strategy.run runs on each replica, or "
                           f"pass global_batch_size=")
    return replicas


def compute_average_loss(per_example_loss, sample_weight=None, global_batch_size=None, regularization_loss=None):
    """The sum of the per-example losses (times ``sample_weight``) divided by the *global* batch size,
    plus ``regularization_loss`` divided by the number of replicas. Without ``global_batch_size``,
    inside ``strategy.run`` it is this replica's batch size times ``num_replicas_in_sync``, and outside
    any strategy this batch's size (a plain mean). Arguments in TensorFlow's order.

    >>> import flowlab as fl
    >>> float(fl.nn.compute_average_loss(fl.constant([1.0, 2.0, 3.0]), global_batch_size=6))
    1.0
    """
    loss = convert_to_tensor(per_example_loss)
    if loss.ndim == 0:
        raise ValueError("compute_average_loss needs one loss per example (rank >= 1), got a scalar: use "
                         "reduction=fl.keras.losses.Reduction.NONE on the loss object to get per-example losses")
    if not loss.dtype.is_floating:
        loss = cast(loss, dtypes.float32)
    if sample_weight is not None:
        loss = loss * cast(convert_to_tensor(sample_weight), loss.dtype)
    if global_batch_size is None:
        replicas = _num_replicas("compute_average_loss")
        rows = loss.shape[0]
        global_batch_size = (cast(shape(loss)[0], loss.dtype) * float(replicas) if rows is None
                             else int(rows) * replicas)
    elif not float(global_batch_size).is_integer() or int(global_batch_size) < 1:
        raise ValueError(f"compute_average_loss: global_batch_size must be a whole number >= 1, got "
                         f"{global_batch_size!r}")
    average = reduce_sum(loss) / (float(global_batch_size) if isinstance(global_batch_size, (int, float))
                                  else global_batch_size)    # a Python float takes the loss's dtype
    if regularization_loss is not None:
        average = average + scale_regularization_loss(regularization_loss)
    return average


def scale_regularization_loss(regularization_loss, name=None):
    """A regularization loss (or a list of them, added) divided by ``num_replicas_in_sync``: every
    replica adds it once, and the strategy sums the replicas' gradients."""
    if isinstance(regularization_loss, (list, tuple)):
        regularization_loss = add_n(regularization_loss)
    return convert_to_tensor(regularization_loss) / float(_num_replicas("scale_regularization_loss"))
