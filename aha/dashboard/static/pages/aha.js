// Aha tracker: did it start reflecting? Reflection phrases over training, split by correct and incorrect answers
// (green is correct and red incorrect in every chart and table here), the completions that hold one, and the same
// held-out problems answered at each evaluation.
"use strict";

const OUTCOME = { all: "#2563eb", correct: "#16a34a", incorrect: "#dc2626" };

function outcomeSeries(m, keys) {
  return keys.map(([k, label, outcome]) => ({ label, values: m.series[k] || m.step.map(() => null), color: OUTCOME[outcome] }));
}
function drawAhaCharts(box, m) {
  const grid = el("div", { class: "charts" });
  box.append(el("p", { class: "meta legend-outcome" }, el("span", { class: "swatch", style: `background:${OUTCOME.correct}` }), " correct  ",
    el("span", { class: "swatch", style: `background:${OUTCOME.incorrect}` }), " incorrect  ",
    el("span", { class: "swatch", style: `background:${OUTCOME.all}` }), " all answers"), grid);
  chart(grid, "reflection", "reflection rate: correct vs incorrect", m.step, outcomeSeries(m, [
    ["behaviour/reflection_rate", "all", "all"], ["behaviour/reflection_rate/correct", "correct", "correct"],
    ["behaviour/reflection_rate/incorrect", "incorrect", "incorrect"]]));
  chart(grid, "phrases", "reflection phrases per 1,000 tokens", m.step, outcomeSeries(m, [["behaviour/phrases_per_1k_tokens", "all", "all"]]));
  chart(grid, "lengths", "length of correct vs incorrect (tokens)", m.step, outcomeSeries(m, [
    ["behaviour/len_correct", "correct", "correct"], ["behaviour/len_incorrect", "incorrect", "incorrect"]]));
}
// a long text kept to a few lines in its cell; a click shows all of it
function clamped(text, attrs = {}) {
  const div = el("div", { class: "clamp", title: "click to show all", ...attrs }, text ?? "–");
  div.addEventListener("click", () => div.classList.toggle("open"));
  return div;
}
function reflectiveTable(ex) {
  const table = el("table", { id: "aha-table", class: "fixed" }, el("colgroup", {}, el("col", { style: "width:5em" }),
    el("col", { style: "width:9em" }), el("col")), el("tr", {}, el("th", {}, "step"), el("th", {}, "reflective / recorded"), el("th", { class: "text" }, "example")));
  for (const s of ex.steps) table.append(el("tr", {}, el("td", {}, s.step), el("td", {}, `${s.reflective} / ${s.completions}`),
    el("td", { class: "text" }, clamped(s.example || ""))));
  return table;
}
function heldOutTable(h) {
  const grid = el("table", { id: "held-out-table", class: "fixed" }, el("colgroup", {}, el("col", { style: "width:16em" }),
    ...h.steps.map(() => el("col"))), el("tr", {}, el("th", {}, "problem (gold)"), ...h.steps.map(s => el("th", {}, `step ${s}`))));
  for (const p of h.problems) {
    const raw = typeof p.prompt === "string" ? p.prompt : JSON.stringify(p.prompt);
    grid.append(el("tr", {}, el("td", { class: "text problem", title: raw }, clamped(`${p.prompt_text ?? raw}  (gold ${p.answer})`)),
      ...h.steps.map(s => { const a = p.by_step[s];
        return el("td", { class: "text " + (a ? (a.correct ? "right" : "wrong") : "") }, clamped(a ? a.greedy : "–")); })));
  }
  return grid;
}

page("aha", "Aha tracker", async () => {
  await loadRuns();
  view.append(el("h2", {}, "Aha tracker"), el("p", { class: "meta" }, "Did it start reflecting? Phrases such as “wait” or " +
    "“let me check” in the recorded answers, and whether answers that hold them are right more often."));
  const box = el("div");
  const draw = async run => {
    await pollMetrics(run);
    box.replaceChildren(); window.ahaCharts = [];
    fileNotes(box, run);
    drawAhaCharts(box, state.metrics[run]);
    const ex = await api(`/api/aha?run=${encodeURIComponent(run)}`);
    box.append(el("h3", {}, `Recorded completions with a reflection phrase (${ex.phrases.join(", ")})`));
    if (!ex.steps.length) box.append(el("p", {}, "No group records in this run."));
    box.append(reflectiveTable(ex), el("h3", {}, "The same held-out problems, answered (greedy) at each evaluation"));
    if (!ex.held_out.problems.length) box.append(el("p", {}, "No held_out.jsonl in this run (it needs eval_steps and a task)."));
    else box.append(el("p", { class: "meta" }, "Green: right, red: wrong. Click a cell to see all of a long answer."), heldOutTable(ex.held_out));
  };
  const picker = runPicker(draw, r => r.steps > 0);
  view.append(el("div", {}, "run ", picker), box);
  if (picker.value) await draw(picker.value);
  else box.append(el("p", {}, state.runs.length ? "No run has logged a step yet." : "No runs found: see the Runs page."));
});
