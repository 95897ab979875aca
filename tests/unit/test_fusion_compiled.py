"""Compiled elementwise fusion (flowlab/core/passes/_cfusion.py, _ccompile.py).

The reference for an arithmetic, comparison or logical op is the group's numpy kernel: the compiled
one must give the same bits, NaN, inf, -0 and subnormals included, in float32 and float64. For exp,
log, tanh and sigmoid the reference is float64 numpy rounded to float32, within ``ULP_BOUND``.
Compiled kernels are called with a numpy fallback that fails the test, so a pass cannot come from
numpy quietly running instead. Every test uses a cache folder of its own module (``cache``).
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import flowlab as fl
from flowlab.core.execute import get_op, list_ops
from flowlab.core.executor import compile_plan
from flowlab.core.passes import _ccompile, _cfusion
from flowlab.core.passes.fusion import elementwise_kernel

pytestmark = pytest.mark.skipif(_ccompile.compiler() is None,
                                reason="no C compiler ($CC, gcc or cc): compiled fusion falls back to numpy here")

F32, F64 = np.dtype(np.float32), np.dtype(np.float64)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# the ops with a C expression (OpDef.c_expr), by kind: float32 functions of the prelude, ops that
# may give a bool, and the rest
C_OPS = [get_op(name) for name in list_ops() if get_op(name).c_expr is not None]
TRANSCENDENTAL = sorted(op.name for op in C_OPS if op.c_block)
BOOL_OPS = sorted(op.name for op in C_OPS if op.c_bool)
ARITHMETIC = sorted(op.name for op in C_OPS if not op.c_block and not op.c_bool)
UNARY = {"negative", "abs", "square", "sqrt", "relu", "sign", "logical_not", "exp", "log", "tanh", "sigmoid"}
REFERENCE = {"exp": np.exp, "log": np.log, "tanh": np.tanh, "sigmoid": lambda x: 1 / (1 + np.exp(-x))}


@pytest.fixture(autouse=True, scope="module")
def cache(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("flowlab-cache"))
    before, old = _ccompile.enabled(), os.environ.get("FLOWLAB_CACHE_DIR")
    os.environ["FLOWLAB_CACHE_DIR"] = folder
    _ccompile.set_enabled(True)
    yield folder
    _ccompile.set_enabled(before)
    if old is None:
        del os.environ["FLOWLAB_CACHE_DIR"]
    else:
        os.environ["FLOWLAB_CACHE_DIR"] = old


def compiled(steps, specs, monkeypatch):
    """The compiled kernel of one group, whose numpy fallback fails the test if it runs."""
    monkeypatch.setattr(_cfusion, "MIN_OPS", 1)
    wrap, = _cfusion.compile_groups([(steps, specs)])
    assert wrap is not None, "the group did not compile"
    return _refusing(wrap, steps)


def unary_or_binary(name, dtype, one=False):
    """The one-op group of ``name`` (the second operand a one-element value if ``one``)."""
    if name in UNARY:
        return [(name, ("x0",), (None,), dtype)], [((None,), dtype)]
    return [(name, ("x0", "x1"), (None,), dtype)], [((None,), dtype), (((), dtype) if one else ((None,), dtype))]


def with_bool(name, dtype):
    """``name`` (a comparison or logical op) and two steps that use its bool result as a float."""
    args = ("x0",) if name in UNARY else ("x0", "x1")
    steps = [(name, args, (None,), np.dtype(bool)), ("multiply", ("t0", "x2"), (None,), dtype),
             ("add", ("t1", "t0"), (None,), dtype)]
    return steps, [((None,), dtype)] * 3


@pytest.fixture(scope="module")
def single(cache):
    """Every one-op group these tests use, compiled in one C file (one compiler run, not 80)."""
    groups = {}
    for dtype in (F32, F64):
        for name in ARITHMETIC:
            groups[name, dtype, False] = unary_or_binary(name, dtype)
            if name not in UNARY:
                groups[name, dtype, True] = unary_or_binary(name, dtype, one=True)
        for name in BOOL_OPS:
            groups[name, dtype, False] = with_bool(name, dtype)
    for name in TRANSCENDENTAL:
        groups[name, F32, False] = unary_or_binary(name, F32)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_cfusion, "MIN_OPS", 1)
        wraps = _cfusion.compile_groups(list(groups.values()))
    assert None not in wraps
    return {key: (steps, specs, _refusing(wrap, steps)) for (key, (steps, specs)), wrap in zip(groups.items(), wraps)}


def _refusing(wrap, steps):
    def refuse(*xs):
        raise AssertionError("the numpy fallback ran instead of the compiled kernel")
    refuse.steps, refuse.source = steps, ""
    return wrap(refuse)


def numpy_kernel(steps, specs):
    return elementwise_kernel(steps, specs)[0]


def special(dtype):
    info = np.finfo(dtype)
    return np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1.0, -1.0, 0.5, -2.0, 3.0, info.max,
                     -info.max, info.tiny, -info.tiny, info.smallest_subnormal, -info.smallest_subnormal,
                     1e-30, -7.5], dtype)


def operands(dtype, seed=0):
    """Two arrays of 4001 elements (not a multiple of any vector or block): every pair of special
    values, then random values of many magnitudes, some equal in both."""
    rng = np.random.default_rng(seed)
    s = special(dtype)
    a, b = np.repeat(s, len(s)), np.tile(s, len(s))
    n = 4001 - len(a)
    ra = (rng.standard_normal(n) * 10.0 ** rng.integers(-30, 30, n)).astype(dtype)
    rb = np.where(rng.random(n) < 0.2, ra, rng.standard_normal(n) * 10.0 ** rng.integers(-30, 30, n)).astype(dtype)
    return np.concatenate([a, ra]), np.concatenate([b, rb])


def same_bits(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape
    bits = np.uint32 if got.dtype == F32 else np.uint64
    bad = got.view(bits) != want.view(bits)
    assert not bad.any(), f"{bad.sum()} differ, e.g. got {got[bad][:4]} want {want[bad][:4]}"


def ulps(got, want):
    """float32 ULPs between ``got`` and ``want`` (a float64 reference, rounded here)."""
    def ordered(v):
        i = v.view(np.int32).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFF), i)
    with np.errstate(over="ignore"):   # beyond float32's range: inf, as it should
        return np.abs(ordered(got) - ordered(want.astype(np.float32)))


# -- which groups compile -------------------------------------------------------------------------
def test_which_groups_compile():
    full, one = ((None, 4), F32), ((), F32)
    chain = [("add", ("x0", "x1"), (None, 4), F32)] + [("tanh", (f"t{j}",), (None, 4), F32) for j in range(7)]
    assert _cfusion.compilable(chain, [full, one])
    assert not _cfusion.compilable(chain[:-1], [full, one])                   # fewer than MIN_OPS ops
    assert not _cfusion.compilable(chain, [full, ((), F64)])                  # mixed dtypes
    assert not _cfusion.compilable([(n, a, s, F64) for n, a, s, _ in chain], [((None, 4), F64)] * 2)  # f64 tanh
    assert not _cfusion.compilable(chain, [full, ((None, 1), F32)])           # a broadcast that is not a scalar
    assert not _cfusion.compilable(chain, [one, one])                         # nothing full size
    pow_chain = [("pow", ("x0", "x1"), (None, 4), F32)] + chain[1:]
    assert not _cfusion.compilable(pow_chain, [full, one])                    # an op left to numpy
    ints = [(n, a, s, np.dtype(np.int32)) for n, a, s, _ in chain]
    assert not _cfusion.compilable(ints, [((None, 4), np.dtype(np.int32))] * 2)


# -- arithmetic, comparisons, logical ops: the same bits as numpy -----------------------------------
@pytest.mark.parametrize("dtype", [F32, F64], ids=["float32", "float64"])
@pytest.mark.parametrize("name", ARITHMETIC)
def test_arithmetic_ops_give_numpys_bits(name, dtype, single):
    a, b = operands(dtype)
    steps, specs, kernel = single[name, dtype, False]
    args = (a, b)[:len(specs)]
    with np.errstate(all="ignore"):
        same_bits(kernel(*args), numpy_kernel(steps, specs)(*args))
    if len(specs) == 2:   # the second operand a one-element broadcast, for every special value
        steps, specs, kernel = single[name, dtype, True]
        for value in special(dtype):
            one = np.array(value, dtype)
            with np.errstate(all="ignore"):
                same_bits(kernel(a, one), numpy_kernel(steps, specs)(a, one))


@pytest.mark.parametrize("dtype", [F32, F64], ids=["float32", "float64"])
@pytest.mark.parametrize("name", BOOL_OPS)
def test_comparisons_and_logical_ops_give_numpys_bits(name, dtype, single):
    """A bool result is held as 0.0 or 1.0 inside; it meets a float in the next step (as in relu's
    gradient), which is what numpy does with it too."""
    a, b = operands(dtype, seed=1)
    steps, specs, kernel = single[name, dtype, False]
    c = np.random.default_rng(2).standard_normal(a.size).astype(dtype)
    with np.errstate(all="ignore"):
        same_bits(kernel(a, b, c), numpy_kernel(steps, specs)(a, b, c))


def test_relu_grad_and_mixed_chains_give_numpys_bits(monkeypatch):
    a, b = operands(F32, seed=3)
    steps = [("relu_grad", ("x0", "x1"), (None,), F32), ("maximum", ("t0", "x1"), (None,), F32),
             ("minimum", ("x2", "t1"), (None,), F32), ("divide", ("t2", "x0"), (None,), F32),
             ("sign", ("t3",), (None,), F32), ("subtract", ("t4", "t2"), (None,), F32),
             ("relu", ("t5",), (None,), F32), ("sqrt", ("t6",), (None,), F32)]
    specs = [((None,), F32), ((None,), F32), ((), F32)]
    two = np.array(2.0, F32)
    with np.errstate(all="ignore"):
        same_bits(compiled(steps, specs, monkeypatch)(a, b, two), numpy_kernel(steps, specs)(a, b, two))


@pytest.mark.parametrize("seed", range(4))
def test_random_dags_give_numpys_bits(seed, monkeypatch):
    """Random groups of 10 to 40 arithmetic, comparison and logical ops, each reading earlier
    values or inputs (values live across many segments, buffers are reused)."""
    rng = np.random.default_rng(seed)
    names = [n for n in ARITHMETIC if n != "sqrt"] + BOOL_OPS
    specs = [((None, 3), F32), ((None, 3), F32), ((), F32)]
    steps, values, bools = [], ["x0", "x1", "x2"], set()
    for j in range(int(rng.integers(10, 40))):
        name = str(rng.choice(names))
        args = [str(rng.choice(values[-6:] if rng.random() < 0.8 else values))
                for _ in range(1 if name in UNARY else 2)]
        if name not in BOOL_OPS and (args[0] in bools and (len(args) == 1 or name == "relu_grad")
                                              or all(a in bools for a in args)):
            args[0] = "x0"   # arithmetic on bools alone is numpy's bool arithmetic: not compiled
        steps.append((name, tuple(args), (None, 3), np.dtype(bool) if name in BOOL_OPS else F32))
        values.append(f"t{j}")
        if name in BOOL_OPS:
            bools.add(f"t{j}")
    steps.append(("add", (values[-1], "x2"), (None, 3), F32))
    assert _cfusion.compilable(steps, specs)
    x0, x1 = (np.random.default_rng(seed + 10).standard_normal((50, 3)).astype(F32) for _ in range(2))
    x0[::7] = 0.0
    x2 = np.array(0.25, F32)
    with np.errstate(all="ignore"):
        same_bits(compiled(steps, specs, monkeypatch)(x0, x1, x2), numpy_kernel(steps, specs)(x0, x1, x2))


# -- exp, log, tanh, sigmoid: within the stated ULPs -----------------------------------------------
@pytest.mark.parametrize("name", TRANSCENDENTAL)
def test_transcendental_ops_are_within_their_ulp_bound(name, single):
    """Over 4 million float32 values: random bit patterns (the whole range: subnormals, huge values,
    inf, NaN), a dense grid where the function bends, and the special values."""
    rng = np.random.default_rng(11)
    x = np.concatenate([rng.integers(0, 2 ** 32, 3_000_000, dtype=np.uint64).astype(np.uint32).view(np.float32),
                        np.linspace(-20, 20, 1_000_001, dtype=np.float32), special(F32)])
    kernel = single[name, F32, False][2]
    got = kernel(x)
    with np.errstate(all="ignore"):
        want = REFERENCE[name](x.astype(np.float64))
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan), x[np.isnan(got) != nan][:5]
    worst = ulps(got[~nan], want[~nan])
    assert worst.max() <= _cfusion.ULP_BOUND[get_op(name).c_block], (name, x[~nan][worst.argmax()], worst.max())
    signed = np.array([0.0, -0.0], np.float32)   # odd functions keep the sign of zero
    if name == "tanh":
        same_bits(kernel(signed), np.tanh(signed))


def test_transcendental_results_are_deterministic(single):
    """The vector loop and its scalar remainder give the same bits: a value's result does not
    depend on where in the array it sits, nor on the array's length."""
    x = np.random.default_rng(5).uniform(-10, 10, 1000).astype(np.float32)
    for name in TRANSCENDENTAL:
        k = single[name, F32, False][2]
        whole = k(x)
        for n in (1, 3, 7, 9, 255, 257):
            same_bits(k(x[:n].copy()), whole[:n])
            same_bits(k(x[-n:].copy()), whole[-n:])


