/*
 * flash.c — FlashAttention-2 forward on the CPU, one query block at a time.
 *
 * Compiled once per instruction set (see simd.h); cpu.c picks the instance.
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
 * Masks. The key range a block needs is the union of its rows' windows;
 * tiles outside it are never visited. A tile wholly inside every row's
 * window runs unmasked; only boundary tiles are masked element by element.
 *
 * Register blocking. Both products run as MR×NR micro-kernels (MR keys or
 * head-dim elements broadcast, NR vectors of queries) whose accumulators
 * stay in registers; the row and vector counts are compile-time constants
 * in each specialization so the compiler keeps them there.
 *
 * Overflow. The caller has checked that |scale·q·k| summed over D and
 * seq_kv·|v| fit in F32, so no score, sum or accumulator can become
 * infinite or NaN here.
 */
#include "flash.h"
#include "simd.h"

#include <float.h>
#include <math.h>

#define BQ ATTN_FLASH_BQ
#define BK ATTN_FLASH_BK
#define MAXD ATTN_MAX_HEAD_DIM

#if ATTN_ISA == 512
#define MR 4
#define NR 4
#define SUFFIX avx512
#elif ATTN_ISA == 256
#define MR 4
#define NR 2
#define SUFFIX avx2
#else
#define MR 4
#define NR 4
#define SUFFIX generic
#endif

#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)
#define INLINE static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 16")

/* ---- micro-kernels ------------------------------------------------------ */

/* Sᵀ rows j..j+mr, query vectors c0..c0+nr: Σ_d K[j][d]·Qᵀ[d][:]. */
INLINE void qk_micro(const float *restrict qt, const float *restrict kp,
                     int64_t ldk, float *restrict st, int64_t D, int64_t j,
                     int c0, const int mr, const int nr) {
  vf acc[MR][NR];
  const float *kr[MR];
  UNROLL for (int r = 0; r < mr; r++) {
    kr[r] = kp + (j + r) * ldk;
    UNROLL for (int c = 0; c < nr; c++) acc[r][c] = vset1(0.0f);
  }
  const float *qp = qt + c0 * VL;
  for (int64_t d = 0; d < D; d++, qp += BQ) {
    vf q[NR];
    UNROLL for (int c = 0; c < nr; c++) q[c] = vload(qp + c * VL);
    UNROLL for (int r = 0; r < mr; r++) {
      vf kv = vset1(kr[r][d]);
      UNROLL for (int c = 0; c < nr; c++) acc[r][c] = vfma(kv, q[c], acc[r][c]);
    }
  }
  UNROLL for (int r = 0; r < mr; r++)
    UNROLL for (int c = 0; c < nr; c++)
      vstore(st + (j + r) * BQ + (c0 + c) * VL, acc[r][c]);
}

/* Oᵀ rows d0..d0+mr, query vectors c0..c0+nr: += Σ_j V[j][d]·Pᵀ[j][:]. */
INLINE void pv_micro(const float *restrict st, const float *restrict vp,
                     int64_t ldv, float *restrict ot, int64_t nkt, int64_t d0,
                     int c0, const int mr, const int nr) {
  vf acc[MR][NR];
  UNROLL for (int r = 0; r < mr; r++)
    UNROLL for (int c = 0; c < nr; c++)
      acc[r][c] = vload(ot + (d0 + r) * BQ + (c0 + c) * VL);
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
  UNROLL for (int r = 0; r < mr; r++)
    UNROLL for (int c = 0; c < nr; c++)
      vstore(ot + (d0 + r) * BQ + (c0 + c) * VL, acc[r][c]);
}

/* Each switch turns a run-time (mr, nr) into a specialization. */
#define NR_CASES(CALL, MRV)                                                    \
  switch (nr) {                                                                \
  case 1: CALL(MRV, 1); break;                                                 \
  case 2: CALL(MRV, 2 <= NR ? 2 : 1); break;                                   \
  case 3: CALL(MRV, 3 <= NR ? 3 : 1); break;                                   \
  default: CALL(MRV, 4 <= NR ? 4 : 1); break;                                  \
  }
