// The training monitor: a fit's ProgressBar snapshot (flowlab/nn/keras/progress.py) drawn as a bar,
// the latest values, the loss per epoch, the loss within the running epoch, the throughput, the
// replica count and a table of finished epochs with their times.

function fmtVal(v) {
  if (typeof v === "string") return v;           // "nan", "inf"
  if (v === null || v === undefined) return "-";
  const a = Math.abs(v);
  return a >= 1e4 || (a && a < 1e-3) ? v.toPrecision(4) : v.toFixed(4);
}

function fmtEpochTime(t) {
  if (t === null || t === undefined) return "-";
  if (t < 0.01) return (t * 1e3).toFixed(1) + " ms";
  if (t < 1) return Math.round(t * 1e3) + " ms";
  return t < 10 ? t.toFixed(2) + " s" : t.toFixed(1) + " s";
}

function fmtRate(r) {
  if (r === null || r === undefined) return "-";
  return r >= 100 ? Math.round(r).toLocaleString("en-US") : r.toPrecision(3);
}

// loss-like series per epoch: {name: [value or null]}
function lossSeries(finished) {
  const names = [];
  for (const r of finished) for (const k of Object.keys(r.values)) if (k.includes("loss") && !names.includes(k)) names.push(k);
  const out = {};
  for (const k of names) out[k] = finished.map((r) => (typeof r.values[k] === "number" ? r.values[k] : null));
  return out;
}

function lossChart(finished, tip, width = 340, height = 150) {
  const svg = s("svg", { class: "fl-loss-chart", width, height, viewBox: `0 0 ${width} ${height}` });
  const series = lossSeries(finished);
  const all = Object.values(series).flat().filter((v) => v !== null);
  const L = 46, R = 10, T = 10, B = 24;
  svg.append(s("line", { x1: L, y1: T, x2: L, y2: height - B, class: "fl-axis" }),
             s("line", { x1: L, y1: height - B, x2: width - R, y2: height - B, class: "fl-axis" }));
  if (!all.length) {
    svg.append(s("text", { x: (L + width) / 2, y: height / 2, "text-anchor": "middle", class: "fl-muted" },
                 "loss per epoch: after the first epoch"));
    return svg;
  }
  let lo = Math.min(...all), hi = Math.max(...all);
  if (hi === lo) hi = lo + 1;
  const n = finished.length;
  const x = (i) => L + (n > 1 ? (i * (width - L - R)) / (n - 1) : (width - L - R) / 2);
  const y = (v) => T + ((hi - v) * (height - T - B)) / (hi - lo);
  svg.append(s("text", { x: L - 4, y: T + 4, "text-anchor": "end" }, fmtVal(hi)),
             s("text", { x: L - 4, y: height - B, "text-anchor": "end" }, fmtVal(lo)),
             s("text", { x: L, y: height - 6, "text-anchor": "middle" }, finished[0].epoch),
             s("text", { x: x(n - 1), y: height - 6, "text-anchor": "middle" }, finished[n - 1].epoch),
             s("text", { x: (L + width - R) / 2, y: height - 6, "text-anchor": "middle", class: "fl-muted" }, "epoch"));
  Object.entries(series).forEach(([name, vals], i) => {
    const colour = PALETTE[i % PALETTE.length];
    const pts = vals.map((v, j) => (v === null ? null : `${x(j).toFixed(1)},${y(v).toFixed(1)}`)).filter(Boolean);
    svg.append(s("polyline", { points: pts.join(" "), fill: "none", stroke: colour, "stroke-width": 1.5,
                               "stroke-dasharray": name.startsWith("val_") ? "4 2" : null, class: "fl-loss-line" }));
    vals.forEach((v, j) => {
      if (v === null) return;
      const dot = s("circle", { cx: x(j), cy: y(v), r: 2.5, fill: colour, class: "fl-loss-dot" });
      dot.addEventListener("mousemove", (e) => tip.show(`epoch ${finished[j].epoch}\n${name}: ${fmtVal(v)}`, e));
      dot.addEventListener("mouseleave", () => tip.hide());
      svg.append(dot);
    });
    svg.append(s("text", { x: width - R, y: T + 10 + 12 * i, "text-anchor": "end", fill: colour }, name));
  });
  return svg;
}

