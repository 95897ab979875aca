"""The GPU twin of compiled fusion (flowlab/core/passes/cuda_fusion.py), checked without a GPU: the
generated CUDA C compiles with NVRTC (registers reported), runs in flowlab's CUDA simulator with the
numpy kernel's results, and a traced chain, placed on a (logical) GPU or not, is one fused node
whose GPU kernel is the generated one."""
import types

import numpy as np
import pytest

import flowlab as fl
from flowlab.core.passes import _cfusion, cuda_fusion
from flowlab.core.passes.fusion import elementwise_kernel
from flowlab.gpu import compile_check, nvrtc_available

F32, F64, BOOL = np.dtype(np.float32), np.dtype(np.float64), np.dtype(bool)
N = 100


def _chain(dtype, ops, scalars=("x1",)):
    """Steps for ``ops`` ((name, args, result dtype or None for ``dtype``)), each over N elements but
    those of one-element arguments only (``scalars``)."""
    steps, scalars = [], set(scalars)
    for j, (name, args, d) in enumerate(ops):
        one = all(a in scalars for a in args)
        scalars |= {f"t{j}"} if one else set()
        steps.append((name, args, () if one else (N,), np.dtype(d or dtype)))
    return steps


# x0, x2: N elements; x1: one value (broadcast)
TRANSCENDENTAL = [("multiply", ("x1", "x1"), None),        # scalars only: computed once, before the loop
                  ("multiply", ("x0", "t0"), None), ("add", ("t1", "x2"), None), ("tanh", ("t2",), None),
                  ("exp", ("t3",), None), ("sigmoid", ("t4",), None), ("log", ("t5",), None),
                  ("abs", ("t6",), None), ("sqrt", ("t7",), None), ("maximum", ("t8", "x2"), None),
                  ("minimum", ("t9", "x1"), None), ("relu", ("t10",), None), ("square", ("t11",), None),
                  ("subtract", ("t12", "x0"), None), ("divide", ("t13", "t4"), None), ("negative", ("t14",), None),
                  ("sign", ("t15",), None), ("multiply", ("t16", "t15"), None)]
COMPARISON = [("greater", ("x0", "x1"), BOOL), ("less", ("x0", "x2"), BOOL), ("logical_and", ("t0", "t1"), BOOL),
              ("logical_not", ("t2",), BOOL), ("logical_or", ("t3", "t0"), BOOL), ("multiply", ("t4", "x2"), None),
              ("equal", ("t5", "x1"), BOOL), ("not_equal", ("x0", "x2"), BOOL), ("less_equal", ("t6", "t7"), BOOL),
              ("greater_equal", ("x2", "x0"), BOOL), ("multiply", ("t8", "x0"), None), ("add", ("t10", "t9"), None),
              ("relu_grad", ("t11", "x0"), None)]
GROUPS = {f"chain_{kind}_{np.dtype(d).name}": (_chain(d, ops), [((N,), d), ((), d), ((N,), d)])
          for kind, ops in (("math", TRANSCENDENTAL), ("compare", COMPARISON)) for d in (F32, F64)}
GROUPS["chain_two_ops_float32"] = (_chain(F32, [("multiply", ("x0", "x1"), None), ("add", ("t0", "x0"), None)]),
                                   [((N,), F32), ((1,), F32)])


def _inputs(specs, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.uniform(-2, 2, shape).astype(dtype) if shape else np.asarray(0.25, dtype) for shape, dtype in specs]


def test_which_groups_compile_for_the_gpu():
    steps, specs = GROUPS["chain_math_float64"]
    assert cuda_fusion.cuda_compilable(steps, specs)                  # exp, tanh... in double: CUDA has them
    assert not _cfusion.compilable(steps, specs)                      # the CPU's prelude is float32 only
    steps, specs = GROUPS["chain_two_ops_float32"]
    assert cuda_fusion.cuda_compilable(steps, specs) and not _cfusion.compilable(steps, specs)   # no MIN_OPS
    as_int = [(n, a, s, np.dtype(np.int32)) for n, a, s, _ in steps]
    assert not cuda_fusion.cuda_compilable(as_int, [((N,), np.dtype(np.int32)), ((1,), np.dtype(np.int32))])
    no_c = _chain(F32, [("sin", ("x0",), None), ("add", ("t0", "x0"), None)])
    assert not cuda_fusion.cuda_compilable(no_c, [((N,), F32)])
    ends_in_bool = _chain(F32, [("add", ("x0", "x0"), None), ("greater", ("t0", "x0"), BOOL)])
    assert not cuda_fusion.cuda_compilable(ends_in_bool, [((N,), F32)])


