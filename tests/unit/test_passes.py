"""Graph passes (flowlab/core/passes): each pass alone on small graphs, then the whole pipeline.

The reference for an optimized plan is the same plan compiled with ``passes=()``: the same
values (bit for bit: the passes run the same kernels, or ufuncs that compute exactly what they
compute), the same side effects in the same order, and no array that anyone else can see
written into. Node counts prove that a pass did something.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import flowlab as fl
from flowlab.core.device import DeviceSpec
from flowlab.core.execute import get_op, list_ops
from flowlab.core.executor import compile_plan
from flowlab.core.passes import (DEFAULT_PASSES, eliminate_common_subexpressions, fold_constants,
                                 fuse_elementwise, optimize, prune_dead_nodes, reuse_buffers)
from flowlab.core.passes._rewrite import on_local_cpu

F32 = np.float32
_rng = np.random.default_rng(7)


@pytest.fixture(autouse=True, scope="module")
def _numpy_fusion_kernels():
    """These tests hold the passes to the numpy kernels, bit for bit: compiled fusion (whose
    tanh/exp/log may differ by an ULP or two) is off here and tested in test_fusion_compiled.py."""
    before = fl.config.compiled_fusion_info()["enabled"]
    fl.config.set_compiled_fusion(False)
    yield
    fl.config.set_compiled_fusion(before)


def rand(*shape, low=-1.0, high=1.0):
    return _rng.uniform(low, high, shape).astype(F32)


def ops(plan):
    return [n.op.name for n in plan.nodes]


def graph_of(build, *specs):
    """A graph made by ``build(*placeholders)``: (graph, fetches, placeholders)."""
    g = fl.Graph("test")
    with g.as_default():
        xs = [g.placeholder(dtype, shape) for shape, dtype in specs]
        out = build(*xs)
    return g, list(out) if isinstance(out, (list, tuple)) else [out], xs


def both(build, *arrays, passes=DEFAULT_PASSES):
    """Compile ``build`` on placeholders shaped like ``arrays`` with and without ``passes``; run both.
    Returns (optimized plan, plain plan, optimized results, plain results)."""
    g, fetches, xs = graph_of(build, *[(a.shape, a.dtype) for a in arrays])
    plain = compile_plan(g, fetches, xs, passes=())
    plan = compile_plan(g, fetches, xs, passes=passes)
    return plan, plain, plan(*arrays), plain(*arrays)


def assert_same(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        a, b = np.asarray(a), np.asarray(b)
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)


def snapshot(graph):
    """Everything a pass must leave alone in the user's graph."""
    return [(id(n), n.op, [id(t) for t in n.inputs], dict(n.attrs), id(n.output), n.output.node is n)
            for n in graph.nodes]


# -- constant folding ---------------------------------------------------------------------------
def test_folding_computes_constant_only_nodes_once():
    x = rand(3)
    plan, plain, got, want = both(lambda x: x * (fl.constant(2.0) * 3.0), x, passes=(fold_constants,))
    assert ops(plain) == ["const", "const", "multiply", "multiply"]
    assert ops(plan) == ["const", "const", "const", "multiply"]
    assert plan.nodes[2].attrs["value"] == 6.0
    assert_same(got, want)


def test_folding_leaves_a_chain_on_a_placeholder_alone():
    # x * 2 * 3 is (x * 2) * 3: neither multiply has only constant inputs
    plan, plain, got, want = both(lambda x: x * 2.0 * 3.0, rand(3), passes=(fold_constants,))
    assert ops(plan) == ops(plain)
    assert_same(got, want)


def test_folding_cascades_and_with_pruning_drops_the_inputs():
    def build(x):
        c = fl.constant([1.0, 2.0, 3.0])
        k = fl.ones_like(c) * 2.0 + fl.square(c)        # all constant
        return x * k + fl.ones_like(x)                  # ones_like(x): x is not a constant
    plan, plain, got, want = both(build, rand(3), passes=(fold_constants, prune_dead_nodes))
    assert len(plain.nodes) == 9
    assert ops(plan) == ["const", "multiply", "ones_like", "add"]   # k = ones_like(c) * 2 + c**2, computed once
    assert_same(got, want)


