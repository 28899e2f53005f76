// Groups: what does one group look like? The G answers to one prompt with their rewards and advantages, and per
// token what the update did. Colours share one scale across every group of the step, so a pale group is a group
// the update barely moved; "colour by" shows the per-token quantities (log-prob, ratio, KL, clip) where they vary.
// An agent's episode is shown turn by turn: each model turn with its tool calls, each tool turn with its results'
// outcomes; the tokens the tools added are greyed, without colour: the model read them, they were not trained.
// Step rewards (process supervision) show as a marker with the score after each step's last token, the step's
// tokens underlined in its score's colour; per-token advantages, where recorded, are in each token's title.
"use strict";

const RESULT_CHARS = 160;  // of a tool's result shown in its turn's header (all of it is in the tokens below)

const COLOUR_BY = {
  loss: { label: "term in the loss", field: "loss", kind: "diverging", neg: [22, 163, 74], pos: [220, 38, 38],
          note: "green lowers the loss by raising the token's probability, red by lowering it" },
  advantage: { label: "advantage", field: "advantage", kind: "diverging", neg: [220, 38, 38], pos: [22, 163, 74],
               note: "green: pushed up (A > 0), red: pushed down (A < 0)" },
  ratio: { label: "ratio π/π_old (log)", field: "ratio", kind: "diverging", neg: [234, 88, 12], pos: [37, 99, 235], log: true,
           note: "blue: more likely than when sampled, orange: less likely; outlined: clipped" },
  kl: { label: "KL to the reference", field: "kl", kind: "sequential", pos: [147, 51, 234], note: "darker: further from the reference" },
  surprise: { label: "surprise (−log-prob)", field: "logp", kind: "sequential", pos: [71, 85, 105], negate: true,
              note: "darker: the policy found the token less likely" },
};

