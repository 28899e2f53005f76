// A group's rewards -> advantages under every estimator aha has (algos.ADVANTAGES), with each one's formula.
"use strict";

explainer("adv-panel", "A group of answers: rewards → advantages", panel => {
  const out = el("div", { id: "adv-out" }), call = learnCall("advantages", out);
  const text = el("input", { id: "adv-rewards", size: 48, value: "1, 0, 0, 1, 0.5, 0" });
  const other = el("input", { id: "adv-other", size: 36, value: "", placeholder: "e.g. 0, 0, 0, 0, 0, 1" });
  const sliderBox = el("div", { class: "sliders" });
  let sliders = [];
  const parse = s => s.split(/[\s,;]+/).filter(Boolean).map(Number);
  const buildSliders = values => {
    sliders = values.map((v, i) => slider(`r${i + 1}`, -2, 2, 0.05, v, () => {
      const now = parse(text.value); now[i] = sliders[i].value; text.value = now.join(", "); update(); }, `reward ${i + 1}`));
    sliderBox.replaceChildren(...sliders.flatMap(x => [x.label, x.input, el("br")]));
  };
  const update = () => {
    const rewards = parse(text.value), others = parse(other.value);
    if (rewards.some(v => !isFinite(v))) return;
    if (rewards.length !== sliders.length) buildSliders(rewards);
    call({ rewards, ...(others.length ? { other: others } : {}) }, data => show(rewards, data));
  };
  const show = (rewards, data) => {
    const names = Object.keys(data.advantages);
    const table = el("table", { id: "adv-table" }, el("tr", {}, el("th", {}, "answer"), el("th", {}, "reward"),
      ...names.map(n => el("th", { title: data.about[n].formula }, n))));
    rewards.forEach((r, i) => table.append(el("tr", {}, el("td", {}, i + 1), el("td", {}, r),
      ...names.map(n => num(data.advantages[n][i], "td", { "data-est": n, "data-i": i })))));
    const about = el("dl", { id: "adv-about" }, ...names.flatMap(n => [el("dt", {}, n, " ", formula(data.about[n].formula)),
      el("dd", {}, data.about[n].doc)]));
    out.replaceChildren(el("p", {}, "group mean ", num(data.mean), ", std ", num(data.std), " (n−1), ε = ", num(data.eps),
      data.other_advantages ? " · the batch also holds the other group below" : " · one group: the batch is this group, " +
      "so batch and batch_rewards equal grpo up to ε; add another group to see them differ"), table, about);
  };
  const equal = el("button", { id: "adv-equal", onclick: () => { text.value = Array(8).fill(1.6).join(", "); update(); } },
    "all equal: 1.6 × 8");
  text.addEventListener("input", debounce(update, 250)); other.addEventListener("input", debounce(update, 250));
  panel.append(el("p", { class: "meta" }, "Any rewards, 2 to 16 of them (type them, or drag a slider). A group whose " +
    "rewards are all equal carries no signal: every estimator gives it exactly 0."),
    el("div", {}, el("label", {}, "rewards ", text), " ", equal), sliderBox,
    el("div", {}, el("label", {}, "another group in the batch (optional, same size) ", other)), out);
  buildSliders(parse(text.value));
  update();
});