def test_a_fed_constant_is_an_input_not_a_constant():
    g = fl.Graph()
    with g.as_default():
        c = g.constant(np.float32(2.0))
        y = c * 3.0
    plan = compile_plan(g, [y], [c])
    assert "multiply" in ops(plan)
    assert plan(np.float32(5.0))[0] == 15.0


def test_folding_leaves_failures_and_non_finite_results_to_run_time():
    g, fetches, _ = graph_of(lambda: [fl.log(fl.constant([0.0, 1.0])), fl.gather(fl.constant([1.0, 2.0]), [5])])
    plan = compile_plan(g, fetches[:1], (), passes=(fold_constants,))
    assert ops(plan)[-1] == "log"                       # -inf: numerics checks must still see the op
    with pytest.raises(fl.errors.InvalidArgumentError, match="gather"):
        compile_plan(g, fetches[1:], (), passes=DEFAULT_PASSES)()


def test_folding_does_not_make_a_large_array_from_a_small_one():
    g, fetches, _ = graph_of(lambda: fl.broadcast_to(fl.constant(1.0), [1024, 512]))
    assert ops(compile_plan(g, fetches, (), passes=(fold_constants,)))[-1] == "broadcast_to"


def test_stateful_nodes_are_never_folded():
    v = fl.Variable(3.0)
    g, fetches, _ = graph_of(lambda: [v.read_value() * 2.0, fl.random.normal([2])])
    plan = compile_plan(g, fetches, ())
    assert {"read", "random", "multiply"} <= set(ops(plan))


# -- common subexpressions ---------------------------------------------------------------------
def test_cse_merges_equal_nodes_and_their_constants():
    def build(x):
        a = x * 2.0
        b = x * 2.0                                     # a second multiply, and a second const 2.0
        return (a + b), fl.reduce_sum(a, axis=0), fl.reduce_sum(b, axis=0)
    plan, plain, got, want = both(build, rand(3, 2), passes=(eliminate_common_subexpressions,))
    assert ops(plain).count("multiply") == 2 and ops(plan).count("multiply") == 1
    assert ops(plain).count("reduce_sum") == 2 and ops(plan).count("reduce_sum") == 1
    assert ops(plan).count("const") == 1
    assert plan.outputs[1] is plan.outputs[2]           # both fetches map to the survivor
    assert_same(got, want)


@pytest.mark.parametrize("first, second, merged", [
    (lambda x: fl.reduce_sum(x, axis=0), lambda x: fl.reduce_sum(x, axis=1), False),
    (lambda x: fl.reduce_sum(x, axis=0), lambda x: fl.reduce_sum(x, axis=0, keepdims=True), False),
    (lambda x: x[1:3], lambda x: x[1:3], True),                              # slices: unhashable before 3.12
    (lambda x: x[1:3], lambda x: x[1:4], False),
    (lambda x: fl.gather(x, [0, 2]), lambda x: fl.gather(x, [0, 2]), True),  # equal index constants
    (lambda x: x[np.array([0, 2])], lambda x: x[np.array([0, 2])], True),   # arrays in attrs: by value
    (lambda x: x[np.array([0, 2])], lambda x: x[np.array([0, 3])], False),
    (lambda x: x + 0.0, lambda x: x + -0.0, False),                         # -0.0 is not 0.0
    (lambda x: fl.cast(x, fl.int32), lambda x: fl.cast(x, fl.int64), False),
])
def test_cse_compares_attributes_by_value_carefully(first, second, merged):
    x = rand(4, 4)
    plan, plain, got, want = both(lambda x: [first(x), second(x)], x, passes=(eliminate_common_subexpressions,))
    assert (len(plan.nodes) < len(plain.nodes)) == merged
    assert_same(got, want)


