// k1, k2, k3 for one token beside the true KL of the two-outcome distributions, and over π.
"use strict";

const KL_CAP = 10;

function klRange(d) {  // a y range that shows the true KL and the estimators near it: k3's spike at small π is off the chart
  const finite = v => v !== null && isFinite(v);
  const truth = d.true_curve.filter(finite), here = [...Object.values(d.values), d.true_kl].filter(finite);
  const hi = Math.min(KL_CAP, Math.max(1, 2 * Math.max(0, ...truth), 1.2 * Math.max(0, ...here)));
  const lows = Object.values(d.curves).flat().filter(finite);
  return [Math.max(-hi, Math.min(0, ...lows)), hi];
}
explainer("kl-panel", "KL estimators k1, k2, k3 beside the true KL", panel => {
  const s = [slider("p", 0.01, 1, 0.01, 0.3, () => update(), "π (policy's probability of the sampled token)"),
             slider("p_ref", 0.01, 1, 0.01, 0.5, () => update(), "π_ref (the reference's)")];
  const out = el("div", { id: "kl-out" }), plotBox = el("div", { class: "charts" }), call = learnCall("kl", out);
  panel.append(el("p", { class: "meta", id: "kl-statement" }, "True KL, for one token: the policy and the reference as " +
    "two-outcome distributions, this token or any other, {π, 1−π} and {π_ref, 1−π_ref}: KL = π·ln(π/π_ref) + " +
    "(1−π)·ln((1−π)/(1−π_ref)). The trainer sees only the sampled token, so it estimates the KL from that one token: " +
    "k1 = ln(π/π_ref), k2 = ½·ln(π/π_ref)², k3 = π_ref/π − 1 − ln(π_ref/π). Averaged over both outcomes (weights π, 1−π), " +
    "k1 gives the true KL exactly, k3 too while π < 1, and k2 only approximately."), sliderRows(s), out, plotBox);
  const show = d => {
    const names = Object.keys(d.values);
    out.replaceChildren(el("table", { id: "kl-table" },
      el("tr", {}, el("th", {}, ""), ...names.map(k => el("th", { title: d.about[k] }, k)), el("th", {}, "true KL")),
      el("tr", {}, el("td", { class: "text" }, "the sampled token"), ...names.map(k => num(d.values[k], "td", { "data-k": k })),
        num(d.true_kl, "td", { id: "kl-true", rowspan: 2 })),
      el("tr", {}, el("td", { class: "text" }, "mean over both outcomes"), ...names.map(k => num(d.expected[k], "td", { "data-mean": k })))));
    const range = klRange(d);
    const off = names.filter(k => d.curves[k].some(v => v > range[1]));
    plotBox.replaceChildren(); window.ahaCharts = window.ahaCharts.filter(c => c.key !== "kl-curve");
    chart(plotBox, "kl-curve", `estimates over π (π_ref = ${s[1].value})`, d.grid, [
      ...names.map(k => ({ label: k, values: d.curves[k], points: false })),
      { label: "true KL", values: d.true_curve, color: "#111827", width: 2.5, dash: [6, 4], points: false }],
      { xlabel: "π", width: 560, height: 260, yRange: range, marker: s[0].value });
    if (off.length) plotBox.append(el("p", { class: "meta", id: "kl-off" }, `${off.join(", ")} leave the chart at small π: ` +
      "with π far below π_ref, ln(π_ref/π) is large and k3 grows like π_ref/π."));
  };
  const update = () => call({ p: s[0].value, p_ref: s[1].value }, show);
  update();
});
