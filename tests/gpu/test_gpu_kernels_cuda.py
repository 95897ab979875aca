"""flowlab's CUDA kernels on a real GPU: each library kernel launched through CuPy equals numpy; the
ops that run them (softmax, the sparse softmax cross-entropy and its mean, with their gradients)
give on /gpu:0 what they give on the CPU, eager and traced; fl.gpu.Kernel launches with numpy
arrays and writes the results back into them. Skipped where no CUDA device is visible."""
import math

import numpy as np
import pytest

import flowlab as fl
from flowlab.core.backends import cuda_kernels
from flowlab.core.execute import get_op
from flowlab.core.ops import nn_ops
from flowlab.gpu import _kernels as gk

pytestmark = pytest.mark.gpu
rng = np.random.default_rng(18)



def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def softmax(z):
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


# -- each kernel, launched through CuPy --------------------------------------------------------------
def test_vector_add(cp):
    n = 100_003
    a, b = f32(n), f32(n)
    c = cp.zeros(n, cp.float32)
    cuda_kernels.launch("vector_add", (64,), (256,), (cp.asarray(a), cp.asarray(b), c, n))   # grid-stride
    np.testing.assert_array_equal(c.get(), a + b)


@pytest.mark.parametrize("rows,cols,block", [(64, 1000, 256), (3, 7, 32)])
def test_reduce_sum_rows(cp, rows, cols, block):
    x = f32(rows, cols)
    out = cp.zeros(rows, cp.float32)
    cuda_kernels.launch("reduce_sum_rows", (rows,), (block,), (cp.asarray(x), out, rows, cols))
    np.testing.assert_allclose(out.get(), x.sum(1), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("rows,cols,block", [(128, 1000, 256), (7, 10, 32)])
def test_softmax_and_cross_entropy_kernels(cp, rows, cols, block):
    z, labels = f32(rows, cols) * 4, rng.integers(0, cols, rows).astype(np.int32)
    probs = cp.zeros((rows, cols), cp.float32)
    cuda_kernels.launch("softmax_rows", (rows,), (block,), (cp.asarray(z), probs, rows, cols))
    np.testing.assert_allclose(probs.get(), softmax(z), rtol=1e-5, atol=1e-7)

    probs, loss = cp.zeros((rows, cols), cp.float32), cp.zeros(rows, cp.float32)
    cuda_kernels.launch("softmax_xent_forward", (rows,), (block,),
                        (cp.asarray(z), cp.asarray(labels), probs, loss, rows, cols))
    p = softmax(z.astype(np.float64))
    np.testing.assert_allclose(loss.get(), -np.log(p[np.arange(rows), labels]), rtol=1e-5, atol=1e-6)

    dloss, dlogits = f32(rows), cp.zeros((rows, cols), cp.float32)
    cuda_kernels.launch("softmax_xent_backward", (rows,), (block,),
                        (probs, cp.asarray(labels), cp.asarray(dloss), dlogits, rows, cols))
    hot = np.eye(cols, dtype=np.float32)[labels]
    np.testing.assert_allclose(dlogits.get(), (p - hot) * dloss[:, None], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["matmul_naive", "matmul_tiled"])
@pytest.mark.parametrize("m,n,k", [(100, 70, 33), (16, 16, 16), (1, 5, 40)])
def test_matmul(cp, name, m, n, k):
    a, b = f32(m, k), f32(k, n)
    c = cp.zeros((m, n), cp.float32)
    grid = (math.ceil(n / 16), math.ceil(m / 16))
    cuda_kernels.launch(name, grid, (16, 16), (cp.asarray(a), cp.asarray(b), c, m, n, k))
    np.testing.assert_allclose(c.get(), a @ b, rtol=1e-4, atol=1e-4)


def test_launch_checks_argument_types(cp):
    with pytest.raises(TypeError, match="float\\* a needs float32, got float64"):
        cuda_kernels.launch("vector_add", (1,), (32,), (cp.zeros(4), *[cp.zeros(4, cp.float32)] * 2, 4))
    with pytest.raises(TypeError, match="takes 4 arguments"):
        cuda_kernels.launch("vector_add", (1,), (32,), (cp.zeros(4, cp.float32),))


# -- the ops on /gpu:0 run these kernels and agree with the CPU ---------------------------------------
def loss_and_grad(x, labels, mean):
    """The loss (per example, or its mean as Keras' loss takes it) and the gradient of a weighted
    sum of it (so the backward kernel gets a dloss that is not all ones)."""
    with fl.GradientTape() as tape:
        tape.watch(x)
        if mean:
            loss = nn_ops.sparse_softmax_cross_entropy_mean(labels, x)
            total = loss * 2.0
        else:
            loss = fl.nn.sparse_softmax_cross_entropy_with_logits(labels, x)
            weights = fl.cast(np.linspace(0.5, 1.5, int(x.shape[0])), x.dtype)
            total = fl.reduce_sum(loss * weights)
    return loss, tape.gradient(total, x)


@pytest.mark.parametrize("mean", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])   # float64: the op's own kernel, on CuPy
def test_cross_entropy_forward_and_backward_on_gpu_equal_the_cpu(cp, mean, dtype):
    z, labels = (f32(32, 10) * 3).astype(dtype), rng.integers(0, 10, 32).astype(np.int64)
    cpu_loss, cpu_grad = loss_and_grad(fl.constant(z), labels, mean)
    with fl.device("/gpu:0"):
        gpu_loss, gpu_grad = loss_and_grad(fl.convert_to_tensor(cp.asarray(z)), labels, mean)
    assert gpu_loss.device.endswith("GPU:0") and gpu_grad.device.endswith("GPU:0")
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(gpu_loss.numpy(), cpu_loss.numpy(), **tol)
    np.testing.assert_allclose(gpu_grad.numpy(), cpu_grad.numpy(), **tol)