def test_cse_never_merges_stateful_nodes():
    v = fl.Variable([1.0, 2.0])

    def build():
        a = v.read_value() * 1.0
        v.assign_add([1.0, 1.0])
        b = v.read_value() * 1.0                        # the same expression, a different value
        return a, b, fl.random.normal([3]), fl.random.normal([3])
    g, fetches, _ = graph_of(build)
    plan = compile_plan(g, fetches, (), passes=(eliminate_common_subexpressions,))
    assert ops(plan).count("read") == 2 and ops(plan).count("random") == 2 and ops(plan).count("multiply") == 2
    a, b, r1, r2 = plan()
    assert a.tolist() == [1.0, 2.0] and b.tolist() == [2.0, 3.0] and not np.array_equal(r1, r2)


# -- dead-node pruning ------------------------------------------------------------------------
def test_pruning_drops_dead_nodes_but_keeps_stateful_ones():
    v = fl.Variable(0.0)

    def build(x):
        y = x + 1.0
        dead = fl.exp(x) * 3.0
        v.assign_add(1.0)                               # nothing reads it: kept all the same
        return y, dead
    g, (y, dead), xs = graph_of(build, ((2,), F32))
    plain = compile_plan(g, [y, dead], xs, passes=())
    nodes, fetches = prune_dead_nodes(plain.nodes, [y], xs)
    assert [n.op.name for n in nodes] == ["const", "add", "const", "assign"]
    assert fetches == [y]


def test_pruning_removes_what_folding_and_merging_left_unused():
    def build(x):
        return x * (fl.constant(2.0) * 3.0) + x * (fl.constant(2.0) * 3.0)
    plan, plain, got, want = both(build, rand(3), passes=(fold_constants, eliminate_common_subexpressions))
    pruned, _, _, _ = both(build, rand(3), passes=(fold_constants, eliminate_common_subexpressions,
                                                   prune_dead_nodes))
    # plain: 2.0, 3.0, 2*3, x*6, twice, and add; then the two 6s, 2.0s, 3.0s and x*6s are merged
    assert len(plain.nodes) == 9 and len(plan.nodes) == 5 and ops(pruned) == ["const", "multiply", "add"]
    assert_same(got, want)


# -- elementwise fusion -----------------------------------------------------------------------
def test_a_chain_becomes_one_fused_node_that_works_in_place():
    x, c, d = rand(4, 5), rand(4, 5), rand(5)
    plan, plain, got, want = both(lambda x, c, d: fl.tanh((x + c) * d), x, c, d, passes=(fuse_elementwise,))
    assert ops(plain) == ["add", "multiply", "tanh"]
    assert ops(plan) == ["fused(add,multiply,tanh)"]
    fused = plan.nodes[0]
    assert fused.name == "fused(add,multiply,tanh)" and fused.op.grad is None
    assert "out=t0" in fused.op.kernel.source          # one allocation, then in place
    assert fused.op.shape_rule(*fused.inputs) == ((4, 5), np.dtype(F32))
    assert_same(got, want)
    assert not np.shares_memory(got[0], x) and not np.shares_memory(got[0], c)


def test_fusion_stops_at_values_read_outside_the_group():
    def build(x):
        a = x + 1.0
        b = fl.tanh(a) * 2.0
        return b, fl.reduce_sum(a)                      # a is read by a reduction: it must exist
    plan, plain, got, want = both(build, rand(3, 3), passes=(fuse_elementwise,))
    assert ops(plan) == ["const", "add", "const", "fused(tanh,multiply)", "reduce_sum"]
    assert_same(got, want)


def test_a_fetched_intermediate_is_not_fused_away():
    plan, plain, got, want = both(lambda x: [x * 2.0, fl.exp(x * 2.0 + 1.0)], rand(3),
                                  passes=(eliminate_common_subexpressions, fuse_elementwise))
    assert "multiply" in ops(plan) and "fused(add,exp)" in ops(plan)
    assert_same(got, want)


