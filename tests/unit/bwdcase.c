/* bwdcase.c — see bwdcase.h. */
#include "bwdcase.h"

#include "reference.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Strides of a tensor as the request gives them, contiguous when zero. */
static void strides(const int64_t s[3], int64_t h, int64_t n, int64_t d, int64_t out[3]) {
  if (s[0] || s[1] || s[2]) {
    memcpy(out, s, 3 * sizeof *out);
    return;
  }
  out[2] = d;
  out[1] = n * d;
  out[0] = h * n * d;
}

/* Offset of element (b, h, n, d) of a [B, H, N, D] tensor with strides s. */
static size_t at(const int64_t s[3], int64_t b, int64_t h, int64_t n, int64_t d) {
  return (size_t)(b * s[0] + h * s[1] + n * s[2] + d);
}

/* O and lse of the float64 forward, stored as a caller would pass them. */
static int forward(tbwd *t, attn_status *st) {
  const tprob *p = &t->c.p;
  size_t no = (size_t)(p->b * p->hq * p->nq * p->d), rows = (size_t)(p->b * p->hq * p->nq);
  double *o = malloc((no + rows) * sizeof *o), *lse = o + no;
  attn_request fr = t->c.req;
  fr.m = fr.l = fr.lse = NULL;
  int rc = attn_reference(&fr, o, NULL, NULL, lse, st);
  int64_t s[3];
  strides(t->c.req.o_stride, p->hq, p->nq, p->d, s);
  for (int64_t b = 0; b < p->b && rc == 0; b++)
    for (int64_t h = 0; h < p->hq; h++)
      for (int64_t n = 0; n < p->nq; n++)
        for (int64_t d = 0; d < p->d; d++)
          attn_store_elem(t->c.o, p->dt, at(s, b, h, n, d),
                          (float)o[(((b * p->hq + h) * p->nq) + n) * p->d + d]);
  for (size_t i = 0; i < rows && rc == 0; i++)
    t->lse[i] = (float)lse[i];
  free(o);
  return rc;
}

int tbwd_init(tbwd *t, const tprob *p0, uint64_t seed, bool with_lse, attn_status *st) {
  memset(t, 0, sizeof *t);
  tprob p = *p0;
  p.stats = false;
  tcase_init(&t->c, &p, seed);
  size_t es = attn_dtype_size(p.dt);
  size_t nq = (size_t)(p.b * p.hq * p.nq * p.d), nk = (size_t)(p.b * p.hkv * p.nkv * p.d);
  t->dout = malloc(nq * es);
  t->dq = malloc(nq * es);
  t->dk = malloc(nk * es);
  t->dv = malloc(nk * es);
  t->lse = malloc((size_t)(p.b * p.hq * p.nq) * sizeof *t->lse);
  t->ref = malloc((nq + 2 * nk) * sizeof *t->ref);
  for (size_t i = 0; i < nq; i++)
    attn_store_elem(t->dout, p.dt, i, (float)tuniform(&seed));
  attn_request *r = &t->c.req;
  int rc = forward(t, st);
  r->pass = ATTN_BACKWARD;
  r->dout = t->dout;
  r->dq = t->dq;
  r->dk = t->dk;
  r->dv = t->dv;
  r->lse_in = with_lse ? t->lse : NULL;
  memcpy(r->do_stride, r->q_stride, sizeof r->do_stride);
  memcpy(r->dq_stride, r->q_stride, sizeof r->dq_stride);
  memcpy(r->dk_stride, r->k_stride, sizeof r->dk_stride);
  memcpy(r->dv_stride, r->v_stride, sizeof r->dv_stride);
  if (rc == 0)
    rc = attn_reference_backward(r, t->ref, t->ref + nq, t->ref + nq + nk, st);
  tbwd_poison(t);
  return rc;
}

void tbwd_poison(tbwd *t) {
  const tprob *p = &t->c.p;
  size_t es = attn_dtype_size(p->dt);
  size_t nq = (size_t)(p->b * p->hq * p->nq * p->d), nk = (size_t)(p->b * p->hkv * p->nkv * p->d);
  memset(t->dq, 0xff, nq * es);
  memset(t->dk, 0xff, nk * es);
  memset(t->dv, 0xff, nk * es);
}

void tbwd_free(tbwd *t) {
  tcase_free(&t->c);
  free(t->dout);
  free(t->dq);
  free(t->dk);
  free(t->dv);
  free(t->lse);
  free(t->ref);
}

/* Normalized error of one output (buffer x, request strides s) against
 * ref, contiguous [B, H, N, D]. */
static double norm_err(const void *x, attn_dtype dt, const int64_t s0[3], int64_t B, int64_t H,
                       int64_t N, int64_t D, const double *ref) {
  int64_t s[3];
  strides(s0, H, N, D, s);
  double num = 0, den = 0;
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++)
      for (int64_t n = 0; n < N; n++)
        for (int64_t d = 0; d < D; d++) {
          double y = attn_load_elem(x, dt, at(s, b, h, n, d));
          double r = ref[((b * H + h) * N + n) * D + d];
          num += (y - r) * (y - r);
          den += r * r;
        }
  double e = den > 0 ? sqrt(num / den) : sqrt(num);
  return isnan(e) ? INFINITY : e;
}

tbwd_err tbwd_check(const tbwd *t) {
  const tprob *p = &t->c.p;
  const attn_request *r = &t->c.req;
  size_t nq = (size_t)(p->b * p->hq * p->nq * p->d), nk = (size_t)(p->b * p->hkv * p->nkv * p->d);
  tbwd_err e;
  e.dq = norm_err(t->dq, p->dt, r->dq_stride, p->b, p->hq, p->nq, p->d, t->ref);
  e.dk = norm_err(t->dk, p->dt, r->dk_stride, p->b, p->hkv, p->nkv, p->d, t->ref + nq);
  e.dv = norm_err(t->dv, p->dt, r->dv_stride, p->b, p->hkv, p->nkv, p->d, t->ref + nq + nk);
  return e;
}

bool tbwd_pass(const tbwd_err *e, double tol) {
  return e->dq <= tol && e->dk <= tol && e->dv <= tol;
}
