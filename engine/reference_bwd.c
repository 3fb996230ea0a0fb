/*
 * reference_bwd.c — the backward pass in float64, by the definition.
 *
 * The yardstick of the flash backward kernels, so it shares nothing with
 * them: it takes P from the forward reference (S and P of one head
 * materialized), forms dP = dO·Vᵀ whole, and applies the softmax Jacobian
 * as written, dS = P∘(dP − rowsum(P∘dP)), without the FlashAttention
 * shortcut rowsum(dO∘O) and without the caller's lse or o (which are only
 * checked for finiteness, so that every backend refuses the same inputs).
 */
#include "reference.h"

#include "check.h"
#include "request_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Rows of one head: q, do (Nq × D), k, v (Nkv × D), o read for its check. */
typedef struct bwd_head {
  double *q, *dout, *k, *v, *o;
} bwd_head;

static int load_inputs(const attn_request *r, int64_t b, int64_t h, int64_t hk, bwd_head *x,
                       attn_status *st) {
  const int64_t D = r->head_dim, Dv = attn_request_dv(r), nq = r->seq_q, nk = r->seq_kv;
  int rc;
  if ((rc = attn_reference_load(r, "q", r->q, r->q_stride, b, h, nq, D, x->q, st)) ||
      (rc = attn_reference_load(r, "k", r->k, r->k_stride, b, hk, nk, D, x->k, st)) ||
      (rc = attn_reference_load(r, "v", r->v, r->v_stride, b, hk, nk, Dv, x->v, st)) ||
      (rc = attn_reference_load(r, "o", r->o, r->o_stride, b, h, nq, Dv, x->o, st)) ||
      (rc = attn_reference_load(r, "do", r->dout, r->do_stride, b, h, nq, Dv, x->dout, st)))
    return rc;
  return 0;
}

/* S becomes dS = P∘(dP − rowsum(P∘dP)), with dP = dO·Vᵀ on visible pairs
 * (P is 0 elsewhere, so masked pairs get dS = 0). */
static void softmax_grad(const attn_request *r, const bwd_head *x, const double *P, double *S) {
  const int64_t nq = r->seq_q, nk = r->seq_kv, D = attn_request_dv(r);
  for (int64_t i = 0; i < nq; i++) {
    double *dp = &S[i * nk], rowsum = 0;
    for (int64_t j = 0; j < nk; j++) {
      double t = 0;
      if (P[i * nk + j] != 0)
        for (int64_t d = 0; d < D; d++)
          t += x->dout[i * D + d] * x->v[j * D + d];
      dp[j] = t;
      rowsum += P[i * nk + j] * t;
    }
    for (int64_t j = 0; j < nk; j++)
      dp[j] = P[i * nk + j] * (dp[j] - rowsum);
  }
}

/* With softcap, the scores the softmax saw are cap·tanh(s/cap) of the
 * scaled scores s: dS picks up the factor 1 - tanh²(s/cap), s recomputed
 * here by the definition. (ALiBi adds a constant: dS is unchanged.) */
static void softcap_grad(const attn_request *r, const bwd_head *x, double *dS) {
  const int64_t nq = r->seq_q, nk = r->seq_kv, D = r->head_dim;
  const double scale = attn_request_scale(r), cap = r->softcap;
  for (int64_t i = 0; i < nq; i++)
    for (int64_t j = 0; j < nk; j++) {
      if (dS[i * nk + j] == 0)
        continue;
      double s = 0;
      for (int64_t d = 0; d < D; d++)
        s += x->q[i * D + d] * x->k[j * D + d];
      double t = tanh(scale * s / cap);
      dS[i * nk + j] *= 1 - t * t;
    }
}

/* dq = scale·dS·K for this head; dk += scale·dSᵀ·Q, dv += Pᵀ·dO. */
static void accumulate(const attn_request *r, const bwd_head *x, const double *P, const double *dS,
                       double *dq, double *dk, double *dv) {
  const int64_t nq = r->seq_q, nk = r->seq_kv, D = r->head_dim, Dv = attn_request_dv(r);
  const double scale = attn_request_scale(r);
  memset(dq, 0, (size_t)(nq * D) * sizeof *dq);
  for (int64_t i = 0; i < nq; i++)
    for (int64_t j = 0; j < nk; j++) {
      double p = P[i * nk + j], ds = dS[i * nk + j];
      for (int64_t d = 0; d < D; d++) {
        dq[i * D + d] += scale * ds * x->k[j * D + d];
        dk[j * D + d] += scale * ds * x->q[i * D + d];
      }
      for (int64_t d = 0; d < Dv; d++)
        dv[j * Dv + d] += p * x->dout[i * Dv + d];
    }
}

int attn_reference_backward_group(const attn_request *r, int64_t b, int64_t hk, double *S,
                                  double *P, double *dq, double *dk, double *dv, attn_status *st) {
  const int64_t nq = r->seq_q, nk = r->seq_kv, D = r->head_dim, Dv = attn_request_dv(r);
  const int64_t group = r->heads_q / r->heads_kv, W = D > Dv ? D : Dv; /* every buffer's width */
  bwd_head x;
  x.q = malloc((size_t)(4 * nq * W + 2 * nk * W) * sizeof(double));
  if (!x.q)
    return attn_status_set(st, ATTN_ENOMEM, "out of memory in the reference");
  x.dout = x.q + nq * W;
  x.o = x.dout + nq * W;
  double *o_fwd = x.o + nq * W;
  x.k = o_fwd + nq * W;
  x.v = x.k + nk * W;
  memset(dk, 0, (size_t)(nk * D) * sizeof *dk);
  memset(dv, 0, (size_t)(nk * Dv) * sizeof *dv);
  int rc = attn__check_lse(r, st);
  for (int64_t g = 0; g < group && rc == 0; g++) {
    int64_t h = hk * group + g;
    if ((rc = load_inputs(r, b, h, hk, &x, st)) == 0 &&
        (rc = attn_reference_head(r, b, h, S, P, o_fwd, NULL, NULL, NULL, st)) == 0) {
      softmax_grad(r, &x, P, S);
      if (r->softcap > 0)
        softcap_grad(r, &x, S);
      accumulate(r, &x, P, S, dq + g * nq * D, dk, dv);
    }
  }
  free(x.q);
  return rc;
}