def test_a_small_dag_fuses_into_one_node():
    # p is read twice inside the group: it joins once both its readers have
    plan, plain, got, want = both(lambda x: fl.exp(x * 2.0) + fl.sin(x * 2.0) * x, rand(8),
                                  passes=(eliminate_common_subexpressions, fuse_elementwise))
    assert [o for o in ops(plan) if o != "const"] == ["fused(multiply,exp,sin,multiply,add)"]
    assert_same(got, want)


def test_fusion_broadcasts_into_a_larger_buffer_when_it_must():
    x, y, z = rand(1, 4), rand(1, 4), rand(3, 4)
    plan, _, got, want = both(lambda x, y, z: fl.sqrt(fl.abs((x + y) * z)), x, y, z)
    assert_same(got, want)
    assert got[0].shape == (3, 4)


def test_fusion_with_unknown_dimensions_never_writes_into_a_smaller_buffer():
    g = fl.Graph()
    with g.as_default():
        a, b = g.placeholder(fl.float32, [None, 4]), g.placeholder(fl.float32, [None, 4])
        bias = g.placeholder(fl.float32, [4])
        y = fl.nn.relu((a + 1.0) * b + bias)
    plan, plain = compile_plan(g, [y], [a, b, bias]), compile_plan(g, [y], [a, b, bias], passes=())
    assert len(plan.nodes) < len(plain.nodes)
    for shapes in [((1, 4), (5, 4)), ((5, 4), (1, 4)), ((3, 4), (3, 4))]:
        arrays = [rand(*shapes[0]), rand(*shapes[1]), rand(4)]
        assert_same(plan(*arrays), plain(*arrays))


def test_a_chain_of_scalars_fuses_too():
    x = np.float32(0.3)
    plan, _, got, want = both(lambda x: fl.nn.sigmoid(fl.exp(x) - 1.0) * 2.0, np.asarray(x))
    assert any(o.startswith("fused(") for o in ops(plan))
    assert_same(got, want)


_BINARY = {"add", "subtract", "multiply", "divide", "floordiv", "floormod", "pow", "maximum", "minimum",
           "equal", "not_equal", "less", "less_equal", "greater", "greater_equal", "logical_and",
           "logical_or", "relu_grad"}


def _inputs_for(name, shapes):
    if name.startswith("logical"):
        return [_rng.integers(0, 2, s).astype(bool) for s in shapes]
    if name in ("sqrt", "log", "pow"):
        return [rand(*s, low=0.5, high=2.0) for s in shapes]
    return [rand(*s, low=-2.0, high=2.0) for s in shapes]


@pytest.mark.parametrize("name", [name for name in list_ops() if get_op(name).elementwise is not None])
def test_every_fusable_function_computes_exactly_what_its_op_kernel_computes(name):
    op = get_op(name)
    assert not op.stateful and op.fresh
    for shapes in ([(3, 4), (4,)], [(), ()]):
        args = _inputs_for(name, shapes[:2] if name in _BINARY else shapes[:1])
        want = np.asarray(op.kernel(*args))
        got = op.elementwise(*args)
        assert np.asarray(got).dtype == want.dtype
        np.testing.assert_array_equal(got, want)
        if want.ndim:
            out = np.empty_like(want)
            assert op.elementwise(*args, out=out) is out
            np.testing.assert_array_equal(out, want)


# -- buffer reuse -----------------------------------------------------------------------------
def test_an_elementwise_node_writes_into_a_matmul_result_that_dies_there():
    x, w, b = rand(4, 3), rand(3, 5), rand(5)
    plan, plain, got, want = both(lambda x, w, b: fl.tanh(x @ w + b), x, w, b)
    assert ops(plan) == ["matmul", "fused(add,tanh)[in-place]"]
    assert_same(got, want)
    single, _, got, _ = both(lambda x, w, b: (x @ w) * b, x, w, b, passes=(reuse_buffers,))
    assert ops(single) == ["matmul", "multiply[in-place]"]


