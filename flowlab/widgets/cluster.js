// The cluster panel (flowlab/widgets/cluster.py: ClusterView). Joined after _common.js; the
// Python side appends `export default { render: renderClusterView }`, and launcher.js (joined
// after this file for LauncherView) uses clusterPanel() for its cluster mode.

const FL_STATES = ["starting", "idle", "busy", "alive", "unresponsive", "paused", "dead", "closed"];
const FL_STATE_TIPS = {
  starting: "starting: the process runs but has not answered yet",
  idle: "idle: alive, running nothing from this kernel",
  busy: "busy: running a request from this kernel",
  alive: "alive: answers its heartbeats",
  unresponsive: "unresponsive: its heartbeats stopped (stuck, or a very long C call)",
  paused: "paused: frozen with SIGSTOP (Resume wakes it)",
  dead: "dead: the process exited",
  closed: "closed: the cluster was stopped",
};

function flState(t) {
  const status = t.status || "starting";
  if (status === "alive" && (t.activity === "idle" || t.activity === "busy")) return t.activity;
  return status;
}

function flExitNote(t) {
  if (t.status !== "dead" || t.exitcode === null || t.exitcode === undefined) return "";
  return t.exitcode < 0 ? ` (signal ${-t.exitcode})` : ` (exit ${t.exitcode})`;
}

function flFaults(t, scheduled) {
  const f = t.faults || {};
  const parts = [];
  if (f.delay_ms) parts.push(`delay ${f.delay_ms} ms`);
  for (const k of ["drop", "corrupt"]) if (f[k]) parts.push(`${k} ${Math.round(f[k] * 1000) / 10}%`);
  if (t.status === "paused" || f.paused) parts.push("paused");
  for (const action of scheduled[t.task] || []) parts.push(`${action} scheduled`);
  return parts.join(", ");
}

function flDash(v, fmt) { return v === null || v === undefined ? "-" : fmt(v); }

function flAgo(e) {
  const attrs = ["signal", "pid", "delay_ms", "drop", "corrupt", "seed", "type"]
    .filter((k) => e.attrs && e.attrs[k] !== null && e.attrs[k] !== undefined)
    .map((k) => `${k}=${e.attrs[k]}`).join(", ");
  return `${(e.ago || 0).toFixed(1).padStart(6)} s ago  ${e.name}${e.task ? " " + e.task : ""}${attrs ? ` (${attrs})` : ""}`;
}

// The message box under the buttons: what an action did, its result (a stack, a log) or its error.
function flMessageBox() {
  const box = h("div", { class: "fl-cluster-message" });
  const run = (model, label, action, args) => {
    box.replaceChildren(h("span", { class: "fl-pending" }, `${label}…`));
    return act(model, action, args).then((reply) => {
      if (reply.error) {
        box.replaceChildren(h("pre", { class: "fl-error" }, `${label} failed: ${reply.error}`));
      } else if (reply.result && typeof reply.result === "object" && "text" in reply.result) {
        box.replaceChildren(h("div", { class: "fl-result-title" }, h("b", {}, reply.result.title || label),
                              h("button", { class: "fl-close-message", title: "hide",
                                            onclick: () => box.replaceChildren() }, "×")),
                            h("pre", { class: "fl-result-text" }, reply.result.text));
      } else {
        box.replaceChildren(h("span", { class: "fl-done" }, `${label}: done`,
                              reply.result ? ` (${reply.result})` : ""));
      }
      return reply;
    });
  };
  return { box, run };
}

