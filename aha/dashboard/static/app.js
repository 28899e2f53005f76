// aha dashboard: the core every page shares (helpers, run data, the page registry, the router).
// A page is one file under pages/ that calls page(name, title, render), and one <script> line in index.html.
// Every number about GRPO comes from the server (aha.algos); the pages only fetch, lay out and draw.
"use strict";

const view = document.getElementById("view");
const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#be185d", "#65a30d"];
const POLL_MS = 2000;
const state = { runs: [], selected: null, metrics: {}, timers: [] };
const PAGES = [];
window.ahaCharts = [];  // {key, plot}: read by the browser tests

function page(name, title, render) { PAGES.push({ name, title, render }); }

// ---------------------------------------------------------------- helpers
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") e.className = v; else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat(Infinity)) e.append(c instanceof Node ? c : document.createTextNode(c ?? ""));
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
// a number from the server, shown: its exact value stays in data-value (the tests compare it with aha.algos)
function num(v, tag = "span", attrs = {}) {
  return el(tag, { class: "num", "data-value": v === null ? "null" : String(v), ...attrs }, v === null ? "∞" : fmt(v));
}
function setStatus(text) { document.getElementById("status").textContent = text; }
function every(ms, fn) {  // a failed poll (the server restarting, a run removed) is shown in the status line, then retried
  const safe = () => Promise.resolve().then(fn).catch(e => setStatus(`not updated: ${e.message}`));
  safe(); state.timers.push(setInterval(safe, ms));
}
function hashParams() { return new URLSearchParams(location.hash.split("?")[1] || ""); }
function setHashParams(params) {  // the page's settings in its address, without reloading the page
  const query = new URLSearchParams(Object.entries(params).filter(([, v]) => v !== "" && v !== null && v !== undefined));
  const name = location.hash.slice(1).split("?")[0];
  history.replaceState(null, "", `#${name}${[...query].length ? "?" + query : ""}`);
}
function debounce(fn, ms) { let t; return (...a) => { clearTimeout(t); t = setTimeout(() => fn(...a), ms); }; }
function ago(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  const s = Math.max(0, Date.now() / 1000 - seconds);
  return s < 90 ? `${Math.round(s)} s ago` : s < 5400 ? `${Math.round(s / 60)} min ago` :
    s < 172800 ? `${Math.round(s / 3600)} h ago` : new Date(seconds * 1000).toLocaleDateString();
}
function runLink(page, id, text) {
  const key = page === "curves" ? "runs" : "run";
  return el("a", { href: `#${page}?${key}=${encodeURIComponent(id)}`, class: `to-${page}` }, text || page);
}

// ---------------------------------------------------------------- run data
async function loadRuns() {
  const data = await api("/api/runs");
  state.runs = data.runs; state.runsInfo = data;
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
  m.offset = got.offset; m.partial = got.partial; m.bad.push(...got.bad); m.missing = got.missing;
  return m.step.length !== before || got.reset || noteChanged;
}
function fileNotes(parent, id) {
  const m = state.metrics[id];
  badLines(parent, id, m.bad);
  if (m.partial) parent.append(el("div", { class: "note partial-line" },
    `${id}: the last line of metrics.jsonl is partial (${m.partial.bytes} bytes, no newline yet: being written, or torn)`));
}
// lines of a run file the server skipped: each with its file, line number and why ("metrics.jsonl line 2: not JSON")
function badLines(parent, id, bad) {
  for (const b of bad) parent.append(el("div", { class: "note bad-line" }, `${id}: ${b.error}; skipped: ${b.text}`));
}
function runPicker(onPick, filter) {
  const select = el("select", { id: "run-select" });
  for (const r of state.runs.filter(filter)) select.append(el("option", { value: r.id }, r.id));
  const want = hashParams().get("run") || state.selected[0];
  if ([...select.options].some(o => o.value === want)) select.value = want;
  select.addEventListener("change", () => { setHashParams({ run: select.value }); onPick(select.value); });
  return select;
}

// ---------------------------------------------------------------- router
async function route() {
  state.timers.forEach(clearInterval); state.timers = []; window.ahaCharts = [];
  const name = (location.hash.slice(1).split("?")[0]) || "runs";
  const current = PAGES.find(p => p.name === name) || PAGES[0];
  document.querySelectorAll("nav a").forEach(a => a.classList.toggle("active", a.dataset.page === current.name));
  view.replaceChildren();
  document.body.dataset.ready = "";
  try { await current.render(); }
  catch (e) { view.append(el("div", { class: "note" }, `error: ${e.message}`)); }
  document.body.dataset.ready = current.name;
}
function start() {
  document.querySelector("nav").replaceChildren(...PAGES.map(p => el("a", { href: `#${p.name}`, "data-page": p.name }, p.title)));
  window.addEventListener("hashchange", route);
  route();
}
document.addEventListener("DOMContentLoaded", start);
