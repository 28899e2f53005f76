// Playground: a real, small GRPO run on column addition with the settings picked here; each run links to its
// curves and groups (where a collapse shows first). A refusal stays on screen until dismissed or 5 s have passed.
"use strict";

const PG_ERROR_MS = 5000;

function pgError(box) {
  let timer = null;
  const hide = () => { clearTimeout(timer); box.hidden = true; box.replaceChildren(); };
  return { hide, show: message => {
    clearTimeout(timer);
    box.replaceChildren(el("span", { id: "pg-error-text" }, message), " ", el("button", { id: "pg-error-dismiss", title: "dismiss", onclick: hide }, "×"));
    box.hidden = false;
    timer = setTimeout(hide, PG_ERROR_MS);
  } };
}
function pgRunsTable(ids) {
  const byId = Object.fromEntries(state.runs.map(r => [r.id, r]));
  return el("table", { id: "pg-runs" }, el("tr", {}, ...["run", "learning_rate", "epsilon", "beta", "G", "steps", "reward/mean", "open"]
    .map(h => el("th", {}, h))), ...ids.slice().reverse().map(id => { const r = byId[id] || { config: {}, last: {} }, m = state.metrics[id];
    return el("tr", { "data-run": id }, el("td", { class: "text" }, id), ...["learning_rate", "epsilon", "beta", "num_generations"]
      .map(k => el("td", {}, fmt(r.config[k]))), el("td", {}, m ? m.step.length : "–"),
      el("td", {}, fmt(m && m.series["reward/mean"] ? m.series["reward/mean"].at(-1) : null)),
      el("td", { class: "text" }, runLink("curves", id, "curves"), " ", runLink("groups", id, "groups"))); }));
}
explainer("playground", "Playground: a real GRPO run on column addition", panel => {
  const field = (name, value) => [el("label", {}, ` ${name} `), el("input", { id: `pg-${name}`, value, size: 7 })];
  const fields = { epsilon: 0.2, beta: 0.0, num_generations: 4, learning_rate: 0.0005, max_steps: 10 };
  const status = el("div", { id: "pg-status" }), plotBox = el("div", { class: "charts", id: "pg-charts" });
  const errorBox = el("div", { id: "pg-error", class: "note error", role: "alert", hidden: true }), error = pgError(errorBox);
  const runsBox = el("div", { id: "pg-runs-box" });
  const start = el("button", { id: "pg-start" }, "Start"), cancel = el("button", { id: "pg-cancel" }, "Cancel");
  panel.append(el("p", { class: "meta" }, "Try a large learning rate (5e-3): the run collapses, and its groups show how."),
    el("div", {}, ...Object.entries(fields).flatMap(([k, v]) => field(k, v)), " ", start, " ", cancel), errorBox, status, plotBox, runsBox);
  let listed = "";
  const draw = async ids => {
    for (const id of ids) await pollMetrics(id);
    plotBox.replaceChildren();
    window.ahaCharts = window.ahaCharts.filter(c => c.key !== "playground");
    if (!ids.length) return;
    const known = new Set(state.runs.filter(r => Object.keys(r.config).length).map(r => r.id));
    if (ids.join() !== listed || ids.some(id => !known.has(id))) { listed = ids.join(); await loadRuns(); }  // until each run's config is written
    const { xs, values } = aligned(ids, "reward/mean");
    chart(plotBox, "playground", "reward/mean of playground runs", xs, ids.map((id, i) => ({ label: id, values: values[i] })));
    runsBox.replaceChildren(pgRunsTable(ids));
  };
  const poll = async () => {
    const st = await api("/api/playground");
    const last = st.jobs[st.jobs.length - 1];
    const steps = last && state.metrics[last.id] ? state.metrics[last.id].step.length : 0;
    status.replaceChildren(last ? `${last.id}: ${last.state}, ${steps} step(s) logged ` :
      `no playground run yet (at most ${st.max_steps} steps, ${st.time_s} s each)`, last ? runLink("groups", last.id, "its groups") : "",
      last ? " " : "", last ? runLink("curves", last.id, "its curves") : "");
    status.dataset.state = last ? last.state : "";
    status.dataset.steps = steps;
    await draw(st.runs);
  };
  start.addEventListener("click", async () => {
    const body = Object.fromEntries(Object.keys(fields).map(k => [k, +document.getElementById(`pg-${k}`).value]));
    error.hide();  // before the request: a slow success must not hide a later click's refusal
    try { await api("/api/playground/start", body); } catch (e) { error.show(e.message); }
    await poll();
  });
  cancel.addEventListener("click", async () => {
    const got = await api("/api/playground/cancel", {});
    if (!got.cancelled) error.show(got.reason);
    await poll();
  });
  every(1000, poll);
});
