/*
 * http.c — the HTTP front of attnd on libmicrohttpd.
 *
 * Runs on libmicrohttpd's one polling thread and never computes. The first
 * callback of a request routes it and decides what it can at once: the GET
 * endpoints (all cheap) and 404/405 are answered when the request is
 * complete, which keeps the connection alive; 415 on a content type no
 * codec reads and 413 when Content-Length is over --max-body are answered
 * before a byte of the body is read (libmicrohttpd then skips "100
 * Continue" and closes). A POST /attention body is read into one buffer
 * that grows as bytes arrive (doubling, up to Content-Length, or to
 * --max-body for a chunked body): memory is reserved for what came, never
 * for what a client declares. A body is an upload in the connection
 * registry (conns.h) until its last byte: late, too slow, or abandoned, it
 * is cut there (on_cut answers it) whatever libmicrohttpd notices; past
 * --max-body or the memory budget it is cut here at once. On its last
 * byte the connection is suspended and the request handed to the loop,
 * which resumes it with the reply set. Every request ends in
 * on_completed(): one log line, the metrics, and freeing its state.
 */
#define _GNU_SOURCE
#include "http.h"
#include "auth.h"
#include "parse.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <arpa/inet.h>
#include <unistd.h>

static const struct {
  const char *path;
  attnd_route route;
} routes[] = {
    {"/attention", ATTND_R_ATTENTION}, {"/attention/backward", ATTND_R_BACKWARD},
    {"/attention/plan", ATTND_R_PLAN}, {"/healthz", ATTND_R_HEALTHZ},
    {"/readyz", ATTND_R_READYZ},       {"/metrics", ATTND_R_METRICS},
    {"/v1/info", ATTND_R_INFO},
};

/* A request target longer than this, or with more query parameters, is
 * refused with 414: libmicrohttpd keeps each parameter in the connection's
 * fixed memory pool, and one that runs out there leaves the connection
 * without a reply. */
#define MAX_TARGET 8192
#define MAX_QUERY_PARAMS 100

/* libmicrohttpd's per-connection memory: the request line and headers, and
 * their index. */
#define CONNECTION_MEMORY ((size_t)64 * 1024)

/* The first buffer of a body, doubled as bytes arrive. */
#define BODY_START ((size_t)64 * 1024)

/* Connections the kernel queues before attnd accepts them. */
#define LISTEN_BACKLOG 1024

static const char json_type[] = ATTND_JSON_TYPE;

_Static_assert(ATTND_CONN_ID_MAX >= ATTND_REQID_MAX, "an upload's record must hold its request id");

/* A reply this layer made for an upload it refuses in mid-body, for the
 * registry's cut (attnd_conns_cut's arg). */
typedef struct cut_reply {
  int status;
  const char *body;
  size_t len;
} cut_reply;

/* ---- replies ------------------------------------------------------------- */

static void set_json(attnd_req *r, int status, attn_sbuf *b) {
  if (b->oom) {
    free(b->p);
    attnd_req_fail(r, ATTND_EOUT_OF_MEMORY, "out of memory building the reply");
    return;
  }
  attnd_req_reply(r, status, b->p, b->len, json_type);
}

/* ---- CORS ----------------------------------------------------------------- */

/* What a browser may send and read beyond the CORS-safelisted headers. */
#define CORS_ALLOW_HEADERS                                                \
  "Authorization, Content-Type, Content-Encoding, Accept, X-Request-Id, " \
  "Inference-Header-Content-Length"
#define CORS_EXPOSE_HEADERS \
  "X-Request-Id, Retry-After, Inference-Header-Content-Length, Server-Timing"
/* Seconds a browser may cache a preflight's answer. */
#define CORS_MAX_AGE "600"

/* --cors-origin's headers on every reply: the origin allowed, and Vary:
 * Origin when it is one origin, so that caches do not serve one origin's
 * reply to another. */
static void add_cors(const attnd_req *r, struct MHD_Response *resp) {
  const char *origin = r->srv->cfg->cors_origin;
  if (!*origin)
    return;
  MHD_add_response_header(resp, "Access-Control-Allow-Origin", origin);
  MHD_add_response_header(resp, "Access-Control-Expose-Headers", CORS_EXPOSE_HEADERS);
  if (strcmp(origin, "*"))
    MHD_add_response_header(resp, MHD_HTTP_HEADER_VARY, "Origin");
  if (r->status == MHD_HTTP_NO_CONTENT && !strcmp(r->method, MHD_HTTP_METHOD_OPTIONS)) {
    MHD_add_response_header(resp, "Access-Control-Allow-Methods", "GET, HEAD, POST, OPTIONS");
    MHD_add_response_header(resp, "Access-Control-Allow-Headers", CORS_ALLOW_HEADERS);
    MHD_add_response_header(resp, "Access-Control-Max-Age", CORS_MAX_AGE);
  }
}

/* A computed request's time in the server (RFC's Server-Timing, which a
 * browser's fetch can read): queued, decoding + engine + encoding, and
 * from its first byte until now, in milliseconds. */
static void add_server_timing(const attnd_req *r, struct MHD_Response *resp) {
  if (!attnd_req_computes(r) || r->t_started <= 0 || r->t_done <= 0)
    return;
  char v[160];
  snprintf(v, sizeof v, "queue;dur=%.3f, compute;dur=%.3f, total;dur=%.3f",
           (r->t_started - r->t_admitted) * 1e3, (r->t_done - r->t_started) * 1e3,
           (attn_now() - r->t_received) * 1e3);
  MHD_add_response_header(resp, "Server-Timing", v);
}

/* The console's security and caching headers, and its ETag. */
static void add_console_headers(const attnd_req *r, struct MHD_Response *resp) {
  if (r->route != ATTND_R_CONSOLE || (r->status != 200 && r->status != MHD_HTTP_NOT_MODIFIED))
    return;
  for (const attnd_console_header *h = attnd_console_headers; h->name; h++)
    MHD_add_response_header(resp, h->name, h->value);
  MHD_add_response_header(resp, MHD_HTTP_HEADER_ETAG, r->asset->etag);
}

/* Hands r's reply to libmicrohttpd. */
static enum MHD_Result queue_reply(attnd_req *r) {
  if (!r->resp) /* out of memory for the error body itself */
    attnd_req_fail(r, ATTND_EOUT_OF_MEMORY, "out of memory");
  struct MHD_Response *resp = MHD_create_response_from_buffer_with_free_callback(
      r->resp_len, r->resp ? r->resp : (char *)"", r->resp ? free : NULL);
  if (!resp)
    return MHD_NO;
  r->bytes_out = r->resp_len;
  r->resp = NULL; /* libmicrohttpd frees it with the response */
  /* mhd_shim.c tells attnd's replies from libmicrohttpd's own by these */
  if (r->status != MHD_HTTP_NO_CONTENT)
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, r->ctype ? r->ctype : json_type);
  MHD_add_response_header(resp, ATTND_REQID_HEADER, r->id);
  add_cors(r, resp);
  add_server_timing(r, resp);
  add_console_headers(r, resp);
  if (r->status == MHD_HTTP_UNAUTHORIZED)
    MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer realm=\"attnd\"");
  if (r->retry_after)
    MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, "1");
  if (r->close)
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
  if (r->resp_json_len) {
    char n[24];
    snprintf(n, sizeof n, "%zu", r->resp_json_len);
    MHD_add_response_header(resp, "Inference-Header-Content-Length", n);
  }
  if (r->status == MHD_HTTP_METHOD_NOT_ALLOWED)
    MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW,
                            attnd_req_computes(r) ? "POST" : "GET, HEAD");
  enum MHD_Result ok = MHD_queue_response(r->conn, (unsigned)r->status, resp);
  MHD_destroy_response(resp);
  r->queued = true;
  return ok;
}

