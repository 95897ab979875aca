"""14 · A block sum in shared memory.

The answer is ``block_sum``: a string of CUDA C that defines
``__global__ void block_sum(const float* x, float* partial, int n)``. Launched with blocks of 256
threads, block b sums its slice ``x[256 b : 256 b + 256]`` (zeros past ``n``) with a tree in shared
memory and writes the total to ``partial[b]``.

Each case runs the kernel in flowlab's simulator (every thread on the CPU, ``__syncthreads()`` a real
barrier), on an ``x`` of multiples of 1/4 (so every order of adding gives the same float32 sum), and
reports what it did: the partial sums, how many times ``x`` was loaded from global memory and
``partial`` stored to, the races the simulator saw, and whether the block summed as a tree (at least
log2(256) = 8 barrier phases per block). An out-of-bounds access, a barrier that only some threads
reach or an endless loop stops the case with the simulator's message (thread, block, line).
"""
import functools

import numpy as np

from flowlab.grading import Case

POINTS = 3
THREADS = 256
TREE_STEPS = 8          # log2(THREADS): halvings from 256 values to 1
HINTS = [
    "first_try has three bugs, one per report of the simulator: a load past n (OutOfBoundsError), a "
    "__syncthreads() that only some threads reach (DivergentBarrierError), and 256 threads storing to one "
    "element of partial (a write-write race). Fix them one at a time and simulate again.",
    "A thread whose i is past n puts a zero in shared memory instead of reading x: "
    "s[t] = (i < n) ? x[i] : 0.0f;",
    "The barrier of each halving step goes after the if, at the end of the loop body, where every thread "
    "of the block reaches it; after the loop only thread 0 writes: if (t == 0) partial[blockIdx.x] = s[0];",
]
TOLERANCE = {"rtol": 0.0, "atol": 0.0}   # sums of multiples of 1/4 are exact in float32
TIME_LIMIT = 20.0


def data(n: int) -> np.ndarray:
    """The ``x`` of a case: ``n`` multiples of 1/4 between -4 and 4, fixed by ``n``."""
    return (np.random.default_rng(1400 + n).integers(-16, 17, n) / 4).astype(np.float32)


def _expected(n, grid, _args):
    x = np.zeros(grid * THREADS, np.float64)
    x[:n] = data(n)
    return {"compiles for a real GPU (NVRTC)": _COMPILES if _nvrtc() else _NOT_CHECKED,
            "races": "none",
            "a tree in shared memory": "holds",
            "global loads of x": n,
            "global stores to partial": grid,
            "partial sums": x.reshape(grid, THREADS).sum(axis=1).tolist()}


def _case(name, n, grid=None):
    grid = grid or -(-n // THREADS)
    return Case(name, kwargs={"n": n, "grid": grid}, expected=functools.partial(_expected, n, grid))


def cases():
    yield _case("n = 1024: four full blocks", 1024)
    yield _case("n = 1000: the last block is part full (zeros past n)", 1000)
    yield _case("n = 100: less than one block", 100)
    yield _case("n = 1", 1)


### BEGIN HIDDEN TESTS
def hidden_cases():
    yield _case("n = 257: one element in the second block", 257)
    yield _case("n = 3000", 3000)
    yield _case("n = 255", 255)
    yield _case("n = 300 on 3 blocks: the third block is all past n", 300, grid=3)
### END HIDDEN TESTS


def _kernel(answer):
    """The answer's block_sum and its parameter names, or a TypeError that says what is wrong."""
    from flowlab.gpu import Kernel
    if not isinstance(answer, str):
        raise TypeError(f"block_sum must be a string of CUDA C (the kernel's source), not {type(answer).__name__}")
    kernel = Kernel(answer, "block_sum")
    kinds = [(ctype, pointer) for _, ctype, pointer in kernel.params]
    if kinds != [("float", True), ("float", True), ("int", False)]:
        got = ", ".join(f"{t}{'*' if p else ''} {name}" for name, t, p in kernel.params)
        raise TypeError(f"block_sum must take (const float* x, float* partial, int n), not ({got})")
    return kernel


def _tree(report, grid):
    phases = report.barriers / grid
    if phases >= TREE_STEPS and sum(report.shared_loads.values()):
        return "holds"
    return (f"does not hold: {phases:g} barrier phase(s) per block; a tree over {THREADS} values in shared "
            f"memory halves them {TREE_STEPS} times, each step ending at a __syncthreads()")


def _race_text(race, lines):
    (_, t1, l1), (_, t2, l2) = race.first, race.second
    said = lambda t, line: f"threadIdx.x={t[0]} at line {line} ({lines[line - 1].strip() if line else '?'})"
    return f"{race.kind} race on {race.array}[{race.index}]: {said(t1, l1)} and {said(t2, l2)}, between the same barriers"


_COMPILES = "yes"
_NOT_CHECKED = "not checked here (no NVRTC: pip install nvidia-cuda-nvrtc)"


def _nvrtc():
    from flowlab.gpu import nvrtc_available
    return nvrtc_available()


@functools.lru_cache(maxsize=8)
def _compiles(source):
    """What NVRTC, NVIDIA's compiler, says of the source: the simulator reads a C subset, and a
    kernel must also build for a real GPU (CuPy finds it by its extern "C" name)."""
    from flowlab.gpu import CudaCompileError, compile_check
    if not _nvrtc():
        return _NOT_CHECKED
    try:
        report = compile_check(source, "block_sum.cu")
    except CudaCompileError as e:
        return f"no: {e.log.strip()}"
    if "block_sum" not in report.kernels:
        return 'no: no kernel named block_sum in the compiled code (declare it extern "C" __global__ void block_sum)'
    return _COMPILES


def run(answer, case):
    kernel = _kernel(answer)
    n, grid = case.kwargs["n"], case.kwargs["grid"]
    x = data(n)
    x.flags.writeable = False                     # const float*: a store into x fails here
    partial = np.full(grid, np.nan, np.float32)   # a block that never stores its total shows nan
    report = kernel.simulate((grid,), (THREADS,), [x, partial, n])
    x_name, partial_name, _ = (p[0] for p in kernel.params)
    # the causes first: a failed case names the first entry that differs, and a race explains wrong sums
    return {"compiles for a real GPU (NVRTC)": _compiles(answer),
            "races": "; ".join(_race_text(r, report.source_lines) for r in report.races) or "none",
            "a tree in shared memory": _tree(report, grid),
            "global loads of x": report.global_loads[x_name],
            "global stores to partial": report.global_stores[partial_name],
            "partial sums": [float(v) for v in partial]}