function batchSpark(batch, width = 200, height = 46) {
  const pts = (batch && batch.points) || [];
  const vals = pts.map((p) => p[1]).filter((v) => typeof v === "number");
  const box = h("div", { class: "fl-batch" },
    h("div", { class: "fl-label" }, `epoch ${batch ? batch.epoch : "-"}: mean loss so far`));
  if (vals.length < 2) {
    box.append(h("div", { class: "fl-muted fl-batch-empty" }, "read when the view redraws (a few times a second)"));
    return box;
  }
  box.append(sparkline(vals, width, height, "fl-spark fl-batch-spark"));
  box.append(h("div", { class: "fl-muted" }, `${vals.length} readings, last ${fmtVal(vals[vals.length - 1])}`));
  return box;
}

// each worker's loss in the last epoch, before the fit averaged them (MultiWorkerMirroredStrategy)
function workerLosses(last) {
  const per = last && last.workers && last.workers.loss;
  if (!per) return null;
  return h("div", { class: "fl-worker-losses" }, `loss per worker, epoch ${last.epoch}: `,
    per.map((v, i) => h("span", { class: "fl-chip", title: `worker ${i}` }, `${i}: `, h("code", {}, fmtVal(v)))));
}

function epochTable(snap) {
  const rows = snap.finished || [];
  if (!rows.length) return h("div");
  const names = Object.keys(rows[rows.length - 1].values);
  const shown = rows.slice(-10);
  const more = rows.length - shown.length + (snap.finished_left_out || 0);
  return h("div", { class: "fl-epochs-box" },
    h("table", { class: "fl-epochs" },
      h("tr", {}, ["epoch", ...names, "time", "samples/s"].map((n) => h("th", {}, n))),
      shown.map((r) => h("tr", { class: "fl-epoch-row" },
        h("td", {}, r.epoch),
        names.map((n) => h("td", {}, fmtVal(r.values[n]))),
        h("td", { class: "fl-epoch-time" }, fmtEpochTime(r.seconds)),
        h("td", { class: "fl-epoch-rate" }, fmtRate(r.samples_per_s))))),
    more > 0 ? h("div", { class: "fl-muted" }, `${more} earlier epochs not shown`) : null);
}

function drawProgress(root, snap, tip) {
  root.replaceChildren();
  const steps = snap.steps || Math.max(snap.step || 0, 1);
  const frac = Math.min(1, (snap.step || 0) / steps);
  const title = (snap.title || "Evaluating") + ` ${snap.epoch}/${snap.epochs}`;
  const finished = snap.finished || [];
  const last = finished[finished.length - 1];
  const running = snap.status === "running";
  const rate = running && snap.samples_per_s != null ? snap.samples_per_s : last ? last.samples_per_s : null;
  root.append(
    h("div", { class: "fl-progress-head" },
      h("b", { class: "fl-progress-title" }, title),
      h("div", { class: `fl-progress-bar fl-status-${snap.status}` },
        h("div", { class: "fl-progress-fill", style: `width:${(frac * 100).toFixed(1)}%` })),
      h("span", { class: "fl-progress-count" }, `${snap.step}/${snap.steps || "?"}`),
      h("span", { class: "fl-progress-status" }, snap.status),
      h("span", { class: "fl-muted" }, `${(snap.elapsed || 0).toFixed(1)} s`)),
    h("div", { class: "fl-progress-values" },
      Object.entries(snap.values || {}).map(([k, v]) => h("span", { class: "fl-chip" }, `${k} `, h("code", {}, fmtVal(v))))),
    h("div", { class: "fl-progress-row" },
      lossChart(finished, tip),
      h("div", { class: "fl-progress-side" },
        h("div", { class: "fl-throughput" },
          h("span", { class: "fl-big" }, fmtRate(rate)), " samples/s",
          h("div", { class: "fl-muted" }, running ? "this epoch so far" : "last epoch")),
        h("div", { class: "fl-epoch-now" },
          running ? `epoch ${snap.epoch}: ${fmtEpochTime(snap.epoch_seconds)} so far`
                  : last ? `last epoch: ${fmtEpochTime(last.seconds)}` : ""),
        h("div", { class: "fl-replicas" },
          (snap.replicas || 1) > 1
            ? `${snap.replicas} replicas in sync${snap.strategy ? " (" + snap.strategy + ")" : ""}: the loss is their mean`
            : "1 replica"),
        workerLosses(last),
        batchSpark(snap.batch))),
    epochTable(snap));
}

export default {
  render({ model, el }) {
    el.classList.add("fl-view", "fl-progress");
    const tip = tooltip(el);
    const root = h("div", { class: "fl-progress-root" });
    el.append(root);
    return onSnapshot(model, (snap) => drawProgress(root, snap, tip));
  },
};