#define MR_CASES(CALL, mr)                                                     \
  switch (mr) {                                                                \
  case 1: NR_CASES(CALL, 1) break;                                             \
  case 2: NR_CASES(CALL, 2 <= MR ? 2 : 1) break;                               \
  case 3: NR_CASES(CALL, 3 <= MR ? 3 : 1) break;                               \
  default: NR_CASES(CALL, 4 <= MR ? 4 : 1) break;                              \
  }

static void qk_tile(const float *qt, const float *kp, int64_t ldk, float *st,
                    int64_t D, int64_t nkt, int nv) {
  for (int c0 = 0; c0 < nv; c0 += NR) {
    const int nr = nv - c0 < NR ? nv - c0 : NR;
    for (int64_t j = 0; j < nkt; j += MR) {
      const int mr = nkt - j < MR ? (int)(nkt - j) : MR;
#define QK(M, N) qk_micro(qt, kp, ldk, st, D, j, c0, M, N)
      MR_CASES(QK, mr)
#undef QK
    }
  }
}

static void pv_tile(const float *st, const float *vp, int64_t ldv, float *ot,
                    int64_t D, int64_t nkt, int nv) {
  for (int c0 = 0; c0 < nv; c0 += NR) {
    const int nr = nv - c0 < NR ? nv - c0 : NR;
    for (int64_t d0 = 0; d0 < D; d0 += MR) {
      const int mr = D - d0 < MR ? (int)(D - d0) : MR;
#define PV(M, N) pv_micro(st, vp, ldv, ot, nkt, d0, c0, M, N)
      MR_CASES(PV, mr)
#undef PV
    }
  }
}

/* ---- softmax and masks --------------------------------------------------- */

/*
 * Online softmax over one tile, down each query column: m grows to the
 * tile's max, alpha = 2^(m_old - m_new) rescales l (and Oᵀ, by the caller),
 * and the scores become P = 2^(s - m_new) in place. A column with no visible
 * key so far has m = -inf; using max(m, -FLT_MAX) as the subtrahend keeps
 * -inf - -inf (NaN) out, and gives P = 0 and alpha = 0 for it.
 */
static void softmax_tile(float *st, int64_t nkt, int nv, float *m, float *l,
                         float *alpha) {
  for (int c = 0; c < nv; c++) {
    vf mt = vset1(-INFINITY);
    for (int64_t j = 0; j < nkt; j++)
      mt = vmax(mt, vload(st + j * BQ + c * VL));
    vf mo = vload(m + c * VL);
    vf mn = vmax(mo, mt);
    vf mu = vmax(mn, vset1(-FLT_MAX));
    vf al = vexp2(vsub(mo, mu));
    vf sum = vset1(0.0f);
    for (int64_t j = 0; j < nkt; j++) {
      float *sp = st + j * BQ + c * VL;
      vf p = vexp2(vsub(vload(sp), mu));
      vstore(sp, p);
      sum = vadd(sum, p);
    }
    vstore(l + c * VL, vfma(vload(l + c * VL), al, sum));
    vstore(m + c * VL, mn);
    vstore(alpha + c * VL, al);
  }
}

/* Sets the scores of invisible (query, key) pairs of a boundary tile to -inf;
 * lane ii holds query position i0 + ii % nq. */
static void mask_tile(float *st, const attn__flash_args *a, int64_t j0,
                      int64_t nkt, int64_t i0, int64_t nq, int64_t lanes) {
  for (int64_t jj = 0; jj < nkt; jj++) {
    const int64_t j = j0 + jj;
    /* Query i sees key j iff j - off - wr <= i <= j - off + wl. */
    int64_t lo = a->wr < 0 ? i0 : j - a->off - a->wr;
    int64_t hi = a->wl < 0 ? i0 + nq - 1 : j - a->off + a->wl;
    float *row = st + jj * BQ;
    for (int64_t ii = 0; ii < lanes; ii++) {
      int64_t i = i0 + ii % nq;
      if (i < lo || i > hi)
        row[ii] = -INFINITY;
    }
  }
}

/* ---- conversions -------------------------------------------------------- */

