// Outcome vs process supervision: one group of worked sums, each column step and each answer scored, and every
// token's advantage when only the answer is rewarded (algos.compute_advantages "grpo") and when each step is
// (algos.process_advantages). Click a step to see its reward and where it lands; toggle it right or wrong.
// Cells are coloured as the Groups page colours advantages (colourOf, pages/groups.js).
"use strict";

explainer("process-panel", "Outcome vs process supervision: which tokens get the credit", panel => {
  const out = el("div", { id: "process-out" }), call = learnCall("supervision", out);
  const detail = el("div", { id: "process-detail" }, "Click a step's score (or an answer's) to see its reward and which tokens it moves.");
  let data = null, picked = null;  // picked: [answer, step index or "answer"]
  const stepOf = (c, j) => j === "answer" ? c.outcome : c.steps[j];
  const scores = () => ({ steps: data.completions.map(c => c.steps.map(s => s.score)),
                          outcomes: data.completions.map(c => c.outcome.score) });
  const toggle = ([i, j]) => {
    const body = scores(), flip = v => (v > 0 ? 0 : 1);
    if (j === "answer") body.outcomes[i] = flip(body.outcomes[i]); else body.steps[i][j] = flip(body.steps[i][j]);
    call(body, show);
  };
  const show = d => {
    data = d;
    const top = Math.max(...d.completions.flatMap(c => [...c.outcome_advantage, ...c.process_advantage]).map(Math.abs));
    out.replaceChildren(el("p", {}, `“${d.question}” (gold ${d.answer}), G = ${d.completions.length}. The group's pool: `,
      num(d.pool.size), " rewards (every step and every answer), mean ", num(d.pool.mean), ", std ", num(d.pool.std), " (n−1)."),
      ...d.completions.map((c, i) => answerTable(c, i, top)));
    if (picked) pick(picked);
  };
  const answerTable = (c, i, top) => {
    const mark = c.pieces.map(() => el("td", {}));
    c.steps.forEach((s, j) => mark[s.token].append(stepButton(s, [i, j])));
    mark[c.outcome.token].append(stepButton(c.outcome, [i, "answer"], "answer "));
    const row = (label, vals, kind) => el("tr", { class: kind }, el("th", { class: "text" }, label),
      ...vals.map((v, t) => num(v, "td", { "data-t": t, style: `background:${colourOf(v, "advantage", top)}` })));
    return el("table", { class: "process-answer", "data-i": i },
      el("tr", {}, el("th", { class: "text" }, `answer ${i + 1}`), ...c.pieces.map((p, t) => el("td", { class: "text mono piece", "data-t": t }, p))),
      el("tr", { class: "marks" }, el("th", { class: "text" }, "step reward"), mark),
      row("outcome supervision A", c.outcome_advantage, "outcome"), row("process supervision A", c.process_advantage, "process"));
  };
  const stepButton = (s, at, prefix = "") => el("button", { class: `step-mark ${s.score > 0 ? "right" : "wrong"}`, "data-i": at[0],
    "data-j": at[1], title: "click: this step's reward and the tokens it moves", onclick: () => pick(at) },
    `${prefix}${s.score > 0 ? "✓" : "✗"} ${fmt(s.score)}`);
  const pick = at => {
    picked = at;
    const [i, j] = at, c = data.completions[i], s = stepOf(c, j), table = out.querySelector(`table[data-i="${i}"]`);
    out.querySelectorAll(".covered, .picked").forEach(e => e.classList.remove("covered", "picked"));
    table.querySelector(`.step-mark[data-j="${j}"]`).classList.add("picked");
    table.querySelectorAll("td.piece, tr.process td").forEach(td => td.classList.toggle("covered", +td.dataset.t <= s.token));
    detail.replaceChildren(...explainStep(c, i, j, s), " ", el("button", { id: "process-toggle", onclick: () => toggle(at) },
      s.score > 0 ? "mark it wrong (score 0)" : "mark it right (score 1)"));
  };
  const explainStep = (c, i, j, s) => [el("b", {}, j === "answer" ? `answer ${i + 1}'s outcome` : `answer ${i + 1}, step ${j + 1} “${c.pieces[s.token].trim()}”`),
    ": score ", num(s.score, "span", { id: "process-score" }), ", normalised in the pool (score − ", num(data.pool.mean), ") / (",
    num(data.pool.std), " + ε) = ", num(s.normalised, "span", { id: "process-normalised" }),
    `. Process supervision adds it to tokens 1 to ${s.token + 1} of this answer (highlighted: every token at or before ` +
    "the step's end), and to no token after it nor of another answer. Outcome supervision " +
    (j === "answer" ? "gives every token of the answer one advantage, " : "does not see the step: every token of the answer gets "),
    num(c.outcome_advantage[0], "span", { id: "process-outcome-adv" }), " (its outcome reward normalised over the group's answers only)."];
  panel.append(el("p", { class: "meta" }, "Four worked answers to one sum. A rule scores each column step 1 (right) or 0 " +
    "(wrong), and the answer 1 or 0. Under outcome supervision (grpo) an answer's tokens all share one advantage: the right " +
    "steps of a wrong answer are pushed down with it, the wrong step of a lucky right answer pushed up. Under process " +
    "supervision (DeepSeekMath §4.1.3) every step and every answer of the group are normalised together (an answer's " +
    "outcome counts as one more step, ending at its last token), and a step's " +
    "normalised reward is added to every token at or before its end: a token's advantage is the sum over the steps ending " +
    "at or after it. So a wrong step lowers the tokens that led up to it, not those after it, and the last tokens carry the " +
    "outcome alone."), el("p", { class: "meta", id: "process-about" }), detail, out);
  call({}, d => { panel.querySelector("#process-about").replaceChildren("aha.algos.process_advantages: ", d.about); show(d); });
});
