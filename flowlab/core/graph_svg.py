"""``Graph.to_svg()``: a graph drawn as one self-contained SVG (no script, no external font or CSS),
so it shows in JupyterLab, on GitHub and in a browser alike.

- One rounded box per node, filled by the device it was placed on (the default CPU:0 light grey,
  every other device its own colour), with a legend of the devices present. A box reads
  ``op`` (or ``read VAR``, ``const VALUE``, ``placeholder NAME``) over ``%index  dtype[shape]``;
  hovering shows the node's line of ``Graph.pretty()`` and the source line that made it.
- Top to bottom, one row per layer, like the listing and the program: a node's layer is the longest
  path to it from the graph's inputs. A node without inputs that is not a placeholder (a variable
  read, a constant) sits in the row just above its first user, not at the top of the page.
  Within a row, a node goes under the mean position of its inputs (pushed right to avoid overlap),
  so a chain of ops is a straight column.
- Arrows run from each input to the node, one per input in argument order, entering the box from
  left to right. An arrow between two devices is dashed: there the value is copied.
- Graphs of more than MAX_NODES nodes are still drawn, without their constants.

Deterministic: the same graph gives the same text, so notebook tests can compare it.
"""
from __future__ import annotations

import re
from xml.sax.saxutils import escape

from .graph_text import _attr, _spec, listing

MAX_NODES = 80
FONT = "ui-monospace, SFMono-Regular, Menlo, Consolas, 'DejaVu Sans Mono', 'Liberation Mono', monospace"
CHAR_W, SMALL_W = 7.3, 6.1          # px per character of the 12 px and 10 px monospace text
BOX_H, ROW_GAP, GAP, PAD, LABEL_MAX = 36, 40, 18, 16, 30
DEFAULT_FILL = "#e5e7eb"             # the default device, /job:localhost/replica:0/task:0/device:CPU:0
FILLS = {"CPU": ("#93c5fd", "#86efac", "#67e8f9", "#a5b4fc", "#bef264", "#5eead4"),   # blues and greens
         "GPU": ("#fdba74", "#f9a8d4", "#fde047", "#fca5a5", "#d8b4fe", "#fcd34d")}   # warm colours
DASH = ' stroke-dasharray="5 3"'
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f]")


def _t(text) -> str:
    """XML-escaped text (also for attribute values); characters XML cannot hold become '?'."""
    return escape(_CONTROL.sub("?", str(text)), {'"': "&quot;"})


def _n(x) -> str:
    return f"{x:.1f}".rstrip("0").rstrip(".")


def _short(text, limit=LABEL_MAX) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 1] + "\u2026"


def _device(node):
    """(sort key, legend label) of the device a node runs on; unset fields are this process's."""
    from .device import _LOCAL
    full = _LOCAL.make_merged_spec(node.device) if node.device else _LOCAL
    local = (full.job, full.replica, full.task) == (_LOCAL.job, _LOCAL.replica, _LOCAL.task)
    label = f"{full.device_type}:{full.device_index}" if local else full.to_string()
    return (not local, full.job, full.replica, full.task, full.device_type, full.device_index), label


def _label(node) -> str:
    kind = node.op.name
    if kind == "const":
        return _short(f"const {_attr(node.attrs['value'])}")
    if kind == "placeholder":
        return _short(f"placeholder {node.attrs.get('name', node.name)}")
    if "variable" in node.attrs:                            # assign, optimizer_update: which variable
        return _short(f"{kind} {_attr(node.attrs['variable'])}")
    return _short(kind)


