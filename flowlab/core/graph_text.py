"""``Graph.pretty()``: a graph as text, one line per node, like a jaxpr. ``%3`` is node 3's value;
``^%3`` (after the inputs) a control input: node 3 runs first, its value is not read."""
from __future__ import annotations

import numpy as np


def _spec(t) -> str:
    shape = "<unknown>" if t._shape is None else ",".join("?" if d is None else str(d) for d in t._shape)
    return f"{t._dtype.name}[{shape}]"


def _attr(value) -> str:
    if isinstance(value, np.ndarray):
        return np.array2string(value, threshold=6, precision=4) if value.size <= 6 else f"<{value.dtype}{list(value.shape)}>"
    if hasattr(value, "_name") and hasattr(value, "_value"):
        return value._name                     # a Variable
    if isinstance(value, np.dtype):
        return value.name
    return repr(value)


def listing(graph, outputs=None) -> str:
    lines = []
    args = ", ".join(f"%{t.node.index}: {_spec(t)}" for t in graph.placeholders)
    lines.append(f"graph {graph.name}({args}) {{")
    for node in graph.nodes:
        if node.op.name == "placeholder":
            continue
        ins = ", ".join([f"%{t.node.index}" for t in node.inputs]
                        + [f"^%{c.index}" for c in node.control_inputs])
        attrs = {k: v for k, v in node.attrs.items()}
        controls = "".join(f" ^%{c.index}" for c in node.control_inputs)
        if node.op.name == "const":
            body = f"const {_attr(attrs.pop('value'))}{controls}"
        elif node.op.name == "read":
            body = f"read {_attr(attrs.pop('variable'))}{controls}"
        else:
            body = node.op.name + (f" {ins}" if ins else "")
            if attrs:
                body += " {" + ", ".join(f"{k}={_attr(v)}" for k, v in attrs.items()) + "}"
        where = f"  @{node.device.to_string() if hasattr(node.device, 'to_string') else node.device}" if node.device else ""
        text = f"  %{node.index} = {body}"
        lines.append(f"{text:<58} : {_spec(node.output)}{where}")
    if outputs is not None:
        lines.append("  return " + ", ".join(f"%{t.node.index}" for t in outputs))
    lines.append("}")
    return "\n".join(lines)
