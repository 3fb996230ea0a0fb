/*
 * flash_bwd_pair.h — the backward's key-block context (kb_ctx) and its F32
 * pair of blocks: the one micro-kernel, the masks, P and dS from the lse.
 *
 * Included by flash_bwd.c, once per instruction set (simd.h), and by the
 * BF16 and AMX paths (flash_bwd_bf16.h, flash_bwd_amx.h), which use its
 * context, its row addressing and its softmax gradient: they lean on this
 * header, never on the file that includes them.
 */
#ifndef ATTN_CPU_FLASH_BWD_PAIR_H
#define ATTN_CPU_FLASH_BWD_PAIR_H

#include "flash.h"
#include "simd.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>

#define BQ ATTN_BWD_BQ
#define BK ATTN_BWD_BK
#define NVK (BK / VL) /* vectors across a key block */

/* ---- the one micro-kernel and its tile loop -------------------------------- */

/* C rows 0..mr, vectors 0..nr: (C +) Σ_k A[r·sar + k·sak]·B[k·ldb + lanes]. */
INLINE void mm_micro(const float *restrict A, int64_t sar, int64_t sak, const float *restrict B,
                     int64_t ldb, float *restrict C, int64_t ldc, int64_t K, bool acc, const int mr,
                     const int nr) {
  vf c[MR][NR];
  UNROLL for (int r = 0; r < mr; r++) UNROLL for (int v = 0; v < nr; v++) c[r][v] =
      acc ? vload(C + r * ldc + v * VL) : vset1(0.0f);
  const float *ap = A, *bp = B;
  for (int64_t k = 0; k < K; k++, ap += sak, bp += ldb) {
    vf b[NR];
    UNROLL for (int v = 0; v < nr; v++) b[v] = vload(bp + v * VL);
    UNROLL for (int r = 0; r < mr; r++) {
      vf x = vset1(ap[r * sar]);
      UNROLL for (int v = 0; v < nr; v++) c[r][v] = vfma(x, b[v], c[r][v]);
    }
  }
  UNROLL for (int r = 0; r < mr; r++) UNROLL for (int v = 0; v < nr; v++)
      vstore(C + r * ldc + v * VL, c[r][v]);
}

/* C (M rows of nv vectors, rows ldc apart) (+)= A·B over K. */
static void mm(float *C, int64_t ldc, int64_t M, int nv, int64_t K, const float *A, int64_t sar,
               int64_t sak, const float *B, int64_t ldb, bool acc) {
  for (int c0 = 0; c0 < nv; c0 += NR) {
    const int nr = nv - c0 < NR ? nv - c0 : NR;
    for (int64_t r0 = 0; r0 < M; r0 += MR) {
      const int mr = M - r0 < MR ? (int)(M - r0) : MR;
#define MM(MV, NV) \
  mm_micro(A + r0 * sar, sar, sak, B + c0 * VL, ldb, C + r0 * ldc + c0 * VL, ldc, K, acc, MV, NV)
      MR_CASES(MM, mr)
#undef MM
    }
  }
}

/* ---- one key block ----------------------------------------------------------- */

typedef struct kb_ctx {
  const attn__bwd_args *a;
  int64_t b, hk, c;
  float *kt, *vt, *dkt, *dvt, *kr, *s, *dp, *qr, *dor, *mu, *di;
  int64_t wd; /* the head dim the workspace is laid out for (attn__cpu_ws_d) */
  int64_t vw; /* V's side of the products (attn__flash_v_width) */
  const char *kbase, *vbase;
  int64_t j0, nkt;
  bool bf16; /* BF16 products (flash_bwd_bf16.h) instead of F32 */
  bool amx;  /* and AMX tiles for whole pairs of blocks (flash_bwd_amx.h) */
  /* The BF16 path's views of the regions above (kb_bf16_carve). */
  uint32_t *ktp, *vtp, *kjp, *qip, *gip, *pip, *sip;
  uint16_t *dsr;
  /* The AMX path's (amx_carve): pairs whose dVᵀ and dKᵀ products wait, in
   * slots of dOᵀ and Qᵀ columns, P and dS pairs; dS rows. */
  int slots, npend;
  uint16_t *gts, *qts, *dsa;
  uint32_t *pps, *sps;
} kb_ctx;

