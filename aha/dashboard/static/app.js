// aha dashboard: hash-routed pages over the JSON API. Every number about GRPO comes from the server
// (aha.algos); this file only fetches, lays out and draws.
"use strict";

const view = document.getElementById("view");
const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#be185d", "#65a30d"];
const POLL_MS = 2000;
const state = { runs: [], selected: null, metrics: {}, timers: [] };
window.ahaCharts = [];  // {key, plot}: read by the browser tests

// ---------------------------------------------------------------- helpers
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(c ?? ""));
  return e;
}
async function api(path, body) {
  const opts = body === undefined ? {} : { method: "POST", headers: { "content-type": "application/json" },
                                           body: JSON.stringify(body) };
  const r = await fetch(path, opts);
  const data = await r.json();
  if (!r.ok) throw new Error(data.error || r.statusText);
  return data;
}
function fmt(v) {
  if (v === null || v === undefined) return "–";
  if (typeof v !== "number") return String(v);
  return Math.abs(v) >= 1000 || (Math.abs(v) < 1e-3 && v !== 0) ? v.toExponential(3) : (+v.toFixed(4)).toString();
}
function setStatus(text) { document.getElementById("status").textContent = text; }
function every(ms, fn) { fn(); state.timers.push(setInterval(fn, ms)); }
function hashParams() { return new URLSearchParams(location.hash.split("?")[1] || ""); }

function chart(parent, key, title, xs, series, opts = {}) {
  // series: [{label, values}] on the shared x values xs
  const box = el("div", { class: "chart", "data-key": key });
  parent.append(box);
  const plot = new uPlot({
    title, width: opts.width || 380, height: opts.height || 200,
    scales: { x: { time: false } },
    series: [{ label: opts.xlabel || "step" },
             ...series.map((s, i) => ({ label: s.label, stroke: s.color || COLORS[i % COLORS.length], spanGaps: true,
                                        points: { show: xs.length < 40 } }))],
    axes: [{}, { size: 55 }],
  }, [xs, ...series.map(s => s.values)], box);
  window.ahaCharts.push({ key, plot });
  return plot;
}
function aligned(runIds, key) {
  // one x axis for several runs' series of `key` (uPlot.join aligns differing steps)
  const tables = runIds.map(id => { const m = state.metrics[id]; return [m.step, m.series[key] || m.step.map(() => null)]; });
  if (tables.length === 1) return { xs: tables[0][0], values: [tables[0][1]] };
  const joined = uPlot.join(tables);
  return { xs: joined[0], values: joined.slice(1) };
}

// ---------------------------------------------------------------- data
async function loadRuns() {
  const data = await api("/api/runs");
  state.runs = data.runs;
  if (state.selected === null) state.selected = state.runs.filter(r => r.steps > 0).slice(0, 1).map(r => r.id);
  return state.runs;
}
async function pollMetrics(id) {
  const m = state.metrics[id] || (state.metrics[id] = { offset: 0, step: [], series: {}, bad: [], partial: null });
  const got = await api(`/api/metrics?run=${encodeURIComponent(id)}&offset=${m.offset}`);
  if (got.reset) { Object.assign(m, { step: [], series: {}, bad: [] }); }
  const before = m.step.length;
  for (const key of Object.keys(got.series)) if (!(key in m.series)) m.series[key] = m.step.map(() => null);
  m.step.push(...got.step);
  for (const key of Object.keys(m.series)) m.series[key].push(...(got.series[key] || got.step.map(() => null)));
  const noteChanged = JSON.stringify(m.partial) !== JSON.stringify(got.partial) || got.bad.length > 0;
  m.offset = got.offset; m.partial = got.partial; m.bad.push(...got.bad);
  return m.step.length !== before || got.reset || noteChanged;
}
function fileNotes(parent, id) {
  const m = state.metrics[id];
  for (const b of m.bad) parent.append(el("div", { class: "note bad-line" },
    `${id}: metrics.jsonl line at byte ${b.at_byte} is not a JSON object, skipped: ${b.text}`));
  if (m.partial) parent.append(el("div", { class: "note partial-line" },
    `${id}: the last line of metrics.jsonl is partial (${m.partial.bytes} bytes, no newline yet: being written, or torn)`));
}

