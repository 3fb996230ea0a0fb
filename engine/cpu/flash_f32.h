/*
 * flash_f32.h — the F32 products of flash.c's instances in the transposed
 * layout, and the online softmax every path runs on its scores.
 *
 * Included by flash.c, after flash_blk.h.
 *
 * Layout choice. A query block of up to BQ rows is packed transposed and
 * pre-scaled, Qᵀ[d][i] = q[i][d]·scale·log2(e), once per block. For every
 * key tile of up to BK keys the kernel computes the scores transposed,
 * Sᵀ[j][i] = Σ_d K[j][d]·Qᵀ[d][i], by broadcasting K elements against Qᵀ
 * vectors, so K and V are read in place (F32) with no transposition, and a
 * column of Sᵀ is one query row: the online softmax (running max m, running
 * sum l, rescale factor alpha) is elementwise across query lanes, with no
 * horizontal reductions. The output is kept transposed and unnormalized,
 * Oᵀ[d][i] += Σ_j V[j][d]·Pᵀ[j][i], rescaled by alpha per tile and divided
 * by l once at the end (FlashAttention-2 §3.1).
 *
 * Register blocking. Both products run as MR×NR micro-kernels (MR keys or
 * head-dim elements broadcast, NR vectors of queries) whose accumulators
 * stay in registers; the row and vector counts are compile-time constants
 * in each specialization so the compiler keeps them there. The AVX-512
 * instances also have a wide form for cores with two 512-bit FMA pipes
 * (a->wide, cpu.c's intel tuning): MR_WIDE = 6 rows and V prefetched during
 * Q·Kᵀ; and rows() takes two blocks of a head over each K/V tile in turn
 * (rows_pair). Neither changes the order of any sum: the same bits.
 */
#ifndef ATTN_CPU_FLASH_F32_H
#define ATTN_CPU_FLASH_F32_H

#include "flash_blk.h"

/* ---- micro-kernels ------------------------------------------------------ */

/* Sᵀ rows j..j+mr, query vectors c0..c0+nr over head_dim d0..d1. */
INLINE void qk_run(vf acc[MR_WIDE][NR], const float *qp, const float *const *kr, int64_t d0,
                   int64_t d1, const int mr, const int nr) {
  for (int64_t d = d0; d < d1; d++, qp += BQ) {
    vf q[NR];
    UNROLL for (int c = 0; c < nr; c++) q[c] = vload(qp + c * VL);
    UNROLL for (int r = 0; r < mr; r++) {
      vf kv = vset1(kr[r][d]);
      UNROLL for (int c = 0; c < nr; c++) acc[r][c] = vfma(kv, q[c], acc[r][c]);
    }
  }
}

/*
 * Sᵀ rows j..j+mr, query vectors c0..c0+nr: Σ_d K[j][d]·Qᵀ[d][:]. With vp
 * (the wide tuning), the same keys' rows of V go into L2 meanwhile, one
 * line of each row per 16 elements of d: P·V reads V down its columns, a
 * new line every key, which the hardware prefetchers do not follow, and
 * stalled on V coming from L3 (measured on Sapphire Rapids, K and V of a
 * head past L2: P·V 20% faster, this product 8% slower).
 */
INLINE void qk_micro(const float *restrict qt, const float *restrict kp, int64_t ldk,
                     float *restrict st, int64_t D, int64_t j, int c0, const float *vp, int64_t ldv,
                     const int mr, const int nr) {
  vf acc[MR_WIDE][NR];
  const float *kr[MR_WIDE];
  UNROLL for (int r = 0; r < mr; r++) {
    kr[r] = kp + (j + r) * ldk;
    UNROLL for (int c = 0; c < nr; c++) acc[r][c] = vset1(0.0f);
  }
  const float *qp = qt + c0 * VL;
  if (!vp) {
    qk_run(acc, qp, kr, 0, D, mr, nr);
  } else {
    for (int64_t d0 = 0; d0 < D; d0 += 16) {
      UNROLL for (int r = 0; r < mr; r++) vprefetch_l2(vp + (j + r) * ldv + d0);
      qk_run(acc, qp + d0 * BQ, kr, d0, d0 + 16 < D ? d0 + 16 : D, mr, nr);
    }
  }
  UNROLL for (int r = 0; r < mr; r++) UNROLL for (int c = 0; c < nr; c++)
      vstore(st + (j + r) * BQ + (c0 + c) * VL, acc[r][c]);
}

