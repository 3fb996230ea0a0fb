/*
 * flash_bwd_bf16.h — the backward's five products on VDPBF16PS, for
 * flash_bwd.c's avx512bf16 and amx instances (BF16 inputs, even head_dim).
 *
 * Included by flash_bwd.c only. The tiles, the masks, P and dS and their
 * F32 arithmetic are flash_bwd_pair.h's; what changes is that each
 * product sums two BF16 products per 32-bit lane into F32,
 *
 *   VDPBF16PS  acc[n] += a[2n]·b[2n] + a[2n+1]·b[2n+1],
 *
 * so both operands come in pairs along the reduction. One micro-kernel,
 * C[r][lanes] (+)= Σ_k pair(A, r, k)·B[k][lanes], with the A pair a 32-bit
 * broadcast read at any two byte strides, covers all five:
 *   S    = Q·Kᵀ      A = Q rows in place (pairs of d), B = Kᵀ pairs over d
 *   dP   = dO·Vᵀ     A = dO rows in place,             B = Vᵀ pairs over d
 *   dVᵀ += dOᵀ·P     A = dO pairs of rows (over i),    B = P pairs over i
 *   dKᵀ += Qᵀ·dS     A = Q pairs of rows,              B = dS pairs over i
 *   dQ  += dS·K      A = dS rows in BF16 (pairs of j), B = K pairs over j
 * S and dP take exact BF16 inputs; P and dS are rounded to BF16 (to
 * nearest even) for the last three, as FlashAttention-2 does on GPUs: the
 * error that adds is about 2^-9 relative per element, random in sign, so
 * the sums' normalized error stays well inside BF16's 8e-3
 * (tests/unit/test_backward.c). An odd row or key count pairs the last one
 * with a zero row or key (zero Q, dO, P, dS or K).
 *
 * Workspace: the same regions as the F32 path, holding pairs instead
 * (kb_bf16_carve), so ATTN_BWD_WS_FLOATS does not change.
 */
#ifndef ATTN_CPU_FLASH_BWD_BF16_H
#define ATTN_CPU_FLASH_BWD_BF16_H

#include "flash_bwd_pair.h"

static inline uint32_t ld32(const char *p) {
  uint32_t v;
  memcpy(&v, p, sizeof v);
  return v;
}

/* C rows 0..mr, vectors 0..nr: (C +) Σ_k pair(A + r·sar + k·sak)·B[k·ldb + lanes]. */
INLINE void dp_micro(const char *A, int64_t sar, int64_t sak, const uint32_t *restrict B,
                     int64_t ldb, float *restrict C, int64_t ldc, int64_t K, bool acc, const int mr,
                     const int nr) {
  __m512 c[MR][NR];
  UNROLL for (int r = 0; r < mr; r++) UNROLL for (int v = 0; v < nr; v++) c[r][v] =
      acc ? vload(C + r * ldc + v * VL) : vset1(0.0f);
  const char *ap = A;
  const uint32_t *bp = B;
  for (int64_t k = 0; k < K; k++, ap += sak, bp += ldb) {
    __m512i b[NR];
    UNROLL for (int v = 0; v < nr; v++) b[v] = _mm512_loadu_si512(bp + v * VL);
    UNROLL for (int r = 0; r < mr; r++) {
      const __m512bh x = (__m512bh)_mm512_set1_epi32((int)ld32(ap + r * sar));
      UNROLL for (int v = 0; v < nr; v++) c[r][v] = _mm512_dpbf16_ps(c[r][v], x, (__m512bh)b[v]);
    }
  }
  UNROLL for (int r = 0; r < mr; r++) UNROLL for (int v = 0; v < nr; v++)
      vstore(C + r * ldc + v * VL, c[r][v]);
}