def test_a_fetched_value_is_never_overwritten():
    x, w = rand(4, 3), rand(3, 4)
    plan, _, (a, y), _ = both(lambda x, w: [x @ w, fl.exp(x @ w) + 1.0], x, w)
    np.testing.assert_array_equal(a, x @ w)
    np.testing.assert_array_equal(y, np.exp(x @ w) + 1.0)
    assert not any(o.endswith("[in-place]") for o in ops(plan))


def test_a_buffer_with_a_live_view_is_not_reused():
    x, w = rand(4, 3), rand(3, 4)

    def build(x, w):
        a = x @ w
        t = fl.transpose(a)                             # a view of a's buffer
        y = a * 2.0                                     # a's own last use, but t lives on
        return y, t + 1.0
    plan, plain, got, want = both(build, x, w)
    assert_same(got, want)
    np.testing.assert_array_equal(got[1], (x @ w).T + 1.0)
    assert ops(plan) == ["matmul", "transpose", "const", "multiply", "const", "add"]   # nothing in place


def test_a_view_read_by_the_same_node_is_safe():
    x, w = rand(4, 3), rand(3, 4)
    plan, _, got, want = both(lambda x, w: (x @ w) + fl.transpose(x @ w), x, w)
    assert ops(plan) == ["matmul", "transpose", "add[in-place]"]   # numpy copies overlapping operands
    assert_same(got, want)


def test_a_fused_kernel_never_writes_into_an_input_that_a_later_step_reads_through_a_view():
    def build(x):
        t = fl.tanh(x)
        return (x + t) + fl.reshape(t, [-1, 3])        # t dies at the fused node; so does its view
    plan, plain, got, want = both(build, rand(3, 3))
    assert ops(plan) == ["tanh", "reshape", "fused(add,add)"]   # its first step must not write into t
    assert_same(got, want)


def test_feeds_constants_and_variables_are_never_written():
    v = fl.Variable(rand(3, 3))
    before = v.numpy().copy()
    earlier = v.read_value()                             # shares the variable's array
    c = rand(3, 3)
    x = rand(3, 3)
    x_before = x.copy()

    @fl.function
    def f(x):
        h = fl.nn.relu(v * 2.0 + x) * fl.constant(c)
        return fl.tanh(h + v), v * x

    outs = [f(x) for _ in range(2)]
    assert_same([o.numpy() for o in outs[0]], [o.numpy() for o in outs[1]])
    np.testing.assert_array_equal(v.numpy(), before)
    np.testing.assert_array_equal(earlier.numpy(), before)
    np.testing.assert_array_equal(x, x_before)
    const_values = [n.attrs["value"] for n in f.get_concrete_function(x)._plan.nodes if n.op.name == "const"]
    assert any(np.array_equal(value, c) for value in const_values)


def test_a_value_given_to_an_assignment_is_never_overwritten():
    v = fl.Variable(np.zeros((3, 3), F32))
    x, w = rand(3, 3), rand(3, 3)

    @fl.function
    def f(x, w):
        h = x @ w
        v.assign(h)                                      # the variable now holds h's buffer
        return fl.exp(h) * 2.0                           # h's last use: must not write into it

    first = f(x, w).numpy().copy()
    np.testing.assert_array_equal(v.numpy(), x @ w)
    np.testing.assert_array_equal(first, np.exp(x @ w) * 2.0)


def test_results_of_earlier_calls_never_change():
    f = fl.function(lambda x: fl.tanh(x @ x + 1.0) * 3.0)
    x1, x2 = rand(4, 4), rand(4, 4)
    r1 = f(x1)
    kept = r1.numpy().copy()
    f(x2)
    np.testing.assert_array_equal(r1.numpy(), kept)


