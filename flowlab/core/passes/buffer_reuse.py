"""Buffer reuse: an elementwise node writes its result into the buffer of an input that dies there."""
from __future__ import annotations

import numpy as np

from ..execute import OpDef, get_op
from ._rewrite import copy_node, on_local_cpu, rewire
from .fusion import elementwise_node, elementwise_steps, fusable


def reuse_buffers(nodes, fetches, feeds):
    """Let an elementwise node (fused or single) write its result with ``out=`` into an input's
    buffer when that buffer is the plan's own and dead after this node: it was made in this run by
    a kernel known to return a new array (``OpDef.fresh``, or a fused kernel), this node is the
    last to read it or any value that may share its memory, it is not fetched, no stateful op has
    seen it (an assignment makes it a variable's value), and it has the result's shape and dtype.
    That saves one allocation per such node. Safe because nothing can observe the overwritten
    values: a value that may share memory with the buffer is any output of a node not known to
    return a new array (``reshape``, ``transpose``, ``getitem``, ``identity``... give views, or the
    input itself) made from it, and all of them are dead too; and in a fused kernel, whose steps run one after
    another, no other input of the node may share its memory. Fed arrays, constants and variables'
    arrays (``read`` returns the variable's own array) are never plan-owned, so never written;
    every run allocates its own buffers, so results returned by earlier runs never change.

    The same rule lets any op with an ``inplace_kernel`` (``OpDef``) write into its first input
    (an optimizer's update scales the gradient in place): the input must be plan-owned, dead
    after this node, not fetched, seen by no other stateful node, and share memory with no other
    input of the node."""
    fresh = {n for n in nodes if _fresh(n)}
    owners = {}   # node -> the plan-owned buffers its output may share memory with
    for n in nodes:
        owners[n] = {n} if n in fresh else set().union(*(owners.get(t.node, ()) for t in n.inputs))
    escaped, last_use, fetched, stateful_use = set(), {}, set(), {}
    for t in fetches:
        fetched |= owners.get(t.node, set())
    escaped |= fetched
    for i, n in enumerate(nodes):
        for t in n.inputs:
            for buffer in owners.get(t.node, ()):
                last_use[buffer] = i
                if n.op.stateful:
                    escaped.add(buffer)
                    stateful_use.setdefault(buffer, set()).add(i)
    replaced, out = {}, []
    for i, n in enumerate(nodes):
        if n.op.inplace_kernel is not None and n.inputs and on_local_cpu(n):
            t = n.inputs[0]
            if (t.node in fresh and t.node not in fetched and last_use[t.node] == i
                    and stateful_use.get(t.node, {i}) <= {i} and not _aliased(t, n.inputs, owners)
                    and all(u is not t for u in n.inputs[1:])):
                new = copy_node(n, op=_inplace_op(n.op))
                replaced[n] = new.output
                out.append(new)
                continue
        if fusable(n) or hasattr(n.op.kernel, "steps"):
            steps, inputs = elementwise_steps(n)
            donated = [k for k, t in enumerate(inputs)
                       if t.node in fresh and t.node not in escaped and last_use[t.node] == i
                       and (_one_ufunc(steps) or not _aliased(t, inputs, owners))]
            new = elementwise_node(n, steps, inputs, donated) if donated else None
            if new is not None:
                replaced[n] = new.output
                n = new
        out.append(n)
    return rewire(out, fetches, replaced)


_INPLACE_OPS: dict = {}


def _inplace_op(op):
    """The op that runs ``op.inplace_kernel`` (one per op, so plans share it)."""
    found = _INPLACE_OPS.get(op)
    if found is None:
        found = _INPLACE_OPS[op] = OpDef(op.name + "[in-place]", op.inplace_kernel, op.shape_rule,
                                         stateful=op.stateful, doc=op.doc)
    return found


def _one_ufunc(steps) -> bool:
    # NOTE: a fused kernel may write into a donated input before a later step reads another input
    # that is a view of it; one ufunc reads all its operands first (numpy copies overlapping ones).
    return len(steps) == 1 and isinstance(get_op(steps[0][0]).elementwise, np.ufunc)


def _aliased(t, inputs, owners) -> bool:
    """Whether another of ``inputs`` may share memory with ``t``'s buffer."""
    return any(t.node in owners.get(u.node, ()) for u in inputs if u is not t)


def _fresh(node) -> bool:
    return bool(node.output._shape) and on_local_cpu(node) and (node.op.fresh or hasattr(node.op.kernel, "steps"))
