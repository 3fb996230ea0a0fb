/*
 * console_live.js — the web console's live panels: GET /metrics every second
 * into rolling five-minute charts (requests, latency quantiles, queue,
 * in flight, errors by code), and with each poll GET /v1/sessions: the
 * caller's sessions, each with a delete button. Loaded after console.js,
 * whose window.attnConsole it writes .live and .sessions to.
 */
"use strict";

(function () {
  const state = window.attnConsole;
  const { $, api, errorText, fmt, bytes, svgEl } = state.lib;

  /* ---- live ------------------------------------------------------------------ */

  const WINDOW_S = 300;
  const WORK_PATHS = new Set(["/attention", "/attention/backward", "/v2/models/*/infer"]);

  /* Prometheus text: [{name, labels, value}]. */
  function parseProm(text) {
    const out = [];
    for (const line of text.split("\n")) {
      if (!line || line[0] === "#") continue;
      const m = /^([A-Za-z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)/.exec(line);
      if (!m) continue;
      const labels = {};
      const re = /(\w+)="((?:[^"\\]|\\.)*)"/g;
      let l;
      while ((l = re.exec(m[2] || ""))) labels[l[1]] = l[2].replace(/\\(.)/g, (_, c) => (c === "n" ? "\n" : c));
      out.push({ name: m[1], labels: labels, value: m[3] === "+Inf" ? Infinity : Number(m[3]) });
    }
    return out;
  }

  /* The counters a sample needs, summed over the attention routes. */
  function reading(series) {
    const r = { t: performance.now() / 1000, requests: 0, buckets: new Map(), queue: 0, inflight: 0, errors: {}, backend: null };
    for (const s of series) {
      if (s.name === "attnd_requests_total" && WORK_PATHS.has(s.labels.path)) r.requests += s.value;
      else if (s.name === "attnd_request_duration_seconds_bucket" && WORK_PATHS.has(s.labels.path)) {
        const le = s.labels.le === "+Inf" ? Infinity : Number(s.labels.le);
        r.buckets.set(le, (r.buckets.get(le) || 0) + s.value);
      } else if (s.name === "attnd_queue_depth") r.queue = s.value;
      else if (s.name === "attnd_inflight") r.inflight = s.value;
      else if (s.name === "attnd_errors_total") r.errors[s.labels.code] = s.value;
      else if (s.name === "attnd_backend_info") r.backend = s.labels;
    }
    return r;
  }

  /* histogram_quantile over bucket deltas: linear within the bucket. */
  function quantile(q, les, counts) {
    const total = counts[counts.length - 1];
    if (!(total > 0)) return null;
    const rank = q * total;
    for (let i = 0; i < les.length; i++) {
      if (counts[i] >= rank) {
        if (les[i] === Infinity) return les[i - 1] !== undefined ? les[i - 1] : null;
        const lo = i ? les[i - 1] : 0, prev = i ? counts[i - 1] : 0;
        return lo + (les[i] - lo) * (counts[i] > prev ? (rank - prev) / (counts[i] - prev) : 1);
      }
    }
    return null;
  }

  const delta = (a, b) => (a >= b ? a - b : a); // a counter that went back restarted

  function sample(cur, prev) {
    const dt = cur.t - prev.t;
    const les = [...cur.buckets.keys()].sort((a, b) => a - b);
    const d = les.map((le) => delta(cur.buckets.get(le), prev.buckets.get(le) || 0));
    const p50 = quantile(0.5, les, d), p99 = quantile(0.99, les, d);
    let errs = 0;
    const byCode = {};
    for (const code in cur.errors) {
      byCode[code] = delta(cur.errors[code], prev.errors[code] || 0);
      errs += byCode[code];
    }
    return {
      t: cur.t, rps: delta(cur.requests, prev.requests) / dt,
      p50: p50 === null ? null : p50 * 1e3, p99: p99 === null ? null : p99 * 1e3,
      queue: cur.queue, inflight: cur.inflight, eps: errs / dt, byCode: byCode,
    };
  }

  /* The smallest of 1, 2, 5 x 10^k at or above x (1 for nothing). */
  function niceCeil(x) {
    if (!(x > 0)) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(x)));
    for (const f of [1, 2, 5, 10]) if (f * p >= x) return f * p;
    return 10 * p;
  }

  /* A rolling chart: the last WINDOW_S seconds, y from 0 to a rounded max. */
  function spark(svg, samples, keys, now) {
    svg.textContent = "";
    let max = 0;
    for (const s of samples) for (const k of keys) if (s[k] !== null && s[k] > max) max = s[k];
    const top = niceCeil(max);
    for (const k of keys) {
      let pts = [];
      const flush = () => {
        if (pts.length > 1) svgEl(svg, "polyline", { class: k, points: pts.join(" ") });
        else if (pts.length) { // a lone value between gaps: a dot, not an invisible line
          const [cx, cy] = pts[0].split(",");
          svgEl(svg, "circle", { class: k, cx: cx, cy: cy, r: 1.8 });
        }
        pts = [];
      };
      for (const s of samples) {
        if (s[k] === null) { flush(); continue; }
        pts.push((300 - (now - s.t) * 300 / WINDOW_S).toFixed(1) + "," + (78 - s[k] / top * 72).toFixed(1));
      }
      flush();
    }
    svgEl(svg, "text", { x: 4, y: 11 }, fmt(top));
    svgEl(svg, "text", { x: 4, y: 77 }, "−5 min");
    const last = samples.length ? samples[samples.length - 1] : null;
    svg.dataset.max = String(max);
    svg.dataset.count = String(samples.length);
    svg.dataset.last = last ? String(last[keys[0]]) : "";
    svg.dataset.nonzero = String(samples.filter((s) => s[keys[0]] > 0).length);
  }

  function showLive(cur) {
    const L = state.live, now = cur.t, ss = L.samples;
    const last = ss[ss.length - 1];
    $("lv-rps").textContent = last ? last.rps.toFixed(1) : "–";
    $("lv-lat").textContent = last && last.p50 !== null ? last.p50.toFixed(2) + " / " + last.p99.toFixed(2) : "–";
    $("lv-queue").textContent = String(cur.queue);
    $("lv-inflight").textContent = String(cur.inflight);
    $("lv-err").textContent = last ? last.eps.toFixed(1) : "–";
    spark($("ch-rps"), ss, ["rps"], now);
    spark($("ch-lat"), ss, ["p50", "p99"], now);
    spark($("ch-queue"), ss, ["queue"], now);
    spark($("ch-inflight"), ss, ["inflight"], now);
    spark($("ch-err"), ss, ["eps"], now);
    const tb = $("lv-codes").tBodies[0];
    tb.textContent = "";
    for (const code of Object.keys(cur.errors).sort()) {
      const recent = ss.reduce((a, s) => a + (s.byCode[code] || 0), 0);
      const tr = tb.insertRow();
      tr.dataset.code = code;
      for (const v of [code, String(cur.errors[code]), String(recent)]) tr.insertCell().textContent = v;
    }
    if (cur.backend) {
      $("live-backend").textContent = cur.backend.backend;
      $("live-kernel").textContent = cur.backend.detail;
    }
  }

  let livePrev = null, liveTimer = 0;
  async function poll() {
    clearTimeout(liveTimer);
    const r = await api("/metrics");
    if (r.status === 200) {
      $("live-error").textContent = "";
      const cur = reading(parseProm(r.body));
      const L = state.live;
      L.polls++;
      if (livePrev) {
        L.samples.push(sample(cur, livePrev));
        while (L.samples.length && cur.t - L.samples[0].t > WINDOW_S) L.samples.shift();
      }
      livePrev = cur;
      showLive(cur);
      refreshSessions();
    } else if (r.status !== 401) {
      $("live-error").textContent = "GET /metrics: " + errorText(r);
    }
    if (r.status !== 401) liveTimer = setTimeout(poll, 1000);
  }

  /* ---- sessions ---------------------------------------------------------------- */

  /* heads_kv × head_dim, and the values' width when it is not head_dim: a
   * latent session's v is the first v_from_k columns of k. */
  function shapeText(s) {
    const dims = s.heads_kv + " × " + s.head_dim;
    if (s.v_from_k) return dims + ", latent (v: " + s.v_from_k + ")";
    return s.head_dim_v && s.head_dim_v !== s.head_dim ? dims + ", v " + s.head_dim_v : dims;
  }

  /* The dtype, and how the rows are stored when they are quantized. */
  function dtypeText(s) {
    return s.kv_dtype && s.kv_dtype !== s.dtype ? s.dtype + " (stored " + s.kv_dtype + ")" : s.dtype;
  }

  function seconds(x) {
    if (!(x >= 0)) return "–";
    if (x < 90) return x.toFixed(0) + " s";
    if (x < 5400) return (x / 60).toFixed(0) + " min";
    return (x / 3600).toFixed(1) + " h";
  }

  async function refreshSessions() {
    const info = state.info;
    if (!info || !info.sessions || !info.sessions.enabled) {
      $("sess-summary").textContent = "Sessions are off on this server (--session-memory 0).";
      return;
    }
    const r = await api("/v1/sessions");
    if (r.status !== 200) {
      if (r.status !== 401) $("sess-error").textContent = "GET /v1/sessions: " + errorText(r);
      return;
    }
    $("sess-error").textContent = "";
    state.sessions = r.body;
    showSessions(r.body);
  }

  function showSessions(list) {
    const m = list.memory;
    $("sess-summary").textContent = list.count + (list.count === 1 ? " session" : " sessions") +
      "; session memory: " + bytes(m.reserved_bytes) + " reserved, " + bytes(m.used_bytes) +
      " in use, of " + bytes(m.pool_bytes) +
      (m.shared_bytes > 0 ? "; " + bytes(m.shared_bytes) + " shared by forks (stored once)" : "");
    const tb = $("sess-table").tBodies[0];
    tb.textContent = "";
    const sorted = list.sessions.slice().sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
    for (const s of sorted) {
      const tr = tb.insertRow();
      tr.dataset.id = s.id;
      const cap = s.layers * s.max_tokens, fill = cap > 0 ? s.tokens / cap : 0;
      for (const v of [s.id, dtypeText(s), shapeText(s), String(s.layers)])
        tr.insertCell().textContent = v;
      const meter = document.createElement("meter");
      meter.min = 0;
      meter.max = 1;
      meter.value = fill;
      meter.dataset.fill = String(fill);
      meter.setAttribute("aria-label", "fill of " + s.id);
      meter.title = s.tokens + " of " + cap + " tokens (" + s.layers + " × " + s.max_tokens + ")";
      const cell = tr.insertCell();
      cell.append(meter, " " + s.tokens + " / " + cap);
      /* a grow session's reservation is what it holds now, not its max_tokens'; a fork's
       * leaves out the pages it shares that another session pays for */
      tr.insertCell().textContent =
        bytes(s.reserved_bytes) + (s.reserve === "grow" ? " (grow)" : "") +
        (s.shared_bytes > 0 ? ", " + bytes(s.shared_bytes) + " shared" : "");
      tr.insertCell().textContent = seconds(s.expires_in_s);
      const del = document.createElement("button");
      del.type = "button";
      del.className = "small";
      del.textContent = "delete";
      del.setAttribute("aria-label", "delete session " + s.id);
      del.addEventListener("click", () => deleteSession(s.id, del));
      tr.insertCell().append(del);
    }
  }

  async function deleteSession(id, button) {
    button.disabled = true;
    const r = await api("/v1/sessions/" + encodeURIComponent(id), { method: "DELETE" });
    if (r.status !== 204 && r.status !== 404) $("sess-error").textContent = "DELETE /v1/sessions/" + id + ": " + errorText(r);
    refreshSessions();
  }

  state.lib.onStart(poll);
})();