# -- the whole pipeline ----------------------------------------------------------------------
def test_passes_never_change_the_users_graph():
    g, fetches, xs = graph_of(lambda x, w: [fl.nn.relu(x @ w + (fl.constant(1.0) + 1.0)) * 2.0,
                                            fl.reduce_sum(x * 2.0)], ((2, 3), F32), ((3, 3), F32))
    before = snapshot(g)
    plan = compile_plan(g, fetches, xs)
    assert snapshot(g) == before
    assert all(n not in g.nodes for n in plan.nodes if n.op.name.startswith("fused"))
    assert len({n.index for n in plan.nodes}) == len(plan.nodes)


def test_every_op_case_of_test_function_gives_the_same_values_with_and_without_passes():
    from test_function import CASES, _differentiable, _float_positions, with_gradients  # the op table's cases
    for case in CASES:
        fns = [case.fn]
        if _differentiable(case):
            out = case.fn(*case.args)
            w = fl.constant(np.random.default_rng(0).standard_normal(tuple(out.shape)).astype(out.dtype.as_numpy_dtype))
            fns.append(lambda *args, g=with_gradients(case.fn, _float_positions(case)), w=w: g(w, *args))
        for fn in fns:
            concrete = fl.function(fn).get_concrete_function(*case.args)
            arrays = [a._value for a in case.args]
            plain = compile_plan(concrete.graph, concrete.outputs, concrete.inputs, passes=())
            try:
                assert_same(concrete._plan(*arrays), plain(*arrays))
                assert_same(concrete._plan.interpret(arrays), plain(*arrays))
            except AssertionError as e:
                raise AssertionError(f"case {case.id}: {e}") from None


def make_chain(n):
    kinds = ["x = x + c", "x = x * d", "x = tanh(x)"]
    body = "\n".join(f"    {kinds[i % 3]}" for i in range(n))
    namespace = {}
    exec(f"def chain(x, c, d, tanh):\n{body}\n    return x\n", namespace)  # noqa: S102 - our own code
    return namespace["chain"]


def test_a_chain_of_100_elementwise_ops_is_one_node_and_gives_the_same_bits():
    chain = make_chain(100)
    a, b, d = rand(64, 64), rand(64, 64, low=-0.5, high=0.5), rand(64, 64, low=0.5, high=1.5)
    plan, plain, got, want = both(lambda x, c, d: chain(x, c, d, fl.tanh), a, b, d)
    assert len(plain.nodes) == 100 and len(plan.nodes) == 1
    assert plan.nodes[0].op.name == "fused(add,multiply,tanh,add,multiply,tanh,...100 ops)"
    assert_same(got, want)
    np.testing.assert_allclose(got[0], chain(a, b, d, np.tanh), rtol=1e-6)


LAYERS = (8, 16, 16, 4)


class MLP:
    def __init__(self, seed=0):
        rng = np.random.default_rng(seed)
        self.variables = []
        for n_in, n_out in zip(LAYERS[:-1], LAYERS[1:]):
            self.variables += [fl.Variable(rng.uniform(-0.5, 0.5, (n_in, n_out)).astype(F32)),
                               fl.Variable(rng.uniform(-0.1, 0.1, n_out).astype(F32))]
        self.optimizer = fl.optimizers.SGD(0.1)

    def step(self, x, y):
        w1, b1, w2, b2, w3, b3 = self.variables
        with fl.GradientTape() as tape:
            h = fl.nn.relu(x @ w1 + b1)
            h = fl.nn.sigmoid(h @ w2 + b2)
            loss = fl.reduce_mean(fl.nn.sparse_softmax_cross_entropy_with_logits(y, h @ w3 + b3))
        self.optimizer.apply_gradients(zip(tape.gradient(loss, self.variables), self.variables))
        return loss


