// Charts: uPlot with the axes a reader can trust (a flat series gets a narrow axis around its value, not 0-100),
// an optional shaded x band and marker line (the Learn page's clip region and current ratio), log scale, zoom.
"use strict";

// y range for [min, max]: a flat series is centred in a narrow range, a log axis stays positive
function yRange(min, max, log) {
  if (min === null || max === null || !isFinite(min) || !isFinite(max)) return log ? [0.1, 10] : [0, 1];
  if (log) return min === max ? [min / 2, max * 2] : [min / 1.2, max * 1.2];
  if (min === max) { const d = min === 0 ? 1 : Math.abs(min) * 0.5; return [min - d, max + d]; }
  // uPlot rounds a span far below its values' magnitude (1 to 1.0000001) to a zero-width range, which it cannot draw
  const r = uPlot.rangeNum(min, max, 0.1, true);
  if (r[1] > r[0]) return r;
  const d = Math.max(max - min, Math.abs(min) * 1e-6);
  return [min - d, max + d];
}
function seriesExtent(values) {
  let lo = Infinity, hi = -Infinity;
  for (const arr of values) for (const v of arr) if (v !== null && v !== undefined && isFinite(v)) { if (v < lo) lo = v; if (v > hi) hi = v; }
  return lo === Infinity ? null : [lo, hi];
}

// a plugin that shades [band[0], band[1]] on x and draws a vertical line at marker (both in x units)
function bandPlugin(band, marker) {
  return { hooks: { drawClear: u => {
    const ctx = u.ctx, top = u.bbox.top, h = u.bbox.height;
    if (band) {
      const x0 = u.valToPos(band[0], "x", true), x1 = u.valToPos(band[1], "x", true);
      ctx.save(); ctx.fillStyle = "rgba(250, 204, 21, 0.28)"; ctx.fillRect(x0, top, x1 - x0, h); ctx.restore();
    }
  }, draw: u => {
    if (marker === null || marker === undefined) return;
    const ctx = u.ctx, x = u.valToPos(marker, "x", true);
    ctx.save(); ctx.strokeStyle = "#111827"; ctx.setLineDash([5, 4]); ctx.lineWidth = 2 * devicePixelRatio;
    ctx.beginPath(); ctx.moveTo(x, u.bbox.top); ctx.lineTo(x, u.bbox.top + u.bbox.height); ctx.stroke(); ctx.restore();
  } } };
}

// series: [{label, values, color, width, dash, faint}] on the shared x values xs
function chart(parent, key, title, xs, series, opts = {}) {
  const box = el("div", { class: "chart", "data-key": key });
  parent.append(box);
  const extent = seriesExtent(series.map(s => s.values));
  const log = !!opts.log && extent !== null && extent[0] > 0;
  const flat = extent !== null && extent[0] === extent[1];
  box.dataset.flat = flat ? "1" : "";
  if (flat) box.classList.add("flat");
  if (flat && opts.flatHeight) box.classList.add("compact");
  const plot = new uPlot({
    title: title + (flat ? `  (constant ${fmt(extent[0])})` : "") + (opts.log && !log ? "  (linear: values ≤ 0)" : ""),
    width: opts.width || 380, height: flat && opts.flatHeight ? opts.flatHeight : opts.height || 200,
    scales: { x: { time: false, ...(opts.xRange ? { range: () => opts.xRange } : {}) },
              y: { distr: log ? 3 : 1, range: opts.yRange ? () => opts.yRange : (u, lo, hi) => yRange(lo, hi, log) } },
    series: [{ label: opts.xlabel || "step" }, ...series.map((s, i) => ({
      label: s.label, stroke: s.color || COLORS[i % COLORS.length], width: s.width || 1.5, dash: s.dash, spanGaps: true,
      alpha: s.faint ? 0.3 : 1, points: { show: s.points ?? xs.length < 40 } }))],
    axes: [{ label: opts.xlabel && opts.xlabel !== "step" ? opts.xlabel : undefined,
             ...(opts.integerX ? { incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000] } : {}) }, { size: 60 }],
    legend: { show: opts.legend !== false },
    plugins: opts.band || opts.marker !== undefined ? [bandPlugin(opts.band, opts.marker)] : [],
    hooks: opts.hooks || {},
  }, [xs, ...series.map(s => s.values)], box);
  window.ahaCharts.push({ key, plot });
  return plot;
}
function aligned(runIds, key, xOf = id => state.metrics[id].step) {
  // one x axis for several runs' series of `key` (uPlot.join aligns differing steps)
  const tables = runIds.map(id => { const m = state.metrics[id]; return [xOf(id), m.series[key] || m.step.map(() => null)]; });
  if (tables.length === 1) return { xs: tables[0][0], values: [tables[0][1]] };
  const joined = uPlot.join(tables);
  return { xs: joined[0], values: joined.slice(1) };
}