static void load_row(float *dst, const void *src, attn_dtype dt, int64_t n) {
  const size_t es = attn_dtype_size(dt);
  int64_t k = 0;
  for (; k + VL <= n; k += VL)
    vstore(dst + k, vload_cvt((const char *)src + k * es, dt));
  for (; k < n; k++)
    dst[k] = (float)attn_load_elem(src, dt, (size_t)k);
}

static void store_row(void *dst, const float *src, attn_dtype dt, int64_t n) {
  const size_t es = attn_dtype_size(dt);
  int64_t k = 0;
  for (; k + VL <= n; k += VL)
    vstore_cvt((char *)dst + k * es, vload(src + k), dt);
  for (; k < n; k++)
    attn_store_elem(dst, dt, (size_t)k, src[k]);
}

/* ---- one query block ---------------------------------------------------- */

static void rows(const attn__flash_args *a, const attn__flash_block *blk, void *ws) {
  const attn_request *r = a->r;
  const attn_dtype dt = r->dtype;
  const size_t es = attn_dtype_size(dt);
  const int64_t b = blk->b, i0 = blk->i0, nq = blk->nq, nrows = blk->nh * nq;
  const int64_t D = r->head_dim, nk = r->seq_kv, hk = blk->h0 / a->group;
  float *qt = ws, *ot = qt + MAXD * BQ, *st = ot + MAXD * BQ;
  float *kb = st + BK * BQ, *vb = kb + BK * MAXD;
  float *m = vb + BK * MAXD, *l = m + BQ, *alpha = l + BQ;
  const int nv = (int)((nrows + VL - 1) / VL);
  const int64_t lanes = (int64_t)nv * VL;

  /* Lane ii is query position i0 + ii % nq of head h0 + ii / nq. */
  for (int64_t ii = 0; ii < nrows; ii++) {
    const int64_t h = blk->h0 + ii / nq, i = i0 + ii % nq;
    load_row(kb, (const char *)r->q + (size_t)(b * r->q_stride[0] + h * r->q_stride[1] +
                                                 i * r->q_stride[2]) * es,
             dt, D);
    for (int64_t d = 0; d < D; d++)
      qt[d * BQ + ii] = kb[d] * a->scale2;
  }
  for (int64_t d = 0; d < D; d++) {
    for (int64_t ii = nrows; ii < lanes; ii++) /* padding lanes: finite, unused */
      qt[d * BQ + ii] = 0.0f;
    for (int64_t ii = 0; ii < lanes; ii++)
      ot[d * BQ + ii] = 0.0f;
  }
  for (int64_t ii = 0; ii < lanes; ii++) {
    m[ii] = -INFINITY;
    l[ii] = 0.0f;
  }

  /* The keys any row of the block can see (every head's rows share the
   * positions i0 .. i0 + nq - 1). */
  const int64_t ilast = i0 + nq - 1;
  int64_t jlo = a->wl < 0 ? 0 : i0 + a->off - a->wl;
  int64_t jhi = a->wr < 0 ? nk - 1 : ilast + a->off + a->wr;
  if (jlo < 0)
    jlo = 0;
  if (jhi > nk - 1)
    jhi = nk - 1;

  const int64_t kstep = r->k_stride[2], vstep = r->v_stride[2];
  const char *kbase = (const char *)r->k +
                      (size_t)(b * r->k_stride[0] + hk * r->k_stride[1]) * es;
  const char *vbase = (const char *)r->v +
                      (size_t)(b * r->v_stride[0] + hk * r->v_stride[1]) * es;
  for (int64_t j0 = jlo; j0 <= jhi; j0 += BK) {
    const int64_t nkt = jhi - j0 + 1 < BK ? jhi - j0 + 1 : BK;
    const float *kp, *vp;
    int64_t ldk, ldv;
    if (dt == ATTN_F32) {
      kp = (const float *)(kbase + (size_t)(j0 * kstep) * es);
      vp = (const float *)(vbase + (size_t)(j0 * vstep) * es);
      ldk = kstep;
      ldv = vstep;
    } else {
      for (int64_t jj = 0; jj < nkt; jj++) {
        load_row(kb + jj * D, kbase + (size_t)((j0 + jj) * kstep) * es, dt, D);
        load_row(vb + jj * D, vbase + (size_t)((j0 + jj) * vstep) * es, dt, D);
      }
      kp = kb;
      vp = vb;
      ldk = ldv = D;
    }
    qk_tile(qt, kp, ldk, st, D, nkt, nv);
    bool full = (a->wl < 0 || j0 >= ilast + a->off - a->wl) &&
                (a->wr < 0 || j0 + nkt - 1 <= i0 + a->off + a->wr);
    if (!full)
      mask_tile(st, a, j0, nkt, i0, nq, nrows);
    softmax_tile(st, nkt, nv, m, l, alpha);
    for (int64_t d = 0; d < D; d++)
      for (int c = 0; c < nv; c++) {
        float *op = ot + d * BQ + c * VL;
        vstore(op, vmul(vload(op), vload(alpha + c * VL)));
      }
    pv_tile(st, vp, ldv, ot, D, nkt, nv);
  }

  /* Normalize once; a row with l = 0 saw no key and stays O = 0. */
  for (int64_t ii = 0; ii < lanes; ii++)
    alpha[ii] = l[ii] > 0 ? 1.0f / l[ii] : 0.0f;
  for (int64_t ii = 0; ii < nrows; ii++) {
    const int64_t h = blk->h0 + ii / nq, i = i0 + ii % nq;
    for (int64_t d = 0; d < D; d++)
      kb[d] = ot[d * BQ + ii] * alpha[ii];
    store_row((char *)r->o + (size_t)(b * r->o_stride[0] + h * r->o_stride[1] +
                                      i * r->o_stride[2]) * es,
              kb, dt, D);
    const size_t srow = (size_t)((b * r->heads_q + h) * r->seq_q + i);
    float mm = m[ii] * (float)M_LN2; /* back from base 2; -inf stays -inf */
    if (r->m)
      r->m[srow] = mm;
    if (r->l)
      r->l[srow] = l[ii];
    if (r->lse)
      r->lse[srow] = l[ii] > 0 ? mm + logf(l[ii]) : -INFINITY;
  }
}

