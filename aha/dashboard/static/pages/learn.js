// Learn GRPO: explainers, each one file under learn/ that calls explainer(id, title, build) and one <script> line
// in index.html. Every number they show is computed by aha.algos on the server (POST /api/learn/<name>); the
// page sends inputs and shows answers, through num() so that each shown number keeps the server's exact value.
"use strict";

const EXPLAINERS = [];
function explainer(id, title, build) { EXPLAINERS.push({ id, title, build }); }

function slider(name, min, max, step, value, onInput, label) {
  const input = el("input", { type: "range", min, max, step, value, id: `s-${name}` });
  const out = el("span", { class: "slider-value" }, value);
  input.addEventListener("input", () => { out.textContent = input.value; onInput(); });
  return { input, label: el("label", {}, `${label || name} `, out), get value() { return +input.value; } };
}
function sliderRows(sliders) { return el("div", { class: "sliders" }, ...sliders.flatMap(x => [x.label, x.input, el("br")])); }
// one request at a time per panel; a newer input replaces a waiting one, and a refusal (400) is shown, not thrown
function learnCall(name, out) {
  let busy = false, next = null;
  const run = async (body, show) => {
    if (busy) { next = [body, show]; return; }
    busy = true;
    try { show(await api(`/api/learn/${name}`, body)); out.querySelector(".learn-error")?.remove(); }
    catch (e) { out.querySelector(".learn-error")?.remove(); out.prepend(el("div", { class: "note learn-error" }, e.message)); }
    busy = false;
    if (next) { const [b, s] = next; next = null; run(b, s); }
  };
  return run;
}
function formula(text) { return el("code", { class: "formula" }, text); }

page("learn", "Learn GRPO", async () => {
  const toc = el("ol", { class: "toc" }, ...EXPLAINERS.map(x => el("li", {}, el("a", { href: `#learn?to=${x.id}`,
    onclick: e => { e.preventDefault(); document.getElementById(x.id).scrollIntoView(); } }, x.title))));
  view.append(el("h2", {}, "Learn GRPO"), el("p", {}, "Every number below is computed by aha.algos on the server, " +
    "by the same functions the trainer calls."), toc);
  for (const x of EXPLAINERS) {
    const panel = el("div", { class: "panel", id: x.id }, el("h3", {}, x.title));
    view.append(panel);
    x.build(panel);
  }
  const to = hashParams().get("to");
  if (to && document.getElementById(to)) document.getElementById(to).scrollIntoView();
});
