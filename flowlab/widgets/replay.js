// The collective replay (flowlab/widgets/replay.py). Position 0 is the start (what each rank holds
// before any message); position k (1..F) is frame k-1 of the snapshot: its step's messages as
// arrows (a dot runs along each while it plays) and what each rank holds after it.
// DOM hooks (browser tests): root .fl-replay[data-alg][data-position]; .fl-replay-step;
// g.fl-replay-msg[data-src][data-dst][data-chunks][data-step][data-bytes];
// g.fl-replay-rank[data-rank][data-holds][data-wait].

const RP_SIZE = 380;
const RP_STEP_MS = 1100;   // one frame while playing
const RP_MOVE_MS = 700;    // a dot's trip

function rpPositions(layout, n, size) {
  const c = size / 2, r = size * 0.36, pts = [];
  if (layout === "star") {
    pts.push([c, c]);
    for (let i = 1; i < n; i++) {
      const a = -Math.PI / 2 + (2 * Math.PI * (i - 1)) / Math.max(1, n - 1);
      pts.push([c + r * Math.cos(a), c + r * Math.sin(a)]);
    }
    return pts.slice(0, n);
  }
  if (layout === "tree") {
    const levels = Math.max(1, Math.floor(Math.log2(n)) + 1);
    for (let i = 0; i < n; i++) {
      const lvl = Math.floor(Math.log2(i + 1)), first = (1 << lvl) - 1;
      const count = Math.min(1 << lvl, n - first);
      pts.push([(size * (i - first + 1)) / (count + 1), size * (0.14 + 0.72 * (lvl / Math.max(1, levels - 1)))]);
    }
    return pts;
  }
  for (let i = 0; i < n; i++) {
    const a = -Math.PI / 2 + (2 * Math.PI * i) / n;
    pts.push([c + r * Math.cos(a), c + r * Math.sin(a)]);
  }
  return pts;
}

function rpCurve(p1, p2, pad) {
  const dx = p2[0] - p1[0], dy = p2[1] - p1[1], d = Math.hypot(dx, dy) || 1;
  const ux = dx / d, uy = dy / d;
  const a = [p1[0] + ux * pad, p1[1] + uy * pad], b = [p2[0] - ux * (pad + 2), p2[1] - uy * (pad + 2)];
  const m = [(p1[0] + p2[0]) / 2 - uy * d * 0.12, (p1[1] + p2[1]) / 2 + ux * d * 0.12];
  const at = (t) => [(1 - t) * (1 - t) * a[0] + 2 * (1 - t) * t * m[0] + t * t * b[0],
                     (1 - t) * (1 - t) * a[1] + 2 * (1 - t) * t * m[1] + t * t * b[1]];
  return { d: `M${a[0].toFixed(1)},${a[1].toFixed(1)} Q${m[0].toFixed(1)},${m[1].toFixed(1)} ${b[0].toFixed(1)},${b[1].toFixed(1)}`, at };
}

// which chunks an arrow carries, in words (replay.py: _label)
function rpLabel(chunks, nblocks) {
  if (chunks.length === nblocks && nblocks > 1) return "all chunks";
  if (chunks.length === 1) return `chunk ${chunks[0]}`;
  const run = chunks.every((c, i) => c === chunks[0] + i);
  return run ? `chunks ${chunks[0]}-${chunks[chunks.length - 1]}` : `chunks ${chunks.join(",")}`;
}

function rpSizeLabel(n) { return fmtBytes(n).replace(".00 ", " "); }

