"""``tf.gradients``: gradient nodes built into the graph by a backward walk over its nodes.

A GradientTape records ops as they are made, so it cannot differentiate a graph built before
the tape opened. But a graph already is a record: its nodes, in the order they were made, are
the tape. ``gradients(ys, xs)`` walks them backwards, from the ys to the xs, and for each node on
a path calls its op's gradient rule (the same table entry eager autodiff uses) with graph tensors,
so the rule adds the gradient's nodes to the graph. The result is an ordinary graph tensor,
computed by the session like any other.

A variable among the xs is read by ``read`` nodes (one per use); its gradient is the sum of the
gradients flowing into its reads.
"""
from __future__ import annotations

import numpy as np

from ..core.execute import Call
from ..core.graph import READ, GraphTensor
from ..core.ops import math_ops
from ..core.tensor import Tensor
from ..core.tensor import Variable as _CoreVariable
from ..core.tensor import constant as _constant
from ._graphs import building, get_default_graph

__all__ = ["gradients"]


def gradients(ys, xs, grad_ys=None, name="gradients", stop_gradients=None, unconnected_gradients="none", **_unused):
    """Graph tensors for d(sum of ys)/d(x) for each x in ``xs`` (tensors or variables).

    ``grad_ys``: weights for each y (default: ones, i.e. the sum). A list comes back, one entry per
    x: None where no y depends on that x (or with ``unconnected_gradients="zero"``, zeros), and
    None for integer xs. Paths through ``stop_gradients`` tensors (and ops with no gradient rule)
    carry no gradient.

    >>> import flowlab.compat.v1 as tf
    >>> g = tf.Graph()
    >>> with g.as_default():
    ...     x = tf.placeholder(tf.float32, [3])
    ...     y = tf.reduce_sum(x * x)
    ...     (dx,) = tf.gradients(y, [x])
    >>> with tf.Session(graph=g) as sess:
    ...     print(sess.run(dx, {x: [1.0, 2.0, 3.0]}))
    [2. 4. 6.]
    """
    ys, xs = _as_list(ys), _as_list(xs)
    graph = _graph_of(ys, xs)
    with building(graph):
        ys = [_as_graph_tensor(graph, y, "ys") for y in ys]
        seeds = _seeds(graph, ys, grad_ys)
        stops = {id(t.node) for t in _as_list(stop_gradients or [])}
        var_sources = {id(x) for x in xs if isinstance(x, _CoreVariable)}
        sources = {id(x.node) for x in xs if isinstance(x, GraphTensor)}
        for x in xs:
            if not isinstance(x, (GraphTensor, _CoreVariable)):
                raise TypeError(f"gradients: xs must be graph tensors or variables, not {type(x).__name__}")
        last = max(y.node.index for y in ys)
        nodes = graph.nodes[:last + 1]   # gradient nodes are appended while walking: walk the forward part
        reached = _depends_on_sources(nodes, sources, var_sources, stops)
        grads: dict = {}              # id(node) -> gradient of its output
        var_grads: dict = {}          # id(variable) -> gradient
        for y, seed in zip(ys, seeds):
            _accumulate(grads, id(y.node), seed)
        for node in reversed(nodes):
            g = grads.get(id(node))
            if g is None or id(node) not in reached:
                continue
            if node.op is READ:
                variable = node.attrs["variable"]
                if id(variable) in var_sources:
                    _accumulate(var_grads, id(variable), g)
                continue
            if node.op.grad is None or id(node) in stops:
                continue
            needs = [id(t.node) in reached and _is_float(t) for t in node.inputs]
            if not any(needs):
                continue
            in_grads = node.op.grad(Call(node.inputs, node.attrs, node.output, needs), g)
            for t, gx, need in zip(node.inputs, in_grads, needs):
                if need and gx is not None:
                    _accumulate(grads, id(t.node), gx)
        result = []
        for x in xs:
            g = var_grads.get(id(x)) if isinstance(x, _CoreVariable) else grads.get(id(x.node))
            if not x.dtype.is_floating:
                g = None
            if g is None and str(getattr(unconnected_gradients, "value", unconnected_gradients)).lower() == "zero":
                g = math_ops.zeros_like(x)
            result.append(g)
    return result


def _as_list(x):
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _graph_of(ys, xs):
    for t in (*ys, *xs):
        if isinstance(t, GraphTensor):
            return t.graph
        if isinstance(t, _CoreVariable) and getattr(t, "graph", None) is not None:
            return t.graph
    return get_default_graph()


def _as_graph_tensor(graph, y, what):
    if isinstance(y, _CoreVariable):
        return y.value() if getattr(y, "graph", None) is graph else graph.read(y)
    if not isinstance(y, GraphTensor):
        raise TypeError(f"gradients: {what} must be graph tensors, not {type(y).__name__}")
    if y.graph is not graph:
        raise ValueError(f"gradients: {y.name} belongs to graph {y.graph.name!r}, not {graph.name!r}")
    return y


def _seeds(graph, ys, grad_ys):
    if grad_ys is None:
        return [math_ops.ones_like(y) for y in ys]
    grad_ys = _as_list(grad_ys)
    if len(grad_ys) != len(ys):
        raise ValueError(f"gradients: {len(grad_ys)} grad_ys for {len(ys)} ys")
    out = []
    for y, g in zip(ys, grad_ys):
        if g is None:
            g = math_ops.ones_like(y)
        elif not isinstance(g, Tensor):
            g = graph.constant(_constant(np.asarray(g), dtype=y.dtype))
        out.append(g)
    return out


def _depends_on_sources(nodes, sources, var_sources, stops):
    """ids of the nodes whose output depends on an x (nodes are in the order they were made)."""
    reached = set()
    for node in nodes:
        if id(node) in stops:
            continue
        if id(node) in sources or (node.op is READ and id(node.attrs["variable"]) in var_sources) \
                or any(id(t.node) in reached for t in node.inputs):
            reached.add(id(node))
    return reached


def _is_float(t):
    return t._dtype.kind == "f"


def _accumulate(grads, key, g):
    prev = grads.get(key)
    grads[key] = g if prev is None else prev + g