def test_the_source_reads_as_one_loop_with_a_line_per_op():
    steps, specs = GROUPS["chain_math_float32"]
    src = cuda_fusion.cuda_source("k", steps, specs, sources=[f"lesson.py:{j}: y = ..." for j in range(len(steps))])
    assert 'extern "C" __global__ void k(const float* __restrict__ x0, const float* __restrict__ x1,' in src
    assert src.count("for (") == 1 and "x1[0]" in src and "x0[i]" in src
    assert "tanhf(t2)" in src and "expf(t3)" in src and "logf(t5)" in src and "FL_" not in src
    assert "// tanh: lesson.py:3: y = ..." in src
    head, loop = src.split("for (")
    assert "const float t0 = v1 * v1;" in head     # both arguments are one value: once, before the loop
    double = cuda_fusion.cuda_source("k", *GROUPS["chain_math_float64"])
    assert "double* __restrict__ out" in double and "tanh(t2)" in double and "float" not in double


@pytest.fixture(scope="module")
def traced_chain():
    """A traced 10-op chain and the CUDA sources of its plan."""
    @fl.function
    def chain(x, c):
        y = fl.tanh(x * c + 1.0)
        y = fl.sigmoid(y) * 2.0 - fl.exp(-y)
        return fl.maximum(fl.abs(y) - 0.5, 0.0) * c
    x = np.linspace(-3, 3, N, dtype=np.float32)
    result = chain(fl.constant(x), fl.constant(np.float32(0.75))).numpy()
    return chain, x, result, cuda_fusion.fused_cuda_sources(chain)


def test_a_traced_chain_has_one_generated_kernel(traced_chain):
    chain, x, result, sources = traced_chain
    assert len(sources) == 1 and "tanhf" in sources[0] and "test_fusion_cuda.py" in sources[0]
    plan = chain.get_concrete_function(fl.constant(x), fl.constant(np.float32(0.75)))._plan
    fused = [n for n in plan.nodes if "cupy" in n.op.kernels]
    assert len(fused) == 1 and fused[0].op.kernels["cupy"].source == sources[0]
    # no GPU here: the GPU kernel given numpy arrays runs the group's numpy kernel: the plan's result
    fed = dict(zip([t.node for t in plan.feeds], [x, np.float32(0.75)]))
    args = [fed.get(t.node, t.node.attrs.get("value")) for t in fused[0].inputs]
    launches, fallbacks = cuda_fusion.stats["launches"], cuda_fusion.stats["fallbacks"]
    np.testing.assert_allclose(fused[0].op.kernels["cupy"](*args), result, rtol=1e-5, atol=1e-6)  # CPU: C
    assert cuda_fusion.stats["launches"] == launches and cuda_fusion.stats["fallbacks"] == fallbacks + 1


def test_every_generated_kernel_compiles_in_one_nvrtc_call(traced_chain):
    if not nvrtc_available():
        pytest.skip("NVRTC is not installed (pip install nvidia-cuda-nvrtc)")
    sources = [cuda_fusion.cuda_source(name, steps, specs) for name, (steps, specs) in GROUPS.items()]
    report = compile_check("\n".join(sources + traced_chain[3]), "fused_chains.cu", options=cuda_fusion.OPTIONS)
    assert set(report.kernels) == set(GROUPS) | {"flowlab_fused0"}
    assert all(k.registers > 0 and k.shared_bytes == 0 and k.spill_stores == 0 for k in report.kernels.values())


