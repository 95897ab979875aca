"""Compile checks without a GPU: NVRTC from its PyPI wheel compiles CUDA C here and ptxas reports
what each kernel uses (flowlab/gpu/_nvrtc.py)."""
import pytest

import flowlab as fl

pytestmark = pytest.mark.skipif(not fl.gpu.nvrtc_available(), reason="NVRTC (pip install nvidia-cuda-nvrtc) is missing")

SOURCE = r'''
#define BLOCK 128
extern "C" __global__ void scale_rows(const float* x, float* y, int n) {
    __shared__ float tile[BLOCK];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    tile[threadIdx.x] = i < n ? x[i] : 0.0f;
    __syncthreads();
    if (i < n) y[i] = tile[threadIdx.x] * 2.0f + tile[(threadIdx.x + 1) % BLOCK];
}
extern "C" __global__ void square(float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = y[i] * y[i];
}
'''


def test_a_kernel_file_compiles_and_reports_what_each_kernel_uses():
    report = fl.gpu.compile_check(SOURCE, "rows.cu")
    assert set(report.kernels) == {"scale_rows", "square"}
    rows = report.kernels["scale_rows"]
    assert rows.registers > 0 and rows.shared_bytes == 128 * 4 and rows.barriers == 1
    assert report.kernels["square"].shared_bytes == 0 and report.kernels["square"].barriers == 0
    assert report.cubin_bytes > 0
    assert "scale_rows: " in str(report) and "512 B shared memory" in str(report)


def test_a_compile_error_names_the_file_and_line():
    bad = SOURCE.replace("tile[threadIdx.x] * 2.0f", "tile[threadIdx.x] * scale")
    with pytest.raises(fl.gpu.CudaCompileError) as e:
        fl.gpu.compile_check(bad, "rows.cu")
    assert 'rows.cu(8): error: identifier "scale" is undefined' in str(e.value)


def test_another_architecture():
    report = fl.gpu.compile_check(SOURCE, "rows.cu", arch="sm_80")
    assert report.arch == "sm_80" and report.kernels["square"].registers > 0