/* ---- the GET endpoints ---------------------------------------------------- */

static void get_info(attnd_req *r) {
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
                   "\"max_head_dim\": %d, \"min_upload_rate\": %.0f, \"max_running\": %d, "
                   "\"max_running_per_client\": %d, \"max_pairs\": %llu}, \"build\": "
                   "{\"cuda\": %s, \"compiler\": ",
                   (unsigned long long)c->max_body, c->max_queue, c->timeout, c->idle_timeout,
                   c->header_timeout, s->max_connections, c->max_connections_per_client,
                   c->drain_timeout, ATTN_MAX_HEAD_DIM, c->min_upload_rate, s->max_running,
                   s->client_cap == INT_MAX ? 0 : s->client_cap, (unsigned long long)c->max_pairs,
                   cuda);
  attn_sbuf_json_str(&b, __VERSION__);
  attn_sbuf_printf(&b, ", \"threads\": %d}, \"security\": {\"api_key\": %s, \"tls\": %s, ",
                   attn_engine_threads(s->engine), *c->api_key ? "true" : "false",
                   s->tls_cert_pem ? "true" : "false");
  attn_sbuf_puts(&b, "\"cors_origin\": ");
  if (*c->cors_origin)
    attn_sbuf_json_str(&b, c->cors_origin);
  else
    attn_sbuf_puts(&b, "null");
  attn_sbuf_puts(&b, "}}\n");
  set_json(r, 200, &b);
}

static void get_plan(attnd_req *r) {
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
  set_json(r, 200, &b);
}

/* Whether the backend requests run on can still take jobs (a CUDA device
 * that failed cannot). */
static bool backend_ready(attnd_server *s, char *why, size_t cap) {
  attn_backend_info info[ATTND_MAX_BACKENDS];
  int n = attn_engine_backends(s->engine, info, ATTND_MAX_BACKENDS);
  for (int i = 0; i < n && i < ATTND_MAX_BACKENDS; i++)
    if (!strcmp(info[i].name, s->backend) && !info[i].available) {
      snprintf(why, cap, "the %s backend cannot run jobs: %.150s", info[i].name, info[i].detail);
      return false;
    }
  return true;
}

/* What the start-up self-check disabled in the backend requests run on,
 * as one line; false when nothing. */
static bool disabled_kernels(attnd_server *s, char *out, size_t cap) {
  attn_backend_info info[ATTND_MAX_BACKENDS];
  int n = attn_engine_backends(s->engine, info, ATTND_MAX_BACKENDS);
  size_t at = 0;
  out[0] = 0;
  for (int i = 0; i < n && i < ATTND_MAX_BACKENDS; i++)
    for (int k = 0; k < info[i].ndisabled && at < cap; k++)
      if (!strcmp(s->backend, "auto") || !strcmp(info[i].name, s->backend))
        at += (size_t)snprintf(out + at, cap - at, "%sthe %s self-check disabled %s (%s)",
                               at ? "; " : "", info[i].name, info[i].disabled[k].kernel,
                               info[i].disabled[k].why);
  return at > 0;
}

int attnd_server_ready(attnd_server *s, char *why, size_t cap) {
  if (atomic_load(&s->draining)) {
    snprintf(why, cap, "the server is draining and takes no new work");
    return ATTND_ESHUTTING_DOWN;
  }
  return backend_ready(s, why, cap) ? 0 : ATTND_EBACKEND_UNAVAILABLE;
}

/* The registry's counters, after the other series of /metrics. */
static void render_conns(attn_sbuf *b, attnd_conns *c) {
  uint64_t n[ATTND_CLOSE_REASONS];
  attnd_conns_counts(c, n);
  attn_sbuf_puts(b, "# HELP attnd_connections_closed_total Connections the server closed or "
                    "refused to keep others from being locked out, by reason.\n"
                    "# TYPE attnd_connections_closed_total counter\n");
  for (int i = 0; i < ATTND_CLOSE_REASONS; i++)
    attn_sbuf_printf(b, "attnd_connections_closed_total{reason=\"%s\"} %llu\n",
                     attnd_conns_reason_name((attnd_conn_reason)i), (unsigned long long)n[i]);
}

/* The body budget in use: what uploads, queued and running jobs hold. */
static void render_budget(attn_sbuf *b, attnd_server *s) {
  const attnd_config *c = s->cfg;
  attn_sbuf_printf(b,
                   "# HELP attnd_body_bytes Bytes of request bodies (and their decodes) the "
                   "server holds, of the budget --max-queue x --max-body (%llu): bytes that "
                   "arrived, never what a client declared.\n"
                   "# TYPE attnd_body_bytes gauge\nattnd_body_bytes %llu\n",
                   (unsigned long long)c->max_queue * c->max_body,
                   (unsigned long long)atomic_load(&s->body_bytes));
}

/* The backend requests run on and its kernel ("avx512bf16 kernel, 2
 * threads"), as an info series a dashboard can show beside the rates. */