@pytest.mark.parametrize("name", sorted(GROUPS))
def test_each_generated_kernel_in_the_simulator_equals_the_numpy_kernel(name):
    sim = pytest.importorskip("flowlab.gpu._sim", reason="the CUDA simulator (flowlab/gpu/_sim.py) is not there yet")
    steps, specs = GROUPS[name]
    xs = _inputs(specs)
    expected = elementwise_kernel(steps, specs)[0](*xs)
    out = np.full(N, np.nan, steps[-1][3])
    # 2 blocks of 32 threads for 100 elements: the grid-stride loop takes each thread round twice
    sim.simulate(cuda_fusion.cuda_source(name, steps, specs), name, 2, 32, [*xs, out, np.int64(N)])
    assert np.isfinite(expected).all() and np.ptp(expected) > 0
    tol = 1e-5 if steps[-1][3] == F32 else 1e-12
    np.testing.assert_allclose(out, expected, rtol=tol, atol=tol)


def test_a_chain_placed_on_a_logical_gpu_is_one_node_with_the_generated_kernel():
    fl.config.set_logical_devices("GPU", 1)
    try:
        @fl.function
        def chain(x):
            with fl.device("/gpu:0"):
                return fl.tanh(x * 3.0 + 1.0) * x
        x = np.linspace(-1, 1, 8, dtype=np.float32)
        result = chain(fl.constant(x))
        plan = chain.get_concrete_function(fl.constant(x))._plan
    finally:
        fl.config.set_logical_devices("GPU", None)
    fused = [n for n in plan.nodes if n.op.name.startswith("fused(")]
    assert len(fused) == 1 and isinstance(fused[0].op.kernels["cupy"], cuda_fusion.FusedCudaKernel)
    assert str(fused[0].device).endswith("GPU:0")
    np.testing.assert_array_equal(result.numpy(), np.tanh(x * np.float32(3) + np.float32(1)) * x)


def test_fused_cuda_sources_says_what_it_needs():
    @fl.function
    def never_called(x):
        return x * 2.0 + 1.0
    with pytest.raises(ValueError, match="not been traced"):
        cuda_fusion.fused_cuda_sources(never_called)
    with pytest.raises(TypeError, match="fl.function"):
        cuda_fusion.fused_cuda_sources(lambda x: x)


class _SimArray(np.ndarray):
    """A numpy array that says it is in GPU 0's memory, for ``_SimCupy``."""
    device = types.SimpleNamespace(id=0)


class _SimCupy:
    """CuPy as far as the launcher uses it, with RawKernel running flowlab's simulator: so the launch
    itself (arguments in the signature's order, the grid, the output) is checked without a GPU."""
    ndarray = _SimArray
    cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(getDevice=lambda: 0))
    launches: list = []

    @staticmethod
    def empty(shape, dtype):
        return np.full(shape, np.nan, dtype).view(_SimArray)

    class RawKernel:
        def __init__(self, source, name, options=()):
            self.source, self.name, self.options = source, name, options

        def __call__(self, grid, block, args):
            from flowlab.gpu._sim import simulate
            _SimCupy.launches.append((grid, block, self.options))
            simulate(self.source, self.name, grid, block, [a.view(np.ndarray) if isinstance(a, np.ndarray) else a
                                                           for a in args])


def test_the_launcher_passes_inputs_output_and_n_in_the_kernels_order(monkeypatch):
    pytest.importorskip("flowlab.gpu._sim", reason="the CUDA simulator (flowlab/gpu/_sim.py) is not there yet")
    monkeypatch.setattr(cuda_fusion, "_xp", [_SimCupy])
    monkeypatch.setattr(cuda_fusion, "_raw", {})
    monkeypatch.setattr(_SimCupy, "launches", [])
    steps, specs = GROUPS["chain_two_ops_float32"]
    numpy_kernel = elementwise_kernel(steps, specs)[0]
    kernel = cuda_fusion.gpu_kernel("chain_two_ops_float32", steps, specs, numpy_kernel)
    x, c = np.linspace(-1, 1, N, dtype=np.float32), np.asarray([0.5], np.float32)
    out = kernel(x.view(_SimArray), c.view(_SimArray))
    assert _SimCupy.launches == [((1,), (cuda_fusion.THREADS,), cuda_fusion.OPTIONS)]
    np.testing.assert_array_equal(out, numpy_kernel(x, c))       # * and + only: numpy's bits
    strided = np.linspace(-1, 1, 2 * N, dtype=np.float32)[::2]
    np.testing.assert_array_equal(kernel(strided.view(_SimArray), c.view(_SimArray)), numpy_kernel(strided, c))
    assert len(_SimCupy.launches) == 1                            # not contiguous: the numpy kernel ran