// ---------------------------------------------------------------- pages
async function pageRuns() {
  view.append(el("h2", {}, "Runs"));
  const runs = await loadRuns();
  if (!runs.length) { view.append(el("p", {}, "No runs found.")); return; }
  const table = el("table", { id: "runs-table" }, el("tr", {}, ...["overlay", "run", "steps", "config", "reward/mean",
    "eval/accuracy", "completion/len_mean", "behaviour/reflection_rate", "files"].map(h => el("th", {}, h))));
  for (const r of runs) {
    const box = el("input", { type: "checkbox", "data-run": r.id });
    box.checked = state.selected.includes(r.id);
    box.addEventListener("change", () => {
      state.selected = [...document.querySelectorAll("#runs-table input:checked")].map(b => b.dataset.run);
    });
    const cfg = Object.entries(r.config).filter(([, v]) => v !== null && v !== "").map(([k, v]) => `${k}=${v}`).join("  ") + (r.config_error ? ` (${r.config_error})` : "");
    const files = el("td", { class: "text" }, ...r.files.flatMap(f => [
      el("a", { href: `/api/file?run=${encodeURIComponent(r.id)}&path=${encodeURIComponent(f)}`, target: "_blank" }, f), el("br")]));
    table.append(el("tr", {}, el("td", {}, box), el("td", { class: "text" }, r.id), el("td", {}, r.steps),
      el("td", { class: "text" }, cfg), el("td", {}, fmt(r.last["reward/mean"])), el("td", {}, fmt(r.last["eval/accuracy"])),
      el("td", {}, fmt(r.last["completion/len_mean"])), el("td", {}, fmt(r.last["behaviour/reflection_rate"])), files));
  }
  view.append(table, el("p", {}, el("button", { id: "overlay", onclick: () => { location.hash = "#curves"; } },
    "Overlay the ticked runs' curves")));
}

function curvePanels(ids) {
  const keys = new Set();
  for (const id of ids) Object.keys(state.metrics[id].series).forEach(k => keys.add(k));
  const all = [...keys].sort();
  return { behaviour: all.filter(k => k.startsWith("behaviour/")), other: all.filter(k => !k.startsWith("behaviour/")) };
}
function drawCurves(box, ids) {
  box.replaceChildren(); window.ahaCharts = [];
  if (!ids.length) return;
  for (const id of ids) fileNotes(box, id);
  const label = (id, key) => ids.length > 1 ? `${id} ${key}` : key;
  const head = el("div", { class: "charts" });
  box.append(el("h3", {}, "Reward beside held-out accuracy"), head);
  const pairs = ids.flatMap(id => ["reward/mean", "eval/accuracy"].map(k => [id, k]));
  const joined = uPlot.join(pairs.map(([id, k]) => [state.metrics[id].step, state.metrics[id].series[k] || state.metrics[id].step.map(() => null)]));
  chart(head, "reward+eval", "reward/mean and eval/accuracy", joined[0],
        pairs.map(([id, k], i) => ({ label: label(id, k), values: joined[i + 1] })));
  const { behaviour, other } = curvePanels(ids);
  for (const [title, keys] of [["Behaviour", behaviour], ["Every metric", other]]) {
    const grid = el("div", { class: "charts" });
    box.append(el("h3", {}, title), grid);
    for (const key of keys) {
      const { xs, values } = aligned(ids, key);
      chart(grid, key, key, xs, ids.map((id, i) => ({ label: ids.length > 1 ? id : key, values: values[i] })));
    }
  }
}
async function pageCurves() {
  await loadRuns();
  const ids = (hashParams().get("runs") || "").split(",").filter(Boolean);
  const chosen = ids.length ? ids : state.selected;
  view.append(el("h2", {}, `Curves: ${chosen.join(", ") || "no run ticked on the Runs page"}`));
  const box = el("div", { id: "curves" });
  view.append(box);
  every(POLL_MS, async () => {
    let changed = false;
    for (const id of chosen) changed = (await pollMetrics(id)) || changed;
    if (changed || !box.children.length) drawCurves(box, chosen);
    setStatus(`live: polled ${new Date().toLocaleTimeString()}`);
  });
}

