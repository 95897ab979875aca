// The result of fl.grading.check(...) (check.py): banner, cases table, hint, hidden checks.
function drawCheck(root, snap) {
  root.replaceChildren();
  const ok = !!snap.passed;
  root.classList.toggle("fl-check-passed", ok);
  root.classList.toggle("fl-check-failed", !ok);
  root.append(h("div", { class: "fl-check-banner" },
    h("span", { class: "fl-check-mark", text: ok ? "✓" : "✗" }),
    h("span", { class: "fl-check-title", text: snap.title && snap.title !== snap.id ? snap.title : snap.id }),
    h("span", { class: "fl-check-count",
                text: `${snap.n_passed} of ${snap.n_cases} check${snap.n_cases === 1 ? "" : "s"} passed` }),
    h("span", { class: "fl-check-points", text: `${flPts(snap.points)}/${flPts(snap.max_points)} points` +
                (ok && snap.hidden ? " if the hidden checks pass too" : "") })));
  const cases = snap.cases || [];
  if (cases.length) {
    const anyWhy = cases.some((c) => c.why);
    const cols = ["", "case", "inputs", "expected", "received"].concat(anyWhy ? ["why"] : []);
    const head = h("tr", {}, cols.map((t) => h("th", { text: t })));
    const rows = cases.map((c) => h("tr", { class: c.passed ? "fl-case-pass" : "fl-case-fail" },
      h("td", { class: "fl-case-mark", text: c.passed ? "✓" : "✗" }),
      h("td", { class: "fl-case-name", text: c.name }),
      h("td", {}, h("code", { text: c.inputs || "" })),
      h("td", {}, h("code", { text: c.expected || "" })),
      h("td", {}, h("code", { text: c.received || "" })),
      anyWhy && h("td", { class: "fl-case-why", text: c.why || "" })));
    root.append(h("table", { class: "fl-check-cases" }, h("thead", {}, head), h("tbody", {}, rows)));
    if (snap.cases_left_out) root.append(h("div", { class: "fl-muted", text: `… ${snap.cases_left_out} more cases` }));
  }
  if (snap.hint) {
    const of = snap.hints_total > 1 ? ` ${snap.hint_number} of ${snap.hints_total}` : "";
    root.append(h("div", { class: "fl-check-hint" }, h("b", { text: `Hint${of}: ` }), snap.hint));
  }
  if (snap.hidden_line) root.append(h("div", { class: "fl-check-hidden fl-muted", text: snap.hidden_line }));
  for (const note of snap.notes || []) root.append(h("div", { class: "fl-check-note", text: "⚠ " + note }));
  const lines = snap.clean_lines || [];
  if (lines.length) {
    root.append(h("pre", { class: "fl-check-clean " + (snap.clean_passed ? "fl-case-pass" : "fl-case-fail"),
                           text: lines.join("\n") }));
  }
}

// "Run it as the grader will": the saved notebook in a fresh kernel (check.py: run_clean)
function cleanButton(model, root) {
  const snap = model.get("snapshot") || {};
  if (!snap.can_clean) return null;
  const status = h("span", { class: "fl-muted fl-check-clean-status" });
  const button = h("button", { class: "fl-check-clean-button", text: "Run the saved notebook as the grader will",
                               title: "a fresh kernel runs the saved file top to bottom, then this exercise's checks" });
  button.addEventListener("click", async () => {
    button.disabled = true;
    status.textContent = " running the saved notebook in a fresh kernel…";
    const reply = await act(model, "clean", {});
    status.textContent = reply.error ? " " + reply.error : "";
    button.disabled = false;
  });
  return h("div", { class: "fl-view fl-check-clean-row" }, button, status);
}

export default {
  render({ model, el }) {
    const root = h("div", { class: "fl-view fl-check" });
    el.append(root);
    const off = onSnapshot(model, (snap) => drawCheck(root, snap));
    const row = cleanButton(model, root);
    if (row) el.append(row);
    return off;
  },
};

// points as the text form writes them (flowlab/grading/check.py _pts): whole numbers bare, else 3 digits
function flPts(p) {
  return Number.isInteger(p) ? String(p) : String(Number(Number(p).toPrecision(3)));
}
