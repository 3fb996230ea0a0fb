/*
 * session.c — a session call's body (proto.h, "sessions"): its own fields
 * (layer, pos, sessions) from any source, and its request from its
 * tensors. The rest of the body is a forward request's, decoded by the
 * same codecs, to which attn_proto_decode_session hands these fields (and
 * k and v as optional) as data, attn__fields.
 */
#include "internal.h"
#include "proto.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Only the counts: an entry of pos and ids is read only once written (its
 * count says so), and zeroing their 35 KB cost a decode step more than its
 * attention. */
void attn_proto_session_init(attn_proto_session *ps, bool batch) {
  ps->batch = batch;
  ps->layer = 0;
  ps->npos = ps->nids = 0;
  ps->shape_of = NULL;
  ps->shape_arg = NULL;
}

static bool name_is(const char *name, size_t len, const char *want) {
  return strlen(want) == len && !memcmp(name, want, len);
}

static bool is_field(const void *ctx, const char *name, size_t len) {
  const attn_proto_session *ps = ctx;
  return name_is(name, len, "layer") || name_is(name, len, "pos") ||
         (ps->batch && name_is(name, len, "sessions"));
}

/* An integer from 0 to 2^40 in v[0..n); false if it is not one. */
static bool parse_count(const char *v, size_t n, int64_t *out) {
  char buf[24];
  if (n == 0 || n >= sizeof buf || memchr(v, 0, n))
    return false;
  memcpy(buf, v, n);
  buf[n] = 0;
  char *end;
  errno = 0;
  long long x = strtoll(buf, &end, 10);
  if (*end || errno || x < 0 || x > ATTN_MAX_DIM || buf[0] == '-' || buf[0] == '+')
    return false;
  *out = x;
  return true;
}

static int bad_value(const char *name, const char *source, const char *want, attn_status *st) {
  return attn_status_set(st, ATTN_PROTO_EOPTVALUE, "\"%s\" in the %s must be %s", name, source,
                         want);
}

/* A list of more than ATTN_PROTO_MAX_BATCH items: a value out of range
 * (422, as the other limits of a call's fields), not a body too large. */
static int too_many(const char *name, attn_status *st) {
  return attn_status_set(st, ATTN_PROTO_EOPTVALUE,
                         "\"%s\" holds more than %d items: a batch call names at most %d sessions "
                         "(split it into several calls)",
                         name, ATTN_PROTO_MAX_BATCH, ATTN_PROTO_MAX_BATCH);
}

/* Each comma-separated item of v[0..n) to fn; the items counted in *count. */
static int each_item(const char *name, const char *v, size_t n, int *count,
                     int (*fn)(attn_proto_session *, int, const char *, size_t, attn_status *),
                     attn_proto_session *ps, attn_status *st) {
  *count = 0;
  for (size_t at = 0; at <= n;) {
    const char *comma = memchr(v + at, ',', n - at);
    size_t len = comma ? (size_t)(comma - (v + at)) : n - at;
    if (*count == ATTN_PROTO_MAX_BATCH)
      return too_many(name, st);
    int rc = fn(ps, (*count)++, v + at, len, st);
    if (rc)
      return rc;
    at += len + 1;
  }
  return 0;
}

static int set_pos(attn_proto_session *ps, int i, const char *v, size_t n, attn_status *st) {
  return parse_count(v, n, &ps->pos[i]) ? 0 : bad_value("pos", "request", "an integer >= 0", st);
}

static int set_id(attn_proto_session *ps, int i, const char *v, size_t n, attn_status *st) {
  attn_status why;
  if (memchr(v, 0, n) || attn_kv_id_check(v, n, &why))
    return attn_status_set(st, ATTN_PROTO_EOPTVALUE, "sessions[%d]: %s", i,
                           memchr(v, 0, n) ? "a session id holds no NUL" : why.message);
  memcpy(ps->ids[i], v, n);
  ps->ids[i][n] = 0;
  return 0;
}

