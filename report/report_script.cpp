// The inline script of an HTML report: reads the page's weft-data block and
// draws SVG charts from it. Plain DOM calls, no library, so the page opens
// offline and a test can watch it for errors (body data-weft="ok" once drawn,
// "error" with the message in #weft-errors otherwise).
namespace weft::report {

extern const char* const kReportScript;

const char* const kReportScript = R"weftjs(
"use strict";
(function () {
const NS = "http://www.w3.org/2000/svg";
const GiB = 1073741824;
const PALETTE = ["#2b6cb0", "#dd6b20", "#38a169", "#d53f8c", "#805ad5", "#d69e2e", "#319795", "#e53e3e",
                 "#718096", "#975a16", "#4c51bf", "#9c4221", "#276749", "#b83280", "#2c7a7b", "#744210"];
const STATUS = {ok: "#38a169", oom: "#dd6b20", timeout: "#d69e2e", failed: "#e53e3e", killed: "#805ad5"};
const PARTS = [["compute_s", "compute"], ["recompute_s", "recompute"], ["tp_comm_s", "TP communication"],
               ["cp_comm_s", "CP communication"], ["pp_bubble_s", "pipeline bubble"], ["pp_p2p_s", "pipeline p2p"], ["dp_comm_s", "DP communication"],
               ["optimizer_s", "optimizer"]];
const t0 = performance.now();
const main = document.getElementById("weft-main");

function h(tag, text, parent, cls) {
  const e = document.createElement(tag);
  if (text != null) e.textContent = text;
  if (cls) e.className = cls;
  (parent || main).appendChild(e);
  return e;
}
function s(tag, attrs, parent) {
  const e = document.createElementNS(NS, tag);
  for (const k in attrs) e.setAttribute(k, attrs[k]);
  if (parent) parent.appendChild(e);
  return e;
}
function tip(e, text) { s("title", {}, e).textContent = text; return e; }
function num(v) {
  if (v == null || !isFinite(v)) return "-";
  const a = Math.abs(v);
  if (a !== 0 && (a >= 1e6 || a < 1e-3)) return v.toExponential(2);
  return +v.toPrecision(4) + "";
}
function sec(v) {
  if (!(v > 0)) return "0";
  if (v < 1e-3) return +(v * 1e6).toPrecision(3) + " µs";
  if (v < 1) return +(v * 1e3).toPrecision(3) + " ms";
  return +v.toPrecision(3) + " s";
}
function gib(b) { return b / GiB; }
function pct(v) { return +(100 * v).toPrecision(3) + "%"; }
function maxOf(a, f) { let m = -Infinity; for (const x of a) { const v = f(x); if (v > m) m = v; } return m; }
function minOf(a, f) { return -maxOf(a, x => -f(x)); }

// Round tick values covering [lo, hi] with about n steps.
function ticks(lo, hi, n) {
  const span = hi - lo, raw = span / n, mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 2.5, 5, 10].map(m => m * mag).find(st => span / st <= n) || 10 * mag;
  const out = [];
  for (let v = Math.floor(lo / step) * step; v <= hi + step * 0.999; v += step) out.push(+v.toPrecision(12));
  return out;
}

function section(title, note, parent) {
  const e = h("section", null, parent);
  h("h2", title, e);
  if (note) h("p", note, e, "note");
  return e;
}

// A chart: title, axes with round ticks and labels, the plot area, and a
// legend column on the right. o.cats: category names along x instead of numbers.
function chart(parent, o) {
  const W = 1100, H = o.height || 380, M = {l: 86, r: 250, t: 40, b: 58};
  const svg = s("svg", {width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: "img"}, parent);
  tip(svg, o.title);
  s("text", {x: M.l, y: 22, class: "ctitle"}, svg).textContent = o.title;
  const pw = W - M.l - M.r, ph = H - M.t - M.b;
  let [x0, x1] = o.cats ? [0, o.cats.length] : o.x, [y0, y1] = o.y;
  if (!(x1 > x0)) x1 = x0 + 1;
  if (!(y1 > y0)) y1 = y0 + (Math.abs(y0) || 1);
  const yt = ticks(y0, y1, 6);
  y0 = Math.min(y0, yt[0]); y1 = Math.max(y1, yt[yt.length - 1]);
  const xt = o.cats ? [] : ticks(x0, x1, 8);
  if (!o.cats) { x0 = Math.min(x0, xt[0]); x1 = Math.max(x1, xt[xt.length - 1]); }
  const X = v => M.l + (v - x0) / (x1 - x0) * pw, Y = v => M.t + ph - (v - y0) / (y1 - y0) * ph;
  const g = s("g", {}, svg);
  for (const v of yt) {
    s("line", {x1: M.l, x2: M.l + pw, y1: Y(v), y2: Y(v), class: "grid"}, g);
    s("text", {x: M.l - 6, y: Y(v) + 4, class: "tick", "text-anchor": "end"}, g).textContent = (o.yfmt || num)(v);
  }
  for (const v of xt) {
    s("line", {x1: X(v), x2: X(v), y1: M.t + ph, y2: M.t + ph + 5, class: "axis"}, g);
    s("text", {x: X(v), y: M.t + ph + 18, class: "tick", "text-anchor": "middle"}, g).textContent = (o.xfmt || num)(v);
  }
  if (o.cats) o.cats.forEach((name, i) => {
    s("text", {x: X(i + 0.5), y: M.t + ph + 18, class: "tick", "text-anchor": "middle"}, g).textContent = name;
  });
  s("line", {x1: M.l, x2: M.l + pw, y1: M.t + ph, y2: M.t + ph, class: "axis"}, g);
  s("line", {x1: M.l, x2: M.l, y1: M.t, y2: M.t + ph, class: "axis"}, g);
  s("text", {x: M.l + pw / 2, y: H - 14, class: "label", "text-anchor": "middle"}, g).textContent = o.xlabel;
  const yl = M.t + ph / 2;
  s("text", {x: 18, y: yl, class: "label", "text-anchor": "middle", transform: `rotate(-90 18 ${yl})`}, g)
      .textContent = o.ylabel;
  const plot = s("g", {}, svg);
  return {svg, plot, X, Y, M, pw, ph, W, H, x0, x1, y0, y1};
}

// Legend entries: {label, color, mark: "dot" | "box" | "line" | "dash" | "cross"}.
function legend(c, items) {
  const g = s("g", {}, c.svg);
  let y = c.M.t + 4;
  const x = c.W - c.M.r + 16;
  for (const it of items) {
    const m = it.mark || "box";
    if (m === "dot") s("circle", {cx: x + 7, cy: y + 6, r: 4.5, fill: it.color}, g);
    else if (m === "line" || m === "dash")
      s("line", {x1: x, x2: x + 16, y1: y + 6, y2: y + 6, stroke: it.color, "stroke-width": 2.5,
                 "stroke-dasharray": m === "dash" ? "5 3" : "none"}, g);
    else if (m === "cross") s("path", {d: `M${x+3},${y+2}l8,8m0,-8l-8,8`, stroke: it.color, "stroke-width": 2}, g);
    else s("rect", {x: x, y: y, width: 14, height: 12, fill: it.color}, g);
    s("text", {x: x + 22, y: y + 10, class: "legend"}, g).textContent = it.label;
    y += 19;
  }
}

function vline(c, x, color, label) {
  s("line", {x1: c.X(x), x2: c.X(x), y1: c.M.t, y2: c.M.t + c.ph, stroke: color, "stroke-width": 1.5,
             "stroke-dasharray": "6 4"}, c.plot);
  if (label) s("text", {x: c.X(x) + 4, y: c.M.t + 12, class: "tick", fill: color}, c.plot).textContent = label;
}
function hline(c, y, color, label) {
  s("line", {x1: c.M.l, x2: c.M.l + c.pw, y1: c.Y(y), y2: c.Y(y), stroke: color, "stroke-width": 1.5,
             "stroke-dasharray": "6 4"}, c.plot);
  if (label) s("text", {x: c.M.l + c.pw - 4, y: c.Y(y) - 5, class: "tick", fill: color, "text-anchor": "end"},
               c.plot).textContent = label;
}
function polyline(c, pts, color, width, dash) {
  if (pts.length === 0) return;
  const d = pts.map((p, i) => (i ? "L" : "M") + c.X(p[0]).toFixed(1) + "," + c.Y(p[1]).toFixed(1)).join("");
  s("path", {d, fill: "none", stroke: color, "stroke-width": width || 1.8, "stroke-dasharray": dash || "none"},
    c.plot);
}

// Stacked bars over categories: stacks[i] = [[value, color, title], ...].
function stacked(c, stacks) {
  const w = Math.max(1, (c.X(1) - c.X(0)) * 0.7);
  stacks.forEach((parts, i) => {
    let base = 0;
    for (const [v, color, title] of parts) {
      if (!(v > 0)) continue;
      const r = s("rect", {x: c.X(i + 0.5) - w / 2, y: c.Y(base + v), width: w,
                           height: Math.max(0.5, c.Y(base) - c.Y(base + v)), fill: color}, c.plot);
      tip(r, title);
      base += v;
    }
  });
}

function table(parent, head, rows) {
  const t = h("table", null, parent);
  const tr = h("tr", null, h("thead", null, t));
  for (const x of head) h("th", x, tr);
  const body = h("tbody", null, t);
  for (const row of rows) {
    const r = h("tr", null, body);
    for (const x of row) h("td", x == null ? "" : String(x), r);
  }
  return t;
}

function facts(parent, pairs) {
  const dl = h("dl", null, parent);
  for (const [k, v] of pairs) { h("dt", k, dl); h("dd", v, dl); }
}

// ---- dry-run ----
function dryRun(d) {
  const model = d.model || {}, cl = d.cluster || {}, dev = cl.device || {}, run = d.run || {};
  const plotted = d.points.length + d.binned;
  facts(main, [
    ["model", `${model.name} (${num(model.params)} parameters, ${model.layers} layers, hidden ${model.hidden})`],
    ["cluster", `${cl.gpus} x ${dev.name}, ${cl.gpus_per_node} per node, ${num(gib(dev.memory_bytes))} GiB each`],
    ["run", `seq ${run.seq}, global batch ${run.global_batch}, ${run.precision}` +
            (run.lora ? `; LoRA r ${run.lora.rank}, alpha ${run.lora.alpha} on ${run.lora.targets} ` +
                        `(${num(d.trainable_params)} trainable of ${num(model.params)}; the base frozen)` : "")],
    ["layouts", `${d.evaluated} evaluated, ${d.fitting} fit, ${d.evaluated - d.fitting} pruned` +
                (d.listed != null && d.listed < d.evaluated ? ` (this file lists ${d.listed})` : "")],
    ["MFU", `against ${num(d.peak_flops / 1e12)} TFLOP/s peak per device`],
    ["memory", `usable ${num(gib(d.usable_bytes))} GiB per device (margin ${pct(d.memory_margin || 0)})`]]);
  let note = `${plotted} layouts with a prediction; ${d.invalid} invalid layouts have none and are counted below.`;
  if (d.binned > 0)
    note += ` ${d.points.length} are drawn exactly (every fitting layout on the memory/MFU Pareto front, the ` +
            `top ranks and an even sample; hover for the layout); the other ${d.binned} are binned into cells ` +
            `whose shade grows with the count.`;
  // Layouts needing several devices' worth of memory would squeeze the ones
  // that fit against the axis: the plot ends at 3x the usable memory.
  const bins = d.bins || {cells: []}, xcap = 3 * gib(d.usable_bytes);
  const beyond = d.points.filter(p => gib(p.peak_bytes) > xcap).length +
                 bins.cells.filter(c => c[1] >= bins.x_bins).reduce((a, c) => a + c[3], 0);
  if (beyond > 0) note += ` ${beyond} layouts need more than 3x the usable memory and lie beyond the plot's right edge.`;
  const sc = section("Every layout: predicted MFU against peak memory", note);
  const xmax = Math.min(xcap, Math.max(gib(d.usable_bytes) * 1.08, maxOf(d.points, p => gib(p.peak_bytes)),
                                       maxOf(bins.cells, c => gib(Math.min(c[1] + 1, bins.x_bins) * bins.x_step_bytes))));
  const ymax = Math.max(maxOf(d.points, p => 100 * p.mfu), maxOf(bins.cells, c => 100 * (c[2] + 1) * bins.y_step_mfu));
  const c = chart(sc, {title: "Predicted MFU against peak memory (worst pipeline stage)",
                       xlabel: "peak memory per device (GiB)", ylabel: "predicted MFU (%)",
                       x: [0, xmax], y: [0, ymax], height: 460});
  const color = i => i === 0 ? "#2b6cb0" : PALETTE[(i + 1) % PALETTE.length];
  const maxN = maxOf(bins.cells, x => x[3]);
  const frag = document.createDocumentFragment();
  for (const [k, xi, yi, n] of bins.cells) {
    if (xi >= bins.x_bins) continue;
    const x = c.X(gib(xi * bins.x_step_bytes)), y = c.Y(100 * (yi + 1) * bins.y_step_mfu);
    const r = s("rect", {x, y, width: Math.max(1, c.X(gib((xi + 1) * bins.x_step_bytes)) - x),
                         height: Math.max(1, c.Y(100 * yi * bins.y_step_mfu) - y), fill: color(k),
                         "fill-opacity": (0.15 + 0.6 * Math.log1p(n) / Math.log1p(maxN)).toFixed(2)}, frag);
    tip(r, `${n} layouts (${d.classes[k]}), binned: ${num(gib(xi * bins.x_step_bytes))}-` +
           `${num(gib((xi + 1) * bins.x_step_bytes))} GiB, MFU ${pct(yi * bins.y_step_mfu)}-${pct((yi + 1) * bins.y_step_mfu)}`);
  }
  // Pruned first, so the fitting layouts are drawn on top.
  const order = d.points.slice().sort((a, b) => (a.class === 0) - (b.class === 0));
  for (const p of order) {
    if (gib(p.peak_bytes) > c.x1) continue;
    const e = s("circle", {cx: c.X(gib(p.peak_bytes)).toFixed(1), cy: c.Y(100 * p.mfu).toFixed(1),
                           r: p.rank === 1 ? 6 : 3, fill: color(p.class), "fill-opacity": p.class === 0 ? 0.9 : 0.55,
                           stroke: p.rank === 1 ? "#000" : "none"}, frag);
    tip(e, `${p.layout}\n${p.rank ? "rank " + p.rank + ", fits" : d.classes[p.class]}\npredicted MFU ${pct(p.mfu)}, ` +
           `peak ${num(gib(p.peak_bytes))} GiB, step ${sec(p.step_s)}`);
  }
  c.plot.appendChild(frag);
  vline(c, gib(d.usable_bytes), "#c53030", `usable memory ${num(gib(d.usable_bytes))} GiB`);
  const counts = d.classes.map((name, i) => i === 0 ? d.fitting : (d.pruned || {})[name] || 0);
  legend(c, d.classes.map((name, i) => ({label: `${name} (${counts[i]})`, color: color(i), mark: "dot"}))
      .concat([{label: "usable memory", color: "#c53030", mark: "dash"}]));

  if (d.top.length) {
    // Up to 30 bars stay readable; the table lists every layout asked for.
    const bars = d.top.slice(0, 30);
    const sb = section("Predicted step time of the top layouts, by part",
                       "Stacked parts of the cost model's step time (slowest stage); hover a bar for the layout. " +
                       `The table lists the ${d.top.length} best-ranked of ${d.fitting} fitting layouts` +
                       (d.top.length < d.fitting ? " (--top N or --all for more; a page lists 1000 at most)." : "."));
    const bc = chart(sb, {title: `Step time of the ${bars.length} best-ranked layouts`, xlabel: "rank",
                          ylabel: "predicted step time", cats: bars.map(t => "#" + t.rank),
                          y: [0, maxOf(bars, t => t.step_s)], yfmt: sec});
    stacked(bc, bars.map(t => PARTS.map(([k, name], j) =>
        [t[k], PALETTE[j], `#${t.rank} ${t.layout}\n${name}: ${sec(t[k])} of ${sec(t.step_s)}`])));
    legend(bc, PARTS.map(([k, name], j) => ({label: name, color: PALETTE[j]})));
    table(sb, ["rank", "layout", "GEMMs", "step", "MFU (vs bf16 peak)", "tokens/s", "peak memory (GiB)",
               "the trainer"],
          d.top.map(t => [t.rank, t.layout, t.gemm_precision || "bf16", sec(t.step_s), pct(t.mfu), num(t.tokens_per_s),
                          num(gib(t.peak_bytes)), t.cannot_run_yet ? "cannot run it yet: " + t.cannot_run_yet : "runs it"]));
  }
  if (d.best && d.best.stages.length) {
    const st = d.best.stages, cats = d.categories;
    const sm = section("Memory per pipeline stage of the best layout", d.best.layout);
    const mc = chart(sm, {title: "Predicted memory per pipeline stage, by category", xlabel: "pipeline stage",
                          ylabel: "memory per device (GiB)", cats: st.map(x => String(x.stage)),
                          y: [0, Math.max(gib(d.usable_bytes), maxOf(st, x => gib(x.total_bytes)))]});
    stacked(mc, st.map(x => cats.map((k, j) => [gib(x[k] || 0), PALETTE[j],
        `stage ${x.stage} (${x.layers} layers, ${x.in_flight} in flight)\n${k}: ${num(gib(x[k] || 0))} GiB`])));
    hline(mc, gib(d.usable_bytes), "#c53030", "usable memory");
    legend(mc, cats.map((k, j) => ({label: k, color: PALETTE[j]})).concat(
        [{label: "usable memory", color: "#c53030", mark: "dash"}]));
  }
  const pr = section("Pruned layouts by reason", null);
  table(pr, ["reason", "layouts"], Object.entries(d.pruned || {}).sort((a, b) => b[1] - a[1]));
}

// ---- tuning ----
function tuning(d) {
  const trials = d.trials;
  facts(main, [
    ["space", `${d.evaluated} layouts evaluated, ${d.fitting} fit, ${d.candidates} candidates the trainer runs`],
    ["trials", `${trials.length} in ${sec(d.profile_seconds)} (tuning ${sec(d.seconds)} in all)`],
    ["stopped", d.stop_reason || "-"]]);
  const w = trials.find(t => t.layout === d.winner && t.status === "ok" && !t.repeat) ||
            trials.find(t => t.layout === d.winner);
  const ws = section("Winner", null);
  if (w) {
    const same = trials.filter(t => t.layout === d.winner && t.status === "ok");
    const mean = same.reduce((a, t) => a + t.measured_s, 0) / same.length;
    h("p", `${d.winner}: ${sec(mean)} per step (mean of ${same.length} trial${same.length > 1 ? "s" : ""}), ` +
           `MFU ${pct(w.mfu)}, ${num(w.tokens_per_s)} tokens/s, peak ${num(gib(w.measured_peak_bytes))} GiB ` +
           `measured against ${num(gib(w.predicted_peak_bytes))} GiB predicted.`, ws);
    h("p", "Why: the shortest mean measured step of the trials (layouts within 1% of it: the one with the " +
           `least memory). Profiling stopped because: ${d.stop_reason}.`, ws);
  } else h("p", "No trial succeeded.", ws);
  if (w && w.expert_load)
    expertLoad(w.expert_load, "Experts' loads in the winner's trial",
               `Tokens each expert took in each MoE layer over trial #${w.order}'s steps, every rank's (all k ` +
               "choices of every token). The table of trials gives each trial's worst layer.");
  if (d.calibration) {
    const k = d.calibration;
    h("p", `Cost model against the ${k.observations} measured steps: RMS error ${pct(k.rms_error_before)} with ` +
           `the default constants, ${pct(k.rms_error_after)} after the refit of ${(k.fitted || []).join(", ")} ` +
           `(${k.accepted ? "accepted" : "rejected: no better than the defaults"}).`, ws);
  }
  const ok = trials.filter(t => t.status === "ok" && t.measured_s > 0);
  if (ok.length) {
    const pe = section("Predicted against measured step time",
                       "Each successful trial; on the diagonal the model is exact. Hover a point for its layout.");
    const hi = Math.max(maxOf(ok, t => t.measured_s), maxOf(ok, t => Math.max(t.predicted_s, t.calibrated_s))) * 1.05;
    const c = chart(pe, {title: "Predicted step time against measured, per trial", xlabel: "measured step time",
                         ylabel: "predicted step time", x: [0, hi], y: [0, hi], xfmt: sec, yfmt: sec});
    polyline(c, [[0, 0], [c.x1, c.x1]], "#a0aec0", 1.2, "4 4");
    for (const t of ok) {
      const lbl = `#${t.order} ${t.layout}\nmeasured ${sec(t.measured_s)}`;
      tip(s("circle", {cx: c.X(t.measured_s), cy: c.Y(t.predicted_s), r: 5, fill: PALETTE[0]}, c.plot),
          `${lbl}, predicted ${sec(t.predicted_s)} (default constants)`);
      const x = c.X(t.measured_s), y = c.Y(t.calibrated_s);
      tip(s("rect", {x: x - 4, y: y - 4, width: 8, height: 8, fill: PALETTE[1]}, c.plot),
          `${lbl}, predicted ${sec(t.calibrated_s)} (constants refit before this trial)`);
    }
    legend(c, [{label: "default constants", color: PALETTE[0], mark: "dot"},
               {label: "refit constants", color: PALETTE[1]}, {label: "predicted = measured", color: "#a0aec0", mark: "dash"}]);
  }
  if (trials.length) {
    const timed = trials.filter(t => t.on_timeline !== false);
    const off = trials.length - timed.length;
    const tl = section("Timeline of the trials",
                       "One row per trial in the order they ran, coloured by outcome." +
                       (d.timeline_estimated ? " This tuning.json records no start times: trials are drawn back to " +
                                               "back, so the gaps between them (refits, set-up) are missing." : "") +
                       (off ? ` ${off} trial${off > 1 ? "s" : ""} read from an earlier run's journal ` +
                              `${off > 1 ? "are" : "is"} in the table, not on the timeline.` : ""));
    const end = maxOf(timed, t => t.start_s + t.seconds);
    const c = chart(tl, {title: "Trials over time", xlabel: "time since tuning began (s)", ylabel: "trial",
                         x: [0, end > 0 ? end : 1], y: [0, Math.max(1, timed.length)],
                         height: Math.min(900, 120 + 16 * timed.length),
                         yfmt: v => v === Math.round(v) ? String(v) : ""});
    timed.forEach((t, i) => {
      const x = c.X(t.start_s), y = c.Y(i + 1);
      const r = s("rect", {x, y: y + 1, width: Math.max(2, c.X(t.start_s + t.seconds) - x),
                           height: Math.max(2, c.Y(i) - y - 2), fill: STATUS[t.status] || "#718096",
                           stroke: t.layout === d.winner ? "#000" : "none"}, c.plot);
      tip(r, `#${t.order} ${t.layout}\n${t.status}${t.repeat ? " (again)" : ""}${t.cut ? " (cut after one timed step)" : ""}${t.reason ? ": " + t.reason : ""}` +
             `\n${sec(t.seconds)}${t.status === "ok" ? ", step " + sec(t.measured_s) : ""}`);
    });
    legend(c, Object.entries(STATUS).map(([k, v]) => ({label: k, color: v})).concat(
        [{label: "winner (outlined)", color: "#000", mark: "line"}]));
    const moe = trials.some(t => t.expert_imbalance > 0);
    table(tl, ["#", "layout", "GEMMs", "status", "predicted", "refit", "measured", "MFU (vs bf16 peak)",
               "memory measured (GiB)"].concat(moe ? ["experts worst / mean (worst layer)"] : []),
          trials.map(t => [t.order, t.layout + (t.layout === d.winner ? "  (winner)" : ""), t.gemm_precision || "bf16",
                           t.status + (t.reason ? ": " + t.reason : "") + (t.on_timeline === false ? " (earlier run)" : ""), sec(t.predicted_s), sec(t.calibrated_s),
                           t.status === "ok" ? sec(t.measured_s) : "-", t.status === "ok" ? pct(t.mfu) : "-",
                           t.measured_peak_bytes > 0 ? num(gib(t.measured_peak_bytes)) : "-"].concat(
                              moe ? [t.expert_imbalance > 0 ? t.expert_imbalance.toFixed(2) : "-"] : [])));
  }
}

// ---- training run ----
function lineChart(parent, title, ylabel, series, marks, zero, more) {
  const all = series.flatMap(x => x.pts);
  if (!all.length) { h("p", `${title}: no records.`, parent, "note"); return null; }
  const lo = minOf(all, p => p[1]), hi = maxOf(all, p => p[1]);
  const c = chart(parent, {title, xlabel: "step", ylabel, x: [minOf(all, p => p[0]), maxOf(all, p => p[0])],
                           y: [zero === false ? lo - 0.05 * (hi - lo) : Math.min(0, lo), hi]});
  for (const x of series) {
    polyline(c, x.pts, x.color, 1.8, x.dash);
    if (x.dots) for (const p of x.pts)
      tip(s("circle", {cx: c.X(p[0]), cy: c.Y(p[1]), r: 3.5, fill: x.color}, c.plot), `${x.label} at step ${p[0]}: ${num(p[1])}`);
  }
  for (const m of marks || []) m(c);
  legend(c, series.map(x => ({label: x.label, color: x.color, mark: x.dash ? "dash" : "line"})).concat(more || []));
  return c;
}

function runReport(d) {
  const tr = d.train, va = d.val;
  const rows = [["folder", d.dir], ["layout", d.layout || "-"], ["GEMMs", d.gemm_precision || "-"],
                ["records", `${d.train_records} train, ${va.length} validation` +
                            (d.train_stride ? ` (plots every ${d.train_stride}th train record)` : "")]];
  if (d.params && d.params.total)
    rows.push(["parameters", `${num(d.params.trainable)} trainable of ${num(d.params.total)} ` +
                             `(${pct(d.params.trainable / d.params.total)})` +
                             (d.lora ? `: LoRA r ${d.lora.rank}, alpha ${d.lora.alpha} on ${d.lora.targets}, the base frozen` : "")]);
  if (d.headers.length > 1 || d.resumes.length) rows.push(["resumed", `${d.headers.length} run headers; resumed at step ${d.resumes.join(", ") || "?"}`]);
  if (d.ends.length === 0 && d.headers.length) rows.push(["end", "no end record: the run was cut off or is still going"]);
  // A launch that stopped on an error (an MoE batch past the receive buffers): the last one's.
  const stops = d.ends.filter(e => e.error);
  if (stops.length) rows.push(["stopped", `after step ${stops[stops.length - 1].last_step}: ${stops[stops.length - 1].error}`]);
  if (d.recipe) rows.push(["recipe", `${d.recipe.layout} (${d.recipe.source})`]);
  if (d.unreadable_lines) rows.push(["skipped", `${d.unreadable_lines} unreadable lines or files`]);
  facts(main, rows);
  const resumeMarks = c => d.resumes.forEach(st => vline(c, st, "#718096", "resumed"));
  const ls = section("Loss", "Training loss per logged step and validation loss; dashed: the unigram baseline.");
  const series = [{label: "train loss", color: PALETTE[0], pts: tr.map(r => [r.step, r.loss])},
                  {label: "validation loss", color: PALETTE[1], dots: true, pts: va.map(r => [r.step, r.val_loss])}];
  const base = va.find(r => r.baseline != null), steps = tr.concat(va).map(r => r.step);
  if (base && steps.length)
    series.push({label: `unigram baseline (${num(base.baseline)})`, color: "#718096", dash: "6 4",
                 pts: [[Math.min(...steps), base.baseline], [Math.max(...steps), base.baseline]]});
  lineChart(ls, "Loss against step", "loss (nats/token)", series, [resumeMarks], false);
  const th = section("Throughput", null);
  lineChart(th, "Tokens per second against step", "tokens/s (whole run)",
            [{label: "tokens/s", color: PALETTE[2], pts: tr.map(r => [r.step, r.tokens_per_s])}], [resumeMarks]);
  lineChart(th, "MFU against step", "MFU (%)",
            [{label: "MFU", color: PALETTE[4], pts: tr.map(r => [r.step, 100 * r.mfu])}], [resumeMarks]);
  const gn = section("Gradient norm and skipped steps", "Red crosses: steps skipped for non-finite values.");
  const skipped = tr.filter(r => r.skipped);
  const gc = lineChart(gn, "Gradient norm against step", "gradient norm (before clipping)",
                       [{label: "gradient norm", color: PALETTE[3], pts: tr.filter(r => typeof r.grad_norm === "number" && isFinite(r.grad_norm))
                             .map(r => [r.step, r.grad_norm])}], [resumeMarks], true,
                       [{label: `skipped steps (${skipped.length})`, color: "#e53e3e", mark: "cross"}]);
  if (gc) {
    for (const r of skipped)
      tip(s("path", {d: `M${gc.X(r.step) - 5},${gc.M.t + 4}l10,10m0,-10l-10,10`, stroke: "#e53e3e", "stroke-width": 2},
            gc.plot), `step ${r.step} skipped`);
  }
  if (d.expert_load) expertLoad(d.expert_load, "Experts' loads",
                                "Tokens each expert took in each MoE layer over the run (all k choices of every " +
                                "token of the global batches).");
  memorySection(d);
  if (d.tuning) { h("h2", "Tuning of this run", main, "part"); tuning(d.tuning); }
}

// An MoE run's or trial's expert loads: a bar per expert for each MoE
// layer (the first 8 drawn), and every layer's worst-to-mean ratio.
function expertLoad(e, title, what) {
  const es = section(title,
                     what + " Worst / mean is the busiest expert's share against an even split: 1 is " +
                     "balanced, and it is what sizes the experts' buffers under expert parallelism." +
                     (e.dropped ? " Dropped: the choices the capacity dropped (they added nothing to their " +
                                  "tokens' outputs), of all the layer's choices." : ""));
  const rows = [];
  e.layers.forEach((layer, i) => {
    const c = e.counts[i] || [], total = c.reduce((a, v) => a + v, 0), mean = total / Math.max(1, c.length);
    const worst = Math.max(...c), least = Math.min(...c);
    const row = [layer, num(total), num(mean), num(worst), num(least), mean > 0 ? (worst / mean).toFixed(2) : "-"];
    if (e.dropped) row.push(`${num(e.dropped[i] || 0)} (${pct((e.dropped[i] || 0) / Math.max(1, total))})`);
    rows.push(row);
    if (i >= 8) return;
    const ch = chart(es, {title: `Layer ${layer}: tokens per expert (worst / mean ${mean > 0 ? (worst / mean).toFixed(2) : "-"})`,
                          xlabel: "expert", ylabel: "tokens", cats: c.map((_, j) => String(j)), y: [0, worst],
                          height: 260});
    stacked(ch, c.map((v, j) => [[v, PALETTE[0], `expert ${j}: ${num(v)} tokens (${pct(v / Math.max(1, total))})`]]));
    hline(ch, mean, "#718096", "even split");
  });
  table(es, ["layer", "tokens", "mean", "worst", "least", "worst / mean"].concat(e.dropped ? ["dropped"] : []), rows);
}

// Measured memory per category against the memory model, per rank; an
// independent measurement (peak RSS, the driver's count) beside them when present.
function memorySection(d) {
  const ms = section("Memory: measured against the model",
                     "Per category for each rank: the arena's high-water mark against the memory model's prediction.");
  if (!d.memory.length) { h("p", "No memory/rank*.json in this folder.", ms, "note"); return; }
  const sum = o => Object.values(o || {}).reduce((a, v) => a + (typeof v === "number" ? v : 0), 0);
  for (const m of d.memory.slice(0, 8)) {
    // The trainer writes {"bytes": N, "what": "..."}: one number for the whole rank.
    const ind = m.independent, cats = d.categories.concat(["total"]);
    const indBytes = typeof ind === "number" ? ind : ind && typeof ind.bytes === "number" ? ind.bytes : null;
    const indOf = k => k === "total" ? indBytes : null;
    const val = (src, k) => k === "total" ? sum(src) : (src || {})[k] || 0;
    const series = [["measured", m.measured, PALETTE[0]], ["predicted", m.predicted, PALETTE[1]]];
    const hasInd = indBytes != null;
    const top = Math.max(...cats.map(k => Math.max(val(m.measured, k), val(m.predicted, k), indOf(k) || 0)));
    const c = chart(ms, {title: `Rank ${m.rank} (pipeline stage ${m.pp_rank})`, xlabel: "memory category",
                         ylabel: "memory (GiB)", cats, y: [0, gib(top)]});
    const n = hasInd ? 3 : 2, bw = (c.X(1) - c.X(0)) * 0.8 / n;
    cats.forEach((k, i) => {
      const vals = series.map(([name, src, col]) => [name, val(src, k), col]);
      if (hasInd) vals.push(["independent", indOf(k), PALETTE[2]]);
      vals.forEach(([name, v, col], j) => {
        if (v == null || !(v >= 0)) return;
        const x = c.X(i + 0.1) + j * bw;
        tip(s("rect", {x, y: c.Y(gib(v)), width: bw - 1, height: Math.max(0.5, c.Y(0) - c.Y(gib(v))), fill: col},
              c.plot), `${k}, ${name}: ${num(gib(v))} GiB`);
      });
    });
    const items = [{label: "measured (arena peak)", color: PALETTE[0]}, {label: "predicted (memory model)", color: PALETTE[1]}];
    if (hasInd) items.push({label: "independent" + (ind && typeof ind.what === "string" ? `: ${ind.what}` : ""),
                            color: PALETTE[2]});
    legend(c, items);
  }
  if (d.memory.length > 8)
    table(ms, ["rank", "stage", "measured (GiB)", "predicted (GiB)"],
          d.memory.map(m => [m.rank, m.pp_rank, num(gib(sum(m.measured))), num(gib(sum(m.predicted)))]));
}

try {
  const d = JSON.parse(document.getElementById("weft-data").textContent);
  if (d.kind === "dry-run") dryRun(d);
  else if (d.kind === "tuning") tuning(d);
  else if (d.kind === "run") runReport(d);
  else throw new Error("unknown report kind " + d.kind);
  document.body.dataset.drawMs = (performance.now() - t0).toFixed(1);
  // Since navigation began: reading the page, its data and drawing.
  document.body.dataset.openMs = performance.now().toFixed(1);
  if (document.body.dataset.weft !== "error") document.body.dataset.weft = "ok";
} catch (e) {
  window.weftError(e && e.stack ? e.stack : String(e));
}
})();
)weftjs";

}  // namespace weft::report
