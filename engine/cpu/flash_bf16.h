/*
 * flash_bf16.h — BF16 products for flash.c's avx512bf16 and amx instances.
 *
 * Included by flash.c; built on flash_blk.h and flash_rows.h. Both
 * products keep flash.c's transposed layout and F32 accumulators; what
 * changes is that two BF16 products are summed per 32-bit lane:
 *
 *   VDPBF16PS  acc[n] += a[2n]·b[2n] + a[2n+1]·b[2n+1]
 *
 * so the operands are packed in pairs along the reduction dimension:
 *   Q pairs    qp[p][ii] = (q_ii[2p], q_ii[2p+1]), unscaled and exact (the
 *              scale is applied to the F32 scores);
 *   K          read in place: a row's pair (k[2p], k[2p+1]) is one 32-bit
 *              load, broadcast;
 *   P pairs    pp[jp][ii] = (P[2jp][ii], P[2jp+1][ii]), rounded to BF16;
 *   V pairs    vp[jp][d]  = (v_2jp[d], v_2jp+1[d]), packed per tile.
 * An odd key count pads with a zero key (P = 0, V = 0). Only even head_dim
 * takes this path (flash.c), so no pair reads past a row of K.
 *
 * The amx instance (flash_amx.h) computes whole 64-key tiles on the tile
 * unit from the same pair layouts, and its partial tiles here.
 */
#ifndef ATTN_CPU_FLASH_BF16_H
#define ATTN_CPU_FLASH_BF16_H

#include "flash_rows.h" /* rf_reduce */

#if ATTN_DPBF16 || ATTN_AMX
static inline uint32_t ld32(const char *p) {
  uint32_t x;
  memcpy(&x, p, sizeof x);
  return x;
}

static inline __m512 dp(__m512 acc, __m512i a, __m512i b) {
  return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
}

/* Lane ii of the Q pairs from the BF16 row at src (NULL: a padding lane). */
static void dp_load_q(blk_ctx *c, const char *src, int64_t ii) {
  uint32_t *qp = (uint32_t *)c->qt;
  const int64_t D2 = c->a->r->head_dim / 2;
  for (int64_t p = 0; p < D2; p++)
    qp[p * BQ + ii] = src ? ld32(src + 4 * p) : 0;
}

/* Sᵀ rows j..j+mr, query vectors c0..c0+nr, times the scale. */
INLINE void dp_qk_micro(const uint32_t *restrict qp, const char *kp, int64_t ldk,
                        float *restrict st, int64_t D2, int64_t j, int c0, float sc, const int mr,
                        const int nr) {
  __m512 acc[MR][NR];
  const char *kr[MR];
  UNROLL for (int r = 0; r < mr; r++) {
    kr[r] = kp + (j + r) * ldk;
    UNROLL for (int c = 0; c < nr; c++) acc[r][c] = _mm512_setzero_ps();
  }
  const uint32_t *q = qp + c0 * VL;
  for (int64_t p = 0; p < D2; p++, q += BQ) {
    __m512i qv[NR];
    UNROLL for (int c = 0; c < nr; c++) qv[c] = _mm512_loadu_si512(q + c * VL);
    UNROLL for (int r = 0; r < mr; r++) {
      __m512i kv = _mm512_set1_epi32((int)ld32(kr[r] + 4 * p));
      UNROLL for (int c = 0; c < nr; c++) acc[r][c] = dp(acc[r][c], qv[c], kv);
    }
  }
  UNROLL for (int r = 0; r < mr; r++) UNROLL for (int c = 0; c < nr; c++)
      vstore(st + (j + r) * BQ + (c0 + c) * VL, vmul(acc[r][c], vset1(sc)));
}

