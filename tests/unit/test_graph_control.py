"""Control dependencies and node names in core graphs.

``Graph.control_dependencies`` gives the nodes made in its block control inputs: nodes that run
first whenever they run, whose values they do not read. Every graph pass must keep those edges
(a pass that dropped one would silently skip a check or an update the user asked for), so each
pass is tested on a graph where it would otherwise remove or merge the node. Names follow
TensorFlow's rules: a name scope prefixes, a taken name gets the first free ``_N`` suffix.
"""
from __future__ import annotations

import numpy as np
import pytest

import flowlab as fl
from flowlab.core import passes as P
from flowlab.core.execute import get_op
from flowlab.core.executor import compile_plan
from flowlab.core.graph import control_dependencies, get_default_graph, name_scope


def names(plan):
    return [n.op.name for n in plan.nodes]


def test_nodes_made_in_the_block_get_control_inputs_and_blocks_nest():
    g = fl.Graph()
    with g.as_default():
        x = g.placeholder(fl.float32, [], name="x")
        a = x * 2.0
        b = x * 3.0
        with control_dependencies([a]):
            c = x + 1.0
            with g.control_dependencies([b.node, a]):   # nodes or tensors; a repeat counts once
                d = fl.identity(x)
            with g.control_dependencies(None):
                e = fl.identity(x)
        f = fl.identity(x)
    assert [n.name for n in c.node.control_inputs] == [a.node.name]
    assert {n.name for n in d.node.control_inputs} == {a.node.name, b.node.name}
    assert len(d.node.control_inputs) == 2
    assert e.node.control_inputs == [] and f.node.control_inputs == []
    # constants made inside carry none: their readers do
    assert all(not n.control_inputs for n in g.nodes if n.op.name == "const")
    assert f"^%{a.node.index}" in g.pretty() and repr(c.node).endswith(f"^%{a.node.index})>")


def test_fetching_a_node_runs_its_control_inputs_first_in_a_plan():
    v = fl.Variable(1.0)
    g = fl.Graph()
    with g.as_default():
        x = g.placeholder(fl.float32, [], name="x")
        g.add_node(get_op("assign"), (x,), {"variable": v, "mode": "add"}, name="bump")
        bump = g.nodes[-1]
        with g.control_dependencies([bump]):
            after = fl.identity(v.read_value())
        unrelated = x * 1.0
    plan = compile_plan(g, [after], [x], run_stateful=False)
    assert plan(np.float32(2.0))[0] == 3.0          # the add ran, then the read
    assert plan(np.float32(2.0))[0] == 5.0
    assert float(v) == 5.0
    plain = compile_plan(g, [unrelated], [x], run_stateful=False)   # no control input: no update
    plain(np.float32(2.0))
    assert float(v) == 5.0


def test_control_inputs_from_another_graph_or_of_the_wrong_kind_are_refused():
    g, h = fl.Graph("g"), fl.Graph("h")
    with h.as_default():
        other = h.placeholder(fl.float32, [])
    with pytest.raises(ValueError, match="belongs to graph 'h'"):
        with g.control_dependencies([other]):
            pass
    with pytest.raises(TypeError, match="control_dependencies takes graph tensors"):
        with g.control_dependencies([1.0]):
            pass


def test_eager_control_dependencies_and_name_scope_do_nothing():
    with control_dependencies([fl.constant(1.0)]), name_scope("outer"):
        y = fl.constant(2.0) * 3.0
    assert float(y) == 6.0


def check_node_survives(run_pass, g, fetches, feeds, keep):
    nodes = g.nodes_for(fetches, feeds)
    out, _ = run_pass(nodes, fetches, feeds)
    assert any(n.name == keep for n in out), [n.name for n in out]
    return out


def test_pruning_keeps_a_pure_control_input_that_nothing_reads():
    g = fl.Graph()
    with g.as_default():
        x = g.placeholder(fl.float32, [3], name="x")
        check = fl.debugging.check_numerics(x, "bad x")
        with g.control_dependencies([check]):
            y = x * 2.0
    out = check_node_survives(P.prune_dead_nodes, g, [y], [x], check.node.name)
    assert out.index(check.node) < next(i for i, n in enumerate(out) if n.op.name == "multiply")
    plan = compile_plan(g, [y], [x])
    assert "check_numerics" in names(plan)
    with pytest.raises(fl.errors.InvalidArgumentError, match="bad x"):
        plan(np.array([1.0, np.nan, 2.0], np.float32))


def test_folding_leaves_a_node_with_control_inputs_as_a_node():
    g = fl.Graph()
    with g.as_default():
        x = g.placeholder(fl.float32, [], name="x")
        first = x + 0.5
        with g.control_dependencies([first]):
            c = fl.constant(2.0) * 3.0       # constants only: would fold
        free = fl.constant(4.0) * 3.0
    out, fetches = P.fold_constants(g.nodes_for([c, free], [x]), [c, free], [x])
    assert fetches[0].node.op.name == "multiply" and fetches[0].node.control_inputs
    assert fetches[1].node.op.name == "const"
    assert compile_plan(g, [c], [x])(np.float32(1.0))[0] == 6.0


def test_cse_merges_only_nodes_with_the_same_control_inputs():
    g = fl.Graph()
    with g.as_default():
        x = g.placeholder(fl.float32, [3], name="x")
        a = fl.exp(x)
        gate = fl.debugging.check_numerics(x, "x")
        with g.control_dependencies([gate]):
            b = fl.exp(x)                 # same op and input as a, but waits for the check
            b2 = fl.exp(x)                # same as b, same control inputs: merged with b
    out, fetches = P.eliminate_common_subexpressions(g.nodes_for([a, b, b2], [x]), [a, b, b2], [x])
    assert fetches[0].node is not fetches[1].node and fetches[1].node is fetches[2].node
    assert fetches[1].node.control_inputs == [gate.node]


