/*
 * load_cmd.c — `attn load`: an HTTP load generator for attnd.
 *
 * One libuv loop on one thread drives keep-alive TCP connections with
 * hand-written HTTP/1.1 requests (the same bytes every time: a prebuilt
 * header block and one shared body) and parses the replies itself (status
 * line, headers, a Content-Length, chunked or read-until-close body;
 * `Connection: close` makes the connection reconnect for the next request).
 *
 * Closed loop (--concurrency N): N connections, each sends its next request
 * as soon as the previous answer has arrived; a request's latency runs from
 * its send. Open loop (--rate R): request i is due at t0 + i/R whatever the
 * server does; it goes out on an idle connection of a pool that grows (up to
 * 1024 connections) while all are busy, and its latency runs from that
 * intended start, so a stalled server shows in the percentiles instead of
 * silently slowing the sender (no coordinated omission). Requests that are
 * due while the pool is full wait (the backlog) and are sent as connections
 * free up, still timed from their intended start.
 *
 * Counting: a request is "sent" when it is handed to a connection (a failed
 * connect counts it as a connect error). Each sent request ends exactly once:
 * answered (any HTTP status), a transport error (connect, write, read,
 * timeout, protocol), or still in flight when the run stops, so
 * sent = answered + transport errors + in flight. Latencies of answered
 * requests (every status) go to a log-linear histogram (hist.h, within 1%).
 */
#include "args.h"
#include "cmds.h"
#include "files.h"
#include "benchlib.h"
#include "hist.h"
#include "http_reply.h"
#include "load_report.h"
#include "proto.h"

#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#include <uv.h>

static const char usage[] =
    "usage: attn load URL [--concurrency N | --rate R] [--duration S | --requests N]\n"
    "                 [--body FILE | --shape B,H,N,D [--shape-kv B,H,N,D] [--dtype T]]\n"
    "                 [--json-body] [--path /attention] [--query \"causal=true\"]\n"
    "                 [--timeout S] [--json]\n"
    "\n"
    "Sends POST requests to attnd (URL http://HOST:PORT, IPv4 or a name) on keep-alive\n"
    "connections and reports requests/s, GFLOP/s served, latency percentiles and errors.\n"
    "\n"
    "  --concurrency N  closed loop: N connections, each sends when its answer is in\n"
    "                   (default 8)\n"
    "  --rate R         open loop: R requests/s at fixed intended start times over a pool\n"
    "                   of up to 1024 connections; latency counts from the intended start\n"
    "  --duration S     run S seconds (default 10); requests still out are \"in flight\"\n"
    "  --requests N     stop after N requests were sent and answered (or failed)\n"
    "  --body FILE      send FILE as the body (safetensors; JSON with --json-body)\n"
    "  --shape B,H,N,D  generate random q (and k, v) of this shape (default 1,8,512,64)\n"
    "  --shape-kv B,H,N,D  k and v shape (default: the --shape)\n"
    "  --dtype T        F32 (default), F16 or BF16\n"
    "  --json-body      send JSON (Content-Type application/json), not safetensors\n"
    "  --path P         request path (default: the URL's, else /attention)\n"
    "  --query Q        query string, e.g. causal=true (default: the URL's)\n"
    "  --timeout S      a request unanswered after S seconds is an error (default 30)\n"
    "  --json           print one JSON object instead of the text report\n"
    "\n"
    "Exit status: 0 when the run completed (HTTP errors are reported, not fatal),\n"
    "1 when no connection could be made, 2 bad usage.\n";

#define MAX_POOL 1024
#define RBUF_SIZE 65536
#define RETRY_MS 100 /* wait before reconnecting after a failed connect */
#define TICK_MS 100

enum { C_FREE, C_CONNECTING, C_OPEN, C_CLOSING };

typedef struct load load;

typedef struct conn {
  uv_tcp_t tcp;
  uv_connect_t creq;
  uv_write_t wreq;
  load *L;
  int state;
  bool active; /* a request is in flight on it */
  bool write_pending;
  bool want_next; /* answered while its write was pending */
  bool connect_failed;
  uint64_t start_ns;  /* latency origin: the intended start */
  uint64_t sent_ns;   /* when it was handed to the connection */
  uint64_t retry_ns;  /* no reconnect before this */
  attn_http_reply rp; /* the reply parser */
  char *rbuf;
} conn;

