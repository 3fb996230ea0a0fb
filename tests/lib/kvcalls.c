/*
 * kvcalls.c — session calls for the tests (kvcalls.h).
 */
#include "kvcalls.h"
#include "helpers.h"
#include "reference.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *fill(int64_t count, attn_dtype dt, uint64_t *seed) {
  void *p = malloc((size_t)count * attn_dtype_size(dt));
  for (int64_t i = 0; i < count; i++)
    attn_store_elem(p, dt, (size_t)i, (float)tuniform(seed));
  return p;
}

tkv_stream tkv_stream_make(int64_t hq, int64_t hkv, int64_t d, int64_t n, attn_dtype dt,
                           uint64_t seed) {
  tkv_stream s = {hq, hkv, d, n, dt, NULL, NULL, NULL};
  s.q = fill(hq * n * d, dt, &seed);
  s.k = fill(hkv * n * d, dt, &seed);
  s.v = fill(hkv * n * d, dt, &seed);
  return s;
}

void tkv_stream_free(tkv_stream *s) {
  free(s->q);
  free(s->k);
  free(s->v);
}

/* Rows [r0, r0 + n) of every head of a [H, total, D] tensor, packed. */
void *tkv_rows_of(const void *t, int64_t heads, int64_t total, int64_t d, attn_dtype dt, int64_t r0,
                  int64_t n) {
  size_t es = attn_dtype_size(dt), w = (size_t)d * es;
  char *out = malloc((size_t)(heads * n) * w + 1);
  for (int64_t h = 0; h < heads; h++)
    memcpy(out + (size_t)(h * n) * w, (const char *)t + (size_t)(h * total + r0) * w,
           (size_t)n * w);
  return out;
}

void tkv_reply_free(tkv_reply *y) {
  free(y->o);
  free(y->m);
  free(y->l);
  free(y->lse);
}

/* Runs call, submitted (here 0) or on this thread; the store's code or
 * the job's, and the job's backend into *backend. */
static int run_waiting(attn_kv_store *kv, attn_kv_call *c, double now, double here, attn_status *st,
                       const char **backend) {
  attn_result res = {0};
  int rc =
      here > 0 ? attn_kv_run_here(kv, c, now, here, &res, st) : attn_kv_run(kv, c, now, &res, st);
  if (rc == 0 && res.status.code) { /* as attn_kv_run answers a job that failed */
    rc = res.status.code;
    *st = res.status;
  }
  if (res.backend) /* the job ran (it may still have failed) */
    *backend = res.backend;
  return rc;
}

int tkv_run(attn_kv_store *kv, attn_kv_call *c, double now, attn_status *st) {
  const char *backend = NULL;
  return run_waiting(kv, c, now, 0, st, &backend);
}

/* A setup step that cannot fail in a sound build: say what and stop (the
 * GPU tests have no Criterion to report it). */
static void must(int rc, const char *what, const attn_status *st) {
  if (rc == 0)
    return;
  fprintf(stderr, "kvcalls: %s: %s\n", what, st->message);
  abort();
}

const tkv_opts tkv_plain = {.causal = true, .wl = -1, .wr = -1};

/* One call on session id: queries [q0, q0 + nq) of s, and (nnew > 0) its
 * tokens [pos, pos + nnew) appended at pos. */
int tkv_call1(attn_kv_store *kv, const char *tenant, const char *id, const tkv_stream *s,
              const tkv_opts *op, int64_t q0, int64_t nq, int64_t pos, int64_t nnew, tkv_reply *y,
              double now, attn_status *st) {
  attn_kv_entry en = {.id = id, .pos = pos, .n_new = nnew};
  attn_kv_call c = {.tenant = tenant, .layer = op->layer, .nentries = 1, .entries = &en};
  void *q = tkv_rows_of(s->q, s->hq, s->n, s->d, s->dt, q0, nq);
  void *k = nnew ? tkv_rows_of(s->k, s->hkv, s->n, s->d, s->dt, pos, nnew) : NULL;
  void *v = nnew ? tkv_rows_of(s->v, s->hkv, s->n, s->d, s->dt, pos, nnew) : NULL;
  memset(y, 0, sizeof *y);
  y->o = calloc((size_t)(s->hq * nq * s->d), attn_dtype_size(s->dt));
  if (op->stats) {
    y->m = calloc((size_t)(s->hq * nq), sizeof(float));
    y->l = calloc((size_t)(s->hq * nq), sizeof(float));
    y->lse = calloc((size_t)(s->hq * nq), sizeof(float));
  }
  attn_request_init(&c.req);
  c.req.heads_q = s->hq;
  c.req.heads_kv = s->hkv;
  c.req.head_dim = s->d;
  c.req.seq_q = nq;
  c.req.dtype = s->dt;
  c.req.causal = op->causal;
  c.req.window_left = op->wl;
  c.req.window_right = op->wr;
  c.req.softcap = op->softcap;
  c.req.q = q;
  c.req.o = y->o;
  c.req.m = y->m;
  c.req.l = y->l;
  c.req.lse = y->lse;
  c.k_new = k;
  c.v_new = v;
  c.total_new = nnew;
  int rc = run_waiting(kv, &c, now, op->here, st, &y->backend);
  y->length = en.length;
  y->replay = en.replay;
  free(q);
  free(k);
  free(v);
  return rc;
}