// an agent's episode: token i was added by a tool (tokens.model 0), read by the model but not trained
function isTool(c, i) { return !!c.tokens.model && c.tokens.model[i] === 0; }
// the per-token values of completion c for a colour mode: tokens.advantage when recorded, else the answer's advantage;
// none on tool tokens (no advantage, ratio or loss term of theirs is in the update)
function tokenValues(c, mode) {
  const m = COLOUR_BY[mode], t = c.tokens, n = t.piece.length;
  let v = mode === "advantage" ? (t.advantage || (c.trained && c.advantage !== null ? Array(n).fill(c.advantage) : null)) : t[m.field];
  if (!v) return Array(n).fill(null);
  return v.map((x, i) => x === null || x === undefined || isTool(c, i) ? null : m.log ? Math.log(x) : m.negate ? -x : x);
}
function stepScale(groups, mode) {  // the largest |value| over every token of every group of the step
  let top = 0;
  for (const g of groups) for (const c of g.completions || []) for (const v of tokenValues(c, mode)) if (v !== null) top = Math.max(top, Math.abs(v));
  return top;
}
function colourOf(v, mode, scale) {
  if (v === null || !scale) return "transparent";
  const m = COLOUR_BY[mode], a = Math.min(1, Math.abs(v) / scale);
  const rgb = m.kind === "sequential" || v >= 0 ? m.pos : m.neg;
  return `rgba(${rgb[0]},${rgb[1]},${rgb[2]},${+a.toFixed(4)})`;
}
// which per-token quantities differ between the tokens of one answer at this step (else the colour is per answer)
function variation(groups) {
  const varies = f => groups.some(g => (g.completions || []).some(c => {
    const v = (c.tokens[f] || []).filter((x, i) => x !== null && !isTool(c, i)); return v.some(x => x !== v[0]); }));
  return Object.fromEntries(["loss", "ratio", "kl", "logp", "clip", "advantage"].map(f => [f, varies(f)]));
}
function variationNote(v, groups) {
  if (!groups.some(g => (g.completions || []).some(c => c.trained))) return "No answer shown here was in the update " +
    "(advantage 0 where a group's rewards were all equal, or masked as truncated), so no per-token values were recorded.";
  const flat = [];
  if (!v.ratio) flat.push("the ratio is 1 on every token (one pass over the batch: nothing moved before this update)");
  if (!v.kl) flat.push("no KL (beta = 0)");
  if (!v.advantage) flat.push("one advantage per answer (outcome reward)");
  if (!v.loss) flat.push("so each answer's tokens share one term in the loss");
  return flat.length ? `At this step ${flat.join("; ")}. Per-token differences: colour by surprise` +
    (v.ratio ? ", ratio" : "") + (v.kl ? ", KL" : "") + (v.advantage ? ", advantage (by step)" : "") + "." : "Per-token terms differ at this step: the colours vary within answers.";
}
// ---------------------------------------------------------------- step rewards
function stepColour(score) {  // 0 red .. 1 green (clamped); a step whose score could not be computed, grey
  if (score === null || score === undefined) return "rgb(148,163,184)";
  const a = Math.min(1, Math.max(0, score)), mix = (x, y) => Math.round(x + (y - x) * a);
  return `rgb(${mix(220, 22)},${mix(38, 163)},${mix(38, 74)})`;
}
function stepOfToken(c, i) {  // the step token i belongs to: the first one ending at or after it
  return (c.steps || []).filter(s => s.token >= i).sort((a, b) => a.token - b.token)[0] || null;
}
function stepMark(s) {
  return el("span", { class: "step-score", "data-score": s.score === null ? "null" : String(s.score), "data-token": s.token,
    style: `background:${stepColour(s.score)}`, title: `step reward ${s.reward}: ${fmt(s.score)} (the step ends at character ` +
    `${s.end}, token ${s.token})` }, s.score === null ? "?" : fmt(s.score));
}
function stepText(step) { return step ? ` · in a step scored ${fmt(step.score)} by ${step.reward}` : ""; }
function tokenTitle(c, i) {  // null where the run recorded neither step rewards nor per-token advantages: as before
  const adv = c.tokens.advantage, step = stepOfToken(c, i);
  if (!adv && !c.steps) return null;
  return `token ${i}` + (adv ? ` · advantage ${fmt(adv[i])}` : "") + stepText(step);
}
function tokenSpan(c, i, vals, mode, scale, detail) {
  const t = c.tokens, clip = t.clip ? t.clip[i] : 0, tool = isTool(c, i), step = stepOfToken(c, i);
  const cls = ["tok", tool ? "masked" : c.trained ? "trained" : "", clip === 1 ? "clip-high" : clip === -1 ? "clip-low" : ""].join(" ").trim();
  const style = tool ? null : `background:${colourOf(vals[i], mode, scale)}` + (step ? `;border-bottom:3px solid ${stepColour(step.score)}` : "");
  const span = el("span", { class: cls, style, "data-v": vals[i], "data-advantage": t.advantage ? t.advantage[i] : null,
                            title: tool ? "tool token: read, not trained" : tokenTitle(c, i) }, t.piece[i]);
  span.addEventListener("click", () => {
    document.querySelectorAll(".tok.selected").forEach(s => s.classList.remove("selected"));
    span.classList.add("selected");
    const clipText = t.clip ? ({ "-1": "clipped low (ratio < 1-ε, A < 0)", "0": "not clipped", "1": "clipped high (ratio > 1+ε_high, A > 0)" })[t.clip[i]] : "–";
    detail.replaceChildren(el("b", {}, JSON.stringify(t.piece[i])), ` log-prob ${fmt(t.logp ? t.logp[i] : null)}`,
      el("span", { class: "ratio" }, ` · ratio ${fmt(t.ratio ? t.ratio[i] : null)}`), ` · ${clipText}`,
      ` · KL ${fmt(t.kl ? t.kl[i] : null)} · loss term ${fmt(t.loss ? t.loss[i] : null)}`,
      t.advantage ? ` · advantage ${fmt(t.advantage[i])}` : "", stepText(step),
      tool ? " (a tool's token: read by the model, not trained)" : c.trained ? "" : " (not in the update)");
  });
  return span;
}
function percent(share) { const p = 100 * share; return `${p >= 10 ? Math.round(p) : +p.toPrecision(2)}%`; }
function advantageBar(a, top) {
  const w = a === null || !top ? 0 : Math.min(100, 100 * Math.abs(a) / top);
  return el("span", { class: "adv-bar", title: `|advantage| relative to the step's largest (${fmt(top)})` },
    el("span", { class: a < 0 ? "neg" : "pos", style: `width:${+w.toFixed(2)}%` }));
}
function drawGroup(g, mode, scale, topAdv, detail) {
  if (g.error) return el("div", { class: "note bad-line" }, g.error);
  const box = el("div", { class: "group", "data-group": g.group });
  const terms = (g.completions || []).flatMap(c => tokenValues(c, mode)).filter(v => v !== null).map(Math.abs);
  const top = terms.length ? Math.max(...terms) : 0;
  box.append(el("div", { title: typeof g.prompt === "string" ? g.prompt : JSON.stringify(g.prompt) }, el("b", {}, `group ${g.group}: `),
    g.prompt_text ?? JSON.stringify(g.prompt), g.answer ? `  (gold: ${g.answer})` : ""),
    el("div", { class: "meta group-scale" }, `reward mean ${fmt(g.mean)} · std ${fmt(g.std)} · G = ${g.completions.length} · ` +
      `largest |${COLOUR_BY[mode].label}| ${fmt(top)}` + (scale ? ` (${percent(top / scale)} of the step's largest)` : "")));
  const sorted = [...g.completions].sort((a, b) => (b.reward ?? -Infinity) - (a.reward ?? -Infinity));
  for (const c of sorted) {
    const per = g.reward_names.map((n, i) => `${n} ${fmt(c.rewards[i])}`).join(" · ");
    const vals = tokenValues(c, mode), toks = (from, to) => tokenRun(c, from, to, vals, mode, scale, detail);
    box.append(el("div", { class: "completion" }, el("div", { class: "meta" }, advantageBar(c.advantage, topAdv),
      ` reward ${fmt(c.reward)} (${per}) · advantage ${fmt(c.advantage)}` + (c.tokens.advantage ? " at the first token " +
      "(each token its own: see its title, or colour by advantage)" : "") + (c.steps ? ` · ${c.steps.length} step reward(s)` : "") +
      (c.trained ? "" : " · left out of the update") +
      (c.turns ? episodeMeta(c, g) : "")), c.turns ? episodeView(c, toks) : toks(0, c.tokens.piece.length)));
  }
  return box;
}
function tokenRun(c, from, to, vals, mode, scale, detail) {
  const spans = [];
  for (let i = from; i < Math.min(to, c.tokens.piece.length); i++) {
    spans.push(tokenSpan(c, i, vals, mode, scale, detail));
    for (const s of (c.steps || []).filter(s => s.token === i)) spans.push(stepMark(s));
  }
  return el("div", { class: "tokens" }, spans);
}
// ---------------------------------------------------------------- an agent's episode, turn by turn
function episodeMeta(c, g) {
  const model = c.tokens.model || [], own = model.filter(k => k === 1).length;
  const prompt = c.prompt_text && c.prompt_text !== g.prompt_text ? ` · episode prompt: ${c.prompt_text}` : "";
  return ` · finish ${c.finish ?? "–"} · ${own} model token(s), ${model.length - own} tool token(s)${prompt}`;
}
// each turn's header (a model turn's tool calls; a tool turn's results with their outcomes), then its tokens
function episodeView(c, toks) {
  const n = c.tokens.piece.length, end = c.turns.length ? c.turns[c.turns.length - 1].end : 0;
  const turns = c.turns.map((t, k) => el("div", { class: `turn ${t.role === "tool" ? "tool" : "model"}`, "data-turn": k },
    turnHeader(t, k), toks(t.start, t.end)));
  return el("div", { class: "episode" }, turns, end < n ? toks(end, n) : []);
}
function turnHeader(t, k) {
  if (t.role === "tool") return el("div", { class: "turn-head" }, `turn ${k + 1}, tool results (read, not trained): `,
    ...(t.calls || []).map(callResult));
  const calls = (t.tool_calls || []).map(c => el("code", { class: "call" + (c.error ? " bad" : "") },
    `${c.name ?? "?"}(${JSON.stringify(c.arguments ?? {})})` + (c.error ? `: ${c.error}` : "")));
  const dropped = t.dropped_results ? [" · results dropped (no room left): ", ...t.dropped_results.map(callResult)] : [];
  return el("div", { class: "turn-head" }, `turn ${k + 1}, model`, calls.length ? ", calls " : " (no tool call)", calls, dropped);
}
function callResult(r) {
  const text = String(r.content ?? ""), short = text.length > RESULT_CHARS ? text.slice(0, RESULT_CHARS) + "…" : text;
  return el("span", { class: "call-result" }, el("code", {}, r.name ?? "?"), " → ",
    el("span", { class: `outcome ${r.outcome === "ok" ? "ok" : "bad"}`, "data-outcome": r.outcome }, r.outcome ?? "–"), " ",
    el("span", { class: "result-text", title: text }, short));
}
function maskedLegend(groups) {  // shown where the step holds tool tokens
  const any = groups.some(g => (g.completions || []).some(c => (c.tokens.model || []).includes(0)));
  return any ? el("div", { class: "legend", id: "masked-legend" }, el("span", { class: "tok masked" }, "tool"),
    " tool tokens: read, not trained (no advantage, ratio or loss term, so no colour)") : "";
}
function stepLegend(groups) {  // shown where the step holds step rewards
  const any = groups.some(g => (g.completions || []).some(c => c.steps && c.steps.length));
  return any ? el("div", { class: "legend", id: "step-legend" }, el("span", { class: "step-score", style: `background:${stepColour(0)}` }, "0"),
    el("span", { class: "step-score", style: `background:${stepColour(1)}` }, "1"), " step rewards: each step's score after its " +
    "last token, its tokens underlined in that colour (red 0 to green 1)") : "";
}
function legend(mode, scale, step, n) {
  const m = COLOUR_BY[mode];
  const ramp = m.kind === "diverging" ? `linear-gradient(90deg, rgb(${m.neg}), #fff, rgb(${m.pos}))` : `linear-gradient(90deg, #fff, rgb(${m.pos}))`;
  const lo = m.kind === "diverging" ? -scale : 0;
  return el("div", { class: "legend", id: "colour-legend" }, el("span", { class: "num" }, fmt(m.log ? Math.exp(lo) : lo)),
    el("span", { class: "ramp", style: `background:${ramp}` }), el("span", { class: "num" }, fmt(m.log ? Math.exp(scale) : scale)),
    ` ${m.label}: one scale for all ${n} group(s) of step ${step}; ${m.note}.`);
}

