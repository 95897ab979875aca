"""The stack of interpreters (core/interpreters.py): ``execute`` hands each op to the innermost one
of its thread; the eager one is the bottom; a graph builder adds nodes; a higher layer can push its
own; ``init_scope`` runs ops now even while a graph is traced."""
import threading

import numpy as np
import pytest

import flowlab as fl
from flowlab.core._context import ACTIVE, state
from flowlab.core.execute import EAGER
from flowlab.core.graph import GraphBuilder, get_default_graph
from flowlab.core.interpreters import Interpreter, current, current_graph, init_scope, interpreting


class Recording(Interpreter):
    """Runs every op eagerly and remembers its name: what a layer above core might push."""

    def __init__(self):
        self.seen = []

    def process(self, op, inputs, attrs):
        self.seen.append(op.name)
        return EAGER.process(op, inputs, attrs)


def test_the_eager_interpreter_is_the_bottom():
    assert current() is EAGER and current_graph() is None
    assert state().interpreters == [] and state().interpreter is None


def test_a_pushed_interpreter_gets_every_op_of_its_thread_and_nothing_after():
    rec = Recording()
    before = ACTIVE.count
    with interpreting(rec):
        assert current() is rec
        y = fl.exp(fl.constant([0.0])) + fl.constant([1.0])      # the fast paths step aside too
        np.testing.assert_allclose(y.numpy(), [2.0])
    assert rec.seen == ["exp", "add"]
    assert ACTIVE.count == before and current() is EAGER
    fl.exp(fl.constant([0.0]))
    assert rec.seen == ["exp", "add"]


def test_an_interpreter_is_popped_when_its_block_raises():
    rec = Recording()
    before = ACTIVE.count
    with pytest.raises(ZeroDivisionError):
        with interpreting(rec):
            1 / 0
    assert ACTIVE.count == before and current() is EAGER


def test_other_threads_keep_their_own_stack():
    rec, seen_there = Recording(), []

    def other():
        seen_there.append(current())
        fl.add(fl.constant(1.0), fl.constant(2.0))

    with interpreting(rec):
        t = threading.Thread(target=other)
        t.start()
        t.join()
    assert seen_there == [EAGER] and rec.seen == []


def test_a_graph_builder_is_an_interpreter():
    g = fl.Graph("g")
    with g.as_default() as built:
        assert built is g and current_graph() is g and get_default_graph() is g
        assert isinstance(current(), GraphBuilder) and current().graph is g
        out = fl.add(fl.constant(1.0), 2.0)
        assert out.graph is g
    assert current_graph() is None and [n.op.name for n in g.nodes][-1] == "add"


def test_init_scope_runs_ops_now_inside_a_trace_and_the_trace_goes_on():
    made = {}

    @fl.function
    def f(x):
        with init_scope():
            assert current() is EAGER and current_graph() is None
            made["w"] = fl.constant([2.0]) * 3.0            # a value, not a node
        assert current_graph() is not None                  # back to the trace
        return x * made["w"]

    np.testing.assert_allclose(f(fl.constant([1.0])).numpy(), [6.0])
    assert isinstance(made["w"], fl.Tensor) and made["w"].numpy().tolist() == [6.0]
    assert fl.init_scope is init_scope


def test_init_scope_where_ops_run_now_pushes_nothing():
    before = ACTIVE.count
    with init_scope():
        assert ACTIVE.count == before and state().interpreters == []


def test_tapes_see_an_op_once_in_a_graph_and_eagerly():
    v = fl.Variable([3.0])
    with fl.GradientTape() as tape:
        y = v * v
    assert tape.gradient(y, v).numpy().tolist() == [6.0]

    @fl.function
    def grad(x):
        with fl.GradientTape() as t:
            t.watch(x)
            z = x * x
        return t.gradient(z, x)

    assert grad(fl.constant([3.0])).numpy().tolist() == [6.0]


def test_variables_updates_and_draws_are_ops_in_every_mode():
    """One path: a pushed interpreter sees reads, assignments, optimizer steps and random draws
    eagerly; a graph builder makes them nodes. The eager read keeps its value after assignments."""
    v, opt = fl.Variable([1.0, 2.0]), fl.optimizers.SGD(0.5)
    rec = Recording()
    with interpreting(rec):
        before = v.read_value()
        mine = np.array([5.0, 6.0], np.float32)
        v.assign(mine)
        mine[0] = 100.0                            # the caller's array is copied
        v.assign_add([1.0, 1.0])
        opt.apply_gradients([(fl.constant([2.0, 2.0]), v)])
        assert fl.random.uniform([3]).shape == (3,)
    assert rec.seen == ["read", "assign", "assign", "optimizer_update", "optimizer_advance", "random"]
    assert before.numpy().tolist() == [1.0, 2.0] and v.numpy().tolist() == [5.0, 6.0]
    with pytest.raises(fl.errors.InvalidArgumentError, match=r"assign_sub: variable 'Variable:0' has shape \(2,\)"):
        v.assign_sub([1.0, 2.0, 3.0])
    g = fl.Graph("g")
    with g.as_default():
        assert current().inline_calls and not current().moves_new_tensors
        with fl.name_scope("s") as prefix:
            v.assign_add(v.read_value())
            opt.apply_gradients([(fl.constant([1.0, 1.0]), v)])
            fl.random.normal([2])
    assert prefix == "s/" and [n.op.name for n in g.nodes] == [
        "read", "assign", "const", "optimizer_update", "optimizer_advance", "random"]
    assert int(opt.iterations) == 1 and v.numpy().tolist() == [5.0, 6.0]   # nothing ran yet
