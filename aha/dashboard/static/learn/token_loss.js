// Token-level loss: how each aggregation weighs the tokens of a short and a long completion, beside the surrogates
// (each token's weight by ratio) and TRL's loss_type names as (surrogate, aggregation) pairs.
"use strict";

explainer("token-loss-panel", "Token-level loss: how much each token weighs", panel => {
  const s = [slider("short", 1, 64, 1, 4, () => update(), "short completion (tokens)"),
             slider("long", 1, 64, 1, 16, () => update(), "long completion (tokens)"),
             slider("max_len", 1, 128, 1, 32, () => update(), "max_completion_length (dr_grpo's fixed length)")];
  const out = el("div", { id: "token-loss-out" }), call = learnCall("aggregation", out);
  panel.append(el("p", { class: "meta" }, "Two completions with the same advantage in one batch. A bar is one token's weight " +
    "in the loss, d(loss)/d(token's loss), taken through algos.aggregate by autograd: the share of the update that token " +
    "gets. Same scale in every row."), sliderRows(s), out);
  const bars = (weights, top, which) => el("div", { class: `bars ${which}` }, ...weights.map((w, i) =>
    el("span", { class: "bar", title: `token ${i + 1}: ${fmt(w)}`, "data-value": w, style: `height:${(60 * w / top).toFixed(2)}px` })));
  const show = d => {
    const rows = Object.entries(d.by_loss_type);
    const top = Math.max(...rows.flatMap(([, r]) => [...r.short, ...r.long]));
    out.replaceChildren(el("table", { id: "token-loss-table" }, el("tr", {}, el("th", {}, "loss_type"), el("th", {}, "short: per-token weight"),
      el("th", {}, "long: per-token weight"), el("th", {}, "short total"), el("th", {}, "long total")),
      ...rows.map(([name, r]) => el("tr", { "data-loss": name }, el("td", { class: "text" }, el("b", {}, name), el("div", { class: "meta" }, r.doc)),
        el("td", { class: "text" }, bars(r.short, top, "short"), num(r.short[0])), el("td", { class: "text" }, bars(r.long, top, "long"), num(r.long[0])),
        num(r.total.short, "td", { "data-total": "short" }), num(r.total.long, "td", { "data-total": "long" })))),
      el("p", { class: "meta" }, "grpo: every completion weighs the same in total, so a short one's tokens weigh more each (a " +
        "short wrong answer is punished harder per token, a long one less: the length bias Dr. GRPO points out). dapo: every " +
        "token weighs the same, so a long completion weighs more in total. dr_grpo: every token weighs 1/(completions × " +
        `max_completion_length = ${d.max_len}), whatever the lengths.`),
      surrogates(d.surrogates), lossTypes(d.loss_types));
  };
  // The other half of a loss_type: what each token's loss is (algos.SURROGATES), as its weight on grad log pi.
  const surrogates = sg => el("div", { id: "surrogates" }, el("h4", {}, "Surrogates: each token's weight on grad log pi, by ratio pi/pi_old"),
    el("table", { id: "surrogate-table" }, el("tr", {}, el("th", {}, "surrogate"), el("th", {}, "A"), ...sg.ratios.map(r => el("th", {}, `r = ${r}`))),
      ...Object.entries(sg).filter(([n]) => n !== "ratios").flatMap(([name, r]) => ["positive", "negative"].map(side =>
        el("tr", { "data-surrogate": name }, el("td", { class: "text" }, el("b", {}, name), side === "positive" ? el("div", { class: "meta" }, r.doc) : ""),
          el("td", {}, side === "positive" ? "+1" : "-1"), ...r[side].map(w => num(w, "td")))))),
    el("p", { class: "meta" }, "epsilon 0.2, epsilon_high 0.28 (clip: ratio within [0.8, 1.28]); cispo's eps_max 5. A 0 is a " +
      "token the surrogate drops from the update."));
  const lossTypes = lt => el("div", { id: "loss-types" }, el("h4", {}, "TRL's loss_type = a surrogate and an aggregation"),
    el("table", { id: "loss-type-table" }, el("tr", {}, el("th", {}, "loss_type"), el("th", {}, "surrogate"), el("th", {}, "aggregation")),
      ...Object.entries(lt).map(([name, t]) => el("tr", { "data-loss-type": name }, el("td", {}, name), el("td", {}, t.surrogate),
        el("td", {}, t.aggregation)))));
  const update = () => call({ short: s[0].value, long: s[1].value, max_len: Math.max(s[2].value, s[0].value, s[1].value) }, show);
  update();
});
