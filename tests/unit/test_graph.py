"""Graphs as data: what a node records, the listing, how traces nest, and the errors a graph gives.

A graph is built by running Python with symbolic tensors, so most mistakes show up in one of two
places: while tracing (a shape rule refuses, a tensor has no value yet, a tensor belongs to
another graph) or while the graph runs (a kernel refuses the data fed to it). Either way the
error must name the op and the user's own line, which for a run-time error is the line that
created the node, long after that line ran.
"""
from __future__ import annotations

import pickle

import numpy as np
import pytest

import flowlab as fl
from flowlab.core._context import ACTIVE, state
from flowlab.core.execute import get_op
from flowlab.core.graph import GraphTensor, get_default_graph


def line_of(fn, offset):
    """The file:line of the ``offset``-th line of ``fn``'s body (its ``def`` is line 0)."""
    return f"{__file__}:{fn.__code__.co_firstlineno + offset}"


def node_named(graph, name):
    return next(n for n in graph.nodes if n.name == name)


# -- building a graph by hand -------------------------------------------------------------------
def test_as_default_makes_ops_symbolic_and_restores_eager_mode():
    outer, inner = fl.Graph("outer"), fl.Graph("inner")
    assert get_default_graph() is None
    with outer.as_default() as g:
        assert g is outer and get_default_graph() is outer
        with inner.as_default():
            assert get_default_graph() is inner
            y = fl.add(1.0, 2.0)
        assert get_default_graph() is outer
    assert get_default_graph() is None
    assert isinstance(y, GraphTensor) and y.graph is inner
    assert isinstance(fl.add(1.0, 2.0), fl.Tensor) and not isinstance(fl.add(1.0, 2.0), GraphTensor)


def test_placeholder_has_a_spec_and_no_value():
    g = fl.Graph()
    with g.as_default():
        p = g.placeholder(fl.float32, [None, 3], name="images")
    assert p.shape == (None, 3) and p.dtype == fl.float32
    assert p.name == "images:0" and p.node.op is get_op("placeholder")
    assert g.placeholders == [p]
    assert len(g.nodes) == 1 and g.nodes[0].inputs == []
    with pytest.raises(ValueError, match="give a shape"):
        g.placeholder(fl.float32)


def test_a_node_records_op_inputs_attrs_spec_name_and_source():
    g = fl.Graph("g")

    def build():
        a = g.placeholder(fl.float32, [None, 3])
        b = g.placeholder(fl.float32, [2, 3])
        first = fl.matmul(a, b, transpose_b=True)
        second = fl.matmul(first, fl.ones([2, 4]))
        return a, b, first, second

    with g.as_default():
        a, b, first, second = build()
    assert (first.node.name, second.node.name) == ("matmul", "matmul_1")
    assert first.name == "matmul:0" and second.name == "matmul_1:0"
    node = first.node
    assert node.op is get_op("matmul") and node.graph is g
    assert node.inputs[0] is a and node.inputs[1] is b
    assert node.attrs == {"transpose_a": False, "transpose_b": True}
    assert node.output is first
    assert first.shape == (None, 2) and first.dtype == fl.float32
    assert second.shape == (None, 4)
    assert node.source.startswith(line_of(build, 3) + ":")
    assert node.source.endswith("first = fl.matmul(a, b, transpose_b=True)")
    assert second.node.source.startswith(line_of(build, 4))
    assert [n.index for n in g.nodes] == list(range(len(g.nodes)))
    assert g.get_tensor_by_name("matmul_1:0") is second
    assert g.get_tensor_by_name("matmul_1") is second
    with pytest.raises(KeyError, match="matmul_2"):
        g.get_tensor_by_name("matmul_2:0")
    assert "matmul_1:0" in repr(second) and "graph tensor" in repr(second)


def test_inputs_become_constants_and_variables_become_reads():
    g = fl.Graph()
    v = fl.Variable([1.0, 2.0], name="w")
    c = fl.constant([3.0, 4.0])
    with g.as_default():
        p = g.placeholder(fl.float32, [2])
        y = (p + c) * c + 1.5 + v
    ops = [n.op.name for n in g.nodes]
    assert ops.count("const") == 2, "one node for c (used twice), one for 1.5"
    read = node_named(g, "w")
    assert read.op.name == "read" and read.attrs["variable"] is v
    assert y.shape == (2,) and y.dtype == fl.float32
    const = next(n for n in g.nodes if n.op.name == "const" and n.output.shape == ())
    assert const.output.dtype == fl.float32, "a Python float takes its partner's dtype"


