"""flowlab's CUDA kernels (flowlab/core/backends/cuda/*.cu) without a GPU: each file compiles with
NVRTC, each kernel run in the thread simulator equals numpy (and reports no race), the tiled matmul
loads less from global memory than the naive one, and the sources are readable from Python
(fl.gpu.source, fl.gpu.Kernel). Sizes are small: the simulator runs every thread in Python."""
import math

import numpy as np
import pytest

import flowlab as fl
from flowlab.core.backends import cuda_kernels
from flowlab.core.execute import get_op
from flowlab.gpu import _kernels as gk
from flowlab.gpu._nvrtc import CudaCompileError, compile_check, nvrtc_available
from flowlab.gpu._sim import KernelSourceError

rng = np.random.default_rng(18)
needs_nvrtc = pytest.mark.skipif(not nvrtc_available(), reason="NVRTC (pip install nvidia-cuda-nvrtc) is missing")


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def softmax(z):
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


# -- compile checks ---------------------------------------------------------------------------------
@needs_nvrtc
@pytest.mark.parametrize("path", sorted(cuda_kernels.KERNEL_DIR.glob("*.cu")), ids=lambda p: p.name)
def test_every_kernel_file_compiles_and_reports_registers(path):
    report = compile_check(path.read_text(), path.name)
    defined = [k for k in cuda_kernels.kernel_names() if cuda_kernels.file_of(k) == path]
    assert defined and sorted(report.kernels) == defined
    for usage in report.kernels.values():
        assert usage.registers > 0, usage


@needs_nvrtc
def test_a_typo_in_a_kernel_is_an_error_with_its_line_from_nvrtc_and_the_simulator():
    text = cuda_kernels.source("vector_add")
    line = text.splitlines().index("        c[i] = a[i] + b[i];") + 1
    bad = text.replace("c[i] = a[i] + b[i];", "c[i] = a[i] + bb[i];")
    with pytest.raises(CudaCompileError) as e:
        compile_check(bad, "vector_add.cu")
    assert f'vector_add.cu({line}): error: identifier "bb" is undefined' in str(e.value)
    with pytest.raises(KernelSourceError) as e:
        gk.Kernel(bad, "vector_add")
    assert e.value.lineno == line and "'bb' is not declared" in str(e.value)


@needs_nvrtc
def test_kernel_compile_reports_only_that_kernel():
    report = gk.Kernel.from_library("matmul_tiled").compile(arch="sm_80")
    assert list(report.kernels) == ["matmul_tiled"] and report.arch == "sm_80"
    assert report.kernels["matmul_tiled"].shared_bytes == 2 * 16 * 16 * 4   # two TILE x TILE float tiles


# -- the kernels, simulated, against numpy ----------------------------------------------------------
def simulate(name, grid, block, args):
    report = gk.Kernel.from_library(name).simulate(grid, block, args)
    assert report.ok and not report.races, report
    return report


def test_vector_add_grid_stride_loop():
    n = 1000
    a, b, c = f32(n), f32(n), np.zeros(n, np.float32)
    simulate("vector_add", (2,), (128,), (a, b, c, n))   # 256 threads: each loops over 3 or 4 elements
    np.testing.assert_array_equal(c, a + b)


def test_reduce_sum_rows():
    x, out = f32(5, 300), np.zeros(5, np.float32)
    report = simulate("reduce_sum_rows", (5,), (256,), (x, out, 5, 300))
    np.testing.assert_allclose(out, x.sum(1), rtol=1e-5, atol=1e-5)
    assert report.global_loads["x"] == x.size          # every element read once, by one thread


def test_softmax_rows_block_narrower_than_the_row():
    z, probs = f32(3, 37) * 5, np.zeros((3, 37), np.float32)
    simulate("softmax_rows", (3,), (32,), (z, probs, 3, 37))
    np.testing.assert_allclose(probs, softmax(z), rtol=1e-5, atol=1e-7)


def test_softmax_xent_forward_and_backward():
    rows, cols = 3, 37
    z, labels = f32(rows, cols) * 5, np.array([0, 36, 7], np.int32)
    probs, loss = np.zeros((rows, cols), np.float32), np.zeros(rows, np.float32)
    simulate("softmax_xent_forward", (rows,), (32,), (z, labels, probs, loss, rows, cols))
    p = softmax(z.astype(np.float64))
    np.testing.assert_allclose(probs, p, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(loss, -np.log(p[np.arange(rows), labels]), rtol=1e-5)

    dloss, dlogits = f32(rows), np.zeros((rows, cols), np.float32)
    simulate("softmax_xent_backward", (rows,), (32,), (probs, labels, dloss, dlogits, rows, cols))
    hot = np.eye(cols, dtype=np.float32)[labels]
    np.testing.assert_allclose(dlogits, (probs - hot) * dloss[:, None], rtol=1e-6, atol=1e-7)


def test_an_invalid_label_gives_nan_for_its_row_only():
    z, labels = f32(2, 5), np.array([1, 5], np.int32)
    probs, loss = np.zeros((2, 5), np.float32), np.zeros(2, np.float32)
    with np.errstate(invalid="ignore"):
        simulate("softmax_xent_forward", (2,), (32,), (z, labels, probs, loss, 2, 5))
    assert np.isfinite(loss[0]) and np.isnan(loss[1])


@pytest.mark.parametrize("name", ["matmul_naive", "matmul_tiled"])
def test_matmul_with_edges_that_are_not_a_multiple_of_the_tile(name):
    m, n, k = 20, 18, 21                   # TILE is 16: every block has threads past an edge
    a, b, c = f32(m, k), f32(k, n), np.zeros((m, n), np.float32)
    tile = 16
    simulate(name, (math.ceil(n / tile), math.ceil(m / tile)), (tile, tile), (a, b, c, m, n, k))
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)