static void render_backend(attn_sbuf *b, const attnd_server *s) {
  attn_backend_info info[8];
  int n = attn_engine_backends(s->engine, info, 8);
  attn_sbuf_puts(b, "# HELP attnd_backend_info The backend requests run on, and its kernel.\n"
                    "# TYPE attnd_backend_info gauge\n");
  for (int i = 0; i < n && i < 8; i++) {
    if (strcmp(info[i].name, s->backend))
      continue;
    char detail[200];
    attn_quote(detail, sizeof detail, info[i].detail, strlen(info[i].detail));
    attn_sbuf_printf(b, "attnd_backend_info{backend=\"%s\",detail=\"%s\"} 1\n", info[i].name,
                     detail);
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
  char esc[160];
  attn_quote(esc, sizeof esc, names, strlen(names));
  attn_sbuf_puts(b, "# HELP attnd_build_info The version and the engine backends of this build.\n"
                    "# TYPE attnd_build_info gauge\n");
  attn_sbuf_printf(b, "attnd_build_info{version=\"%s\",backends=\"%s\"} 1\n", ATTN_VERSION, esc);
}

/* A console file, or 304 when the browser holds these bytes already. */
static void get_console(attnd_req *r) {
  const attnd_console_asset *a = r->asset;
  const char *inm =
      MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_IF_NONE_MATCH);
  if (attnd_console_not_modified(inm, a->etag)) {
    attnd_req_reply(r, MHD_HTTP_NOT_MODIFIED, malloc(1), 0, a->type);
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

static void answer_get(attnd_req *r) {
  attnd_server *s = r->srv;
  attn_sbuf b = {0};
  switch (r->route) {
  case ATTND_R_HEALTHZ:
    attn_sbuf_puts(&b, "{\"status\": \"ok\"}\n");
    set_json(r, 200, &b);
    break;
  case ATTND_R_READYZ: {
    char why[200];
    int code = attnd_server_ready(s, why, sizeof why);
    if (code)
      attnd_req_fail(r, code, why);
    else {
      attn_sbuf_puts(&b, "{\"status\": \"ready\"");
      if (disabled_kernels(s, why, sizeof why)) {
        attn_sbuf_puts(&b, ", \"detail\": ");
        attn_sbuf_json_str(&b, why);
      }
      attn_sbuf_puts(&b, "}\n");
      set_json(r, 200, &b);
    }
    break;
  }
  case ATTND_R_METRICS: {
    size_t len = 0;
    char *text = attnd_metrics_render(s->metrics, &len);
    attn_sbuf m = {.p = text, .len = len, .cap = len};
    if (text) {
      render_conns(&m, &s->conns);
      render_budget(&m, s);
      render_backend(&m, s);
      render_build(&m, s);
    }
    if (text && !m.oom)
      attnd_req_reply(r, 200, m.p, m.len, "text/plain; version=0.0.4; charset=utf-8");
    else {
      free(m.p);
      attnd_req_fail(r, ATTND_EOUT_OF_MEMORY, "out of memory rendering the metrics");
    }
    break;
  }
  case ATTND_R_INFO: get_info(r); break;
  case ATTND_R_PLAN: get_plan(r); break;
  case ATTND_R_CONSOLE: get_console(r); break;
  default: attnd_v2_answer_get(r); break;
  }
}

/* ---- request parsing ---------------------------------------------------- */

/* The query string again, percent-encoded, from libmicrohttpd's decoded
 * arguments: the proto parsers read query strings. */
static enum MHD_Result add_arg(void *cls, enum MHD_ValueKind kind, const char *key,
                               const char *value) {
  (void)kind;
  attn_sbuf *b = cls;
  const char *parts[2] = {key, value};
  if (b->len)
    attn_sbuf_put(b, "&", 1);
  for (int i = 0; i < 2 && parts[i]; i++) {
    if (i)
      attn_sbuf_put(b, "=", 1);
    for (const unsigned char *p = (const unsigned char *)parts[i]; *p; p++) {
      if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
          *p == '-' || *p == '_' || *p == '.' || *p == '~')
        attn_sbuf_put(b, (const char *)p, 1);
      else
        attn_sbuf_printf(b, "%%%02X", *p);
    }
  }
  return MHD_YES;
}

/* The media type of a header value: "Application/JSON; charset=utf-8" is
 * application/json. */
static bool media_is(const char *v, const char *type) {
  if (!v)
    return false;
  while (*v == ' ')
    v++;
  size_t n = strlen(type);
  if (strncasecmp(v, type, n) != 0)
    return false;
  v += n;
  while (*v == ' ' || *v == '\t')
    v++;
  return *v == 0 || *v == ';';
}

static bool accepts_binary(struct MHD_Connection *conn) {
  const char *a = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_ACCEPT);
  if (!a)
    return false;
  /* A list: binary when octet-stream is in it and JSON is not preferred
   * before it. */
  const char *bin = strcasestr(a, "application/octet-stream");
  const char *js = strcasestr(a, "application/json");
  return bin && (!js || bin < js);
}

/*
 * A /v2 infer request: JSON, optionally followed by binary tensors whose
 * start Inference-Header-Content-Length gives. tritonclient sends no
 * Content-Type, so none is needed; one that names neither JSON nor binary
 * data is refused. false when r has its reply.
 */
static bool v2_framing(attnd_req *r, const char *ct) {
  char msg[240], what[72];
  if (ct && !media_is(ct, "application/json") && !media_is(ct, "application/octet-stream")) {
    attn_quote(what, sizeof what, ct, strlen(ct));
    snprintf(msg, sizeof msg,
             "Content-Type \"%s\" is not one the inference protocol reads; send "
             "application/json, application/octet-stream or none",
             what);
    attnd_req_fail(r, ATTND_EUNSUPPORTED_MEDIA_TYPE, msg);
    return false;
  }
  const char *h =
      MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Inference-Header-Content-Length");
  if (!h)
    return true;
  char *end;
  errno = 0;
  unsigned long long v = strtoull(h, &end, 10);
  if (*h < '0' || *h > '9' || *end || errno || v > SIZE_MAX - 1) {
    attn_quote(what, sizeof what, h, strlen(h));
    snprintf(msg, sizeof msg,
             "Inference-Header-Content-Length \"%s\" is not a byte count (the JSON's length)",
             what);
    attnd_req_fail(r, ATTN_PROTO_EFRAMING, msg);
    return false;
  }
  r->v2_json_len = (size_t)v;
  return true;
}

/* Content-Encoding: gzip and deflate bodies are decoded before the codec
 * (loop.c), others are refused with 415 (RFC 9110 15.5.16). false when r
 * has its reply. */
static bool accept_encoding(attnd_req *r) {
  const char *ce =
      MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_ENCODING);
  r->encoding = attnd_encoding_of(ce);
  if (r->encoding != ATTND_ENC_UNKNOWN)
    return true;
  char msg[200], what[72];
  attn_quote(what, sizeof what, ce, strlen(ce));
  snprintf(msg, sizeof msg,
           "Content-Encoding \"%s\" is not one this server reads; send gzip, deflate or none",
           what);
  attnd_req_fail(r, ATTND_EUNSUPPORTED_MEDIA_TYPE, msg);
  return false;
}

/* The first callback of a POST /attention: refuse what can be refused
 * before the body; returns false when r already has its reply. */