struct load {
  uv_loop_t *loop;
  uv_timer_t tick, sched, end;
  uv_signal_t sigint;
  struct sockaddr_in addr;
  /* the request */
  char *head;
  size_t head_len;
  const char *body;
  size_t body_len;
  /* the plan */
  bool open_loop;
  int concurrency;
  double rate;
  double duration;
  int64_t max_requests; /* 0: by duration */
  double timeout;
  bool progress;
  /* the pool */
  conn *pool[MAX_POOL];
  int npool, max_pool;
  /* state */
  uint64_t t0, t_end;
  uint64_t next_i; /* open loop: the next scheduled request */
  bool stopping, ever_connected, no_connect;
  int connect_err;
  int open_handles;
  attn_load_counts n;
  attn_hist hist;
  /* progress */
  uint64_t last_prog_ns, last_prog_answered;
};

static uint64_t now_ns(void) { return uv_hrtime(); }

static void conn_issue(conn *c);
static void conn_close(conn *c);
static void dispatch_due(load *L);
static void load_stop(load *L);

/* ---- request life ------------------------------------------------------- */

static bool limit_reached(const load *L) {
  return L->max_requests > 0 && L->n.sent >= (uint64_t)L->max_requests;
}

static void check_done(load *L) {
  if (L->max_requests > 0 && !L->stopping) {
    uint64_t ended = L->n.answered;
    for (int t = 0; t < ATTN_TERR_COUNT; t++)
      ended += L->n.terr[t];
    if (ended >= (uint64_t)L->max_requests)
      load_stop(L);
  }
}

static void transport_error(conn *c, int kind) {
  load *L = c->L;
  if (c->active) {
    c->active = false;
    L->n.terr[kind]++;
  }
  conn_close(c);
  check_done(L);
}

/* --duration is over (checked where work is started, since a loop iteration
 * that writes many large bodies can delay the end timer). */
static bool past_end(load *L) {
  if (L->max_requests > 0 || L->stopping)
    return L->stopping;
  if (now_ns() - L->t0 >= (uint64_t)(L->duration * 1e9)) {
    load_stop(L);
    return true;
  }
  return false;
}

/* The connection is free for another request. */
static void conn_next(conn *c) {
  load *L = c->L;
  if (past_end(L))
    return;
  if (L->open_loop)
    dispatch_due(L);
  else
    conn_issue(c);
}

static void on_write(uv_write_t *w, int status) {
  conn *c = w->data;
  load *L = c->L;
  c->write_pending = false;
  if (status == UV_ECANCELED)
    return; /* the handle is closing */
  if (status < 0) {
    if (c->active)
      transport_error(c, ATTN_TERR_WRITE);
    else
      conn_close(c); /* answered early (say 503), then the peer closed */
    return;
  }
  L->n.bytes_sent += L->head_len + L->body_len;
  if (c->want_next && c->state == C_OPEN) {
    c->want_next = false;
    conn_next(c);
  }
}

static void conn_send(conn *c) {
  load *L = c->L;
  uv_buf_t b[2] = {uv_buf_init(L->head, (unsigned)L->head_len),
                   uv_buf_init((char *)(uintptr_t)L->body, (unsigned)L->body_len)};
  attn_http_reply_start(&c->rp);
  c->want_next = false;
  c->wreq.data = c;
  c->sent_ns = now_ns();
  int rc = uv_write(&c->wreq, (uv_stream_t *)&c->tcp, b, L->body_len ? 2 : 1, on_write);
  if (rc < 0) {
    transport_error(c, ATTN_TERR_WRITE);
    return;
  }
  c->write_pending = true;
}

static void on_connect(uv_connect_t *req, int status);

static void conn_connect(conn *c) {
  load *L = c->L;
  uv_tcp_init(L->loop, &c->tcp);
  c->tcp.data = c;
  c->state = C_CONNECTING;
  L->open_handles++;
  uv_tcp_nodelay(&c->tcp, 1);
  c->creq.data = c;
  int rc = uv_tcp_connect(&c->creq, &c->tcp, (const struct sockaddr *)&L->addr, on_connect);
  if (rc < 0) {
    c->connect_failed = true;
    c->retry_ns = now_ns() + (uint64_t)RETRY_MS * 1000000;
    L->connect_err = rc;
    if (c->active) {
      c->active = false;
      L->n.terr[ATTN_TERR_CONNECT]++;
    }
    c->state = C_OPEN; /* so that conn_close closes it */
    conn_close(c);
    check_done(L);
  }
}

