"""The placement graph of a traced function or a graph: where every op runs, and what crosses devices.

``fl.debugging.placement_graph(f, x, y)`` (or a ``ConcreteFunction`` or a ``Graph`` shown as a cell's
last expression) gives a :class:`PlacementGraph`, a plain object:

- one box per node, filled with the colour of its device (the default ``CPU:0`` light grey), with a
  stripe of its task's colour on the left when the graph spans several tasks
  (``/job:worker/task:1``); the legend lists tasks and their devices;
- an arrow per input; an arrow between two devices is dashed red and labelled with the bytes the
  copy moves, from the static shape and dtype (``?`` where a dimension is unknown);
- hover (a ``<title>`` in the static picture, a tooltip in the widget): op, name, input and output
  shapes and dtypes, device, and the user's source line that made the node;
- name scopes fold: a folded scope is one box with its node count. A graph of more than
  ``FOLD_AT`` nodes starts with its top-level scopes folded; ``unfold(scope)``/``fold(scope)``
  (or a click in the widget) change that.

The layout is computed here, so the static SVG (``_repr_html_``, what GitHub and a notebook opened
without its kernel show) and the widget (``placement.js``, which draws ``snapshot()``) draw the same
picture: layers by longest path from the inputs (a node without inputs sits just above its first
user), then a few barycentre sweeps to cut crossings, then x positions under the inputs' centre.
Everything is ordered by node index, never by ids or hashes: the same graph gives the same text.
"""
from __future__ import annotations

from xml.sax.saxutils import escape

import numpy as np

from ..core.device import DEFAULT_DEVICE, DeviceSpec, as_spec
from ..core.errors import did_you_mean
from ..core.function import ConcreteFunction, Function
from ..core.graph import Graph

__all__ = ["PlacementGraph", "placement_graph", "static_html", "FOLD_AT"]

FOLD_AT = 60          # more nodes than this: top-level scopes start folded
MAX_DRAWN = 400       # at most this many boxes are drawn; the rest are counted
SWEEPS = 4            # barycentre passes (down and up) to cut crossings
BOX_H, ROW_GAP, GAP, PAD, LABEL_MAX = 36, 46, 18, 16, 30
CHAR_W, SMALL_W = 7.3, 6.1
FONT = "ui-monospace, SFMono-Regular, Menlo, Consolas, 'DejaVu Sans Mono', 'Liberation Mono', monospace"
DEFAULT_FILL = "#e5e7eb"
FILLS = ("#93c5fd", "#fdba74", "#86efac", "#f9a8d4", "#c4b5fd", "#fde047", "#67e8f9", "#fca5a5",
         "#bef264", "#d8b4fe")
TASK_COLOURS = ("#1d4ed8", "#c2410c", "#15803d", "#7e22ce", "#be123c", "#0f766e", "#a16207", "#334155")
CROSS, PLAIN, CONTROL = "#b91c1c", "#6b7280", "#9ca3af"
_LOCAL = DeviceSpec.from_string(DEFAULT_DEVICE)
_LOCAL_TASK = "/job:localhost/replica:0/task:0"


def fmt_bytes(n) -> str:
    """'1.50 KiB' (as the widgets' fmtBytes), '?' for unknown."""
    if n is None:
        return "?"
    units, i, v = ("B", "KiB", "MiB", "GiB", "TiB"), 0, float(n)
    while v >= 1024 and i < len(units) - 1:
        v, i = v / 1024, i + 1
    return f"{int(n)} B" if i == 0 else f"{v:.2f} {units[i]}" if v < 10 else f"{v:.1f} {units[i]}"


def _spec(t) -> str:
    shape = t.shape
    dims = "<unknown>" if shape.rank is None else ",".join("?" if d is None else str(d) for d in shape)
    return f"{t.dtype.name}[{dims}]"


def _nbytes(t):
    shape = t.shape
    if shape.rank is None or any(d is None for d in shape):
        return None
    return int(np.prod([int(d) for d in shape], dtype=np.int64)) * t.dtype.size


def _short(text, limit=LABEL_MAX) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 1] + "\u2026"


