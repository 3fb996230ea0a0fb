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
 * sized from Content-Length (grown for chunked bodies; past --max-body the
 * rest is dropped and the reply is 413); on its last byte the connection is
 * suspended and the request handed to the loop, which resumes it with the
 * reply set. Every request ends in
 * on_completed(): one log line, the metrics, and freeing its state.
 */
#define _GNU_SOURCE
#include "server.h"

#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <arpa/inet.h>
#include <unistd.h>

static const struct {
  const char *path;
  attnd_route route;
  bool post;
} routes[] = {
    {"/attention", ATTND_R_ATTENTION, true},   {"/attention/plan", ATTND_R_PLAN, false},
    {"/healthz", ATTND_R_HEALTHZ, false},      {"/readyz", ATTND_R_READYZ, false},
    {"/metrics", ATTND_R_METRICS, false},      {"/v1/info", ATTND_R_INFO, false},
};

static const char json_type[] = "application/json";

/* ---- replies ------------------------------------------------------------- */

static void set_reply(attnd_req *r, int status, char *buf, size_t len, const char *ctype) {
  free(r->resp);
  r->status = status;
  r->resp = buf;
  r->resp_len = len;
  r->ctype = ctype;
}

void attnd_req_error(attnd_req *r, int status, const char *code, const char *message) {
  size_t len = 0;
  char *b = attn_proto_error_body(code, message, &len);
  set_reply(r, status, b, b ? len : 0, json_type);
  r->retry_after = status == 503;
}

void attnd_req_fail(attnd_req *r, const attn_status *st) {
  attnd_req_error(r, attn_proto_http_status(st->code), attn_proto_code_name(st->code),
                  st->message);
}

static void set_json(attnd_req *r, int status, attn_sbuf *b) {
  if (b->oom) {
    free(b->p);
    attnd_req_error(r, 503, "out_of_memory", "out of memory building the reply");
    return;
  }
  set_reply(r, status, b->p, b->len, json_type);
}

/* Hands r's reply to libmicrohttpd. */
static enum MHD_Result queue_reply(attnd_req *r) {
  if (!r->resp) /* out of memory for the error body itself */
    attnd_req_error(r, 503, "out_of_memory", "out of memory");
  struct MHD_Response *resp = MHD_create_response_from_buffer_with_free_callback(
      r->resp_len, r->resp ? r->resp : (char *)"", r->resp ? free : NULL);
  if (!resp)
    return MHD_NO;
  r->bytes_out = r->resp_len;
  r->resp = NULL; /* libmicrohttpd frees it with the response */
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, r->ctype ? r->ctype : json_type);
  if (r->retry_after)
    MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, "1");
  if (r->status == MHD_HTTP_METHOD_NOT_ALLOWED)
    MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW,
                            r->route == ATTND_R_ATTENTION ? "POST" : "GET, HEAD");
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
  attn_backend_info info[8];
  int n = attn_engine_backends(s->engine, info, 8);
  for (int i = 0; i < n && i < 8; i++) {
    attn_sbuf_puts(&b, i ? ", {\"name\": " : "{\"name\": ");
    attn_sbuf_json_str(&b, info[i].name);
    attn_sbuf_printf(&b, ", \"available\": %s, \"detail\": ", info[i].available ? "true" : "false");
    attn_sbuf_json_str(&b, info[i].detail);
    attn_sbuf_puts(&b, "}");
  }
#ifdef ATTN_HAVE_CUDA
  const char *cuda = "true";
#else
  const char *cuda = "false";
  attn_sbuf_puts(&b, ", {\"name\": \"cuda\", \"available\": false, \"detail\": "
                     "\"not compiled into this build\"}");
#endif
  attn_sbuf_printf(&b,
                   "], \"limits\": {\"max_body\": %llu, \"max_queue\": %d, \"timeout\": %g, "
                   "\"idle_timeout\": %d, \"max_connections\": %d, \"drain_timeout\": %g, "
                   "\"max_head_dim\": %d}, \"build\": {\"cuda\": %s, \"compiler\": ",
                   (unsigned long long)c->max_body, c->max_queue, c->timeout, c->idle_timeout,
                   c->max_connections, c->drain_timeout, ATTN_MAX_HEAD_DIM, cuda);
  attn_sbuf_json_str(&b, __VERSION__);
  attn_sbuf_printf(&b, ", \"threads\": %d}}\n", attn_engine_threads(s->engine));
  set_json(r, 200, &b);
}