/* A field from its text (a comma-separated list for pos and sessions). */
static int field_text(void *ctx, const char *name, size_t nlen, const char *value, size_t vlen,
                      const char *source, attn_status *st) {
  attn_proto_session *ps = ctx;
  if (name_is(name, nlen, "layer"))
    return parse_count(value, vlen, &ps->layer) && ps->layer < ATTN_KV_MAX_LAYERS
               ? 0
               : bad_value("layer", source, "an integer from 0 to 1023", st);
  if (name_is(name, nlen, "sessions"))
    return each_item("sessions", value, vlen, &ps->nids, set_id, ps, st);
  if (!ps->batch && memchr(value, ',', vlen))
    return bad_value("pos", source, "one integer >= 0 (a list is for /v1/sessions/_batch)", st);
  return each_item("pos", value, vlen, &ps->npos, set_pos, ps, st);
}

/* One JSON scalar of a list: a number's text (integers print exactly) or a
 * string's, into buf; its length, or 0 for another type. A number past
 * 2^53 is no count either way; it is never cast (1e300 does not fit a long
 * long) but printed as it is, for parse_count to refuse. */
static size_t scalar_text(attn__jr *v, char *buf, size_t cap) {
  if (attn__jr_is_number(v)) {
    double x = attn__jr_number(v);
    bool whole = fabs(x) <= 9007199254740992.0 && x == floor(x);
    return (size_t)snprintf(buf, cap, whole ? "%.0f" : "%.17g", x);
  }
  if (v->s[v->pos] == '"') {
    size_t n = attn__jr_string(v, buf, cap);
    return n < cap ? n : cap - 1;
  }
  return 0;
}

/* A field from its JSON value (a number, string or array of them). */
static int field_json(void *ctx, const char *name, size_t nlen, attn__jr v, attn_status *st) {
  attn_proto_session *ps = ctx;
  char item[ATTN_KV_ID_MAX + 2];
  bool ids = name_is(name, nlen, "sessions");
  const char *want = ids                                          ? "an array of session ids"
                     : ps->batch && !name_is(name, nlen, "layer") ? "an array of integers >= 0"
                                                                  : "an integer >= 0";
  char key[16];
  snprintf(key, sizeof key, "%.*s", (int)nlen, name);
  if (v.s[v.pos] != '[') {
    if (ids || (ps->batch && !name_is(name, nlen, "layer")) || !attn__jr_is_number(&v))
      return bad_value(key, "JSON body", want, st);
    size_t n = scalar_text(&v, item, sizeof item);
    return field_text(ps, name, nlen, item, n, "JSON body", st);
  }
  if (!ps->batch || name_is(name, nlen, "layer"))
    return bad_value(key, "JSON body", want, st);
  int *count = ids ? &ps->nids : &ps->npos;
  *count = 0;
  while (attn__jr_elem(&v)) {
    bool ok = ids ? v.s[v.pos] == '"' : attn__jr_is_number(&v);
    size_t n = ok ? scalar_text(&v, item, sizeof item) : 0;
    if (!ok || n == 0)
      return bad_value(key, "JSON body", want, st);
    if (*count == ATTN_PROTO_MAX_BATCH)
      return too_many(key, st);
    int rc = ids ? set_id(ps, *count, item, n, st) : set_pos(ps, *count, item, n, st);
    if (rc)
      return rc;
    (*count)++;
  }
  return 0;
}

/* q: [Hq, Nq, D] or [Nq, D]. */
static int check_q(const attn_proto_tensor *q, attn_status *st) {
  int rc = attn__check_one(q, 2, st);
  if (rc == 0 && q->rank == 4)
    rc = attn_status_set(st, ATTN_PROTO_ESHAPE,
                         "a session call's q is [Hq, Nq, D] or [Nq, D] (one sequence; a batch "
                         "of sessions is /v1/sessions/_batch), not rank 4");
  return rc;
}

/* The session's shape as far as the call's tensors depend on it: Dv and
 * whether it is latent (ps->shape_of's, else a session of v's width, or
 * q's D without v, that stores v). */
