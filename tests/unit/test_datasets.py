"""flowlab.datasets: the shipped digits data and the seeded synthetic generators."""
import gzip
import hashlib
import os

import numpy as np
import pytest

import flowlab as fl
import flowlab.datasets as ds

DATA = os.path.join(os.path.dirname(ds.__file__), "data")


# -- digits -----------------------------------------------------------------------------------
def test_digits_shapes_and_dtypes():
    (x_train, y_train), (x_test, y_test) = fl.datasets.digits()
    assert x_train.shape == (1437, 64) and y_train.shape == (1437,)
    assert x_test.shape == (360, 64) and y_test.shape == (360,)
    assert ds.DIGITS_TEST_SIZE == 360
    for x in (x_train, x_test):
        assert x.dtype == np.float32
    for y in (y_train, y_test):
        assert y.dtype == np.int32


def test_digits_value_ranges():
    (x_train, y_train), (x_test, y_test) = ds.digits()
    x = np.concatenate([x_train, x_test])
    y = np.concatenate([y_train, y_test])
    assert x.min() == 0.0 and x.max() == 1.0
    # pixels were counts 0..16 divided by 16: every value is a multiple of 1/16
    np.testing.assert_array_equal(x * 16, np.round(x * 16))
    assert set(np.unique(y).tolist()) == set(range(10))


def test_digits_class_balance():
    (_, y_train), (_, y_test) = ds.digits()
    counts = np.bincount(np.concatenate([y_train, y_test]), minlength=10)
    assert counts.sum() == 1797
    assert counts.min() >= 150 and counts.max() <= 200, counts
    # both halves of the fixed split hold every class in about the same proportion
    test_counts = np.bincount(y_test, minlength=10)
    assert test_counts.min() >= 30, test_counts
    assert np.bincount(y_train, minlength=10).min() >= 120


def test_digits_split_is_fixed_and_disjoint():
    (x1, y1), (t1, u1) = ds.digits()
    (x2, y2), (t2, u2) = ds.digits()
    np.testing.assert_array_equal(x1, x2)
    np.testing.assert_array_equal(y1, y2)
    np.testing.assert_array_equal(t1, t2)
    np.testing.assert_array_equal(u1, u2)
    # no image appears in both halves (the 1797 rows of the file are all different)
    train_rows = {row.tobytes() for row in x1}
    test_rows = {row.tobytes() for row in t1}
    assert len(train_rows) == 1437 and len(test_rows) == 360
    assert not train_rows & test_rows
    # the test set is the last 360 rows of the file, as documented
    with gzip.open(os.path.join(DATA, "digits.csv.gz"), "rt") as f:
        last = np.array(f.read().strip().splitlines()[-1].split(","), dtype=np.int64)
    np.testing.assert_array_equal(t1[-1] * 16, last[:64])
    assert u1[-1] == last[64]


def test_digits_returns_fresh_arrays():
    (x, y), _ = ds.digits()
    x[:] = -1
    y[:] = -1
    (x2, y2), _ = ds.digits()
    assert x2.min() == 0.0 and y2.min() == 0


def test_digits_file_is_the_documented_one():
    with open(os.path.join(DATA, "digits.csv.gz"), "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    with open(os.path.join(DATA, "README.md")) as f:
        readme = f.read()
    assert digest in readme
    assert "CC BY 4.0" in readme and "Alpaydin" in readme and "Kaynak" in readme


def test_digits_trains_a_flowlab_model():
    """The data is learnable: a few epochs of softmax regression beat chance by far."""
    (x, y), (xt, yt) = ds.digits()
    w = fl.Variable(np.zeros((64, 10), np.float32))
    b = fl.Variable(np.zeros(10, np.float32))
    opt = fl.optimizers.SGD(0.5)
    xs, ys = fl.constant(x), fl.constant(y)
    for _ in range(30):
        with fl.GradientTape() as tape:
            loss = fl.reduce_mean(fl.nn.sparse_softmax_cross_entropy_with_logits(ys, xs @ w + b))
        opt.apply_gradients(zip(tape.gradient(loss, [w, b]), [w, b]))
    accuracy = float(np.mean(np.argmax(xt @ w.numpy() + b.numpy(), axis=1) == yt))
    assert accuracy > 0.8, accuracy


# -- synthetic generators ---------------------------------------------------------------------
def test_regression_shapes_dtypes_and_model():
    x, y, w, b = ds.regression(200, noise=0.0, seed=3, features=4, return_params=True)
    assert x.shape == (200, 4) and y.shape == (200,) and w.shape == (4,)
    assert x.dtype == np.float32 and y.dtype == np.float32 and isinstance(b, float)
    assert x.min() >= -1 and x.max() < 1
    np.testing.assert_allclose(y, x @ w + b, rtol=1e-5, atol=1e-5)
    x2, y2 = ds.regression(200, noise=0.5, seed=3, features=4)
    np.testing.assert_array_equal(x, x2)
    residual = y2 - (x2 @ w + b)
    assert 0.4 < residual.std() < 0.6


def test_spirals_shapes_balance_and_range():
    x, y = ds.spirals(50, classes=4, noise=0.1, seed=1)
    assert x.shape == (200, 2) and y.shape == (200,)
    assert x.dtype == np.float32 and y.dtype == np.int32
    np.testing.assert_array_equal(np.bincount(y), [50] * 4)
    assert np.all(np.linalg.norm(x, axis=1) <= 1 + 1e-6)
    xo, yo = ds.spirals(50, classes=4, noise=0.1, seed=1, shuffle=False)
    np.testing.assert_array_equal(yo, np.repeat(np.arange(4), 50))
    assert sorted(map(bytes, x)) == sorted(map(bytes, xo))   # shuffling only reorders


def test_blobs_shapes_balance_and_centers():
    x, y = ds.blobs(301, centers=3, seed=2)
    assert x.shape == (301, 2) and y.shape == (301,)
    assert x.dtype == np.float32 and y.dtype == np.int32
    assert sorted(np.bincount(y).tolist()) == [100, 100, 101]
    centers = np.array([[0.0, 0.0, 0.0], [20.0, 20.0, 20.0]])
    x, y = ds.blobs(400, centers=centers, seed=2, std=0.5)
    assert x.shape == (400, 3)
    for k in range(2):
        np.testing.assert_allclose(x[y == k].mean(axis=0), centers[k], atol=0.2)


@pytest.mark.parametrize("make", [
    lambda seed: ds.regression(50, 0.3, seed),
    lambda seed: ds.spirals(30, 3, 0.2, seed),
    lambda seed: ds.blobs(90, 3, seed),
])
def test_generators_are_deterministic_under_a_seed(make):
    a, b, c = make(7), make(7), make(8)
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u, v)
    assert not np.array_equal(a[0], c[0])


@pytest.mark.parametrize("call", [
    lambda: ds.regression(0),
    lambda: ds.regression(10, noise=-1),
    lambda: ds.spirals(10, classes=0),
    lambda: ds.blobs(2, centers=3),
    lambda: ds.blobs(10, centers=np.zeros(3)),
    lambda: ds.blobs(2.5),
])
def test_generators_reject_bad_arguments(call):
    with pytest.raises(ValueError):
        call()