/* Starts a request on c (idle and open, or free: it connects first) whose
 * latency counts from start. */
static void conn_start(conn *c, uint64_t start) {
  load *L = c->L;
  L->n.sent++;
  c->active = true;
  c->start_ns = start;
  c->sent_ns = now_ns();
  if (c->state == C_OPEN)
    conn_send(c);
  else if (c->state == C_FREE)
    conn_connect(c);
}

/* Closed loop: the connection's next request, if the plan wants one. */
static void conn_issue(conn *c) {
  load *L = c->L;
  if (past_end(L) || limit_reached(L) || c->active || c->write_pending)
    return;
  if (c->state == C_FREE && c->connect_failed && now_ns() < c->retry_ns)
    return; /* the tick retries it */
  if (c->state == C_OPEN || c->state == C_FREE)
    conn_start(c, now_ns());
}

/* ---- the reply parser --------------------------------------------------- */

static void response_done(conn *c) {
  load *L = c->L;
  if (!c->active)
    return;
  c->active = false;
  uint64_t t = now_ns();
  L->n.answered++;
  if (c->rp.status >= 200 && c->rp.status < 300)
    L->n.ok++;
  if (c->rp.status >= 100 && c->rp.status < 600)
    L->n.status[c->rp.status]++;
  else
    L->n.status_other++;
  attn_hist_record(&L->hist, t > c->start_ns ? (t - c->start_ns + 500) / 1000 : 0);
  check_done(L);
  if (L->stopping)
    return;
  if (c->rp.close_after) {
    conn_close(c);
  } else if (c->write_pending) {
    c->want_next = true;
  } else {
    conn_next(c);
  }
}

/* Feeds read bytes to the reply parser; each reply that ends is counted
 * (and may close the connection or send its next request) before the bytes
 * after it are fed. -1 on a protocol error. */
static int parse(conn *c, const char *p, size_t n) {
  while (n > 0) {
    size_t used;
    int rc = attn_http_reply_feed(&c->rp, p, n, &used);
    if (rc == ATTN_HTTP_ERROR)
      return -1;
    p += used;
    n -= used;
    if (rc == ATTN_HTTP_DONE) {
      response_done(c);
      if (c->state != C_OPEN)
        return 0;
    }
  }
  return 0;
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)suggested;
  conn *c = h->data;
  *buf = uv_buf_init(c->rbuf, RBUF_SIZE);
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
  conn *c = s->data;
  load *L = c->L;
  if (nread == 0 || c->state != C_OPEN)
    return;
  if (nread < 0) {
    if (nread == UV_EOF && attn_http_reply_until_close(&c->rp) && c->active) {
      attn_http_reply_reset(&c->rp);
      response_done(c);
      conn_close(c);
    } else if (c->active) {
      transport_error(c, ATTN_TERR_READ);
    } else {
      conn_close(c); /* an idle connection the server closed */
    }
    return;
  }
  L->n.bytes_recv += (uint64_t)nread;
  if (parse(c, buf->base, (size_t)nread) < 0)
    transport_error(c, ATTN_TERR_PROTOCOL);
}

static void on_connect(uv_connect_t *req, int status) {
  conn *c = req->data;
  load *L = c->L;
  if (status == UV_ECANCELED || c->state != C_CONNECTING)
    return;
  if (status < 0) {
    c->connect_failed = true;
    c->retry_ns = now_ns() + (uint64_t)RETRY_MS * 1000000;
    L->connect_err = status;
    c->state = C_OPEN;
    if (!L->ever_connected) {
      /* nothing has ever connected: the server is not there */
      if (c->active) {
        c->active = false;
        L->n.terr[ATTN_TERR_CONNECT]++;
      }
      L->no_connect = true;
      load_stop(L);
      return;
    }
    transport_error(c, ATTN_TERR_CONNECT);
    return;
  }
  L->ever_connected = true;
  c->connect_failed = false;
  c->state = C_OPEN;
  attn_http_reply_reset(&c->rp);
  uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
  if (c->active)
    conn_send(c);
  else if (L->open_loop)
    dispatch_due(L);
}

