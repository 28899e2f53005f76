// Runs: every run found, nested runs under the folder that holds them (runs/demo -> demo/sft, demo/grpo), with
// what each is, how far it got and when it last wrote; tick runs to overlay their curves.
"use strict";

const HEADLINE = { "reward/mean": "reward", "eval/accuracy": "held-out acc.", "completion/len_mean": "length",
                   "behaviour/reflection_rate": "reflection" };

function runsHint(info) {
  const out = [];
  if (!info.runs.length) out.push(el("div", { class: "note", id: "runs-hint" },
    `No runs found ${info.given.length ? "in " + info.given.join(", ") : "under " + info.root}. A run is a folder ` +
    "holding metrics.jsonl, config.yaml or demo_config.yaml (looked for three levels deep). `bash scripts/demo.sh` " +
    "writes runs/demo/sft and runs/demo/grpo; `aha dashboard PATH ...` shows the runs in PATH."));
  for (const path of info.empty) out.push(el("div", { class: "note empty-folder" },
    `${path}: no run here yet (no metrics.jsonl, config.yaml or demo_config.yaml within three levels); it is watched.`));
  return out;
}
function runRow(r, ids) {
  const parent = ids.filter(o => r.id.startsWith(o + "/")).length;
  const folder = !r.has_metrics && ids.some(o => o.startsWith(r.id + "/"));
  const box = folder ? "" : el("input", { type: "checkbox", "data-run": r.id });
  if (box) {
    box.checked = state.selected.includes(r.id);
    box.addEventListener("change", () => {
      state.selected = [...document.querySelectorAll("#runs-table input:checked")].map(b => b.dataset.run);
    });
  }
  const cfg = Object.entries(r.config).filter(([, v]) => v !== null && v !== "").map(([k, v]) => `${k}=${v}`).join("  ") +
    (r.config_error ? ` (${r.config_error})` : "");
  const files = r.files.flatMap(f => [el("a", { href: `/api/file?run=${encodeURIComponent(r.id)}&path=${encodeURIComponent(f)}`,
    target: "_blank" }, f), " "]);
  const links = r.steps > 0 ? [runLink("curves", r.id, "curves"), " ", r.has_groups ? runLink("groups", r.id, "groups") : "",
    " ", r.has_groups ? runLink("aha", r.id, "aha") : ""] : [];
  const name = el("td", { class: "text run-name", style: `padding-left:${0.6 + 1.4 * parent}em` },
    folder ? el("b", {}, `${r.id}/`) : r.id, r.stage ? el("span", { class: `badge stage-${r.stage}` }, r.stage) : "");
  return el("tr", { "data-run": r.id, class: folder ? "folder" : "" }, el("td", {}, box), name, el("td", {}, folder ? "" : r.steps),
    el("td", { class: "text" }, folder ? "" : ago(r.updated)),
    ...Object.keys(HEADLINE).map(k => el("td", {}, folder ? "" : fmt(r.last[k]))), el("td", { class: "text" }, ...links),
    el("td", { class: "text cfg" }, cfg), el("td", { class: "text files" }, ...files));
}
function runsTable(runs) {
  const ids = runs.map(r => r.id);
  const head = ["overlay", "run", "steps", "last write", ...Object.entries(HEADLINE).map(([k, v]) => [v, k]), "open", "config", "files"];
  return el("table", { id: "runs-table" }, el("tr", {}, ...head.map(h => Array.isArray(h) ? el("th", { title: h[1] }, h[0]) : el("th", {}, h))),
    ...runs.map(r => runRow(r, ids)));
}

page("runs", "Runs", async () => {
  view.append(el("h2", {}, "Runs"), el("p", { class: "meta" }, "Is it learning? Tick runs and overlay their curves; " +
    "a folder that holds runs (a demo, a recipe) lists them beneath it."));
  const box = el("div");
  view.append(box, el("p", {}, el("button", { id: "overlay", onclick: () => {
    location.hash = `#curves?runs=${state.selected.map(encodeURIComponent).join(",")}`; } }, "Overlay the ticked runs' curves")));
  let shown = "";
  const draw = async () => {
    await loadRuns();
    const key = JSON.stringify(state.runs.map(r => [r.id, r.steps, r.files]));
    if (key === shown) return;  // redraw only when a run appears or grows: a tick being clicked is never lost
    shown = key;
    box.replaceChildren(...runsHint(state.runsInfo), ...(state.runs.length ? [runsTable(state.runs)] : []));
  };
  await draw();
  state.timers.push(setInterval(() => draw().catch(e => setStatus(`not updated: ${e.message}`)), 5000));
});
