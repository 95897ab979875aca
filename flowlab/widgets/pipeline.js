// The pipeline observatory: a PipelineStats snapshot (flowlab/data/stats.py) drawn as one row per
// stage, source first: its elements and throughput, its throughput over time, how long its consumer
// waited on it, its buffer's fill against its capacity over time, and AUTOTUNE's decisions (marked
// on the stage's charts and listed with their reasons).

function rateText(r) {
  if (r === null || r === undefined) return "-";
  return r >= 100 ? Math.round(r).toLocaleString("en-US") : r.toPrecision(3);
}

// bars of per-bucket values, with the decisions of this stage as vertical marks
function barChart(values, opts, tip) {
  const { width = 260, height = 38, cls = "fl-pipe-bars", bucket = 0.01, label, decisions = [], max } = opts;
  const svg = s("svg", { class: cls, width: "100%", height, viewBox: `0 0 ${width} ${height}`,
                         preserveAspectRatio: "none" });
  const n = values.length;
  const top = Math.max(max || 0, ...values.map((v) => v || 0)) || 1;
  const bw = width / Math.max(n, 1);
  values.forEach((v, i) => {
    if (!v) return;
    const bh = Math.max(1, ((height - 2) * v) / top);
    const bar = s("rect", { x: i * bw, y: height - bh, width: Math.max(bw - 0.5, 0.5), height: bh });
    bar.addEventListener("mousemove", (e) =>
      tip.show(`${(i * bucket).toFixed(2)}-${((i + 1) * bucket).toFixed(2)} s\n${label(v)}`, e));
    bar.addEventListener("mouseleave", () => tip.hide());
    svg.append(bar);
  });
  for (const d of decisions) {
    const x = Math.min(width - 1, (d.time / bucket) * bw);
    const mark = s("line", { x1: x, x2: x, y1: 0, y2: height, class: "fl-pipe-decision" });
    mark.addEventListener("mousemove", (e) => tip.show(`${d.time.toFixed(3)} s AUTOTUNE\n${d.parameter} ${d.old} -> ${d.new}`, e));
    mark.addEventListener("mouseleave", () => tip.hide());
    svg.append(mark);
  }
  return svg;
}

// mean buffer fill per bucket (area) against the capacity (a step line)
function fillChart(series, bucket, decisions, tip, width = 260, height = 38) {
  const svg = s("svg", { class: "fl-pipe-fill", width: "100%", height, viewBox: `0 0 ${width} ${height}`,
                         preserveAspectRatio: "none" });
  const fill = series.fill || [], cap = series.capacity || [];
  const top = Math.max(1, ...cap, ...fill.map((v) => v || 0));
  const n = fill.length, bw = width / Math.max(n, 1);
  const y = (v) => height - 1 - ((height - 3) * v) / top;
  let capPts = [];
  fill.forEach((v, i) => {
    if (cap[i]) capPts.push(`${i * bw},${y(cap[i])}`, `${(i + 1) * bw},${y(cap[i])}`);
    if (v === null || v === undefined) return;
    const r = s("rect", { x: i * bw, y: y(v), width: Math.max(bw - 0.5, 0.5), height: height - 1 - y(v), class: "fl-pipe-fillbar" });
    r.addEventListener("mousemove", (e) =>
      tip.show(`${(i * bucket).toFixed(2)}-${((i + 1) * bucket).toFixed(2)} s\nready when asked: ${v.toFixed(1)} of ${cap[i] || "?"}`, e));
    r.addEventListener("mouseleave", () => tip.hide());
    svg.append(r);
  });
  if (capPts.length) svg.append(s("polyline", { points: capPts.join(" "), class: "fl-pipe-capacity", fill: "none" }));
  for (const d of decisions) {
    const x = Math.min(width - 1, (d.time / bucket) * bw);
    svg.append(s("line", { x1: x, x2: x, y1: 0, y2: height, class: "fl-pipe-decision" }));
  }
  return svg;
}