def _label(node) -> str:
    kind, attrs = node.op.name, node.attrs
    if kind == "placeholder":
        return _short(f"input {attrs.get('name') or node.name}")
    variable = attrs.get("variable")
    if variable is not None:
        return _short(f"{kind} {getattr(variable, 'name', variable)}".replace(":0", ""))
    if kind == "const":
        value = attrs.get("value")
        if isinstance(value, np.ndarray) and value.size == 1:
            return _short(f"const {value.reshape(()).item():.4g}" if value.dtype.kind == "f"
                          else f"const {value.reshape(()).item()}")
    return _short(kind)


def _where(node):
    """(task, device label, full device string) of a node; unset fields are this process's."""
    full = _LOCAL.make_merged_spec(as_spec(node.device)) if node.device else _LOCAL
    task = f"/job:{full.job}/replica:{full.replica}/task:{full.task}"
    return task, f"{full.device_type}:{full.device_index}", full.to_string()


def _scopes(name):
    """The name scopes of a node name, outermost first: 'a/b/c' -> ['a/', 'a/b/']."""
    parts = name.split("/")[:-1]
    return ["/".join(parts[:k]) + "/" for k in range(1, len(parts) + 1)]


def _t(text) -> str:
    return escape("".join(c if c >= " " or c in "\n\t" else "?" for c in str(text)), {'"': "&quot;"})


def _n(x) -> str:
    return f"{x:.1f}".rstrip("0").rstrip(".")