function runPicker(onPick, filter) {
  const select = el("select", { id: "run-select" });
  for (const r of state.runs.filter(filter)) select.append(el("option", { value: r.id }, r.id));
  const want = hashParams().get("run") || state.selected[0];
  if ([...select.options].some(o => o.value === want)) select.value = want;
  select.addEventListener("change", () => onPick(select.value));
  return select;
}
function tokenSpan(c, i, scale, detail) {
  const t = c.tokens, loss = t.loss ? t.loss[i] : null;
  const a = loss === null || !scale ? 0 : Math.min(1, Math.abs(loss) / scale);
  const color = loss === null ? "transparent" : loss < 0 ? `rgba(22,163,74,${a})` : `rgba(220,38,38,${a})`;
  const span = el("span", { class: c.trained ? "tok trained" : "tok", style: `background:${color}` }, t.piece[i]);
  span.addEventListener("click", () => {
    document.querySelectorAll(".tok.selected").forEach(s => s.classList.remove("selected"));
    span.classList.add("selected");
    const clip = t.clip ? ({ "-1": "clipped low (ratio < 1-ε, A < 0)", "0": "not clipped", "1": "clipped high (ratio > 1+ε_high, A > 0)" })[t.clip[i]] : "–";
    detail.replaceChildren(el("b", {}, JSON.stringify(t.piece[i])), ` log-prob ${fmt(t.logp ? t.logp[i] : null)}`,
      el("span", { class: "ratio" }, ` · ratio ${fmt(t.ratio ? t.ratio[i] : null)}`), ` · ${clip}`,
      ` · KL ${fmt(t.kl ? t.kl[i] : null)} · loss term ${fmt(loss)}`, c.trained ? "" : " (not in the update)");
  });
  return span;
}
function drawGroup(g, detail) {
  if (g.error) return el("div", { class: "note" }, g.error);
  const box = el("div", { class: "group" });
  const last = Array.isArray(g.prompt) && g.prompt.length ? g.prompt[g.prompt.length - 1] : null;
  const prompt = typeof g.prompt === "string" ? g.prompt : last && typeof last.content === "string" ?
    `${last.role}: ${last.content}` : JSON.stringify(g.prompt);
  box.append(el("div", {}, el("b", {}, `group ${g.group}: `), prompt, g.answer ? `  (gold: ${g.answer})` : ""),
             el("div", { class: "meta" }, `reward mean ${fmt(g.mean)} · std ${fmt(g.std)} · G = ${g.completions.length}`));
  const terms = g.completions.flatMap(c => (c.tokens.loss || []).filter(v => v !== null).map(Math.abs));
  const scale = terms.length ? Math.max(...terms) : 0;
  const sorted = [...g.completions].sort((a, b) => (b.reward ?? -Infinity) - (a.reward ?? -Infinity));
  for (const c of sorted) {
    const per = g.reward_names.map((n, i) => `${n} ${fmt(c.rewards[i])}`).join(" · ");
    const toks = el("div", { class: "tokens" }, ...c.tokens.piece.map((_, i) => tokenSpan(c, i, scale, detail)));
    box.append(el("div", { class: "completion" },
      el("div", { class: "meta" }, `reward ${fmt(c.reward)} (${per}) · advantage ${fmt(c.advantage)}` +
         (c.trained ? "" : " · left out of the update")), toks));
  }
  return box;
}
async function pageGroups() {
  await loadRuns();
  view.append(el("h2", {}, "Groups"));
  const body = el("div"), detail = el("div", { id: "token-detail" }, "Click a token: its log-prob, ratio, clip and KL.");
  const stepSel = el("select", { id: "step-select" });
  const show = async (run, step) => {
    const q = step === undefined ? "" : `&step=${step}`;
    const data = await api(`/api/groups?run=${encodeURIComponent(run)}${q}`);
    stepSel.replaceChildren(...data.steps.map(s => el("option", { value: s }, `step ${s}`)));
    stepSel.value = data.step;
    body.replaceChildren(...(data.missing ? [el("p", {}, "This run has no groups.jsonl (log_groups_steps = 0?).")] :
      data.groups.map(g => drawGroup(g, detail))));
    body.prepend(el("p", { class: "meta" }, "Tokens coloured by their term in the loss: green lowers the loss by " +
      "raising the token's probability, red by lowering it; the darker, the larger."));
  };
  const picker = runPicker(run => show(run), r => r.has_groups);
  stepSel.addEventListener("change", () => show(picker.value, stepSel.value));
  view.append(el("div", {}, "run ", picker, " ", stepSel), detail, body);
  if (picker.value) await show(picker.value, hashParams().get("step") ?? undefined);
  else body.append(el("p", {}, "No run has group records."));
}

