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
#include "benchlib.h"
#include "hist.h"
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
#define MAX_HEADER 65536
#define RETRY_MS 100 /* wait before reconnecting after a failed connect */
#define TICK_MS 100

enum { T_CONNECT, T_WRITE, T_READ, T_TIMEOUT, T_PROTOCOL, T_COUNT };
static const char *const terr_name[T_COUNT] = {"connect", "write", "read", "timeout",
                                               "protocol"};

enum { C_FREE, C_CONNECTING, C_OPEN, C_CLOSING };
enum { P_IDLE, P_HEAD, P_CL, P_CHUNK_SIZE, P_CHUNK_DATA, P_CHUNK_CRLF, P_TRAILER, P_EOF };

typedef struct load load;

typedef struct conn {
  uv_tcp_t tcp;
  uv_connect_t creq;
  uv_write_t wreq;
  load *L;
  int state;
  bool active;        /* a request is in flight on it */
  bool write_pending;
  bool want_next;     /* answered while its write was pending */
  bool close_after;   /* the reply said Connection: close (or HTTP/1.0) */
  bool connect_failed;
  uint64_t start_ns;  /* latency origin: the intended start */
  uint64_t sent_ns;   /* when it was handed to the connection */
  uint64_t retry_ns;  /* no reconnect before this */
  /* the reply parser */
  int pstate;
  int status;
  uint64_t remaining;
  char *hbuf;
  size_t hlen;
  char line[64];
  size_t llen;
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
  /* counts */
  uint64_t sent, answered, ok, terr[T_COUNT], in_flight_end, backlog_end;
  uint64_t status[600], status_other;
  uint64_t bytes_sent, bytes_recv;
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
  return L->max_requests > 0 && L->sent >= (uint64_t)L->max_requests;
}

static void check_done(load *L) {
  if (L->max_requests > 0 && !L->stopping) {
    uint64_t ended = L->answered;
    for (int t = 0; t < T_COUNT; t++)
      ended += L->terr[t];
    if (ended >= (uint64_t)L->max_requests)
      load_stop(L);
  }
}

static void transport_error(conn *c, int kind) {
  load *L = c->L;
  if (c->active) {
    c->active = false;
    L->terr[kind]++;
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
      transport_error(c, T_WRITE);
    else
      conn_close(c); /* answered early (say 503), then the peer closed */
    return;
  }
  L->bytes_sent += L->head_len + L->body_len;
  if (c->want_next && c->state == C_OPEN) {
    c->want_next = false;
    conn_next(c);
  }
}