static void get_plan(attnd_req *r) {
  attn_plan_params pp;
  attn_plan pl;
  attn_status st;
  if (attn_proto_parse_plan_query(r->query, &pp, &st) < 0 ||
      (pp.threads = attn_engine_threads(r->srv->engine),
       attn_plan_compute(&pp, &pl, &st) < 0)) {
    attnd_req_fail(r, &st);
    return;
  }
  attn_sbuf b = {0};
  attn_proto_plan_json(&b, &pp, &pl);
  set_json(r, 200, &b);
}

/* Whether the backend requests run on can still take jobs (a CUDA device
 * that failed cannot). */
static bool backend_ready(attnd_server *s, char *why, size_t cap) {
  attn_backend_info info[8];
  int n = attn_engine_backends(s->engine, info, 8);
  for (int i = 0; i < n && i < 8; i++)
    if (!strcmp(info[i].name, s->backend) && !info[i].available) {
      snprintf(why, cap, "the %s backend cannot run jobs: %.150s", info[i].name, info[i].detail);
      return false;
    }
  return true;
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
    if (atomic_load(&s->draining))
      attnd_req_error(r, 503, "shutting_down", "the server is draining and takes no new work");
    else if (!backend_ready(s, why, sizeof why))
      attnd_req_error(r, 503, "backend_unavailable", why);
    else {
      attn_sbuf_puts(&b, "{\"status\": \"ready\"}\n");
      set_json(r, 200, &b);
    }
    break;
  }
  case ATTND_R_METRICS: {
    size_t len = 0;
    char *text = attnd_metrics_render(s->metrics, &len);
    if (text)
      set_reply(r, 200, text, len, "text/plain; version=0.0.4; charset=utf-8");
    else
      attnd_req_error(r, 503, "out_of_memory", "out of memory rendering the metrics");
    break;
  }
  case ATTND_R_INFO: get_info(r); break;
  case ATTND_R_PLAN: get_plan(r); break;
  default: break;
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

bool attnd_body_reserve(attnd_req *r, size_t n) {
  attnd_server *s = r->srv;
  uint64_t budget = (uint64_t)s->cfg->max_queue * s->cfg->max_body;
  uint64_t held = atomic_fetch_add(&s->body_bytes, n);
  if (held + n > budget) {
    atomic_fetch_sub(&s->body_bytes, n);
    return false;
  }
  r->reserved += n;
  return true;
}

void attnd_body_release(attnd_req *r) {
  atomic_fetch_sub(&r->srv->body_bytes, r->reserved);
  r->reserved = 0;
}

void attnd_body_over_budget(attnd_req *r) {
  char msg[200];
  snprintf(msg, sizeof msg,
           "request bodies already hold the server's memory budget (--max-queue x "
           "--max-body = %llu bytes); retry shortly",
           (unsigned long long)r->srv->cfg->max_queue * r->srv->cfg->max_body);
  attnd_req_error(r, 503, "queue_full", msg);
}

/* The first callback of a POST /attention: refuse what can be refused
 * before the body; returns false when r already has its reply. */
static bool begin_post(attnd_req *r) {
  attnd_server *s = r->srv;
  struct MHD_Connection *conn = r->conn;
  if (atomic_load(&s->draining)) {
    attnd_req_error(r, 503, "shutting_down", "the server is draining and takes no new work");
    return false;
  }
  const char *ct = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                               MHD_HTTP_HEADER_CONTENT_TYPE);
  if (media_is(ct, "application/json")) {
    r->json_in = true;
    r->binary_out = accepts_binary(conn);
  } else if (media_is(ct, "application/octet-stream")) {
    r->binary_out = true;
  } else {
    char msg[200];
    snprintf(msg, sizeof msg,
             "Content-Type \"%.60s\" is not one this server reads; send application/json or "
             "application/octet-stream (safetensors)",
             ct ? ct : "(none)");
    attnd_req_error(r, 415, "unsupported_media_type", msg);
    return false;
  }
  const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                               MHD_HTTP_HEADER_CONTENT_LENGTH);
  uint64_t want = 0;
  if (cl) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(cl, &end, 10);
    want = (*cl && !*end && !errno) ? v : UINT64_MAX;
  }
  if (want > s->cfg->max_body) {
    char msg[200];
    snprintf(msg, sizeof msg, "Content-Length %s is over the limit of %llu bytes (--max-body)",
             cl, (unsigned long long)s->cfg->max_body);
    attnd_req_error(r, 413, "too_large", msg);
    return false;
  }
  r->cap = cl ? (size_t)want : 64 * 1024;
  if (!attnd_body_reserve(r, r->cap)) {
    attnd_body_over_budget(r);
    return false;
  }
  r->body = malloc(r->cap ? r->cap : 1);
  if (!r->body) {
    attnd_req_error(r, 503, "out_of_memory", "out of memory for the request body");
    return false;
  }
  return true;
}