/* The float64 reference of queries [q0, q0 + nq) over keys [0, nk) of s,
 * bottom-right aligned; the relative L2 error of y's O against it, and
 * the largest error of its statistics when it has them. */
double tkv_ref_error(const tkv_stream *s, const tkv_opts *op, int64_t q0, int64_t nq, int64_t nk,
                     const tkv_reply *y) {
  attn_request r;
  attn_request_init(&r);
  void *q = tkv_rows_of(s->q, s->hq, s->n, s->d, s->dt, q0, nq);
  r.batch = 1;
  r.heads_q = s->hq;
  r.heads_kv = s->hkv;
  r.seq_q = nq;
  r.seq_kv = nk;
  r.head_dim = s->d;
  r.dtype = s->dt;
  r.causal = op->causal;
  r.window_left = op->wl;
  r.window_right = op->wr;
  r.softcap = op->softcap;
  r.q = q;
  r.k = s->k;
  r.v = s->v;
  r.o = q; /* validation wants an output; the reference writes its own */
  int64_t ks[3] = {s->hkv * s->n * s->d, s->n * s->d, s->d};
  memcpy(r.k_stride, ks, sizeof ks);
  memcpy(r.v_stride, ks, sizeof ks);
  const size_t no = (size_t)(s->hq * nq * s->d), nr = (size_t)(s->hq * nq);
  double *o = malloc(no * sizeof *o), *m = malloc(nr * 8), *l = malloc(nr * 8),
         *lse = malloc(nr * 8);
  attn_status st;
  must(attn_reference(&r, o, m, l, lse, &st), "the float64 reference", &st);
  double num = 0, den = 0, err = 0;
  for (size_t i = 0; i < no; i++) {
    double x = attn_load_elem(y->o, s->dt, i);
    num += (x - o[i]) * (x - o[i]);
    den += o[i] * o[i];
  }
  err = den > 0 ? sqrt(num / den) : sqrt(num);
  for (size_t i = 0; y->lse && i < nr; i++) {
    double e = fabs(y->lse[i] - lse[i]) / fmax(1, fabs(lse[i]));
    err = isfinite(lse[i]) ? fmax(err, e) : err;
  }
  free(q);
  free(o);
  free(m);
  free(l);
  free(lse);
  return err;
}

attn_kv_store *tkv_open_store(attn_engine *e, uint64_t bytes, bool batch, const char *backend) {
  attn_kv_store *kv;
  attn_status st;
  must(attn_kv_open(e, bytes, batch, backend, &kv, &st), "opening a session store", &st);
  return kv;
}

void tkv_make(attn_kv_store *kv, const char *tenant, const char *id, const tkv_stream *s,
              int64_t layers, int64_t max_tokens, double ttl, double now) {
  attn_kv_shape sh = {.heads_kv = s->hkv,
                      .head_dim = s->d,
                      .dtype = s->dt,
                      .layers = layers,
                      .max_tokens = max_tokens};
  bool created;
  attn_status st;
  must(attn_kv_create(kv, tenant, id, &sh, ttl, now, &created, &st), "making a session", &st);
}

/* Whether step [pos, pos + n) of the plan is checked against float64. */
static bool checked(const tkv_stream *s, const tkv_plan *pl, int64_t pos, int64_t n) {
  double ops = (double)s->hq * (double)n * (double)(pos + n) * (double)s->d;
  if (pl->max_ops > 0 && ops > pl->max_ops)
    return false;
  return pos < pl->pre || pl->every <= 1 || (pos - pl->pre) % pl->every == 0 || pos + n == s->n;
}

/* What is wrong with step [pos, pos + n)'s outcome, or NULL. */
static const char *step_fault(const tkv_stream *s, const tkv_opts *op, const tkv_plan *pl,
                              int64_t pos, int64_t n, const tkv_reply *y, double *err) {
  double tol = pl->tol > 0 ? pl->tol : ttol(s->dt);
  *err = 0;
  if (y->length != pos + n)
    return "the layer's length is not pos + n";
  if (pl->backend && (!y->backend || strcmp(y->backend, pl->backend)))
    return "the job ran on another backend";
  if (checked(s, pl, pos, n) && !((*err = tkv_ref_error(s, op, pos, n, pos + n, y)) <= tol))
    return "the error is past the tolerance";
  return NULL;
}

int tkv_decode(attn_kv_store *kv, const char *id, const tkv_stream *s, const tkv_opts *op,
               const tkv_plan *pl, char *why, size_t cap) {
  int fails = 0;
  for (int64_t pos = 0, n; pos < s->n; pos += n) {
    int64_t left = pl->pre - pos, chunk = pl->chunk > 0 ? pl->chunk : pl->pre;
    n = pos < pl->pre ? (left < chunk ? left : chunk) : 1;
    tkv_reply y;
    attn_status st = {0};
    double err = 0;
    int rc = tkv_call1(kv, "", id, s, op, pos, n, pos, n, &y, 0, &st);
    const char *fault = rc ? st.message : step_fault(s, op, pl, pos, n, &y, &err);
    tkv_reply_free(&y);
    if (fault && fails++ == 0)
      snprintf(why, cap, "pos %lld (%lld tokens): %.120s (error %.3g)", (long long)pos,
               (long long)n, fault, err);
    if (rc)
      break;
  }
  return fails;
}
