// The placement graph (flowlab/widgets/placement.py): boxes and arrows at the positions Python
// computed (the static SVG draws the same), hover for a node's op, shapes, device and source line,
// click a node to list its inputs and consumers, click a folded scope to unfold it; wheel zooms,
// dragging the background pans.

function pgNode(n, onEnter, onLeave, onClick) {
  const g = s("g", { class: `fl-pg-node ${n.kind}${n.returned ? " returned" : ""}`, "data-id": n.id,
                     "data-name": n.name || n.scope });
  g.append(s("rect", { class: "fl-pg-box", x: n.x, y: n.y, width: n.w, height: n.h, rx: 7, ry: 7,
                       fill: n.fill }));
  if (n.stripe) g.append(s("rect", { x: n.x + 1, y: n.y + 6, width: 5, height: n.h - 12, rx: 2, fill: n.stripe }));
  g.append(s("text", { x: n.x + n.w / 2, y: n.y + 15, "text-anchor": "middle", class: "fl-pg-label", text: n.label }));
  g.append(s("text", { x: n.x + n.w / 2, y: n.y + 29, "text-anchor": "middle", class: "fl-pg-sub", text: n.sub }));
  g.addEventListener("mousemove", (e) => onEnter(n, e));
  g.addEventListener("mouseleave", () => onLeave(n));
  g.addEventListener("click", (e) => { e.stopPropagation(); onClick(n); });
  return g;
}

function pgLegend(snap) {
  const lx = snap.graph_width + 8;
  let y = 44;
  const g = s("g", { class: "fl-pg-legend" });
  g.append(s("text", { x: lx, y: y + 10, class: "fl-pg-legend-title",
                       text: snap.multi_task ? "tasks and devices" : "devices" }));
  for (const task of snap.legend || []) {
    if (snap.multi_task) {
      y += 20;
      g.append(s("rect", { x: lx, y: y + 1, width: 5, height: 12, rx: 2, fill: task.colour }));
      g.append(s("text", { x: lx + 10, y: y + 11, text: task.task }));
    }
    for (const d of task.devices) {
      y += 20;
      const dx = snap.multi_task ? 10 : 0;
      g.append(s("rect", { class: "swatch", x: lx + dx, y, width: 16, height: 14, rx: 3, fill: d.fill }));
      g.append(s("text", { x: lx + dx + 24, y: y + 11, text: d.label + (d.default ? " (default)" : "") }));
    }
  }
  const notes = ["dashed red: a copy between devices,", "  labelled with the bytes it moves"];
  if ((snap.nodes || []).some((n) => n.returned)) notes.push("thick border: returned");
  if ((snap.folded || []).length) notes.push("dashed box: a folded name scope (click it)");
  for (const text of notes) {
    y += 18;
    g.append(s("text", { x: lx, y: y + 11, class: "fl-pg-note", text }));
  }
  return g;
}

function pgDetails(node, byId, select) {
  const box = h("div", { class: "fl-pg-details" });
  if (!node) {
    box.append(h("div", { class: "fl-pg-hint", text: "Click a box to list its inputs and consumers; click a folded scope to unfold it." }));
    return box;
  }
  box.append(h("div", { class: "fl-pg-title" }, h("b", { text: node.name }), ` = ${node.op}  →  ${node.shape}`));
  box.append(h("div", { text: `device ${node.device}` }));
  box.append(h("div", { class: "fl-pg-source", text: `source ${node.source || "unknown"}` }));
  const link = (id, name) => h("a", { href: "#", class: "fl-pg-link", text: name,
                                       onclick: (e) => { e.preventDefault(); if (byId[id]) select(byId[id]); } });
  const inputs = h("table", { class: "fl-pg-inputs" },
    h("tr", {}, h("th", { text: "inputs" }), h("th", { text: "op" }), h("th", { text: "value" }),
                h("th", { text: "from device" }), h("th", { text: "copied" })),
    ...(node.inputs || []).map((i) => h("tr", { class: i.bytes ? "cross" : "" },
      h("td", {}, link(i.id, i.name)), h("td", { text: i.op }), h("td", { text: i.spec }),
      h("td", { text: i.device }), h("td", { text: i.bytes || "" }))));
  if (!(node.inputs || []).length) inputs.append(h("tr", {}, h("td", { text: "(none)" })));
  const consumers = h("table", { class: "fl-pg-consumers" },
    h("tr", {}, h("th", { text: "consumers" }), h("th", { text: "op" }), h("th", { text: "device" })),
    ...(node.consumers || []).map((c) => h("tr", {}, h("td", {}, link(c.id, c.name)), h("td", { text: c.op }),
                                                  h("td", { text: c.device }))));
  if (!(node.consumers || []).length) consumers.append(h("tr", {}, h("td", { text: "(none: an output)" })));
  box.append(h("div", { class: "fl-pg-lists" }, inputs, consumers));
  return box;
}