// clusterPanel(model, root): draws a panel snapshot into root with draw(snap); the controls and the
// message box survive redraws (a snapshot arrives every 0.5 s while something changes).
function clusterPanel(model, root) {
  const message = flMessageBox();
  const title = h("div", { class: "fl-cluster-title" });
  const table = h("table", { class: "fl-cluster-table" });
  const taskSelect = h("select", { class: "fl-delay-task", title: "the task to slow down" });
  const msInput = h("input", { class: "fl-delay-ms", type: "number", min: 0, max: 60000, step: 50, value: 200,
                               title: "milliseconds added to every message it handles (0 removes the delay)" });
  const buttons = {};
  const button = (name, label, tip, onclick, cls) => {
    buttons[name] = h("button", { class: `fl-act-${name} ${cls || ""}`, title: tip, onclick }, label);
    return buttons[name];
  };
  const controls = h("div", { class: "fl-cluster-controls" },
    button("add_worker", "Add worker", "start one more worker; the next collective forms a group with it",
           () => message.run(model, "add worker", "add_worker", {})),
    button("stop", "Stop cluster", "end every task of this cluster (cluster.close())",
           () => message.run(model, "stop cluster", "stop", {}), "fl-danger"),
    h("span", { class: "fl-sep" }),
    taskSelect, msInput, h("span", { class: "fl-unit" }, "ms"),
    button("delay", "Delay", "delay every message the chosen task handles",
           () => message.run(model, `delay ${taskSelect.value}`, "delay",
                             { task: taskSelect.value, ms: Number(msInput.value) })),
    button("clear_faults", "Clear faults", "resume paused tasks, remove delays, drops and scheduled faults",
           () => message.run(model, "clear faults", "clear_faults", {})));
  const activity = h("div", { class: "fl-cluster-activity" });
  root.append(title, h("div", { class: "fl-table-wrap" }, table), controls, message.box, activity);
  root.classList.add("fl-cluster");
  let taskNames = "";

  // One row per task, made once and updated in place: a button must not be replaced under the
  // pointer (a snapshot arrives every 0.5 s while a task is busy, and a click spans mouse down to up).
  const rowsByTask = new Map();
  const makeRow = (task) => {
    const b = (name, label, tip) =>
      h("button", { class: `fl-act-${name}`, title: tip,
                    onclick: () => message.run(model, `${name} ${task}`, name, { task }) }, label);
    const buttons = {
      kill: b("kill", "Kill", "SIGKILL this task's process"),
      pause: b("pause", "Pause", "freeze it (SIGSTOP): calls waiting on it fail at once"),
      resume: b("resume", "Resume", "wake it (SIGCONT)"),
      restart: b("restart", "Restart", "start this task again (a new process that rejoins the group)"),
      stack: b("stack", "Stack", "its threads' current Python stacks (works while it is busy)"),
      log: b("log", "Log", "the last lines of its log (stdout and stderr)"),
    };
    const cell = (cls) => h("td", { class: cls });
    const cells = {
      pid: h("span", { class: "fl-pid" }), address: h("code", { class: "fl-address" }),
      state: cell("fl-state"), cpu: cell("fl-num fl-cpu"), rss: cell("fl-num fl-rss"),
      running: cell("fl-running"), msgs: cell("fl-num fl-msgs"), bytes: cell("fl-num fl-bytes"),
      spark: cell("fl-spark-cell"), faults: cell("fl-faults"),
    };
    // pid and address sit under the task's name, so that the row fits a notebook's width
    const tr = h("tr", { class: "fl-task", "data-task": task },
      h("td", { class: "fl-task-name" }, h("code", {}, task),
        h("div", { class: "fl-sub" }, "pid ", cells.pid, " · ", cells.address)),
      cells.state, h("td", { class: "fl-row-actions" }, Object.values(buttons)),
      cells.cpu, cells.rss, cells.running, cells.msgs, cells.bytes, cells.spark, cells.faults);
    return { tr, buttons, cells };
  };
  const updateRow = (row, t, state, closed, scheduled, unit) => {
    const { tr, buttons, cells } = row;
    const live = ["alive", "unresponsive", "paused", "starting"].includes(t.status);
    tr.className = `fl-task fl-row-${state}`;
    const enable = { kill: live, pause: live && state !== "starting", resume: true,
                     restart: t.status !== "closed", stack: live, log: t.status !== "closed" };
    for (const [name, button] of Object.entries(buttons)) {
      button.disabled = closed || !enable[name];
      button.hidden = closed || (name === "resume" ? t.status !== "paused" : name === "pause" && t.status === "paused");
    }
    cells.pid.textContent = flDash(t.pid, String);
    cells.address.textContent = t.address || "-";
    cells.state.className = `fl-state fl-state-${state}`;
    cells.state.title = FL_STATE_TIPS[state] || state;
    cells.state.replaceChildren(h("span", { class: "fl-dot" }), state + flExitNote(t));
    cells.cpu.textContent = flDash(t.cpu, (v) => `${Math.round(v)}%`);
    cells.rss.textContent = flDash(t.rss, fmtBytes);
    cells.running.replaceChildren(t.running ? h("code", {}, t.running) : "-");
    cells.msgs.textContent = `${flDash(t.msgs_in, String)} / ${flDash(t.msgs_out, String)}`;
    cells.bytes.textContent = `${flDash(t.bytes_in, fmtBytes)} / ${flDash(t.bytes_out, fmtBytes)}`;
    const spark = sparkline(t.history || [], 56, 16);
    spark.append(s("title", { text: `last ${(t.history || []).length} samples (${unit})` }));
    cells.spark.replaceChildren(spark);
    cells.faults.textContent = flFaults(t, scheduled);
  };
  const head = h("tr", {}, ...["task · pid · address", "state", "", "CPU", "memory", "running",
                               "msgs in/out", "bytes in/out", "activity", "faults"].map((c) => h("th", {}, c)));
  table.append(head);

  function draw(snap) {
    const tasks = snap.tasks || [];
    const closed = !!snap.closed;
    root.classList.toggle("fl-closed", closed);
    title.replaceChildren(
      h("b", {}, "LocalCluster"), " ",
      h("code", { class: "fl-target" }, closed ? "closed" : (snap.target || "")), " · ",
      `${snap.workers ?? tasks.length} worker(s)`, snap.ps ? `, ${snap.ps} ps` : "");
    const scheduled = {};
    for (const [, action, task] of snap.scheduled || []) (scheduled[task] = scheduled[task] || []).push(action);
    const unit = snap.history_unit || "%";
    const seen = new Set();
    let previous = head;
    for (const t of tasks) {
      let row = rowsByTask.get(t.task);
      if (!row) {
        row = makeRow(t.task);
        rowsByTask.set(t.task, row);
      }
      if (row.tr.previousSibling !== previous) previous.after(row.tr);   // in snapshot order; moved only if not
      previous = row.tr;
      updateRow(row, t, flState(t), closed, scheduled, unit);
      seen.add(t.task);
    }
    for (const [task, row] of rowsByTask) {
      if (!seen.has(task)) { row.tr.remove(); rowsByTask.delete(task); }
    }

    const names = tasks.map((t) => t.task).join("\n");
    if (names !== taskNames) {          // keep the user's choice across redraws
      const chosen = taskSelect.value;
      taskSelect.replaceChildren(...tasks.map((t) => h("option", { value: t.task }, t.task)));
      if (tasks.some((t) => t.task === chosen)) taskSelect.value = chosen;
      taskNames = names;
    }
    for (const b of Object.values(buttons)) b.disabled = closed;
    taskSelect.disabled = msInput.disabled = closed;

    const parts = [];
    if ((snap.scheduled || []).length) {
      parts.push(h("div", { class: "fl-scheduled" }, h("b", {}, "scheduled"),
        h("ul", {}, snap.scheduled.map(([at, action, task]) => h("li", {}, `${action} ${task} at +${at} s`)))));
    }
    if ((snap.recent || []).length) {
      parts.push(h("div", { class: "fl-recent" }, h("b", {}, "last faults"),
        h("pre", {}, snap.recent.slice(-6).reverse().map(flAgo).join("\n"))));
    }
    for (const run of snap.runs || []) {
      parts.push(h("div", { class: `fl-run fl-run-${run.state}` },
        h("b", {}, `run_with_recovery(${run.what})`), " ",
        h("span", { class: `fl-run-state fl-run-state-${run.state}` }, "● ", run.state),
        ` · ${(run.seconds || 0).toFixed(1)} s · `,
        h("span", { class: "fl-restarts" }, `${run.restarts.length} restart(s)`),
        run.restarts.length ? h("ul", {}, run.restarts.map((r) => h("li", {}, r))) : null,
        run.error ? h("div", {}, h("code", {}, run.error)) : null));
    }
    activity.replaceChildren(...parts);
  }
  return { draw, message };
}

function renderClusterView({ model, el }) {
  el.classList.add("fl-view", "fl-cluster-view");
  const panel = clusterPanel(model, el);
  return onSnapshot(model, panel.draw);
}