def test_get_operations_is_the_nodes_in_order():
    g = fl.Graph()
    with g.as_default():
        x = g.placeholder(fl.float32, [3])
        fl.exp(fl.negative(x))
    assert [n.op.name for n in g.get_operations()] == ["placeholder", "negative", "exp"]
    assert repr(g).endswith("3 nodes>")


# -- the listing --------------------------------------------------------------------------------
def test_pretty_lists_every_node_and_the_return():
    def model(x, w):
        return fl.nn.softmax(fl.matmul(x, w) + 1.0)

    concrete = fl.function(model).get_concrete_function(fl.TensorSpec([None, 3]), fl.TensorSpec([3, 2]))
    text = concrete.pretty()
    lines = text.splitlines()
    assert lines[0] == "graph model(%0: float32[?,3], %1: float32[3,2]) {"
    assert lines[-1] == "}"
    for op in ("matmul", "add", "softmax", "const"):
        assert op in text, f"{op} missing from\n{text}"
    out = concrete.outputs[0]
    assert lines[-2] == f"  return %{out.node.index}"
    matmul_line = next(line for line in lines if "matmul" in line)
    assert "%0, %1" in matmul_line and matmul_line.endswith(": float32[?,2]")
    softmax_line = next(line for line in lines if "softmax" in line)
    assert "{axis=-1}" in softmax_line and softmax_line.endswith(": float32[?,2]")


def test_pretty_shows_variables_and_attrs_by_name():
    v = fl.Variable([[1.0], [2.0]], name="kernel")
    concrete = fl.function(lambda x: fl.reduce_sum(x @ v, axis=0)).get_concrete_function(fl.TensorSpec([None, 2]))
    text = concrete.pretty()
    assert "read kernel" in text
    assert "reduce_sum" in text and "axis=(0,)" in text
    assert "return" not in concrete.graph.pretty(), "a graph alone has no outputs"


# -- traced functions as graphs -----------------------------------------------------------------
def test_nodes_of_a_traced_function_name_the_users_line():
    def f(x):
        y = x * 2.0
        return fl.reduce_sum(y)

    graph = fl.function(f).get_concrete_function(fl.zeros([3])).graph
    assert node_named(graph, "multiply").source.startswith(line_of(f, 1))
    assert node_named(graph, "reduce_sum").source.startswith(line_of(f, 2))


def test_nested_functions_inline_into_the_outer_graph():
    @fl.function
    def inner(x):
        return fl.exp(x) * 2.0

    @fl.function
    def outer(x):
        return inner(x) + inner(x + 1.0)

    x = fl.constant([0.0, 1.0])
    np.testing.assert_allclose(outer(x).numpy(), 2 * np.exp([0.0, 1.0]) + 2 * np.exp([1.0, 2.0]), rtol=1e-6)
    assert inner.experimental_get_tracing_count() == 0, "inlined, never traced on its own"
    ops = [n.op.name for n in outer.get_concrete_function(x).graph.nodes]
    assert ops.count("exp") == 2 and ops.count("multiply") == 2


def test_a_tape_outside_a_function_sees_through_it():
    @fl.function
    def cube(x):
        return x * x * x

    x = fl.constant([1.0, -2.0])
    for _ in range(3):
        with fl.GradientTape() as tape:
            tape.watch(x)
            y = cube(x)
        assert tape.gradient(y, x).numpy().tolist() == [3.0, 12.0]
    # the function ran as its graph (one trace, reused); its gradient is a traced backward function
    assert cube.experimental_get_tracing_count() == 1
    v = fl.Variable(2.0)
    with fl.GradientTape() as tape:
        y = fl.function(lambda: v * v)()
    assert float(tape.gradient(y, v)) == 4.0     # captured variables get gradients too


def test_gradients_of_gradients_through_a_function():
    cube = fl.function(lambda a: a * a * a)
    z = fl.constant(0.5)
    with fl.GradientTape() as outer:
        outer.watch(z)
        with fl.GradientTape() as inner:
            inner.watch(z)
            y = cube(z)
        dy = inner.gradient(y, z)
    assert float(dy) == 0.75 and float(outer.gradient(dy, z)) == 3.0


