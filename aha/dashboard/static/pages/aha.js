// Aha tracker: did it start reflecting? The moment a held-out problem was first fixed by its own check, reflection
// phrases over training, split by correct and incorrect answers (green is correct and red incorrect in every chart
// and table here), what the checks did (sampled and held-out greedy), the completions that hold a phrase, and the
// same held-out problems answered at each evaluation.
"use strict";

const OUTCOME = { all: "#2563eb", correct: "#16a34a", incorrect: "#dc2626" };
const DECODING = { sampled: "#2563eb", greedy: "#9333ea" };  // blue, purple: green and red mean right and wrong here
const CHECKS = [["reflection_rate", "reflection rate"], ["correction_rate", "corrections (a “wait”)"],
  ["wait_fixed_rate", "a “wait” fixed the answer"], ["wait_broke_rate", "a “wait” broke the answer"],
  ["empty_reflection", "empty reflections"]];

function outcomeSeries(m, keys) {
  return keys.map(([k, label, outcome]) => ({ label, values: m.series[k] || m.step.map(() => null), color: OUTCOME[outcome] }));
}
function drawAhaCharts(box, m) {
  const grid = el("div", { class: "charts" });
  box.append(el("h3", {}, "Reflection phrases in the sampled completions"),
    el("p", { class: "meta legend-outcome" }, el("span", { class: "swatch", style: `background:${OUTCOME.correct}` }), " correct  ",
    el("span", { class: "swatch", style: `background:${OUTCOME.incorrect}` }), " incorrect  ",
    el("span", { class: "swatch", style: `background:${OUTCOME.all}` }), " all answers"), grid);
  chart(grid, "reflection", "reflection rate: correct vs incorrect", m.step, outcomeSeries(m, [
    ["behaviour/reflection_rate", "all", "all"], ["behaviour/reflection_rate/correct", "correct", "correct"],
    ["behaviour/reflection_rate/incorrect", "incorrect", "incorrect"]]));
  chart(grid, "phrases", "reflection phrases per 1,000 tokens", m.step, outcomeSeries(m, [["behaviour/phrases_per_1k_tokens", "all", "all"]]));
  chart(grid, "lengths", "length of correct vs incorrect (tokens)", m.step, outcomeSeries(m, [
    ["behaviour/len_correct", "correct", "correct"], ["behaviour/len_incorrect", "incorrect", "incorrect"]]));
}
// a behaviour metric as the sampled training completions (behaviour/...) and the held-out greedy answers at each
// evaluation (eval/behaviour/...), dashed with points
function decodingSeries(m, metric, name = "", colors = DECODING) {
  const col = k => m.series[k] || m.step.map(() => null);
  return [{ label: `${name}sampled`, values: col(`behaviour/${metric}`), color: colors.sampled },
          { label: `${name}held-out greedy`, values: col(`eval/behaviour/${metric}`), color: colors.greedy, dash: [6, 4], points: true }];
}
function drawCheckCharts(box, m) {
  const logged = k => (m.series[k] || []).some(v => v !== null);
  if (!logged("behaviour/correction_rate") && !logged("eval/behaviour/correction_rate")) return;  // no check format
  const grid = el("div", { class: "charts", id: "check-charts" }), col = k => m.series[k] || m.step.map(() => null);
  box.append(el("h3", {}, "What the checks did"), el("p", { class: "meta" }, "Solid: the sampled completions of each " +
    "training step; dashed with points: the held-out greedy answers at each evaluation. Rates are shares of all answers."), grid);
  for (const [metric, title] of CHECKS) chart(grid, `check/${metric}`, title, m.step, decodingSeries(m, metric));
  chart(grid, "check/accuracy", "accuracy of reflective vs direct answers", m.step, [
    ...decodingSeries(m, "accuracy/reflective", "reflective, ", { sampled: "#ea580c", greedy: "#ea580c" }),
    ...decodingSeries(m, "accuracy/direct", "direct, ", { sampled: "#0891b2", greedy: "#0891b2" })]);
  chart(grid, "check/eval_accuracy", "held-out accuracy (greedy)", m.step,
    [{ label: "eval/accuracy", values: col("eval/accuracy"), color: DECODING.greedy, dash: [6, 4], points: true }]);
  chart(grid, "check/len_mean", "completion length (sampled, tokens)", m.step,
    [{ label: "completion/len_mean", values: col("completion/len_mean"), color: DECODING.sampled }]);
}
// the reflection phrases of a text marked
function marked(text, phrases) {
  const words = phrases.map(p => p.trim()).filter(Boolean).map(p => p.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"))
    .sort((a, b) => b.length - a.length);  // the longest first, as aha.behaviour.phrase_pattern
  if (!words.length) return [text ?? ""];
  const re = new RegExp(`((?<!\\w)(?:${words.join("|")})(?!\\w))`, "i");
  return String(text ?? "").split(re).map((part, i) => i % 2 ? el("mark", { class: "reflect" }, part) : part);
}
// one problem a reflection fixed: its wrong answer at the evaluation before, beside the right one
function momentView(mo, phrases) {
  const side = (a, right) => el("div", { class: right ? "right" : "wrong" }, el("b", {}, `step ${a.step}: ${right ?
    "right, through its check" : "wrong"}`), el("pre", { class: right ? "after" : "before" }, marked(a.greedy, phrases)));
  return el("div", { class: "moment-of", "data-id": mo.id }, el("p", { class: "meta" },
    `${mo.prompt_text} (gold ${mo.answer}): wrong at step ${mo.before.step}, fixed by a “wait” at step ${mo.step}`),
    el("div", { class: "moment" }, side(mo.before, false), side(mo.after, true)));
}
function momentPanel(found, phrases) {
  if (!found.checked) return [];  // the held-out answers do not say what their reflection did
  const head = el("h3", {}, "The moment: a held-out problem answered wrong, then fixed by its own check");
  if (!found.moments.length) return [head, el("p", { class: "note", id: "no-moment" }, "No held-out problem was fixed " +
    "by a reflection in this run: no greedy answer went from wrong at one evaluation to right through a “wait” at the next.")];
  const [first, ...rest] = found.moments;
  return [head, el("div", { id: "aha-moment" }, momentView(first, phrases)), rest.length ? el("details", { id: "more-moments" },
    el("summary", {}, `${rest.length} more problem(s) fixed by a reflection later`), rest.map(mo => momentView(mo, phrases))) : ""];
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
  view.append(el("h2", {}, "Aha tracker"), el("p", { class: "meta" }, "Did it start reflecting? The first held-out answer " +
    "a reflection fixed, phrases such as “wait” or “let me check” in the recorded answers, and whether answers that hold " +
    "them are right more often."));
  const box = el("div");
  const draw = async run => {
    await pollMetrics(run);
    const ex = await api(`/api/aha?run=${encodeURIComponent(run)}`);
    box.replaceChildren(); window.ahaCharts = [];
    fileNotes(box, run);
    badLines(box, run, [...ex.bad, ...ex.held_out.bad]);
    box.append(...momentPanel(ex.moments, ex.phrases));
    drawCheckCharts(box, state.metrics[run]);
    drawAhaCharts(box, state.metrics[run]);
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
