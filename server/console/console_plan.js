/*
 * console_plan.js — the web console's memory plan: GET /attention/plan for the
 * playground's shape at N = 256 to 2^20, drawn as a log-log SVG chart and a
 * table next to the seed's exercise. Loaded after console.js, whose
 * window.attnConsole it writes .plan to.
 */
"use strict";

(function () {
  const state = window.attnConsole;
  const { $, api, errorText, intOf, bytes, svgEl } = state.lib;

  /* ---- the memory plan --------------------------------------------------------- */

  const PLAN_NS = Array.from({ length: 13 }, (_, i) => 256 * Math.pow(2, i)); // 256 ... 2^20
  const SEED = { batch: 1, heads: 1, seq_q: 4096, head_dim: 64, dtype: "F32" };

  function planQuery(p) {
    return "/attention/plan?" + new URLSearchParams(Object.entries(p).map(([k, v]) => [k, String(v)])).toString();
  }

  async function updatePlan() {
    const st = $("plan-status");
    let shape;
    try {
      shape = { batch: intOf("pg-batch", 1), heads: intOf("pg-heads", 1), heads_kv: intOf("pg-heads-kv", 1), head_dim: intOf("pg-d", 1), dtype: $("pg-dtype").value };
    } catch (e) { st.textContent = e.message; return; }
    st.textContent = "asking the server…";
    // one call first: a shape the server refuses is refused once, not 13 times
    const first = await api(planQuery(Object.assign({}, shape, { seq_q: PLAN_NS[0] })));
    if (first.status !== 200) { st.textContent = "the plan failed: " + errorText(first); return; }
    const calls = PLAN_NS.slice(1).map((n) => api(planQuery(Object.assign({}, shape, { seq_q: n }))));
    calls.push(api(planQuery(SEED)));
    const rs = [first].concat(await Promise.all(calls));
    const bad = rs.find((r) => r.status !== 200);
    if (bad) { st.textContent = "the plan failed: " + errorText(bad); return; }
    const point = (n, j) => ({
      n: n,
      standard: j.bytes.s_plus_p,
      flash: j.bytes.m + j.bytes.l + j.bytes.workspace,
      ratio: j.bytes.s_plus_p / (j.bytes.m + j.bytes.l + j.bytes.workspace),
      total_ratio: j.ratios.standard_over_flash,
    });
    const points = PLAN_NS.map((n, i) => point(n, rs[i].body));
    const seed = point(SEED.seq_q, rs[rs.length - 1].body);
    state.plan = { shape: shape, points: points, seed: seed };
    st.textContent = "batch " + shape.batch + ", heads " + shape.heads + " (kv " + shape.heads_kv + "), D " + shape.head_dim + ", " + shape.dtype + "; workspace for " + rs[0].body.threads + " threads";
    drawPlan();
  }

  function ratio(x) {
    return (x >= 100 ? Math.round(x).toLocaleString("en") : x.toPrecision(3)) + "×";
  }

  function drawPlan() {
    const P = state.plan, svg = $("plan-chart");
    svg.textContent = "";
    const W = 720, H = 400, L = 78, R = 20, T = 20, B = 46;
    const all = P.points.flatMap((p) => [p.standard, p.flash]).concat([P.seed.standard]).filter((x) => x > 0);
    const lo = Math.floor(Math.log2(Math.min(...all)) / 5) * 5, hi = Math.ceil(Math.log2(Math.max(...all)) / 5) * 5;
    const x = (n) => L + (Math.log2(n) - 8) / 12 * (W - L - R);
    const y = (b) => T + (hi - Math.log2(b)) / Math.max(1, hi - lo) * (H - T - B);
    for (let e = lo; e <= hi; e += 5) {
      svgEl(svg, "line", { class: "grid", x1: L, x2: W - R, y1: y(Math.pow(2, e)), y2: y(Math.pow(2, e)) });
      svgEl(svg, "text", { x: L - 6, y: y(Math.pow(2, e)) + 4, "text-anchor": "end" }, bytes(Math.pow(2, e)));
    }
    for (let e = 8; e <= 20; e += 2) {
      const n = Math.pow(2, e);
      svgEl(svg, "line", { class: "grid", x1: x(n), x2: x(n), y1: T, y2: H - B });
      svgEl(svg, "text", { x: x(n), y: H - B + 16, "text-anchor": "middle" }, n >= 1048576 ? "1M" : n >= 1024 ? n / 1024 + "K" : String(n));
    }
    svgEl(svg, "line", { class: "axis", x1: L, x2: W - R, y1: H - B, y2: H - B });
    svgEl(svg, "line", { class: "axis", x1: L, x2: L, y1: T, y2: H - B });
    svgEl(svg, "text", { x: (L + W - R) / 2, y: H - 8, "text-anchor": "middle" }, "sequence length N (log scale)");
    svgEl(svg, "text", { x: 14, y: (T + H - B) / 2, "text-anchor": "middle", transform: "rotate(-90 14 " + (T + H - B) / 2 + ")" }, "bytes (log scale)");
    for (const [key, label] of [["standard", "standard: S + P"], ["flash", "flash: m + l + workspace"]]) {
      const cls = key === "standard" ? "std" : "flash";
      svgEl(svg, "polyline", { class: cls, points: P.points.map((p) => x(p.n) + "," + y(p[key])).join(" ") });
      for (const p of P.points) {
        const c = svgEl(svg, "circle", { class: cls, cx: x(p.n), cy: y(p[key]), r: 3.5, "data-series": key, "data-n": p.n, "data-bytes": p[key] });
        svgEl(c, "title", {}, label + " at N = " + p.n + ": " + bytes(p[key]) + " (" + p[key] + " bytes)");
      }
      const lastP = P.points[P.points.length - 1];
      svgEl(svg, "text", { class: "label-" + cls, x: x(lastP.n) - 6, y: y(lastP[key]) + (key === "standard" ? 18 : -10), "text-anchor": "end" }, label);
    }
    const s = P.seed;
    const seedMark = svgEl(svg, "circle", { class: "seed", cx: x(s.n), cy: y(s.standard), r: 8, "data-series": "seed", "data-n": s.n, "data-bytes": s.standard });
    svgEl(seedMark, "title", {}, "the seed's exercise: N = 4096, D = 64, F32, one head");
    svgEl(svg, "text", { x: x(s.n) + 12, y: y(s.standard) - 10 }, "seed: N = 4096, D = 64, F32: S + P = " + bytes(s.standard));
    const at = P.points.find((p) => p.n === 4096);
    $("plan-ratio").textContent = "At N = 4096 for this shape: S + P = " + bytes(at.standard) + ", m + l + workspace = " + bytes(at.flash)
      + ": " + ratio(at.ratio) + " less; all buffers (Q, K, V, O included): " + ratio(at.total_ratio) + ". At N = 1M: " + ratio(P.points[P.points.length - 1].ratio) + ".";
    const tb = $("plan-table").tBodies[0];
    tb.textContent = "";
    for (const p of P.points) {
      const tr = tb.insertRow();
      for (const v of [String(p.n), bytes(p.standard), bytes(p.flash), ratio(p.ratio)]) tr.insertCell().textContent = v;
    }
  }

  let planTimer = 0;
  function planSoon() {
    clearTimeout(planTimer);
    planTimer = setTimeout(updatePlan, 400);
  }

  for (const id of ["pg-batch", "pg-heads", "pg-heads-kv", "pg-d", "pg-dtype"]) $(id).addEventListener("change", planSoon);
  $("plan-run").addEventListener("click", updatePlan);
  state.lib.onStart(updatePlan);
})();