# -- in graphs ----------------------------------------------------------------------------------
def chain(x, c, n=12):
    """x + c, x * 0.75, tanh(x), exp(-x^2) + x, ... n of them (what a long activation looks like)."""
    ops = [lambda v: v + c, lambda v: v * 0.75, fl.tanh, lambda v: fl.exp(-fl.square(v)) + v]
    for i in range(n):
        x = ops[i % len(ops)](x)
    return x


def plan_of(build, *specs):
    g = fl.Graph("test")
    with g.as_default():
        xs = [g.placeholder(dtype, shape) for shape, dtype in specs]
        out = build(*xs)
    return compile_plan(g, [out], xs), compile_plan(g, [out], xs, passes=())


def is_compiled(plan):
    return [n.op.name for n in plan.nodes if getattr(n.op.kernel, "compiled", False)]


def test_an_arithmetic_chain_in_a_graph_gives_eagers_bits_and_unknown_shapes_work():
    def build(x, c):
        for _ in range(5):
            x = fl.maximum(x * c + 0.5, -x) / 3.0 - fl.abs(x)
        return fl.sqrt(fl.square(x) + 1.0)
    plan, plain = plan_of(build, ([None, 7], F32), ([], F32))
    assert is_compiled(plan) and len(plan.nodes) < len(plain.nodes)
    c = np.array(1.25, F32)
    for rows in (0, 1, 3, 40, 1000):
        x = np.random.default_rng(rows).standard_normal((rows, 7)).astype(F32)
        same_bits(plan(x, c)[0], plain(x, c)[0])