def test_a_function_with_side_effects_runs_eagerly_under_a_tape():
    # its backward trace would repeat the assignment: so it runs op by op, and assigns once
    v = fl.Variable(1.0)
    counter = fl.Variable(0.0, trainable=False)

    @fl.function
    def f():
        counter.assign_add(1.0)
        return v * 3.0

    with fl.GradientTape() as tape:
        y = f()
    assert float(tape.gradient(y, v)) == 3.0
    assert float(counter) == 1.0


def test_a_concrete_function_takes_arrays_and_returns_structures():
    concrete = fl.function(lambda x, y: {"sum": x + y, "both": (x, y * 2.0), "tag": "ok"}).get_concrete_function(
        fl.TensorSpec([2]), fl.TensorSpec([2]))
    out = concrete(np.array([1.0, 2.0], np.float32), fl.constant([3.0, 4.0]))
    assert out["tag"] == "ok"
    assert out["sum"].numpy().tolist() == [4.0, 6.0]
    assert out["both"][0].numpy().tolist() == [1.0, 2.0] and out["both"][1].numpy().tolist() == [6.0, 8.0]
    assert len(concrete.inputs) == 2 and len(concrete.outputs) == 3


@pytest.mark.parametrize("arg", [fl.zeros([3]), np.zeros([2], np.int32)], ids=["wrong shape", "wrong dtype"])
def test_a_concrete_function_refuses_arguments_that_do_not_fit(arg):
    concrete = fl.function(lambda x: x * 2.0).get_concrete_function(fl.TensorSpec([2]))
    with pytest.raises((TypeError, ValueError)):
        concrete(arg)


def test_the_interpreter_and_the_compiled_plan_agree():
    """Hooks make a graph run node by node; the hook sees every computing node, in order."""
    params = [np.random.default_rng(0).standard_normal(s).astype(np.float32) for s in [(3, 4), (4,)]]

    @fl.function
    def layer(x):
        return fl.nn.tanh(x @ params[0] + params[1])

    x = fl.constant(np.arange(6, dtype=np.float32).reshape(2, 3))
    compiled = layer(x).numpy()
    seen = []

    def hook(op, inputs, attrs, out):
        seen.append(op.name)

    st = state()
    st.push("hooks", hook)
    try:
        interpreted = layer(x).numpy()
    finally:
        st.pop("hooks", hook)
    np.testing.assert_array_equal(interpreted, compiled)
    assert [n for n in seen if n != "const"] == ["matmul", "add", "tanh"]
    assert layer.experimental_get_tracing_count() == 1


# -- errors while tracing -----------------------------------------------------------------------
def test_a_shape_error_while_tracing_names_the_op_and_the_users_line():
    def bad(a, b):
        return fl.matmul(a, b)

    with pytest.raises(fl.InvalidArgumentError) as info:
        fl.function(bad)(fl.zeros([2, 3]), fl.zeros([4, 5]))
    err = info.value
    assert str(err).startswith("matmul: inner dimensions do not match")
    assert err.op == "matmul"
    assert "float32[2,3], float32[4,5]" in str(err)
    assert err.source.startswith(line_of(bad, 1)), err.source


def test_a_dtype_error_while_tracing_names_the_op():
    g = fl.Graph()
    with g.as_default(), pytest.raises(fl.InvalidArgumentError, match=r"^add: inputs must have the same dtype"):
        fl.add(g.placeholder(fl.float32, [2]), g.placeholder(fl.int32, [2]))


def test_tensors_from_two_graphs_do_not_mix():
    first, second = fl.Graph("first"), fl.Graph("second")
    with first.as_default():
        a = first.placeholder(fl.float32, [2])
    with second.as_default():
        b = second.placeholder(fl.float32, [2])
        with pytest.raises(fl.InvalidArgumentError, match=r"^add: input 0 \(placeholder:0\) belongs to another graph"):
            fl.add(a, b)
    assert len(second.nodes) == 1, "the refused op added no node"


def test_a_tensor_leaked_from_one_trace_cannot_be_used_in_another():
    leaked = []

    @fl.function
    def keep(x):
        leaked.append(x * 2.0)
        return x

    @fl.function
    def use(x):
        return x + leaked[0]

    keep(fl.zeros([2]))
    with pytest.raises(fl.InvalidArgumentError, match="belongs to another graph"):
        use(fl.zeros([2]))