class PlacementGraph:
    """The placement of a graph's nodes on tasks and devices, drawn as a layered graph (see the
    module docstring). ``graph``: a ``Graph`` (core or ``compat.v1``); ``outputs``: the tensors
    it returns (marked); ``fold_at``: fold top-level scopes above this many nodes."""

    _view = "flowlab.widgets.placement_view:PlacementView"

    def __init__(self, graph, outputs=None, *, title=None, fold_at=FOLD_AT):
        if not isinstance(graph, Graph):
            raise TypeError(f"PlacementGraph takes a Graph, not {type(graph).__name__}; use "
                            "fl.debugging.placement_graph(f, *args) for a function")
        self.graph = graph
        self.outputs = list(outputs or [])
        self.title = title or f"graph {graph.name}"
        self.fold_at = fold_at
        self._version = None
        self._folded: set = set()
        self._scope_names: list = []
        self._auto = True         # folding not chosen by the user yet: follow the graph's size
        self._cache = None

    # -- folding ---------------------------------------------------------------------------------
    @property
    def scopes(self) -> list:
        """Every name scope in the graph ('layer/', 'layer/dense/'), sorted."""
        self._build()
        return list(self._scope_names)

    @property
    def folded(self) -> list:
        """The scopes drawn as one box each, sorted."""
        self._build()
        return sorted(self._folded)

    def _scope(self, scope) -> str:
        scope = str(scope)
        scope = scope if scope.endswith("/") else scope + "/"
        if scope not in self._scope_names:
            raise ValueError(f"graph {self.graph.name!r} has no name scope {scope!r}"
                             + did_you_mean(scope, self._scope_names))
        return scope

    def fold(self, scope=None):
        """Draw ``scope`` (a name scope, 'layer' or 'layer/') as one box; no scope: every top-level
        scope. Returns self."""
        self._build()
        if scope is None:
            self._folded = {s for s in self._scope_names if s.count("/") == 1}
        else:
            self._folded.add(self._scope(scope))
        self._auto, self._cache = False, None
        return self

    def unfold(self, scope=None):
        """Draw the nodes of ``scope`` again (its own sub-scopes stay folded in a large graph); no
        scope: unfold everything. Returns self."""
        self._build()
        if scope is None:
            self._folded = set()
        else:
            scope = self._scope(scope)
            self._folded = {s for s in self._folded if not scope.startswith(s)}
            if len(self.graph.nodes) > self.fold_at:
                depth = scope.count("/") + 1
                self._folded |= {s for s in self._scope_names if s.startswith(scope) and s.count("/") == depth}
        self._auto, self._cache = False, None
        return self

    # -- the model -------------------------------------------------------------------------------
    def _build(self):
        graph = self.graph
        if self._version == (graph.version, len(graph.nodes)) and self._cache is not None:
            return self._cache
        if self._version != (graph.version, len(graph.nodes)):
            self._version = (graph.version, len(graph.nodes))
            self._scope_names = sorted({s for n in graph.nodes for s in _scopes(n.name)})
            if self._auto:
                self._folded = ({s for s in self._scope_names if s.count("/") == 1}
                                if len(graph.nodes) > self.fold_at else set())
            else:
                self._folded &= set(self._scope_names)
        self._cache = self._model()
        return self._cache

    def _model(self):
        nodes = list(self.graph.nodes)
        where = {n.index: _where(n) for n in nodes}
        returned = {t.node.index for t in self.outputs if getattr(t, "graph", None) is self.graph}
        tasks = sorted({w[0] for w in where.values()}, key=lambda t: (t != _LOCAL_TASK, t))
        devices = sorted({(w[0], w[1], w[2]) for w in where.values()},
                         key=lambda d: (tasks.index(d[0]), d[1]))
        fills, k = {}, 0
        for task, label, full in devices:
            if full == _LOCAL.to_string():
                fills[full] = DEFAULT_FILL
            else:
                fills[full], k = FILLS[k % len(FILLS)], k + 1
        task_colour = {t: TASK_COLOURS[i % len(TASK_COLOURS)] for i, t in enumerate(tasks)}

        # what is drawn: a node, or the folded scope it is in (its outermost folded scope)
        rep = {}
        for n in nodes:
            scope = next((s for s in _scopes(n.name) if s in self._folded), None)
            rep[n.index] = f"scope:{scope}" if scope else f"n{n.index}"
        items, members = {}, {}
        for n in nodes:
            r = rep[n.index]
            members.setdefault(r, []).append(n)
            if r not in items:
                items[r] = {"id": r, "first": n.index}
        order = sorted(items, key=lambda r: items[r]["first"])
        left_out = max(0, len(order) - MAX_DRAWN)
        order = order[:MAX_DRAWN]
        drawn = set(order)

        # edges between drawn items: data (with bytes when crossing devices) and control
        edges, by_pair = [], {}
        for n in nodes:
            b = rep[n.index]
            for pos, t in enumerate(n.inputs):
                a = rep[t.node.index]
                if a == b or a not in drawn or b not in drawn:
                    continue
                cross = where[t.node.index][2] != where[n.index][2]
                e = by_pair.get((a, b))
                if e is None:
                    e = by_pair[(a, b)] = {"from": a, "to": b, "cross": False, "bytes": 0, "unknown": False,
                                           "control": False, "count": 0}
                    edges.append(e)
                e["count"] += 1
                if cross:
                    size = _nbytes(t)
                    e["cross"] = True
                    e["unknown"] |= size is None
                    e["bytes"] += size or 0
            for c in n.control_inputs:
                a = rep[c.index]
                if a != b and a in drawn and b in drawn and (a, b) not in by_pair:
                    e = by_pair[(a, b)] = {"from": a, "to": b, "cross": False, "bytes": 0, "unknown": False,
                                           "control": True, "count": 1}
                    edges.append(e)
        for e in edges:
            e["label"] = (fmt_bytes(e["bytes"]) + ("+?" if e["bytes"] else "") if e["unknown"] and e["bytes"]
                          else "?" if e["unknown"] else fmt_bytes(e["bytes"])) if e["cross"] else ""

        consumers = {n.index: [] for n in nodes}
        for n in nodes:
            for t in n.inputs:
                if n.index not in consumers[t.node.index]:
                    consumers[t.node.index].append(n.index)
        by_index = {n.index: n for n in nodes}
        out = []
        for r in order:
            group = members[r]
            if r.startswith("scope:"):
                scope = r[6:]
                places = sorted({where[n.index][2] for n in group})
                full = places[0] if len(places) == 1 else None
                task = where[group[0].index][0] if len({where[n.index][0] for n in group}) == 1 else None
                ops = {}
                for n in group:
                    ops[n.op.name] = ops.get(n.op.name, 0) + 1
                top = sorted(ops.items(), key=lambda kv: (-kv[1], kv[0]))[:6]
                item = {"id": r, "kind": "scope", "scope": scope, "count": len(group),
                        "label": _short(f"\u25b8 {scope} ({len(group)} nodes)"),
                        "sub": full.split("/device:")[-1] if full else f"{len(places)} devices",
                        "device": full, "task": task, "fill": fills[full] if full else "#ffffff",
                        "stripe": task_colour[task] if task and len(tasks) > 1 else None,
                        "returned": any(n.index in returned for n in group),
                        "hover": "\n".join([f"name scope {scope}: {len(group)} nodes (click to unfold)",
                                            "ops: " + ", ".join(f"{k} x{v}" for k, v in top)
                                            + (", ..." if len(ops) > len(top) else ""),
                                            "devices: " + ", ".join(places)])}
            else:
                n = group[0]
                task, label, full = where[n.index]
                ins = []
                for t in n.inputs:
                    src = t.node
                    cross = where[src.index][2] != full
                    ins.append({"id": rep[src.index], "name": src.name, "op": src.op.name, "spec": _spec(t),
                                "device": where[src.index][1] if where[src.index][0] == task else where[src.index][2],
                                "bytes": fmt_bytes(_nbytes(t)) if cross else None})
                outs = [{"id": rep[c], "name": by_index[c].name, "op": by_index[c].op.name,
                         "device": where[c][1] if where[c][0] == task else where[c][2]}
                        for c in consumers[n.index]]
                hover = [f"{n.op.name}  {n.name}",
                         *(f"in {k}: {i['spec']}  from {i['name']} ({i['op']})" for k, i in enumerate(ins)),
                         f"out: {_spec(n.output)}",
                         f"device: {full}",
                         f"source: {n.source or 'unknown'}"]
                if n.control_inputs:
                    hover.insert(len(ins) + 1, "after: " + ", ".join(c.name for c in n.control_inputs))
                item = {"id": r, "kind": "node", "index": n.index, "name": n.name, "op": n.op.name,
                        "label": _label(n), "sub": f"%{n.index}  {_spec(n.output)}",
                        "shape": _spec(n.output), "device": full, "task": task, "device_label": label,
                        "fill": fills[full], "stripe": task_colour[task] if len(tasks) > 1 else None,
                        "source": n.source, "returned": n.index in returned,
                        "inputs": ins, "consumers": outs, "hover": "\n".join(hover)}
            item["w"] = round(max(64, len(item["label"]) * CHAR_W + 18, len(item["sub"]) * SMALL_W + 18), 1)
            item["first"] = items[r]["first"]
            out.append(item)
        self._layout(out, edges)
        for item in out:
            item.pop("first")
        legend = []
        for task in tasks:
            legend.append({"task": task, "colour": task_colour[task],
                           "devices": [{"label": lab, "device": full, "fill": fills[full],
                                        "default": full == _LOCAL.to_string()}
                                       for t, lab, full in devices if t == task]})
        crossing = [e for e in edges if e["cross"]]
        return {"nodes": out, "edges": edges, "legend": legend, "multi_task": len(tasks) > 1,
                "crossing": len(crossing), "left_out": left_out,
                "moved": fmt_bytes(sum(e["bytes"] for e in crossing)) + (
                    " + ?" if any(e["unknown"] for e in crossing) else "")}

    # -- layout ------------------------------------------------------------------------------------
    @staticmethod
    def _layout(items, edges):
        """Set x, y, row of every item and the path and label position of every edge."""
        key = {it["id"]: it["first"] for it in items}
        preds = {it["id"]: [] for it in items}
        succs = {it["id"]: [] for it in items}
        for e in edges:
            a, b = e["from"], e["to"]
            if key[a] < key[b]:            # folding may make cycles: layer along node order only
                preds[b].append(a)
                succs[a].append(b)
        ids = [it["id"] for it in items]
        layer = {}
        for i in ids:
            layer[i] = 1 + max(layer[a] for a in preds[i]) if preds[i] else 0
        kinds = {it["id"]: it.get("op") for it in items}
        for i in reversed(ids):            # a read or constant: just above its first user
            if not preds[i] and succs[i] and kinds[i] != "placeholder":
                layer[i] = max(0, min(layer[s] for s in succs[i]) - 1)
        rows: dict = {}
        for i in ids:
            rows.setdefault(layer[i], []).append(i)
        levels = sorted(rows)
        pos = {i: k for r in levels for k, i in enumerate(rows[r])}

        def sweep(row, neighbours):
            def bary(i):
                ns = [pos[j] for j in neighbours[i]]
                return sum(ns) / len(ns) if ns else pos[i]
            row.sort(key=lambda i: (bary(i), pos[i], key[i]))
            for k, i in enumerate(row):
                pos[i] = k
        for _ in range(SWEEPS):
            for r in levels[1:]:
                sweep(rows[r], preds)
            for r in reversed(levels[:-1]):
                sweep(rows[r], succs)
        width = {it["id"]: it["w"] for it in items}
        centre = {}

        def place(row, want):
            right = None
            for i in row:
                left = want[i] - width[i] / 2 if want.get(i) is not None else (right + GAP if right is not None else 0)
                if right is not None:
                    left = max(left, right + GAP)
                centre[i], right = left + width[i] / 2, left + width[i]

        for r in levels:                   # under the mean of the inputs
            row = rows[r]
            want = {}
            for i in row:
                xs = [centre[a] for a in preds[i] if a in centre]
                want[i] = sum(xs) / len(xs) if xs else None
            place(row, want)
        for r in reversed(levels):         # sources: over the mean of their users
            row = rows[r]
            if all(preds[i] for i in row):
                continue
            want = {}
            for i in row:
                xs = [centre[s] for s in succs[i]]
                want[i] = centre[i] if preds[i] or not xs else sum(xs) / len(xs)
            place(row, want)
        shift = PAD - min((centre[i] - width[i] / 2 for i in ids), default=0)
        top = PAD + 28
        for it in items:
            i = it["id"]
            it["row"] = layer[i]
            it["x"] = round(centre[i] - width[i] / 2 + shift, 1)
            it["y"] = top + levels.index(layer[i]) * (BOX_H + ROW_GAP) if levels else top
            it["h"] = BOX_H
        at = {it["id"]: it for it in items}
        incoming: dict = {}
        for e in edges:
            incoming.setdefault(e["to"], []).append(e)
        for b, es in incoming.items():
            es.sort(key=lambda e: (at[e["from"]]["x"], key[e["from"]]))
            tgt = at[b]
            for k, e in enumerate(es):
                src = at[e["from"]]
                sx, sy = src["x"] + src["w"] / 2, src["y"] + BOX_H
                tx, ty = tgt["x"] + tgt["w"] * (k + 1) / (len(es) + 1), tgt["y"]
                bend = max(min(ROW_GAP, (ty - sy) / 2), 10) if ty > sy else ROW_GAP + abs(sy - ty) / 3
                e["path"] = (f"M{_n(sx)},{_n(sy)} C{_n(sx)},{_n(sy + bend)} {_n(tx)},{_n(ty - bend)} "
                             f"{_n(tx)},{_n(ty - 1)}")
                e["lx"], e["ly"] = round((sx + tx) / 2, 1), round((sy + ty) / 2 + 4, 1)

    # -- what the widget and the static picture draw ---------------------------------------------------
    def snapshot(self) -> dict:
        """Everything drawn, JSON-safe: nodes (positions, colours, hover text, inputs and
        consumers), edges (paths, bytes), the legend, folded scopes, and the picture's size."""
        model = self._build()
        nodes = model["nodes"]
        gw = max((n["x"] + n["w"] for n in nodes), default=PAD) + PAD
        gh = max((n["y"] + BOX_H for n in nodes), default=PAD + 28) + PAD
        legend_rows = sum(1 + len(t["devices"]) for t in model["legend"]) + 3
        lw = max([len(d["device"] if model["multi_task"] else d["label"]) * SMALL_W + 70
                  for t in model["legend"] for d in t["devices"]] + [240])
        return {"title": self.title, "graph": self.graph.name, "total_nodes": len(self.graph.nodes),
                "nodes": nodes, "edges": [{k: e[k] for k in ("from", "to", "cross", "control", "label", "path",
                                                           "lx", "ly", "count")} for e in model["edges"]],
                "legend": model["legend"], "multi_task": model["multi_task"],
                "crossing": model["crossing"], "moved": model["moved"], "left_out": model["left_out"],
                "folded": self.folded, "scopes": self.scopes,
                "graph_width": round(gw, 1), "width": round(gw + lw, 1),
                "height": round(max(gh, PAD + 28 + 20 * legend_rows + PAD), 1)}

    def node(self, name) -> dict:
        """What the widget lists when a node is clicked: its op, shapes, device, source line,
        inputs and consumers (``name``: a node name or ``%index``)."""
        snap = self._build()
        for n in snap["nodes"]:
            if n["kind"] == "node" and (n["name"] == name or f"%{n['index']}" == str(name)):
                return {k: n[k] for k in ("name", "op", "shape", "device", "source", "inputs", "consumers")}
        names = [n["name"] for n in snap["nodes"] if n["kind"] == "node"]
        raise KeyError(f"graph {self.graph.name!r} draws no node {name!r}" + did_you_mean(str(name), names))

    def __repr__(self):
        m = self._build()
        tasks = len(m["legend"])
        devices = sum(len(t["devices"]) for t in m["legend"])
        where = f"{devices} device{'s' * (devices != 1)}" + (f" on {tasks} tasks" if tasks > 1 else "")
        folded = f", {len(self._folded)} scope(s) folded" if self._folded else ""
        cross = (f", {m['crossing']} cross-device edge(s) moving {m['moved']}" if m["crossing"]
                 else ", no cross-device edges")
        return f"<PlacementGraph {self.graph.name}: {len(self.graph.nodes)} nodes on {where}{cross}{folded}>"

    def _repr_mimebundle_(self, include=None, exclude=None):
        from .._display import mimebundle
        return mimebundle(self, include, exclude)

    def _repr_html_(self):
        return self.to_svg()

    def to_svg(self) -> str:
        """The picture as one self-contained SVG document (no script, no external font or CSS)."""
        snap = self.snapshot()
        w, h = snap["width"], snap["height"]
        out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="fl-placement-static" width="{_n(w)}" '
               f'height="{_n(h)}" viewBox="0 0 {_n(w)} {_n(h)}" font-family="{_t(FONT)}" font-size="12">',
               f"<title>{_t(repr(self))}</title>",
               '<defs><marker id="fl-pg-arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
               'markerHeight="7" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#4b5563"/></marker></defs>',
               f'<rect width="{_n(w)}" height="{_n(h)}" fill="#ffffff"/>',
               f'<text x="{PAD}" y="{PAD + 12}" font-size="13" font-weight="bold" fill="#111827">'
               f'{_t(snap["title"])} <tspan font-weight="normal" fill="#6b7280">{_t(_caption(snap))}</tspan></text>']
        for e in snap["edges"]:
            colour = CROSS if e["cross"] else CONTROL if e["control"] else PLAIN
            dash = ' stroke-dasharray="5 3"' if e["cross"] else ' stroke-dasharray="2 3"' if e["control"] else ""
            out.append(f'<path class="fl-pg-edge{" cross" if e["cross"] else ""}" d="{e["path"]}" fill="none" '
                       f'stroke="{colour}" stroke-width="{1.6 if e["cross"] else 1.2}"{dash} '
                       f'marker-end="url(#fl-pg-arrow)"/>')
        for n in snap["nodes"]:
            x, y, bw = n["x"], n["y"], n["w"]
            edge = ('stroke="#111827" stroke-width="2.6"' if n["returned"] else 'stroke="#4b5563" stroke-width="1"')
            if n["kind"] == "scope":
                edge += ' stroke-dasharray="6 3"'
            parts = [f'<g class="fl-pg-node {n["kind"]}" data-id="{_t(n["id"])}"><title>{_t(n["hover"])}</title>',
                     f'<rect x="{_n(x)}" y="{_n(y)}" width="{_n(bw)}" height="{BOX_H}" rx="7" ry="7" '
                     f'fill="{n["fill"]}" {edge}/>']
            if n["stripe"]:
                parts.append(f'<rect x="{_n(x + 1)}" y="{_n(y + 6)}" width="5" height="{BOX_H - 12}" rx="2" '
                             f'fill="{n["stripe"]}"/>')
            parts.append(f'<text x="{_n(x + bw / 2)}" y="{_n(y + 15)}" text-anchor="middle" fill="#111827">'
                         f'{_t(n["label"])}</text><text x="{_n(x + bw / 2)}" y="{_n(y + 29)}" text-anchor="middle" '
                         f'font-size="10" fill="#4b5563">{_t(n["sub"])}</text></g>')
            out.append("".join(parts))
        for e in snap["edges"]:            # byte labels on top of boxes and arrows
            if e["label"]:
                lw = len(e["label"]) * SMALL_W + 8
                out.append(f'<g class="fl-pg-bytes"><rect x="{_n(e["lx"] - lw / 2)}" y="{_n(e["ly"] - 11)}" '
                           f'width="{_n(lw)}" height="15" rx="3" fill="#fef2f2" stroke="{CROSS}" stroke-width="0.6"/>'
                           f'<text x="{_n(e["lx"])}" y="{_n(e["ly"])}" text-anchor="middle" font-size="10" '
                           f'fill="{CROSS}">{_t(e["label"])}</text></g>')
        out.extend(_legend_svg(snap))
        out.append("</svg>")
        return "\n".join(out)