static bool begin_post(attnd_req *r) {
  attnd_server *s = r->srv;
  struct MHD_Connection *conn = r->conn;
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
  r->fd = ci ? ci->connect_fd : -1;
  attnd_upload_begin(r);
  if (atomic_load(&s->draining)) {
    attnd_req_fail(r, ATTND_ESHUTTING_DOWN, "the server is draining and takes no new work");
    return false;
  }
  const char *ct = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
  if (r->v2) {
    /* the inference protocol's codec reads the body whatever it is called */
    if (!v2_framing(r, ct))
      return false;
  } else if (media_is(ct, "application/json")) {
    r->json_in = true;
    r->binary_out = accepts_binary(conn);
  } else if (media_is(ct, "application/octet-stream")) {
    r->binary_out = true;
  } else {
    char msg[200], what[72];
    const char *given = ct ? ct : "(none)";
    attn_quote(what, sizeof what, given, strlen(given));
    snprintf(msg, sizeof msg,
             "Content-Type \"%s\" is not one this server reads; send application/json or "
             "application/octet-stream (safetensors)",
             what);
    attnd_req_fail(r, ATTND_EUNSUPPORTED_MEDIA_TYPE, msg);
    return false;
  }
  if (!accept_encoding(r))
    return false;
  const char *cl =
      MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
  uint64_t want = 0;
  if (cl) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(cl, &end, 10);
    want = (*cl && !*end && !errno) ? v : UINT64_MAX;
  }
  if (want > s->cfg->max_body) {
    char msg[200], what[40];
    attn_quote(what, sizeof what, cl, strlen(cl));
    snprintf(msg, sizeof msg, "Content-Length %s is over the limit of %llu bytes (--max-body)",
             what, (unsigned long long)s->cfg->max_body);
    attnd_req_fail(r, ATTND_ETOO_LARGE, msg);
    return false;
  }
  r->declared = cl ? want : UINT64_MAX;
  r->cap = cl && want < BODY_START ? (size_t)want : BODY_START;
  if (!attnd_body_reserve(r, r->cap)) {
    attnd_body_over_budget(r);
    return false;
  }
  r->body = malloc(r->cap ? r->cap : 1);
  if (!r->body) {
    attnd_req_fail(r, ATTND_EOUT_OF_MEMORY, "out of memory for the request body");
    return false;
  }
  return true;
}

/* r's body buffer grown to hold need bytes: doubled, up to what the body
 * can be (its Content-Length, or --max-body); false with r's reply set. */
static bool grow_body(attnd_req *r, size_t need) {
  uint64_t limit = r->declared != UINT64_MAX ? r->declared : r->srv->cfg->max_body;
  size_t cap = r->cap * 2 > need ? r->cap * 2 : need;
  if (cap > limit)
    cap = (size_t)limit;
  if (!attnd_body_reserve(r, cap - r->cap)) {
    attnd_body_over_budget(r);
    return false;
  }
  /* glibc moves a block this large by remapping its pages, not copying */
  char *b = realloc(r->body, cap);
  if (!b) {
    attnd_req_fail(r, ATTND_EOUT_OF_MEMORY, "out of memory for the request body");
    return false;
  }
  r->body = b;
  r->cap = cap;
  return true;
}

/* Appends a piece of body; false when r has its error reply. */
static bool take_body(attnd_req *r, const char *data, size_t n) {
  uint64_t max = r->srv->cfg->max_body;
  if (r->len + n > max) {
    char msg[160];
    snprintf(msg, sizeof msg, "the body grew past the limit of %llu bytes (--max-body)",
             (unsigned long long)max);
    attnd_req_fail(r, ATTND_ETOO_LARGE, msg);
    return false;
  }
  if (r->len + n > r->cap && !grow_body(r, r->len + n))
    return false;
  memcpy(r->body + r->len, data, n);
  r->len += n;
  return true;
}

static attnd_req *new_req(attnd_server *s, struct MHD_Connection *conn) {
  attnd_req *r = attnd_req_new(s);
  if (!r)
    return NULL;
  r->conn = conn;
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  r->link = ci ? ci->socket_context : NULL;
  if (r->link)
    r->link->req = r;
  return r;
}

static void target_refused(attnd_req *r, const char *why) {
  if (r->bad_target)
    return;
  r->bad_target = why;
  r->bad_target_code = ATTND_EBAD_REQUEST;
}

/*
 * libmicrohttpd's unescaper, replaced (MHD_OPTION_UNESCAPE_CALLBACK): it
 * runs on each query key and value, then on the path, in place. "%00"
 * would end the string there for attnd and not for others, and "%2F" in
 * the path would become a separator that a proxy routing by path never
 * saw: the first is refused, the second left as it is.
 */
static size_t on_unescape(void *cls, struct MHD_Connection *conn, char *s) {
  (void)cls;
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  attnd_conn *k = ci ? ci->socket_context : NULL;
  attnd_req *r = k ? k->req : NULL;
  bool nul = false;
  /* the path is the string that starts where the target did */
  size_t n = attnd_parse_unescape(s, r && s == r->target, &nul);
  if (nul && r)
    target_refused(r, "the request target holds %00 (a NUL byte)");
  return n;
}

/*
 * libmicrohttpd's first look at a request, once its request line is in and
 * before it parses the query: the request starts here, so that a request
 * libmicrohttpd refuses later is still logged. A target past the limits has
 * its query cut before libmicrohttpd stores it, and is refused with 414 once
 * the headers are in.
 */
static void *on_target(void *cls, const char *uri, struct MHD_Connection *conn) {
  attnd_req *r = new_req(cls, conn);
  if (!r)
    return NULL;
  snprintf(r->path, sizeof r->path, "%s", uri);
  size_t params = 0;
  char *q = strchr(uri, '?');
  for (const char *p = q; p && *p; p++)
    params += *p == '&' || p == q;
  r->target = uri;
  r->target_end = uri + strlen(uri);
  r->bad_target_code = ATTND_EURI_TOO_LONG;
  if (strlen(uri) > MAX_TARGET)
    r->bad_target = "the request target is longer than 8192 bytes";
  else if (params > MAX_QUERY_PARAMS)
    r->bad_target = "the query string has more than 100 parameters";
  else if (strpbrk(uri, " \t"))
    target_refused(r, "the request target holds a space or tab; percent-encode it (%20)");
  if (r->bad_target && q)
    q[1] = 0;
  return r;
}

/* The path of a target in absolute form ("http://host:8080/healthz", which
 * HTTP/1.1 servers must accept), or the target itself. */
static const char *origin_path(const char *url) {
  const char *p = !strncasecmp(url, "http://", 7)    ? url + 7
                  : !strncasecmp(url, "https://", 8) ? url + 8
                                                     : NULL;
  if (!p)
    return url;
  p = strchr(p, '/');
  return p ? p : "/";
}

/* ---- the head: one reading of where a request ends (parse.h) ------------- */

/* The walk over a request's headers: parse.h's rules, and whether a value
 * holds a NUL byte, which C strings hide. */
typedef struct head_walk {
  attnd_head h;
  const char *last; /* the previous header's value */
  bool nul;
} head_walk;

/*
 * Whether a value ends where its line did. libmicrohttpd 0.9.75 keeps each
 * header line where it was read, its colon and line end overwritten with
 * NULs, one line after the other: a value's string ends one (LF) or two
 * (CRLF) bytes before the next header's name, and the last one's is
 * followed by NULs (its line end, then the blank line's). A NUL inside a
 * value ends its string early; a folded line (obs-fold) is moved elsewhere.
 * Both are refused (RFC 9112 §5.2 allows 400 for obs-fold).
 */
static bool value_whole(const char *value, const char *next_name) {
  const char *end = value + strlen(value);
  return next_name ? next_name == end + 1 || next_name == end + 2 : end[1] == 0;
}

static enum MHD_Result walk_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                   const char *value) {
  (void)kind;
  head_walk *w = cls;
  if (w->last && !value_whole(w->last, key))
    w->nul = true;
  attnd_head_add(&w->h, key, value);
  w->last = value ? value : "";
  return MHD_YES;
}