/* Oᵀ rows d0..d0+mr, query vectors c0..c0+nr: += Σ_jp V pairs · P pairs. */
INLINE void dp_pv_micro(const uint32_t *restrict pp, const uint32_t *restrict vp, int64_t D,
                        float *restrict ot, int64_t np, int64_t d0, int c0, const int mr,
                        const int nr) {
  __m512 acc[MR][NR];
  UNROLL for (int r = 0; r < mr; r++) UNROLL for (int c = 0; c < nr; c++) acc[r][c] =
      vload(ot + (d0 + r) * BQ + (c0 + c) * VL);
  const uint32_t *p = pp + c0 * VL, *v = vp + d0;
  for (int64_t jp = 0; jp < np; jp++, p += BQ, v += D) {
    __m512i pv[NR];
    UNROLL for (int c = 0; c < nr; c++) pv[c] = _mm512_loadu_si512(p + c * VL);
    UNROLL for (int r = 0; r < mr; r++) {
      __m512i vv = _mm512_set1_epi32((int)v[r]);
      UNROLL for (int c = 0; c < nr; c++) acc[r][c] = dp(acc[r][c], pv[c], vv);
    }
  }
  UNROLL for (int r = 0; r < mr; r++) UNROLL for (int c = 0; c < nr; c++)
      vstore(ot + (d0 + r) * BQ + (c0 + c) * VL, acc[r][c]);
}

static void dp_qk_tile(blk_ctx *c, const char *kp, int64_t ldk, int64_t nkt) {
  const int64_t D2 = c->a->r->head_dim / 2;
  const uint32_t *qp = (const uint32_t *)c->qt;
  const float sc = c->a->scale2;
  for (int c0 = 0; c0 < c->nv; c0 += NR) {
    const int nr = c->nv - c0 < NR ? c->nv - c0 : NR;
    for (int64_t j = 0; j < nkt; j += MR) {
      const int mr = nkt - j < MR ? (int)(nkt - j) : MR;
#define QK(M, N) dp_qk_micro(qp, kp, ldk, c->st, D2, j, c0, sc, M, N)
      MR_CASES(QK, mr)
#undef QK
    }
  }
}

/* P (F32, transposed in st) to BF16 pairs of keys: cvtne2ps puts row 2jp in
 * the low 16 words and row 2jp+1 in the high ones; vpermw interleaves them. */
static void dp_pack_p(blk_ctx *c, int64_t nkt) {
  const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                       23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  uint32_t *pp = (uint32_t *)c->kb;
  for (int64_t jp = 0; 2 * jp < nkt; jp++)
    for (int v = 0; v < c->nv; v++) {
      __m512 lo = vload(c->st + 2 * jp * BQ + v * VL);
      __m512 hi =
          2 * jp + 1 < nkt ? vload(c->st + (2 * jp + 1) * BQ + v * VL) : _mm512_setzero_ps();
      __m512i w = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
      _mm512_storeu_si512(pp + jp * BQ + v * VL, _mm512_permutexvar_epi16(idx, w));
    }
}

/* The tile's V rows (nkt of them) to pairs of keys, vp[jp][d]; a missing
 * odd key is 0. */
static void dp_pack_v(blk_ctx *c, int64_t nkt, uint32_t *vp) {
  const int64_t D = c->a->r->head_dim, step = c->vstep * 2;
  for (int64_t jp = 0; 2 * jp < nkt; jp++) {
    const char *a = c->vt + 2 * jp * step;
    const char *b = 2 * jp + 1 < nkt ? a + step : NULL;
    int64_t d = 0;
    for (; d + 16 <= D; d += 16) {
      __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(a + 2 * d)));
      __m512i hi = b ? _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(b + 2 * d)))
                     : _mm512_setzero_si512();
      _mm512_storeu_si512(vp + jp * D + d, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
    }
    for (; d < D; d++) {
      uint16_t x, y = 0;
      memcpy(&x, a + 2 * d, 2);
      if (b)
        memcpy(&y, b + 2 * d, 2);
      vp[jp * D + d] = x | (uint32_t)y << 16;
    }
  }
}

static void dp_pv_tile(blk_ctx *c, const uint32_t *vp, int64_t nkt) {
  const int64_t D = c->a->r->head_dim, vw = attn__flash_v_width(c->a->r), np = (nkt + 1) / 2;
  const uint32_t *pp = (const uint32_t *)c->kb;
  for (int c0 = 0; c0 < c->nv; c0 += NR) {
    const int nr = c->nv - c0 < NR ? c->nv - c0 : NR;
    for (int64_t d0 = 0; d0 < vw; d0 += MR) { /* Oᵀ's rows past v's width stay 0 */
      const int mr = vw - d0 < MR ? (int)(vw - d0) : MR;
#define PV(M, N) dp_pv_micro(pp, vp, D, c->ot, np, d0, c0, M, N)
      MR_CASES(PV, mr)
#undef PV
    }
  }
}