export default {
  render({ model, el }) {
    const root = h("div", { class: "fl-view fl-replay" });
    el.append(root);
    const title = h("div", { class: "fl-replay-title" });
    const svg = s("svg", { class: "fl-replay-svg", width: RP_SIZE, height: RP_SIZE, viewBox: `0 0 ${RP_SIZE} ${RP_SIZE}` });
    const stepLabel = h("span", { class: "fl-replay-step" });
    const scrub = h("input", { type: "range", class: "fl-replay-scrub", min: 0, max: 0, value: 0 });
    const btn = (cls, text, tip, f) => h("button", { class: cls, title: tip, onclick: f }, text);
    const play = btn("fl-replay-play", "▶ play", "play / pause", () => (timer ? pause() : start()));
    const controls = h("div", { class: "fl-replay-controls" },
      btn("fl-replay-first", "|◀", "the start", () => go(0)),
      btn("fl-replay-back", "◀ step", "one step back", () => go(pos - 1)),
      play,
      btn("fl-replay-fwd", "step ▶", "one step forward", () => go(pos + 1, true)),
      btn("fl-replay-last", "▶|", "the end", () => go(frames().length)),
      scrub, stepLabel);
    const numbers = h("div", { class: "fl-replay-numbers" });
    const ranksTable = h("div", { class: "fl-replay-ranks" });
    // the re-run form (built once: what the learner chose survives redraws)
    const sel = (cls, options, value) => {
      const el = h("select", { class: cls }, options.map(([v, t]) => h("option", { value: v }, t)));
      el.value = String(value);
      return el;
    };
    const algSel = sel("fl-replay-alg", [["ring", "ring"], ["tree", "tree"], ["naive", "naive"]], "ring");
    const sizeSel = sel("fl-replay-size", [[4096, "4 KiB"], [65536, "64 KiB"], [1048576, "1 MiB"], [8388608, "8 MiB"]], 1048576);
    const ranksSel = sel("fl-replay-nranks", [2, 3, 4, 5, 6, 8].map((k) => [k, `${k} ranks`]), 4);
    const slowSel = h("select", { class: "fl-replay-slow" });
    const delayIn = h("input", { class: "fl-replay-delay", type: "number", min: 0, max: 200, step: 1, value: 5 });
    const fillSlow = () => {
      const keep = slowSel.value;
      slowSel.replaceChildren(h("option", { value: "" }, "no slow rank"),
        ...Array.from({ length: Number(ranksSel.value) }, (_, r) => h("option", { value: r }, `rank ${r} slow`)));
      slowSel.value = Number(keep) < Number(ranksSel.value) ? keep : "";
    };
    ranksSel.addEventListener("change", fillSlow);
    fillSlow();
    const message = h("span", { class: "fl-replay-message" });
    const rerun = h("button", { class: "fl-replay-rerun" }, "Re-run");
    rerun.addEventListener("click", () => {
      rerun.disabled = true;
      message.textContent = "recording…";
      message.classList.remove("fl-error");
      const args = { algorithm: algSel.value, nbytes: Number(sizeSel.value), world_size: Number(ranksSel.value),
                     slow_rank: slowSel.value === "" ? null : Number(slowSel.value), delay_ms: Number(delayIn.value) };
      act(model, "rerun", args).then((reply) => {
        rerun.disabled = false;
        if (reply.error) { message.textContent = reply.error; message.classList.add("fl-error"); return; }
        const r = reply.result;
        message.textContent = `recorded: ${r.alg}, ${r.ranks} ranks, ${rpSizeLabel(r.nbytes)}, ${r.frames} steps`;
        autoplay = true;
      });
    });
    const form = h("div", { class: "fl-replay-form" }, algSel, sizeSel, ranksSel, slowSel,
                   h("label", {}, "delay ", delayIn, " ms"), rerun, message);
    root.append(title, h("div", { class: "fl-replay-main" },
      h("div", { class: "fl-replay-left" }, svg, controls),
      h("div", { class: "fl-replay-right" }, numbers, ranksTable)), form);

    let snap = {}, pos = 0, timer = null, anim = null, autoplay = false;
    const frames = () => snap.frames || [];

    function pause() {
      if (timer) clearInterval(timer);
      timer = null;
      play.textContent = "▶ play";
    }
    function start() {
      if (pos >= frames().length) go(0);
      play.textContent = "⏸ pause";
      timer = setInterval(() => {
        if (pos >= frames().length) { pause(); return; }
        go(pos + 1, true, true);
      }, RP_STEP_MS);
      go(pos + 1, true, true);
    }
    function go(k, animate = false, playing = false) {
      if (!playing) pause();
      k = Math.max(0, Math.min(frames().length, k));
      const moved = k === pos + 1;
      pos = k;
      scrub.value = String(k);
      if (anim) cancelAnimationFrame(anim);
      anim = null;
      if (animate && moved && k > 0) {
        const t0 = performance.now();
        const tick = (now) => {
          const p = Math.min(1, (now - t0) / RP_MOVE_MS);
          draw(k, p);
          anim = p < 1 ? requestAnimationFrame(tick) : null;
        };
        draw(k, 0);
        anim = requestAnimationFrame(tick);
      } else {
        draw(k, 1);
      }
    }
    scrub.addEventListener("input", () => go(Number(scrub.value)));

    function holdsAt(k) { return k === 0 ? snap.initial || [] : frames()[k - 1].holds; }

    function draw(k, p) {
      const n = snap.ranks || 0, fs = frames();
      const frame = k > 0 ? fs[k - 1] : null;
      root.dataset.position = String(k);
      stepLabel.textContent = frame
        ? `frame ${k} of ${fs.length} · step ${frame.step} · ${frame.phase}` + (frame.folded_messages ? ` (+${frame.folded_messages} arrows folded)` : "")
        : `start (0 of ${fs.length}) · every rank holds only its own data`;
      const pts = rpPositions(snap.layout, n, RP_SIZE);
      const node = Math.max(8, Math.min(22, RP_SIZE / (3.2 * Math.max(n, 1))));
      const holds = holdsAt(p >= 1 ? k : k - 1);
      const full = snap.full || 1, nb = snap.blocks || 1;
      const ranks = Array.from({ length: n }, (_, r) => r);
      svg.replaceChildren(s("defs", {}, s("marker", { id: "fl-rp-arrow", viewBox: "0 0 6 6", refX: 5, refY: 3,
        markerWidth: 6, markerHeight: 6, orient: "auto" }, s("path", { d: "M0,0L6,3L0,6z", fill: "#666" }))));
      const maxWait = frame ? Math.max(1e-9, ...frame.wait) : 1;
      // ranks
      for (const r of ranks) {
        const [x, y] = pts[r];
        const row = holds[r] || [];
        const done = row.length > 0 && row.every((v) => v >= full);
        const wait = frame ? frame.wait[r] : 0;
        const slow = snap.slow && snap.slow.rank === r;
        const g = s("g", { class: "fl-replay-rank" + (done ? " fl-replay-done" : "") + (slow ? " fl-replay-slowed" : ""),
                           "data-rank": r, "data-holds": row.join(","), "data-wait": wait });
        g.append(s("circle", { cx: x, cy: y, r: node, fill: done ? "#e8f5e9" : "var(--jp-layout-color1, #fff)",
                               stroke: colourOf(r, ranks), "stroke-width": slow ? 4 : 2 }));
        g.append(s("text", { x, y: y + 4, "text-anchor": "middle", class: "fl-replay-rankname" }, String(r)));
        // one square per block: filled as far as the block's reduction has got on this rank
        const sq = Math.max(3, Math.min(9, (2.6 * node) / nb)), w = sq * nb;
        row.forEach((v, b) => {
          const f = Math.min(1, v / full);
          g.append(s("rect", { x: x - w / 2 + b * sq, y: y + node + 3, width: sq - 1, height: sq - 1,
                               class: "fl-replay-block", fill: f >= 1 ? "#2e7d32" : "#4e79a7", "fill-opacity": 0.12 + 0.88 * f },
                     s("title", {}, `rank ${r}, chunk ${b * (snap.block_ranks || 1)}: ${v}/${full} ranks' data`)));
        });
        if (frame && wait > 0 && p >= 1) {
          const len = (26 * wait) / maxWait;
          g.append(s("rect", { x: x - 13, y: y - node - 8, width: Math.max(1, len), height: 4, class: "fl-replay-waitbar" }));
          g.append(s("text", { x: x + 15, y: y - node - 4, class: "fl-replay-waittext" }, fmtSeconds(wait)));
        }
        g.append(s("title", {}, `rank ${r}` + (slow ? ` (slowed: ${snap.slow.delay_ms} ms per message)` : "") +
                   (frame ? `\nwaited ${fmtSeconds(wait)} in this step` : "") +
                   `\nholds: ${row.map((v) => `${v}/${full}`).join(" ")}`));
        svg.append(g);
      }
      // this step's messages
      if (frame) {
        for (const m of frame.messages) {
          const c = rpCurve(pts[m.src], pts[m.dst], node);
          const label = rpLabel(m.chunks, snap.op === "broadcast" ? 1 : n);
          const g = s("g", { class: "fl-replay-msg" + (m.reduce ? " fl-replay-reduce" : " fl-replay-copy"),
                             "data-src": m.src, "data-dst": m.dst, "data-chunks": m.chunks.join(","),
                             "data-step": frame.step, "data-bytes": m.bytes });
          g.append(s("path", { d: c.d, "marker-end": "url(#fl-rp-arrow)" }));
          const [dx, dy] = c.at(p);
          g.append(s("circle", { cx: dx, cy: dy, r: 4, class: "fl-replay-dot" }));
          const [lx, ly] = c.at(0.5);
          g.append(s("text", { x: lx, y: ly - 3, "text-anchor": "middle", class: "fl-replay-msglabel" },
                     `${label.replace("all chunks", "all").replace("chunks ", "c").replace("chunk ", "c")} · ${rpSizeLabel(m.bytes)}`));
          g.append(s("title", {}, `rank ${m.src} → rank ${m.dst}: ${label}, ${rpSizeLabel(m.bytes)}` +
                     (m.parts > 1 ? ` in ${m.parts} parts` : "") + (m.reduce ? ", added on arrival" : ", copied on arrival") +
                     `\nsent at ${fmtSeconds(m.start)}, received by ${fmtSeconds(m.end)}`));
          svg.append(g);
        }
      }
    }

    function drawNumbers() {
      const md = snap.model, ms = snap.measured || {}, rec = snap.recorded || {};
      const row = (name, a, b) => h("tr", {}, h("td", {}, name), h("td", {}, a), h("td", {}, b));
      numbers.replaceChildren(h("table", { class: "fl-replay-table" },
        h("tr", {}, h("th", {}, ""), h("th", {}, "recorded"), h("th", {}, "α-β model")),
        row("steps", rec.steps, md ? md.steps : "-"),
        row("bytes, busiest link", rpSizeLabel(rec.bytes), md ? rpSizeLabel(md.bytes) : "-"),
        row("time", h("span", { class: "fl-replay-measured" }, fmtSeconds(ms.seconds)),
            h("span", { class: "fl-replay-predicted" }, md ? fmtSeconds(md.seconds) : "-")),
        row("measured / model", md && md.ratio ? md.ratio.toFixed(2) + "×" : "-", ""),
        row("α, β", "", md ? `${fmtSeconds(md.alpha)}, ${(md.beta * 1e9).toFixed(3)} ns/B` : "-"),
        row("algbw", ms.algbw ? fmtBytes(ms.algbw) + "/s" : "-", ""),
        row(`busbw (× ${ms.factor_formula})`, h("span", { class: "fl-replay-busbw" }, ms.busbw ? fmtBytes(ms.busbw) + "/s" : "-"), "")));
      const per = snap.per_rank || [];
      const slowest = per.reduce((a, b) => (b.wait > (a ? a.wait : -1) ? b : a), null);
      ranksTable.replaceChildren(h("table", {},
        h("tr", {}, h("th", {}, "rank"), h("th", {}, "waiting"), h("th", {}, "working"), h("th", {}, "done at")),
        ...per.map((p) => h("tr", { class: slowest && p.rank === slowest.rank ? "fl-replay-waitmost" : "" },
          h("td", {}, String(p.rank) + (snap.slow && snap.slow.rank === p.rank ? " (slowed)" : "")),
          h("td", {}, fmtSeconds(p.wait)), h("td", {}, fmtSeconds(p.busy)), h("td", {}, fmtSeconds(p.end))))));
    }

    const cleanup = onSnapshot(model, (next) => {
      snap = next;
      root.dataset.alg = snap.alg || "";
      const slow = snap.slow ? ` · rank ${snap.slow.rank} slowed by ${snap.slow.delay_ms} ms per message` : "";
      const folded = snap.folded_frames ? ` · ${snap.folded_frames} of ${snap.total_frames} steps folded` : "";
      title.replaceChildren(h("b", {}, `${snap.alg} ${snap.op}`),
        ` · ${snap.ranks} ranks · ${rpSizeLabel(snap.nbytes)} · ${snap.total_frames} steps from ${snap.events} events${slow}${folded}`);
      scrub.max = String(frames().length);
      drawNumbers();
      go(autoplay ? 0 : Math.min(pos, frames().length));
      if (autoplay) { autoplay = false; start(); }
    });
    return () => { pause(); if (anim) cancelAnimationFrame(anim); cleanup(); };
  },
};