def test_cse_rewires_control_inputs_to_the_surviving_node():
    g = fl.Graph()
    with g.as_default():
        x = g.placeholder(fl.float32, [3], name="x")
        a = fl.debugging.check_numerics(fl.exp(x), "a")
        b = fl.debugging.check_numerics(fl.exp(x), "a")   # merged into a
        with g.control_dependencies([b]):
            y = x * 2.0
    out, fetches = P.optimize(g.nodes_for([y, a], [x]), [y, a], [x], P.DEFAULT_PASSES)
    y_node = next(n for n in out if n.name == y.node.name)
    assert [c.name for c in y_node.control_inputs] == [a.node.name]
    assert all(c in out for c in y_node.control_inputs)


def test_fusion_does_not_swallow_a_control_input_of_an_outside_node():
    g = fl.Graph()
    with g.as_default():
        x = g.placeholder(fl.float32, [4], name="x")
        t = fl.tanh(x)                     # would join the fused chain ...
        u = fl.exp(t) + 1.0
        with g.control_dependencies([t]):  # ... but another node waits for it
            w = fl.identity(x)
    plan = compile_plan(g, [u, w], [x])
    kept = {n.name for n in plan.nodes}
    assert t.node.name in kept
    value = np.linspace(-1, 1, 4, dtype=np.float32)
    got_u, got_w = plan(value)
    np.testing.assert_array_equal(got_u, np.exp(np.tanh(value)) + np.float32(1.0))
    np.testing.assert_array_equal(got_w, value)


def test_control_dependencies_inside_a_traced_function_keep_results_and_order():
    v = fl.Variable(np.zeros(3, np.float32))

    @fl.function
    def step(x):
        before = v.read_value()
        v.assign_add(x)
        graph = get_default_graph()
        update = graph.nodes[-1]
        with graph.control_dependencies([update]):
            after = fl.identity(v.read_value())
        return before, after

    before, after = step(fl.constant([1.0, 2.0, 3.0]))
    np.testing.assert_array_equal(before.numpy(), [0, 0, 0])
    np.testing.assert_array_equal(after.numpy(), [1, 2, 3])
    before, after = step(fl.constant([1.0, 1.0, 1.0]))
    np.testing.assert_array_equal(before.numpy(), [1, 2, 3])
    np.testing.assert_array_equal(after.numpy(), [2, 3, 4])


# -- names --------------------------------------------------------------------------------------
def test_unique_names_follow_tensorflow_rules():
    g = fl.Graph()
    assert [g.unique_name("a") for _ in range(3)] == ["a", "a_1", "a_2"]
    assert g.unique_name("b_1") == "b_1"
    assert g.unique_name("b") == "b" and g.unique_name("b") == "b_2"   # b_1 is taken
    assert g.unique_name("c", mark_as_used=False) == "c" and g.unique_name("c") == "c"


def test_add_node_names_and_name_scopes():
    g = fl.Graph()
    with g.as_default():
        x = g.placeholder(fl.float32, [2], name="x")
        with g.name_scope("layer"):
            y = g.add_node(get_op("multiply"), (x, 2.0), name="scaled")
            z = fl.exp(y)
            with name_scope("inner"):
                w = fl.exp(z)
                with g.name_scope("layer/"):          # a whole prefix: re-enter exactly
                    q = fl.exp(w)
                with g.name_scope(None):              # the top level
                    r = fl.exp(w)
            y2 = g.add_node(get_op("multiply"), (x, 2.0), name="scaled")
        c = g.constant(np.float32(1.0), name="one")
    assert x.name == "x:0" and y.name == "layer/scaled:0" and z.name == "layer/exp:0"
    assert w.name == "layer/inner/exp:0" and q.name == "layer/exp_1:0" and r.name == "exp:0"
    assert y2.name == "layer/scaled_1:0" and c.name == "one:0"
    assert g.get_tensor_by_name("layer/scaled:0") is y
    assert g.rename(z.node, "activation") == "activation"
    with g.name_scope("s"):
        assert g.rename(z.node, "act") == "s/act"
    assert g.rename(w.node, "act", scoped=False) == "act"


def test_a_finalized_core_graph_refuses_new_nodes_and_renames():
    g = fl.Graph()
    with g.as_default():
        x = g.placeholder(fl.float32, [])
    g.finalize()
    assert g.finalized
    with pytest.raises(RuntimeError, match="finalized"):
        with g.as_default():
            x + 1.0
    with pytest.raises(RuntimeError, match="finalized"):
        g.rename(x.node, "y")


def test_an_assigned_variable_stands_for_its_latest_assignment_in_a_function():
    v = fl.Variable(np.float32(1.0))

    @fl.function
    def f(x):
        updated = v.assign_add(np.float32(1.0))     # inside a graph this returns the variable
        with fl.control_dependencies([updated]):
            return v.read_value() * x

    assert f(fl.constant(np.float32(2.0))).numpy() == 4.0 and v.numpy() == 2.0
    assert f(fl.constant(np.float32(2.0))).numpy() == 6.0 and v.numpy() == 3.0


def test_a_variable_nothing_assigns_is_refused_with_its_name():
    v = fl.Variable(np.float32(1.0), name="never_set")

    @fl.function
    def f(x):
        with fl.control_dependencies([v]):
            return x + 1

    with pytest.raises(ValueError, match="never_set"):
        f(fl.constant(np.float32(2.0)))