function stageRow(st, snap, tip) {
  const bucket = snap.bucket_s || 0.01;
  const series = st.series || { elements: [] };
  const seconds = snap.seconds || 0;
  const buffered = (st.requests || 0) > 0 || !!series.requests;
  const waitShare = seconds > 0 ? Math.min(1, (st.wait_s || 0) / seconds) : 0;
  const knobs = [];
  if (st.parallelism !== null && st.parallelism !== undefined) knobs.push(`${st.parallelism} worker${st.parallelism === 1 ? "" : "s"}`);
  if (st.buffer_size !== null && st.buffer_size !== undefined) knobs.push(`buffer ${st.buffer_size}`);
  const tuned = (st.autotune || []).length;
  const recent = series.elements.length ? series.elements[series.elements.length - 1] / bucket : null;
  return h("div", { class: "fl-stage", "data-stage": st.name },
    h("div", { class: "fl-stage-name" },
      h("b", {}, st.name),
      knobs.length ? h("div", { class: "fl-muted" }, knobs.join(", ")) : null,
      tuned ? h("span", { class: "fl-badge", title: "AUTOTUNE changed this stage" }, `AUTOTUNE x${tuned}`) : null),
    h("div", { class: "fl-stage-numbers" },
      h("div", {}, h("span", { class: "fl-stage-rate" }, rateText(st.throughput)), " elements/s"),
      h("div", { class: "fl-muted" }, `${st.elements.toLocaleString("en-US")} elements`),
      snap.running && recent !== null ? h("div", { class: "fl-muted" }, `now ${rateText(recent)}/s`) : null),
    h("div", { class: "fl-stage-chart" },
      h("div", { class: "fl-muted" }, "elements made over time"),
      barChart(series.elements, { bucket, tip, label: (v) => `${v} elements (${rateText(v / bucket)}/s)`,
                                  decisions: st.autotune || [] })),
    h("div", { class: "fl-stage-wait" },
      buffered
        ? [h("div", { class: "fl-muted" }, "its consumer waited"),
           h("div", { class: "fl-waitbar", title: `${fmtSeconds(st.wait_s)} of ${fmtSeconds(seconds)}` },
             h("div", { class: "fl-waitbar-fill", style: `width:${(waitShare * 100).toFixed(1)}%` })),
           h("div", { class: "fl-stage-waittext" }, `${fmtSeconds(st.wait_s)} (${(waitShare * 100).toFixed(0)}%), `
             + `${st.blocked} of ${st.requests} requests`)]
        : h("div", { class: "fl-muted" }, "sequential: its consumer calls it directly")),
    h("div", { class: "fl-stage-chart" },
      buffered && series.fill
        ? [h("div", { class: "fl-muted" }, "buffer: ready when asked / capacity"),
           fillChart(series, bucket, st.autotune || [], tip)]
        : null));
}

function drawPipeline(root, snap, tip) {
  root.replaceChildren();
  const stages = snap.stages || [];
  const decisions = snap.autotune || [];
  root.append(
    h("div", { class: "fl-pipe-head" },
      h("b", {}, `pipeline ${snap.pipeline ?? "-"}`),
      h("span", { class: `fl-pipe-state ${snap.running ? "fl-running" : "fl-finished"}` },
        snap.running ? "running" : "finished"),
      h("span", {}, `${(snap.seconds || 0).toFixed(2)} s`),
      h("span", { class: "fl-muted" }, `${stages.length} stages, source first; one bar = ${fmtSeconds(snap.bucket_s)}`),
      snap.counting === false ? h("span", { class: "fl-error" }, "stats off (Options.stats.enabled is False)") : null),
    h("div", { class: "fl-stages" }, stages.map((st) => stageRow(st, snap, tip))),
    h("div", { class: "fl-autotune" },
      h("b", {}, `AUTOTUNE: ${decisions.length} decision${decisions.length === 1 ? "" : "s"}`),
      decisions.length
        ? h("ol", {}, decisions.map((d) => h("li", { class: "fl-decision" },
            h("code", {}, `${d.time.toFixed(3)} s`), ` ${d.stage} ${d.parameter} ${d.old} \u2192 ${d.new}: `,
            h("span", { class: "fl-reason" }, d.reason))))
        : h("div", { class: "fl-muted" }, "none: no stage was given fl.data.AUTOTUNE, or none had to grow")));
}

export default {
  render({ model, el }) {
    el.classList.add("fl-view", "fl-pipeline");
    const tip = tooltip(el);
    const root = h("div", { class: "fl-pipeline-root" });
    el.append(root);
    return onSnapshot(model, (snap) => drawPipeline(root, snap, tip));
  },
};
