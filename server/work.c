/*
 * work.c — what a computing request's job does off the loop (work.h): its
 * decode (Content-Encoding undone, then the codec) and submission to the
 * engine on libuv's threadpool, the engine's handoff back to the loop, its
 * encode on the threadpool, and the memory its decode draws on the body
 * budget.
 */
#include "work.h"
#include "errors.h"
#include "jobs.h"
#include "route.h"
#include "sessions.h"

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

/* What decoding r's body allocates beside it: nothing for safetensors
 * (read in place), the tensors of a JSON body (up to twice the body), and
 * for /v2 those of its JSON part plus an aligned copy of its binary part. */
static uint64_t decode_need(const attnd_req *r, size_t len) {
  if (r->v2)
    return attn_proto_v2_decode_bound(len, r->v2_json_len < len ? r->v2_json_len : len);
  return r->json_in ? attn_proto_json_decode_bound(len) : 0;
}

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
             r->v2 ? "send the tensors as binary data, or raise --max-queue"
                   : "send it as safetensors (application/octet-stream), which needs no copy, "
                     "or raise --max-queue");
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

/* r's body into r->pr with its codec, once any Content-Encoding is undone.
 * The inference protocol takes its options from the body's "parameters"
 * only. */
static int decode_body(attnd_req *r, attn_status *st) {
  if (r->encoding != ATTND_ENC_IDENTITY && inflate_body(r, st) < 0)
    return st->code;
  const char *body = r->plain ? r->plain : r->body;
  size_t len = r->plain ? r->plain_len : r->len;
  if (r->v2) {
    size_t json_len = r->v2_json_len == SIZE_MAX ? len : r->v2_json_len;
    return attn_proto_decode_v2(body, len, json_len, &r->pr, &r->v2_info, st);
  }
  attn_options q;
  attn_options_init(&q);
  int rc = r->route->session ? attnd_sessions_prepare(r, &q, st) : 0;
  if (rc == 0)
    rc = attn_options_parse_query(&q, r->query, st);
  attn_pass pass = attnd_req_pass(r);
  if (rc == 0)
    rc = r->json_in ? attn_proto_decode_json_pass(body, len, pass, &q, &r->pr, st)
                    : attn_proto_decode_safetensors_pass(body, len, pass, &q, &r->pr, st);
  return rc;
}

/* --max-pairs, checked on the decoded request before it computes: a body of
 * a few hundred kilobytes can ask for minutes of work (787 KB of F16 at
 * N = 131072, D = 1 is 1.7e10 pairs), which no --max-body catches. */
static int check_pairs(const attnd_req *r, attn_status *st) {
  if (r->route->session) /* its keys are the store's: bounded by max_tokens */
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

void attnd_outbuf_free(attnd_server *s, void *p) {
  if (p && !(s && s->engine && attn_engine_host_free(s->engine, p)))
    free(p);
}

static void outbuf_free(void *ctx, void *p) { attnd_outbuf_free(ctx, p); }

/* The outputs (not yet computed) moved into page-locked memory when the
 * engine lends it: a GPU then downloads them in place, and a safetensors
 * reply is sent from there. Not a session call's: those run on the CPU. */
static void pin_outputs(attnd_req *r) {
  if (r->route->session || r->pr.out_bytes == 0)
    return;
  void *buf = attn_engine_host_alloc(r->srv->engine, r->pr.out_bytes);
  if (buf)
    attn_proto_req_set_out(&r->pr, buf, outbuf_free, r->srv);
}

int attnd_work_decode(attnd_req *r, attn_status *st) {
  int rc = decode_body(r, st);
  if (rc == 0)
    rc = check_pairs(r, st);
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
  attnd_server *s = r->srv;
  attn_status st;
  int rc = r->decoded ? 0 : attnd_work_decode(r, &st);
  if (rc == 0) {
    /* Set before submitting: once submitted, the job may complete (and r be
     * touched by the loop) before this thread returns. */
    r->in_engine = true;
    rc = r->route->session ? attnd_sessions_submit(r, engine_done, &st)
                           : attn_engine_submit(s->engine, &r->pr.req, engine_done, r, &st);
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
  if (r->res.status.code == 0 && r->route->session)
    attnd_sessions_reply_fields(r);
  if (r->res.status.code) {
    st = r->res.status;
    rc = -1;
  } else if (r->v2) {
    /* the request's id (X-Request-Id, or made) when the body had none */
    void *head = NULL;
    rc = attn_proto_encode_v2_parts(&r->pr, &r->v2_info, attn_proto_v2_model_name(r->v2_model),
                                    r->id, r->res.backend, &head, &r->out_len, r->out_parts,
                                    &r->out_nparts, &st);
    r->out = head;
    r->out_json_len = r->out_nparts ? r->out_len : 0;
    r->out_ctype = r->out_nparts ? "application/octet-stream" : "application/json";
  } else if (r->binary_out) {
    void *head = NULL;
    rc = attn_proto_encode_safetensors_parts(&r->pr, &head, &r->out_len, r->out_parts,
                                             &r->out_nparts, &st);
    r->out = head;
    r->out_ctype = "application/octet-stream";
  } else {
    rc = attn_proto_encode_json(&r->pr, r->res.backend, &r->out, &r->out_len, &st);
    r->out_ctype = "application/json";
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