/*
 * Refuses heads that two HTTP parsers could read differently (a proxy in
 * front and libmicrohttpd here), which is how a second request is
 * smuggled: answered at once, the connection is closed and no byte after
 * the headers is read. false when r has its reply.
 */
static bool check_head(attnd_req *r, const char *version) {
  head_walk w = {0};
  MHD_get_connection_values(r->conn, MHD_HEADER_KIND, walk_header, &w);
  if (w.last && !value_whole(w.last, NULL))
    w.nul = true;
  char msg[300];
  int code = attnd_head_check(&w.h, version, msg, sizeof msg);
  if (!code && w.nul) {
    code = ATTND_EBAD_REQUEST;
    snprintf(msg, sizeof msg,
             "a header value holds a NUL byte, or a header is folded over two lines; send each "
             "header on one line, without NUL");
  }
  if (code) {
    attnd_req_fail(r, code, msg);
    return false;
  }
  r->has_body = attnd_head_has_body(&w.h);
  r->host = w.h.host;
  return true;
}

static void route_of(attnd_req *r, const char *url, const char *method) {
  const char *path = origin_path(url);
  snprintf(r->method, sizeof r->method, "%s", method);
  snprintf(r->path, sizeof r->path, "%s", path);
  r->route = ATTND_R_NONE;
  for (size_t i = 0; i < sizeof routes / sizeof *routes; i++)
    if (!strcmp(path, routes[i].path))
      r->route = routes[i].route;
  if ((r->asset = attnd_console_find(path)))
    r->route = ATTND_R_CONSOLE;
  attnd_v2_route(r, path);
  attn_sbuf q = {0};
  MHD_get_connection_values(r->conn, MHD_GET_ARGUMENT_KIND, add_arg, &q);
  r->query = q.oom ? NULL : q.p;
}

/* A CORS preflight (OPTIONS, with --cors-origin): answered 204 on any
 * path, before the key check, since browsers send preflights without
 * credentials. true when r has its reply. */
static bool preflight(attnd_req *r) {
  if (!*r->srv->cfg->cors_origin || strcmp(r->method, MHD_HTTP_METHOD_OPTIONS))
    return false;
  /* an empty body, but not NULL: queue_reply reads NULL as out of memory */
  attnd_req_reply(r, MHD_HTTP_NO_CONTENT, malloc(1), 0, NULL);
  return true;
}

/* The API key check (--api-key): true when r may go on; else r has its
 * 401. Probes (attnd_auth_open) need no key, nor does the console, which
 * holds no data and asks for the key its API calls send. */
static bool authorized(attnd_req *r) {
  const char *key = r->srv->cfg->api_key;
  if (!*key || attnd_auth_open(r->path) || r->route == ATTND_R_CONSOLE)
    return true;
  const char *h =
      MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
  if (attnd_auth_check(h, key))
    return true;
  attnd_req_fail(r, ATTND_EUNAUTHORIZED,
                 h ? "the API key in the Authorization header is not this server's"
                   : "this server needs an API key: send the header \"Authorization: Bearer "
                     "<key>\"");
  return false;
}

/* Whether a keyless server serves r: its Host is one the server is reached
 * by (a DNS-rebinding page sends its own name), and a page of another
 * origin computes nothing (/v2 reads bodies without a Content-Type, which
 * browsers send without asking first). false when r has its 403. */
static bool keyless_ok(attnd_req *r, bool post) {
  const attnd_config *c = r->srv->cfg;
  char msg[400], q[128];
  if (*c->api_key)
    return true;
  if (!attnd_parse_host_allowed(r->host, c->allowed_hosts)) {
    attn_quote(q, sizeof q, r->host, strlen(r->host));
    snprintf(msg, sizeof msg,
             "this server has no API key and answers only to IP addresses, localhost and "
             "--allowed-hosts; Host \"%s\" is none of them: add it to --allowed-hosts, or "
             "set an API key",
             q);
  } else {
    const char *origin = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Origin");
    if (!post || attnd_parse_origin_allowed(origin, r->host, c->cors_origin))
      return true;
    attn_quote(q, sizeof q, origin, strlen(origin));
    snprintf(msg, sizeof msg,
             "a page of origin \"%s\" may not call this server (it has no API key); allow "
             "the origin with --cors-origin",
             q);
  }
  attnd_req_fail(r, ATTND_EFORBIDDEN, msg);
  return false;
}

/* What r's head alone refuses: its target, its headers, and what a keyless
 * server answers. A target that libmicrohttpd read past a NUL byte has its
 * string end before the HTTP version that followed it on the line. false
 * when r has its reply, which then closes the connection. */
static bool head_ok(attnd_req *r, const char *version, bool post) {
  if (r->target_end && version != r->target_end + 1)
    target_refused(r, "the request target holds a NUL byte");
  if (r->bad_target)
    attnd_req_fail(r, r->bad_target_code, r->bad_target);
  else if (check_head(r, version) && keyless_ok(r, post))
    return true;
  r->close = true;
  return false;
}

/* The first callback, once the headers are in: route, and decide what can
 * be decided before the body. */
static enum MHD_Result first_call(attnd_req *r, const char *url, const char *method,
                                  const char *version) {
  attnd_server *s = r->srv;
  r->started = true;
  if (r->link) {
    attnd_conns_set(&s->conns, r->link, ATTND_CONN_BUSY, attn_now());
    /* the key of its fair share of the running slots (loop.c) */
    snprintf(r->client, sizeof r->client, "%s", r->link->client);
  }
  route_of(r, url, method);
  const char *id = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, ATTND_REQID_HEADER);
  if (attnd_reqid_valid(id))
    snprintf(r->id, sizeof r->id, "%s", id);
  bool post = !strcmp(method, MHD_HTTP_METHOD_POST);
  bool get = !strcmp(method, MHD_HTTP_METHOD_GET) || !strcmp(method, MHD_HTTP_METHOD_HEAD);
  if (!head_ok(r, version, post))
    return queue_reply(r);
  if (r->has_body && r->link)
    attnd_conns_upload(&s->conns, r->link, r->id, r->t_received + s->cfg->timeout, attn_now());
  if (preflight(r) || !authorized(r))
    return post ? queue_reply(r) : MHD_YES;
  if (r->route == ATTND_R_NONE && r->v2) {
    attnd_v2_not_found(r);
  } else if (r->route == ATTND_R_NONE) {
    char msg[280], path[96];
    attn_quote(path, sizeof path, r->path, strlen(r->path));
    snprintf(msg, sizeof msg,
             "no such path \"%s\" (try POST /attention, POST /attention/backward, GET "
             "/attention/plan, /healthz, /readyz, /metrics, /v1/info, /v2, or / for the web "
             "console)",
             path);
    attnd_req_fail(r, ATTND_ENOT_FOUND, msg);
  } else if (attnd_req_computes(r) ? !post : !get) {
    char msg[200], m[24];
    attn_quote(m, sizeof m, method, strlen(method));
    snprintf(msg, sizeof msg, "%s is not allowed on %.60s (use %s)", m, r->path,
             attnd_req_computes(r) ? "POST" : "GET");
    attnd_req_fail(r, ATTND_EMETHOD_NOT_ALLOWED, msg);
  } else if (!attnd_req_computes(r)) {
    answer_get(r);
  } else if (!begin_post(r)) {
    /* Refused before the body: reply now, and libmicrohttpd closes the
     * connection rather than read a body nobody wants. */
    return queue_reply(r);
  }
  /* Other replies go out once the request is complete, which keeps the
   * connection alive for the next one. */
  return MHD_YES;
}