def _layout(nodes):
    """{index: (row, x of the box's left edge)} and each node's box width."""
    drawn = {n.index for n in nodes}
    ins = {n.index: [t.node.index for t in n.inputs if t.node.index in drawn] for n in nodes}
    users = {n.index: [] for n in nodes}
    for n in nodes:
        for i in ins[n.index]:
            users[i].append(n.index)
    layer = {}
    for n in nodes:                                          # indices are a topological order
        layer[n.index] = 1 + max(layer.get(i, 0) for i in ins[n.index]) if ins[n.index] else 0
    for n in reversed(nodes):
        if not ins[n.index] and n.op.name != "placeholder" and users[n.index]:
            layer[n.index] = max(0, min(layer[u] for u in users[n.index]) - 1)
    width = {n.index: max(64, len(_label(n)) * CHAR_W + 16, len(_sub(n)) * SMALL_W + 16) for n in nodes}
    rows = {}
    for n in nodes:
        rows.setdefault(layer[n.index], []).append(n.index)
    centre, place = {}, {}
    for r in sorted(rows):
        want = {}
        for i in rows[r]:                                   # under the mean of its inputs
            xs = [centre[j] for j in ins[i] if j in centre]
            if xs:
                want[i] = sum(xs) / len(xs)
        for i in rows[r]:                                   # a read or constant: next to its user's inputs
            if i not in want and users[i]:
                xs = [want[j] for j in ins[users[i][0]] if j in want]
                if xs:
                    want[i] = sum(xs) / len(xs) + 0.5
        right = None
        for i in sorted(rows[r], key=lambda i: (want.get(i, i * 1e-3), i)):
            left = want.get(i, 0) - width[i] / 2
            if right is not None:
                left = max(left, right + GAP)
            place[i], centre[i], right = (r, left), left + width[i] / 2, left + width[i]
    shift = PAD - min(x for _, x in place.values())
    return {i: (r, x + shift) for i, (r, x) in place.items()}, width


def _sub(node) -> str:
    return f"%{node.index}  {_spec(node.output)}"


def _titles(graph, nodes, returned):
    lines = {}
    for line in listing(graph).splitlines():
        m = re.match(r"\s*%(\d+) = ", line)
        if m:
            lines[int(m.group(1))] = line.strip()
    out = {}
    for n in nodes:
        head = lines.get(n.index) or f"%{n.index} = {n.op.name}: {_spec(n.output)}  (input {n.attrs.get('name', n.name)})"
        out[n.index] = "\n".join([head, f"source: {n.source or 'unknown'}"] + (["returned"] if n.index in returned else []))
    return out


