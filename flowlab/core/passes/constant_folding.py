"""Constant folding: compute at compile time what depends on constants only."""
from __future__ import annotations

import numpy as np

from ..graph import CONST, PLACEHOLDER
from ._rewrite import copy_node, on_local_cpu, rewire

FOLD_LIMIT_BYTES = 1 << 20   # a larger result is folded only if no larger than its largest input


def fold_constants(nodes, fetches, feeds):
    """Run each non-stateful node whose inputs are all constants once, now, and make it a
    constant. Safe because such a node gives the same value every run: its kernel is a pure
    function of its inputs and attributes (stateful ops, such as reads, assignments and random
    draws, are never folded), and a fed tensor is never a constant, whatever op made it. A node is
    left to run time when its kernel fails (so the error comes when the graph runs, naming the
    node), when its result holds NaN or Inf (so numerics checks still name the op that made it),
    when the result would be a large array made from small ones (``broadcast_to``), and when the
    node has control inputs (made in a ``control_dependencies`` block: it must stay a node that
    runs them first). An input that the op reads only for its shape (``OpDef.shape_only``: the
    gradient of a mean over a batch of fixed size is a constant, whatever the batch holds) counts
    as a constant when its static shape is fully known: the kernel gets a stand-in of that shape."""
    consts = {n for n in nodes if n.op is CONST}
    replaced = {}
    out = []
    for n in nodes:
        ins = [replaced.get(t.node, t) for t in n.inputs]
        shape_only = _shape_only(n, ins)
        if (n.op.stateful or n.op is CONST or n.op is PLACEHOLDER or n.control_inputs or not on_local_cpu(n)
                or not all(t.node in consts or i in shape_only for i, t in enumerate(ins))):
            out.append(n)
            continue
        values = [t.node.attrs["value"] if t.node in consts else _stand_in(t) for t in ins]
        value = _evaluate(n, values)
        if value is None:
            out.append(n)
            continue
        new = copy_node(n, op=CONST, inputs=[], attrs={"value": value}, shape=value.shape, dtype=value.dtype)
        consts.add(new)
        replaced[n] = new.output
        out.append(new)
    return rewire(out, fetches, replaced)


def _shape_only(node, ins):
    """The positions of ``node``'s inputs that its kernel reads only for their (fully known) shape."""
    positions = node.op.shape_only
    if not positions:
        return ()
    return tuple(i for i in positions if i < len(ins) and ins[i]._shape is not None
                 and None not in ins[i]._shape)


def _stand_in(t):
    """A read-only array of ``t``'s static shape and dtype that uses no memory."""
    return np.broadcast_to(np.zeros((), t._dtype), t._shape)


def _evaluate(node, values):
    """The node's value, or None when it should not be folded (see fold_constants)."""
    try:
        with np.errstate(all="ignore"):
            value = node.op.kernel(*values, **node.attrs)
    except Exception:  # noqa: BLE001 - the error belongs to run time, where it names the node
        return None
    if not isinstance(value, (np.ndarray, np.generic)):
        return None
    value = np.asarray(value)
    spec = node.output
    if value.dtype != spec._dtype or spec._shape is not None and (
            value.ndim != len(spec._shape) or any(d is not None and d != v for d, v in zip(spec._shape, value.shape))):
        return None
    if value.dtype.kind in "fc" and not np.isfinite(value).all():
        return None
    if value.nbytes > FOLD_LIMIT_BYTES and value.nbytes > max((v.nbytes for v in values), default=0):
        return None
    return value