static const char *row_at(const attn_request *r, const void *base, const int64_t st[3], int64_t b,
                          int64_t h, int64_t i) {
  return (const char *)base +
         (size_t)(b * st[0] + h * st[1] + i * st[2]) * attn_dtype_size(r->dtype);
}

static void *out_row(const attn_request *r, void *base, const int64_t st[3], int64_t b, int64_t h,
                     int64_t i) {
  return (char *)base + (size_t)(b * st[0] + h * st[1] + i * st[2]) * attn_dtype_size(r->dtype);
}

/* Row i of (b, h) of the dQ partial of chunk c. */
static float *dq_part(const attn__bwd_args *a, int64_t c, int64_t b, int64_t h, int64_t i) {
  const attn_request *r = a->r;
  const int64_t rows = r->batch * r->heads_q * r->seq_q;
  return a->dqp + ((c * rows) + (b * r->heads_q + h) * r->seq_q + i) * a->dld;
}

/* Kᵀ and Vᵀ (D × BK, keys past nkt zero) and K rows (padded with zeros). */
static void pack_kv(kb_ctx *x) {
  const attn_request *r = x->a->r;
  const int64_t D = r->head_dim, dld = x->a->dld, es = (int64_t)attn_dtype_size(r->dtype);
  for (int64_t jj = 0; jj < BK; jj++) {
    float *kr = x->kr + jj * dld, *vr = x->qr;
    if (jj < x->nkt) {
      load_row(kr, x->kbase + (x->j0 + jj) * r->k_stride[2] * es, r->dtype, D);
      load_row(vr, x->vbase + (x->j0 + jj) * r->v_stride[2] * es, r->dtype, D);
    } else {
      for (int64_t d = 0; d < D; d++)
        kr[d] = vr[d] = 0.0f;
    }
    for (int64_t d = D; d < dld; d++)
      kr[d] = 0.0f;
    for (int64_t d = 0; d < D; d++) {
      x->kt[d * BK + jj] = kr[d];
      x->vt[d * BK + jj] = vr[d];
    }
  }
}

/* Zeroes P outside row i's window and past the block's last key. */
static void mask_row(const kb_ctx *x, int64_t i, float *p) {
  const attn__bwd_args *a = x->a;
  int64_t lo = a->wl < 0 ? 0 : i + a->off - a->wl;
  int64_t hi = a->wr < 0 ? a->r->seq_kv - 1 : i + a->off + a->wr;
  hi = hi < x->j0 + x->nkt - 1 ? hi : x->j0 + x->nkt - 1;
  for (int64_t jj = 0; jj < BK; jj++)
    if (x->j0 + jj < lo || x->j0 + jj > hi)
      p[jj] = 0.0f;
}

/*
 * softmax_grad with the variants: s2 = S·scale2 goes through softcap,
 * t = tanh(s2 / cap2), s2 = cap2·t, and gets the ALiBi bias before P is
 * formed; dS = P∘(dP − Dᵢ)∘(1 − t²) is the gradient of the scaled score
 * before the cap. (dP − Dᵢ)(1 − t²) goes into dP first, so the mask, which
 * zeroes P, still zeroes dS.
 */
static void softmax_grad_variant(const kb_ctx *x, int64_t h, int64_t i0, int64_t n, bool full) {
  const attn__bwd_args *a = x->a;
  const vf sc = vset1(a->scale2), cap = vset1(a->var.cap2), inv = vset1(a->var.inv_cap2);
  const float slope2 = (float)(-attn_request_alibi_slope(a->r, x->b, h) * M_LOG2E);
  float dist[BK];
  for (int64_t ii = 0; ii < n; ii++) {
    float *s = x->s + ii * BK, *dp = x->dp + ii * BK;
    const vf nmu = vset1(-x->mu[ii]), di = vset1(x->di[ii]);
    for (int64_t jj = 0; jj < BK; jj++) /* |i + off - j|, exact below 2^24 */
      dist[jj] = (float)llabs(i0 + ii + a->off - x->j0 - jj);
    for (int v = 0; v < NVK; v++) {
      vf s2 = vmul(vload(s + v * VL), sc), g = vsub(vload(dp + v * VL), di);
      if (a->var.cap2 > 0) {
        const vf t = vtanh(vmul(s2, inv));
        s2 = vmul(cap, t);
        g = vmul(g, vsub(vset1(1.0f), vmul(t, t)));
      }
      s2 = vfma(vset1(slope2), vload(dist + v * VL), s2);
      vstore(s + v * VL, vexp2(vadd(s2, nmu)));
      vstore(dp + v * VL, g);
    }
    if (!full)
      mask_row(x, i0 + ii, s);
    for (int v = 0; v < NVK; v++)
      vstore(dp + v * VL, vmul(vload(s + v * VL), vload(dp + v * VL)));
  }
}