/* Bytes of body read and dropped after a reply was decided (413 on a
 * chunked body, 404 or 405 with a body) before the connection is cut
 * instead: libmicrohttpd takes a reply only before the body or after all
 * of it. */
#define DISCARD_LIMIT ((size_t)64 << 20)

/* The body is whole: the registry no longer holds it as an upload. */
static void body_done(attnd_req *r) {
  if (!r->has_body)
    return;
  r->has_body = false;
  if (r->link)
    attnd_conns_set(&r->srv->conns, r->link, ATTND_CONN_BUSY, attn_now());
}

/* A piece of body. A body refused in mid-way (past --max-body or the
 * memory budget) is answered and cut at once: libmicrohttpd takes a reply
 * only before the body or after all of it. */
static enum MHD_Result on_body(attnd_req *r, const char *data, size_t n) {
  if (r->link)
    attnd_conns_upload_add(&r->srv->conns, r->link, n);
  if (r->status) { /* the reply is decided (404, 405); drop the body, up to a point */
    r->discarded += n;
    return r->discarded > DISCARD_LIMIT ? MHD_NO : MHD_YES;
  }
  if (take_body(r, data, n))
    return MHD_YES;
  cut_reply c = {r->status, r->resp, r->resp_len};
  if (r->link)
    attnd_conns_cut(&r->srv->conns, r->link, ATTND_CLOSE_BODY_REFUSED, &c);
  return MHD_NO;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls) {
  attnd_server *s = cls;
  attnd_req *r = *con_cls;
  if (!r && !(r = *con_cls = new_req(s, conn)))
    return MHD_NO;
  if (!r->started)
    return first_call(r, url, method, version);
  if (r->queued) {
    *upload_size = 0;
    return MHD_YES;
  }
  if (*upload_size) {
    size_t n = *upload_size;
    *upload_size = 0;
    return on_body(r, upload, n);
  }
  body_done(r);
  if (r->gone) /* the client left before its reply: close, send nothing */
    return MHD_NO;
  if (r->status)
    return queue_reply(r);
  if (!r->submitted) {
    r->submitted = true;
    atomic_fetch_add(&s->replying, 1);
    MHD_suspend_connection(conn);
    attnd_loop_submit(s, r);
    attnd_upload_end(r); /* after the handoff: a drain sees one or the other */
  }
  return MHD_YES;
}

/* The status a request that got no reply of its own is logged with: what
 * the registry answered when it cut the upload (0 there: a client that was
 * gone), 408 for libmicrohttpd's idle timeout, else 499. */
static void unanswered(attnd_server *s, attnd_req *r, enum MHD_RequestTerminationCode why) {
  int status = 0;
  size_t bytes = 0;
  if (r->link && attnd_conns_was_cut(&s->conns, r->link, &status, &bytes)) {
    r->status = status ? status : 499;
    r->bytes_out = bytes;
    return;
  }
  r->status = why == MHD_REQUEST_TERMINATED_TIMEOUT_REACHED ? 408 : 499;
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode why) {
  (void)conn;
  attnd_server *s = cls;
  attnd_req *r = *con_cls;
  if (!r)
    return;
  if (!r->queued) /* the client left before a reply */
    unanswered(s, r, why);
  attnd_req_account(s, r);
  if (r->link) {
    r->link->req = NULL;
    attnd_conns_set(&s->conns, r->link, ATTND_CONN_IDLE, attn_now());
    r->link = NULL;
  }
  attnd_upload_end(r);
  if (r->submitted)
    atomic_fetch_sub(&s->replying, 1);
  /* A job answered early may still be in the engine: the last reference
   * frees r. */
  attnd_req_unref(r);
  *con_cls = NULL;
}

/* ---- libmicrohttpd's own refusals ------------------------------------------ */

/* Writes a JSON error reply straight to the socket and ends the
 * connection's sending side; what the client sent after it is read and
 * dropped first where it is already there, so that closing does not reset
 * the connection before the client reads the reply. Returns the body bytes
 * sent. */
static size_t send_error_reply(int fd, int status, const char *body, size_t blen, const char *id) {
  char msg[2048];
  int n =
      snprintf(msg, sizeof msg,
               "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
               "%s%s%s%sConnection: close\r\n\r\n%.*s",
               status, attnd_err_reason(status), body ? blen : 0, id ? ATTND_REQID_HEADER ": " : "",
               id ? id : "", id ? "\r\n" : "", status == 503 ? "Retry-After: 1\r\n" : "",
               body ? (int)blen : 0, body ? body : "");
  size_t len = n > 0 && (size_t)n < sizeof msg ? (size_t)n : 0;
  ssize_t sent = send(fd, msg, len, MSG_NOSIGNAL | MSG_DONTWAIT);
  sent = sent == (ssize_t)len ? (ssize_t)blen : 0; /* bytes_out counts the body */
  shutdown(fd, SHUT_WR);
  char sink[4096];
  for (int i = 0; i < 16 && recv(fd, sink, sizeof sink, MSG_DONTWAIT) > 0; i++)
    ;
  return sent > 0 ? (size_t)sent : 0;
}

/* libmicrohttpd's refusal as the JSON error of its status. */
static size_t send_refusal(int fd, const attnd_refusal *f, const char *id) {
  size_t blen = 0;
  char *body = attn_proto_error_body(f->code, f->message, &blen);
  size_t sent = send_error_reply(fd, f->status, body, blen, id);
  free(body);
  return sent;
}

/* Why the registry cut an upload, as the error code and message its reply
 * carries. */
static int cut_message(const attnd_server *s, const attnd_conn *k, attnd_conn_reason why, char *msg,
                       size_t cap) {
  double now = attn_now(), took = now - k->up_started;
  if (why == ATTND_CLOSE_BODY_TIMEOUT) {
    snprintf(msg, cap,
             "the body did not arrive whole within the %g s deadline (--timeout): %llu bytes "
             "came in %.1f s",
             s->cfg->timeout, (unsigned long long)k->up_bytes, took);
    return ATTND_EREQUEST_TIMEOUT;
  }
  if (why == ATTND_CLOSE_BODY_TOO_SLOW) {
    snprintf(msg, cap,
             "the body arrived at %.0f bytes/s over the last %g s, below --min-upload-rate "
             "(%.0f bytes/s)",
             k->up_window_rate, ATTND_RATE_WINDOW, s->cfg->min_upload_rate);
    return ATTND_EREQUEST_TIMEOUT;
  }
  snprintf(msg, cap,
           "every connection was busy and this was the slowest upload of the client holding "
           "the most: it was closed to let another client in; retry");
  return ATTND_ECONNECTIONS_FULL;
}