/* ---- few query rows (decoding): vectors along head_dim ------------------
 *
 * With nrows <= RW_MAX the transposed layout would leave most of the 16
 * query lanes idle, so these rows run along head_dim instead (head_dim a
 * multiple of 32): a score is a VDPBF16PS dot product of a Q row and a K
 * row, both in place, summed across the vector; for P·V, two V rows are
 * interleaved into key pairs by vpunpck{l,h}wd, which orders the head_dim
 * elements within each 128-bit lane (d0+8L+{0..3} low, d0+8L+{4..7} high),
 * so the O rows are kept in that order (rw_o, in the V workspace) and put
 * back in Oᵀ once, at the end of the block. Scores and P still go through
 * the transposed score tile, so masks and the softmax are shared. The amx
 * instance runs these blocks on tiles instead (flash_amx_rows.h). */
enum { RW_MAX = 4 };

static inline bool rw_ok(const blk_ctx *c) {
  return c->bf16dp && c->nrows <= RW_MAX && c->a->r->head_dim % 32 == 0;
}

/* Scores of 4 keys (nk of them real) at kp × the block's nr rows: 16
 * VDPBF16PS dot products whose lanes one transposing reduction sums at
 * once (rf_reduce), instead of a horizontal sum per score. */
INLINE void rw_scores4(blk_ctx *c, const char *const q[RW_MAX], const char *kp, int64_t ldk,
                       int64_t j, int64_t nk, const int nr) {
  const int64_t D = c->a->r->head_dim;
  __m512 acc[RW_MAX * 4];
  UNROLL for (int n = 0; n < RW_MAX * 4; n++) acc[n] = _mm512_setzero_ps();
  for (int64_t d = 0; d < D; d += 32) {
    __m512i k[4];
    UNROLL for (int jj = 0; jj < 4; jj++) k[jj] =
        jj < nk ? _mm512_loadu_si512(kp + jj * ldk + 2 * d) : _mm512_setzero_si512();
    UNROLL for (int ii = 0; ii < nr; ii++) {
      const __m512i qv = _mm512_loadu_si512(q[ii] + 2 * d);
      UNROLL for (int jj = 0; jj < 4; jj++) acc[ii * 4 + jj] = dp(acc[ii * 4 + jj], qv, k[jj]);
    }
  }
  const __m512 s = vmul(rf_reduce(acc), vset1(c->a->scale2));
  UNROLL for (int jj = 0; jj < 4; jj++) if (jj < nk)
      _mm_storeu_ps(c->st + (j + jj) * BQ, _mm512_extractf32x4_ps(s, jj));
}

INLINE void rw_scores_n(blk_ctx *c, int64_t nkt, const int nr) {
  const int64_t ldk = c->kstep * 2;
  const char *q[RW_MAX];
  UNROLL for (int ii = 0; ii < nr; ii++) q[ii] =
      q_row(c, c->blk->h0 + ii / c->blk->nq, c->blk->i0 + ii % c->blk->nq);
  for (int64_t j = 0; j < nkt; j += 4) {
    prefetch_next(c, j / 4, (nkt + 3) / 4); /* a quarter of the next tile's rows per 4 keys */
    rw_scores4(c, q, c->kt + j * ldk, ldk, j, nkt - j < 4 ? nkt - j : 4, nr);
  }
}

