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
  return tkv_stream_make_dv(hq, hkv, d, d, false, n, dt, seed);
}

tkv_stream tkv_stream_make_dv(int64_t hq, int64_t hkv, int64_t d, int64_t dv, bool latent,
                              int64_t n, attn_dtype dt, uint64_t seed) {
  tkv_stream s = {.hq = hq, .hkv = hkv, .d = d, .n = n, .dt = dt, .dv = dv, .latent = latent};
  s.q = fill(hq * n * d, dt, &seed);
  s.k = fill(hkv * n * d, dt, &seed);
  if (!latent) {
    s.v = fill(hkv * n * dv, dt, &seed);
    return s;
  }
  const size_t es = attn_dtype_size(dt);
  s.v = malloc((size_t)(hkv * n * dv) * es);
  for (int64_t r = 0; r < hkv * n; r++)
    memcpy((char *)s.v + (size_t)(r * dv) * es, (const char *)s.k + (size_t)(r * d) * es,
           (size_t)dv * es);
  return s;
}

tkv_stream tkv_stream_splice(const tkv_stream *a, const tkv_stream *b, int64_t n) {
  tkv_stream s = tkv_stream_make_dv(a->hq, a->hkv, a->d, a->dv, a->latent, a->n, a->dt, 1);
  const size_t es = attn_dtype_size(a->dt);
  struct {
    void *dst;
    const void *x, *y;
    int64_t heads, w;
  } t[3] = {{s.q, a->q, b->q, a->hq, a->d},
            {s.k, a->k, b->k, a->hkv, a->d},
            {s.v, a->v, b->v, a->hkv, a->dv}};
  for (int i = 0; i < 3; i++)
    for (int64_t h = 0; h < t[i].heads; h++) {
      const size_t row = (size_t)t[i].w * es, at = (size_t)(h * a->n) * row;
      memcpy((char *)t[i].dst + at, (const char *)t[i].x + at, (size_t)n * row);
      memcpy((char *)t[i].dst + at + (size_t)n * row, (const char *)t[i].y + at + (size_t)n * row,
             (size_t)(a->n - n) * row);
    }
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

/* The next piece of x at buf + *at, of at most want bytes; false with
 * why set when it is wrong, and *done at the end. */
static bool read_piece(attn_kv_exporter *x, char *buf, size_t n, size_t *at, size_t want,
                       bool *done, char *why, size_t cap) {
  attn_status st;
  int64_t got = attn_kv_export_read(x, buf + *at, want, &st);
  if (got < 0 || (size_t)got > want || *at + (size_t)got > n) {
    snprintf(why, cap, "a read of %zu at %zu gave %lld: %s", want, *at, (long long)got,
             got < 0 ? st.message : "too many bytes");
    return false;
  }
  *at += (size_t)got;
  *done = got == 0;
  if ((size_t)got < want && *at < n) {
    snprintf(why, cap, "a short read (%lld of %zu) at %zu, before the end", (long long)got, want,
             *at);
    return false;
  }
  return true;
}

void *tkv_export_all(attn_kv_exporter *x, size_t n, char *why, size_t cap) {
  static const size_t pieces[] = {1, 7, 333, 4096, 65539};
  char *buf = malloc(n + 65540);
  size_t at = 0;
  bool done = false, ok = buf != NULL;
  for (int i = 0; ok && !done; i = (i + 1) % 5)
    ok = read_piece(x, buf, n, &at, pieces[i], &done, why, cap);
  if (ok && at != n)
    ok = snprintf(why, cap, "the export read out %zu bytes, not %zu", at, n) < 0;
  if (!ok) {
    free(buf);
    return NULL;
  }
  return buf;
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
  void *v = nnew && !s->latent ? tkv_rows_of(s->v, s->hkv, s->n, s->dv, s->dt, pos, nnew) : NULL;
  memset(y, 0, sizeof *y);
  y->o = calloc((size_t)(s->hq * nq * s->dv), attn_dtype_size(s->dt));
  if (op->stats) {
    y->m = calloc((size_t)(s->hq * nq), sizeof(float));
    y->l = calloc((size_t)(s->hq * nq), sizeof(float));
    y->lse = calloc((size_t)(s->hq * nq), sizeof(float));
  }
  attn_request_init(&c.req);
  c.req.heads_q = s->hq;
  c.req.heads_kv = s->hkv;
  c.req.head_dim = s->d;
  c.req.head_dim_v = s->dv;
  c.req.seq_q = nq;
  c.req.dtype = s->dt;
  c.req.causal = op->causal;
  c.req.window_left = op->wl;
  c.req.window_right = op->wr;
  c.req.softcap = op->softcap;
  c.req.sinks = op->sinks;
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

/* Rows [r0, r0 + n) of each head of t ([heads, total, w bytes]) to rows
 * [d0, d0 + n) of dst ([heads, dn, w]). */
static void rows_to(char *dst, int64_t dn, int64_t d0, const void *t, int64_t total, int64_t r0,
                    int64_t heads, int64_t n, size_t w) {
  for (int64_t h = 0; h < heads; h++)
    memcpy(dst + (size_t)(h * dn + d0) * w, (const char *)t + (size_t)(h * total + r0) * w,
           (size_t)n * w);
}

int tkv_call_batch(attn_kv_store *kv, const tkv_batch *bt, int n, void **po, double now,
                   attn_status *st) {
  attn_kv_entry en[TKV_BATCH_MAX];
  int64_t cu_q[TKV_BATCH_MAX + 1] = {0}, tq = 0, tk = 0;
  const tkv_stream *s0 = bt->s[0];
  for (int i = 0; i < n; i++) {
    en[i] = (attn_kv_entry){.id = bt->ids[i], .pos = bt->pos[i], .n_new = bt->nn[i], .kv_off = tk};
    tq += bt->nq[i];
    tk += bt->nn[i];
    cu_q[i + 1] = tq;
  }
  const size_t es = attn_dtype_size(s0->dt), w = (size_t)s0->d * es, wv = (size_t)s0->dv * es;
  char *q = malloc((size_t)(s0->hq * tq) * w + 1), *k = malloc((size_t)(s0->hkv * tk) * w + 1),
       *v = s0->latent ? NULL : malloc((size_t)(s0->hkv * tk) * wv + 1);
  *po = calloc((size_t)(s0->hq * tq) * wv + 1, 1);
  for (int i = 0, r0 = 0, k0 = 0; i < n; r0 += (int)bt->nq[i], k0 += (int)bt->nn[i], i++) {
    const tkv_stream *s = bt->s[i];
    rows_to(q, tq, r0, s->q, s->n, bt->pos[i], s->hq, bt->nq[i], w);
    rows_to(k, tk, k0, s->k, s->n, bt->pos[i], s->hkv, bt->nn[i], w);
    if (v)
      rows_to(v, tk, k0, s->v, s->n, bt->pos[i], s->hkv, bt->nn[i], wv);
  }
  attn_kv_call c = {.tenant = "",
                    .nentries = n,
                    .entries = en,
                    .k_new = tk ? k : NULL,
                    .v_new = tk ? v : NULL,
                    .total_new = tk};
  attn_request_init(&c.req);
  c.req.heads_q = s0->hq;
  c.req.heads_kv = s0->hkv;
  c.req.head_dim = s0->d;
  c.req.head_dim_v = s0->dv;
  c.req.seq_q = tq;
  c.req.dtype = s0->dt;
  c.req.causal = true;
  c.req.cu_seqlens_q = cu_q;
  c.req.q = q;
  c.req.o = *po;
  int rc = tkv_run(kv, &c, now, st);
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
  r.head_dim_v = s->dv;
  r.dtype = s->dt;
  r.causal = op->causal;
  r.window_left = op->wl;
  r.window_right = op->wr;
  r.softcap = op->softcap;
  r.sinks = op->sinks;
  r.q = q;
  r.k = s->k;
  r.v = s->v;
  r.o = q; /* validation wants an output; the reference writes its own */
  int64_t ks[3] = {s->hkv * s->n * s->d, s->n * s->d, s->d};
  int64_t vs[3] = {s->hkv * s->n * s->dv, s->n * s->dv, s->dv};
  memcpy(r.k_stride, ks, sizeof ks);
  memcpy(r.v_stride, vs, sizeof vs);
  const size_t no = (size_t)(s->hq * nq * s->dv), nr = (size_t)(s->hq * nq);
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
  err = isnan(err) ? INFINITY : err; /* fmax below would drop a NaN */
  for (size_t i = 0; y->lse && i < nr; i++) {
    double e = fabs(y->lse[i] - lse[i]) / fmax(1, fabs(lse[i]));
    if (isfinite(lse[i]))
      err = isnan(e) ? INFINITY : fmax(err, e);
  }
  free(q);
  free(o);
  free(m);
  free(l);
  free(lse);
  return err;
}

double tkv_step_error(attn_kv_store *kv, const char *id, const tkv_stream *s, const tkv_opts *op,
                      int64_t pos, int64_t n, attn_status *st) {
  tkv_reply y;
  double err = INFINITY;
  if (tkv_call1(kv, "", id, s, op, pos, n, pos, n, &y, 0, st) == 0)
    err = tkv_ref_error(s, op, pos, n, pos + n, &y);
  tkv_reply_free(&y);
  return err;
}

attn_kv_store *tkv_open_store(attn_engine *e, uint64_t bytes, bool batch, const char *backend) {
  attn_kv_store *kv;
  attn_status st;
  must(attn_kv_open(e, bytes, batch, backend, &kv, &st), "opening a session store", &st);
  return kv;
}

attn_kv_store *tkv_open_paged(attn_engine *e, uint64_t bytes, size_t page_bytes) {
  attn_kv_store *kv;
  attn_status st;
  must(attn_kv_open_paged(e, bytes, page_bytes, true, "cpu", &kv, &st), "opening a session store",
       &st);
  return kv;
}

void tkv_make(attn_kv_store *kv, const char *tenant, const char *id, const tkv_stream *s,
              int64_t layers, int64_t max_tokens, double ttl, double now) {
  attn_kv_shape sh = {.heads_kv = s->hkv,
                      .head_dim = s->d,
                      .head_dim_v = s->dv,
                      .v_from_k = s->latent,
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