def _caption(snap) -> str:
    bits = [f"{snap['total_nodes']} nodes"]
    if snap["folded"]:
        bits.append(f"{len(snap['folded'])} scope(s) folded")
    if snap["left_out"]:
        bits.append(f"{snap['left_out']} boxes not drawn")
    bits.append(f"{snap['crossing']} copies, {snap['moved']}" if snap["crossing"] else "no copies")
    return "(" + ", ".join(bits) + ")"


def _legend_svg(snap):
    lx, y = snap["graph_width"] + PAD / 2, PAD + 28
    out = [f'<g class="fl-pg-legend"><text x="{_n(lx)}" y="{_n(y + 10)}" font-weight="bold" fill="#111827">'
           f'{"tasks and devices" if snap["multi_task"] else "devices"}</text>']
    for task in snap["legend"]:
        if snap["multi_task"]:
            y += 20
            out.append(f'<rect x="{_n(lx)}" y="{_n(y + 1)}" width="5" height="12" rx="2" fill="{task["colour"]}"/>'
                       f'<text x="{_n(lx + 10)}" y="{_n(y + 11)}" font-size="11" fill="#111827">{_t(task["task"])}</text>')
        for d in task["devices"]:
            y += 20
            text = d["label"] + (" (default)" if d["default"] else "")
            out.append(f'<rect class="swatch" x="{_n(lx + (10 if snap["multi_task"] else 0))}" y="{_n(y)}" width="16" '
                       f'height="14" rx="3" fill="{d["fill"]}" stroke="#4b5563" stroke-width="1"/>'
                       f'<text x="{_n(lx + (34 if snap["multi_task"] else 24))}" y="{_n(y + 11)}" font-size="11" '
                       f'fill="#111827">{_t(text)}</text>')
    notes = ["dashed red: a copy between devices,", "  labelled with the bytes it moves"]
    if any(n["returned"] for n in snap["nodes"]):
        notes.append("thick border: returned")
    if snap["folded"]:
        notes.append("dashed box: a folded name scope")
    for text in notes:
        y += 18
        out.append(f'<text x="{_n(lx)}" y="{_n(y + 11)}" font-size="10" fill="#4b5563" '
                   f'xml:space="preserve">{_t(text)}</text>')
    out.append("</g>")
    return out