INLINE void rw_values_n(blk_ctx *c, int64_t nkt, const int nr) {
  const int64_t D = c->a->r->head_dim, step = c->vstep * 2, np = (nkt + 1) / 2;
  const uint32_t *pp = (const uint32_t *)c->kb;
  for (int64_t d0 = 0; d0 < D; d0 += 32) {
    __m512 acc[RW_MAX][2];
    UNROLL for (int ii = 0; ii < nr; ii++) {
      const __m512 al = vset1(c->alpha[ii]);
      acc[ii][0] = vmul(vload(c->vb + ii * D + d0), al);
      acc[ii][1] = vmul(vload(c->vb + ii * D + d0 + 16), al);
    }
    const char *a = c->vt + 2 * d0;
    for (int64_t jp = 0; jp < np; jp++, a += 2 * step) {
      __m512i va = _mm512_loadu_si512(a);
      __m512i vb = 2 * jp + 1 < nkt ? _mm512_loadu_si512(a + step) : _mm512_setzero_si512();
      __m512i lo = _mm512_unpacklo_epi16(va, vb), hi = _mm512_unpackhi_epi16(va, vb);
      UNROLL for (int ii = 0; ii < nr; ii++) {
        __m512i p = _mm512_set1_epi32((int)pp[jp * BQ + ii]);
        acc[ii][0] = dp(acc[ii][0], lo, p);
        acc[ii][1] = dp(acc[ii][1], hi, p);
      }
    }
    UNROLL for (int ii = 0; ii < nr; ii++) {
      vstore(c->vb + ii * D + d0, acc[ii][0]);
      vstore(c->vb + ii * D + d0 + 16, acc[ii][1]);
    }
  }
}

#define RW_CASES(CALL)     \
  switch (c->nrows) {      \
  case 1: CALL(1); break;  \
  case 2: CALL(2); break;  \
  case 3: CALL(3); break;  \
  default: CALL(4); break; \
  }

static void rw_scores(blk_ctx *c, int64_t nkt) {
#define RWS(N) rw_scores_n(c, nkt, N)
  RW_CASES(RWS)
#undef RWS
}

/* O rows = alpha·O rows + P·V (O rows are rescaled here, not in Oᵀ). */
static void rw_values(blk_ctx *c, int64_t nkt) {
  dp_pack_p(c, nkt);
#define RWV(N) rw_values_n(c, nkt, N)
  RW_CASES(RWV)
#undef RWV
}

static void rw_begin(blk_ctx *c) {
  memset(c->vb, 0, (size_t)(c->nrows * c->a->r->head_dim) * sizeof *c->vb);
}

/* The O rows back into Oᵀ, undoing the unpack order. */
static void rw_end(blk_ctx *c) {
  const int64_t D = c->a->r->head_dim;
  for (int64_t ii = 0; ii < c->nrows; ii++)
    for (int64_t d0 = 0; d0 < D; d0 += 32)
      for (int n = 0; n < 16; n++) {
        const int64_t d = d0 + 8 * (n / 4) + n % 4;
        c->ot[d * BQ + ii] = c->vb[ii * D + d0 + n];
        c->ot[(d + 4) * BQ + ii] = c->vb[ii * D + d0 + 16 + n];
      }
}

/* Scores of the tile's nkt keys from K in place. */
static void dp_scores(blk_ctx *c, int64_t nkt) {
  const int64_t ldk = c->kstep * 2;
  dp_qk_tile(c, c->kt, ldk, nkt);
}

/* Oᵀ += Vᵀ·P for the tile's keys (Oᵀ already rescaled). */
static void dp_values(blk_ctx *c, int64_t nkt) {
  dp_pack_p(c, nkt);
  dp_pack_v(c, nkt, (uint32_t *)c->vb);
  dp_pv_tile(c, (const uint32_t *)c->vb, nkt);
}
#else
/* Without BF16 products bf16dp is always false: never called. */
static inline void dp_load_q(blk_ctx *c, const char *src, int64_t ii) {
  (void)c, (void)src, (void)ii;
}
static inline void dp_scores(blk_ctx *c, int64_t nkt) { (void)c, (void)nkt; }
static inline void dp_values(blk_ctx *c, int64_t nkt) { (void)c, (void)nkt; }
static inline bool rw_ok(const blk_ctx *c) {
  (void)c;
  return false;
}
static inline void rw_scores(blk_ctx *c, int64_t nkt) { (void)c, (void)nkt; }
static inline void rw_values(blk_ctx *c, int64_t nkt) { (void)c, (void)nkt; }
static inline void rw_begin(blk_ctx *c) { (void)c; }
static inline void rw_end(blk_ctx *c) { (void)c; }
#endif

#endif
