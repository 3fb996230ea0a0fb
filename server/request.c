/*
 * request.c — one HTTP request's life, apart from the HTTP library and the
 * scheduler: its creation and references, its reply (attnd_req_fail is the
 * only way to set an error), the body budget it draws on, the uploads a
 * drain waits for, and its metrics label.
 */
#include "request.h"
#include "errors.h"
#include "kind.h"
#include "route.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

attnd_req *attnd_req_new(attnd_server *s) {
  attnd_req *r = calloc(1, sizeof *r);
  if (!r)
    return NULL;
  r->srv = s;
  r->fd = -1;
  r->series = -1;
  atomic_init(&r->refs, 1); /* the connection's */
  r->t_received = attn_now();
  attnd_reqid_make(&s->ids, r->id);
  memcpy(r->method, "-", 2);
  memcpy(r->path, "-", 2);
  return r;
}

void attnd_req_unref(attnd_req *r) {
  if (atomic_fetch_sub(&r->refs, 1) != 1)
    return;
  attn_proto_req_free(&r->pr);
  if (attnd_req_computes(r) && r->route->kind->free) /* what its kind holds beside r */
    r->route->kind->free(r);
  attnd_req_drop_body(r);
  free(r->plain);
  attnd_body_release(r);
  free(r->query);
  free(r->resp);
  attnd_outbuf_free(r->srv, r->parts_buf);
  if (r->stream.end) /* set, never queued */
    r->stream.end(r->stream.arg);
  free(r->out);
  attnd_outbuf_free(r->srv, r->out_parts_buf);
  free(r);
}

bool attnd_req_computes(const attnd_req *r) { return r->route && r->route->kind; }

void attnd_outbuf_free(attnd_server *s, void *p) {
  if (p && !(s && s->engine && attn_engine_host_free(s->engine, p)))
    free(p);
}

/* ---- the reply ------------------------------------------------------------ */

void attnd_req_reply(attnd_req *r, int status, char *buf, size_t len, const char *ctype) {
  if (r->stream.end) /* a stream set before is not sent */
    r->stream.end(r->stream.arg);
  r->stream = (attnd_stream){0};
  free(r->resp);
  attnd_outbuf_free(r->srv, r->parts_buf);
  r->parts_buf = NULL;
  r->nparts = 0;
  r->status = status;
  r->resp = buf;
  r->resp_len = len;
  r->ctype = ctype;
  r->resp_json_len = 0;
}

void attnd_req_reply_stream(attnd_req *r, int status, const attnd_stream *s, const char *ctype) {
  attnd_req_reply(r, status, NULL, 0, ctype);
  r->stream = *s;
}

void attnd_req_reply_json(attnd_req *r, int status, attn_sbuf *b) {
  if (b->oom) {
    free(b->p);
    attnd_req_fail(r, ATTND_EOUT_OF_MEMORY, "out of memory building the reply");
    return;
  }
  attnd_req_reply(r, status, b->p, b->len, ATTND_JSON_TYPE);
}

/* The one way an error reply is set: the body, Retry-After on a 503, and
 * the count by code. A client that is gone gets no reply at all: the
 * connection is closed and the 499 only logged. */
void attnd_req_fail(attnd_req *r, int code, const char *message) {
  const char *name = attnd_err_code(code);
  attnd_metrics_error(r->srv->metrics, name);
  if (code == ATTND_ECLIENT_CLOSED) {
    r->gone = true;
    return;
  }
  int status = attnd_err_status(code);
  size_t len = 0;
  /* /v2 speaks the inference protocol's error shape; the code is still
   * counted, and the status is the same. */
  char *b =
      r->v2 ? attn_proto_v2_error_body(message, &len) : attn_proto_error_body(name, message, &len);
  attnd_req_reply(r, status, b, b ? len : 0, ATTND_JSON_TYPE);
  r->retry_after = status == 503;
}

/* ---- the body budget and uploads ----------------------------------------------- */

/* Links r into (on) or out of the uploads a drain waits for. */
static void upload_track(attnd_req *r, bool on) {
  attnd_server *s = r->srv;
  pthread_mutex_lock(&s->mu);
  if (on) {
    r->up_prev = NULL;
    r->up_next = s->up_head;
    if (s->up_head)
      s->up_head->up_prev = r;
    s->up_head = r;
  } else {
    if (r->up_prev)
      r->up_prev->up_next = r->up_next;
    else
      s->up_head = r->up_next;
    if (r->up_next)
      r->up_next->up_prev = r->up_prev;
  }
  pthread_mutex_unlock(&s->mu);
}

void attnd_req_drop_body(attnd_req *r) {
  if (r->body_mapped)
    attnd_bodybuf_put(&r->srv->bufs, r->body);
  else
    free(r->body);
  r->body = NULL;
  r->body_mapped = false;
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
  if (r->srv->cfg->max_queue == 0) {
    attnd_req_fail(r, ATTND_EQUEUE_FULL, "this server admits no requests (--max-queue 0)");
    return;
  }
  snprintf(msg, sizeof msg,
           "request bodies already hold the server's memory budget (--max-queue x "
           "--max-body = %llu bytes); retry shortly",
           (unsigned long long)r->srv->cfg->max_queue * r->srv->cfg->max_body);
  attnd_req_fail(r, ATTND_EQUEUE_FULL, msg);
}

/* A POST whose headers arrived and whose body is still being read: a drain
 * waits for it. Counted before the drain check in begin_post, so a drain
 * that begins meanwhile either sees the count or is seen by the check. */
void attnd_upload_begin(attnd_req *r) {
  r->uploading = true;
  upload_track(r, true);
  attnd_metrics_gauge_add(r->srv->metrics, ATTND_GAUGE_UPLOADS, 1);
}

void attnd_upload_end(attnd_req *r) {
  if (!r->uploading)
    return;
  r->uploading = false;
  upload_track(r, false);
  attnd_metrics_gauge_add(r->srv->metrics, ATTND_GAUGE_UPLOADS, -1);
}

/* ---- its metrics label -------------------------------------------------------- */

int attnd_req_series(const attnd_req *r) { return r->route && r->route->label ? r->series : -1; }

const char *attnd_req_route_label(const attnd_req *r) {
  if (r->route && r->route->label)
    return r->route->label;
  return r->v2 ? "/v2/*" : r->path;
}