def test_tiled_matmul_loads_each_input_fewer_times_than_naive():
    m = n = k = 20
    tile, grid = 16, (2, 2)
    loads = {}
    for name in ("matmul_naive", "matmul_tiled"):
        a, b, c = f32(m, k), f32(k, n), np.zeros((m, n), np.float32)
        loads[name] = simulate(name, grid, (tile, tile), (a, b, c, m, n, k)).global_loads
    # naive: each element of C reads a row of A and a column of B; tiled: a row of A is read once
    # per column of blocks, a column of B once per row of blocks
    assert loads["matmul_naive"]["A"] == m * n * k and loads["matmul_naive"]["B"] == m * n * k
    assert loads["matmul_tiled"]["A"] == m * k * math.ceil(n / tile)
    assert loads["matmul_tiled"]["B"] == k * n * math.ceil(m / tile)


def test_tiled_matmul_without_its_second_barrier_races():
    text = cuda_kernels.source("matmul_tiled")
    second = "        __syncthreads();               // everyone is done with these tiles"
    assert second in text
    k = gk.Kernel(text.replace(second, "        // (barrier removed)"), "matmul_tiled")
    m = n = k_ = 20
    a, b, c = f32(m, k_), f32(k_, n), np.zeros((m, n), np.float32)
    report = k.simulate((2, 2), (16, 16), (a, b, c, m, n, k_))
    assert not report.ok and {r.array for r in report.races} >= {"tile_a"}


# -- reading the kernels from Python ----------------------------------------------------------------
def test_source_of_a_kernel_or_of_an_op():
    assert "void matmul_tiled(" in gk.source("matmul_tiled")
    assert "void softmax_rows(" in gk.source("softmax")
    assert gk.source(get_op("sparse_softmax_cross_entropy_mean")) == cuda_kernels.source("softmax_xent_forward")
    assert gk.kernels() == cuda_kernels.kernel_names() and "reduce_sum_rows" in gk.kernels()


def test_unknown_names_list_what_exists():
    with pytest.raises(KeyError) as e:
        gk.source("conv2d")
    assert "matmul_tiled" in str(e.value) and "softmax" in str(e.value)
    with pytest.raises(KeyError, match="did you mean matmul_tiled"):
        cuda_kernels.source("matmul_tiles")
    with pytest.raises(KeyError, match="defines: vector_add"):
        gk.Kernel(cuda_kernels.source("vector_add"), "vector_sub")


def test_kernel_object_parameters_and_display():
    k = gk.Kernel.from_library("softmax_xent_backward")
    assert [(p[0], p[2]) for p in k.params] == [(p[0], p[2]) for p in cuda_kernels.params(k.name)]
    assert [p[0] for p in k.params] == ["probs", "labels", "dloss", "dlogits", "rows", "cols"]
    text = repr(k)
    assert text.startswith("<Kernel softmax_xent_backward (softmax_xent.cu)>")
    first = k.source.splitlines()[0]
    assert f"  1 | {first}" in text and "<pre>" in k._repr_html_()


def test_launch_without_a_gpu_simulates_into_the_callers_arrays(hidden_gpus):
    a, b, c = f32(100), f32(100), np.zeros(100, np.float32)
    report = gk.Kernel.from_library("vector_add")((1,), (64,), (a, b, c, 100))
    np.testing.assert_array_equal(c, a + b)
    assert report.threads == 64 and report.global_stores["c"] == 100


# -- the ops' GPU kernels are registered, and leave arrays that are not CuPy's to the op's kernel ---
def test_registered_gpu_kernels_fall_back_for_other_arrays(gpus):
    for op, launched in cuda_kernels.OP_KERNELS.items():
        assert get_op(op).kernels["cupy"] is not None and set(launched) <= set(cuda_kernels.kernel_names())
    z, labels = f32(4, 6), np.array([0, 5, 2, 1], np.int32)
    with fl.device("/gpu:0"):
        x = fl.constant(z)
        with fl.GradientTape() as tape:
            tape.watch(x)
            loss = fl.nn.sparse_softmax_cross_entropy_with_logits(labels, x)
        grad = tape.gradient(loss, x)
        probs = fl.nn.softmax(x)
    assert probs.device.endswith("GPU:0")
    np.testing.assert_allclose(probs.numpy(), softmax(z), rtol=1e-5)
    np.testing.assert_allclose(grad.numpy(), softmax(z) - np.eye(6, dtype=np.float32)[labels], rtol=1e-5, atol=1e-6)


def test_a_kernel_call_converts_python_numbers_to_its_parameters_c_types_as_the_gpu_path_does():
    src = ('extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {\n'
           '    int i = blockIdx.x * blockDim.x + threadIdx.x;\n    if (i < n) y[i] = a * x[i] + y[i];\n}\n')
    x, y = np.arange(5, dtype=np.float32), np.ones(5, np.float32)
    fl.gpu.Kernel(src, "saxpy")(1, 8, [2.0, x, y, 5])
    np.testing.assert_array_equal(y, 2 * x + 1)
    with pytest.raises(fl.gpu.KernelArgumentError, match="np.float32"):   # simulate takes what CuPy is given
        fl.gpu.simulate(src, "saxpy", 1, 8, [2.0, x, y, 5])
