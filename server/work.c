/*
 * work.c — what a computing request's job does off the loop (work.h): its
 * decode (Content-Encoding undone, then its kind's, kind.h) and submission
 * on libuv's threadpool, the engine's handoff back to the loop, its encode
 * on the threadpool, and the memory its decode draws on the body budget.
 * Every step that differs by what the request computes is its kind's.
 */
#include "work.h"
#include "errors.h"
#include "jobs.h"
#include "kind.h"
#include "route.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The tensors are no longer needed once the engine is done; the reply is
 * what stays. */
void attnd_work_drop_inputs(attnd_req *r) {
  attn_proto_req_free(&r->pr);
  attnd_req_drop_body(r);
  free(r->plain);
  r->plain = NULL;
  attnd_body_release(r);
}

/* The engine calls this, on one of its threads, when a submitted job ends. */
static void engine_done(const attn_result *res, void *arg);

/* What decoding len bytes of r's body allocates beside them: its kind's
 * word. */
static uint64_t decode_need(const attnd_req *r, size_t len) { return r->route->kind->need(r, len); }

/* Reserves what decoding r's body will hold (decode_need), held like the
 * body until attnd_work_drop_inputs(); false with r's reply set. A body whose decode
 * could not fit even in an idle server is too large (a retry would never
 * help); one that does not fit now is asked to retry. */
bool attnd_work_reserve(attnd_req *r) {
  const attnd_config *c = r->srv->cfg;
  uint64_t need = decode_need(r, r->len);
  uint64_t budget = (uint64_t)c->max_queue * c->max_body;
  if (need == 0 || r->decoded) /* a decoded body's tensors were reserved before */
    return true;
  if (r->reserved + need > budget) {
    char msg[320];
    snprintf(msg, sizeof msg,
             "decoding this %zu-byte body needs %llu bytes beside it, past the server's "
             "memory budget (--max-queue x --max-body = %llu bytes); %s",
             r->len, (unsigned long long)need, (unsigned long long)budget,
             r->route->kind->too_large);
    attnd_req_fail(r, ATTND_ETOO_LARGE, msg);
    return false;
  }
  if (!attnd_body_reserve(r, need)) {
    attnd_body_over_budget(r);
    return false;
  }
  return true;
}

/* The decoded body draws on the body budget as the body did. */
static bool grow_plain(void *ctx, size_t more) { return attnd_body_reserve(ctx, more); }

/* A gzip or deflate body decoded into r->plain (threadpool), with what its
 * decode holds reserved beyond what the encoded size already did; the
 * encoded body is freed. 0, or -1 with *st set. */
static int inflate_body(attnd_req *r, attn_status *st) {
  const attnd_config *c = r->srv->cfg;
  st->code = attnd_inflate(r->encoding, r->body, r->len, (size_t)c->max_body, grow_plain, r,
                           &r->plain, &r->plain_len, st->message, sizeof st->message);
  if (st->code)
    return -1;
  attnd_req_drop_body(r);
  uint64_t had = decode_need(r, r->len), need = decode_need(r, r->plain_len);
  if (need <= had || attnd_body_reserve(r, (size_t)(need - had)))
    return 0;
  st->code = ATTND_EQUEUE_FULL;
  snprintf(st->message, sizeof st->message,
           "decoding this body (%zu bytes after Content-Encoding) would pass the server's "
           "memory budget (--max-queue x --max-body); retry shortly, or send binary tensors",
           r->plain_len);
  return -1;
}

/* r's body into r->pr by its kind, once any Content-Encoding is undone. */
static int decode_body(attnd_req *r, attn_status *st) {
  if (r->encoding != ATTND_ENC_IDENTITY && inflate_body(r, st) < 0)
    return st->code;
  const char *body = r->plain ? r->plain : r->body;
  size_t len = r->plain ? r->plain_len : r->len;
  return r->route->kind->decode(r, body, len, st);
}

/* --max-pairs, checked on the decoded request before it computes: a body of
 * a few hundred kilobytes can ask for minutes of work (787 KB of F16 at
 * N = 131072, D = 1 is 1.7e10 pairs), which no --max-body catches. */
static int check_pairs(const attnd_req *r, attn_status *st) {
  if (!r->route->kind->max_pairs)
    return 0;
  uint64_t cap = r->srv->cfg->max_pairs, n = attn_request_pairs(&r->pr.req);
  if (cap == 0 || n <= cap)
    return 0;
  return attn_status_set(st, ATTND_ETOO_MUCH_WORK,
                         "this request has %llu score pairs, over --max-pairs %llu (batch x "
                         "heads x Nq x Nkv, summed over its sequences); split it into smaller "
                         "requests",
                         (unsigned long long)n, (unsigned long long)cap);
}