static void conn_send(conn *c) {
  load *L = c->L;
  uv_buf_t b[2] = {uv_buf_init(L->head, (unsigned)L->head_len),
                   uv_buf_init((char *)(uintptr_t)L->body, (unsigned)L->body_len)};
  c->pstate = P_HEAD;
  c->hlen = 0;
  c->close_after = false;
  c->want_next = false;
  c->wreq.data = c;
  c->sent_ns = now_ns();
  int rc = uv_write(&c->wreq, (uv_stream_t *)&c->tcp, b, L->body_len ? 2 : 1, on_write);
  if (rc < 0) {
    transport_error(c, T_WRITE);
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
      L->terr[T_CONNECT]++;
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
  L->sent++;
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
  c->pstate = P_IDLE;
  if (!c->active)
    return;
  c->active = false;
  uint64_t t = now_ns();
  L->answered++;
  if (c->status >= 200 && c->status < 300)
    L->ok++;
  if (c->status >= 100 && c->status < 600)
    L->status[c->status]++;
  else
    L->status_other++;
  attn_hist_record(&L->hist, t > c->start_ns ? (t - c->start_ns + 500) / 1000 : 0);
  check_done(L);
  if (L->stopping)
    return;
  if (c->close_after) {
    conn_close(c);
  } else if (c->write_pending) {
    c->want_next = true;
  } else {
    conn_next(c);
  }
}

static bool header_is(const char *name, size_t nlen, const char *want) {
  return nlen == strlen(want) && strncasecmp(name, want, nlen) == 0;
}

static bool value_has(const char *v, size_t vlen, const char *tok) {
  size_t tl = strlen(tok);
  for (size_t i = 0; i + tl <= vlen; i++)
    if (strncasecmp(v + i, tok, tl) == 0)
      return true;
  return false;
}

/* Parses c->hbuf[0 .. len) (status line and headers, without the blank
 * line); sets the body mode. -1 when malformed. */
static int parse_head(conn *c, size_t len) {
  const char *h = c->hbuf, *end = h + len;
  const char *eol = memchr(h, '\n', len);
  if (!eol)
    eol = end;
  if (eol - h < 12 || strncmp(h, "HTTP/1.", 7) != 0 || h[8] != ' ')
    return -1;
  bool http10 = h[7] == '0';
  int st = 0;
  for (int i = 9; i < 12; i++) {
    if (h[i] < '0' || h[i] > '9')
      return -1;
    st = st * 10 + (h[i] - '0');
  }
  c->status = st;
  bool chunked = false, have_cl = false, keep_alive = false, hdr_close = false;
  uint64_t cl = 0;
  for (const char *p = eol < end ? eol + 1 : end; p < end;) {
    const char *e = memchr(p, '\n', (size_t)(end - p));
    if (!e)
      e = end;
    const char *le = e;
    if (le > p && le[-1] == '\r')
      le--;
    const char *colon = memchr(p, ':', (size_t)(le - p));
    if (colon) {
      size_t nlen = (size_t)(colon - p);
      const char *v = colon + 1;
      while (v < le && (*v == ' ' || *v == '\t'))
        v++;
      size_t vlen = (size_t)(le - v);
      if (header_is(p, nlen, "content-length")) {
        cl = 0;
        have_cl = vlen > 0;
        for (size_t i = 0; i < vlen; i++) {
          if (v[i] == ' ' || v[i] == '\t')
            break;
          if (v[i] < '0' || v[i] > '9' || cl > UINT64_MAX / 10 - 10)
            return -1;
          cl = cl * 10 + (uint64_t)(v[i] - '0');
        }
      } else if (header_is(p, nlen, "transfer-encoding")) {
        chunked = value_has(v, vlen, "chunked");
      } else if (header_is(p, nlen, "connection")) {
        hdr_close |= value_has(v, vlen, "close");
        keep_alive |= value_has(v, vlen, "keep-alive");
      }
    }
    p = e < end ? e + 1 : end;
  }
  c->close_after = hdr_close || (http10 && !keep_alive);
  if (st >= 100 && st < 200) {
    c->pstate = P_HEAD; /* an interim reply: the real one follows */
    return 0;
  }
  if (st == 204 || st == 304) {
    c->pstate = P_IDLE;
    response_done(c);
  } else if (chunked) {
    c->pstate = P_CHUNK_SIZE;
    c->llen = 0;
  } else if (have_cl) {
    c->remaining = cl;
    c->pstate = P_CL;
    if (cl == 0)
      response_done(c);
  } else {
    c->pstate = P_EOF;
    c->close_after = true;
  }
  return 0;
}

/* Appends one byte to the chunk line buffer; true when a line is complete
 * (its text, without CR LF, in c->line). */
static bool line_byte(conn *c, char ch, bool *overflow) {
  if (ch == '\n') {
    if (c->llen && c->line[c->llen - 1] == '\r')
      c->llen--;
    c->line[c->llen] = 0;
    return true;
  }
  if (c->llen + 1 >= sizeof c->line) {
    if (c->pstate == P_TRAILER) /* long trailer lines are skipped */
      return false;
    *overflow = true;
    return false;
  }
  c->line[c->llen++] = ch;
  return false;
}

/* Feeds n bytes; -1 on a protocol error. May end the response (and even
 * close or reuse the connection) part way. */
static int parse(conn *c, const char *p, size_t n) {
  while (n > 0) {
    switch (c->pstate) {
    case P_IDLE:
      return -1; /* bytes nobody asked for */
    case P_HEAD: {
      size_t old = c->hlen, take = n;
      if (old + take > MAX_HEADER)
        take = MAX_HEADER - old;
      memcpy(c->hbuf + old, p, take);
      c->hlen += take;
      size_t from = old >= 3 ? old - 3 : 0;
      char *e = NULL;
      for (size_t i = from; i + 4 <= c->hlen; i++)
        if (memcmp(c->hbuf + i, "\r\n\r\n", 4) == 0) {
          e = c->hbuf + i;
          break;
        }
      if (!e) {
        if (c->hlen >= MAX_HEADER)
          return -1;
        return 0;
      }
      size_t hend = (size_t)(e - c->hbuf) + 4; /* bytes of head in hbuf */
      size_t used = hend - old;                /* of them from p */
      p += used;
      n -= used;
      c->hlen = 0;
      if (parse_head(c, hend - 2) < 0)
        return -1;
      if (c->state != C_OPEN)
        return 0;
      break;
    }
    case P_CL: {
      size_t take = n < c->remaining ? n : (size_t)c->remaining;
      c->remaining -= take;
      p += take;
      n -= take;
      if (c->remaining == 0)
        response_done(c);
      if (c->state != C_OPEN)
        return 0;
      break;
    }
    case P_CHUNK_SIZE:
    case P_TRAILER: {
      bool over = false, line = false;
      while (n > 0 && !line && !over) {
        line = line_byte(c, *p, &over);
        p++;
        n--;
      }
      if (over)
        return -1;
      if (!line)
        return 0;
      if (c->pstate == P_TRAILER) {
        if (c->llen == 0)
          response_done(c);
        c->llen = 0;
      } else {
        char *q;
        errno = 0;
        unsigned long long sz = strtoull(c->line, &q, 16);
        if (q == c->line || errno || (*q && *q != ';' && *q != ' '))
          return -1;
        c->llen = 0;
        c->remaining = sz;
        c->pstate = sz ? P_CHUNK_DATA : P_TRAILER;
      }
      if (c->state != C_OPEN)
        return 0;
      break;
    }
    case P_CHUNK_DATA: {
      size_t take = n < c->remaining ? n : (size_t)c->remaining;
      c->remaining -= take;
      p += take;
      n -= take;
      if (c->remaining == 0) {
        c->pstate = P_CHUNK_CRLF;
        c->llen = 0;
      }
      break;
    }
    case P_CHUNK_CRLF:
      while (n > 0 && c->pstate == P_CHUNK_CRLF) {
        if (*p == '\n')
          c->pstate = P_CHUNK_SIZE;
        else if (*p != '\r')
          return -1;
        p++;
        n--;
      }
      break;
    case P_EOF:
      return 0; /* the body runs to the close */
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
    if (nread == UV_EOF && c->pstate == P_EOF && c->active) {
      c->close_after = true;
      response_done(c);
      conn_close(c);
    } else if (c->active) {
      transport_error(c, T_READ);
    } else {
      conn_close(c); /* an idle connection the server closed */
    }
    return;
  }
  L->bytes_recv += (uint64_t)nread;
  if (parse(c, buf->base, (size_t)nread) < 0)
    transport_error(c, T_PROTOCOL);
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
        L->terr[T_CONNECT]++;
      }
      L->no_connect = true;
      load_stop(L);
      return;
    }
    transport_error(c, T_CONNECT);
    return;
  }
  L->ever_connected = true;
  c->connect_failed = false;
  c->state = C_OPEN;
  c->pstate = P_IDLE;
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
  c->pstate = P_IDLE;
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
  c->hbuf = malloc(MAX_HEADER);
  c->rbuf = malloc(RBUF_SIZE);
  if (!c->hbuf || !c->rbuf) {
    free(c->hbuf);
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
    if (c->state == C_OPEN && c->pstate == P_IDLE)
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
  double rps = dt > 0 ? (double)(L->answered - L->last_prog_answered) / dt : 0;
  uint64_t terr = 0;
  for (int i = 0; i < T_COUNT; i++)
    terr += L->terr[i];
  printf("\r%6.1f s  %9.1f requests/s  p99 %9.3f ms  answered %llu  errors %llu\033[K", secs,
         rps, attn_hist_percentile(&L->hist, 99) / 1e3, (unsigned long long)L->answered,
         (unsigned long long)(L->answered - L->ok + terr));
  fflush(stdout);
  L->last_prog_ns = t;
  L->last_prog_answered = L->answered;
}

