"""Neural-network ops: softmax, log-softmax, the cross-entropy losses over logits, 2-D convolution
(im2col), max pooling and dropout masks."""
from __future__ import annotations

import threading

import numpy as np

from .. import random as _random
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
_softmax_op = defop("softmax", _softmax_kernel, _softmax_rule, strict=True, fresh=True, grad=lambda c, g: (
    c.output * (g - reduction_ops.reduce_sum(g * c.output, axis=c.attrs["axis"], keepdims=True)),))
_log_softmax_op = defop("log_softmax", _log_softmax_kernel, _softmax_rule, strict=True, fresh=True,
                        grad=lambda c, g: (
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


def _row_max(x):
    # NOTE: a numpy ufunc's reduce skips the ~2 us of Python in ndarray.max/sum; cupy arrays use the methods
    return np.maximum.reduce(x, axis=-1, keepdims=True) if type(x) is np.ndarray else x.max(axis=-1, keepdims=True)


def _row_sum(x):
    return np.add.reduce(x, axis=-1, keepdims=True) if type(x) is np.ndarray else x.sum(axis=-1, keepdims=True)


def _check_labels(labels, depth):
    if not labels.size:
        return
    if type(labels) is np.ndarray and labels.dtype.kind == "i":
        # one pass: seen as unsigned, a negative label is larger than any class id
        if np.maximum.reduce(labels.view(labels.dtype.str.replace("i", "u")), axis=None) >= depth:
            raise _label_error(labels, depth)
    elif labels.min() < 0:                  # too-large labels fail the indexing where they are used
        raise _label_error(labels, depth)


_ROWS: dict = {}


def _rows(n, like):
    """arange(n), kept for the batch sizes seen (numpy), for picking one entry per row."""
    if type(like) is not np.ndarray:
        return array_module(like).arange(n)
    rows = _ROWS.get(n)
    if rows is None:
        rows = _ROWS[n] = np.arange(n)
        rows.flags.writeable = False
        if len(_ROWS) > 64:
            _ROWS.clear()
    return rows


# The forward kernel leaves the softmax it computed for the backward kernel of the same logits
# array (one slot per thread, taken by the first backward call that matches): training computes
# exp() once per step, as TensorFlow's fused kernel does. A value is reused only for the very same
# array object, which stays alive in the slot, and tensors' arrays are never written: never stale.
_softmax_slot = threading.local()


def _sparse_xent_kernel(labels, logits):
    # -log softmax(z)[label] = log(sum(exp(z - m))) - (z[label] - m): no full log-softmax array
    depth = logits.shape[-1]
    _check_labels(labels, depth)
    e = logits - _row_max(logits)
    try:
        if e.ndim == 2:
            picked = e[_rows(e.shape[0], e), labels]   # 3x faster than take_along_axis
        else:
            picked = np.take_along_axis(e, labels[..., None], axis=-1)[..., 0]
    except IndexError:
        raise _label_error(labels, depth) from None
    np.exp(e, out=e)
    total = _row_sum(e)
    e /= total                       # the softmax, for the backward kernel
    _softmax_slot.value = (logits, e)
    loss = np.log(total)[..., 0]
    loss -= picked
    return loss


def _take_softmax(logits):
    cached = getattr(_softmax_slot, "value", None)
    if cached is not None and cached[0] is logits:
        _softmax_slot.value = None
        return cached[1]
    p = logits - _row_max(logits)
    np.exp(p, out=p)
    p /= _row_sum(p)
    return p


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
    p = _take_softmax(logits)         # a fresh array, this kernel's own: every step below writes into it
    flat = p.reshape(-1, p.shape[-1])
    flat[_rows(flat.shape[0], p), labels.reshape(-1)] -= 1
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
                             lambda g, labels, logits: R.spec(logits), _sparse_xent_grad_grad, fresh=True)
_sparse_xent_op = defop("sparse_softmax_cross_entropy_with_logits", _sparse_xent_kernel, _sparse_xent_rule,
                        lambda c, g: (None, execute(_sparse_xent_grad_op, (g, c.inputs[0], c.inputs[1]))))


def sparse_softmax_cross_entropy_with_logits(labels, logits, name=None):
    """Per-example cross-entropy where ``labels`` are integer class ids in [0, num_classes)."""
    return execute(_sparse_xent_op, (labels, logits))


# -- its mean over the batch, as one op: the loss Keras minimizes most often ----------------------
# mean(sparse_softmax_cross_entropy_with_logits(labels, logits)) in one forward kernel and one
# backward kernel, g / N * (softmax(logits) - one_hot(labels)), instead of a reduction and its
# gradient around the per-example op (N: the number of examples, labels.size).
def _sparse_xent_mean_kernel(labels, logits):
    loss = _sparse_xent_kernel(labels, logits)
    if type(loss) is not np.ndarray:
        return loss.mean()     # a 0-d device array (CuPy refuses np.asarray)
    return np.asarray(np.add.reduce(loss, axis=None) / max(loss.size, 1))


def _sparse_xent_mean_rule(labels, logits):
    return (), _sparse_xent_rule(labels, logits)[1]


def _sparse_xent_mean_grad_kernel(g, labels, logits):
    p = _take_softmax(logits)
    flat = p.reshape(-1, p.shape[-1])
    flat[_rows(flat.shape[0], p), labels.reshape(-1)] -= 1
    p *= g / max(labels.size, 1)
    return p


def _count(labels, dtype):
    return math_ops.cast(array_ops.size(labels), dtype)


def _sparse_xent_mean_grad_grad(c, gg):
    # out = (g / N) (p - onehot): d/dg = sum(gg * (p - onehot)) / N;  d/dlogits = (g / N) p (gg - sum(gg p))
    g, labels, logits = c.inputs
    p = softmax(logits)
    n = _count(labels, logits.dtype)
    dg = dz = None
    if c.needs[0]:
        hot = array_ops.one_hot(labels, R.shape_of(logits)[-1], dtype=logits.dtype)
        dg = reduction_ops.reduce_sum(gg * (p - hot)) / n
    if c.needs[2]:
        gp = gg * p
        dz = (g / n) * (gp - p * reduction_ops.reduce_sum(gp, axis=-1, keepdims=True))
    return dg, None, dz


_sparse_xent_mean_grad_op = defop(
    "sparse_softmax_cross_entropy_mean_grad", _sparse_xent_mean_grad_kernel,
    lambda g, labels, logits: R.spec(logits), _sparse_xent_mean_grad_grad,
    doc="g / N * (softmax(logits) - one_hot(labels)): the backward pass of the mean cross-entropy.")
_sparse_xent_mean_op = defop(
    "sparse_softmax_cross_entropy_mean", _sparse_xent_mean_kernel, _sparse_xent_mean_rule,
    lambda c, g: (None, execute(_sparse_xent_mean_grad_op, (g, c.inputs[0], c.inputs[1]))),
    doc="The mean over every example of sparse_softmax_cross_entropy_with_logits.")


def sparse_softmax_cross_entropy_mean(labels, logits):
    """mean(sparse_softmax_cross_entropy_with_logits(labels, logits)) as one op (Keras losses use it)."""
    return execute(_sparse_xent_mean_op, (labels, logits))


__all__ = ["softmax", "log_softmax", "softmax_cross_entropy_with_logits",
           "sparse_softmax_cross_entropy_with_logits", "conv2d", "max_pool2d", "dropout"]


# -- 2-D convolution and max pooling (NHWC images, HWIO filters) ------------------------------
# Geometry is TensorFlow's: "VALID" keeps only whole windows; "SAME" gives ceil(size / stride)
# outputs and pads the shortfall, the odd pixel at the end.
def _pair_of(value, what):
    v = (value, value) if isinstance(value, (int, np.integer)) else tuple(int(s) for s in value)
    if len(v) == 4:       # TensorFlow's [1, sh, sw, 1]
        if v[0] != 1 or v[3] != 1:
            raise ValueError(f"{what} [{', '.join(map(str, v))}]: only the height and width entries may differ from 1")
        v = v[1:3]
    if len(v) != 2 or min(v) < 1:
        raise ValueError(f"{what} must be one positive int, two, or four as [1, h, w, 1]; got {value!r}")
    return tuple(int(s) for s in v)


def _padding_of(padding):
    p = str(padding).upper()
    if p not in ("VALID", "SAME"):
        raise ValueError(f"padding must be 'VALID' or 'SAME', got {padding!r}")
    return p


def _out_size(size, k, s, padding):
    """(output size, padding before, padding after) along one axis; size None: (None, None, None)."""
    if size is None:
        return None, None, None
    if padding == "VALID":
        return max((size - k) // s + 1, 0), 0, 0
    out = -(-size // s)
    total = max((out - 1) * s + k - size, 0)
    return out, total // 2, total - total // 2


def _windows(x, kh, kw, strides, padding, fill=0):
    """Every window of ``x`` [N, H, W, C] as a view [N, OH, OW, kh, kw, C] of the padded input."""
    xp_ = array_module(x)
    (oh, pt, pb), (ow, pl, pr) = (_out_size(x.shape[1], kh, strides[0], padding),
                                  _out_size(x.shape[2], kw, strides[1], padding))
    if pt or pb or pl or pr:
        x = xp_.pad(x, ((0, 0), (pt, pb), (pl, pr), (0, 0)), constant_values=fill)
    s = x.strides
    shape = (x.shape[0], oh, ow, kh, kw, x.shape[3])
    steps = (s[0], s[1] * strides[0], s[2] * strides[1], s[1], s[2], s[3])
    if xp_ is np:   # read-only: windows overlap, a write into one would change others
        return np.lib.stride_tricks.as_strided(x, shape, steps, writeable=False)
    return xp_.lib.stride_tricks.as_strided(x, shape, steps)   # CuPy's has no `writeable`


def _scatter_windows(cols, shape, strides, padding):
    """The transpose of ``_windows``: add each window [N, OH, OW, kh, kw, C] back where it came from."""
    n, h, w, c = shape
    _, oh, ow, kh, kw, _ = cols.shape
    (_, pt, pb), (_, pl, pr) = _out_size(h, kh, strides[0], padding), _out_size(w, kw, strides[1], padding)
    out = array_module(cols).zeros((n, h + pt + pb, w + pl + pr, c), dtype=cols.dtype)
    sh, sw = strides
    for i in range(kh):        # one strided add per filter tap: kh * kw vectorized adds
        for j in range(kw):
            out[:, i:i + sh * (oh - 1) + 1:sh, j:j + sw * (ow - 1) + 1:sw, :] += cols[:, :, :, i, j, :]
    return out[:, pt:pt + h, pl:pl + w, :]


def _conv2d_kernel(x, w, strides, padding):
    kh, kw, cin, cout = w.shape
    cols = _windows(x, kh, kw, strides, padding)
    n, oh, ow = cols.shape[:3]
    out = cols.reshape(n * oh * ow, kh * kw * cin) @ w.reshape(kh * kw * cin, cout)   # im2col: one matmul
    return out.reshape(n, oh, ow, cout)


def _conv_input_grad_kernel(g, w, x, strides, padding):
    kh, kw, cin, cout = w.shape
    n, oh, ow = g.shape[:3]
    cols = (g.reshape(n * oh * ow, cout) @ w.reshape(kh * kw * cin, cout).T).reshape(n, oh, ow, kh, kw, cin)
    return _scatter_windows(cols, x.shape, strides, padding)


def _conv_filter_grad_kernel(x, g, w, strides, padding):
    kh, kw, cin, cout = w.shape
    cols = _windows(x, kh, kw, strides, padding)
    n, oh, ow = cols.shape[:3]
    return (cols.reshape(n * oh * ow, kh * kw * cin).T @ g.reshape(n * oh * ow, cout)).reshape(w.shape)


def _image_spec(x, what):
    shape, dtype = R.floating(x)
    if len(shape) != 4:
        R.fail(f"{what} must be 4-D [batch, height, width, channels], got shape {tuple(shape)}")
    return shape, dtype


def _conv2d_rule(x, w, strides, padding):
    (n, h, wd, c), dtype = _image_spec(x, "input")
    wshape, wdtype = R.spec(w)
    if len(wshape) != 4:
        R.fail(f"filters must be 4-D [height, width, in_channels, out_channels], got shape {tuple(wshape)}")
    if wdtype != dtype:
        R.fail(f"input ({dtype.name}) and filters ({wdtype.name}) must have the same dtype")
    kh, kw, cin, cout = wshape
    if None in (kh, kw):
        R.fail(f"filters need a known height and width, got shape {tuple(wshape)}")
    if c is not None and cin is not None and c != cin:
        R.fail(f"input has {c} channels but the filters expect {cin} (filters shape {tuple(wshape)})")
    oh, ow = _out_size(h, kh, strides[0], padding)[0], _out_size(wd, kw, strides[1], padding)[0]
    if padding == "VALID" and ((h is not None and h < kh) or (wd is not None and wd < kw)):
        R.fail(f"a {kh}x{kw} filter does not fit a {h}x{wd} image with padding 'VALID'")
    return (n, oh, ow, cout), dtype


def _conv2d_grad(c, g):
    x, w = c.inputs
    a = c.attrs
    return (execute(_conv_input_grad_op, (g, w, x), a) if c.needs[0] else None,
            execute(_conv_filter_grad_op, (x, g, w), a) if c.needs[1] else None)


# Both backward ops are linear in their first two inputs and are each other's transposes (with
# conv2d), so their own gradients are convolutions again: gradients of any order work. The last
# input of each only gives a shape (x's for the input gradient, the filters' for the filter one).
def _conv_input_grad_grad(c, gg):
    g, w, x = c.inputs
    a = c.attrs
    return (execute(_conv2d_op, (gg, w), a) if c.needs[0] else None,
            execute(_conv_filter_grad_op, (gg, g, w), a) if c.needs[1] else None, None)


def _conv_filter_grad_grad(c, gw):
    x, g, w = c.inputs
    a = c.attrs
    return (execute(_conv_input_grad_op, (g, gw, x), a) if c.needs[0] else None,
            execute(_conv2d_op, (x, gw), a) if c.needs[1] else None, None)


_conv2d_op = defop("conv2d", _conv2d_kernel, _conv2d_rule, _conv2d_grad, same_dtype=(0, 1), strict=True,
                   doc="2-D convolution of NHWC images with HWIO filters, as one matmul over the image's patches.")
_conv_input_grad_op = defop("conv2d_backprop_input", _conv_input_grad_kernel,
                            lambda g, w, x, strides, padding: R.spec(x)[:1] + R.spec(g)[1:], _conv_input_grad_grad,
                            doc="d conv2d / d input: each output gradient spread back over its window.")
_conv_filter_grad_op = defop("conv2d_backprop_filter", _conv_filter_grad_kernel,
                             lambda x, g, w, strides, padding: R.spec(w)[:1] + R.spec(g)[1:], _conv_filter_grad_grad,
                             doc="d conv2d / d filters: patches of the input times the output gradient.")


def conv2d(input, filters, strides=1, padding="VALID", data_format="NHWC", dilations=None, name=None):  # noqa: A002
    """2-D convolution: ``input`` [batch, height, width, in_channels], ``filters`` [height, width,
    in_channels, out_channels]; ``strides`` one int, two, or [1, sh, sw, 1]; ``padding`` "VALID" or "SAME".

    >>> import flowlab as fl
    >>> fl.nn.conv2d(fl.ones([1, 4, 4, 1]), fl.ones([3, 3, 1, 2]), 1, "VALID").shape
    TensorShape([1, 2, 2, 2])
    """
    if data_format != "NHWC" or dilations not in (None, 1, (1, 1), [1, 1], (1, 1, 1, 1), [1, 1, 1, 1]):
        raise ValueError("conv2d: flowlab supports data_format='NHWC' without dilations")
    return execute(_conv2d_op, (input, filters), {"strides": _pair_of(strides, "strides"),
                                                  "padding": _padding_of(padding)})


def _pool_rule(x, ksize, strides, padding):
    (n, h, w, c), dtype = _image_spec(x, "input")
    kh, kw = ksize
    if padding == "VALID" and ((h is not None and h < kh) or (w is not None and w < kw)):
        R.fail(f"a {kh}x{kw} window does not fit a {h}x{w} image with padding 'VALID'")
    return (n, _out_size(h, kh, strides[0], padding)[0], _out_size(w, kw, strides[1], padding)[0], c), dtype


def _pool_argmax(x, ksize, strides, padding):
    """For every window, the position (0..kh*kw-1) of its largest element (the first, on ties)."""
    win = _windows(x, *ksize, strides, padding, fill=-np.inf)
    n, oh, ow, kh, kw, c = win.shape
    return win.reshape(n, oh, ow, kh * kw, c).argmax(axis=3)


def _pool_grad_kernel(g, x, ksize, strides, padding):
    where = _pool_argmax(x, ksize, strides, padding)
    kh, kw = ksize
    cols = array_module(g).zeros(g.shape[:3] + (kh, kw, g.shape[3]), dtype=g.dtype)
    for i in range(kh):
        for j in range(kw):
            cols[:, :, :, i, j, :] = g * (where == i * kw + j)
    return _scatter_windows(cols, x.shape, strides, padding)


def _pool_grad_grad_kernel(gg, x, ksize, strides, padding):
    where = _pool_argmax(x, ksize, strides, padding)
    win = _windows(gg, *ksize, strides, padding)
    n, oh, ow, kh, kw, c = win.shape
    return np.take_along_axis(win.reshape(n, oh, ow, kh * kw, c), where[:, :, :, None, :], axis=3)[:, :, :, 0, :]


_max_pool_op = defop(
    "max_pool2d", lambda x, ksize, strides, padding: _windows(x, *ksize, strides, padding, fill=-np.inf).max(axis=(3, 4)),
    _pool_rule, lambda c, g: (execute(_pool_grad_op, (g, c.inputs[0]), c.attrs),), strict=True,
    doc="The largest value of each window of NHWC images.")
# The backward op routes each gradient to its window's largest input; its gradient picks the
# incoming values at those same places (the next op), whose gradient is the backward op again.
_pool_grad_op = defop("max_pool2d_grad", _pool_grad_kernel, lambda g, x, ksize, strides, padding: R.spec(x),
                      lambda c, gg: (execute(_pool_grad_grad_op, (gg, c.inputs[1]), c.attrs), None),
                      doc="d max_pool2d / d input: each gradient goes to the largest element of its window.")
_pool_grad_grad_op = defop("max_pool2d_grad_grad", _pool_grad_grad_kernel,
                           lambda gg, x, ksize, strides, padding: _pool_rule(x, ksize, strides, padding)[:1] + R.spec(gg)[1:],
                           lambda c, g: (execute(_pool_grad_op, (g, c.inputs[1]), c.attrs), None),
                           doc="The values of gg where each window of x has its largest element.")


def max_pool2d(input, ksize, strides, padding="VALID", data_format="NHWC", name=None):  # noqa: A002
    """Max pooling of ``input`` [batch, height, width, channels] over ``ksize`` windows moved by
    ``strides`` (each one int, two, or [1, h, w, 1]); ``padding`` "VALID" or "SAME"."""
    if data_format != "NHWC":
        raise ValueError("max_pool2d: flowlab supports data_format='NHWC'")
    return execute(_max_pool_op, (input,), {"ksize": _pair_of(ksize, "ksize"), "strides": _pair_of(strides, "strides"),
                                            "padding": _padding_of(padding)})


# -- dropout ---------------------------------------------------------------------------------
def _dropout_mask_kernel(x, rate, seed):
    rng = _random.generator(seed)   # the global generator (fl.random.set_seed) unless seeded
    keep = rng.random(x.shape, dtype=np.float64) >= rate
    return array_module(x).asarray(keep.astype(x.dtype) / np.asarray(1 - rate, dtype=x.dtype))


def _dropout_mask_rule(x, rate, seed):
    return R.floating(x)


# A random op: stateful, so graph passes never fold or merge it and it draws anew at every run
# (with ``seed``, the same mask every time). Its output has no gradient; dropout multiplies by it.
_dropout_mask_op = defop("dropout_mask", _dropout_mask_kernel, _dropout_mask_rule, stateful=True, strict=True,
                         doc="0 with probability rate, else 1 / (1 - rate), shaped like x.")


def dropout(x, rate, noise_shape=None, seed=None, name=None):
    """Zero each element of ``x`` with probability ``rate`` and scale the rest by 1 / (1 - rate), so
    the expected value is unchanged. A new mask at every call (and every run of a graph), drawn from
    the global generator; ``seed``: an int (the same mask every time) or a ``numpy.random.Generator``
    (a repeatable sequence of masks)."""
    if noise_shape is not None:
        raise ValueError("dropout: flowlab does not support noise_shape")
    rate = float(rate)
    if not 0 <= rate < 1:
        raise ValueError(f"dropout: rate must be in [0, 1), got {rate}")
    return x * execute(_dropout_mask_op, (x,), {"rate": rate, "seed": seed})
