/*
 * kind_session.c — the session kinds (kind.h): POST
 * /v1/sessions/{id}/attention and POST /v1/sessions/_batch. The body is a
 * forward request's with a session call's fields (proto.h, "sessions");
 * the call goes to the session store, which appends its new tokens and
 * attends over the layer's keys, and the reply is /attention's with the
 * layer's length (or the batch's) beside the outputs.
 */
#include "kind.h"
#include "errors.h"
#include "sessions.h"

#include <stdio.h>
#include <stdlib.h>

/* A session call's state beside r (r->state). */
typedef struct attnd_session_call {
  attn_proto_session ps;
  attn_kv_call call;
  attn_kv_entry entries[ATTN_PROTO_MAX_BATCH];
  char id[ATTN_KV_ID_MAX + 1];
  char length_header[24];
} attnd_session_call;

/* The shape of the call's session (a batch's first), which its tensors
 * depend on: the store's, as GET shows it. */
static int shape_of(void *arg, const attn_proto_session *ps, attn_kv_shape *sh, attn_status *st) {
  attnd_req *r = arg;
  const attnd_session_call *sc = r->state;
  attn_kv_info info;
  int rc = attn_kv_get(r->srv->kv, r->tenant, ps->batch ? ps->ids[0] : sc->id, attn_now(), &info,
                       NULL, 0, st);
  if (rc == 0)
    *sh = info.shape;
  return rc;
}

/* The store (the HTTP thread's routes' 404, here on the threadpool), the
 * call's state, the id of its path, then the body with its fields. */
static int decode(attnd_req *r, const char *body, size_t len, attn_status *st) {
  if (!r->srv->kv)
    return attn_status_set(st, ATTND_ENOT_FOUND, "%s", ATTND_SESSIONS_OFF);
  /* not zeroed: its batch-sized arrays are written before they are read */
  if (!r->state && !(r->state = malloc(sizeof(attnd_session_call))))
    return attn_status_set(st, ATTN_ENOMEM, "out of memory for a session call");
  attnd_session_call *sc = r->state;
  sc->id[0] = sc->length_header[0] = 0;
  sc->call = (attn_kv_call){0};
  bool batch = r->route->kind == &attnd_kind_session_batch;
  attn_proto_session_init(&sc->ps, batch);
  sc->ps.shape_of = shape_of;
  sc->ps.shape_arg = r;
  int rc = batch ? 0 : attnd_sessions_id(r->path, sc->id, st);
  if (rc == 0)
    rc = attn_proto_decode_session(body, len, r->json_in, r->query, &sc->ps, &r->pr, st);
  return rc;
}

/* The store's call of the decoded request. */
static attn_kv_call *call_of(attnd_req *r) {
  attnd_session_call *sc = r->state;
  attn_kv_call *c = &sc->call;
  const attn_request *req = &r->pr.req;
  *c = (attn_kv_call){.tenant = r->tenant, .layer = sc->ps.layer, .entries = sc->entries};
  c->nentries = attn_proto_session_entries(&sc->ps, req, sc->id, sc->entries);
  c->k_new = req->k;
  c->v_new = req->v;
  c->total_new = req->k ? req->seq_kv : 0;
  c->req = *req;
  c->req.k = c->req.v = NULL;
  c->req.cu_seqlens_kv = NULL;
  c->req.seq_kv = 0;
  c->req.batch = 1;
  if (!sc->ps.batch)
    c->req.cu_seqlens_q = NULL;
  return c;
}

static int submit(attnd_req *r, attn_done_fn done, attn_status *st) {
  return attn_kv_submit(r->srv->kv, call_of(r), attn_now(), done, r, st);
}

/* A small call whose layers no other call holds is computed here; one that
 * would wait for another session's (or its own earlier) call is queued, so
 * that this thread never waits for another call's work. */
static int here(attnd_req *r) {
  attn_status st = {0};
  int rc = attn_kv_run_here(r->srv->kv, call_of(r), attn_now(), (double)r->srv->cfg->tiny_flops,
                            &r->res, &st);
  if (rc == ATTN_KV_LATER)
    return 1;
  if (rc)
    r->res.status = st;
  return 0;
}

/* The layer's length (or the batch's) into the reply: JSON fields or the
 * safetensors reply's metadata (only the one the reply is written in),
 * and the X-Session-Length header. */
static void reply_fields(attnd_req *r) {
  attnd_session_call *sc = r->state;
  attn_sbuf b = {0};
  const attn_kv_call *c = &sc->call;
  const bool json = !r->binary_out;
  if (!sc->ps.batch) {
    long long n = (long long)c->entries[0].length;
    if (json)
      attn_sbuf_printf(&b, "\"length\": %lld, \"replay\": %s", n,
                       c->entries[0].replay ? "true" : "false");
    else
      attn_sbuf_printf(&b, "\"length\": \"%lld\"", n);
    snprintf(sc->length_header, sizeof sc->length_header, "%lld", n);
  } else {
    attn_sbuf_puts(&b, json ? "\"lengths\": [" : "\"lengths\": \"");
    for (int64_t e = 0; e < c->nentries; e++)
      attn_sbuf_printf(&b, "%s%lld", e ? (json ? ", " : ",") : "", (long long)c->entries[e].length);
    attn_sbuf_puts(&b, json ? "]" : "\"");
  }
  char *p = b.oom ? (free(b.p), NULL) : b.p;
  if (json)
    r->pr.reply_json = p;
  else
    r->pr.reply_meta = p;
}

static int encode(attnd_req *r, attn_status *st) {
  reply_fields(r);
  return attnd_kind_encode_tensors(r, st);
}

static const char *length_header(const attnd_req *r) {
  const attnd_session_call *sc = r->state;
  return sc && sc->length_header[0] ? sc->length_header : NULL;
}

/* A call waiting in the store ends now, a job of several calls once all
 * its callers cancel. */
static void cancel(attnd_req *r) { attn_kv_cancel(r->srv->kv, &r->cancel); }

static void free_call(attnd_req *r) {
  free(r->state);
  r->state = NULL;
}

/* A session call holds a place of --max-queue but takes no running slot,
 * nor waits for one: the store orders the calls of each layer and batches
 * those that wait together, and a call kept there (waiting for its layer)
 * must not keep other requests from their slots. Its keys are the store's,
 * bounded by its max_tokens rather than --max-pairs, and it is computed
 * where its pages are. */
#define SESSION_KIND                                                                          \
  {                                                                                           \
    .pass = ATTN_FORWARD, .need = attnd_kind_need_tensors, .too_large = ATTND_KIND_TOO_LARGE, \
    .decode = decode, .submit = submit, .here = here, .encode = encode, .free = free_call,    \
    .cancel = cancel, .reply_header = "X-Session-Length", .reply_value = length_header        \
  }

/* The batch differs only by being a row of its own (decode reads which). */
const attnd_kind attnd_kind_session = SESSION_KIND;
const attnd_kind attnd_kind_session_batch = SESSION_KIND;
