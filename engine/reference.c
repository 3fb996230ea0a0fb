/*
 * reference.c — float64 standard attention, by the definition.
 *
 * A library without engine state: the tests' independent yardstick, and
 * what the "reference" backend (reference_backend.c) runs a head at a time.
 * The backward pass by the definition is reference_bwd.c.
 */
#include "reference.h"

#include "request_int.h"
#include "softmax.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int attn_reference_load(const attn_request *r, const char *name, const void *base,
                        const int64_t s[3], int64_t b, int64_t h, int64_t n, int64_t width,
                        double *dst, attn_status *st) {
  const int64_t D = width;
  for (int64_t i = 0; i < n; i++)
    for (int64_t d = 0; d < D; d++) {
      size_t off = (size_t)(b * s[0] + h * s[1] + i * s[2] + d);
      double x = attn_load_elem(base, r->dtype, off);
      if (!isfinite(x))
        return attn_status_set(st, ATTN_ENONFINITE,
                               "tensor %s holds a non-finite value (%g) at "
                               "[%lld, %lld, %lld, %lld]; inputs must be finite",
                               name, x, (long long)b, (long long)h, (long long)i, (long long)d);
      dst[i * D + d] = x;
    }
  return 0;
}

/* One row's softmax over its nk scores s into p; with sinks over one
 * logit more, the head's sink (a key whose value is zero, so it shows in
 * p's normalization, m and l only), through row (nk + 1 doubles). */
static void row_softmax(const attn_request *r, int64_t h, const double *s, double *p, double *row,
                        double *pm, double *pl) {
  const size_t nk = (size_t)r->seq_kv;
  if (!r->sinks) {
    attn_softmax_safe(s, nk, p, pm, pl);
    return;
  }
  memcpy(row, s, nk * sizeof *row);
  row[nk] = r->sinks[h];
  attn_softmax_safe(row, nk + 1, row, pm, pl);
  memcpy(p, row, nk * sizeof *p);
}

int attn_reference_head(const attn_request *r, int64_t b, int64_t h, double *S, double *P,
                        double *o, double *m, double *l, double *lse, attn_status *st) {
  const int64_t nq = r->seq_q, nk = r->seq_kv, D = r->head_dim, Dv = attn_request_dv(r);
  const int64_t hk = h / (r->heads_q / r->heads_kv);
  const double scale = attn_request_scale(r);
  int64_t wl, wr;
  attn_request_window(r, &wl, &wr);
  const int64_t off = attn_request_offset(r);
  const double slope = attn_request_alibi_slope(r, b, h);
  double *q = malloc((size_t)((nq + nk) * D + nk * Dv + nk + 1) * sizeof *q);
  if (!q)
    return attn_status_set(st, ATTN_ENOMEM, "out of memory in the reference");
  double *k = q + nq * D, *v = k + nk * D;
  int rc;
  if ((rc = attn_reference_load(r, "q", r->q, r->q_stride, b, h, nq, D, q, st)) ||
      (rc = attn_reference_load(r, "k", r->k, r->k_stride, b, hk, nk, D, k, st)) ||
      (rc = attn_reference_load(r, "v", r->v, r->v_stride, b, hk, nk, Dv, v, st))) {
    free(q);
    return rc;
  }
  for (int64_t i = 0; i < nq; i++)
    for (int64_t j = 0; j < nk; j++) {
      bool visible = (wl < 0 || j >= i + off - wl) && (wr < 0 || j <= i + off + wr);
      double s = -INFINITY;
      if (visible) {
        s = 0;
        for (int64_t d = 0; d < D; d++)
          s += q[i * D + d] * k[j * D + d];
        s *= scale;
        if (r->softcap > 0)
          s = r->softcap * tanh(s / r->softcap);
        s -= slope * fabs((double)(i + off - j));
      }
      S[i * nk + j] = s;
    }
  for (int64_t i = 0; i < nq; i++) {
    double mi, li;
    row_softmax(r, h, &S[i * nk], &P[i * nk], v + nk * Dv, &mi, &li);
    if (m)
      m[i] = mi;
    if (l)
      l[i] = li;
    if (lse)
      lse[i] = li > 0 ? mi + log(li) : -INFINITY;
    for (int64_t d = 0; d < Dv; d++)
      o[i * Dv + d] = 0;
    for (int64_t j = 0; j < nk; j++) {
      double pij = P[i * nk + j];
      if (pij != 0)
        for (int64_t d = 0; d < Dv; d++)
          o[i * Dv + d] += pij * v[j * Dv + d];
    }
  }
  free(q);
  return 0;
}

int attn_reference_scratch(const attn_request *r, double **S, double **P, attn_status *st) {
  size_t n = (size_t)r->seq_q * (size_t)r->seq_kv;
  *S = malloc(n * sizeof **S);
  *P = malloc(n * sizeof **P);
  if (!*S || !*P) {
    free(*S);
    free(*P);
    return attn_status_set(st, ATTN_ENOMEM, "out of memory for the reference's S and P (%zu bytes)",
                           2 * n * sizeof(double));
  }
  return 0;
}

int attn_reference(const attn_request *r0, double *o, double *m, double *l, double *lse,
                   attn_status *st) {
  int rc = attn_request_validate(r0, st);
  if (rc < 0)
    return rc;
  if (r0->cu_seqlens_q) /* the engine splits a varlen batch before any backend */
    return attn_status_set(st, ATTN_EUNSUPPORTED,
                           "the float64 reference takes one problem, not a variable-length "
                           "batch; run it on each sequence");
  if (r0->k_pages) /* it reads K and V in place, the way the contract lays them out */
    return attn_status_set(st, ATTN_EUNSUPPORTED,
                           "the float64 reference reads whole K and V tensors, not pages");
  attn_request r = *r0;
  attn__request_fill_strides(&r);
  double *S, *P;
  if ((rc = attn_reference_scratch(&r, &S, &P, st)) < 0)
    return rc;
  const int64_t nq = r.seq_q, D = attn_request_dv(&r);
  for (int64_t b = 0; b < r.batch && rc == 0; b++)
    for (int64_t h = 0; h < r.heads_q && rc == 0; h++) {
      size_t row = (size_t)((b * r.heads_q + h) * nq);
      rc = attn_reference_head(&r, b, h, S, P, o + row * (size_t)D, m ? m + row : NULL,
                               l ? l + row : NULL, lse ? lse + row : NULL, st);
    }
  free(S);
  free(P);
  return rc;
}
