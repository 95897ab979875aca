"""The CuPy backend runs the same op table on a GPU. Skipped where no CUDA device is visible."""
import numpy as np
import pytest

import flowlab as fl

pytestmark = pytest.mark.gpu



def test_ops_on_gpu_match_numpy(cp):
    a = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
    b = np.random.default_rng(1).standard_normal((32, 16)).astype(np.float32)
    x, y = fl.convert_to_tensor(cp.asarray(a)), fl.convert_to_tensor(cp.asarray(b))
    assert "GPU:0" in x.device
    out = fl.nn.softmax(fl.nn.relu(x @ y) + 1.0)
    assert "GPU:0" in out.device
    ref = np.maximum(a @ b, 0) + 1.0
    ref = np.exp(ref - ref.max(-1, keepdims=True))
    np.testing.assert_allclose(out.numpy(), ref / ref.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)


def test_gradients_on_gpu_match_cpu(cp):
    a = np.random.default_rng(2).standard_normal((8, 5)).astype(np.float32)
    labels = np.arange(8) % 5

    def grad(x, lab):
        with fl.GradientTape() as tape:
            tape.watch(x)
            loss = fl.reduce_mean(fl.nn.sparse_softmax_cross_entropy_with_logits(lab, fl.tanh(x)))
        return tape.gradient(loss, x)

    gpu = grad(fl.convert_to_tensor(cp.asarray(a)), fl.convert_to_tensor(cp.asarray(labels.astype(np.int32))))
    cpu = grad(fl.constant(a), fl.constant(labels.astype(np.int32)))
    np.testing.assert_allclose(gpu.numpy(), cpu.numpy(), rtol=1e-5, atol=1e-6)
