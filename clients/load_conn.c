/* load_conn.c — see load_conn.h. */
#include "load_conn.h"
#include "load_report.h"

#include <stdlib.h>

#define RBUF_SIZE 65536

uint64_t tool_load_now_ns(void) { return uv_hrtime(); }

static const tool_load_conn_ops *ops(const tool_load_conn *c) { return c->w->ops; }

void tool_load_conn_fail(tool_load_conn *c, int kind) {
  bool busy = tool_load_conn_drop(c);
  tool_load_conn_close(c);
  ops(c)->failed(c, kind, 0, busy);
}

bool tool_load_conn_drop(tool_load_conn *c) {
  bool busy = c->active;
  c->active = false;
  return busy;
}

/* A connect that failed: no reconnect before the retry time. */
static void connect_error(tool_load_conn *c) {
  c->connect_failed = true;
  c->retry_ns = tool_load_now_ns() + (uint64_t)TOOL_LOAD_RETRY_MS * 1000000;
  c->state = TOOL_LOAD_OPEN; /* so that tool_load_conn_close closes it */
}

static void connect_failed(tool_load_conn *c, int err) {
  bool busy = tool_load_conn_drop(c);
  tool_load_conn_close(c);
  ops(c)->failed(c, TOOL_TERR_CONNECT, err, busy);
}

static void on_write(uv_write_t *w, int status) {
  tool_load_conn *c = w->data;
  c->write_pending = false;
  if (status == UV_ECANCELED)
    return; /* the handle is closing */
  if (status < 0) {
    if (c->active)
      tool_load_conn_fail(c, TOOL_TERR_WRITE);
    else
      tool_load_conn_close(c); /* answered early (say 503), then the peer closed */
    return;
  }
  c->bytes_sent += c->w->head_len + c->w->body_len;
  if (c->want_next && c->state == TOOL_LOAD_OPEN) {
    c->want_next = false;
    ops(c)->ready(c);
  }
}

static void send_request(tool_load_conn *c) {
  const tool_load_wire *w = c->w;
  uv_buf_t b[2] = {uv_buf_init((char *)(uintptr_t)w->head, (unsigned)w->head_len),
                   uv_buf_init((char *)(uintptr_t)w->body, (unsigned)w->body_len)};
  attn_http_reply_start(&c->rp);
  c->want_next = false;
  c->wreq.data = c;
  c->sent_ns = tool_load_now_ns();
  int rc = uv_write(&c->wreq, (uv_stream_t *)&c->tcp, b, w->body_len ? 2 : 1, on_write);
  if (rc < 0) {
    tool_load_conn_fail(c, TOOL_TERR_WRITE);
    return;
  }
  c->write_pending = true;
}

/* The reply to the request in flight is in: the owner counts it, then c
 * closes, waits for its write, or is ready for the next. */
static void reply_done(tool_load_conn *c) {
  if (!tool_load_conn_drop(c))
    return;
  if (!ops(c)->answered(c, c->rp.status))
    return;
  if (c->rp.close_after)
    tool_load_conn_close(c);
  else if (c->write_pending)
    c->want_next = true;
  else
    ops(c)->ready(c);
}

/* Feeds read bytes to the reply parser; each reply that ends is counted
 * (and may close the connection or send its next request) before the bytes
 * after it are fed. -1 on a protocol error. */
static int parse(tool_load_conn *c, const char *p, size_t n) {
  while (n > 0) {
    size_t used;
    int rc = attn_http_reply_feed(&c->rp, p, n, &used);
    if (rc == ATTN_HTTP_ERROR)
      return -1;
    p += used;
    n -= used;
    if (rc == ATTN_HTTP_DONE) {
      reply_done(c);
      if (c->state != TOOL_LOAD_OPEN)
        return 0;
    }
  }
  return 0;
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)suggested;
  tool_load_conn *c = h->data;
  *buf = uv_buf_init(c->rbuf, RBUF_SIZE);
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
  tool_load_conn *c = s->data;
  if (nread == 0 || c->state != TOOL_LOAD_OPEN)
    return;
  if (nread < 0) {
    if (nread == UV_EOF && attn_http_reply_until_close(&c->rp) && c->active) {
      attn_http_reply_reset(&c->rp);
      reply_done(c);
      tool_load_conn_close(c);
    } else if (c->active) {
      tool_load_conn_fail(c, TOOL_TERR_READ);
    } else {
      tool_load_conn_close(c); /* an idle connection the server closed */
    }
    return;
  }
  c->bytes_recv += (uint64_t)nread;
  if (parse(c, buf->base, (size_t)nread) < 0)
    tool_load_conn_fail(c, TOOL_TERR_PROTOCOL);
}

static void on_connect(uv_connect_t *req, int status) {
  tool_load_conn *c = req->data;
  if (status == UV_ECANCELED || c->state != TOOL_LOAD_CONNECTING)
    return;
  if (status < 0) {
    connect_error(c);
    if (!ops(c)->unreachable(c, status))
      connect_failed(c, status);
    return;
  }
  bool busy = c->active;
  c->connect_failed = false;
  c->state = TOOL_LOAD_OPEN;
  attn_http_reply_reset(&c->rp);
  uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
  ops(c)->connected(c, busy);
  if (busy)
    send_request(c);
}

static void start_connect(tool_load_conn *c) {
  uv_tcp_init(c->w->loop, &c->tcp);
  c->tcp.data = c;
  c->state = TOOL_LOAD_CONNECTING;
  uv_tcp_nodelay(&c->tcp, 1);
  c->creq.data = c;
  int rc = uv_tcp_connect(&c->creq, &c->tcp, (const struct sockaddr *)&c->w->addr, on_connect);
  if (rc < 0) {
    connect_error(c);
    connect_failed(c, rc);
  }
}

void tool_load_conn_start(tool_load_conn *c, uint64_t start) {
  c->active = true;
  c->start_ns = start;
  c->sent_ns = tool_load_now_ns();
  if (c->state == TOOL_LOAD_OPEN)
    send_request(c);
  else if (c->state == TOOL_LOAD_FREE)
    start_connect(c);
}

static void on_close(uv_handle_t *h) {
  tool_load_conn *c = h->data;
  c->state = TOOL_LOAD_FREE;
  attn_http_reply_reset(&c->rp);
  c->write_pending = false;
  c->want_next = false;
  ops(c)->ready(c);
}

void tool_load_conn_close(tool_load_conn *c) {
  if (c->state == TOOL_LOAD_FREE || c->state == TOOL_LOAD_CLOSING)
    return;
  c->state = TOOL_LOAD_CLOSING;
  uv_close((uv_handle_t *)&c->tcp, on_close);
}

tool_load_conn *tool_load_conn_new(const tool_load_wire *w) {
  tool_load_conn *c = calloc(1, sizeof *c);
  if (!c)
    return NULL;
  c->rbuf = malloc(RBUF_SIZE);
  if (attn_http_reply_init(&c->rp) < 0 || !c->rbuf) {
    tool_load_conn_free(c);
    return NULL;
  }
  c->w = w;
  c->state = TOOL_LOAD_FREE;
  return c;
}

void tool_load_conn_free(tool_load_conn *c) {
  if (!c)
    return;
  attn_http_reply_free(&c->rp);
  free(c->rbuf);
  free(c);
}