def test_cross_entropy_traced_on_gpu_equals_eager(cp):
    z, labels = f32(16, 10), rng.integers(0, 10, 16).astype(np.int32)
    x = fl.convert_to_tensor(cp.asarray(z))
    with fl.device("/gpu:0"):
        eager = loss_and_grad(x, labels, True)
        traced = fl.function(lambda x, y: loss_and_grad(x, y, True))(x, labels)
    for a, b in zip(eager, traced):
        assert b.device.endswith("GPU:0")
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-6, atol=1e-7)


def test_softmax_on_gpu_eager_and_traced(cp):
    z = f32(5, 300, 7).transpose(0, 2, 1).copy()     # 3-D, softmax over the last axis: 35 rows
    fn = fl.function(lambda x: fl.nn.softmax(x))
    with fl.device("/gpu:0"):
        eager, traced = fl.nn.softmax(fl.constant(z)), fn(fl.constant(z))
    for out in (eager, traced):
        assert out.device.endswith("GPU:0")
        np.testing.assert_allclose(out.numpy(), softmax(z), rtol=1e-5, atol=1e-7)
    with fl.device("/gpu:0"):   # not the last axis: the op's own kernel, same answer
        np.testing.assert_allclose(fl.nn.softmax(fl.constant(z), axis=1).numpy(),
                                   np.moveaxis(softmax(np.moveaxis(z, 1, -1)), -1, 1), rtol=1e-5, atol=1e-7)


def test_the_registered_kernels_are_the_ones_that_run(cp, monkeypatch):
    calls = []
    real = cuda_kernels.launch
    monkeypatch.setattr(cuda_kernels, "launch", lambda name, *a, **k: (calls.append(name), real(name, *a, **k))[1])
    x, labels = fl.convert_to_tensor(cp.asarray(f32(8, 10))), rng.integers(0, 10, 8).astype(np.int32)
    with fl.device("/gpu:0"):
        loss_and_grad(x, labels, mean=False)
        loss_and_grad(x, labels, mean=True)
        fl.nn.softmax(x)
    # the backward reuses the forward's probabilities (no softmax_rows between them)
    assert calls == ["softmax_xent_forward", "softmax_xent_backward"] * 2 + ["softmax_rows"]
    assert all(get_op(op).kernels["cupy"].__module__ == cuda_kernels.__name__ for op in cuda_kernels.OP_KERNELS)


def test_an_invalid_label_gives_nan_on_the_gpu(cp):
    with fl.device("/gpu:0"):
        loss = fl.nn.sparse_softmax_cross_entropy_with_logits(np.array([1, 10], np.int32), fl.constant(f32(2, 10)))
    values = loss.numpy()
    assert np.isfinite(values[0]) and np.isnan(values[1])


def test_fit_under_a_gpu_scope_equals_the_cpu(cp):
    x, y = f32(64, 8), rng.integers(0, 3, 64).astype(np.int32)

    def fit(device):
        fl.random.set_seed(7)
        with fl.device(device):
            model = fl.keras.Sequential([fl.keras.layers.Dense(16, activation="relu"), fl.keras.layers.Dense(3)])
            model.compile(optimizer=fl.optimizers.SGD(0.1),
                          loss=fl.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            return model.fit(x, y, epochs=3, batch_size=16, verbose=0, shuffle=False).history["loss"]

    np.testing.assert_allclose(fit("/gpu:0"), fit("/cpu:0"), rtol=1e-5, atol=1e-6)


# -- fl.gpu.Kernel: numpy in, numpy out, on the GPU ---------------------------------------------------
def test_kernel_launch_writes_results_back_into_numpy_arrays(cp):
    a, b, c = f32(1000), f32(1000), np.zeros(1000, np.float32)
    result = gk.Kernel.from_library("vector_add")((4,), (256,), (a, b, c, 1000))
    assert result is None                             # it ran on the GPU, not in the simulator
    np.testing.assert_array_equal(c, a + b)

    m, n, k = 20, 18, 21
    A, B, C = f32(m, k), f32(k, n), np.zeros((m, n), np.float32)
    gk.Kernel.from_library("matmul_tiled").launch((2, 2), (16, 16), (A, B, C, m, n, k))
    np.testing.assert_allclose(C, A @ B, rtol=1e-4, atol=1e-4)


def test_kernel_from_a_learners_source(cp):
    text = r'''
extern "C" __global__ void scale(float* x, float s, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= s;
}'''
    x = f32(50)
    expected = x * 3
    gk.Kernel(text, "scale")((1,), (64,), (x, 3.0, 50))     # 3.0 becomes a C float, 50 an int
    np.testing.assert_allclose(x, expected, rtol=1e-6)