/* C (M rows of nv vectors, rows ldc apart) (+)= A·B over K pairs. */
static void dmm(float *C, int64_t ldc, int64_t M, int nv, int64_t K, const char *A, int64_t sar,
                int64_t sak, const uint32_t *B, int64_t ldb, bool acc) {
  for (int c0 = 0; c0 < nv; c0 += NR) {
    const int nr = nv - c0 < NR ? nv - c0 : NR;
    for (int64_t r0 = 0; r0 < M; r0 += MR) {
      const int mr = M - r0 < MR ? (int)(M - r0) : MR;
#define DM(MV, NV) \
  dp_micro(A + r0 * sar, sar, sak, B + c0 * VL, ldb, C + r0 * ldc + c0 * VL, ldc, K, acc, MV, NV)
      MR_CASES(DM, mr)
#undef DM
    }
  }
}

/* ---- packing --------------------------------------------------------------- */

/* The workspace regions of kb_ctx as pairs: Kᵀ and Vᵀ pairs over d
 * (D/2 × BK), K pairs over j (BK/2 × dld), Q and dO pairs over i
 * (BQ/2 × D each), P and dS pairs over i (BQ/2 × BK each), dS rows in BF16
 * (BQ × BK). */
static void kb_bf16_carve(kb_ctx *x) {
  x->ktp = (uint32_t *)x->kt;
  x->vtp = (uint32_t *)x->vt;
  x->kjp = (uint32_t *)x->kr;
  x->qip = (uint32_t *)x->qr;
  x->gip = (uint32_t *)x->dor;
  x->pip = x->qip + BQ / 2 * x->wd;
  x->sip = x->gip + BQ / 2 * x->wd;
  x->dsr = (uint16_t *)(x->pip + BQ / 2 * BK);
}

/* n rows at src (BF16, `step` bytes apart) as pairs of rows: out[p][d] =
 * (row 2p, row 2p+1)[d], rows ld apart; a missing odd row and the columns
 * [D, ld) are zero. */
static void pair_rows(uint32_t *out, int64_t ld, const char *src, int64_t step, int64_t n,
                      int64_t D) {
  for (int64_t p = 0; 2 * p < n; p++) {
    const char *a = src + 2 * p * step, *b = 2 * p + 1 < n ? a + step : NULL;
    uint32_t *o = out + p * ld;
    int64_t d = 0;
    for (; d + 16 <= D; d += 16) {
      __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(a + 2 * d)));
      __m512i hi = b ? _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(b + 2 * d)))
                     : _mm512_setzero_si512();
      _mm512_storeu_si512(o + d, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
    }
    for (; d < D; d++) {
      uint16_t u, w = 0;
      memcpy(&u, a + 2 * d, 2);
      if (b)
        memcpy(&w, b + 2 * d, 2);
      o[d] = u | (uint32_t)w << 16;
    }
    for (; d < ld; d++)
      o[d] = 0;
  }
}

/* out[p·BK + jj] = word p (elements 2p, 2p+1) of row jj at src (rows ld
 * bytes apart), for D2 words and the BK keys (zero past nkt): 16 rows by
 * 16 words at a time, a 16×16 transpose. */
static void pair_cols(uint32_t *out, const char *src, int64_t ld, int64_t nkt, int64_t D2) {
  for (int64_t jj0 = 0; jj0 < BK; jj0 += 16)
    for (int64_t p0 = 0; p0 < D2; p0 += 16) {
      const __mmask16 m = (__mmask16)(p0 + 16 <= D2 ? 0xffff : (1u << (D2 - p0)) - 1);
      __m512i x[16];
      for (int64_t rr = 0; rr < 16; rr++)
        x[rr] = jj0 + rr < nkt ? _mm512_maskz_loadu_epi32(m, src + (jj0 + rr) * ld + 4 * p0)
                               : _mm512_setzero_si512();
      vtranspose16(x);
      for (int64_t c = 0; c < 16 && p0 + c < D2; c++)
        _mm512_storeu_si512(out + (p0 + c) * BK + jj0, x[c]);
    }
}