static void on_close(uv_handle_t *h) {
  conn *c = h->data;
  load *L = c->L;
  c->state = C_FREE;
  attn_http_reply_reset(&c->rp);
  c->write_pending = false;
  c->want_next = false;
  L->open_handles--;
  if (L->stopping)
    return;
  if (L->open_loop)
    dispatch_due(L);
  else
    conn_issue(c);
}

static void conn_close(conn *c) {
  if (c->state == C_FREE || c->state == C_CLOSING)
    return;
  c->state = C_CLOSING;
  uv_close((uv_handle_t *)&c->tcp, on_close);
}

static conn *conn_new(load *L) {
  conn *c = calloc(1, sizeof *c);
  if (!c)
    return NULL;
  c->rbuf = malloc(RBUF_SIZE);
  if (attn_http_reply_init(&c->rp) < 0 || !c->rbuf) {
    attn_http_reply_free(&c->rp);
    free(c->rbuf);
    free(c);
    return NULL;
  }
  c->L = L;
  c->state = C_FREE;
  L->pool[L->npool++] = c;
  return c;
}

/* ---- the open loop -------------------------------------------------------- */

static uint64_t due_ns(const load *L, uint64_t i) {
  return L->t0 + (uint64_t)((double)i * 1e9 / L->rate);
}

static bool sched_more(const load *L) {
  if (L->max_requests > 0)
    return L->next_i < (uint64_t)L->max_requests;
  return due_ns(L, L->next_i) < L->t0 + (uint64_t)(L->duration * 1e9);
}

/* An idle open connection, else a free one to connect, else a new one. */
static conn *pool_get(load *L) {
  uint64_t t = now_ns();
  conn *free_c = NULL;
  for (int i = 0; i < L->npool; i++) {
    conn *c = L->pool[i];
    if (c->active || c->write_pending)
      continue;
    if (c->state == C_OPEN && attn_http_reply_idle(&c->rp))
      return c;
    if (!free_c && c->state == C_FREE && (!c->connect_failed || t >= c->retry_ns))
      free_c = c;
  }
  if (free_c)
    return free_c;
  if (L->npool < L->max_pool)
    return conn_new(L);
  return NULL;
}

static void on_sched(uv_timer_t *t) { dispatch_due(t->data); }

static void dispatch_due(load *L) {
  if (!L->open_loop || past_end(L))
    return;
  uint64_t t = now_ns();
  while (sched_more(L) && due_ns(L, L->next_i) <= t) {
    if (past_end(L))
      return;
    conn *c = pool_get(L);
    if (!c)
      return; /* backlog: a connection that frees up calls again */
    uint64_t due = due_ns(L, L->next_i);
    L->next_i++;
    conn_start(c, due);
    if (L->stopping)
      return;
  }
  if (sched_more(L)) {
    uint64_t d = due_ns(L, L->next_i);
    uv_timer_start(&L->sched, on_sched, d > t ? (d - t) / 1000000 : 0, 0);
  }
}

/* ---- timers --------------------------------------------------------------- */

static void print_progress(load *L, uint64_t t) {
  double secs = (double)(t - L->t0) * 1e-9;
  double dt = (double)(t - L->last_prog_ns) * 1e-9;
  double rps = dt > 0 ? (double)(L->n.answered - L->last_prog_answered) / dt : 0;
  uint64_t terr = attn_load_transport_errors(&L->n);
  printf("\r%6.1f s  %9.1f requests/s  p99 %9.3f ms  answered %llu  errors %llu\033[K", secs, rps,
         attn_hist_percentile(&L->hist, 99) / 1e3, (unsigned long long)L->n.answered,
         (unsigned long long)(L->n.answered - L->n.ok + terr));
  fflush(stdout);
  L->last_prog_ns = t;
  L->last_prog_answered = L->n.answered;
}

static void on_tick(uv_timer_t *tm) {
  load *L = tm->data;
  uint64_t t = now_ns();
  uint64_t limit = (uint64_t)(L->timeout * 1e9);
  for (int i = 0; i < L->npool && !L->stopping; i++) {
    conn *c = L->pool[i];
    if (c->active && t - c->sent_ns > limit)
      transport_error(c, ATTN_TERR_TIMEOUT);
    else if (!L->open_loop && !c->active && c->state == C_FREE)
      conn_issue(c); /* retries after a failed connect */
  }
  if (L->open_loop && !L->stopping)
    dispatch_due(L);
  if (L->progress && !L->stopping && t - L->last_prog_ns >= 1000000000ull)
    print_progress(L, t);
}