def test_inputs_in_another_layout_are_copied_so_the_bits_never_depend_on_it(monkeypatch):
    """A transposed view, a broadcast along an unknown dimension: the compiled kernel still runs
    (the numpy fallback refuses), on a contiguous copy, and gives the bits it gives that copy."""
    steps = [("add", ("x0", "x1"), (None, None), F32), ("multiply", ("t0", "x2"), (None, None), F32),
             ("tanh", ("t1",), (None, None), F32), ("subtract", ("t2", "x1"), (None, None), F32)]
    specs = [((None, None), F32), ((None, None), F32), ((), F32)]
    k = compiled(steps, specs, monkeypatch)
    a = np.random.default_rng(1).standard_normal((6, 5)).astype(F32)
    half = np.array(0.5, F32)
    for x, y in ((a.T, a.T.copy()), (a, a[:, :1]), (a[:1], a), (a[::2], a[1::2])):
        want = k(np.ascontiguousarray(np.broadcast_to(x, np.broadcast_shapes(x.shape, y.shape))),
                 np.ascontiguousarray(np.broadcast_to(y, np.broadcast_shapes(x.shape, y.shape))), half)
        same_bits(k(x, y, half), want)
    with pytest.raises(AssertionError, match="fallback"):     # another dtype: the numpy kernel
        k(a.astype(np.float64), a, half)