def placement_graph(fn_or_graph, *args, **kwargs) -> PlacementGraph:
    """The placement graph of ``fn_or_graph``: an ``@fl.function`` (traced for ``*args``,
    ``**kwargs`` if it was not yet), a ``ConcreteFunction``, or a ``Graph`` (a ``compat.v1``
    graph, e.g. ``tf.get_default_graph()``)."""
    if isinstance(fn_or_graph, PlacementGraph):
        return fn_or_graph
    if isinstance(fn_or_graph, ConcreteFunction):
        if args or kwargs:
            raise TypeError("placement_graph: a ConcreteFunction is already traced; pass no arguments")
        return PlacementGraph(fn_or_graph.graph, fn_or_graph.outputs, title=f"function {fn_or_graph.graph.name}")
    if isinstance(fn_or_graph, Function) or callable(getattr(fn_or_graph, "get_concrete_function", None)):
        return placement_graph(fn_or_graph.get_concrete_function(*args, **kwargs))
    if isinstance(fn_or_graph, Graph):
        if args or kwargs:
            raise TypeError("placement_graph: a Graph takes no arguments")
        return PlacementGraph(fn_or_graph)
    raise TypeError(f"placement_graph takes an @fl.function, a ConcreteFunction or a Graph, not "
                    f"{type(fn_or_graph).__name__}" + (" (decorate the function with @fl.function)"
                                                        if callable(fn_or_graph) else ""))


def static_html(fn_or_graph) -> str:
    """The static placement graph of a ConcreteFunction or a Graph, as HTML (their ``_repr_html_``,
    through ``flowlab._display.static_html``)."""
    return placement_graph(fn_or_graph)._repr_html_()