/* Oᵀ rows d0..d0+mr, query vectors c0..c0+nr: = Oᵀ·alpha + Σ_j V[j][d]·Pᵀ[j][:]
 * (alpha NULL: all ones, Oᵀ as it is). */
INLINE void pv_micro(const float *restrict st, const float *restrict vp, int64_t ldv,
                     float *restrict ot, const float *alpha, int64_t nkt, int64_t d0, int c0,
                     const int mr, const int nr) {
  vf acc[MR_WIDE][NR];
  UNROLL for (int r = 0; r < mr; r++) UNROLL for (int c = 0; c < nr; c++) {
    acc[r][c] = vload(ot + (d0 + r) * BQ + (c0 + c) * VL);
    if (alpha)
      acc[r][c] = vmul(acc[r][c], vload(alpha + (c0 + c) * VL));
  }
  const float *pp = st + c0 * VL;
  const float *vr = vp + d0;
  for (int64_t j = 0; j < nkt; j++, pp += BQ, vr += ldv) {
    vf p[NR];
    UNROLL for (int c = 0; c < nr; c++) p[c] = vload(pp + c * VL);
    UNROLL for (int r = 0; r < mr; r++) {
      vf vv = vset1(vr[r]);
      UNROLL for (int c = 0; c < nr; c++) acc[r][c] = vfma(vv, p[c], acc[r][c]);
    }
  }
  UNROLL for (int r = 0; r < mr; r++) UNROLL for (int c = 0; c < nr; c++)
      vstore(ot + (d0 + r) * BQ + (c0 + c) * VL, acc[r][c]);
}

/* The tiles' loops, for MRX rows per micro-kernel: MR, or MR_WIDE with the
 * wide tuning (a->wide; simd.h). */
INLINE void qk_rows(const float *qt, const float *kp, int64_t ldk, float *st, int64_t D,
                    int64_t nkt, int nv, const float *vp, int64_t ldv, const int MRX) {
  for (int c0 = 0; c0 < nv; c0 += NR) {
    const int nr = nv - c0 < NR ? nv - c0 : NR;
    const float *pf = c0 == 0 ? vp : NULL; /* V once, with the first vectors */
    for (int64_t j = 0; j < nkt; j += MRX) {
      const int mr = nkt - j < MRX ? (int)(nkt - j) : MRX;
#define QK(M, N) qk_micro(qt, kp, ldk, st, D, j, c0, pf, ldv, M, N)
      if (MRX == MR)
        MR_CASES(QK, mr)
      else
        MR_WIDE_CASES(QK, mr)
#undef QK
    }
  }
}

INLINE void pv_rows(const float *st, const float *vp, int64_t ldv, float *ot, const float *alpha,
                    int64_t D, int64_t nkt, int nv, const int MRX) {
  for (int c0 = 0; c0 < nv; c0 += NR) {
    const int nr = nv - c0 < NR ? nv - c0 : NR;
    for (int64_t d0 = 0; d0 < D; d0 += MRX) {
      const int mr = D - d0 < MRX ? (int)(D - d0) : MRX;
#define PV(M, N) pv_micro(st, vp, ldv, ot, alpha, nkt, d0, c0, M, N)
      if (MRX == MR)
        MR_CASES(PV, mr)
      else
        MR_WIDE_CASES(PV, mr)
#undef PV
    }
  }
}