/* The key block's Kᵀ and Vᵀ pairs over d (keys past nkt zero), and K pairs
 * over j, straight from the BF16 rows. */
static void pack_kv_bf16(kb_ctx *x) {
  const attn_request *r = x->a->r;
  const int64_t ldk = r->k_stride[2] * 2, ldv = r->v_stride[2] * 2;
  const char *kp = x->kbase + x->j0 * ldk, *vp = x->vbase + x->j0 * ldv;
  pair_cols(x->ktp, kp, ldk, x->nkt, r->head_dim / 2);
  pair_cols(x->vtp, vp, ldv, x->nkt, x->vw / 2);
  pair_rows(x->kjp, x->a->dld, kp, ldk, x->nkt, r->head_dim);
}

/* Rows 2p and 2p+1 of an F32 tile (BK wide) as BF16 pairs over rows; rows
 * past n are zero. cvtne2ps puts row 2p in the low 16 words and 2p+1 in
 * the high ones; vpermw interleaves them. */
static void pair_tile(uint32_t *out, const float *t, int64_t n) {
  const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                       23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  for (int64_t p = 0; 2 * p < n; p++)
    for (int v = 0; v < NVK; v++) {
      __m512 lo = vload(t + 2 * p * BK + v * VL);
      __m512 hi = 2 * p + 1 < n ? vload(t + (2 * p + 1) * BK + v * VL) : _mm512_setzero_ps();
      __m512i w = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
      _mm512_storeu_si512(out + p * BK + v * VL, _mm512_permutexvar_epi16(idx, w));
    }
}

/* P and dS (F32, from softmax_grad) to pairs over i at pip and sip, and dS
 * rows to BF16 at dsr. */
static void pack_p_ds(const kb_ctx *x, int64_t n, uint32_t *pip, uint32_t *sip, uint16_t *dsr) {
  pair_tile(pip, x->s, n);
  pair_tile(sip, x->dp, n);
  for (int64_t ii = 0; ii < n; ii++)
    for (int v = 0; v < NVK; v++)
      _mm256_storeu_si256((__m256i *)(dsr + ii * BK + v * VL),
                          (__m256i)_mm512_cvtneps_pbh(vload(x->dp + ii * BK + v * VL)));
}

/* Query rows [i0, i0 + n) of head h against the key block, BF16 products. */
static void pair_bf16(kb_ctx *x, int64_t h, int64_t i0, int64_t n) {
  const attn__bwd_args *a = x->a;
  const attn_request *r = a->r;
  const int64_t D = r->head_dim, np = (n + 1) / 2;
  const int64_t ldq = r->q_stride[2] * 2, ldo = r->do_stride[2] * 2;
  const char *q = row_at(r, r->q, r->q_stride, x->b, h, i0);
  const char *g = row_at(r, r->dout, r->do_stride, x->b, h, i0);
  const bool full = pair_stats(x, h, i0, n);
  dmm(x->s, BK, n, NVK, D / 2, q, ldq, 4, x->ktp, BK, false);
  dmm(x->dp, BK, n, NVK, x->vw / 2, g, ldo, 4, x->vtp, BK, false);
  softmax_grad(x, h, i0, n, full);
  pack_p_ds(x, n, x->pip, x->sip, x->dsr);
  pair_rows(x->qip, D, q, ldq, n, D);
  pair_rows(x->gip, D, g, ldo, n, x->vw);
  dmm(x->dvt, BK, x->vw, NVK, np, (const char *)x->gip, 4, 4 * D, x->pip, BK, true);
  dmm(x->dkt, BK, D, NVK, np, (const char *)x->qip, 4, 4 * D, x->sip, BK, true);
  dmm(dq_part(a, x->c, x->b, h, i0), a->dld, n, (int)(a->dld / VL), (x->nkt + 1) / 2,
      (const char *)x->dsr, 2 * BK, 4, x->kjp, a->dld, true);
}

#endif