static void on_end(uv_timer_t *t) { load_stop(t->data); }

static void on_sigint(uv_signal_t *s, int signum) {
  (void)signum;
  load_stop(s->data);
}

static void load_stop(load *L) {
  if (L->stopping)
    return;
  L->stopping = true;
  L->t_end = now_ns();
  for (int i = 0; i < L->npool; i++) {
    conn *c = L->pool[i];
    if (c->active && L->no_connect && c->state == C_CONNECTING)
      L->n.terr[ATTN_TERR_CONNECT]++; /* it would fail the same way */
    else if (c->active)
      L->n.in_flight_end++;
    c->active = false;
    conn_close(c);
  }
  if (L->open_loop && sched_more(L)) {
    uint64_t t = L->t_end;
    while (sched_more(L) && due_ns(L, L->next_i) <= t) {
      L->n.backlog_end++;
      L->next_i++;
    }
  }
  uv_close((uv_handle_t *)&L->tick, NULL);
  uv_close((uv_handle_t *)&L->sched, NULL);
  uv_close((uv_handle_t *)&L->end, NULL);
  uv_close((uv_handle_t *)&L->sigint, NULL);
}

/* ---- setup ---------------------------------------------------------------- */

static int parse_double(const char *flag, const char *s, double lo, double hi, double *out) {
  char *e;
  errno = 0;
  double v = strtod(s, &e);
  if (e == s || *e || errno || !isfinite(v) || v < lo || v > hi) {
    fprintf(stderr, "attn load: %s expects a number from %g to %g, not \"%s\"\n", flag, lo, hi, s);
    return -1;
  }
  *out = v;
  return 0;
}

typedef struct url_parts {
  char host[256];
  int port;
  char path[1024]; /* "" when the URL has none (or just "/") */
  char query[1024];
} url_parts;

static int parse_url(const char *u, url_parts *o) {
  memset(o, 0, sizeof *o);
  if (strncmp(u, "http://", 7) != 0) {
    fprintf(stderr, "attn load: the URL must start with http:// (\"%s\")\n", u);
    return -1;
  }
  const char *h = u + 7;
  size_t hl = strcspn(h, ":/?");
  if (hl == 0 || hl >= sizeof o->host) {
    fprintf(stderr, "attn load: no host in \"%s\"\n", u);
    return -1;
  }
  memcpy(o->host, h, hl);
  const char *p = h + hl;
  o->port = 80;
  if (*p == ':') {
    char *e;
    long port = strtol(p + 1, &e, 10);
    if (e == p + 1 || port < 1 || port > 65535 || (*e && *e != '/' && *e != '?')) {
      fprintf(stderr, "attn load: bad port in \"%s\"\n", u);
      return -1;
    }
    o->port = (int)port;
    p = e;
  }
  size_t pl = strcspn(p, "?");
  if (pl >= sizeof o->path) {
    fprintf(stderr, "attn load: path too long in \"%s\"\n", u);
    return -1;
  }
  if (pl > 1)
    memcpy(o->path, p, pl);
  if (p[pl] == '?') {
    if (strlen(p + pl + 1) >= sizeof o->query) {
      fprintf(stderr, "attn load: query too long in \"%s\"\n", u);
      return -1;
    }
    strcpy(o->query, p + pl + 1);
  }
  return 0;
}

static int resolve(const char *host, int port, struct sockaddr_in *out) {
  if (strcmp(host, "localhost") == 0)
    host = "127.0.0.1";
  if (uv_ip4_addr(host, port, out) == 0)
    return 0;
  struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res;
  if (getaddrinfo(host, NULL, &hints, &res) != 0 || !res)
    return -1;
  memcpy(out, res->ai_addr, sizeof *out);
  out->sin_port = htons((uint16_t)port);
  freeaddrinfo(res);
  return 0;
}

/* FLOPs of one request as the server will see it (the body decoded with the
 * query's options), or -1 when the body cannot be decoded here. */