/* P = 2^(S·scale2 − mu) in place of S, then dS = P∘(dP − Dᵢ) in place of dP. */
static void softmax_grad(const kb_ctx *x, int64_t h, int64_t i0, int64_t n, bool full) {
  if (x->a->var.on) {
    softmax_grad_variant(x, h, i0, n, full);
    return;
  }
  const vf sc = vset1(x->a->scale2);
  for (int64_t ii = 0; ii < n; ii++) {
    float *s = x->s + ii * BK, *dp = x->dp + ii * BK;
    const vf nmu = vset1(-x->mu[ii]), di = vset1(x->di[ii]);
    for (int v = 0; v < NVK; v++)
      vstore(s + v * VL, vexp2(vfma(vload(s + v * VL), sc, nmu)));
    if (!full)
      mask_row(x, i0 + ii, s);
    for (int v = 0; v < NVK; v++)
      vstore(dp + v * VL, vmul(vload(s + v * VL), vsub(vload(dp + v * VL), di)));
  }
}

/* Rows [i0, i0 + n) of a query tensor as F32: in place, or widened into buf. */
static const float *rows_f32(const kb_ctx *x, const void *base, const int64_t st[3], int64_t h,
                             int64_t i0, int64_t n, float *buf, int64_t *ld) {
  const attn_request *r = x->a->r;
  const char *p = row_at(r, base, st, x->b, h, i0);
  if (r->dtype == ATTN_F32) {
    *ld = st[2];
    return (const float *)p;
  }
  const int64_t D = r->head_dim, es = (int64_t)attn_dtype_size(r->dtype);
  for (int64_t ii = 0; ii < n; ii++)
    load_row(buf + ii * D, p + ii * st[2] * es, r->dtype, D);
  *ld = D;
  return buf;
}

/* mu and Dᵢ of rows [i0, i0 + n) of head h; whether the pair of blocks is
 * wholly inside every row's window (no mask). */
static bool pair_stats(kb_ctx *x, int64_t h, int64_t i0, int64_t n) {
  const attn__bwd_args *a = x->a;
  const attn_request *r = a->r;
  const int64_t row = (x->b * r->heads_q + h) * r->seq_q + i0, ilast = i0 + n - 1;
  for (int64_t ii = 0; ii < n; ii++) {
    const float lse = a->lse[row + ii];
    x->mu[ii] = lse == -INFINITY ? FLT_MAX : lse * (float)M_LOG2E;
    x->di[ii] = a->di[row + ii];
  }
  return x->nkt == BK && (a->wl < 0 || x->j0 >= ilast + a->off - a->wl) &&
         (a->wr < 0 || x->j0 + BK - 1 <= i0 + a->off + a->wr);
}

/* Query rows [i0, i0 + n) of head h against the key block. */
static void pair(kb_ctx *x, int64_t h, int64_t i0, int64_t n) {
  const attn__bwd_args *a = x->a;
  const attn_request *r = a->r;
  const int64_t D = r->head_dim;
  int64_t ldq, ldo;
  const float *q = rows_f32(x, r->q, r->q_stride, h, i0, n, x->qr, &ldq);
  const float *g = rows_f32(x, r->dout, r->do_stride, h, i0, n, x->dor, &ldo);
  const bool full = pair_stats(x, h, i0, n);
  mm(x->s, BK, n, NVK, D, q, ldq, 1, x->kt, BK, false);
  mm(x->dp, BK, n, NVK, x->vw, g, ldo, 1, x->vt, BK, false);
  softmax_grad(x, h, i0, n, full);
  mm(x->dvt, BK, x->vw, NVK, n, g, 1, ldo, x->s, BK, true);
  mm(x->dkt, BK, D, NVK, n, q, 1, ldq, x->dp, BK, true);
  mm(dq_part(a, x->c, x->b, h, i0), a->dld, n, (int)(a->dld / VL), x->nkt, x->dp, BK, 1, x->kr,
     a->dld, true);
}

#endif