/* Appends a chunk of body; on failure r has its error reply. */
static void take_body(attnd_req *r, const char *data, size_t n) {
  uint64_t max = r->srv->cfg->max_body;
  if (r->len + n > max) {
    char msg[160];
    snprintf(msg, sizeof msg, "the body grew past the limit of %llu bytes (--max-body)",
             (unsigned long long)max);
    attnd_req_error(r, 413, "too_large", msg);
    return;
  }
  if (r->len + n > r->cap) {
    size_t cap = r->cap * 2 > r->len + n ? r->cap * 2 : r->len + n;
    if (cap > max)
      cap = (size_t)max;
    if (!attnd_body_reserve(r, cap - r->cap)) {
      attnd_body_over_budget(r);
      return;
    }
    char *b = realloc(r->body, cap);
    if (!b) {
      attnd_req_error(r, 503, "out_of_memory", "out of memory for the request body");
      return;
    }
    r->body = b;
    r->cap = cap;
  }
  memcpy(r->body + r->len, data, n);
  r->len += n;
}

static attnd_req *new_req(attnd_server *s, struct MHD_Connection *conn, const char *url,
                          const char *method) {
  attnd_req *r = calloc(1, sizeof *r);
  if (!r)
    return NULL;
  r->srv = s;
  r->conn = conn;
  r->t_received = attnd_now();
  snprintf(r->method, sizeof r->method, "%s", method);
  snprintf(r->path, sizeof r->path, "%s", url);
  r->route = ATTND_R_NONE;
  for (size_t i = 0; i < sizeof routes / sizeof *routes; i++)
    if (!strcmp(url, routes[i].path))
      r->route = routes[i].route;
  attn_sbuf q = {0};
  MHD_get_connection_values(conn, MHD_GET_ARGUMENT_KIND, add_arg, &q);
  r->query = q.oom ? NULL : q.p;
  return r;
}

/* Bytes of body read and dropped after a reply was decided (413 on a
 * chunked body, 404 or 405 with a body) before the connection is cut
 * instead: libmicrohttpd takes a reply only before the body or after all
 * of it. */
