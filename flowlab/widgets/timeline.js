// The timeline view (flowlab/widgets/timeline_view.py): lanes of bars, one lane per rank, task or
// pipeline stage and thread; wheel zooms, drag pans, double-click shows the whole run again; hover
// a bar for its details; arrows join each send to its receive. Zooming and panning redraw the bars
// at hand at once, then ask the kernel for the window's detail (action "zoom").

const TL_LABEL_W = 160, TL_ROW_H = 13, TL_AXIS_H = 22, TL_GAP = 6;
let _tlCount = 0;

function tlTicks(lo, hi, n) {
  const span = hi - lo;
  if (!(span > 0)) return { ticks: [], unit: "ms", scale: 1e3 };
  const raw = span / n, mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((v) => v >= raw);
  const [unit, scale] = step >= 0.5 ? ["s", 1] : step >= 5e-4 ? ["ms", 1e3] : ["µs", 1e6];
  const ticks = [];
  for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) ticks.push(t);
  return { ticks, unit, scale };
}

function tlFmtTick(v, scale) {
  const x = v * scale;
  return Math.abs(x - Math.round(x)) < 1e-6 ? String(Math.round(x)) : String(Number(x.toPrecision(3)));
}

function render({ model, el }) {
  el.classList.add("fl-view", "fl-timeline");
  const uid = `fl-tl-${++_tlCount}`;
  const arrowsBox = h("input", { type: "checkbox", class: "fl-tl-arrows-toggle", checked: true });
  const resetButton = h("button", { class: "fl-tl-reset", title: "show the whole run (or double-click the plot)" },
                        "Whole run");
  const exportButton = h("button", { class: "fl-tl-export", title: "write a Chrome trace JSON for Perfetto" },
                         "Export trace");
  const title = h("b", { class: "fl-tl-title" });
  const info = h("span", { class: "fl-tl-info" });
  const toolbar = h("div", { class: "fl-tl-toolbar" }, title, " ",
                    h("label", {}, arrowsBox, " arrows"), resetButton, exportButton, info);
  const legend = h("div", { class: "fl-tl-legend" });
  const plot = h("div", { class: "fl-tl-plot" });
  const message = h("div", { class: "fl-tl-message" });
  el.append(toolbar, legend, plot, message);
  const tip = tooltip(el);

  let snap = {};
  let win = null;            // [t0, t1] shown now (seconds from the first event)
  let hidden = new Set();    // kinds switched off in the legend
  let fetchTimer = null, frame = null, drag = null;

  const span = () => (snap.span > 0 ? snap.span : 1e-6);
  const current = () => win || (snap.window ? snap.window.slice() : [0, span()]);

  function askDetail() {
    clearTimeout(fetchTimer);
    fetchTimer = setTimeout(() => {
      const [a, b] = current();
      const whole = a <= 0 && b >= span();
      act(model, whole ? "reset" : "zoom", whole ? {} : { t0: a, t1: b }).then((reply) => {
        if (reply.error) message.textContent = reply.error;
      });
    }, 250);
  }

  function setWindow(a, b) {
    const total = span(), minW = 1e-7;
    if (b - a < minW) { const c = (a + b) / 2; a = c - minW / 2; b = c + minW / 2; }
    if (b - a > total) { a = 0; b = total; }
    if (a < 0) { b -= a; a = 0; }
    if (b > total) { a -= b - total; b = total; }
    win = [Math.max(a, 0), b];
    redraw();
    askDetail();
  }

  function redraw() {
    if (frame) return;
    frame = requestAnimationFrame(() => { frame = null; draw(); });
  }

  function laneName(lane) {
    return lane.label ? `${lane.process} · ${lane.label}` : lane.process;
  }

  function describe(b) {
    const lane = snap.lanes[b[0]] || {};
    const lines = [b[5], `${b[4]} on ${laneName(lane)}`];
    if (b[8] !== null && b[8] !== undefined) lines.push(`peer ${b[8]}`);
    if (b[7]) lines.push(`${fmtBytes(b[7])}${b[6] > 1 ? " in all" : ""}`);
    lines.push(`${b[6] > 1 ? "spanning" : "duration"} ${fmtSeconds(b[3] - b[2])}, at +${fmtSeconds(b[2])}`);
    return lines.join("\n");
  }

  function drawLegend() {
    legend.replaceChildren(...(snap.kinds || []).map((kind) => {
      const item = h("span", { class: `fl-tl-key${hidden.has(kind) ? " fl-tl-off" : ""}`, "data-kind": kind,
                               title: "click to hide or show", onclick: () => {
                                 hidden.has(kind) ? hidden.delete(kind) : hidden.add(kind);
                                 drawLegend(); redraw();
                               } },
                      h("i", { style: `background:${snap.colours[kind]}` }), `${kind} ${snap.counts[kind] ?? ""}`);
      return item;
    }));
  }

  function draw() {
    const lanes = snap.lanes || [];
    const width = Math.max(plot.clientWidth || el.clientWidth || 900, 420);
    const plotW = width - TL_LABEL_W - 8;
    const ys = [];
    let y = TL_AXIS_H;
    for (const lane of lanes) { ys.push(y); y += lane.depth * TL_ROW_H + TL_GAP; }
    const height = y + 4;
    const [a, b] = current();
    const x = (t) => TL_LABEL_W + ((t - a) / (b - a)) * plotW;
    const clipX = (t) => Math.min(Math.max(x(t), TL_LABEL_W - 2), TL_LABEL_W + plotW + 2);

    const svg = s("svg", { width, height, class: "fl-tl-svg" });
    svg.append(s("defs", {},
      s("clipPath", { id: `${uid}-clip` }, s("rect", { x: TL_LABEL_W, y: 0, width: plotW, height })),
      s("marker", { id: `${uid}-head`, viewBox: "0 0 6 6", refX: 6, refY: 3, markerWidth: 6, markerHeight: 6,
                    orient: "auto" }, s("path", { d: "M0,0 L6,3 L0,6 z", class: "fl-tl-head" }))));
    const { ticks, unit, scale } = tlTicks(a, b, Math.max(2, Math.floor(plotW / 110)));
    const axis = s("g", { class: "fl-tl-axis" });
    for (const t of ticks) {
      axis.append(s("line", { x1: x(t), x2: x(t), y1: TL_AXIS_H - 4, y2: height }),
                  s("text", { x: x(t), y: TL_AXIS_H - 8, "text-anchor": "middle" }, tlFmtTick(t, scale)));
    }
    axis.append(s("text", { x: TL_LABEL_W + plotW, y: 10, "text-anchor": "end", class: "fl-tl-unit" }, unit));
    svg.append(axis);
    const labels = s("g", { class: "fl-tl-labels" });
    lanes.forEach((lane, i) => {
      const first = i === 0 || lanes[i - 1].process !== lane.process;
      if (first && i) labels.append(s("line", { x1: 0, x2: width, y1: ys[i] - TL_GAP / 2, y2: ys[i] - TL_GAP / 2 }));
      const full = first ? laneName(lane) : lane.label;
      const text = full.length > 27 ? `${full.slice(0, 26)}…` : full;
      labels.append(s("g", {}, s("title", {}, full),
                      s("text", { x: 2, y: ys[i] + TL_ROW_H - 3, class: first ? "fl-tl-process" : "fl-tl-thread" },
                        first ? text : `  ${text}`)));
    });
    svg.append(labels);

    const bars = s("g", { class: "fl-tl-bars", "clip-path": `url(#${uid}-clip)` });
    (snap.bars || []).forEach((bar, i) => {
      if (bar[3] < a || bar[2] > b || hidden.has(bar[4]) || ys[bar[0]] === undefined) return;
      const x0 = clipX(bar[2]), x1 = clipX(bar[3]);
      bars.append(s("rect", { x: x0, y: ys[bar[0]] + bar[1] * TL_ROW_H, width: Math.max(x1 - x0, 1),
                              height: TL_ROW_H - 2, fill: snap.colours[bar[4]] || "#9c755f", "data-i": i,
                              class: `fl-tl-bar fl-tl-kind-${bar[4]}${bar[6] > 1 ? " fl-tl-merged" : ""}` }));
    });
    svg.append(bars);
    if (arrowsBox.checked) {
      const arrows = s("g", { class: "fl-tl-arrows", "clip-path": `url(#${uid}-clip)` });
      for (const ar of snap.arrows || []) {
        if (Math.max(ar[2], ar[5]) < a || Math.min(ar[2], ar[5]) > b) continue;
        if (ys[ar[0]] === undefined || ys[ar[3]] === undefined) continue;
        arrows.append(s("line", { x1: x(ar[2]), y1: ys[ar[0]] + ar[1] * TL_ROW_H + TL_ROW_H / 2,
                                  x2: x(ar[5]), y2: ys[ar[3]] + ar[4] * TL_ROW_H + TL_ROW_H / 2,
                                  class: "fl-tl-arrow", "marker-end": `url(#${uid}-head)` }));
      }
      svg.append(arrows);
    }
    plot.replaceChildren(svg);
    tip.hide();                   // the bar under it may be gone: the next mousemove shows it again

    title.textContent = snap.title || "timeline";
    const nBars = (snap.bars || []).length;
    info.textContent = `${snap.events ?? 0} events · ${nBars} bars` +
      (snap.merged ? ` (${snap.merged} short events merged)` : "") +
      ` · ${snap.messages ?? 0} messages` + (snap.arrows_left_out ? ` (${snap.arrows_left_out} arrows left out)` : "") +
      ` · showing ${fmtSeconds(a)} – ${fmtSeconds(b)} of ${fmtSeconds(span())}`;
  }

  // -- zoom, pan, hover --------------------------------------------------------------------------
  const timeAt = (event) => {
    const box = plot.getBoundingClientRect();
    const plotW = box.width - TL_LABEL_W - 8;
    const [a, b] = current();
    return a + ((event.clientX - box.left - TL_LABEL_W) / plotW) * (b - a);
  };
  plot.addEventListener("wheel", (event) => {
    event.preventDefault();
    const [a, b] = current();
    const t = Math.min(Math.max(timeAt(event), a), b);
    const f = Math.exp(Math.max(-300, Math.min(300, event.deltaY)) * 0.002);
    setWindow(t - (t - a) * f, t + (b - t) * f);
  }, { passive: false });
  plot.addEventListener("mousedown", (event) => {
    drag = { x: event.clientX, win: current(), moved: false };
    event.preventDefault();
  });
  const onMove = (event) => {
    if (!drag) return;
    const dx = event.clientX - drag.x;
    if (Math.abs(dx) < 2 && !drag.moved) return;
    drag.moved = true;
    tip.hide();
    const plotW = plot.getBoundingClientRect().width - TL_LABEL_W - 8;
    const [a, b] = drag.win, dt = (-dx / plotW) * (b - a);
    setWindow(a + dt, b + dt);
  };
  const onUp = () => { drag = null; };
  window.addEventListener("mousemove", onMove);
  window.addEventListener("mouseup", onUp);
  plot.addEventListener("dblclick", () => { win = [0, span()]; redraw(); askDetail(); });
  plot.addEventListener("mousemove", (event) => {
    if (drag && drag.moved) return;
    const i = event.target.getAttribute && event.target.getAttribute("data-i");
    if (i === null || i === undefined) { tip.hide(); return; }
    tip.show(describe(snap.bars[Number(i)]), event);
    const tipEl = el.querySelector(":scope > .fl-tip");     // near the right edge: on the left
    if (tipEl && tipEl.offsetLeft + tipEl.offsetWidth > el.clientWidth) {
      tipEl.style.left = `${Math.max(0, tipEl.offsetLeft - tipEl.offsetWidth - 24)}px`;
    }
    if (tipEl && tipEl.offsetTop + tipEl.offsetHeight > el.clientHeight) {  // near the bottom: above
      tipEl.style.top = `${Math.max(0, tipEl.offsetTop - tipEl.offsetHeight - 24)}px`;
    }
  });
  plot.addEventListener("mouseleave", () => tip.hide());
  arrowsBox.addEventListener("change", redraw);
  resetButton.addEventListener("click", () => { win = [0, span()]; redraw(); askDetail(); });
  exportButton.addEventListener("click", () => {
    exportButton.disabled = true;
    message.textContent = "writing the trace…";
    act(model, "export", {}).then((reply) => {
      exportButton.disabled = false;
      message.textContent = reply.error ? reply.error :
        `wrote ${reply.result.path} (${reply.result.slices} slices, ${reply.result.flows} flows): ` +
        "open it in https://ui.perfetto.dev or chrome://tracing";
    });
  });

  const observer = new ResizeObserver(() => redraw());
  observer.observe(plot);
  const off = onSnapshot(model, (next) => {
    snap = next;
    if (!snap.window && !win) win = null;
    drawLegend();
    draw();
  });
  return () => {
    off();
    observer.disconnect();
    window.removeEventListener("mousemove", onMove);
    window.removeEventListener("mouseup", onUp);
    clearTimeout(fetchTimer);
  };
}

export default { render };