static int session_shape(const attn_proto_session *ps, const attn_proto_tensor *t,
                         attn_kv_shape *sh, attn_status *st) {
  const attn_proto_tensor *q = &t[ATTN_PROTO_T_Q], *v = &t[ATTN_PROTO_T_V];
  if (ps->shape_of)
    return ps->shape_of(ps->shape_arg, ps, sh, st);
  *sh = (attn_kv_shape){.head_dim = q->shape[q->rank - 1],
                        .head_dim_v = v->data ? v->shape[v->rank - 1] : 0};
  return 0;
}

/* New tokens, when sent: k [Hkv, Nnew, D] like q's rank, q's dtype and D,
 * Hkv dividing Hq; and v [Hkv, Nnew, Dv] of the session's Dv, except that
 * a latent session takes none (its v is part of k). */
static int check_kv(const attn_proto_tensor *t, const attn_kv_shape *sh, attn_status *st) {
  const attn_proto_tensor *q = &t[ATTN_PROTO_T_Q], *k = &t[ATTN_PROTO_T_K], *v = &t[ATTN_PROTO_T_V];
  const long long dv = (long long)attn_kv_shape_dv(sh);
  if (sh->v_from_k && v->data)
    return attn_status_set(st, ATTN_PROTO_EUNKNOWNTENSOR,
                           "tensor \"v\" was sent to a latent session (v_from_k %lld), which takes "
                           "q and k only: its v is the first %lld columns of each k row",
                           dv, dv);
  if (!k->data && !v->data)
    return 0;
  if (!k->data || (!v->data && !sh->v_from_k))
    return attn_status_set(st, ATTN_PROTO_EMISSING,
                           "tensor \"%s\" is missing: new tokens need both k and v",
                           k->data ? "v" : "k");
  int rc;
  if ((rc = attn__check_one(k, 2, st)) || (v->data && (rc = attn__check_one(v, 2, st))))
    return rc;
  if (k->dtype != q->dtype || (v->data && v->dtype != q->dtype))
    return attn_status_set(st, ATTN_PROTO_EDTYPE, "q, k%s must share one dtype (q %s, k %s%s%s)",
                           v->data ? " and v" : "", attn_dtype_name(q->dtype),
                           attn_dtype_name(k->dtype), v->data ? ", v " : "",
                           v->data ? attn_dtype_name(v->dtype) : "");
  if (v->data && v->shape[v->rank - 1] != dv)
    return attn_status_set(st, ATTN_PROTO_ESHAPE,
                           "tensor \"v\" ends in %lld but the session's values are %lld wide "
                           "(head_dim_v): send v [Hkv, Nnew, %lld]",
                           (long long)v->shape[v->rank - 1], dv, dv);
  int64_t a[4], b[4];
  attn__bhnd(q, a);
  attn__bhnd(k, b);
  bool v_fits = !v->data || (v->rank == k->rank &&
                             !memcmp(v->shape, k->shape, sizeof *k->shape * (size_t)(k->rank - 1)));
  if (k->rank != q->rank || !v_fits || a[3] != b[3] || a[1] % b[1])
    return attn_status_set(st, ATTN_PROTO_ESHAPE,
                           "k [Hkv, Nnew, D] and v [Hkv, Nnew, Dv] must have q's rank, k q's D "
                           "(%lld), and Hkv must divide q's %lld heads",
                           (long long)a[3], (long long)a[1]);
  return 0;
}

/* The fields the route needs: pos with new tokens; for a batch, the ids,
 * one pos each, and cu_seqlens_q (and cu_seqlens_kv with new tokens), one
 * sequence a session. */
