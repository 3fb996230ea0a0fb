/*
 * v1.c — attnd's own GET endpoints (v1.h): the probes, the metrics, the
 * server's description, the plan, and the console's files. Each is cheap,
 * and answered on the HTTP thread.
 */
#include "v1.h"
#include "sessions.h"
#include "errors.h"
#include "prom.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void attnd_v1_healthz(attnd_req *r) {
  attn_sbuf b = {0};
  attn_sbuf_puts(&b, "{\"status\": \"ok\"}\n");
  attnd_req_reply_json(r, 200, &b);
}

void attnd_v1_readyz(attnd_req *r) {
  attnd_server *s = r->srv;
  char why[200];
  int code = attnd_server_ready(s, why, sizeof why);
  if (code) {
    attnd_req_fail(r, code, why);
    return;
  }
  attn_sbuf b = {0};
  attn_sbuf_puts(&b, "{\"status\": \"ready\"");
  if (attnd_server_disabled_kernels(s, why, sizeof why)) {
    attn_sbuf_puts(&b, ", \"detail\": ");
    attn_sbuf_json_str(&b, why);
  }
  attn_sbuf_puts(&b, "}\n");
  attnd_req_reply_json(r, 200, &b);
}

void attnd_v1_info(attnd_req *r) {
  attnd_server *s = r->srv;
  const attnd_config *c = s->cfg;
  attn_sbuf b = {0};
  attn_sbuf_printf(&b, "{\"version\": \"%s\", \"backend\": ", ATTN_VERSION);
  attn_sbuf_json_str(&b, s->engine_detail);
  attn_sbuf_puts(&b, ", \"backends\": [");
  attn_backend_info info[ATTND_MAX_BACKENDS];
  int n = attn_engine_backends(s->engine, info, ATTND_MAX_BACKENDS);
  for (int i = 0; i < n && i < ATTND_MAX_BACKENDS; i++) {
    attn_sbuf_puts(&b, i ? ", {\"name\": " : "{\"name\": ");
    attn_sbuf_json_str(&b, info[i].name);
    attn_sbuf_printf(&b, ", \"available\": %s, \"detail\": ", info[i].available ? "true" : "false");
    attn_sbuf_json_str(&b, info[i].detail);
    attn_sbuf_puts(&b, ", \"disabled\": [");
    for (int k = 0; k < info[i].ndisabled; k++) {
      attn_sbuf_puts(&b, k ? ", {\"kernel\": " : "{\"kernel\": ");
      attn_sbuf_json_str(&b, info[i].disabled[k].kernel);
      attn_sbuf_puts(&b, ", \"why\": ");
      attn_sbuf_json_str(&b, info[i].disabled[k].why);
      attn_sbuf_puts(&b, "}");
    }
    attn_sbuf_puts(&b, "]}");
  }
#ifdef ATTN_HAVE_CUDA
  const char *cuda = "true";
#else
  const char *cuda = "false";
  attn_sbuf_puts(&b, ", {\"name\": \"cuda\", \"available\": false, \"detail\": "
                     "\"not compiled into this build\", \"disabled\": []}");
#endif
  attn_sbuf_printf(&b,
                   "], \"limits\": {\"max_body\": %llu, \"max_queue\": %d, \"timeout\": %g, "
                   "\"idle_timeout\": %d, \"header_timeout\": %g, \"max_connections\": %d, "
                   "\"max_connections_per_client\": %d, \"drain_timeout\": %g, "
                   "\"max_head_dim\": %d, \"max_head_dim_v\": %d, \"min_upload_rate\": %.0f, "
                   "\"max_running\": %d, "
                   "\"max_running_per_client\": %d, \"max_pairs\": %llu}, \"build\": "
                   "{\"cuda\": %s, \"compiler\": ",
                   (unsigned long long)c->max_body, c->max_queue, c->timeout, c->idle_timeout,
                   c->header_timeout, s->max_connections, c->max_connections_per_client,
                   c->drain_timeout, ATTN_MAX_HEAD_DIM, ATTN_MAX_HEAD_DIM_V, c->min_upload_rate,
                   s->max_running, s->client_cap == INT_MAX ? 0 : s->client_cap,
                   (unsigned long long)c->max_pairs, cuda);
  attn_sbuf_json_str(&b, __VERSION__);
  attn_sbuf_printf(&b,
                   ", \"threads\": %d, \"http_threads\": %d, \"deterministic\": %s}, "
                   "\"security\": {\"api_key\": %s, \"api_keys\": %d, \"tls\": %s, ",
                   attn_engine_threads(s->engine), c->http_threads,
                   c->deterministic ? "true" : "false", c->keys.n ? "true" : "false", c->keys.n,
                   s->tls_cert_pem ? "true" : "false");
  attn_sbuf_puts(&b, "\"cors_origin\": ");
  if (*c->cors_origin)
    attn_sbuf_json_str(&b, c->cors_origin);
  else
    attn_sbuf_puts(&b, "null");
  attn_sbuf_puts(&b, "}, ");
  attnd_sessions_info(&b, s);
  attn_sbuf_puts(&b, "}\n");
  attnd_req_reply_json(r, 200, &b);
}

void attnd_v1_plan(attnd_req *r) {
  attn_plan_params pp;
  attn_plan pl;
  attn_status st;
  if (attn_proto_parse_plan_query(r->query, &pp, &st) < 0 ||
      (pp.threads = attn_engine_threads(r->srv->engine), attn_plan_compute(&pp, &pl, &st) < 0)) {
    attnd_req_fail(r, st.code, st.message);
    return;
  }
  attn_sbuf b = {0};
  attn_proto_plan_json(&b, &pp, &pl);
  attnd_req_reply_json(r, 200, &b);
}