async function pageAha() {
  await loadRuns();
  view.append(el("h2", {}, "Aha tracker"));
  const box = el("div");
  const draw = async run => {
    await pollMetrics(run);
    box.replaceChildren(); window.ahaCharts = [];
    fileNotes(box, run);
    const m = state.metrics[run], grid = el("div", { class: "charts" });
    box.append(grid);
    const pick = keys => keys.map(k => ({ label: k.replace("behaviour/", ""), values: m.series[k] || m.step.map(() => null) }));
    chart(grid, "reflection", "reflection rate: correct vs incorrect", m.step, pick(["behaviour/reflection_rate",
      "behaviour/reflection_rate/correct", "behaviour/reflection_rate/incorrect"]));
    chart(grid, "phrases", "reflection phrases per 1,000 tokens", m.step, pick(["behaviour/phrases_per_1k_tokens"]));
    chart(grid, "lengths", "length of correct vs incorrect (tokens)", m.step, pick(["behaviour/len_correct", "behaviour/len_incorrect"]));
    const ex = await api(`/api/aha?run=${encodeURIComponent(run)}`);
    box.append(el("h3", {}, `Recorded completions with a reflection phrase (${ex.phrases.join(", ")})`));
    if (!ex.steps.length) box.append(el("p", {}, "No group records in this run."));
    const table = el("table", { id: "aha-table" }, el("tr", {}, el("th", {}, "step"), el("th", {}, "reflective / recorded"), el("th", {}, "example")));
    for (const s of ex.steps) table.append(el("tr", {}, el("td", {}, s.step), el("td", {}, `${s.reflective} / ${s.completions}`),
      el("td", { class: "text" }, s.example || "")));
    box.append(table);
    const h = ex.held_out;
    box.append(el("h3", {}, "The same held-out problems, answered (greedy) at each evaluation"));
    if (!h.problems.length) box.append(el("p", {}, "No held_out.jsonl in this run (it needs eval_steps and a task)."));
    else {
      const grid = el("table", { id: "held-out-table" }, el("tr", {}, el("th", {}, "problem"),
        ...h.steps.map(s => el("th", {}, `step ${s}`))));
      for (const p of h.problems) {
        const prompt = typeof p.prompt === "string" ? p.prompt : JSON.stringify(p.prompt);
        grid.append(el("tr", {}, el("td", { class: "text" }, `${prompt.slice(-80)} (gold ${p.answer})`),
          ...h.steps.map(s => { const a = p.by_step[s];
            return el("td", { class: "text " + (a ? (a.correct ? "right" : "wrong") : "") }, a ? a.greedy : "–"); })));
      }
      box.append(grid);
    }
  };
  const picker = runPicker(draw, r => r.steps > 0);
  view.append(el("div", {}, "run ", picker), box);
  if (picker.value) await draw(picker.value);
}