def render(graph, outputs=None) -> str:
    """The graph as an SVG document (a str); ``outputs``: graph tensors to mark as returned."""
    nodes = list(graph.nodes)
    elided = 0
    if len(nodes) > MAX_NODES:
        kept = [n for n in nodes if n.op.name != "const"]
        elided, nodes = len(nodes) - len(kept), kept
    returned = {t.node.index for t in (outputs or []) if getattr(t, "graph", None) is graph}
    place, width = _layout(nodes)
    devices = {n.index: _device(n) for n in nodes}
    fills, counts = {}, {}
    for key, label in sorted(set(devices.values())):
        if label == "CPU:0":
            fills[label] = DEFAULT_FILL
        else:
            k = counts[key[4]] = counts.get(key[4], -1) + 1
            fills[label] = FILLS[key[4]][k % len(FILLS[key[4]])]
    top = PAD + 26
    y = {i: top + r * (BOX_H + ROW_GAP) for i, (r, _) in place.items()}
    graph_w = max((place[i][1] + width[i] for i in place), default=PAD) + PAD
    graph_h = max(y.values(), default=top) + BOX_H + PAD
    cross = any(devices[t.node.index][1] != devices[n.index][1] for n in nodes for t in n.inputs
                if t.node.index in place)
    legend = [(fills[lab], lab + (" (default)" if lab == "CPU:0" else "")) for _, lab in sorted(set(devices.values()))]
    notes = (["thick border: returned"] if returned else []) + (["dashed arrow: crosses devices"] if cross else [])
    legend_w = max([len(t) * SMALL_W + 40 for _, t in legend] + [len(t) * SMALL_W + 16 for t in notes] + [90])
    w, h = graph_w + legend_w + PAD, max(graph_h, top + 22 * (len(legend) + len(notes) + 1) + PAD)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{_n(w)}" height="{_n(h)}" viewBox="0 0 {_n(w)} {_n(h)}" '
           f'font-family="{_t(FONT)}" font-size="12">',
           f"<title>{_t(f'graph {graph.name}: {len(graph.nodes)} nodes')}</title>",
           '<defs><marker id="fl-arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" '
           'orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#4b5563"/></marker></defs>',
           f'<rect width="{_n(w)}" height="{_n(h)}" fill="#ffffff"/>',
           f'<text x="{PAD}" y="{PAD + 12}" font-size="13" font-weight="bold" fill="#111827">{_t("graph " + graph.name)}'
           + (f' <tspan font-weight="normal" fill="#6b7280">({elided} constants not drawn)</tspan>' if elided else "")
           + "</text>"]
    for n in nodes:                                         # arrows first: boxes sit on top of them
        drawn_ins = [t.node.index for t in n.inputs if t.node.index in place]
        for k, i in enumerate(drawn_ins):
            sx, sy = place[i][1] + width[i] / 2, y[i] + BOX_H
            tx, ty = place[n.index][1] + width[n.index] * (k + 1) / (len(drawn_ins) + 1), y[n.index]
            bend = min(ROW_GAP, (ty - sy) / 2) if ty > sy else ROW_GAP
            dashed = devices[i][1] != devices[n.index][1]
            out.append(f'<path class="edge{" cross" if dashed else ""}" d="M{_n(sx)},{_n(sy)} C{_n(sx)},{_n(sy + bend)} '
                       f'{_n(tx)},{_n(ty - bend)} {_n(tx)},{_n(ty - 1)}" fill="none" '
                       f'stroke="{"#b91c1c" if dashed else "#6b7280"}" stroke-width="1.3"'
                       f'{DASH if dashed else ""} marker-end="url(#fl-arrow)"/>')
    titles = _titles(graph, nodes, returned)
    for n in nodes:
        x, yy, bw = place[n.index][1], y[n.index], width[n.index]
        edge = ('stroke="#111827" stroke-width="2.6"' if n.index in returned else 'stroke="#4b5563" stroke-width="1"')
        out.append(f'<g class="node" id="node-{n.index}"><title>{_t(titles[n.index])}</title>'
                   f'<rect x="{_n(x)}" y="{_n(yy)}" width="{_n(bw)}" height="{BOX_H}" rx="7" ry="7" '
                   f'fill="{fills[devices[n.index][1]]}" {edge}/>'
                   f'<text x="{_n(x + bw / 2)}" y="{_n(yy + 15)}" text-anchor="middle" fill="#111827">{_t(_label(n))}</text>'
                   f'<text x="{_n(x + bw / 2)}" y="{_n(yy + 29)}" text-anchor="middle" font-size="10" '
                   f'fill="#4b5563">{_t(_sub(n))}</text></g>')
    lx, ly = graph_w + PAD / 2, top
    out.append(f'<g class="legend"><text x="{_n(lx)}" y="{_n(ly + 10)}" font-weight="bold" fill="#111827">devices</text>')
    for k, (fill, text) in enumerate(legend):
        yy = ly + 22 * (k + 1)
        out.append(f'<rect class="swatch" x="{_n(lx)}" y="{_n(yy)}" width="16" height="14" rx="3" fill="{fill}" '
                   f'stroke="#4b5563" stroke-width="1"/><text x="{_n(lx + 24)}" y="{_n(yy + 11)}" font-size="11" '
                   f'fill="#111827">{_t(text)}</text>')
    for k, text in enumerate(notes):
        yy = ly + 22 * (len(legend) + k + 1)
        out.append(f'<text x="{_n(lx)}" y="{_n(yy + 11)}" font-size="10" fill="#4b5563">{_t(text)}</text>')
    out.append("</g></svg>")
    return "\n".join(out)