/* Sᵀ = K·Qᵀ for the tile; vp: V's rows to prefetch (wide only), or NULL. */
static void qk_tile(const float *qt, const float *kp, int64_t ldk, float *st, int64_t D,
                    int64_t nkt, int nv, const float *vp, int64_t ldv, bool wide) {
  if (wide)
    qk_rows(qt, kp, ldk, st, D, nkt, nv, vp, ldv, MR_WIDE);
  else
    qk_rows(qt, kp, ldk, st, D, nkt, nv, NULL, 0, MR);
}

static void pv_tile(const float *st, const float *vp, int64_t ldv, float *ot, const float *alpha,
                    int64_t D, int64_t nkt, int nv, bool wide) {
  if (wide)
    pv_rows(st, vp, ldv, ot, alpha, D, nkt, nv, MR_WIDE);
  else
    pv_rows(st, vp, ldv, ot, alpha, D, nkt, nv, MR);
}

/* ---- softmax and masks --------------------------------------------------- */

/*
 * The two passes of softmax_tile, across all nv query vectors at once: a
 * column's max (or sum) is a chain of dependent vmax (vadd) down the keys,
 * 4 cycles each, so one column at a time would wait on latency; interleaved,
 * the columns' chains overlap (and the max pass has two chains per column,
 * even and odd keys: max is exact, so the grouping cannot change it). The
 * sum of each column still adds its keys in order, one chain per column,
 * so P and l are the same bits as column by column. Called with nv a
 * constant for full blocks (always inlined), so the chains stay in registers.
 */
INLINE void tile_max(const float *st, int64_t nkt, const int nv, vf *mt) {
  vf a[BQ / VL], b[BQ / VL];
  for (int c = 0; c < nv; c++)
    a[c] = b[c] = vset1(-INFINITY);
  int64_t j = 0;
  for (; j + 2 <= nkt; j += 2)
    for (int c = 0; c < nv; c++) {
      a[c] = vmax(a[c], vload(st + j * BQ + c * VL));
      b[c] = vmax(b[c], vload(st + (j + 1) * BQ + c * VL));
    }
  for (int c = 0; c < nv; c++)
    mt[c] = j < nkt ? vmax(vmax(a[c], vload(st + j * BQ + c * VL)), b[c]) : vmax(a[c], b[c]);
}

/* P = 2^(s - mu) in place, l = l·alpha + the column sums. */
INLINE void tile_exp(float *st, int64_t nkt, const int nv, const vf *mu, float *l,
                     const float *alpha) {
  vf sum[BQ / VL];
  for (int c = 0; c < nv; c++)
    sum[c] = vset1(0.0f);
  for (int64_t j = 0; j < nkt; j++)
    for (int c = 0; c < nv; c++) {
      float *sp = st + j * BQ + c * VL;
      vf p = vexp2(vsub(vload(sp), mu[c]));
      vstore(sp, p);
      sum[c] = vadd(sum[c], p);
    }
  for (int c = 0; c < nv; c++)
    vstore(l + c * VL, vfma(vload(l + c * VL), vload(alpha + c * VL), sum[c]));
}

/*
 * Online softmax over one tile, down each query column: m grows to the
 * tile's max, alpha = 2^(m_old - m_new) rescales l (and Oᵀ, by the caller),
 * and the scores become P = 2^(s - m_new) in place. A column with no visible
 * key so far has m = -inf; using max(m, -FLT_MAX) as the subtrahend keeps
 * -inf - -inf (NaN) out, and gives P = 0 and alpha = 0 for it.
 */
