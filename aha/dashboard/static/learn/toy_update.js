// Run it in your browser: one GRPO update of a toy softmax policy over six completions, done on the server by aha's
// own loss (aha.algos) and optimizer (AdamW, as the trainer builds it), then the next, and the next.
"use strict";

explainer("toy-panel", "Run it in your browser — toy GRPO update", panel => {
  const out = el("div", { id: "toy-out" }), plotBox = el("div", { class: "charts" }), call = learnCall("toy", out);
  const toy = { state: null, history: [], updates: 0, last: null };
  const rewards = [1, 1, 0, 0.5, 0, 0].map((v, i) => slider(`toy-r${i + 1}`, -1, 2, 0.05, v, () => refresh(), `reward ${i + 1}`));
  const knobs = [slider("toy-lr", 0.01, 1, 0.01, 0.1, () => {}, "learning rate"), slider("toy-eps", 0.05, 0.5, 0.01, 0.2, () => {}, "ε"),
                 slider("toy-beta", 0, 1, 0.05, 0, () => {}, "β (KL to the starting policy)"),
                 slider("toy-passes", 1, 8, 1, 1, () => {}, "optimizer steps per group (num_iterations)")];
  const est = el("select", { id: "toy-estimator" }, ...["grpo", "dr_grpo", "rloo", "batch", "batch_rewards"].map(n => el("option", { value: n }, n)));
  const loss = el("select", { id: "toy-loss" }, ...["dapo", "grpo", "dr_grpo"].map(n => el("option", { value: n }, n)));
  const body = apply => ({ rewards: rewards.map(r => r.value), state: toy.state, apply, learning_rate: knobs[0].value,
    epsilon: knobs[1].value, beta: knobs[2].value, passes: knobs[3].value, estimator: est.value, loss_type: loss.value });
  let stepping = false;
  const step = async n => {  // updates one after another, each from the state the last one returned
    if (stepping) return;
    stepping = true;
    panel.querySelectorAll("button").forEach(b => { b.disabled = true; });
    try { for (let i = 0; i < n; i++) record(await api("/api/learn/toy", body(true))); out.querySelector(".learn-error")?.remove(); }
    catch (e) { out.prepend(el("div", { class: "note learn-error" }, e.message)); }
    stepping = false;
    panel.querySelectorAll("button").forEach(b => { b.disabled = false; });
  };
  const record = d => {
    if (!toy.history.length) toy.history.push(d.before);
    toy.state = d.state; toy.updates += 1; toy.history.push(d.after); toy.last = d; show(d);
  };
  const refresh = () => call(body(false), show);  // the policy as it is now, advantages of the rewards as set
  const reset = () => { Object.assign(toy, { state: null, history: [], updates: 0, last: null }); refresh(); };
  panel.append(el("p", { class: "meta" }, "The prompt has six possible completions; the policy is a softmax over them (six logits). " +
    "Here the group is those six, each once (a real group is sampled from the policy). Set the rewards, then apply an update: " +
    "advantages, clipped surrogate, KL and aggregation by aha.algos, the step by aha's AdamW, all on the server."),
    el("div", { class: "sliders" }, ...rewards.flatMap(x => [x.label, x.input, el("br")])), sliderRows(knobs),
    el("div", {}, "advantage ", est, " loss_type ", loss, " ", el("button", { id: "toy-step", onclick: () => step(1) }, "Apply one GRPO update"),
      " ", el("button", { id: "toy-step10", onclick: () => step(10) }, "10 updates"), " ", el("button", { id: "toy-reset", onclick: reset }, "Reset")), out, plotBox);
  const show = d => {
    const table = el("table", { id: "toy-table" }, el("tr", {}, ...["completion", "reward", "advantage", "probability before",
      "after this update", "change"].map(h => el("th", {}, h))), ...d.completions.map((c, i) => el("tr", { "data-i": i },
      el("td", { class: "text mono" }, el("span", { class: "swatch", style: `background:${COLORS[i % COLORS.length]}` }), " ", c), el("td", {}, rewards[i].value), num(d.advantages[i], "td", { class: "num adv" }),
      num(d.before[i], "td", { class: "num before" }), d.after ? num(d.after[i], "td", { class: "num after" }) : el("td", {}, "–"),
      d.change ? num(d.change[i], "td", { class: "num change" }) : el("td", {}, "–"))));
    out.replaceChildren(el("p", {}, `“${d.prompt}” · `, el("span", { id: "toy-updates" }, `${toy.updates} update(s) applied`),
      d.loss ? [" · loss per pass ", ...d.loss.map(v => [num(v), " "]), "· completions clipped per pass ", d.clipped.join(", ")] : ""), table,
      el("p", { class: "meta" }, "AdamW's first step moves every logit by about the learning rate, whatever the size of its " +
        "advantage: the sign counts, not the size. Later steps follow the running moments. With several optimizer steps per " +
        "group the ratio leaves 1 and the clip starts to bite."));
    plotBox.replaceChildren(); window.ahaCharts = window.ahaCharts.filter(c => c.key !== "toy-history");
    if (toy.history.length > 1) chart(plotBox, "toy-history", "probability of each completion, update by update",
      toy.history.map((_, i) => i), d.completions.map((c, i) => ({ label: `${i + 1}`, values: toy.history.map(h => h[i]) })),
      { xlabel: "update", width: 560, height: 240, integerX: true });
  };
  refresh();
});
