/*
 * console.js — attnd's web console: plain JavaScript, no library, no build
 * step, and no request to any origin but this server's.
 *
 * Its parts share one object, window.attnConsole: the state below, which
 * also lets tests read the numbers behind what is drawn, and under .lib the
 * helpers this file lends the panels in console_plan.js and console_live.js
 * (loaded after it, in order, by defer):
 *   playground  (here) POST /attention with seeded or pasted tensors
 *               (stats: true), and a heatmap of P = exp(s - m) / l computed
 *               here in float64 from this page's Q and K and the server's m
 *               and l;
 *   plan        GET /attention/plan for N = 256 ... 2^20, a log-log chart;
 *   live        GET /metrics every second, rolling five-minute charts;
 *   sessions    GET /v1/sessions with each poll: the caller's sessions, each
 *               with a delete button (DELETE /v1/sessions/{id}).
 * The API key, when the server wants one, lives in a closure variable only.
 */
"use strict";

(function () {
  const $ = (id) => document.getElementById(id);
  const state = {
    info: null,        // GET /v1/info
    last: null,        // {request, status, reply, timing} of the last run
    heat: null,        // the heatmap's numbers
    plan: null,        // {points: [{n, standard, flash, ratio}], seed}
    live: { samples: [], codes: {}, polls: 0 },
    sessions: null,    // the last GET /v1/sessions: {sessions, count, memory}
  };
  window.attnConsole = state;
  let apiKey = null;   // never stored anywhere but here
  const starters = []; // what each panel runs once /v1/info answered, in load order

  /* ---- the API ------------------------------------------------------------ */

  /* One call: {status, body (parsed JSON, or text), headers}. A 401 asks
   * for the key; a network failure gives status 0. */
  async function api(path, init) {
    const opts = Object.assign({ cache: "no-store" }, init || {});
    const headers = new Headers(opts.headers || {});
    if (apiKey) headers.set("Authorization", "Bearer " + apiKey);
    opts.headers = headers;
    let res;
    try {
      res = await fetch(path, opts);
    } catch (e) {
      return { status: 0, body: { error: { code: "network", message: String(e.message || e) } } };
    }
    const type = res.headers.get("Content-Type") || "";
    const text = await res.text();
    let body = text;
    if (type.startsWith("application/json")) {
      try { body = JSON.parse(text); } catch (e) { body = { error: { code: "bad_reply", message: text.slice(0, 200) } }; }
    }
    if (res.status === 401) askKey(body);
    return { status: res.status, body: body, headers: res.headers };
  }

  function errorText(r) {
    const e = r.body && r.body.error;
    if (e && typeof e === "object") return (r.status ? r.status + " " : "") + e.code + ": " + e.message;
    return r.status + " " + String(r.body).slice(0, 200);
  }

  function askKey(body) {
    const form = $("key-form");
    const hadKey = apiKey !== null;
    apiKey = null;
    const why = body && body.error && body.error.message;
    $("key-error").textContent = hadKey ? "That key was refused: " + (why || "401") : "";
    if (form.hidden) {
      form.hidden = false;
      $("api-key").focus();
    }
  }
  $("key-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    apiKey = $("api-key").value;
    $("api-key").value = "";
    $("key-form").hidden = true;
    start();
  });

  /* ---- dtypes: the values the server will hold ------------------------------ */

  const f32 = new Float32Array(1), u32 = new Uint32Array(f32.buffer);
  function roundBF16(x) {
    f32[0] = x;
    const b = u32[0];
    u32[0] = (b + 0x7fff + ((b >>> 16) & 1)) & 0xffff0000; // nearest, ties to even
    return f32[0];
  }
  function roundF16(x) {
    const a = Math.abs(x);
    if (!isFinite(a) || a === 0) return x;
    if (a >= 65520) return x > 0 ? Infinity : -Infinity;
    let e = Math.max(-14, Math.floor(Math.log2(a)));
    if (e > -14 && Math.pow(2, e) > a) e--;
    const ulp = Math.pow(2, e - 10), m = a / ulp;
    let r = Math.floor(m);
    const frac = m - r;
    if (frac > 0.5 || (frac === 0.5 && r % 2 === 1)) r++;
    return Math.sign(x) * r * ulp;
  }
  const rounders = { F32: Math.fround, F16: roundF16, BF16: roundBF16 };

  /* A seeded generator (mulberry32) and standard normals from it. */
  function mulberry32(seed) {
    let a = seed >>> 0;
    return function () {
      a = (a + 0x6d2b79f5) >>> 0;
      let t = a;
      t = Math.imul(t ^ (t >>> 15), t | 1);
      t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
      return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
    };
  }
  function normals(rand, n, round) {
    const out = new Array(n);
    for (let i = 0; i < n; i += 2) {
      const u = 1 - rand(), v = rand();
      const r = Math.sqrt(-2 * Math.log(u));
      out[i] = round(r * Math.cos(2 * Math.PI * v));
      if (i + 1 < n) out[i + 1] = round(r * Math.sin(2 * Math.PI * v));
    }
    return out;
  }

  /* ---- the playground's inputs ------------------------------------------------ */

  function intOf(id, lo) {
    const v = Number($(id).value);
    if (!Number.isInteger(v) || v < lo) throw new Error($(id).closest("label").firstElementChild.textContent + " must be an integer of at least " + lo);
    return v;
  }

  /* A nested JSON array as {shape, data}, or an Error. */
  function fromNested(text, name, round) {
    let x;
    try { x = JSON.parse(text); } catch (e) { throw new Error(name + " is not JSON: " + e.message); }
    const shape = [];
    for (let y = x; Array.isArray(y); y = y[0]) shape.push(y.length);
    if (shape.length < 2 || shape.length > 4) throw new Error(name + " must be nested 2 to 4 deep ([N, D], [H, N, D] or [B, H, N, D])");
    const data = [];
    (function walk(y, depth) {
      if (depth === shape.length) {
        if (typeof y !== "number") throw new Error(name + " holds something other than a number: " + JSON.stringify(y));
        data.push(round(y));
        return;
      }
      if (!Array.isArray(y) || y.length !== shape[depth]) throw new Error(name + " is not rectangular (every row of a level must have the same length)");
      for (const z of y) walk(z, depth + 1);
    })(x, 0);
    return { shape: shape, data: data };
  }

  const MAX_ELEMENTS = 1 << 22; // per tensor: the page builds JSON in memory

  /* The request the form describes: {body, dims} or an Error thrown. */
  function buildRequest() {
    const dtype = $("pg-dtype").value, round = rounders[dtype];
    let q, k, v;
    if ($("pg-src-paste").checked) {
      q = fromNested($("pg-q").value, "Q", round);
      k = fromNested($("pg-k").value, "K", round);
      v = fromNested($("pg-v").value, "V", round);
    } else {
      const b = intOf("pg-batch", 1), hq = intOf("pg-heads", 1), hkv = intOf("pg-heads-kv", 1);
      const nq = intOf("pg-nq", 1), nkv = intOf("pg-nkv", 1), d = intOf("pg-d", 1);
      const seed = intOf("pg-seed", 0);
      // v may have a head dim of its own (o then has it); empty: D
      const dv = $("pg-dv").value.trim() === "" ? d : intOf("pg-dv", 1);
      if (b * hq * nq * Math.max(d, dv) > MAX_ELEMENTS || b * hkv * nkv * Math.max(d, dv) > MAX_ELEMENTS)
        throw new Error("more than " + MAX_ELEMENTS + " values in a tensor: too large for a page (use attn infer)");
      const rand = mulberry32(seed);
      q = { shape: [b, hq, nq, d], data: normals(rand, b * hq * nq * d, round) };
      k = { shape: [b, hkv, nkv, d], data: normals(rand, b * hkv * nkv * d, round) };
      v = { shape: [b, hkv, nkv, dv], data: normals(rand, b * hkv * nkv * dv, round) };
    }
    const body = {
      q: { shape: q.shape, dtype: dtype, data: q.data },
      k: { shape: k.shape, dtype: dtype, data: k.data },
      v: { shape: v.shape, dtype: dtype, data: v.data },
      causal: $("pg-causal").checked,
      window_left: intOf("pg-wl", -1),
      window_right: intOf("pg-wr", -1),
      stats: true,
      backend: $("pg-backend").value,
    };
    const sinks = $("pg-sinks").value.trim();
    if (sinks !== "") {
      const hq = dims4(q.shape).h, parts = sinks.split(",").map((x) => x.trim());
      const s = parts.map(Number);
      if (s.length !== hq || !parts.every((x, i) => x !== "" && isFinite(s[i])))
        throw new Error("sinks must be " + hq + " finite numbers (one per query head), comma-separated");
      body.sinks = s;
    }
    const sc = $("pg-scale").value.trim();
    if (sc !== "") {
      const s = Number(sc);
      if (!isFinite(s)) throw new Error("scale must be a number, or empty for 1/√D");
      body.scale = s;
    }
    return body;
  }

  /* [B, H, N, D] of a shape of 2 to 4 dimensions. */
  function dims4(shape) {
    const s = shape.slice();
    while (s.length < 4) s.unshift(1);
    return { b: s[0], h: s[1], n: s[2], d: s[3] };
  }

  /* Server-Timing: "queue;dur=0.01, compute;dur=1.2, total;dur=1.3". */
  function parseTiming(h) {
    const out = {};
    for (const part of (h || "").split(",")) {
      const m = /^\s*([\w-]+)\s*;\s*dur=([\d.eE+-]+)/.exec(part);
      if (m) out[m[1]] = Number(m[2]);
    }
    return out;
  }

  /* ---- the playground --------------------------------------------------------- */

  function fmt(x) {
    if (x === null) return "−inf";
    if (typeof x !== "number") return String(x);
    return Math.abs(x) >= 1e5 || (Math.abs(x) < 1e-3 && x !== 0) ? x.toExponential(4) : x.toPrecision(6).replace(/\.?0+$/, "");
  }
  function ms(x) { return x === undefined ? "?" : x < 1 ? x.toFixed(3) + " ms" : x.toFixed(2) + " ms"; }
  function bytes(n) {
    const u = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let i = 0;
    while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
    return (n >= 100 || i === 0 ? Math.round(n) : n.toPrecision(3).replace(/\.?0+$/, "")) + " " + u[i];
  }

  const SVG = "http://www.w3.org/2000/svg";

  function svgEl(parent, name, attrs, text) {
    const e = document.createElementNS(SVG, name);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    parent.appendChild(e);
    return e;
  }

  const SHOWN = 48;
  function showTensors(reply) {
    const box = $("pg-tensors");
    box.textContent = "";
    for (const name of ["o", "m", "l", "lse"]) {
      const t = reply[name];
      if (!t) continue;
      const h = document.createElement("h4");
      h.textContent = name + "  " + t.dtype + " [" + t.shape.join(", ") + "]";
      const pre = document.createElement("pre");
      const more = t.data.length > SHOWN ? "  … " + (t.data.length - SHOWN) + " more" : "";
      pre.textContent = t.data.slice(0, SHOWN).map(fmt).join("  ") + more;
      box.append(h, pre);
    }
  }

  async function run(ev) {
    ev.preventDefault();
    const err = $("pg-error");
    err.textContent = "";
    delete err.dataset.status;
    delete err.dataset.code;
    let body;
    try { body = buildRequest(); } catch (e) { err.textContent = e.message; err.dataset.code = "page"; return; }
    $("pg-run").disabled = true;
    $("pg-status").textContent = "running…";
    const t0 = performance.now();
    const r = await api("/attention", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
    const rtt = performance.now() - t0;
    $("pg-run").disabled = false;
    const timing = r.headers ? parseTiming(r.headers.get("Server-Timing")) : {};
    state.last = { request: body, status: r.status, reply: r.body, timing: timing, rtt: rtt };
    $("pg-http").textContent = r.status ? String(r.status) : "no reply";
    $("pg-rtt").textContent = ms(rtt);
    $("pg-timing").textContent = timing.total !== undefined
      ? "queue " + ms(timing.queue) + ", compute " + ms(timing.compute) + ", total " + ms(timing.total) : "–";
    if (r.status !== 200) {
      $("pg-status").textContent = "failed";
      $("pg-used").textContent = "–";
      err.textContent = errorText(r);
      err.dataset.status = String(r.status);
      err.dataset.code = (r.body && r.body.error && r.body.error.code) || "";
      return;
    }
    $("pg-status").textContent = "done";
    $("pg-used").textContent = r.body.backend || "–";
    showTensors(r.body);
    heatSetup(body, r.body);
  }

  /* ---- the heatmap ------------------------------------------------------------ */

  const HEAT_MAX_N = 512;

  function heatSetup(req, reply) {
    const qd = dims4(req.q.shape), kd = dims4(req.k.shape);
    const fill = (sel, n, label) => {
      const keep = Math.min(Number(sel.value) || 0, n - 1);
      sel.textContent = "";
      for (let i = 0; i < n; i++) sel.add(new Option(label + " " + i, String(i)));
      sel.value = String(keep);
    };
    fill($("hm-b"), qd.b, "batch");
    fill($("hm-h"), qd.h, "head");
    if (qd.n > HEAT_MAX_N || kd.n > HEAT_MAX_N) {
      state.heat = null;
      clearHeat("No heatmap above N = " + HEAT_MAX_N + " (" + qd.n + " × " + kd.n + " cells).");
      return;
    }
    heatCompute();
  }

  function clearHeat(msg) {
    const c = $("heatmap");
    c.getContext("2d").clearRect(0, 0, c.width, c.height);
    $("hm-readout").textContent = msg;
  }

  /* P for (b, h) in float64 from the request's Q and K and the reply's m and
   * l, with the same mask the server applies. A sink takes its share of l
   * too: the row's sum counts it, so that visible rows still sum to 1. */
  function heatCompute() {
    if (!state.last || state.last.status !== 200) return;
    const req = state.last.request, reply = state.last.reply;
    const qd = dims4(req.q.shape), kd = dims4(req.k.shape);
    if (qd.n > HEAT_MAX_N || kd.n > HEAT_MAX_N) return;
    const b = Number($("hm-b").value) || 0, h = Number($("hm-h").value) || 0;
    const hk = Math.floor(h / (qd.h / kd.h)), D = qd.d, nq = qd.n, nkv = kd.n;
    const scale = req.scale !== undefined ? req.scale : 1 / Math.sqrt(D);
    const wl = req.window_left, wr = req.causal ? 0 : req.window_right, off = nkv - nq;
    const qBase = ((b * qd.h + h) * nq) * D, kBase = ((b * kd.h + hk) * nkv) * D;
    const sBase = (b * qd.h + h) * nq;
    const p = [], s = [], visible = [], rowSums = [];
    let max = 0;
    for (let i = 0; i < nq; i++) {
      const m = reply.m.data[sBase + i], l = reply.l.data[sBase + i];
      const pr = new Array(nkv), sr = new Array(nkv), vr = new Array(nkv);
      let sum = 0;
      for (let j = 0; j < nkv; j++) {
        vr[j] = (wl < 0 || j >= i + off - wl) && (wr < 0 || j <= i + off + wr);
        let dot = 0;
        for (let t = 0; t < D; t++) dot += req.q.data[qBase + i * D + t] * req.k.data[kBase + j * D + t];
        sr[j] = scale * dot;
        pr[j] = vr[j] && m !== null && l > 0 ? Math.exp(sr[j] - m) / l : 0;
        sum += pr[j];
        if (pr[j] > max) max = pr[j];
      }
      if (req.sinks && m !== null && l > 0) sum += Math.exp(req.sinks[h] - m) / l;
      p.push(pr); s.push(sr); visible.push(vr); rowSums.push(sum);
    }
    state.heat = { b: b, h: h, nq: nq, nkv: nkv, p: p, s: s, visible: visible, rowSums: rowSums, max: max, cursor: null };
    const c = $("heatmap");
    c.dataset.b = String(b); c.dataset.h = String(h);
    c.dataset.rows = String(nq); c.dataset.cols = String(nkv);
    c.dataset.maxRowError = String(Math.max(0, ...rowSums.filter((x, i) => visible[i].some(Boolean)).map((x) => Math.abs(x - 1))));
    $("hm-max").textContent = fmt(max);
    heatDraw();
    $("hm-readout").textContent = "batch " + b + ", head " + h + " (kv head " + hk + "): " + nq + " × " + nkv + " cells. Hover or use the arrow keys.";
  }

  /* White through amber to dark red, P relative to the largest P. */
  const RAMP = [[255, 255, 255], [253, 230, 138], [245, 158, 11], [194, 65, 12], [69, 10, 10]];
  function ramp(t) {
    const x = Math.min(1, Math.max(0, t)) * (RAMP.length - 1), i = Math.min(RAMP.length - 2, Math.floor(x)), f = x - i;
    return RAMP[i].map((a, k) => Math.round(a + (RAMP[i + 1][k] - a) * f));
  }

  function heatDraw() {
    const H = state.heat, c = $("heatmap");
    c.width = H.nkv;
    c.height = H.nq;
    const ctx = c.getContext("2d"), img = ctx.createImageData(H.nkv, H.nq);
    for (let i = 0; i < H.nq; i++) {
      for (let j = 0; j < H.nkv; j++) {
        const rgb = H.visible[i][j] ? ramp(H.max > 0 ? H.p[i][j] / H.max : 0) : [185, 185, 192];
        const at = 4 * (i * H.nkv + j);
        img.data[at] = rgb[0]; img.data[at + 1] = rgb[1]; img.data[at + 2] = rgb[2]; img.data[at + 3] = 255;
      }
    }
    if (H.cursor) {
      const at = 4 * (H.cursor[0] * H.nkv + H.cursor[1]);
      img.data[at] = 11; img.data[at + 1] = 92; img.data[at + 2] = 173;
    }
    ctx.putImageData(img, 0, 0);
  }

  function heatRead(i, j) {
    const H = state.heat;
    if (!H) return;
    H.cursor = [i, j];
    heatDraw();
    $("hm-readout").textContent = "query " + i + ", key " + j + ": " + (H.visible[i][j]
      ? "s = " + fmt(H.s[i][j]) + ", P = " + fmt(H.p[i][j]) + " (row sum " + fmt(H.rowSums[i]) + ")"
      : "masked (key not visible to this query)");
  }

  $("heatmap").addEventListener("mousemove", (ev) => {
    const H = state.heat;
    if (!H) return;
    const r = ev.currentTarget.getBoundingClientRect();
    const j = Math.min(H.nkv - 1, Math.floor((ev.clientX - r.left) / r.width * H.nkv));
    const i = Math.min(H.nq - 1, Math.floor((ev.clientY - r.top) / r.height * H.nq));
    if (i >= 0 && j >= 0) heatRead(i, j);
  });
  $("heatmap").addEventListener("keydown", (ev) => {
    const H = state.heat;
    const step = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1] }[ev.key];
    if (!H || !step) return;
    ev.preventDefault();
    const [i, j] = H.cursor || [0, 0];
    const n = ev.shiftKey ? 8 : 1;
    heatRead(Math.min(H.nq - 1, Math.max(0, i + step[0] * n)), Math.min(H.nkv - 1, Math.max(0, j + step[1] * n)));
  });
  $("hm-b").addEventListener("change", heatCompute);
  $("hm-h").addEventListener("change", heatCompute);

  /* ---- start ------------------------------------------------------------------ */

  async function loadInfo() {
    const r = await api("/v1/info");
    if (r.status !== 200) {
      $("server-line").textContent = r.status === 401 ? "API key needed" : "GET /v1/info: " + errorText(r);
      return false;
    }
    const info = (state.info = r.body);
    $("server-line").textContent = "attnd " + info.version + " · " + info.backend + (info.security && info.security.api_key ? " · API key in use" : "");
    const sel = $("pg-backend");
    for (const o of sel.options) {
      const b = info.backends.find((x) => x.name === o.value);
      o.disabled = o.value !== "auto" && !(b && b.available);
      o.textContent = o.value + (o.disabled ? " (unavailable)" : "");
    }
    const m = /^(\S+)\s*\((.*)\)$/.exec(info.backend);
    $("live-backend").textContent = m ? m[1] : info.backend;
    $("live-kernel").textContent = m ? m[2] : "–";
    return true;
  }

  async function start() {
    if (!(await loadInfo())) return;
    for (const f of starters) f();
  }

  $("pg-form").addEventListener("submit", run);
  for (const el of document.querySelectorAll('input[name="pg-src"]'))
    el.addEventListener("change", () => { $("pg-paste").hidden = !$("pg-src-paste").checked; });

  /* What the panel files use. They run after this file and before
   * DOMContentLoaded (defer keeps the order), so start waits for that. */
  state.lib = Object.freeze({ $, api, errorText, intOf, fmt, bytes, svgEl, onStart: (f) => starters.push(f) });
  document.addEventListener("DOMContentLoaded", start);
})();