/* The registry's counters, after the other series of /metrics. */
static void render_conns(attn_sbuf *b, attnd_conns *c) {
  uint64_t n[ATTND_CLOSE_REASONS];
  attnd_conns_counts(c, n);
  attn_prom_family(b, "attnd_connections_closed_total", "counter",
                   "Connections the server closed or refused to keep others from being locked "
                   "out, by reason.");
  for (int i = 0; i < ATTND_CLOSE_REASONS; i++) {
    attn_prom_label l = {"reason", attnd_conns_reason_name((attnd_conn_reason)i)};
    attn_prom_sample_u64(b, "attnd_connections_closed_total", &l, 1, n[i]);
  }
}

/* The body budget in use: what uploads, queued and running jobs hold. */
static void render_budget(attn_sbuf *b, attnd_server *s) {
  const attnd_config *c = s->cfg;
  char help[320];
  snprintf(help, sizeof help,
           "Bytes of request bodies (and their decodes) the server holds, of the budget "
           "--max-queue x --max-body (%llu): bytes that arrived, never what a client declared.",
           (unsigned long long)c->max_queue * c->max_body);
  attn_prom_gauge(b, "attnd_body_bytes", help, (int64_t)atomic_load(&s->body_bytes));
  attn_host_stats hs;
  attn_engine_host_stats(s->engine, &hs);
  if (hs.cap == 0) /* no GPU lends any: nothing to show */
    return;
  snprintf(help, sizeof help,
           "Page-locked host memory of the GPU's pool (--pinned-memory %llu): bytes pinned now, "
           "lent to bodies and replies or idle for reuse.",
           (unsigned long long)hs.cap);
  attn_prom_gauge(b, "attnd_pinned_bytes", help, (int64_t)hs.pinned);
  attn_prom_gauge(b, "attnd_pinned_lent_bytes", "Of those, bytes lent to bodies and replies.",
                  (int64_t)hs.lent);
  attn_prom_counter(b, "attnd_pinned_refused_total",
                    "Buffers the pool could not lend (full): those bodies and replies were "
                    "ordinary memory, staged.",
                    hs.refused);
}

/* The backend requests run on and its kernel ("avx512bf16 kernel, 2
 * threads"), as an info series a dashboard can show beside the rates. */
static void render_backend(attn_sbuf *b, const attnd_server *s) {
  attn_backend_info info[8];
  int n = attn_engine_backends(s->engine, info, 8);
  attn_prom_family(b, "attnd_backend_info", "gauge",
                   "The backend requests run on, and its kernel.");
  for (int i = 0; i < n && i < 8; i++) {
    if (strcmp(info[i].name, s->backend))
      continue;
    attn_prom_label l[] = {{"backend", info[i].name}, {"detail", info[i].detail}};
    attn_prom_sample_u64(b, "attnd_backend_info", l, 2, 1);
  }
}

/* attnd_build_info: the version and the backends compiled in, one series
 * whose value is 1 (joined onto others in queries). */
static void render_build(attn_sbuf *b, const attnd_server *s) {
  attn_backend_info info[ATTND_MAX_BACKENDS];
  int n = attn_engine_backends(s->engine, info, ATTND_MAX_BACKENDS);
  char names[128] = "";
  size_t at = 0;
  for (int i = 0; i < n && i < ATTND_MAX_BACKENDS && at < sizeof names; i++)
    at += (size_t)snprintf(names + at, sizeof names - at, "%s%s", i ? "," : "", info[i].name);
  attn_prom_family(b, "attnd_build_info", "gauge",
                   "The version and the engine backends of this build.");
  attn_prom_label l[] = {{"version", ATTN_VERSION}, {"backends", names}};
  attn_prom_sample_u64(b, "attnd_build_info", l, 2, 1);
}

void attnd_v1_metrics(attnd_req *r) {
  attnd_server *s = r->srv;
  size_t len = 0;
  /* r->tenant: the caller's key's name, "" without keys (no such family) */
  char *text = attnd_metrics_render_for(s->metrics, r->tenant, &len);
  attn_sbuf m = {.p = text, .len = len, .cap = len};
  if (text) {
    render_conns(&m, &s->conns);
    render_budget(&m, s);
    render_backend(&m, s);
    render_build(&m, s);
    attnd_sessions_metrics(&m, s);
  }
  if (text && !m.oom) {
    attnd_req_reply(r, 200, m.p, m.len, "text/plain; version=0.0.4; charset=utf-8");
    return;
  }
  free(m.p);
  attnd_req_fail(r, ATTND_EOUT_OF_MEMORY, "out of memory rendering the metrics");
}

/* A console file, or 304 when the browser holds these bytes already. */
void attnd_v1_console(attnd_req *r) {
  const attnd_console_asset *a = r->asset;
  const char *inm = r->srv->transport->header(r, "If-None-Match");
  if (attnd_console_not_modified(inm, a->etag)) {
    attnd_req_reply(r, 304, malloc(1), 0, a->type);
    return;
  }
  char *b = malloc(a->len ? a->len : 1);
  if (!b) {
    attnd_req_fail(r, ATTND_EOUT_OF_MEMORY, "out of memory for the console page");
    return;
  }
  memcpy(b, a->data, a->len);
  attnd_req_reply(r, 200, b, a->len, a->type);
}