static void softmax_tile(float *st, int64_t nkt, int nv, float *m, float *l, float *alpha) {
  vf mt[BQ / VL], mu[BQ / VL];
  if (nv == BQ / VL)
    tile_max(st, nkt, BQ / VL, mt);
  else
    tile_max(st, nkt, nv, mt);
  for (int c = 0; c < nv; c++) {
    vf mo = vload(m + c * VL);
    vf mn = vmax(mo, mt[c]);
    mu[c] = vmax(mn, vset1(-FLT_MAX));
    vf al = vexp2(vsub(mo, mu[c]));
    vstore(m + c * VL, mn);
    vstore(alpha + c * VL, al);
  }
  if (nv == BQ / VL)
    tile_exp(st, nkt, BQ / VL, mu, l, alpha);
  else
    tile_exp(st, nkt, nv, mu, l, alpha);
}

/*
 * dst[c·ldd + r] = src[r·lds + c] for rows r < nr and columns c < nc, 16
 * columns (16 rows of dst) at a time so that the rows being written stay
 * in L1, whole 16 × 16 blocks in registers (AVX-512). Element by element
 * down each column of Qᵀ and Oᵀ (32 KiB each at D=128, together more than
 * L1), nearly every store missed: loading Q and storing O cost 4% of a
 * block against N=4096 keys, 5% against N=1024 at D=64.
 */
static void transpose(float *restrict dst, int64_t ldd, const float *restrict src, int64_t lds,
                      int64_t nr, int64_t nc) {
  for (int64_t c0 = 0; c0 < nc; c0 += 16) {
    const int64_t c1 = c0 + 16 < nc ? c0 + 16 : nc;
    int64_t r = 0;
#if ATTN_ISA == 512
    for (; c1 - c0 == 16 && r + 16 <= nr; r += 16) {
      __m512i x[16];
      for (int k = 0; k < 16; k++)
        x[k] = _mm512_loadu_si512(src + (r + k) * lds + c0);
      vtranspose16(x);
      for (int k = 0; k < 16; k++)
        _mm512_storeu_si512(dst + (c0 + k) * ldd + r, x[k]);
    }
#endif
    for (; r < nr; r++)
      for (int64_t c = c0; c < c1; c++)
        dst[c * ldd + r] = src[r * lds + c];
  }
}

/* Qᵀ in F32, pre-scaled: the rows widened and scaled in the K workspace
 * (padding lanes 0: finite, unused), then transposed. */
static void load_q(blk_ctx *c) {
  const attn__flash_args *a = c->a;
  const int64_t D = a->r->head_dim, nq = c->blk->nq;
  for (int64_t ii = 0; ii < c->lanes; ii++) {
    float *row = c->kb + ii * D;
    if (ii < c->nrows)
      load_row(row, q_row(c, c->blk->h0 + ii / nq, c->blk->i0 + ii % nq), a->r->dtype, D);
    for (int64_t d = 0; d < D; d++)
      row[d] = ii < c->nrows ? row[d] * a->scale2 : 0.0f;
  }
  transpose(c->qt, BQ, c->kb, D, c->lanes, D);
}
/* S = Q·Kᵀ for the tile's nkt keys in F32, converting narrow tiles. */
static void f32_scores(blk_ctx *c, int64_t nkt, const float **vp, int64_t *ldv) {
  const attn_request *r = c->a->r;
  const attn_dtype dt = r->dtype;
  const size_t es = attn_dtype_size(dt);
  const int64_t D = r->head_dim;
  const float *kp = (const float *)c->kt;
  int64_t ldk = c->kstep;
  *vp = (const float *)c->vt;
  *ldv = c->vstep;
  if (dt != ATTN_F32) {
    for (int64_t jj = 0; jj < nkt; jj++) {
      load_row(c->kb + jj * D, c->kt + (size_t)(jj * c->kstep) * es, dt, D);
      load_row(c->vb + jj * D, c->vt + (size_t)(jj * c->vstep) * es, dt, D);
    }
    kp = c->kb;
    *vp = c->vb;
    ldk = *ldv = D;
  }
  /* V converted above is in cache already: nothing to prefetch */
  qk_tile(c->qt, kp, ldk, c->st, D, nkt, c->nv, dt == ATTN_F32 ? *vp : NULL, *ldv, c->a->wide);
}

#endif
