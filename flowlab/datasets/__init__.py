"""Small datasets that work offline: one real one (``digits``) and a few synthetic generators.

Everything returns plain numpy arrays (features float32, class labels int32), ready for
``fl.constant`` or for slicing into batches. Nothing here touches the network: the digits data
ships inside the package (see ``data/README.md`` for its provenance and license), and the
generators are deterministic under their ``seed``.

>>> import flowlab as fl
>>> (x_train, y_train), (x_test, y_test) = fl.datasets.digits()
>>> x_train.shape, y_train.shape, x_test.shape, y_test.shape
((1437, 64), (1437,), (360, 64), (360,))
"""
from __future__ import annotations

import functools
import os

import numpy as np

__all__ = ["digits", "regression", "spirals", "blobs", "DIGITS_TEST_SIZE"]

_DATA = os.path.join(os.path.dirname(__file__), "data")

#: How many samples of ``digits()`` are the test set: the last 360 rows of the file (20%).
DIGITS_TEST_SIZE = 360


@functools.lru_cache(maxsize=1)
def _digits_table() -> np.ndarray:
    path = os.path.join(_DATA, "digits.csv.gz")
    table = np.loadtxt(path, delimiter=",", dtype=np.int32)
    if table.shape != (1797, 65):
        raise RuntimeError(f"{path}: expected 1797 rows of 64 pixels and a label, got shape {table.shape}")
    table.flags.writeable = False
    return table


def digits():
    """The UCI 8x8 handwritten digits: ``(x_train, y_train), (x_test, y_test)``.

    1797 grayscale 8x8 images of the digits 0-9 (about 180 of each), flattened to 64 features.
    Pixels are counts 0..16 in the source; here they are float32 scaled to [0, 1] (divided by 16).
    Labels are int32 class ids 0..9.

    The split is fixed, with no randomness: the first 1437 rows of the data file are the training
    set and the last 360 (20%, ``DIGITS_TEST_SIZE``) the test set. Both halves hold every class in
    about the same proportion (33 to 37 test samples per class). Shuffle the training set yourself
    before making minibatches. Each call returns fresh arrays that you may modify.

    Source and license: Alpaydin, E. & Kaynak, C. (1998). Optical Recognition of Handwritten
    Digits [Dataset]. UCI Machine Learning Repository. https://doi.org/10.24432/C50P49 -- its
    1797-image test part, as shipped by scikit-learn. Licensed under CC BY 4.0
    (https://creativecommons.org/licenses/by/4.0/); see ``flowlab/datasets/data/README.md``.
    """
    table = _digits_table()
    x = (table[:, :64].astype(np.float32) / np.float32(16.0))
    y = table[:, 64].astype(np.int32)
    cut = table.shape[0] - DIGITS_TEST_SIZE
    return (x[:cut].copy(), y[:cut].copy()), (x[cut:].copy(), y[cut:].copy())


def regression(n=100, noise=0.1, seed=0, features=1, return_params=False):
    """A linear-regression problem: ``y = x @ w + b + noise``.

    ``x`` is float32 ``[n, features]`` drawn uniformly from [-1, 1); the true ``w`` (``[features]``)
    and ``b`` (a float) are drawn from a standard normal; ``noise`` is the standard deviation of
    Gaussian noise added to ``y`` (float32 ``[n]``). With ``return_params=True`` also returns
    ``w`` and ``b``: ``(x, y, w, b)``, so a lesson can compare what it learned with the truth.

    >>> import flowlab as fl
    >>> x, y = fl.datasets.regression(4, noise=0.0, seed=1, features=3)
    >>> x.shape, y.shape, x.dtype.name
    ((4, 3), (4,), 'float32')
    """
    n, features = _count(n, "n"), _count(features, "features")
    if noise < 0:
        raise ValueError(f"regression: noise is a standard deviation and must be >= 0, got {noise}")
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(features).astype(np.float32)
    b = np.float32(rng.standard_normal())
    x = rng.uniform(-1.0, 1.0, (n, features)).astype(np.float32)
    y = (x @ w + b + noise * rng.standard_normal(n)).astype(np.float32)
    if return_params:
        return x, y, w, float(b)
    return x, y


def spirals(n_per_class=100, classes=3, noise=0.2, seed=0, shuffle=True):
    """Interleaved 2-D spirals, one arm per class: a problem a linear model cannot solve.

    Arm ``k`` has ``n_per_class`` points with radius growing from 0 to 1 and angle from ``4k`` to
    ``4(k+1)`` radians (plus Gaussian noise of standard deviation ``noise`` on the angle), as in
    the CS231n example. Returns ``x`` float32 ``[n_per_class * classes, 2]`` and ``y`` int32 class
    ids; shuffled (under ``seed``) unless ``shuffle=False``, which leaves the arms in class order.
    """
    n_per_class, classes = _count(n_per_class, "n_per_class"), _count(classes, "classes")
    rng = np.random.default_rng(seed)
    r = np.linspace(0.0, 1.0, n_per_class)
    xs, ys = [], []
    for k in range(classes):
        t = np.linspace(4.0 * k, 4.0 * (k + 1), n_per_class) + noise * rng.standard_normal(n_per_class)
        xs.append(np.stack([r * np.sin(t), r * np.cos(t)], axis=1))
        ys.append(np.full(n_per_class, k))
    x = np.concatenate(xs).astype(np.float32)
    y = np.concatenate(ys).astype(np.int32)
    return _shuffled(x, y, rng) if shuffle else (x, y)


def blobs(n=300, centers=3, seed=0, features=2, std=1.0, box=(-10.0, 10.0), shuffle=True):
    """Gaussian clusters: ``n`` points split as evenly as possible over ``centers`` clusters.

    ``centers`` is a number of clusters (their centres drawn uniformly inside ``box`` in each of
    ``features`` dimensions) or an array ``[k, features]`` of centres. Each point is its centre
    plus Gaussian noise of standard deviation ``std``. Returns ``x`` float32 ``[n, features]`` and
    ``y`` int32 cluster ids, shuffled under ``seed`` unless ``shuffle=False``.
    """
    n = _count(n, "n")
    rng = np.random.default_rng(seed)
    if np.ndim(centers) == 0:
        k = _count(centers, "centers")
        c = rng.uniform(box[0], box[1], (k, _count(features, "features")))
    else:
        c = np.asarray(centers, dtype=np.float64)
        if c.ndim != 2 or c.shape[0] < 1:
            raise ValueError(f"blobs: centers must be a count or an array [k, features], got shape {c.shape}")
        k = c.shape[0]
    if n < k:
        raise ValueError(f"blobs: n={n} points cannot cover {k} clusters")
    sizes = np.full(k, n // k)
    sizes[: n % k] += 1
    y = np.repeat(np.arange(k), sizes).astype(np.int32)
    x = (c[y] + std * rng.standard_normal((n, c.shape[1]))).astype(np.float32)
    return _shuffled(x, y, rng) if shuffle else (x, y)


def _count(value, what) -> int:
    if isinstance(value, (bool, np.bool_)) or int(value) != value or value < 1:
        raise ValueError(f"{what} must be a whole number >= 1, got {value!r}")
    return int(value)


def _shuffled(x, y, rng):
    order = rng.permutation(len(y))
    return x[order], y[order]
