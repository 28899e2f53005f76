// Curves: is it learning? Every metric of the ticked runs, found by search, smoothed (TensorBoard's debiased EMA),
// on a step or training-time axis, linear or log, zoomed by dragging (all charts follow; double-click resets),
// enlarged, exported as CSV, and the overlaid runs' config differences. The settings live in the address.
"use strict";

const FIRST_SECTIONS = ["reward", "eval", "behaviour", "completion", "clip"];
const curves = { ids: [], settings: null, syncing: false, errors: {} };

function curveSettings() {
  const p = hashParams();
  return { q: p.get("q") || "", smooth: Math.min(0.99, Math.max(0, +p.get("smooth") || 0)),
           x: p.get("x") === "time" ? "time" : "step", log: p.get("log") === "1" };
}
function saveSettings(s) {
  setHashParams({ runs: curves.ids.join(","), q: s.q, smooth: s.smooth || "", x: s.x === "time" ? "time" : "",
                  log: s.log ? "1" : "" });
}
// TensorBoard's smoothing: an exponential moving average, debiased so the first points are not pulled to 0
function ema(values, weight) {
  if (!weight) return values;
  let last = 0, n = 0;
  return values.map(v => {
    if (v === null || v === undefined || !isFinite(v)) return null;
    last = last * weight + (1 - weight) * v; n += 1;
    return last / (1 - Math.pow(weight, n));
  });
}
function trainingTime(id) {  // seconds of training so far at each row: the running sum of perf/step_s
  const m = state.metrics[id], dt = m.series["perf/step_s"];
  if (!dt) return null;
  let t = 0, prev = -Infinity;
  return m.step.map((_, i) => { t += dt[i] > 0 ? dt[i] : 0; prev = Math.max(t, prev + 1e-9); return prev; });
}
function xOf(settings) {
  return id => (settings.x === "time" && trainingTime(id)) || state.metrics[id].step;
}
function matcher(q) {
  if (!q) return () => true;
  let re = null;
  try { re = new RegExp(q, "i"); } catch (e) { re = null; }
  const low = q.toLowerCase();
  return key => key.toLowerCase().includes(low) || (re !== null && re.test(key));
}
function hasValues(ids, key) {
  return ids.some(id => (state.metrics[id].series[key] || []).some(v => v !== null && isFinite(v)));
}
function isFlat(ids, key) {
  const e = seriesExtent(ids.map(id => state.metrics[id].series[key] || []));
  return e !== null && e[0] === e[1];
}
function sectionOf(key) { return key.includes("/") ? key.split("/")[0] : "train"; }
function sections(keys) {
  const by = {};
  for (const k of keys) (by[sectionOf(k)] = by[sectionOf(k)] || []).push(k);
  const order = [...FIRST_SECTIONS.filter(s => by[s]), ...Object.keys(by).filter(s => !FIRST_SECTIONS.includes(s)).sort()];
  return order.map(s => [s, by[s]]);
}
// the chart series of `key`: per run the raw values, and with smoothing a faint raw line under the smoothed one
function keySeries(ids, key, settings) {
  const { xs, values } = aligned(ids, key, xOf(settings));
  const series = [];
  ids.forEach((id, i) => {
    const color = COLORS[i % COLORS.length], name = ids.length > 1 ? id : key;
    if (settings.smooth > 0) series.push({ label: `${name} (raw)`, values: values[i], color, faint: true, width: 1 },
                                         { label: `${name} (smoothed ${settings.smooth})`, values: ema(values[i], settings.smooth), color, width: 2 });
    else series.push({ label: name, values: values[i], color });
  });
  return { xs, series };
}
function syncHooks() {  // a zoom on one chart (drag; double-click resets) applies to every chart of the page
  return { setScale: [(u, scale) => {
    if (scale !== "x" || curves.syncing) return;
    curves.syncing = true;
    const { min, max } = u.scales.x, xs = u.data[0];
    curves.zoom = xs.length && min <= xs[0] && max >= xs[xs.length - 1] ? null : { min, max };
    for (const c of window.ahaCharts) if (c.plot !== u && c.sync) c.plot.setScale("x", { min, max });
    curves.syncing = false;
  }] };
}
function curveChart(grid, key, title, ids, settings, extra = {}) {
  const data = () => extra.series ? extra : keySeries(ids, key, settings);
  const { xs, series } = data();
  const xlabel = settings.x === "time" ? "training time (s)" : "step";
  const plot = chart(grid, key, title, xs, series, { log: settings.log, xlabel, hooks: syncHooks(), flatHeight: 120, ...extra.opts });
  Object.assign(window.ahaCharts[window.ahaCharts.length - 1], { sync: true, data: extra.series ? extra.data : data });
  const box = grid.lastChild;
  box.prepend(el("button", { class: "enlarge", title: "enlarge", onclick: () => enlarge(key, title, ids, settings, extra) }, "⤢"));
  return plot;
}
function enlarge(key, title, ids, settings, extra) {
  document.getElementById("chart-zoom")?.remove();
  const close = () => { overlay.remove(); window.ahaCharts = window.ahaCharts.filter(c => c.key !== `${key} (enlarged)`); };
  const body = el("div", { class: "zoom-body" }, el("button", { class: "close", onclick: close }, "×"));
  const overlay = el("div", { id: "chart-zoom", onclick: e => { if (e.target === overlay) close(); } }, body);
  document.body.append(overlay);
  const { xs, series } = extra.series ? extra : keySeries(ids, key, settings);
  chart(body, `${key} (enlarged)`, title, xs, series, { log: settings.log, width: Math.min(1150, innerWidth - 80),
    height: Math.min(620, innerHeight - 140), xlabel: settings.x === "time" ? "training time (s)" : "step", ...extra.opts });
  body.append(el("p", { class: "meta" }, "Drag to zoom, double-click to reset, Esc to close."));
  document.addEventListener("keydown", function esc(e) { if (e.key === "Escape") { close(); document.removeEventListener("keydown", esc); } });
}
function headline(box, ids, settings) {
  const keys = ["reward/mean", "eval/accuracy"];  // both, even before the first evaluation: the pair is the point
  if (!keys.some(k => hasValues(ids, k)) || !matcher(settings.q)("reward/mean eval/accuracy")) return;
  const pairs = ids.flatMap(id => keys.map(k => [id, k]));
  const { xs, series: values } = headlineData(ids, keys, settings);
  const label = (id, k) => ids.length > 1 ? `${id} ${k}` : k;
  const series = pairs.map(([id, k], i) => ({ label: label(id, k), values: values[i].values,  // a run's colour, eval dashed
    color: COLORS[ids.indexOf(id) % COLORS.length], ...(k === "eval/accuracy" ? { points: true, dash: [6, 4] } : {}) }));
  const head = el("div", { class: "charts" });
  box.append(el("h3", {}, "Reward beside held-out accuracy"), head);
  curveChart(head, "reward+eval", "reward/mean and eval/accuracy", ids, settings, { series, xs, data: () => headlineData(ids, keys, settings) });
}
function headlineData(ids, keys, settings) {
  const pairs = ids.flatMap(id => keys.map(k => [id, k])), x = xOf(settings);
  const joined = uPlot.join(pairs.map(([id, k]) => [x(id), state.metrics[id].series[k] || state.metrics[id].step.map(() => null)]));
  return { xs: joined[0], series: pairs.map((_, i) => ({ values: joined[i + 1] })) };
}
// new rows of a run being written: each chart's data replaced in place (a zoom is kept), no chart rebuilt
function refreshCurves() {
  curves.syncing = true;
  for (const c of window.ahaCharts) {
    if (!c.data) continue;
    const { xs, series } = c.data();
    c.plot.setData([xs, ...series.map(s => s.values)]);
    if (curves.zoom) c.plot.setScale("x", curves.zoom);
  }
  curves.syncing = false;
}
function curvesShape(ids, settings) {  // what, when it changes, needs the charts rebuilt: the metric keys, the notes
  return JSON.stringify([settings, curves.errors, ids.map(id => { const m = state.metrics[id];
    return [Object.keys(m.series).filter(k => hasValues([id], k)), m.bad.length, m.partial]; })]);
}
function drawCurves(box, ids, settings) {
  box.replaceChildren(); window.ahaCharts = window.ahaCharts.filter(c => c.key.endsWith("(enlarged)"));
  if (!ids.length) return;
  for (const id of ids) {
    const m = state.metrics[id];
    if (curves.errors[id]) box.append(el("div", { class: "note" }, `${id}: ${curves.errors[id]}`));
    else if (m.missing) box.append(el("div", { class: "note" }, `${id} has no metrics.jsonl (yet): its curves appear when it logs a step.`));
    fileNotes(box, id);
  }
  const all = [...new Set(ids.flatMap(id => Object.keys(state.metrics[id].series)))].sort();
  const found = all.filter(matcher(settings.q)), shown = found.filter(k => hasValues(ids, k));
  const empty = found.filter(k => !shown.includes(k));
  document.getElementById("curve-count").textContent = `${shown.length} of ${all.length} metrics` +
    (settings.q ? ` match “${settings.q}”` : "");
  headline(box, ids, settings);
  for (const [name, keys] of sections(shown)) {
    const grid = el("div", { class: "charts" });
    const section = el("details", { open: true, class: "section", "data-section": name }, el("summary", {}, `${name} (${keys.length})`), grid);
    box.append(section);
    const flat = keys.filter(k => isFlat(ids, k));  // constant series last, and smaller
    for (const key of [...keys.filter(k => !flat.includes(k)), ...flat]) curveChart(grid, key, key, ids, settings);
  }
  if (empty.length) box.append(el("p", { class: "meta", id: "empty-series" }, `No values yet (not drawn): ${empty.join(", ")}`));
  if (!found.length && settings.q) box.append(el("p", { id: "no-match" }, `No metric matches “${settings.q}”.`));
}
function csvText(ids, settings) {
  const keys = window.ahaCharts.filter(c => c.sync && c.key !== "reward+eval").map(c => c.key);
  const cols = ids.flatMap(id => keys.map(k => [id, k]));
  const xName = settings.x === "time" ? "training_time_s" : "step";
  const tables = cols.map(([id, k]) => [xOf(settings)(id), state.metrics[id].series[k]]);
  const joined = tables.length > 1 ? uPlot.join(tables) : tables.length ? [tables[0][0], tables[0][1]] : [[]];
  const smooth = settings.smooth > 0 ? joined.slice(1).map(v => ema(v, settings.smooth)) : [];
  const quote = s => /[",\n]/.test(s) ? `"${s.replace(/"/g, '""')}"` : s;
  const head = [xName, ...cols.map(([id, k]) => `${id}:${k}`), ...(smooth.length ? cols.map(([id, k]) => `${id}:${k} (smoothed ${settings.smooth})`) : [])];
  const lines = [head.map(quote).join(",")];
  joined[0].forEach((x, r) => lines.push([x, ...joined.slice(1).map(c => c[r]), ...smooth.map(c => c[r])]
    .map(v => v === null || v === undefined ? "" : String(v)).join(",")));
  return lines.join("\n") + "\n";
}
function downloadCsv(ids, settings) {
  const url = URL.createObjectURL(new Blob([csvText(ids, settings)], { type: "text/csv" }));
  const a = el("a", { href: url, download: `aha-curves-${ids.join("+").replace(/[^\w.+-]+/g, "_")}.csv` });
  document.body.append(a); a.click(); a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}
async function configDiff(box, ids) {
  if (ids.length < 2) { box.replaceChildren(); return; }
  const d = await api(`/api/config_diff?runs=${ids.map(encodeURIComponent).join(",")}`);
  const keys = Object.keys(d.differ);
  const show = v => v === null || v === undefined ? "–" : typeof v === "object" ? JSON.stringify(v) : String(v);
  const table = el("table", { id: "config-diff-table" }, el("tr", {}, el("th", {}, "config key"), ...ids.map((id, i) =>
    el("th", { style: `color:${COLORS[i % COLORS.length]}` }, id))),
    ...keys.map(k => el("tr", { "data-key": k }, el("td", { class: "text" }, k), ...d.differ[k].map(v => el("td", { class: "text" }, show(v))))));
  box.replaceChildren(el("details", { open: keys.length <= 12 }, el("summary", {},
    keys.length ? `Config: ${keys.length} difference(s) between the overlaid runs (${d.same} keys equal)` :
    `Config: the overlaid runs' configs are the same (${d.same} keys)`), keys.length ? table : ""),
    ...Object.entries(d.errors).map(([id, e]) => el("div", { class: "note" }, `${id}: ${e}`)));
}
function curveToolbar(settings, redraw) {
  const search = el("input", { id: "curve-search", type: "search", value: settings.q, size: 28,
    placeholder: "search metrics: len, clip, reward/.*mean" });
  const smooth = el("input", { id: "curve-smooth", type: "range", min: 0, max: 0.99, step: 0.01, value: settings.smooth });
  const smoothOut = el("span", { id: "curve-smooth-value" }, String(settings.smooth));
  const xSel = el("select", { id: "curve-x" }, el("option", { value: "step" }, "step"),
    el("option", { value: "time" }, "training time (Σ perf/step_s)"));
  xSel.value = settings.x;
  const log = el("input", { id: "curve-log", type: "checkbox" }); log.checked = settings.log;
  const apply = () => {
    Object.assign(settings, { q: search.value.trim(), smooth: +smooth.value, x: xSel.value, log: log.checked });
    smoothOut.textContent = String(settings.smooth); saveSettings(settings); redraw();
  };
  search.addEventListener("input", debounce(apply, 200)); smooth.addEventListener("input", debounce(apply, 60));
  xSel.addEventListener("change", apply); log.addEventListener("change", apply);
  const csv = el("button", { id: "curve-csv", onclick: () => downloadCsv(curves.ids, settings) }, "CSV of the shown metrics");
  return el("div", { class: "toolbar" }, search, el("label", {}, " smoothing ", smooth, " ", smoothOut), el("label", {}, " x ", xSel),
    el("label", {}, log, " log y"), " ", csv, " ", el("span", { id: "curve-count", class: "meta" }));
}

page("curves", "Curves", async () => {
  const ids = (hashParams().get("runs") || "").split(",").filter(Boolean);
  curves.errors = {};
  const first = ids.map(id => pollMetrics(id).catch(e => { curves.errors[id] = e.message; }));  // fetched meanwhile
  await loadRuns();
  await Promise.all(first);
  const chosen = ids.length ? ids : state.selected;
  curves.ids = chosen;
  const settings = curveSettings();
  view.append(el("h2", {}, `Curves: ${chosen.join(", ") || "no run ticked on the Runs page"}`));
  if (!chosen.length) {
    view.append(el("p", { class: "note" }, state.runs.length ? "Tick one or more runs on the Runs page, or open a run's curves from there." :
      "No runs found: see the Runs page."));
    return;
  }
  const box = el("div", { id: "curves" }), diff = el("div", { id: "config-diff" });
  let shape = "";
  const redraw = () => { curves.zoom = null; shape = curvesShape(chosen, settings); drawCurves(box, chosen, settings); };
  view.append(curveToolbar(settings, redraw), diff, box);
  configDiff(diff, chosen).catch(e => diff.replaceChildren(el("div", { class: "note" }, `config diff: ${e.message}`)));
  every(POLL_MS, async () => {
    let changed = false;
    for (const id of chosen) {
      if ((curves.errors[id] || "").startsWith("no run")) continue;  // not a run: asked once, not every 2 s
      try { changed = (await pollMetrics(id)) || changed; delete curves.errors[id]; }
      catch (e) { changed = changed || curves.errors[id] !== e.message; curves.errors[id] = e.message; }
    }
    if (!box.children.length || (changed && curvesShape(chosen, settings) !== shape)) redraw();
    else if (changed) refreshCurves();
    setStatus(`live: polled ${new Date().toLocaleTimeString()}`);
  });
});