/*
 * The registry's hook for an upload cut short (conns.h): the JSON error
 * written straight to the socket, since libmicrohttpd takes no reply in
 * mid-body. arg is this layer's own reply (a cut_reply); without one the
 * registry's reason words it. A client that is gone gets nothing; over TLS
 * nothing can be written from here, and the connection only closes.
 */
static void on_cut(void *ctx, attnd_conn *k, attnd_conn_reason why, const void *arg) {
  attnd_server *s = ctx;
  if (why == ATTND_CLOSE_CLIENT_GONE)
    return;
  cut_reply own = {0};
  const cut_reply *c = arg;
  char msg[400];
  if (!c) {
    int code = cut_message(s, k, why, msg, sizeof msg);
    attnd_metrics_error(s->metrics, attnd_err_code(code));
    own.status = attnd_err_status(code);
    own.body = attn_proto_error_body(attnd_err_code(code), msg, &own.len);
    c = &own;
  }
  k->cut_status = c->status;
  if (!s->tls_cert_pem)
    k->cut_bytes = send_error_reply(k->fd, c->status, c->body, c->len, k->id);
  free((char *)(uintptr_t)own.body);
}

/* libmicrohttpd's only 500 of its own: a body's chunk-size line (with its
 * extensions) that does not fit the connection's buffer — the client's
 * doing, not the server's. */
static const attnd_refusal long_chunk_line = {
    400, "Bad Request", "bad_request",
    "a chunk-size line (with its extensions) is longer than the connection's buffer (under 64 "
    "KiB); send chunk sizes without long extensions or leading zeros"};

/* The log line and metrics of a refusal no request was made for (method
 * "-"; path names what was refused). */
static void account_without_request(attnd_server *s, int status, size_t out, const char *path) {
  attnd_req line = {.t_received = attn_now(), .status = status, .bytes_out = out};
  snprintf(line.method, sizeof line.method, "-");
  snprintf(line.path, sizeof line.path, "%s", path);
  attnd_req_account(s, &line);
}

/* A refusal in mid-body goes through the registry, which may be cutting
 * the same upload on the loop thread: one reply, never two. */
static size_t refuse_upload(attnd_server *s, attnd_conn *k, const attnd_refusal *f) {
  cut_reply c = {f->status, NULL, 0};
  char *body = attn_proto_error_body(f->code, f->message, &c.len);
  int status = 0;
  size_t out = 0;
  c.body = body;
  attnd_conns_cut(&s->conns, k, ATTND_CLOSE_BODY_REFUSED, &c);
  attnd_conns_was_cut(&s->conns, k, &status, &out);
  free(body);
  return out;
}

enum MHD_Result attnd_http_refuse(struct MHD_Connection *conn, unsigned status) {
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  attnd_conn *k = ci ? ci->socket_context : NULL;
  if (!k)
    return MHD_NO;
  attnd_server *s = k->owner;
  const attnd_refusal *f =
      status == MHD_HTTP_INTERNAL_SERVER_ERROR ? &long_chunk_line : attnd_err_refusal((int)status);
  attnd_req *r = k->req;
  attnd_metrics_error(s->metrics, f->code);
  /* Over TLS the socket carries records, not text: libmicrohttpd closes
   * the connection unanswered instead. */
  size_t out = r && r->has_body  ? refuse_upload(s, k, f)
               : s->tls_cert_pem ? 0
                                 : send_refusal(k->fd, f, r ? r->id : NULL);
  if (r) { /* on_completed logs it */
    r->status = f->status;
    r->queued = true;
    r->bytes_out = out;
    return MHD_NO;
  }
  /* a refusal before any request: not a connection left waiting */
  attnd_conns_set(&s->conns, k, ATTND_CONN_BUSY, attn_now());
  account_without_request(s, f->status, out, "-");
  return MHD_NO;
}

/* libmicrohttpd's notes that attnd logs better itself: each refused
 * request has its request line, and a connection closed on purpose (a client
 * that reset during its job) has its cancel line. */
static bool said_already(const char *msg) {
  static const char *const notes[] = {"Error processing request", "Closing connection (",
                                      "Application reported internal error",
                                      "Connection socket is closed when reading request"};
  for (size_t i = 0; i < sizeof notes / sizeof *notes; i++)
    if (!strncmp(msg, notes[i], strlen(notes[i])))
      return true;
  return false;
}

/* libmicrohttpd's diagnostics, one escaped line each. */
__attribute__((format(printf, 2, 0))) static void on_mhd_log(void *cls, const char *fmt,
                                                             va_list ap) {
  attnd_server *s = cls;
  char msg[512], esc[600];
  vsnprintf(msg, sizeof msg, fmt, ap);
  msg[strcspn(msg, "\n")] = 0;
  if (said_already(msg))
    return;
  attn_quote(esc, sizeof esc, msg, strlen(msg));
  attnd_log_note(s, ATTND_WARN, "libmicrohttpd", NULL, "%s", esc);
}

/* ---- connections ------------------------------------------------------------- */

static void client_text(const struct sockaddr *a, char *out, size_t cap) {
  if (a && a->sa_family == AF_INET)
    inet_ntop(AF_INET, &((const struct sockaddr_in *)(const void *)a)->sin_addr, out,
              (socklen_t)cap);
  else if (a && a->sa_family == AF_INET6)
    inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)(const void *)a)->sin6_addr, out,
              (socklen_t)cap);
  else
    snprintf(out, cap, "?");
}

/* Before accepting: room is made by closing the oldest idle connections. */
static enum MHD_Result on_accept(void *cls, const struct sockaddr *addr, socklen_t len) {
  (void)len;
  attnd_server *s = cls;
  char client[48];
  client_text(addr, client, sizeof client);
  return attnd_conns_admit(&s->conns, client, attn_now()) ? MHD_YES : MHD_NO;
}

/*
 * libmicrohttpd 0.9.75 closes a connection whose request line has no space
 * without calling or telling attnd, and after shutting its sending side,
 * so no reply can be written; it is logged as the 400 it is. Seen here as
 * a connection closed before its first request started, after its client
 * sent bytes, and before any deadline.
 */
static void note_unparsed(attnd_server *s, attnd_conn *k) {
  if (atomic_load(&s->stopping) || s->tls_cert_pem ||
      !attnd_conns_unparsed(&s->conns, k, attn_now()))
    return;
  attnd_metrics_error(s->metrics, attnd_err_code(ATTND_EBAD_REQUEST));
  account_without_request(s, 400, 0, "(a request line libmicrohttpd could not parse)");
}

static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_ctx,
                          enum MHD_ConnectionNotificationCode code) {
  attnd_server *s = cls;
  if (code == MHD_CONNECTION_NOTIFY_STARTED) {
    attnd_metrics_gauge_add(s->metrics, ATTND_GAUGE_CONNECTIONS, 1);
    const union MHD_ConnectionInfo *fd =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    const union MHD_ConnectionInfo *addr =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    char client[48];
    client_text(addr ? addr->client_addr : NULL, client, sizeof client);
    attnd_conn *k = fd ? attnd_conns_open(&s->conns, fd->connect_fd, client, attn_now()) : NULL;
    if (k)
      k->owner = s;
    *socket_ctx = k;
    return;
  }
  attnd_metrics_gauge_add(s->metrics, ATTND_GAUGE_CONNECTIONS, -1);
  if (*socket_ctx) {
    note_unparsed(s, *socket_ctx);
    attnd_conns_close(&s->conns, *socket_ctx);
  }
  *socket_ctx = NULL;
}

