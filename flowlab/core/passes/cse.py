"""Common-subexpression elimination: compute each distinct expression once."""
from __future__ import annotations

import numpy as np

from ..graph import PLACEHOLDER
from ._rewrite import rewire

_PLAIN = (type(None), bool, int, str, bytes, np.dtype, type, type(Ellipsis))


def eliminate_common_subexpressions(nodes, fetches, feeds):
    """Keep one of any two non-stateful nodes with the same op, the same inputs, the same device
    and equal attributes (and the same control inputs), and let the later one's consumers (and fetches) use the earlier one's
    output. Constants count as equal when their dtype, shape and bytes are, so ``x * 2`` written
    twice becomes one node even though each ``2`` became its own constant. Safe because such nodes
    compute the same value (a pure kernel of the same arguments), the earlier one runs first, and
    tensors are never written to after they are made (buffer reuse, which runs later, knows when a
    merged value has several readers). Attributes compare by value for plain data (numbers by type
    and repr, so 0.0 and -0.0 differ; arrays by dtype, shape and bytes) and by identity otherwise."""
    seen = {}
    replaced = {}
    out = []
    for n in nodes:
        if n.op.stateful or n.op is PLACEHOLDER:
            out.append(n)
            continue
        key = (n.op, _freeze(n.device), _freeze(n.attrs),
               tuple(_current(t, replaced).node for t in n.inputs),
               tuple(_current(c.output, replaced).node for c in n.control_inputs))
        first = seen.get(key)
        if first is None:
            seen[key] = n
            out.append(n)
        else:
            replaced[n] = first.output
    return rewire(out, fetches, replaced)


def _current(t, replaced):
    while t.node in replaced:
        t = replaced[t.node]
    return t


def _freeze(value):
    """A hashable key that is equal only for attribute values that are surely equal."""
    if isinstance(value, float) or isinstance(value, complex):
        return (type(value), repr(value))
    if isinstance(value, _PLAIN):
        return (type(value), value)
    if isinstance(value, (np.ndarray, np.generic)):
        return ("array", value.dtype.str, value.shape, np.ascontiguousarray(value).tobytes())
    if isinstance(value, (tuple, list)):
        return (type(value), tuple(_freeze(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple(sorted((repr(k), _freeze(v)) for k, v in value.items())))
    if isinstance(value, slice):
        return ("slice", _freeze(value.start), _freeze(value.stop), _freeze(value.step))
    return ("object", id(value))