/* ---- input scan ---------------------------------------------------------- */

static int64_t scan(const void *p, attn_dtype dt, int64_t n, int64_t d,
                    int64_t stride, float *pmax) {
  const size_t es = attn_dtype_size(dt);
  vf mx = vset1(0.0f), bad = vset1(0.0f);
  float smx = 0.0f, sbad = 0.0f;
  for (int64_t i = 0; i < n; i++) {
    const char *row = (const char *)p + (size_t)(i * stride) * es;
    int64_t k = 0;
    for (; k + VL <= d; k += VL) {
      vf x = vload_cvt(row + k * es, dt);
      mx = vmax(mx, vabs(x));
      bad = vadd(bad, vmul(x, vset1(0.0f)));
    }
    for (; k < d; k++) {
      float x = (float)attn_load_elem(row, dt, (size_t)k);
      smx = fabsf(x) > smx ? fabsf(x) : smx;
      sbad += x * 0.0f;
    }
  }
  if (vany_nan(bad) || sbad != sbad) {
    for (int64_t i = 0; i < n; i++)
      for (int64_t k = 0; k < d; k++)
        if (!isfinite(attn_load_elem(p, dt, (size_t)(i * stride + k))))
          return i * d + k;
  }
  float vm = vhmax(mx);
  *pmax = vm > smx ? vm : smx;
  return -1;
}

static void exp2_array(const float *x, float *y, int64_t n) {
  int64_t i = 0;
  for (; i + VL <= n; i += VL)
    vstore(y + i, vexp2(vload(x + i)));
  for (; i < n; i++) { /* through a padded vector, so the tail is the same code */
    float t[VL] = {0};
    t[0] = x[i];
    vstore(t, vexp2(vload(t)));
    y[i] = t[0];
  }
}

const attn__flash_isa CAT(attn__flash_, SUFFIX) = {
    /* .name = */ ISA_NAME,
    /* .rows = */ rows,
    /* .scan = */ scan,
    /* .exp2 = */ exp2_array,
};