/* Binds the socket ourselves: a port in use is reported with its reason,
 * and port 0 picks a free one whose number we can log. */
static int bind_listen(attnd_server *s) {
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)s->cfg->port)};
  const char *host = s->cfg->host;
  if (!strcmp(host, "localhost"))
    host = "127.0.0.1";
  if (inet_pton(AF_INET, host, &a.sin_addr) != 1) {
    fprintf(stderr, "attnd: --listen: \"%s\" is not an IPv4 address\n", s->cfg->host);
    return -1;
  }
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0 ||
      bind(fd, (struct sockaddr *)&a, sizeof a) < 0 || listen(fd, LISTEN_BACKLOG) < 0) {
    fprintf(stderr, "attnd: cannot listen on %s:%d: %s\n", s->cfg->host, s->cfg->port,
            strerror(errno));
    if (fd >= 0)
      close(fd);
    return -1;
  }
  socklen_t len = sizeof a;
  getsockname(fd, (struct sockaddr *)&a, &len);
  s->port = ntohs(a.sin_port);
  s->listen_fd = fd;
  return 0;
}

/* Descriptors attnd needs besides its connections: stdio, the listening
 * socket, epoll, libuv's and the engine's wake-ups, a GPU driver's. */
#define RESERVED_FDS 32

/* Connections the registry has shut down and libmicrohttpd has not yet
 * closed still count against libmicrohttpd's own limit: it is set this much
 * above --max-connections, so eviction always finds room. */
static int eviction_slack(int max) { return max / 8 > 8 ? max / 8 : 8; }

/*
 * Raises the open-file limit to what --max-connections needs; where the
 * hard limit does not allow it, lowers the connections served to fit and
 * says so, rather than let accept() fail and park clients in the backlog.
 */
static void fit_open_files(attnd_server *s) {
  int max = s->cfg->max_connections;
  rlim_t need = (rlim_t)max + (rlim_t)eviction_slack(max) + RESERVED_FDS;
  struct rlimit rl;
  s->max_connections = max;
  if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur >= need)
    return;
  struct rlimit want = {need, rl.rlim_max >= need ? rl.rlim_max : need};
  if (setrlimit(RLIMIT_NOFILE, &want) == 0)
    return;
  want.rlim_max = rl.rlim_max;
  want.rlim_cur = rl.rlim_max;
  setrlimit(RLIMIT_NOFILE, &want);
  getrlimit(RLIMIT_NOFILE, &rl);
  long room = (long)rl.rlim_cur - RESERVED_FDS;
  int fit = room > 9 ? (int)(room * 8 / 9) : 1;
  if (fit < max)
    s->max_connections = fit;
  fprintf(stderr,
          "attnd: the open-file limit is %llu (ulimit -n) and cannot be raised to %llu: "
          "serving at most %d connections instead of %d\n",
          (unsigned long long)rl.rlim_cur, (unsigned long long)need, s->max_connections, max);
}

int attnd_http_start(attnd_server *s) {
  if (bind_listen(s) < 0)
    return -1;
  const attnd_config *c = s->cfg;
  fit_open_files(s);
  int per_client = c->max_connections_per_client;
  attnd_conns_init(&s->conns, s->max_connections, per_client, c->header_timeout, c->idle_timeout);
  attnd_conns_uploads(&s->conns, c->min_upload_rate, on_cut, s);
  unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME |
                   MHD_USE_ERROR_LOG;
  struct MHD_OptionItem tls[4] = {{MHD_OPTION_END, 0, NULL}};
  if (s->tls_cert_pem) {
    if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES) {
      fprintf(stderr, "attnd: --tls-cert: this libmicrohttpd was built without TLS (GnuTLS)\n");
      close(s->listen_fd);
      return -1;
    }
    flags |= MHD_USE_TLS;
    tls[0] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_CERT, 0, s->tls_cert_pem};
    tls[1] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_KEY, 0, s->tls_key_pem};
    /* checked at start (attnd_tls_check_priorities); libmicrohttpd's own
     * default, NORMAL, would accept TLS 1.0 and 1.1 and CBC suites */
    tls[2] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_PRIORITIES, 0,
                                     (void *)(uintptr_t)c->tls_priorities};
    tls[3] = (struct MHD_OptionItem){MHD_OPTION_END, 0, NULL};
  }
  unsigned limit = (unsigned)(s->max_connections + eviction_slack(s->max_connections));
  /* The logger must come first, or libmicrohttpd prints its first notes
   * itself. */
  s->mhd = MHD_start_daemon(
      flags, 0, on_accept, s, on_request, s, MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, s,
      MHD_OPTION_LISTEN_SOCKET, s->listen_fd, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
      MHD_OPTION_NOTIFY_CONNECTION, on_connection, s, MHD_OPTION_URI_LOG_CALLBACK, on_target, s,
      MHD_OPTION_UNESCAPE_CALLBACK, on_unescape, s, MHD_OPTION_CONNECTION_TIMEOUT,
      (unsigned)c->idle_timeout, MHD_OPTION_CONNECTION_LIMIT, limit,
      MHD_OPTION_CONNECTION_MEMORY_LIMIT, CONNECTION_MEMORY, MHD_OPTION_ARRAY, tls, MHD_OPTION_END);
  if (!s->mhd) {
    fprintf(stderr, "attnd: cannot start the HTTP%s daemon on %s:%d\n", s->tls_cert_pem ? "S" : "",
            c->host, s->port);
    attnd_conns_destroy(&s->conns);
    close(s->listen_fd);
    return -1;
  }
  return 0;
}

static void quiesce(attnd_server *s) {
  MHD_socket fd = MHD_quiesce_daemon(s->mhd);
  if (fd != MHD_INVALID_SOCKET)
    close(fd);
}

void attnd_http_stop(attnd_server *s) {
  if (!s->mhd)
    return;
  atomic_store(&s->stopping, true);
  MHD_stop_daemon(s->mhd);
  s->mhd = NULL;
  attnd_conns_destroy(&s->conns);
}

static void resume(attnd_req *r) { MHD_resume_connection(r->conn); }

static bool client_gone(attnd_req *r) {
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
  /* Data is a pipelining client. End-of-file is a client that closed, or
   * half-closed, before its reply: TCP cannot tell the two apart, and as
   * nginx does for proxied requests, attnd takes both as the client
   * abandoning the job, so that nobody's slot is spent on it. */
  return ci && attnd_peek(ci->connect_fd) <= 0;
}

const attnd_transport attnd_http_transport = {
    .resume = resume,
    .client_gone = client_gone,
    .quiesce = quiesce,
};