def test_an_arithmetic_graph_fed_other_layouts_gives_numpys_bits():
    def build(x, y):
        for _ in range(4):
            x = (x + y) * 0.5 - y
        return x
    plan, plain = plan_of(build, ([None, None], F32), ([None, None], F32))
    assert is_compiled(plan)
    a = np.random.default_rng(1).standard_normal((6, 6)).astype(F32)
    for x, y in ((a.T, a), (a, a[:, :1]), (a[:1], a), (a, a.T.copy())):
        same_bits(plan(x, y)[0], plain(x, y)[0])


def test_a_function_with_gradients_equals_eager_within_the_bound():
    rng = np.random.default_rng(3)
    w = fl.Variable(rng.standard_normal((5, 4)).astype(F32))
    x = fl.constant(rng.standard_normal((8, 5)).astype(F32))
    c = fl.constant(np.float32(0.3))

    def step(x):
        with fl.GradientTape() as tape:
            loss = fl.reduce_sum(chain(fl.matmul(x, w), c, n=16))
        return loss, tape.gradient(loss, w)

    traced = fl.function(step)
    got_loss, got_grad = traced(x)
    want_loss, want_grad = step(x)
    plan = traced.get_concrete_function(x)._plan
    assert is_compiled(plan), [n.op.name for n in plan.nodes]
    np.testing.assert_allclose(got_loss.numpy(), want_loss.numpy(), rtol=1e-5)
    np.testing.assert_allclose(got_grad.numpy(), want_grad.numpy(), rtol=1e-4, atol=1e-5)