export default {
  render({ model, el }) {
    el.classList.add("fl-view", "fl-placement");
    const tip = tooltip(el);
    let view = { x: 0, y: 0, k: 1 };
    let selected = null;
    let drag = null;
    const draw = (snap) => {
      for (const c of [...el.children]) if (!c.classList.contains("fl-tip")) c.remove();
      const nodes = snap.nodes || [];
      const byId = Object.fromEntries(nodes.map((n) => [n.id, n]));
      if (selected && !byId[selected.id]) selected = null;
      if (selected) selected = byId[selected.id];
      const folded = snap.folded || [];
      const caption = `${snap.total_nodes} nodes` + (folded.length ? `, ${folded.length} scope(s) folded` : "") +
        (snap.left_out ? `, ${snap.left_out} boxes not drawn` : "") +
        (snap.crossing ? `, ${snap.crossing} copies, ${snap.moved}` : ", no copies");
      const bar = h("div", { class: "fl-pg-bar" }, h("b", { text: snap.title || "" }), h("span", { class: "fl-pg-caption", text: ` (${caption}) ` }));
      if ((snap.scopes || []).length) {
        bar.append(h("button", { class: "fl-pg-fold-all", text: "fold scopes", onclick: () => act(model, "fold", {}) }));
        bar.append(h("button", { class: "fl-pg-unfold-all", text: "unfold all", onclick: () => act(model, "unfold", {}) }));
      }
      bar.append(h("button", { class: "fl-pg-reset", text: "reset zoom",
                               onclick: () => { view = { x: 0, y: 0, k: 1 }; place(); } }));
      const status = h("span", { class: "fl-pg-status" });
      bar.append(status);
      const w = snap.width || 300, hgt = snap.height || 100;
      const svg = s("svg", { class: "fl-pg-svg", width: w, height: hgt, viewBox: `0 0 ${w} ${hgt}` });
      svg.append(s("defs", {}, s("marker", { id: "fl-pg-arrow-live", viewBox: "0 0 10 10", refX: 10, refY: 5,
        markerWidth: 9, markerHeight: 9, markerUnits: "userSpaceOnUse", orient: "auto" }, s("path", { d: "M0,0 L10,5 L0,10 z", class: "fl-pg-head" }))));
      const canvas = s("g", { class: "fl-pg-canvas" });
      svg.append(canvas);
      const place = () => canvas.setAttribute("transform", `translate(${view.x},${view.y}) scale(${view.k})`);
      place();
      const edgeEls = [];
      for (const e of snap.edges || []) {
        const p = s("path", { class: `fl-pg-edge${e.cross ? " cross" : ""}${e.control ? " control" : ""}`, d: e.path,
                              "marker-end": "url(#fl-pg-arrow-live)", "data-from": e.from, "data-to": e.to });
        edgeEls.push(p);
        canvas.append(p);
      }
      const details = h("div", { class: "fl-pg-side" });
      const highlight = () => {
        for (const g of canvas.querySelectorAll(".fl-pg-node")) g.classList.toggle("selected", !!selected && g.dataset.id === selected.id);
        for (const p of edgeEls) p.classList.toggle("selected", !!selected &&
          (p.dataset.from === selected.id || p.dataset.to === selected.id));
      };
      const select = (n) => {
        if (n.kind === "scope") {
          status.textContent = `unfolding ${n.scope}…`;
          act(model, "unfold", { scope: n.scope }).then((r) => { status.textContent = r.error || ""; });
          return;
        }
        selected = n;
        details.replaceChildren(pgDetails(n, byId, select));
        highlight();
        act(model, "inspect", { node: n.name }).then((r) => { if (r.error) status.textContent = r.error; });
      };
      for (const n of nodes) {
        canvas.append(pgNode(n, (m, e) => tip.show(m.hover, e), () => tip.hide(), select));
      }
      for (const e of snap.edges || []) {
        if (!e.label) continue;
        const lw = e.label.length * 6.1 + 8;
        canvas.append(s("g", { class: "fl-pg-bytes" },
          s("rect", { x: e.lx - lw / 2, y: e.ly - 11, width: lw, height: 15, rx: 3 }),
          s("text", { x: e.lx, y: e.ly, "text-anchor": "middle", text: e.label })));
      }
      canvas.append(pgLegend(snap));
      svg.addEventListener("wheel", (e) => {
        e.preventDefault();
        const box = svg.getBoundingClientRect();
        const scale = w / box.width;
        const mx = (e.clientX - box.left) * scale, my = (e.clientY - box.top) * scale;
        const k = Math.min(4, Math.max(0.25, view.k * (e.deltaY < 0 ? 1.15 : 1 / 1.15)));
        view = { k, x: mx - ((mx - view.x) * k) / view.k, y: my - ((my - view.y) * k) / view.k };
        place();
      }, { passive: false });
      svg.addEventListener("mousedown", (e) => { drag = { x: e.clientX, y: e.clientY, vx: view.x, vy: view.y }; });
      svg.addEventListener("mousemove", (e) => {
        if (!drag || !(e.buttons & 1)) { drag = null; return; }
        const scale = w / svg.getBoundingClientRect().width;
        view = { ...view, x: drag.vx + (e.clientX - drag.x) * scale, y: drag.vy + (e.clientY - drag.y) * scale };
        place();
      });
      svg.addEventListener("mouseup", () => { drag = null; });
      details.append(pgDetails(selected, byId, select));
      el.append(bar, h("div", { class: "fl-pg-scroll" }, svg), details);
      highlight();
    };
    return onSnapshot(model, draw);
  },
};