/* The outputs past the body's size drawn on the body budget. Up to it they
 * always were covered: outputs never outgrew the inputs until v could have a
 * head dim of its own, and O of Dv can (D 1, Dv 256: 256 times q). */
static int reserve_outputs(attnd_req *r, attn_status *st) {
  const attnd_config *c = r->srv->cfg;
  size_t len = r->plain ? r->plain_len : r->len, out = r->pr.out_bytes;
  if (out <= len || attnd_body_reserve(r, out - len))
    return 0;
  bool never = out - len > (uint64_t)c->max_queue * c->max_body;
  return attn_status_set(st, never ? ATTND_ETOO_LARGE : ATTND_EQUEUE_FULL,
                         "the outputs of this request (%zu bytes) would pass the server's memory "
                         "budget (--max-queue x --max-body = %llu bytes); %s",
                         out, (unsigned long long)c->max_queue * c->max_body,
                         never ? "split it into smaller requests" : "retry shortly");
}

static void outbuf_free(void *ctx, void *p) { attnd_outbuf_free(ctx, p); }

/* The outputs (not yet computed) moved into page-locked memory when the
 * engine lends it and the kind computes there: a GPU then downloads them in
 * place, and a safetensors reply is sent from there. */
static void pin_outputs(attnd_req *r) {
  if (!r->route->kind->pin || r->pr.out_bytes == 0)
    return;
  void *buf = attn_engine_host_alloc(r->srv->engine, r->pr.out_bytes);
  if (buf)
    attn_proto_req_set_out(&r->pr, buf, outbuf_free, r->srv);
}

int attnd_work_decode(attnd_req *r, attn_status *st) {
  int rc = decode_body(r, st);
  if (rc == 0)
    rc = check_pairs(r, st);
  if (rc == 0)
    rc = reserve_outputs(r, st);
  if (rc == 0) {
    r->decoded = true;
    pin_outputs(r);
    /* "auto" means the server's backend; a named one is the client's call */
    if (!strcmp(r->pr.req.backend, "auto"))
      r->pr.req.backend = r->srv->backend;
    /* a job canceled while it decoded is refused by the engine */
    r->pr.req.cancel = &r->cancel;
  }
  return rc;
}

void attnd_work_decode_submit(uv_work_t *w) {
  attnd_req *r = w->data;
  attn_status st;
  int rc = r->decoded ? 0 : attnd_work_decode(r, &st);
  if (rc == 0) {
    /* Set before submitting: once submitted, the job may complete (and r be
     * touched by the loop) before this thread returns. */
    r->in_engine = true;
    rc = r->route->kind->submit(r, engine_done, &st);
    if (rc == 0)
      return;
    r->in_engine = false;
  }
  r->t_engine = attn_now();
  r->job_st = st;
  attnd_work_drop_inputs(r);
}

/* Any engine thread: hand the finished job to the loop. */
static void engine_done(const attn_result *res, void *arg) {
  attnd_req *r = arg;
  attnd_server *s = r->srv;
  r->res = *res;
  r->t_engine = attn_now();
  pthread_mutex_lock(&s->mu);
  attnd_jobs_push(&s->done_head, &s->done_tail, r);
  pthread_mutex_unlock(&s->mu);
  uv_async_send(&s->completed);
}

void attnd_work_encode_result(attnd_req *r) {
  attn_status st;
  int rc;
  if (r->res.status.code) {
    st = r->res.status;
    rc = -1;
  } else {
    rc = r->route->kind->encode(r, &st);
  }
  if (rc == 0 && r->out_nparts) { /* sent from the outputs as they lie: keep them */
    r->out_parts_buf = r->pr.out; /* freed by attnd_outbuf_free() */
    r->pr.out = NULL;
  }
  if (rc < 0)
    r->job_st = st;
  attnd_work_drop_inputs(r);
}

void attnd_work_encode(uv_work_t *w) { attnd_work_encode_result(w->data); }

void attnd_work_reply(attnd_req *r) {
  r->t_done = r->t_engine;
  if (r->job_st.code) {
    attnd_req_fail(r, r->job_st.code, r->job_st.message);
    return;
  }
  free(r->resp);
  r->status = 200;
  r->resp = r->out;
  r->resp_len = r->out_len;
  r->ctype = r->out_ctype;
  r->resp_json_len = r->out_json_len;
  r->out = NULL;
  memcpy(r->parts, r->out_parts, sizeof r->parts);
  r->nparts = r->out_nparts;
  r->parts_buf = r->out_parts_buf;
  r->out_parts_buf = NULL;
}
