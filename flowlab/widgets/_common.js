// Helpers every flowlab view uses. This file is joined in front of each view's own file
// (flowlab/widgets/_view.py: esm()), so these are plain top-level functions of one ES module.
// A view draws model.get("snapshot") and nothing else; user actions go back with act().

const SVG_NS = "http://www.w3.org/2000/svg";

// h("div", {class: "x", onclick: f}, child, "text", ...): an HTML element
function h(tag, attrs, ...children) {
  return fill(document.createElement(tag), attrs, children);
}

// s("rect", {x: 1, ...}, ...): an SVG element
function s(tag, attrs, ...children) {
  return fill(document.createElementNS(SVG_NS, tag), attrs, children);
}

function fill(el, attrs, children) {
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
    else if (k === "text") el.textContent = String(v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

function fmtBytes(n) {
  if (n === null || n === undefined) return "-";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i === 0 ? String(Math.round(n)) : n.toFixed(n < 10 ? 2 : 1)) + " " + units[i];
}

function fmtSeconds(t) {
  if (t === null || t === undefined) return "-";
  const a = Math.abs(t);
  if (a >= 1) return t.toFixed(2) + " s";
  if (a >= 1e-3) return (t * 1e3).toFixed(2) + " ms";
  return (t * 1e6).toFixed(1) + " µs";
}

function fmtNum(v) {
  if (v === null || v === undefined) return "-";
  if (typeof v !== "number") return String(v);
  const a = Math.abs(v);
  if (a !== 0 && (a >= 1e5 || a < 1e-3)) return v.toExponential(3);
  return Number.isInteger(v) ? String(v) : v.toFixed(4);
}

// act(model, "kill", {task: "..."}) -> Promise of the reply ({ok, result} or {error})
let _nextActionId = 1;
function act(model, action, args) {
  const id = _nextActionId++;
  return new Promise((resolve) => {
    const onReply = (msg) => {
      if (msg && msg.reply === id) { model.off("msg:custom", onReply); resolve(msg); }
    };
    model.on("msg:custom", onReply);
    model.send({ action, args: args || {}, id });
  });
}

// Draw now and on every snapshot change; returns the cleanup render() should return.
function onSnapshot(model, draw) {
  const redraw = () => draw(model.get("snapshot") || {});
  model.on("change:snapshot", redraw);
  redraw();
  return () => model.off("change:snapshot", redraw);
}

// A small line of values (the last point marked), as an SVG element
function sparkline(values, width = 80, height = 18, cls = "fl-spark") {
  const svg = s("svg", { width, height, class: cls, viewBox: `0 0 ${width} ${height}` });
  const vs = (values || []).filter((v) => typeof v === "number");
  if (vs.length < 2) return svg;
  const lo = Math.min(...vs), hi = Math.max(...vs), span = hi - lo || 1;
  const x = (i) => (i * (width - 2)) / (vs.length - 1) + 1;
  const y = (v) => height - 2 - ((v - lo) * (height - 4)) / span;
  svg.append(s("polyline", { points: vs.map((v, i) => `${x(i)},${y(v)}`).join(" "), fill: "none" }));
  svg.append(s("circle", { cx: x(vs.length - 1), cy: y(vs[vs.length - 1]), r: 1.8 }));
  return svg;
}

// A floating tooltip inside el: show(html-free text, x, y) / hide()
function tooltip(el) {
  const tip = h("div", { class: "fl-tip" });
  tip.style.display = "none";
  el.append(tip);
  return {
    show(text, event) {
      tip.textContent = text;
      tip.style.display = "block";
      const box = el.getBoundingClientRect();
      tip.style.left = `${event.clientX - box.left + 12}px`;
      tip.style.top = `${event.clientY - box.top + 12}px`;
    },
    hide() { tip.style.display = "none"; },
  };
}

// One colour per key (a task, a device, a rank), stable across redraws
const PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1",
                 "#ff9da7", "#9c755f", "#bab0ac"];
function colourOf(key, keys) {
  const i = keys.indexOf(key);
  return PALETTE[(i < 0 ? 0 : i) % PALETTE.length];
}