static void on_tick(uv_timer_t *tm) {
  load *L = tm->data;
  uint64_t t = now_ns();
  uint64_t limit = (uint64_t)(L->timeout * 1e9);
  for (int i = 0; i < L->npool && !L->stopping; i++) {
    conn *c = L->pool[i];
    if (c->active && t - c->sent_ns > limit)
      transport_error(c, T_TIMEOUT);
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
      L->terr[T_CONNECT]++; /* it would fail the same way */
    else if (c->active)
      L->in_flight_end++;
    c->active = false;
    conn_close(c);
  }
  if (L->open_loop && sched_more(L)) {
    uint64_t t = L->t_end;
    while (sched_more(L) && due_ns(L, L->next_i) <= t) {
      L->backlog_end++;
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
    fprintf(stderr, "attn load: %s expects a number from %g to %g, not \"%s\"\n", flag, lo,
            hi, s);
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

static char *read_whole(const char *path, size_t *plen) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  size_t cap = 1 << 16, len = 0;
  char *b = malloc(cap);
  for (;;) {
    if (!b)
      break;
    size_t n = fread(b + len, 1, cap - len, f);
    len += n;
    if (len < cap)
      break;
    char *nb = realloc(b, cap * 2);
    if (!nb) {
      free(b);
      b = NULL;
      break;
    }
    b = nb;
    cap *= 2;
  }
  if (b && ferror(f)) {
    free(b);
    b = NULL;
  }
  fclose(f);
  *plen = len;
  return b;
}

/* FLOPs of one request as the server will see it (the body decoded with the
 * query's options), or -1 when the body cannot be decoded here. */
static double body_flops(const char *body, size_t len, bool json, const char *query,
                         char *desc, size_t cap) {
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
           (long long)r->batch, (long long)r->heads_q, (long long)r->seq_q,
           (long long)r->head_dim, (long long)r->batch, (long long)r->heads_kv,
           (long long)r->seq_kv, (long long)r->head_dim, attn_dtype_name(r->dtype),
           r->causal ? " causal" : "", f * 1e-9);
  attn_proto_req_free(&pr);
  return f;
}

/* ---- the report ------------------------------------------------------------ */

static void fmt_bytes(char *b, size_t cap, uint64_t n) {
  if (n >= 1000000000ull)
    snprintf(b, cap, "%.2f GB", (double)n * 1e-9);
  else if (n >= 1000000)
    snprintf(b, cap, "%.2f MB", (double)n * 1e-6);
  else if (n >= 1000)
    snprintf(b, cap, "%.2f kB", (double)n * 1e-3);
  else
    snprintf(b, cap, "%llu B", (unsigned long long)n);
}

typedef struct report {
  const char *url, *body_kind, *body_desc;
  double flops, elapsed;
} report;

static void print_text(const load *L, const report *R, uint64_t terr) {
  const attn_hist *h = &L->hist;
  printf("attn load %s: ", R->url);
  if (L->open_loop)
    printf("open loop, %g requests/s, up to %d connections (%d used)", L->rate, L->max_pool,
           L->npool);
  else
    printf("closed loop, %d connections", L->concurrency);
  if (L->max_requests > 0)
    printf(", %lld requests\n", (long long)L->max_requests);
  else
    printf(", %g s\n", L->duration);
  printf("body       %s %zu bytes, %s\n", R->body_kind, L->body_len, R->body_desc);
  printf("requests   sent %llu, answered %llu, successful (2xx) %llu, in flight at the end %llu\n",
         (unsigned long long)L->sent, (unsigned long long)L->answered,
         (unsigned long long)L->ok, (unsigned long long)L->in_flight_end);
  bool holds = L->sent == L->answered + terr + L->in_flight_end;
  printf("invariant  sent %llu = answered %llu + transport errors %llu + in flight %llu: %s\n",
         (unsigned long long)L->sent, (unsigned long long)L->answered,
         (unsigned long long)terr, (unsigned long long)L->in_flight_end,
         holds ? "holds" : "BROKEN");
  printf("errors     HTTP:");
  bool any = false;
  for (int s = 0; s < 600; s++)
    if (L->status[s] && (s < 200 || s >= 300)) {
      printf(" %d x%llu", s, (unsigned long long)L->status[s]);
      any = true;
    }
  if (L->status_other) {
    printf(" other x%llu", (unsigned long long)L->status_other);
    any = true;
  }
  printf("%s; transport:", any ? "" : " none");
  for (int t = 0; t < T_COUNT; t++)
    printf(" %s %llu%s", terr_name[t], (unsigned long long)L->terr[t], t + 1 < T_COUNT ? "," : "");
  printf("\n");
  if (L->backlog_end)
    printf("backlog    %llu requests were due but never sent (all %d connections busy)\n",
           (unsigned long long)L->backlog_end, L->max_pool);
  printf("throughput %.1f requests/s, %.1f successful/s, ", (double)L->answered / R->elapsed,
         (double)L->ok / R->elapsed);
  if (R->flops >= 0)
    printf("%.2f GFLOP/s served", (double)L->ok * R->flops / R->elapsed * 1e-9);
  else
    printf("GFLOP/s unknown");
  printf(" over %.3f s\n", R->elapsed);
  printf("latency ms p50 %.3f  p90 %.3f  p99 %.3f  p99.9 %.3f  max %.3f  (min %.3f, mean %.3f%s)\n",
         attn_hist_percentile(h, 50) / 1e3, attn_hist_percentile(h, 90) / 1e3,
         attn_hist_percentile(h, 99) / 1e3, attn_hist_percentile(h, 99.9) / 1e3,
         (double)attn_hist_max(h) / 1e3, (double)attn_hist_min(h) / 1e3,
         attn_hist_mean(h) / 1e3, L->open_loop ? ", from the intended start" : "");
  char bs[32], br[32];
  fmt_bytes(bs, sizeof bs, L->bytes_sent);
  fmt_bytes(br, sizeof br, L->bytes_recv);
  printf("bytes      sent %s (%llu), received %s (%llu)\n", bs,
         (unsigned long long)L->bytes_sent, br, (unsigned long long)L->bytes_recv);
}

static void json_str(const char *s) {
  putchar('"');
  for (; *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\')
      printf("\\%c", ch);
    else if (ch < 0x20)
      printf("\\u%04x", ch);
    else
      putchar(ch);
  }
  putchar('"');
}

static void print_json(const load *L, const report *R, uint64_t terr) {
  const attn_hist *h = &L->hist;
  printf("{\"url\": ");
  json_str(R->url);
  printf(", \"mode\": \"%s\", \"concurrency\": %d, \"rate\": ",
         L->open_loop ? "open" : "closed", L->open_loop ? L->npool : L->concurrency);
  if (L->open_loop)
    printf("%.17g", L->rate);
  else
    printf("null");
  printf(", \"connections\": %d, \"duration_s\": %.6f, \"body_bytes\": %zu, \"body\": ",
         L->npool, R->elapsed, L->body_len);
  json_str(R->body_desc);
  printf(",\n \"sent\": %llu, \"answered\": %llu, \"successful\": %llu, \"in_flight\": %llu, "
         "\"backlog\": %llu, \"transport_errors\": %llu",
         (unsigned long long)L->sent, (unsigned long long)L->answered,
         (unsigned long long)L->ok, (unsigned long long)L->in_flight_end,
         (unsigned long long)L->backlog_end, (unsigned long long)terr);
  printf(",\n \"errors\": {\"status\": {");
  bool first = true;
  for (int s = 0; s < 600; s++)
    if (L->status[s] && (s < 200 || s >= 300)) {
      printf("%s\"%d\": %llu", first ? "" : ", ", s, (unsigned long long)L->status[s]);
      first = false;
    }
  if (L->status_other)
    printf("%s\"other\": %llu", first ? "" : ", ", (unsigned long long)L->status_other);
  printf("}, \"transport\": {");
  for (int t = 0; t < T_COUNT; t++)
    printf("%s\"%s\": %llu", t ? ", " : "", terr_name[t], (unsigned long long)L->terr[t]);
  printf("}},\n \"status\": {");
  first = true;
  for (int s = 0; s < 600; s++)
    if (L->status[s]) {
      printf("%s\"%d\": %llu", first ? "" : ", ", s, (unsigned long long)L->status[s]);
      first = false;
    }
  printf("},\n \"requests_per_s\": %.3f, \"successful_per_s\": %.3f, \"gflops\": ",
         (double)L->answered / R->elapsed, (double)L->ok / R->elapsed);
  if (R->flops >= 0)
    printf("%.4f, \"flops_per_request\": %.17g", (double)L->ok * R->flops / R->elapsed * 1e-9,
           R->flops);
  else
    printf("null, \"flops_per_request\": null");
  printf(",\n \"latency_ms\": {\"p50\": %.4f, \"p90\": %.4f, \"p99\": %.4f, \"p99.9\": %.4f, "
         "\"max\": %.4f, \"min\": %.4f, \"mean\": %.4f, \"count\": %llu}",
         attn_hist_percentile(h, 50) / 1e3, attn_hist_percentile(h, 90) / 1e3,
         attn_hist_percentile(h, 99) / 1e3, attn_hist_percentile(h, 99.9) / 1e3,
         (double)attn_hist_max(h) / 1e3, (double)attn_hist_min(h) / 1e3,
         attn_hist_mean(h) / 1e3, (unsigned long long)attn_hist_count(h));
  printf(",\n \"bytes_sent\": %llu, \"bytes_received\": %llu",
         (unsigned long long)L->bytes_sent, (unsigned long long)L->bytes_recv);
  printf(",\n \"invariant\": {\"holds\": %s, \"text\": \"sent %llu = answered %llu + transport "
         "errors %llu + in flight %llu\"}}\n",
         L->sent == L->answered + terr + L->in_flight_end ? "true" : "false",
         (unsigned long long)L->sent, (unsigned long long)L->answered,
         (unsigned long long)terr, (unsigned long long)L->in_flight_end);
}

/* ---- the command ----------------------------------------------------------- */

int attn_cmd_load(int argc, char **argv) {
  static const struct option opts[] = {
      {"concurrency", required_argument, 0, 'c'}, {"rate", required_argument, 0, 'r'},
      {"duration", required_argument, 0, 'd'},    {"requests", required_argument, 0, 'n'},
      {"body", required_argument, 0, 'b'},        {"shape", required_argument, 0, 's'},
      {"shape-kv", required_argument, 0, 'k'},    {"dtype", required_argument, 0, 't'},
      {"json-body", no_argument, 0, 'J'},         {"path", required_argument, 0, 'p'},
      {"query", required_argument, 0, 'q'},       {"timeout", required_argument, 0, 'T'},
      {"json", no_argument, 0, 'j'},              {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0}};
  int concurrency = 8, c, bad = 0;
  double rate = 0, duration = 10, timeout = 30;
  int64_t nreq = 0, shape[4] = {1, 8, 512, 64}, shape_kv[4];
  bool have_c = false, have_r = false, have_d = false, have_n = false, have_shape = false,
       have_kv = false, have_dt = false, json_body = false, json_out = false;
  attn_dtype dt = ATTN_F32;
  const char *body_file = NULL, *path = NULL, *query = NULL;
  optind = 1;
  while (!bad && (c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
    switch (c) {
    case 'c':
      bad = attn_arg_int("--concurrency", optarg, 1, MAX_POOL, &concurrency);
      have_c = true;
      break;
    case 'r': bad = parse_double("--rate", optarg, 1e-3, 1e7, &rate); have_r = true; break;
    case 'd': bad = parse_double("--duration", optarg, 1e-3, 1e7, &duration); have_d = true; break;
    case 'n':
      bad = attn_arg_i64("--requests", optarg, 1, INT64_MAX / 2, &nreq);
      have_n = true;
      break;
    case 'b': body_file = optarg; break;
    case 's': bad = attn_arg_dims("--shape", optarg, shape); have_shape = true; break;
    case 'k': bad = attn_arg_dims("--shape-kv", optarg, shape_kv); have_kv = true; break;
    case 't': bad = attn_arg_dtype("--dtype", optarg, &dt); have_dt = true; break;
    case 'J': json_body = true; break;
    case 'p': path = optarg; break;
    case 'q': query = optarg; break;
    case 'T': bad = parse_double("--timeout", optarg, 1e-3, 1e7, &timeout); break;
    case 'j': json_out = true; break;
    case 'h': fputs(usage, stdout); return 0;
    default: fputs(usage, stderr); return 2;
    }
  }
  if (bad)
    return 2;
  const char *why = NULL;
  if (optind >= argc)
    why = "no URL";
  else if (optind + 1 < argc)
    why = "more than one URL";
  else if (have_c && have_r)
    why = "--concurrency and --rate exclude each other";
  else if (have_d && have_n)
    why = "--duration and --requests exclude each other";
  else if (body_file && (have_shape || have_kv || have_dt))
    why = "--body excludes --shape, --shape-kv and --dtype";
  else if (have_kv && (shape_kv[0] != shape[0] || shape_kv[3] != shape[3]))
    why = "--shape-kv must have the batch and head dim of --shape";
  else if (path && path[0] != '/')
    why = "--path must start with /";
  if (why) {
    fprintf(stderr, "attn load: %s\n%s", why, usage);
    return 2;
  }
  url_parts u;
  if (parse_url(argv[optind], &u) < 0)
    return 2;
  if (!path)
    path = u.path[0] ? u.path : "/attention";
  if (!query)
    query = u.query;
  if (query[0] == '?')
    query++;

  /* the body */
  char *body = NULL;
  size_t body_len = 0;
  if (body_file) {
    body = read_whole(body_file, &body_len);
    if (!body) {
      fprintf(stderr, "attn load: cannot read %s: %s\n", body_file, strerror(errno));
      return 2;
    }
  } else {
    if (!have_kv)
      memcpy(shape_kv, shape, sizeof shape_kv);
    attn_bench_case bc;
    if (attn_bench_case_init(&bc, shape[0], shape[1], shape_kv[1], shape[2], shape_kv[2],
                             shape[3], dt, false, 42) < 0) {
      fprintf(stderr, "attn load: out of memory for the inputs\n");
      return 1;
    }
    attn_status st;
    void *sb = NULL;
    int erc = json_body ? attn_proto_encode_request_json(&bc.req, NULL, &body, &body_len, &st)
                        : attn_proto_encode_request_safetensors(&bc.req, NULL, &sb, &body_len,
                                                                &st);
    attn_bench_case_free(&bc);
    if (erc < 0) {
      fprintf(stderr, "attn load: %s\n", st.message);
      return 1;
    }
    if (!json_body)
      body = sb;
  }
  if (body_len > UINT32_MAX) {
    fprintf(stderr, "attn load: the body is larger than 4 GiB\n");
    free(body);
    return 2;
  }
  char body_desc[512];
  double flops = body_flops(body, body_len, json_body, query, body_desc, sizeof body_desc);

  static load L0;
  load *L = &L0;
  memset(L, 0, sizeof *L);
  if (resolve(u.host, u.port, &L->addr) < 0) {
    fprintf(stderr, "attn load: cannot resolve \"%s\" (IPv4)\n", u.host);
    free(body);
    return 1;
  }
  char url[2400];
  snprintf(url, sizeof url, "http://%s:%d%s%s%s", u.host, u.port, path, query[0] ? "?" : "",
           query);
  char head[3000];
  int hl = snprintf(head, sizeof head,
                    "POST %s%s%s HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: %s\r\n"
                    "Content-Length: %zu\r\nConnection: keep-alive\r\n"
                    "User-Agent: attn-load\r\n\r\n",
                    path, query[0] ? "?" : "", query, u.host, u.port,
                    json_body ? "application/json" : "application/octet-stream", body_len);
  if (hl < 0 || (size_t)hl >= sizeof head) {
    fprintf(stderr, "attn load: path or query too long\n");
    free(body);
    return 2;
  }
  L->head = head;
  L->head_len = (size_t)hl;
  L->body = body;
  L->body_len = body_len;
  L->open_loop = have_r;
  L->concurrency = concurrency;
  L->rate = rate;
  L->duration = duration;
  L->max_requests = have_n ? nreq : 0;
  L->timeout = timeout;
  L->max_pool = have_r ? MAX_POOL : concurrency;
  L->progress = isatty(STDOUT_FILENO);
  if (attn_hist_init(&L->hist) < 0) {
    fprintf(stderr, "attn load: out of memory\n");
    free(body);
    return 1;
  }
  signal(SIGPIPE, SIG_IGN);

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
  if (!have_n)
    uv_timer_start(&L->end, on_end, (uint64_t)(duration * 1e3 + 0.5), 0);
  if (L->open_loop) {
    dispatch_due(L);
  } else {
    for (int i = 0; i < concurrency && !L->stopping; i++) {
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

  if (L->progress)
    printf("\r\033[K");
  uint64_t terr = 0;
  for (int t = 0; t < T_COUNT; t++)
    terr += L->terr[t];
  report R = {.url = url,
              .body_kind = body_file ? body_file : json_body ? "JSON" : "safetensors",
              .body_desc = body_desc,
              .flops = flops,
              .elapsed = (double)(L->t_end - L->t0) * 1e-9};
  if (R.elapsed <= 0)
    R.elapsed = 1e-9;
  if (L->no_connect) {
    fprintf(stderr, "attn load: cannot connect to %s:%d: %s\n", u.host, u.port,
            uv_strerror(L->connect_err));
    rc = 1;
  }
  if (json_out)
    print_json(L, &R, terr);
  else
    print_text(L, &R, terr);
  fflush(stdout);

  for (int i = 0; i < L->npool; i++) {
    free(L->pool[i]->hbuf);
    free(L->pool[i]->rbuf);
    free(L->pool[i]);
  }
  attn_hist_free(&L->hist);
  free(body);
  return rc;
}