#define DISCARD_LIMIT ((size_t)64 << 20)

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload, size_t *upload_size, void **con_cls) {
  (void)version;
  attnd_server *s = cls;
  attnd_req *r = *con_cls;
  if (!r) {
    r = *con_cls = new_req(s, conn, url, method);
    if (!r)
      return MHD_NO;
    bool post = !strcmp(method, MHD_HTTP_METHOD_POST);
    bool get = !strcmp(method, MHD_HTTP_METHOD_GET) || !strcmp(method, MHD_HTTP_METHOD_HEAD);
    if (r->route == ATTND_R_NONE) {
      char msg[200];
      snprintf(msg, sizeof msg,
               "no such path \"%.80s\" (try POST /attention, GET /attention/plan, /healthz, "
               "/readyz, /metrics, /v1/info)",
               url);
      attnd_req_error(r, 404, "not_found", msg);
    } else if (r->route == ATTND_R_ATTENTION ? !post : !get) {
      char msg[120];
      snprintf(msg, sizeof msg, "%.16s is not allowed on %.60s (use %s)", method, url,
               r->route == ATTND_R_ATTENTION ? "POST" : "GET");
      attnd_req_error(r, 405, "method_not_allowed", msg);
    } else if (r->route != ATTND_R_ATTENTION) {
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
  if (r->queued) {
    *upload_size = 0;
    return MHD_YES;
  }
  if (*upload_size) {
    size_t n = *upload_size;
    *upload_size = 0;
    if (r->status) { /* the reply is decided; drop the body, up to a point */
      r->discarded += n;
      return r->discarded > DISCARD_LIMIT ? MHD_NO : MHD_YES;
    }
    take_body(r, upload, n);
    return MHD_YES;
  }
  if (r->status)
    return queue_reply(r);
  if (!r->submitted) {
    r->submitted = true;
    atomic_fetch_add(&s->replying, 1);
    MHD_suspend_connection(conn);
    attnd_loop_submit(s, r);
  }
  return MHD_YES;
}

static void log_line(attnd_server *s, const attnd_req *r, double total) {
  double queue = r->t_started > 0 ? r->t_started - r->t_admitted : 0;
  double compute = r->t_done > 0 && r->t_started > 0 ? r->t_done - r->t_started : 0;
  pthread_mutex_lock(&s->log_mu);
  if (s->cfg->log_json) {
    attn_sbuf b = {0};
    attn_sbuf_puts(&b, "{\"method\": ");
    attn_sbuf_json_str(&b, r->method);
    attn_sbuf_puts(&b, ", \"path\": ");
    attn_sbuf_json_str(&b, r->path);
    attn_sbuf_printf(&b,
                     ", \"status\": %d, \"bytes_in\": %zu, \"bytes_out\": %llu, "
                     "\"queue_us\": %.0f, \"compute_us\": %.0f, \"total_us\": %.0f}\n",
                     r->status, r->len, (unsigned long long)r->bytes_out, queue * 1e6,
                     compute * 1e6, total * 1e6);
    if (!b.oom)
      fputs(b.p, stderr);
    free(b.p);
  } else {
    fprintf(stderr, "attnd: %s %s %d in=%zu out=%llu queue_us=%.0f compute_us=%.0f "
                    "total_us=%.0f\n",
            r->method, r->path, r->status, r->len, (unsigned long long)r->bytes_out,
            queue * 1e6, compute * 1e6, total * 1e6);
  }
  pthread_mutex_unlock(&s->log_mu);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode why) {
  (void)conn;
  attnd_server *s = cls;
  attnd_req *r = *con_cls;
  if (!r)
    return;
  if (!r->queued) /* the client left before a reply */
    r->status = why == MHD_REQUEST_TERMINATED_TIMEOUT_REACHED ? 408 : 499;
  double total = attnd_now() - r->t_received;
  attnd_metrics_request(s->metrics, r->path, r->status, total, r->len, r->bytes_out);
  log_line(s, r, total);
  attn_proto_req_free(&r->pr);
  free(r->body);
  attnd_body_release(r);
  free(r->query);
  free(r->resp);
  if (r->submitted)
    atomic_fetch_sub(&s->replying, 1);
  free(r);
  *con_cls = NULL;
}

static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_ctx,
                          enum MHD_ConnectionNotificationCode code) {
  (void)conn;
  (void)socket_ctx;
  attnd_server *s = cls;
  attnd_metrics_gauge_add(s->metrics, ATTND_GAUGE_CONNECTIONS,
                          code == MHD_CONNECTION_NOTIFY_STARTED ? 1 : -1);
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
      bind(fd, (struct sockaddr *)&a, sizeof a) < 0 || listen(fd, 1024) < 0) {
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

int attnd_http_start(attnd_server *s) {
  if (bind_listen(s) < 0)
    return -1;
  unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME |
                   MHD_USE_ERROR_LOG;
  s->mhd = MHD_start_daemon(
      flags, 0, NULL, NULL, on_request, s, MHD_OPTION_LISTEN_SOCKET, s->listen_fd,
      MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_NOTIFY_CONNECTION,
      on_connection, s, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)s->cfg->idle_timeout,
      MHD_OPTION_CONNECTION_LIMIT, (unsigned)s->cfg->max_connections,
      MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(64 * 1024), MHD_OPTION_END);
  if (!s->mhd) {
    fprintf(stderr, "attnd: cannot start the HTTP daemon on %s:%d\n", s->cfg->host, s->port);
    close(s->listen_fd);
    return -1;
  }
  return 0;
}

void attnd_http_quiesce(attnd_server *s) {
  MHD_socket fd = MHD_quiesce_daemon(s->mhd);
  if (fd != MHD_INVALID_SOCKET)
    close(fd);
}

void attnd_http_stop(attnd_server *s) {
  if (s->mhd)
    MHD_stop_daemon(s->mhd);
  s->mhd = NULL;
}