static int check_fields(const attn_proto_session *ps, const attn_proto_tensor *t, attn_status *st) {
  const bool kv = t[ATTN_PROTO_T_K].data != NULL;
  const attn_proto_tensor *cq = &t[ATTN_PROTO_T_CU_Q], *ck = &t[ATTN_PROTO_T_CU_KV];
  if (!ps->batch) {
    if (cq->data || ck->data)
      return attn_status_set(st, ATTN_PROTO_EUNKNOWNTENSOR,
                             "cu_seqlens are for /v1/sessions/_batch; a session's call is one "
                             "sequence");
    return kv && ps->npos != 1 ? attn_status_set(st, ATTN_PROTO_EOPTVALUE,
                                                 "\"pos\" is missing: new k and v are appended at "
                                                 "pos, which must be the layer's length")
                               : 0;
  }
  if (ps->nids < 1)
    return attn_status_set(st, ATTN_PROTO_EOPTVALUE, "\"sessions\" is missing: the batch's ids");
  if (!cq->data || (kv && !ck->data) || (!kv && ck->data))
    return attn_status_set(st, ATTN_PROTO_EMISSING,
                           "a batch call needs cu_seqlens_q, and cu_seqlens_kv exactly when it "
                           "sends k and v");
  if (cq->rank != 1 || cq->shape[0] != ps->nids + 1 ||
      (ck->data && (ck->rank != 1 || ck->shape[0] != ps->nids + 1)))
    return attn_status_set(st, ATTN_PROTO_ESHAPE,
                           "cu_seqlens_q (and cu_seqlens_kv) must hold %d offsets: one a session "
                           "and one more",
                           ps->nids + 1);
  if (kv && ps->npos != ps->nids)
    return attn_status_set(st, ATTN_PROTO_ESHAPE, "\"pos\" holds %d values for %d sessions",
                           ps->npos, ps->nids);
  return 0;
}

/* A batch's cu_seqlens_q over q's rows, and cu_seqlens_kv over k's (their
 * counts checked by check_fields), with /attention's checks and words:
 * here, because the entries are cut from them (attn_proto_session_entries)
 * before the engine sees the call, and a safetensors I64 offset may be
 * anything (2^63 - 1 minus -2 overflows). */
static int check_offsets(const attn_proto_session *ps, const attn_proto_tensor *t,
                         attn_status *st) {
  if (!ps->batch)
    return 0;
  int64_t d[4];
  attn__bhnd(&t[ATTN_PROTO_T_Q], d);
  int rc =
      attn_offsets_check(st, "cu_seqlens_q", t[ATTN_PROTO_T_CU_Q].data, ps->nids, d[2], "q has");
  if (rc || !t[ATTN_PROTO_T_K].data)
    return rc;
  attn__bhnd(&t[ATTN_PROTO_T_K], d);
  return attn_offsets_check(st, "cu_seqlens_kv", t[ATTN_PROTO_T_CU_KV].data, ps->nids, d[2],
                            "k and v have");
}

static int check_options(const attn_options *o, attn_status *st) {
  if (o->set & ATTN_OPT_DIAG_OFFSET)
    return attn_status_set(st, ATTN_PROTO_EOPTVALUE,
                           "option \"diag_offset\" is not one of a session call: its mask is "
                           "aligned to the layer's keys (off = pos + Nnew - Nq)");
  if (strcmp(o->backend, "auto") && strcmp(o->backend, "cpu"))
    return attn_status_set(st, ATTN_PROTO_EOPTVALUE,
                           "option \"backend\" of a session call must be auto or cpu: sessions "
                           "are computed where their pages are, by the cpu backend");
  return 0;
}