static double body_flops(const char *body, size_t len, bool json, const char *query, char *desc,
                         size_t cap) {
  attn_options q;
  attn_status st;
  attn_options_init(&q);
  if (query && *query && attn_options_parse_query(&q, query, &st) != 0) {
    snprintf(desc, cap, "query not understood here: %s", st.message);
    return -1;
  }
  attn_proto_req pr;
  memset(&pr, 0, sizeof pr);
  int rc = json ? attn_proto_decode_json(body, len, &q, &pr, &st)
                : attn_proto_decode_safetensors(body, len, &q, &pr, &st);
  if (rc != 0) {
    snprintf(desc, cap, "not a request body here (%s)", st.message);
    return -1;
  }
  const attn_request *r = &pr.req;
  double f = attn_request_flops(r);
  snprintf(desc, cap, "q [%lld,%lld,%lld,%lld] kv [%lld,%lld,%lld,%lld] %s%s, %.4g GFLOP a request",
           (long long)r->batch, (long long)r->heads_q, (long long)r->seq_q, (long long)r->head_dim,
           (long long)r->batch, (long long)r->heads_kv, (long long)r->seq_kv,
           (long long)r->head_dim, attn_dtype_name(r->dtype), r->causal ? " causal" : "", f * 1e-9);
  attn_proto_req_free(&pr);
  return f;
}

/* ---- the command ----------------------------------------------------------- */

typedef struct load_args {
  int concurrency;
  double rate, duration, timeout;
  int64_t nreq, shape[4], shape_kv[4];
  bool have_c, have_r, have_d, have_n, have_shape, have_kv, have_dt, json_body, json_out;
  attn_dtype dt;
  const char *body_file, *path, *query;
  url_parts u;
} load_args;

