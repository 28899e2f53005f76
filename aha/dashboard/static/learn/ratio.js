// The clipped surrogate of one token over the policy ratio: where the clip bites (shaded) and the current ratio.
"use strict";

explainer("ratio-panel", "Policy ratio explorer: when does the clip bite?", panel => {
  const s = [slider("p_old", 0.01, 1, 0.01, 0.5, () => update(), "π_old (token's probability when sampled)"),
             slider("p_new", 0.01, 1, 0.01, 0.7, () => update(), "π (its probability now)"),
             slider("epsilon", 0.05, 0.5, 0.01, 0.2, () => update(), "ε (clip below)"),
             slider("epsilon_high", 0.05, 0.5, 0.01, 0.28, () => update(), "ε_high (clip above, DAPO)")];
  const out = el("div", { id: "ratio-out" }), plotBox = el("div", { class: "charts" }), call = learnCall("ratio", out);
  panel.append(el("p", { class: "meta" }, "The objective of one token is min(ratio·A, clip(ratio, 1−ε, 1+ε_high)·A). Inside the " +
    "shaded region the two agree; outside it the clip takes over where it lowers the objective, and there the token's gradient is 0."),
    sliderRows(s), out, plotBox);
  const row = (k, v) => el("tr", {}, el("td", {}, k), num(v.objective, "td"), num(v.unclipped, "td"), el("td", {}, v.clipped ? "yes" : "no"));
  const show = d => {
    out.replaceChildren(el("p", {}, "ratio π/π_old = ", num(d.ratio, "b", { id: "ratio-value" }), " · clip region [",
      num(d.clip_range[0]), ", ", num(d.clip_range[1]), "] (shaded) · the dashed line is the current ratio"),
      el("table", { id: "ratio-table" }, el("tr", {}, el("th", {}, "advantage"), el("th", {}, "clipped objective"),
        el("th", {}, "ratio·A"), el("th", {}, "clip bites")), row("A = +1", d.by_advantage.positive), row("A = −1", d.by_advantage.negative)));
    plotBox.replaceChildren(); window.ahaCharts = window.ahaCharts.filter(c => c.key !== "ratio-curve");
    chart(plotBox, "ratio-curve", "objective over the ratio", d.grid, [
      { label: "A = +1", values: d.by_advantage.positive.curve, color: "#16a34a", points: false },
      { label: "A = −1", values: d.by_advantage.negative.curve, color: "#dc2626", points: false }],
      { xlabel: "ratio", width: 560, height: 260, band: d.clip_range, marker: d.ratio });
  };
  const update = () => call({ p_old: s[0].value, p_new: s[1].value, epsilon: s[2].value, epsilon_high: s[3].value }, show);
  update();
});