/* The call's request from its tensors, fields and options. */
static int build(attn_proto_req *pr, const attn_proto_tensor *t, const attn_proto_session *ps,
                 const attn_options *opts, attn_status *st) {
  attn_kv_shape sh;
  int rc;
  if ((rc = check_q(&t[ATTN_PROTO_T_Q], st)) || (rc = check_fields(ps, t, st)) ||
      (rc = session_shape(ps, t, &sh, st)) || (rc = check_kv(t, &sh, st)) ||
      (rc = check_offsets(ps, t, st)) || (rc = check_options(opts, st)) ||
      (rc = attn__check_alibi(&t[ATTN_PROTO_T_ALIBI], t, st)) ||
      (rc = attn__check_sinks(&t[ATTN_PROTO_T_SINKS], t, st)))
    return rc;
  int64_t q[4], k[4] = {0, 0, 0, 0};
  attn__bhnd(&t[ATTN_PROTO_T_Q], q);
  if (t[ATTN_PROTO_T_K].data)
    attn__bhnd(&t[ATTN_PROTO_T_K], k);
  pr->opts = *opts;
  pr->rank = t[ATTN_PROTO_T_Q].rank;
  memcpy(pr->shape_q, t[ATTN_PROTO_T_Q].shape, sizeof pr->shape_q);
  memcpy(pr->shape_kv, t[ATTN_PROTO_T_K].shape, sizeof pr->shape_kv);
  const int64_t dv = attn_kv_shape_dv(&sh);
  attn__shapes_dv(pr, dv);
  attn_request *r = &pr->req;
  attn_request_init(r);
  r->batch = ps->batch ? ps->nids : 1;
  r->heads_q = q[1];
  r->heads_kv = k[1];
  r->seq_q = q[2];
  r->seq_kv = k[2];
  r->head_dim = q[3];
  r->head_dim_v = dv == q[3] ? 0 : dv;
  r->dtype = t[ATTN_PROTO_T_Q].dtype;
  r->scale = opts->scale;
  r->causal = opts->set & ATTN_OPT_CAUSAL ? opts->causal : true;
  pr->opts.causal = r->causal;
  r->window_left = opts->window_left;
  r->window_right = opts->window_right;
  r->softcap = opts->softcap;
  r->alibi_slopes = t[ATTN_PROTO_T_ALIBI].data;
  r->alibi_stride_b = t[ATTN_PROTO_T_ALIBI].rank == 2 ? q[1] : 0;
  r->sinks = t[ATTN_PROTO_T_SINKS].data;
  r->backend = "cpu";
  r->q = t[ATTN_PROTO_T_Q].data;
  r->k = t[ATTN_PROTO_T_K].data;
  r->v = t[ATTN_PROTO_T_V].data;
  r->cu_seqlens_q = t[ATTN_PROTO_T_CU_Q].data;
  r->cu_seqlens_kv = t[ATTN_PROTO_T_CU_KV].data;
  return attn__alloc_outputs(pr, st);
}

int attn_proto_decode_session(const char *body, size_t len, bool json, const char *query,
                              attn_proto_session *ps, attn_proto_req *pr, attn_status *st) {
  const attn__fields fields = {ps, is_field, field_text, field_json,
                               1u << ATTN_PROTO_T_K | 1u << ATTN_PROTO_T_V};
  attn_options q, opts;
  attn_proto_tensor t[ATTN_PROTO_MAX_TENSORS];
  attn_options_init(&q);
  q.fields = &fields;
  memset(pr, 0, sizeof *pr);
  int rc = attn_options_parse_query(&q, query, st);
  if (rc == 0)
    rc = json ? attn__json_tensors(body, len, ATTN_FORWARD, &q, pr, t, &opts, st)
              : attn__st_tensors(body, len, ATTN_FORWARD, &q, pr, t, &opts, st);
  if (rc == 0)
    rc = build(pr, t, ps, &opts, st);
  pr->opts.fields = NULL; /* they were this call's, on its stack */
  if (rc < 0)
    attn_proto_req_free(pr);
  return rc;
}

int64_t attn_proto_session_entries(const attn_proto_session *ps, const attn_request *req,
                                   const char *id, attn_kv_entry *entries) {
  const int64_t n = ps->batch ? ps->nids : 1;
  const int64_t *cu = req->cu_seqlens_kv;
  for (int64_t e = 0; e < n; e++) {
    attn_kv_entry *en = &entries[e];
    *en = (attn_kv_entry){.id = ps->batch ? ps->ids[e] : id};
    if (!req->k)
      continue;
    en->pos = ps->pos[e];
    en->kv_off = ps->batch ? cu[e] : 0;
    en->n_new = ps->batch ? cu[e + 1] - cu[e] : req->seq_kv;
  }
  return n;
}
