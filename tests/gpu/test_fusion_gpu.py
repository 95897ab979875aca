"""Fused elementwise chains on a real GPU: one generated CUDA kernel per chain (core/passes/cuda_fusion.py),
launched through CuPy's RawKernel, equal to the CPU's result. tests/unit/test_fusion_cuda.py checks the
same kernels' source with NVRTC and the simulator. Skipped where no CUDA device is visible."""
import numpy as np
import pytest

import flowlab as fl
from flowlab.core.passes import cuda_fusion

pytestmark = pytest.mark.gpu



def _fifty_ops(x, c):
    y = x
    for _ in range(10):                               # 5 ops a round: 50 ops, one fused chain
        y = fl.tanh(y * c + 0.5) - fl.sigmoid(y) * 0.25
    return y


def _launched(fn, *args):
    """fn's result, and how many generated kernels ran and how many calls fell back to numpy kernels."""
    before = dict(cuda_fusion.stats)
    out = fn(*args)
    return out, cuda_fusion.stats["launches"] - before["launches"], cuda_fusion.stats["fallbacks"] - before["fallbacks"]


@pytest.mark.parametrize("dtype,tol", [(np.float32, 1e-5), (np.float64, 1e-12)])
def test_a_traced_fifty_op_chain_on_the_gpu_is_one_launch(cp, dtype, tol):
    @fl.function
    def on_gpu(x, c):
        with fl.device("/gpu:0"):
            return _fifty_ops(x, c)

    x = np.random.default_rng(0).uniform(-2, 2, (256, 300)).astype(dtype)
    c = np.asarray(0.75, dtype)
    cpu = fl.function(_fifty_ops)(fl.constant(x), fl.constant(c)).numpy()
    out, launches, fallbacks = _launched(on_gpu, fl.constant(x), fl.constant(c))
    assert (launches, fallbacks) == (1, 0)
    assert out.device.endswith("GPU:0") and isinstance(out._value, cp.ndarray)
    np.testing.assert_allclose(out.numpy(), cpu, rtol=tol, atol=tol)
    assert len(cuda_fusion.fused_cuda_sources(on_gpu)) == 1
    out, launches, _ = _launched(on_gpu, fl.constant(x), fl.constant(c))   # compiled once: the next call launches
    assert launches == 1


def test_an_unplaced_chain_given_gpu_arrays_runs_the_generated_kernel(cp):
    fn = fl.function(_fifty_ops)
    x = np.linspace(-3, 3, 4096, dtype=np.float32).reshape(64, 64)
    cpu = fn(fl.constant(x), fl.constant(np.float32(0.5))).numpy()
    gx, gc = fl.convert_to_tensor(cp.asarray(x)), fl.convert_to_tensor(cp.asarray(np.float32(0.5)))
    out, launches, fallbacks = _launched(fn, gx, gc)
    assert (launches, fallbacks) == (1, 0) and isinstance(out._value, cp.ndarray)
    np.testing.assert_allclose(out.numpy(), cpu, rtol=1e-5, atol=1e-5)   # the CPU's exp/tanh are its own


def test_a_non_contiguous_input_falls_back_to_the_numpy_kernel_with_the_same_result(cp):
    fn = fl.function(_fifty_ops)
    x = np.random.default_rng(1).uniform(-1, 1, (32, 48)).astype(np.float32)
    gc = fl.convert_to_tensor(cp.asarray(np.float32(0.5)))
    contiguous, _, _ = _launched(fn, fl.convert_to_tensor(cp.asarray(np.ascontiguousarray(x.T))), gc)
    strided, launches, fallbacks = _launched(fn, fl.convert_to_tensor(cp.asarray(x).T), gc)
    assert (launches, fallbacks) == (0, 1)
    np.testing.assert_allclose(strided.numpy(), contiguous.numpy(), rtol=1e-5, atol=1e-6)