page("groups", "Groups", async () => {
  await loadRuns();
  view.append(el("h2", {}, "Groups"), el("p", { class: "meta" }, "What does one group look like? The answers to one prompt, " +
    "best first, with what the update did to each token (click one)."));
  const body = el("div"), detail = el("div", { id: "token-detail" }, "Click a token: its log-prob, ratio, clip and KL.");
  const stepSel = el("select", { id: "step-select" }), modeSel = el("select", { id: "colour-by" },
    ...Object.entries(COLOUR_BY).map(([k, m]) => el("option", { value: k }, m.label)));
  modeSel.value = COLOUR_BY[hashParams().get("colour")] ? hashParams().get("colour") : "loss";
  let data = null;
  const curvesLink = el("a", { class: "to-curves" }, "its curves");
  const render = () => {
    for (const o of modeSel.options) {  // a quantity this step did not record (no KL at beta = 0) cannot be picked
      o.disabled = !data.groups.some(g => (g.completions || []).some(c => tokenValues(c, o.value).some(v => v !== null)));
      o.textContent = COLOUR_BY[o.value].label + (o.disabled ? " (not recorded)" : "");
    }
    if (modeSel.selectedOptions[0]?.disabled) modeSel.value = "loss";
    const mode = modeSel.value, groups = data.groups, scale = stepScale(groups, mode);
    const topAdv = Math.max(0, ...groups.flatMap(g => (g.completions || []).map(c => Math.abs(c.advantage ?? 0))));
    const v = variation(groups);
    const notes = el("div");
    badLines(notes, picker.value, data.bad);
    body.replaceChildren(...(data.missing ? [el("p", {}, "This run has no groups.jsonl (log_groups_steps = 0?).")] :
      [notes, legend(mode, scale, data.step, groups.length), maskedLegend(groups), stepLegend(groups), el("p", { class: "meta", id: "variation-note" }, variationNote(v, groups)),
       ...groups.map(g => drawGroup(g, mode, scale, topAdv, detail))]));
    setHashParams({ run: picker.value, step: data.step, colour: mode === "loss" ? "" : mode });
    curvesLink.href = `#curves?runs=${encodeURIComponent(picker.value)}`;
  };
  const show = async (run, step) => {
    data = await api(`/api/groups?run=${encodeURIComponent(run)}${step === undefined ? "" : `&step=${step}`}`);
    stepSel.replaceChildren(...data.steps.map(s => el("option", { value: s }, `step ${s}`)));
    stepSel.value = data.step;
    render();
  };
  const picker = runPicker(run => show(run), r => r.has_groups);
  const move = d => { const i = stepSel.selectedIndex + d; if (i >= 0 && i < stepSel.options.length) show(picker.value, stepSel.options[i].value); };
  stepSel.addEventListener("change", () => show(picker.value, stepSel.value));
  modeSel.addEventListener("change", () => data && render());
  view.append(el("div", { class: "toolbar" }, "run ", picker, " ", el("button", { id: "step-prev", onclick: () => move(-1) }, "◀"), stepSel,
    el("button", { id: "step-next", onclick: () => move(1) }, "▶"), " colour by ", modeSel, " ", curvesLink),
    detail, body);
  if (picker.value) await show(picker.value, hashParams().get("step") ?? undefined);
  else body.append(el("p", {}, state.runs.length ? "No run has group records (GRPO runs write groups.jsonl every log_groups_steps)." :
    "No runs found: see the Runs page."));
});