def test_an_mlp_training_step_trains_the_same_with_and_without_passes():
    rng = np.random.default_rng(1)
    batches = [(rng.standard_normal((32, 8)).astype(F32), rng.integers(0, 4, 32).astype(np.int32))
               for _ in range(3)]
    eager, optimized, plain = MLP(), MLP(), MLP()
    fn_optimized, fn_plain = fl.function(optimized.step), fl.function(plain.step)
    concrete = fn_plain.get_concrete_function(*batches[0])
    plain_plan = compile_plan(concrete.graph, concrete.outputs, concrete.inputs, passes=())
    opt_plan = fn_optimized.get_concrete_function(*batches[0])._plan
    assert len(opt_plan.nodes) < len(plain_plan.nodes)
    assert any(o.startswith("fused(") for o in ops(opt_plan)) and any(o.endswith("[in-place]") for o in ops(opt_plan))
    for x, y in batches:
        loss_eager = eager.step(fl.constant(x), fl.constant(y))
        loss_optimized = fn_optimized(x, y)
        (loss_plain,) = plain_plan(x, y)
        assert float(loss_optimized) == float(loss_plain)
        np.testing.assert_allclose(float(loss_optimized), float(loss_eager), rtol=1e-5)
    for a, b, c in zip(optimized.variables, plain.variables, eager.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
        np.testing.assert_allclose(a.numpy(), c.numpy(), rtol=1e-5, atol=1e-6)
    assert int(optimized.optimizer.iterations.numpy()) == 3


def test_stateful_nodes_keep_their_order_and_effects():
    v = fl.Variable([1.0, 2.0])

    def program(x):
        a = v * 1.0
        v.assign_add(x)
        b = v * 1.0 + 0.0
        v.assign(b * 2.0)
        fl.random.normal([2])                            # unused: drawn all the same
        return a, b, v * 1.0, fl.random.uniform([2])

    concrete = fl.function(program).get_concrete_function(fl.constant([0.5, 0.5]))
    plain = compile_plan(concrete.graph, concrete.outputs, concrete.inputs, passes=())
    plan = concrete._plan
    stateful = [(n.op.name, n.index) for n in plan.nodes if n.op.stateful]
    assert stateful == [(n.op.name, n.index) for n in plain.nodes if n.op.stateful]
    assert [name for name, _ in stateful].count("random") == 2
    results = []
    for p in (plan, plain):
        v.assign([1.0, 2.0])
        fl.random.set_seed(3)
        results.append(p(np.array([0.5, 0.5], F32)))
        assert v.numpy().tolist() == [3.0, 5.0]
    assert_same(*results)
    assert results[0][0].tolist() == [1.0, 2.0] and results[0][1].tolist() == [1.5, 2.5]


def test_a_kernel_failure_names_the_fused_node_and_the_users_line():
    g, fetches, xs = graph_of(lambda x, y: fl.abs(x ** y) + 1, ((3,), np.int32), ((3,), np.int32))
    plan = compile_plan(g, fetches, xs)
    assert ops(plan) == ["const", "fused(pow,abs,add)"]
    with pytest.raises(fl.errors.InvalidArgumentError, match=r"fused\(pow,abs,add\)") as e:
        plan(np.array([1, 2, 3], np.int32), np.array([1, -1, 2], np.int32))
    assert "test_passes.py" in str(e.value)


def test_debug_hooks_see_the_ops_as_traced():
    seen = []
    g, fetches, xs = graph_of(lambda x: fl.tanh(x * 2.0 + 1.0), ((3,), F32))
    plan = compile_plan(g, fetches, xs)
    from flowlab.core._context import state
    st = state()
    hook = lambda op, inputs, attrs, out: seen.append(op.name)  # noqa: E731
    st.push("hooks", hook)
    try:
        got = plan(rand(3))
    finally:
        st.pop("hooks", hook)
    assert [name for name in seen if name != "const"] == ["multiply", "add", "tanh"] and got[0].shape == (3,)


def test_optimize_runs_passes_in_order_and_returns_nodes_and_fetches():
    g, fetches, xs = graph_of(lambda x: fl.exp(x) * (fl.constant(1.0) + 1.0), ((3,), F32))
    plain = compile_plan(g, fetches, xs, passes=())
    nodes, outs = optimize(plain.nodes, fetches, xs)
    assert [n.op.name for n in nodes] == ["const", "fused(exp,multiply)"] and outs[0] is nodes[-1].output


def test_only_nodes_on_this_cpu_get_new_kernels():
    class Fake:
        device = None
    node = Fake()
    for spec, local in [(None, True), ("/cpu:0", True), ("/job:localhost/task:0", True), ("/gpu:0", False),
                        ("/job:worker/task:1", False), ("/device:GPU:1", False)]:
        node.device = spec if spec is None else DeviceSpec.from_string(spec)
        assert on_local_cpu(node) == local, spec


# -- random programs: the whole pipeline against no passes ----------------------------------------
_UNARY_OPS = [fl.tanh, fl.negative, fl.square, fl.abs, fl.nn.relu, fl.nn.sigmoid, fl.sin]
_BINARY_OPS = [fl.add, fl.subtract, fl.multiply, fl.maximum, fl.minimum]
_INPUT_SHAPES = [(3, 3), (3, 3), (3, 3), (1, 3), (3, 1), (3,), ()]


@st.composite
def programs(draw):
    """A list of input shapes, and ops that each read earlier values: elementwise ops (which fuse
    and work in place), matmuls (whose results are buffers to reuse), and views and reductions
    (which must block reuse)."""
    shapes = draw(st.lists(st.sampled_from(_INPUT_SHAPES), min_size=1, max_size=3))
    steps = []
    n_values = len(shapes)
    for _ in range(draw(st.integers(1, 16))):
        kind = draw(st.sampled_from(["unary", "binary", "binary", "matmul", "matmul", "view", "reduce"]))
        args = tuple(draw(st.integers(0, n_values - 1)) for _ in range(2))
        steps.append((kind, draw(st.integers(0, 6)), args))
        n_values += 1
    fetches = draw(st.sets(st.integers(0, n_values - 1), max_size=3))
    return shapes, steps, sorted(fetches | {n_values - 1}), draw(st.booleans())


def _run_program(steps, fetch_positions):
    def build(*xs):
        values = list(xs)
        for kind, which, (i, j) in steps:
            a, b = values[i], values[j]
            square = [v for v in (a, b) if tuple(v.shape) == (3, 3) or v.shape[-2:] == (None, 3)]
            if kind == "unary":
                values.append(_UNARY_OPS[which % len(_UNARY_OPS)](a))
            elif kind == "matmul" and len(square) == 2:
                values.append(square[0] @ square[1])
            elif kind == "view" and len(a.shape) == 2:
                values.append(fl.transpose(a) if which % 2 or a.shape[-1] != 3 else fl.reshape(a, [-1, 3]))
            elif kind == "reduce" and len(a.shape) == 2:
                values.append(fl.reduce_sum(a, axis=which % 2, keepdims=True))
            else:
                values.append(_BINARY_OPS[which % len(_BINARY_OPS)](a, b))
        return [values[k] for k in fetch_positions]
    return build


@settings(max_examples=150, deadline=None)
@given(programs())
def test_random_programs_give_the_same_bits_and_write_into_no_input(program):
    shapes, steps, fetch_positions, unknown_batch = program
    arrays = [rand(*s) for s in shapes]
    specs = [((None, 3) if unknown_batch and s == (3, 3) else s, F32) for s in shapes]   # None: still 3 when run
    g, fetches, xs = graph_of(_run_program(steps, fetch_positions), *specs)
    plain = compile_plan(g, fetches, xs, passes=())
    plan = compile_plan(g, fetches, xs)
    kept = [a.copy() for a in arrays]
    want = plain(*arrays)
    got = plan(*arrays)
    assert_same(got, want)
    first = [np.array(v, copy=True) for v in got]
    plan(*[a * 2 for a in arrays])                       # a later run changes nothing already returned
    assert_same(got, first)
    for a, b in zip(arrays, kept):
        np.testing.assert_array_equal(a, b)