def test_a_variable_cannot_be_made_from_a_graph_tensor():
    with pytest.raises(ValueError, match="concrete initial value.*outside @fl.function"):
        fl.function(lambda x: fl.Variable(x * 2.0))(fl.zeros([2]))


def test_a_variable_with_a_dtype_cannot_be_made_from_a_graph_tensor():
    with pytest.raises(ValueError, match="concrete initial value"):
        fl.function(lambda x: fl.Variable(x, dtype=fl.float32))(fl.zeros([2]))


@pytest.mark.parametrize("use", [
    pytest.param(lambda t: t.numpy(), id="numpy"),
    pytest.param(float, id="float"),
    pytest.param(int, id="int"),
    pytest.param(bool, id="bool"),
    pytest.param(np.asarray, id="np.asarray"),
    pytest.param(len, id="len of an unknown dim"),
    pytest.param(lambda t: list(t), id="iterate an unknown dim"),
    pytest.param(lambda t: [0, 1, 2][fl.reduce_sum(t)], id="index a list with a scalar"),
])
def test_a_graph_tensor_has_no_value(use):
    g = fl.Graph()
    with g.as_default():
        p = g.placeholder(fl.int32, [None])
        with pytest.raises(TypeError, match=r"\w+:0 is a graph tensor: it has none until the graph runs"):
            use(p)


def test_a_graph_tensor_of_known_length_can_be_unpacked_and_not_pickled():
    g = fl.Graph()
    with g.as_default():
        p = g.placeholder(fl.float32, [2, 3])
        first, second = p
    assert len(p) == 2 and first.shape == (3,) and second.node.op.name == "getitem"
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(p)


# -- errors while the graph runs ----------------------------------------------------------------
def test_a_failure_at_run_time_names_the_op_and_the_line_that_made_the_node():
    def pick(params, indices):
        rows = fl.gather(params, indices)
        return rows * 2.0

    traced = fl.function(pick)
    params = fl.constant([[1.0, 2.0], [3.0, 4.0]])
    assert traced(params, fl.constant([1, 0])).numpy().tolist() == [[6.0, 8.0], [2.0, 4.0]]
    with pytest.raises(fl.InvalidArgumentError) as info:
        traced(params, fl.constant([1, 2]))
    err = info.value
    assert str(err).startswith("gather: IndexError: index 2 is not in [0, 2)")
    assert err.op == "gather"
    assert err.source.startswith(line_of(pick, 1)), err.source
    assert err.source.endswith("(graph node gather)")
    assert traced.experimental_get_tracing_count() == 1, "the data, not the trace, was wrong"
    assert state().node is None, "the interpreter forgets the node it ran"
    assert traced(params, fl.constant([0])).numpy().tolist() == [[2.0, 4.0]], "and the function still works"


# -- tracing leaves no state behind -------------------------------------------------------------
def _raise_python_error(x):
    raise KeyError("user code failed")


def _raise_shape_error(x):
    return fl.matmul(x, x)


def _raise_inside_a_tape(x):
    with fl.GradientTape() as tape:
        tape.watch(x)
        fl.reshape(x, [7])
    return tape


def _raise_in_a_nested_function(x):
    return fl.function(_raise_shape_error)(x * 2.0)


def _raise_with_a_graph_open(x):
    with fl.Graph().as_default():
        return fl.matmul(x, x)


@pytest.mark.parametrize("body,error", [
    (lambda x: x * 2.0, None),
    (_raise_python_error, KeyError),
    (_raise_shape_error, fl.InvalidArgumentError),
    (_raise_inside_a_tape, fl.InvalidArgumentError),
    (_raise_in_a_nested_function, fl.InvalidArgumentError),
    (_raise_with_a_graph_open, fl.InvalidArgumentError),
], ids=["ok", "python error", "shape error", "error inside a tape", "nested function", "inner graph"])
def test_active_count_returns_after_tracing(body, error):
    before = ACTIVE.count
    st = state()
    traced = fl.function(body)
    if error is None:
        traced(fl.zeros([3]))
    else:
        with pytest.raises(error):
            traced(fl.zeros([3]))
    assert ACTIVE.count == before
    assert st.graph is None and st.interpreters == [] and st.interpreter is None and st.tapes == []
    # eager mode is back: ops give values, and the fast path is taken again
    assert fl.add(fl.constant(1.0), fl.constant(2.0)).numpy() == 3.0