// ---------------------------------------------------------------- Learn GRPO
function slider(name, min, max, step, value, onInput) {
  const input = el("input", { type: "range", min, max, step, value, id: `s-${name}` });
  const out = el("span", {}, value);
  input.addEventListener("input", () => { out.textContent = input.value; onInput(); });
  return { input, label: el("label", {}, `${name} `, out), get value() { return +input.value; } };
}
function advantagePanel() {
  const panel = el("div", { class: "panel", id: "adv-panel" }, el("h3", {}, "A group of six answers: rewards → advantages"));
  const rewards = [1, 0, 0, 1, 0.5, 0].map((v, i) => slider(`r${i + 1}`, 0, 1, 0.05, v, () => update()));
  const out = el("div", { id: "adv-out" });
  panel.append(el("div", { class: "sliders" }, ...rewards.flatMap(s => [s.label, s.input, el("br")])), out);
  const update = async () => {
    const data = await api("/api/learn/advantages", { rewards: rewards.map(s => s.value) });
    const names = Object.keys(data.advantages);
    const table = el("table", { id: "adv-table" }, el("tr", {}, el("th", {}, "answer"), el("th", {}, "reward"),
      ...names.map(n => el("th", {}, n))));
    rewards.forEach((s, i) => table.append(el("tr", {}, el("td", {}, i + 1), el("td", {}, s.value),
      ...names.map(n => el("td", { "data-est": n, "data-i": i, "data-value": data.advantages[n][i] },
        fmt(data.advantages[n][i]))))));
    out.replaceChildren(el("p", {}, `group mean ${fmt(data.mean)}, std ${fmt(data.std)} (n-1), ε = ${data.eps}`), table);
  };
  update();
  return panel;
}
function ratioPanel() {
  const panel = el("div", { class: "panel" }, el("h3", {}, "Policy ratio explorer: when does the clip bite?"));
  const s = [slider("p_old", 0.01, 1, 0.01, 0.5, () => update()), slider("p_new", 0.01, 1, 0.01, 0.7, () => update()),
             slider("epsilon", 0.05, 0.5, 0.01, 0.2, () => update()), slider("epsilon_high", 0.05, 0.5, 0.01, 0.28, () => update())];
  const out = el("div", { id: "ratio-out" }), plotBox = el("div", { class: "charts" });
  panel.append(el("div", { class: "sliders" }, ...s.flatMap(x => [x.label, x.input, el("br")])), out, plotBox);
  const update = async () => {
    const d = await api("/api/learn/ratio", { p_old: s[0].value, p_new: s[1].value, epsilon: s[2].value, epsilon_high: s[3].value });
    const row = (k, v) => el("tr", {}, el("td", {}, k), el("td", {}, fmt(v.objective)), el("td", {}, fmt(v.unclipped)),
      el("td", {}, v.clipped ? "yes" : "no"));
    out.replaceChildren(el("p", {}, `ratio π/π_old = ${fmt(d.ratio)}`), el("table", { id: "ratio-table" },
      el("tr", {}, el("th", {}, "advantage"), el("th", {}, "clipped objective"), el("th", {}, "ratio·A"), el("th", {}, "clip bites")),
      row("A = +1", d.by_advantage.positive), row("A = -1", d.by_advantage.negative)));
    plotBox.replaceChildren();
    chart(plotBox, "ratio-curve", "objective over the ratio", d.grid, [
      { label: "A = +1", values: d.by_advantage.positive.curve }, { label: "A = -1", values: d.by_advantage.negative.curve }],
      { xlabel: "ratio" });
  };
  update();
  return panel;
}
function klPanel() {
  const panel = el("div", { class: "panel" }, el("h3", {}, "KL estimators k1, k2, k3 side by side"));
  const s = [slider("p", 0.01, 1, 0.01, 0.3, () => update()), slider("p_ref", 0.01, 1, 0.01, 0.5, () => update())];
  const out = el("div", { id: "kl-out" }), plotBox = el("div", { class: "charts" });
  panel.append(el("div", { class: "sliders" }, ...s.flatMap(x => [x.label, x.input, el("br")])), out, plotBox);
  const update = async () => {
    const d = await api("/api/learn/kl", { p: s[0].value, p_ref: s[1].value });
    out.replaceChildren(el("table", { id: "kl-table" }, el("tr", {}, ...Object.keys(d.values).map(k => el("th", {}, k))),
      el("tr", {}, ...Object.values(d.values).map(v => el("td", {}, fmt(v))))));
    plotBox.replaceChildren();
    chart(plotBox, "kl-curve", `estimates over π (π_ref = ${s[1].value})`, d.grid,
          Object.entries(d.curves).map(([k, v]) => ({ label: k, values: v })), { xlabel: "π" });
  };
  update();
  return panel;
}
function playgroundPanel() {
  const panel = el("div", { class: "panel", id: "playground" }, el("h3", {}, "Playground: a real GRPO run on column addition"));
  const field = (name, value) => { const i = el("input", { id: `pg-${name}`, value, size: 7 }); return [el("label", {}, ` ${name} `), i]; };
  const fields = { epsilon: 0.2, beta: 0.0, num_generations: 4, learning_rate: 0.0005, max_steps: 10 };
  const inputs = Object.entries(fields).map(([k, v]) => field(k, v));
  const status = el("div", { id: "pg-status" }), plotBox = el("div", { class: "charts", id: "pg-charts" });
  const start = el("button", { id: "pg-start" }, "Start"), cancel = el("button", { id: "pg-cancel" }, "Cancel");
  panel.append(el("div", {}, ...inputs.flat(), " ", start, " ", cancel), status, plotBox);
  const draw = async ids => {
    for (const id of ids) await pollMetrics(id);
    plotBox.replaceChildren();
    window.ahaCharts = window.ahaCharts.filter(c => c.key !== "playground");
    if (!ids.length) return;
    const { xs, values } = aligned(ids, "reward/mean");
    chart(plotBox, "playground", "reward/mean of playground runs", xs, ids.map((id, i) => ({ label: id, values: values[i] })));
  };
  const poll = async () => {
    const st = await api("/api/playground");
    const last = st.jobs[st.jobs.length - 1];
    const steps = last && state.metrics[last.id] ? state.metrics[last.id].step.length : 0;
    status.textContent = last ? `${last.id}: ${last.state}, ${steps} step(s) logged` :
      `no playground run yet (at most ${st.max_steps} steps, ${st.time_s} s each)`;
    status.dataset.state = last ? last.state : "";
    status.dataset.steps = steps;
    await draw(st.runs);
  };
  start.addEventListener("click", async () => {
    const body = Object.fromEntries(Object.keys(fields).map(k => [k, +document.getElementById(`pg-${k}`).value]));
    try { await api("/api/playground/start", body); } catch (e) { status.textContent = e.message; }
    await poll();
  });
  cancel.addEventListener("click", async () => { await api("/api/playground/cancel", {}); await poll(); });
  every(1000, poll);
  return panel;
}
async function pageLearn() {
  view.append(el("h2", {}, "Learn GRPO"), el("p", {}, "Every number below is computed by aha.algos on the server."),
              advantagePanel(), ratioPanel(), klPanel(), playgroundPanel());
}

// ---------------------------------------------------------------- router
const PAGES = { runs: pageRuns, curves: pageCurves, groups: pageGroups, aha: pageAha, learn: pageLearn };
async function route() {
  state.timers.forEach(clearInterval); state.timers = []; window.ahaCharts = [];
  const name = (location.hash.slice(1).split("?")[0]) || "runs";
  document.querySelectorAll("nav a").forEach(a => a.classList.toggle("active", a.dataset.page === name));
  view.replaceChildren();
  document.body.dataset.ready = "";
  try { await (PAGES[name] || pageRuns)(); }
  catch (e) { view.append(el("div", { class: "note" }, `error: ${e.message}`)); }
  document.body.dataset.ready = name;
}
window.addEventListener("hashchange", route);
route();