def test_the_switch(monkeypatch):
    def build(x):
        return chain(x, 0.5, n=12)
    fl.config.set_compiled_fusion(False)
    try:
        assert fl.config.compiled_fusion_info()["enabled"] is False
        off, _ = plan_of(build, ([None], F32))
    finally:
        fl.config.set_compiled_fusion(True)
    on, _ = plan_of(build, ([None], F32))
    assert not is_compiled(off) and is_compiled(on)
    assert on.nodes[-1].op.name == off.nodes[-1].op.name          # the same name, either way
    info = fl.config.compiled_fusion_info()
    assert info["enabled"] and info["available"] and info["cache_dir"].startswith(os.environ["FLOWLAB_CACHE_DIR"])
    assert "-ffp-contract=off" in info["flags"] and "-ffast-math" not in info["flags"]
    env = dict(os.environ, FLOWLAB_COMPILED_FUSION="0")
    code = "import flowlab as fl; print(fl.config.compiled_fusion_info()['enabled'])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, cwd=ROOT)
    assert out.stdout.strip() == "False", out.stderr


def test_a_failing_compiler_warns_once_and_numpy_runs(tmp_path, monkeypatch):
    fake = tmp_path / "cc"
    fake.write_text("#!/bin/sh\nif [ \"$1\" = --version ]; then echo fakecc 1.0; exit 0; fi\necho boom >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CC", str(fake))
    monkeypatch.setenv("FLOWLAB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setitem(_ccompile._state, "compiler", None)
    monkeypatch.setitem(_ccompile._state, "warned", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan, plain = plan_of(lambda x: chain(x, 0.5, n=12), ([None], F32))
        plan2, _ = plan_of(lambda x: chain(x, 0.25, n=12), ([None], F32))
    assert [str(w.message) for w in caught if "compiled fusion" in str(w.message)][0].count("boom") == 1
    assert len([w for w in caught if "compiled fusion" in str(w.message)]) == 1
    assert not is_compiled(plan) and not is_compiled(plan2)
    x = np.linspace(-3, 3, 50, dtype=F32)
    same_bits(plan(x)[0], plain(x)[0])


CHILD = textwrap.dedent("""
    import hashlib, sys, numpy as np, flowlab as fl
    from flowlab.core.passes import _ccompile
    mode, path = sys.argv[1], sys.argv[2]
    rng = np.random.default_rng(0)
    w = fl.Variable(rng.standard_normal((6, 6)).astype(np.float32))
    x = fl.constant(rng.standard_normal((16, 6)).astype(np.float32))

    @fl.function
    def train_step(x):
        with fl.GradientTape() as tape:
            h = fl.matmul(x, w)
            for _ in range(4):
                h = fl.tanh(h * 0.9 + 0.1) + fl.exp(-fl.square(h)) * 0.5
            loss = fl.reduce_mean(fl.square(h))
        w.assign_sub(0.1 * tape.gradient(loss, w))
        return loss

    if mode == "resume":
        w.assign(np.load(path))
    for step in range(3 if mode == "resume" else 6):
        train_step(x)
        if mode == "full" and step == 2:
            np.save(path, w.numpy())
    print(hashlib.sha256(w.numpy().tobytes()).hexdigest(), _ccompile.stats["compiled"], _ccompile.stats["loaded"])
""")


def test_training_resumed_in_a_new_process_is_bit_identical_whatever_the_cache_held(tmp_path):
    """Process 1 trains 6 steps (compiling; checkpoint after 3). Process 2 resumes from the
    checkpoint with the same cache (loads the library, compiles nothing); process 3 with an empty
    cache (compiles again). All end with the same bits."""
    ckpt = str(tmp_path / "w.npy")

    def run(mode, cache):
        env = dict(os.environ, FLOWLAB_CACHE_DIR=str(tmp_path / cache), FLOWLAB_COMPILED_FUSION="1")
        out = subprocess.run([sys.executable, "-c", CHILD, mode, ckpt], capture_output=True, text=True,
                             env=env, timeout=300, cwd=ROOT)
        assert out.returncode == 0, out.stderr[-2000:]
        digest, made, loaded = out.stdout.split()
        return digest, int(made), int(loaded)

    full = run("full", "a")
    warm = run("resume", "a")
    cold = run("resume", "b")
    assert full[1] >= 1 and full[2] == 0
    assert warm[1] == 0 and warm[2] >= 1          # the second process loaded, without compiling
    assert cold[1] >= 1
    assert full[0] == warm[0] == cold[0]
    assert os.listdir(tmp_path / "a") and not [f for f in os.listdir(tmp_path / "a") if f.startswith(".")]


def test_one_compiler_run_per_plan_and_none_for_a_plan_seen_before():
    g = fl.Graph("two chains")
    with g.as_default():
        x = g.placeholder(fl.float32, [None])
        a, b = chain(x, 0.125, n=9), chain(x * 3.0, 0.375, n=9)   # two groups: a and b are both fetched
    before = dict(_ccompile.stats)
    plan = compile_plan(g, [a, b], [x])
    assert len(is_compiled(plan)) == 2
    assert _ccompile.stats["compiled"] - before["compiled"] + _ccompile.stats["loaded"] - before["loaded"] == 1
    again = dict(_ccompile.stats)
    compile_plan(g, [a, b], [x])
    assert _ccompile.stats["compiled"] == again["compiled"] and _ccompile.stats["loaded"] == again["loaded"] + 1
