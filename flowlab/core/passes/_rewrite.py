"""What the passes share: copying a node (a pass never changes the user's nodes), rewiring the
node list after some nodes were replaced, and who consumes what."""
from __future__ import annotations

import numpy as np

from ..graph import GraphTensor, Node


def copy_node(node: Node, shape=None, dtype=None, **fields) -> Node:
    """A new Node with ``node``'s fields except those given, and an output tensor of its own
    (with ``node``'s shape and dtype unless ``shape``/``dtype`` say otherwise)."""
    new = Node()
    for field in Node.__slots__:
        if field != "output":
            setattr(new, field, fields.get(field, getattr(node, field)))
    new.inputs, new.attrs, new.control_inputs = list(new.inputs), dict(new.attrs), list(new.control_inputs)
    old = node.output
    out = object.__new__(GraphTensor)
    out._device, out.graph, out.node = old._device, old.graph, new
    out._shape = old._shape if shape is None else tuple(shape)
    out._dtype = old._dtype if dtype is None else np.dtype(dtype)
    new.output = out
    return new


def rewire(nodes, fetches, replaced):
    """Point every input and fetch at the current tensor. ``replaced`` maps an old node to the
    tensor that now stands for its output; a node whose inputs change is copied (and its copy
    stands for it in turn). Control inputs follow their replacements too. Returns ``(nodes, fetches)``."""
    def current(t):
        while t.node in replaced:
            t = replaced[t.node]
        return t

    out = []
    for n in nodes:
        inputs = [current(t) for t in n.inputs]
        controls = [current(c.output).node for c in n.control_inputs] if n.control_inputs else n.control_inputs
        if any(a is not b for a, b in zip(inputs, n.inputs)) or any(
                a is not b for a, b in zip(controls, n.control_inputs)):
            new = copy_node(n, inputs=inputs, control_inputs=list(dict.fromkeys(controls)))
            replaced[n] = new.output
            n = new
        out.append(n)
    return out, [current(t) for t in fetches]


def consumers(nodes) -> dict:
    """node -> the nodes of ``nodes`` that read its output or have it as a control input (once
    each, in program order): a node that another one must wait for is not merged away."""
    users = {n: [] for n in nodes}
    for n in nodes:
        for p in dict.fromkeys([t.node for t in n.inputs] + n.control_inputs):
            if p in users:
                users[p].append(n)
    return users


def on_local_cpu(node) -> bool:
    """Passes that change kernels (folding, fusion, buffer reuse) touch only nodes that run on this
    process's CPU with numpy: a GPU or another task runs kernels of its own."""
    d = node.device
    if d is None or (hasattr(d, "device_type") and not d):
        return True
    return (getattr(d, "device_type", "?") in (None, "CPU") and getattr(d, "job", None) in (None, "localhost")
            and getattr(d, "task", None) in (None, 0))
