// The launcher (flowlab/widgets/launcher_view.py: LauncherView), joined after _common.js and cluster.js:
// a form that starts a LocalCluster, the clusters this kernel started, and, once one is started
// or shown, that cluster's panel (clusterPanel from cluster.js) with a way back to the form.

function launcherForm(model, root) {
  const message = flMessageBox();
  const workers = h("input", { class: "fl-launch-workers", type: "number", min: 1, max: 16, value: 2 });
  const ps = h("input", { class: "fl-launch-ps", type: "number", min: 0, max: 16, value: 0 });
  const transport = h("select", { class: "fl-launch-transport" });
  const note = h("div", { class: "fl-launch-note" });
  const start = h("button", { class: "fl-act-start fl-primary", title: "start the cluster and show its panel",
    onclick: () => message.run(model, "start", "start",
      { workers: Number(workers.value), ps: Number(ps.value), transport: transport.value }) }, "Start");
  const list = h("div", { class: "fl-launch-list" });
  root.append(
    h("div", { class: "fl-cluster-title" }, h("b", {}, "Start a LocalCluster")),
    h("div", { class: "fl-launch-form" },
      h("label", {}, "workers ", workers), h("label", {}, "parameter servers ", ps),
      h("label", {}, "transport ", transport), start),
    note, message.box, list);
  let filled = false;
  const describe = () => { note.textContent = (model.get("snapshot").transports || {})[transport.value] || ""; };
  transport.addEventListener("change", describe);

  function draw(snap) {
    const d = snap.defaults || {};
    if (!filled) {       // the defaults once: later redraws keep what the user typed
      transport.replaceChildren(...Object.keys(snap.transports || {}).map((k) => h("option", { value: k }, k)));
      workers.value = d.workers ?? 2; ps.value = d.ps ?? 0; transport.value = d.transport || "unix+tcp";
      filled = true;
    }
    describe();
    const clusters = snap.clusters || [];
    list.replaceChildren(...[h("b", {}, clusters.length ? "clusters this kernel started" : "no cluster is open"),
      clusters.length ? h("table", { class: "fl-launch-clusters" },
        h("tr", {}, ...["#", "target", "workers", "ps", "transport", ""].map((c) => h("th", {}, c))),
        ...clusters.map((c, i) => h("tr", { class: "fl-launch-cluster", "data-index": i },
          h("td", {}, String(i)), h("td", {}, h("code", {}, c.target || "-")), h("td", {}, String(c.workers)),
          h("td", {}, String(c.ps)), h("td", {}, c.transport || "-"),
          h("td", {}, h("button", { class: "fl-act-show", title: "show this cluster's panel",
            onclick: () => message.run(model, `show #${i}`, "show", { index: i }) }, "Show"))))) : null]
      .filter((c) => c !== null));
  }
  return { draw };
}

export default {
  render({ model, el }) {
    el.classList.add("fl-view", "fl-launcher");
    const formRoot = h("div", { class: "fl-launcher-form" });
    const back = h("button", { class: "fl-act-back", title: "the form and the list of clusters",
      onclick: () => act(model, "back", {}) }, "← All clusters");
    const panelRoot = h("div", {});
    const panelBox = h("div", { class: "fl-launcher-panel" }, back, panelRoot);
    el.append(formRoot, panelBox);
    const form = launcherForm(model, formRoot);
    const panel = clusterPanel(model, panelRoot);
    return onSnapshot(model, (snap) => {
      const cluster = snap.mode === "cluster";
      formRoot.style.display = cluster ? "none" : "";
      panelBox.style.display = cluster ? "" : "none";
      (cluster ? panel : form).draw(snap);
    });
  },
};