int attn_reference_backward(const attn_request *r0, double *dq, double *dk, double *dv,
                            attn_status *st) {
  int rc = attn_request_validate(r0, st);
  if (rc < 0)
    return rc;
  if (r0->pass != ATTN_BACKWARD)
    return attn_status_set(st, ATTN_EINVAL, "attn_reference_backward needs a backward request");
  if (r0->cu_seqlens_q)
    return attn_status_set(st, ATTN_EUNSUPPORTED,
                           "the float64 reference takes one problem, not a variable-length "
                           "batch; run it on each sequence");
  attn_request r = *r0;
  attn__request_fill_strides(&r);
  size_t n = (size_t)r.seq_q * (size_t)r.seq_kv;
  double *S = malloc(n * sizeof *S), *P = malloc(n * sizeof *P);
  if (!S || !P)
    rc = attn_status_set(st, ATTN_ENOMEM, "out of memory for the reference's S and P");
  const int64_t D = r.head_dim, Dv = attn_request_dv(&r), group = r.heads_q / r.heads_kv;
  for (int64_t b = 0; b < r.batch && rc == 0; b++)
    for (int64_t hk = 0; hk < r.heads_kv && rc == 0; hk++) {
      size_t qrow = (size_t)((b * r.heads_q + hk * group) * r.seq_q);
      size_t krow = (size_t)((b * r.heads_kv + hk) * r.seq_kv);
      rc = attn_reference_backward_group(&r, b, hk, S, P, dq + qrow * (size_t)D,
                                         dk + krow * (size_t)D, dv + krow * (size_t)Dv, st);
    }
  free(S);
  free(P);
  return rc;
}

/* Head (b, h)'s share of dsinks[h]: the sink's logit t enters row i's
 * softmax beside the scores, with P_t = e^(t − m)/l and dP_t = dO·0 = 0,
 * so dL/dt = P_t·(0 − Σ_j P_ij·dP_ij) by the Jacobian, summed over rows. */
static int dsinks_head(const attn_request *r, int64_t b, int64_t h, double *S, double *P,
                       bwd_head *x, double *ml, double *out, attn_status *st) {
  const int64_t nq = r->seq_q, nk = r->seq_kv, D = attn_request_dv(r);
  const int64_t hk = h / (r->heads_q / r->heads_kv);
  int rc = load_inputs(r, b, h, hk, x, st);
  if (rc == 0)
    rc = attn_reference_head(r, b, h, S, P, x->o, ml, ml + nq, NULL, st);
  for (int64_t i = 0; i < nq && rc == 0; i++) {
    double rowsum = 0;
    for (int64_t j = 0; j < nk; j++) {
      double dp = 0;
      for (int64_t d = 0; d < D; d++)
        dp += x->dout[i * D + d] * x->v[j * D + d];
      rowsum += P[i * nk + j] * dp;
    }
    *out -= exp((double)r->sinks[h] - ml[i]) / ml[nq + i] * rowsum;
  }
  return rc;
}

int attn_reference_dsinks(const attn_request *r0, double *dsinks, attn_status *st) {
  int rc = attn_request_validate(r0, st);
  if (rc < 0)
    return rc;
  if (r0->pass != ATTN_BACKWARD || !r0->sinks || r0->cu_seqlens_q)
    return attn_status_set(st, ATTN_EINVAL,
                           "attn_reference_dsinks needs a backward request with sinks and "
                           "one problem (not a variable-length batch)");
  attn_request r = *r0;
  attn__request_fill_strides(&r);
  const int64_t nq = r.seq_q, nk = r.seq_kv;
  const int64_t D = r.head_dim > attn_request_dv(&r) ? r.head_dim : attn_request_dv(&r);
  size_t n = (size_t)(nq * nk);
  double *S = malloc(n * sizeof *S), *P = malloc(n * sizeof *P);
  double *buf = malloc((size_t)(3 * nq * D + 2 * nk * D + 2 * nq) * sizeof *buf);
  if (!S || !P || !buf)
    rc = attn_status_set(st, ATTN_ENOMEM, "out of memory in the reference");
  bwd_head x = {0};
  if (buf)
    x = (bwd_head){.q = buf,
                   .dout = buf + nq * D,
                   .o = buf + 2 * nq * D,
                   .k = buf + 3 * nq * D,
                   .v = buf + 3 * nq * D + nk * D};
  for (int64_t h = 0; h < r.heads_q && rc == 0; h++) {
    dsinks[h] = 0;
    for (int64_t b = 0; b < r.batch && rc == 0; b++)
      rc = dsinks_head(&r, b, h, S, P, &x, x.v + nk * D, &dsinks[h], st);
  }
  free(S);
  free(P);
  free(buf);
  return rc;
}