/* getopt over argv into a; 0, 2 after a message, or -1 for --help. */
static int parse_flags(int argc, char **argv, load_args *a) {
  static const struct option opts[] = {{"concurrency", required_argument, 0, 'c'},
                                       {"rate", required_argument, 0, 'r'},
                                       {"duration", required_argument, 0, 'd'},
                                       {"requests", required_argument, 0, 'n'},
                                       {"body", required_argument, 0, 'b'},
                                       {"shape", required_argument, 0, 's'},
                                       {"shape-kv", required_argument, 0, 'k'},
                                       {"dtype", required_argument, 0, 't'},
                                       {"json-body", no_argument, 0, 'J'},
                                       {"path", required_argument, 0, 'p'},
                                       {"query", required_argument, 0, 'q'},
                                       {"timeout", required_argument, 0, 'T'},
                                       {"json", no_argument, 0, 'j'},
                                       {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
  int c, bad = 0;
  optind = 1;
  while (!bad && (c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
    switch (c) {
    case 'c':
      bad = attn_arg_int("--concurrency", optarg, 1, MAX_POOL, &a->concurrency);
      a->have_c = true;
      break;
    case 'r':
      bad = parse_double("--rate", optarg, 1e-3, 1e7, &a->rate);
      a->have_r = true;
      break;
    case 'd':
      bad = parse_double("--duration", optarg, 1e-3, 1e7, &a->duration);
      a->have_d = true;
      break;
    case 'n':
      bad = attn_arg_i64("--requests", optarg, 1, INT64_MAX / 2, &a->nreq);
      a->have_n = true;
      break;
    case 'b': a->body_file = optarg; break;
    case 's':
      bad = attn_arg_dims("--shape", optarg, a->shape);
      a->have_shape = true;
      break;
    case 'k':
      bad = attn_arg_dims("--shape-kv", optarg, a->shape_kv);
      a->have_kv = true;
      break;
    case 't':
      bad = attn_arg_dtype("--dtype", optarg, &a->dt);
      a->have_dt = true;
      break;
    case 'J': a->json_body = true; break;
    case 'p': a->path = optarg; break;
    case 'q': a->query = optarg; break;
    case 'T': bad = parse_double("--timeout", optarg, 1e-3, 1e7, &a->timeout); break;
    case 'j': a->json_out = true; break;
    case 'h': fputs(usage, stdout); return -1;
    default: fputs(usage, stderr); return 2;
    }
  }
  return bad ? 2 : 0;
}

/* The flags and the URL together; 0, 2 after a message, or -1 for --help. */
static int parse_load_args(int argc, char **argv, load_args *a) {
  int rc = parse_flags(argc, argv, a);
  if (rc != 0)
    return rc;
  const char *why = NULL;
  if (optind >= argc)
    why = "no URL";
  else if (optind + 1 < argc)
    why = "more than one URL";
  else if (a->have_c && a->have_r)
    why = "--concurrency and --rate exclude each other";
  else if (a->have_d && a->have_n)
    why = "--duration and --requests exclude each other";
  else if (a->body_file && (a->have_shape || a->have_kv || a->have_dt))
    why = "--body excludes --shape, --shape-kv and --dtype";
  else if (a->have_kv && (a->shape_kv[0] != a->shape[0] || a->shape_kv[3] != a->shape[3]))
    why = "--shape-kv must have the batch and head dim of --shape";
  else if (a->path && a->path[0] != '/')
    why = "--path must start with /";
  if (why) {
    fprintf(stderr, "attn load: %s\n%s", why, usage);
    return 2;
  }
  if (parse_url(argv[optind], &a->u) < 0)
    return 2;
  if (!a->path)
    a->path = a->u.path[0] ? a->u.path : "/attention";
  if (!a->query)
    a->query = a->u.query;
  if (a->query[0] == '?')
    a->query++;
  return 0;
}

/* The body to send: --body's file, or random tensors encoded by proto.
 * 0, or the exit status after a message. */
static int make_body(load_args *a, char **pbody, size_t *plen) {
  if (a->body_file) {
    void *fb;
    if (attn_read_file(a->body_file, &fb, plen) < 0) {
      fprintf(stderr, "attn load: cannot read %s: %s\n", a->body_file, strerror(errno));
      return 2;
    }
    *pbody = fb;
  } else {
    if (!a->have_kv)
      memcpy(a->shape_kv, a->shape, sizeof a->shape_kv);
    attn_bench_case bc;
    if (attn_bench_case_init(&bc, a->shape[0], a->shape[1], a->shape_kv[1], a->shape[2],
                             a->shape_kv[2], a->shape[3], a->dt, false, 42) < 0) {
      fprintf(stderr, "attn load: out of memory for the inputs\n");
      return 1;
    }
    attn_status st;
    void *sb = NULL;
    int erc = a->json_body ? attn_proto_encode_request_json(&bc.req, NULL, pbody, plen, &st)
                           : attn_proto_encode_request_safetensors(&bc.req, NULL, &sb, plen, &st);
    attn_bench_case_free(&bc);
    if (erc < 0) {
      fprintf(stderr, "attn load: %s\n", st.message);
      return 1;
    }
    if (!a->json_body)
      *pbody = sb;
  }
  if (*plen > UINT32_MAX) {
    fprintf(stderr, "attn load: the body is larger than 4 GiB\n");
    return 2;
  }
  return 0;
}

/* The plan and the request head into L (head: the caller's buffer of cap
 * bytes); 0, or the exit status after a message. */
static int load_setup(load *L, const load_args *a, char *head, size_t cap) {
  if (resolve(a->u.host, a->u.port, &L->addr) < 0) {
    fprintf(stderr, "attn load: cannot resolve \"%s\" (IPv4)\n", a->u.host);
    return 1;
  }
  const char *q = a->query;
  bool bad_key;
  const char *key = attn_arg_api_key("attn load", &bad_key);
  if (bad_key)
    return 2;
  int hl = snprintf(head, cap,
                    "POST %s%s%s HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: %s\r\n"
                    "Content-Length: %zu\r\nConnection: keep-alive\r\n"
                    "User-Agent: attn-load\r\n%s%.500s%s\r\n",
                    a->path, q[0] ? "?" : "", q, a->u.host, a->u.port,
                    a->json_body ? "application/json" : "application/octet-stream", L->body_len,
                    key ? "Authorization: Bearer " : "", key ? key : "", key ? "\r\n" : "");
  if (hl < 0 || (size_t)hl >= cap) {
    fprintf(stderr, "attn load: path or query too long\n");
    return 2;
  }
  L->head = head;
  L->head_len = (size_t)hl;
  L->open_loop = a->have_r;
  L->concurrency = a->concurrency;
  L->rate = a->rate;
  L->duration = a->duration;
  L->max_requests = a->have_n ? a->nreq : 0;
  L->timeout = a->timeout;
  L->max_pool = a->have_r ? MAX_POOL : a->concurrency;
  L->progress = isatty(STDOUT_FILENO);
  if (attn_hist_init(&L->hist) < 0) {
    fprintf(stderr, "attn load: out of memory\n");
    return 1;
  }
  return 0;
}

/* Runs the plan on one libuv loop until it stops; 0, or 1 when out of
 * memory for a connection. */
static int load_run(load *L) {
  uv_loop_t loop;
  uv_loop_init(&loop);
  L->loop = &loop;
  uv_timer_init(&loop, &L->tick);
  uv_timer_init(&loop, &L->sched);
  uv_timer_init(&loop, &L->end);
  uv_signal_init(&loop, &L->sigint);
  L->tick.data = L->sched.data = L->end.data = L->sigint.data = L;
  uv_signal_start(&L->sigint, on_sigint, SIGINT);
  int rc = 0;
  L->t0 = L->last_prog_ns = now_ns();
  uv_timer_start(&L->tick, on_tick, TICK_MS, TICK_MS);
  if (L->max_requests == 0)
    uv_timer_start(&L->end, on_end, (uint64_t)(L->duration * 1e3 + 0.5), 0);
  if (L->open_loop) {
    dispatch_due(L);
  } else {
    for (int i = 0; i < L->concurrency && !L->stopping; i++) {
      conn *cn = conn_new(L);
      if (!cn) {
        fprintf(stderr, "attn load: out of memory\n");
        load_stop(L);
        rc = 1;
        break;
      }
      conn_issue(cn);
    }
  }
  uv_run(&loop, UV_RUN_DEFAULT);
  if (!L->stopping) /* cannot happen: the timers keep the loop alive */
    load_stop(L);
  uv_run(&loop, UV_RUN_DEFAULT);
  if (uv_loop_close(&loop) != 0)
    fprintf(stderr, "attn load: warning: handles left open\n");
  return rc;
}

static void load_report(const load *L, const load_args *a, const char *body_desc, double flops) {
  char url[2400];
  snprintf(url, sizeof url, "http://%s:%d%s%s%s", a->u.host, a->u.port, a->path,
           a->query[0] ? "?" : "", a->query);
  if (L->progress)
    printf("\r\033[K");
  attn_load_report R = {.url = url,
                        .body_kind = a->body_file   ? a->body_file
                                     : a->json_body ? "JSON"
                                                    : "safetensors",
                        .body_desc = body_desc,
                        .body_len = L->body_len,
                        .flops = flops,
                        .elapsed = (double)(L->t_end - L->t0) * 1e-9,
                        .open_loop = L->open_loop,
                        .rate = L->rate,
                        .duration = L->duration,
                        .concurrency = L->concurrency,
                        .max_pool = L->max_pool,
                        .connections = L->npool,
                        .max_requests = L->max_requests};
  if (R.elapsed <= 0)
    R.elapsed = 1e-9;
  if (a->json_out)
    attn_load_print_json(&R, &L->n, &L->hist);
  else
    attn_load_print_text(&R, &L->n, &L->hist);
  fflush(stdout);
}

static void load_free(load *L) {
  for (int i = 0; i < L->npool; i++) {
    attn_http_reply_free(&L->pool[i]->rp);
    free(L->pool[i]->rbuf);
    free(L->pool[i]);
  }
  attn_hist_free(&L->hist);
}

int attn_cmd_load(int argc, char **argv) {
  load_args a = {
      .concurrency = 8, .duration = 10, .timeout = 30, .shape = {1, 8, 512, 64}, .dt = ATTN_F32};
  int rc = parse_load_args(argc, argv, &a);
  if (rc != 0)
    return rc < 0 ? 0 : rc;
  char *body = NULL;
  size_t body_len = 0;
  if ((rc = make_body(&a, &body, &body_len)) != 0) {
    free(body);
    return rc;
  }
  char body_desc[512];
  double flops = body_flops(body, body_len, a.json_body, a.query, body_desc, sizeof body_desc);
  load *L = calloc(1, sizeof *L); /* 8 KiB of pool: not on the stack */
  char head[3000];
  if (!L) {
    fprintf(stderr, "attn load: out of memory\n");
    free(body);
    return 1;
  }
  L->body = body;
  L->body_len = body_len;
  if ((rc = load_setup(L, &a, head, sizeof head)) == 0) {
    signal(SIGPIPE, SIG_IGN);
    rc = load_run(L);
    if (L->no_connect) {
      fprintf(stderr, "attn load: cannot connect to %s:%d: %s\n", a.u.host, a.u.port,
              uv_strerror(L->connect_err));
      rc = 1;
    }
    load_report(L, &a, body_desc, flops);
  }
  load_free(L);
  free(L);
  free(body);
  return rc;
}
