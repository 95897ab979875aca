"""Neural-network ops: softmax, log-softmax and the cross-entropy losses over logits."""
from __future__ import annotations

import numpy as np

from ..backends import array_module
from ..execute import defop, execute
from . import _rules as R
from . import array_ops, math_ops, reduction_ops


def _shifted(x, axis):
    return x - x.max(axis=axis, keepdims=True)   # subtracting the max keeps exp() from overflowing


def _softmax_kernel(logits, axis):
    e = np.exp(_shifted(logits, axis))
    return e / e.sum(axis=axis, keepdims=True)


def _log_softmax_kernel(logits, axis):
    s = _shifted(logits, axis)
    return s - np.log(np.exp(s).sum(axis=axis, keepdims=True))


def _softmax_rule(logits, axis):
    shape, dtype = R.floating(logits)
    R.norm_axis(axis, len(shape))
    return shape, dtype


# d softmax: y * (g - sum(g * y));  d log_softmax: g - softmax * sum(g)
_softmax_op = defop("softmax", _softmax_kernel, _softmax_rule, strict=True, grad=lambda c, g: (
    c.output * (g - reduction_ops.reduce_sum(g * c.output, axis=c.attrs["axis"], keepdims=True)),))
_log_softmax_op = defop("log_softmax", _log_softmax_kernel, _softmax_rule, strict=True, grad=lambda c, g: (
    g - math_ops.exp(c.output) * reduction_ops.reduce_sum(g, axis=c.attrs["axis"], keepdims=True),))


def softmax(logits, axis=-1, name=None):
    """exp(x) / sum(exp(x)) along ``axis``: each slice becomes a probability distribution."""
    return execute(_softmax_op, (logits,), {"axis": int(axis)})


def log_softmax(logits, axis=-1, name=None):
    """log(softmax(x)), computed without overflow or log(0)."""
    return execute(_log_softmax_op, (logits,), {"axis": int(axis)})


def _xent_kernel(labels, logits, axis):
    return -(labels * _log_softmax_kernel(logits, axis)).sum(axis=axis)


def _xent_rule(labels, logits, axis):
    shape, dtype = _softmax_rule(logits, axis)
    lshape, ldtype = R.spec(labels)
    if ldtype != dtype:
        R.fail(f"labels ({ldtype.name}) and logits ({dtype.name}) must have the same dtype")
    if not R.same_shape(lshape, shape):
        R.fail(f"labels {tuple(lshape)} and logits {tuple(shape)} must have the same shape")
    a = R.norm_axis(axis, len(shape))
    return shape[:a] + shape[a + 1:], dtype


def _xent_grad(c, g):
    labels, logits = c.inputs
    axis = c.attrs["axis"]
    g = array_ops.expand_dims(g, axis)
    return (-g * log_softmax(logits, axis) if c.needs[0] else None,
            g * (softmax(logits, axis) - labels) if c.needs[1] else None)


_xent_op = defop("softmax_cross_entropy_with_logits", _xent_kernel, _xent_rule, _xent_grad, same_dtype=(0, 1),
                 strict=True)


def softmax_cross_entropy_with_logits(labels, logits, axis=-1, name=None):
    """Per-example cross-entropy between ``labels`` (a probability distribution per row, e.g. one-hot)
    and ``softmax(logits)``: -sum(labels * log_softmax(logits)) along ``axis``."""
    return execute(_xent_op, (labels, logits), {"axis": int(axis)})


def _label_error(labels, depth):
    bad = labels[(labels < 0) | (labels >= depth)].ravel()[0]
    return IndexError(f"label {bad} is outside the valid range [0, {depth})")


def _sparse_xent_kernel(labels, logits):
    logp = _log_softmax_kernel(logits, -1)
    depth = logits.shape[-1]
    if labels.size and labels.min() < 0:   # too-large labels fail the indexing below
        raise _label_error(labels, depth)
    try:
        if logp.ndim == 2:
            picked = logp[array_module(logp).arange(logp.shape[0]), labels]   # 3x faster than take_along_axis for a batch
        else:
            picked = np.take_along_axis(logp, labels[..., None], axis=-1)[..., 0]
    except IndexError:
        raise _label_error(labels, depth) from None
    return -picked


def _sparse_xent_rule(labels, logits):
    shape, dtype = _softmax_rule(logits, -1)
    lshape, ldtype = R.spec(labels)
    if ldtype.kind not in "iu":
        R.fail(f"labels must be integer class ids, got {ldtype.name}")
    if not R.same_shape(lshape, shape[:-1]):
        R.fail(f"labels {tuple(lshape)} must have the shape of logits {tuple(shape)} without its last axis")
    return shape[:-1], dtype


# The backward pass is one op: g * (softmax(logits) - one_hot(labels)), in one pass over the logits.
def _sparse_xent_grad_kernel(g, labels, logits):
    p = _softmax_kernel(logits, -1)
    flat = p.reshape(-1, p.shape[-1])
    flat[array_module(p).arange(flat.shape[0]), labels.reshape(-1)] -= 1    # p is a fresh array: safe to write
    p *= g[..., None]
    return p


def _sparse_xent_grad_grad(c, gg):
    # out = g * (p - onehot):  d/dg = sum(gg * (p - onehot));  d/dlogits = g * p * (gg - sum(gg * p))
    g, labels, logits = c.inputs
    p = softmax(logits)
    hot = array_ops.one_hot(labels, R.shape_of(logits)[-1], dtype=logits.dtype)
    dg = reduction_ops.reduce_sum(gg * (p - hot), axis=-1) if c.needs[0] else None
    dz = None
    if c.needs[2]:
        gp = gg * p
        dz = array_ops.expand_dims(g, -1) * (gp - p * reduction_ops.reduce_sum(gp, axis=-1, keepdims=True))
    return dg, None, dz


_sparse_xent_grad_op = defop("sparse_softmax_cross_entropy_grad", _sparse_xent_grad_kernel,
                             lambda g, labels, logits: R.spec(logits), _sparse_xent_grad_grad)
_sparse_xent_op = defop("sparse_softmax_cross_entropy_with_logits", _sparse_xent_kernel, _sparse_xent_rule,
                        lambda c, g: (None, execute(_sparse_xent_grad_op, (g, c.inputs[0], c.inputs[1]))))


def sparse_softmax_cross_entropy_with_logits(labels, logits, name=None):
    """Per-example cross-entropy where ``labels`` are integer class ids in [0, num_classes)."""
    return execute(_sparse_xent_op, (labels, logits))


__all__ = ["softmax", "log_softmax", "softmax_cross_entropy_with_logits",
           "sparse_softmax_cross_entropy_with_logits"]
