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
 * in each specialization so the compiler keeps them there. The AVX-512
 * instances also have a wide form for cores with two 512-bit FMA pipes
 * (a->wide, cpu.c's intel tuning): MR_WIDE = 6 rows and V prefetched during
 * Q·Kᵀ; and rows() takes two blocks of a head over each K/V tile in turn
 * (rows_pair). Neither changes the order of any sum: the same bits.
 *
 * BF16 products. The avx512bf16 and amx instances compute BF16 inputs with
 * BF16 dot products and F32 accumulation (flash_bf16.h): Q and K stay BF16
 * (exact), P is rounded to BF16 for P·V as FlashAttention does on GPUs.
 * F16 inputs take the F32 path (widened exactly) on every instance but amx:
 * BF16 would drop 3 bits of their significand, and an exact hi+lo split
 * costs 3 to 4 products per pair, no faster than F32 FMAs on VDPBF16PS
 * (tests/bench/peak.c measures both rates), far faster on tiles.
 *
 * AMX. The amx instance runs whole key tiles of wide enough blocks on the
 * tile unit (flash_amx.h: tile_step hands them to amx_step), BF16 and F16
 * split in two BF16 parts; cpu.c may first pack every key tile of a job
 * once (pack_keys, at the end of this file). Its other tiles take the
 * paths above, after the tile unit's waiting products are summed into Oᵀ.
 * Its few rows blocks (decoding) run every tile on the tile unit too, K
 * and V rows in place (flash_amx_rows.h), instead of flash_bf16.h's rw_*.
 *
 * Where things are: the micro-kernels and the softmax, then blk_ctx and the
 * few-rows paths (flash_rows.h, flash_bf16.h's rw_*, flash_amx_rows.h), the
 * BF16 and AMX products (flash_bf16.h, flash_amx.h), a block's start, tiles
 * and finish, rows() (one block), the packing, the input scan, and the
 * instance table.
 *
 * Input scan. Every tile of Q, K and V is scanned for non-finite values and
 * its largest magnitude as it is loaded for compute, into a->seen; the
 * caller judges the job from that once every block has run (and discards
 * the output of a refused job). Compute on such inputs makes garbage but
 * never traps or loops longer. Paged K and V were checked when stored and
 * are not scanned again.
 *
 * Paged K and V (attn_request.k_pages). Each tile reads its K and V rows
 * from two row-0 pointers and row steps set once per tile (tile_rows): the
 * dense tensors' rows, or a run of rows inside one page, with no gather
 * copy and no per-element indirection. A page holds a multiple of BK keys,
 * so a tile that would cross a page's end (tiles start at jlo, unaligned
 * under a window) is cut there; the dense tiling is unchanged.
 */
#include "flash.h"
#include "simd.h"

#ifndef ATTN_DPBF16
#define ATTN_DPBF16 0
#endif
#ifndef ATTN_AMX
#define ATTN_AMX 0
#endif

#include <float.h>
#include <math.h>

#define BQ ATTN_FLASH_BQ
#define BK ATTN_FLASH_BK
#define MAXD ATTN_MAX_HEAD_DIM

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

/* Sets the scores of invisible (query, key) pairs of a boundary tile to -inf;
 * lane ii holds query position i0 + ii % nq. */
static void mask_tile(float *st, const attn__flash_args *a, int64_t j0, int64_t nkt, int64_t i0,
                      int64_t nq, int64_t lanes) {
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

/* ---- the fused input scan ------------------------------------------------ */

/* The first non-finite element of n rows (row·d + col), all of which hold one. */
static int64_t first_bad(const void *p, attn_dtype dt, int64_t n, int64_t d, int64_t stride) {
  for (int64_t i = 0; i < n; i++)
    for (int64_t k = 0; k < d; k++)
      if (!isfinite(attn_load_elem(p, dt, (size_t)(i * stride + k))))
        return i * d + k;
  return -1; /* not reached */
}

#if ATTN_ISA == 512
/*
 * The scan runs on every tile the kernel loads, so it is kept to two
 * integer operations per vector: with the sign bit cleared, the bit
 * patterns of floats order like their magnitudes, and the non-finite ones
 * (exponent all ones) are the largest. So the largest masked pattern gives
 * both the largest |x| and whether any element is not finite. Row tails
 * are masked loads.
 */
static int64_t scan(const void *p, attn_dtype dt, int64_t n, int64_t d, int64_t stride,
                    float *pmax) {
  const size_t es = attn_dtype_size(dt);
  uint32_t top;
  if (dt == ATTN_F32) {
    __m512i mx = _mm512_setzero_si512(), abs = _mm512_set1_epi32(0x7fffffff);
    for (int64_t i = 0; i < n; i++) {
      const char *row = (const char *)p + (size_t)(i * stride) * es;
      for (int64_t k = 0; k < d; k += 16) {
        __mmask16 m = d - k >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (d - k)) - 1);
        __m512i x = _mm512_maskz_loadu_epi32(m, row + 4 * k);
        mx = _mm512_max_epu32(mx, _mm512_and_si512(x, abs));
      }
    }
    top = (uint32_t)_mm512_reduce_max_epu32(mx);
    if (top >= 0x7f800000u)
      return first_bad(p, dt, n, d, stride);
    memcpy(pmax, &top, sizeof top);
    return -1;
  }
  __m512i mx = _mm512_setzero_si512(), abs = _mm512_set1_epi16(0x7fff);
  for (int64_t i = 0; i < n; i++) {
    const char *row = (const char *)p + (size_t)(i * stride) * es;
    for (int64_t k = 0; k < d; k += 32) {
      __mmask32 m = d - k >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << (d - k)) - 1);
      __m512i x = _mm512_maskz_loadu_epi16(m, row + 2 * k);
      mx = _mm512_max_epu16(mx, _mm512_and_si512(x, abs));
    }
  }
  /* widen the 16-bit lanes to finish the reduction in 32 bits */
  __m512i lo = _mm512_and_si512(mx, _mm512_set1_epi32(0xffff)), hi = _mm512_srli_epi32(mx, 16);
  uint16_t t = (uint16_t)_mm512_reduce_max_epu32(_mm512_max_epu32(lo, hi));
  if (t >= (dt == ATTN_BF16 ? 0x7f80u : 0x7c00u))
    return first_bad(p, dt, n, d, stride);
  *pmax = (float)attn_load_elem(&t, dt, 0);
  return -1;
}
#else
static int64_t scan(const void *p, attn_dtype dt, int64_t n, int64_t d, int64_t stride,
                    float *pmax) {
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
  if (vany_nan(bad) || sbad != sbad)
    return first_bad(p, dt, n, d, stride);
  float vm = vhmax(mx);
  *pmax = vm > smx ? vm : smx;
  return -1;
}
#endif

/* Scans n rows at p (rows `stride` apart), the first of them row `row0` of
 * head `head` of tensor t, into a->seen. */
static void see(const attn__flash_args *a, int t, int64_t head, const void *p, int64_t row0,
                int64_t n, int64_t stride) {
  const int64_t D = a->r->head_dim;
  float mx = 0.0f;
  int64_t bad = scan(p, a->r->dtype, n, D, stride, &mx);
  attn__seen_record(&a->seen[t], head, bad < 0 ? -1 : row0 * D + bad, mx);
}

/* ---- one query block ---------------------------------------------------- */

/* The pieces of the workspace and where the block's tensors start. */
typedef struct blk_ctx {
  const attn__flash_args *a;
  const attn__flash_block *blk;
  float *qt, *ot, *st, *kb, *vb, *m, *l, *alpha;
  const char *kbase, *vbase; /* dense K and V of (b, hk); NULL when paged */
  /* Paged K and V: (b, hk)'s page tables; NULL when dense. */
  const void *const *kpg, *const *vpg;
  /* The current tile's first K and V rows and the elements between rows
   * (tile_rows): every product reads its keys from these, so one kernel
   * serves the dense layout and pages alike. */
  const char *kt, *vt;
  int64_t kstep, vstep;
  /* The next tile's rows, pn of them (0: none), for prefetch_next. */
  const char *pk, *pv;
  int64_t pks, pvs, pn;
  int64_t nrows, lanes, hk, jlo, jhi;
  int64_t scan_from; /* the keys this block scans: [scan_from, jhi] */
  int nv;
  bool bf16dp;              /* BF16 products (flash_bf16.h) instead of F32 */
  bool amx;                 /* and AMX tiles for whole tiles (flash_amx.h) */
  bool amx16;               /* F16 on AMX tiles, split in two BF16 parts (flash_amx.h) */
  bool rowwise;             /* and few rows, along head_dim (flash_bf16.h) */
  bool amxrows;             /* and those on AMX tiles (flash_amx_rows.h) */
  bool rowf;                /* few rows along head_dim in F32 (rf_*) */
  int pbase, npend;         /* AMX: the tiles whose P·V waits (flash_amx.h) */
  const uint16_t *vslot[4]; /* and where their Vᵀ is */
  const uint16_t *pvt;      /* the next tile's packed Vᵀ, or NULL */
  const float *orows;       /* O as rows ([nrows][D]), or NULL: read Oᵀ */
} blk_ctx;

static const char *q_row(const blk_ctx *c, int64_t h, int64_t i) {
  const attn_request *r = c->a->r;
  return (const char *)r->q +
         (size_t)(c->blk->b * r->q_stride[0] + h * r->q_stride[1] + i * r->q_stride[2]) *
             attn_dtype_size(r->dtype);
}

#if ATTN_ISA == 512
/* Part `part` of `parts` of the next tile's K and V rows into L2. A decode
 * step streams K and V from memory with little arithmetic per byte, and
 * stalled on its loads without this (measured on Zen 4: about 1.5x the
 * rate with it). Into L2, not L1: a tile ahead is as large as L1 and would
 * evict the tile being computed. */
static inline void prefetch_next(const blk_ctx *c, int64_t part, int64_t parts) {
  const size_t es = attn_dtype_size(c->a->r->dtype), row = (size_t)c->a->r->head_dim * es;
  for (int64_t j = part * c->pn / parts; j < (part + 1) * c->pn / parts; j++)
    for (size_t b = 0; b < row; b += 64) {
      _mm_prefetch(c->pk + (size_t)(j * c->pks) * es + b, _MM_HINT_T1);
      _mm_prefetch(c->pv + (size_t)(j * c->pvs) * es + b, _MM_HINT_T1);
    }
}

#endif

/* Whether the n factors at f are all 1: no lane's running max moved, as it
 * stays once the largest scores have been seen, and Oᵀ needs no pass. */
static bool ones(const float *f, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    if (f[i] != 1.0f)
      return false;
  return true;
}

/* Oᵀ's lanes times f (a factor per lane), a vector of lanes at a time,
 * skipping vectors whose factors are all 1. */
static void scale_ot(blk_ctx *c, const float *f) {
  const int64_t D = c->a->r->head_dim;
  for (int v = 0; v < c->nv; v++) {
    if (ones(f + v * VL, VL))
      continue;
    const vf fv = vload(f + v * VL);
    for (int64_t d = 0; d < D; d++)
      vstore(c->ot + d * BQ + v * VL, vmul(vload(c->ot + d * BQ + v * VL), fv));
  }
}

#include "flash_rows.h" /* before flash_bf16.h, which shares rf_reduce */

/* The variants, on scaled scores (below; flash_amx.h calls it too). */
static void variant_tile(blk_ctx *c, int64_t j0, int64_t nkt);

#if ATTN_DPBF16 || ATTN_AMX
#include "flash_bf16.h"
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
#if ATTN_AMX
#include "flash_amx.h"
#include "flash_amx_rows.h"
#else
/* Without the tile unit c->amx is always false: never called. */
static inline bool amx_tile(const blk_ctx *c, int64_t nkt) {
  (void)c, (void)nkt;
  return false;
}
static inline void amx_step(blk_ctx *c, int64_t j0, int64_t nkt, bool full) {
  (void)c, (void)j0, (void)nkt, (void)full;
}
static inline void amx_flush(blk_ctx *c) { (void)c; }
static inline void amx_begin(blk_ctx *c) { (void)c; }
static inline void amx_end(blk_ctx *c) { (void)c; }
static inline bool amx16_ok(const blk_ctx *c) {
  (void)c;
  return false;
}
static inline bool amx_ok(const blk_ctx *c) {
  (void)c;
  return false;
}
static inline void amx_load_q(blk_ctx *c) { (void)c; }
static inline bool ar_ok(const blk_ctx *c) {
  (void)c;
  return false;
}
static inline void ar_begin(blk_ctx *c) { (void)c; }
static inline void ar_scores(blk_ctx *c, int64_t nkt) { (void)c, (void)nkt; }
static inline void ar_values(blk_ctx *c, int64_t nkt) { (void)c, (void)nkt; }
static inline void ar_end(blk_ctx *c) { (void)c; }
#endif

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

/* Qᵀ pre-scaled in F32 (or as BF16 pairs), Oᵀ = 0, m = -inf, l = 0; scans Q.
 * The F32 rows path (rf_begin) needs only the scan, m and l. */
static void start_block(blk_ctx *c) {
  const attn__flash_args *a = c->a;
  const int64_t D = a->r->head_dim, nq = c->blk->nq;
  for (int64_t hh = 0; hh < c->blk->nh; hh++) {
    const int64_t h = c->blk->h0 + hh;
    see(a, 0, c->blk->b * a->r->heads_q + h, q_row(c, h, c->blk->i0), c->blk->i0, nq,
        a->r->q_stride[2]);
  }
  for (int64_t ii = 0; ii < c->lanes; ii++) {
    c->m[ii] = -INFINITY;
    c->l[ii] = 0.0f;
  }
  if (c->amx || c->amxrows) /* every lane's Q pairs at once */
    amx_load_q(c);
  if (c->amx) /* Oᵀ zeroed whole */
    memset(c->ot, 0, (size_t)(D * BQ) * sizeof *c->ot);
  /* rf_begin, amx_load_q lay out Q and O themselves; rw_* read Q in place
   * and keep O as rows, ar_* on tiles, until the block's end. */
  if (c->rowf || c->amx || c->rowwise)
    return;
  /* Lane ii is query position i0 + ii % nq of head h0 + ii / nq. */
  if (c->bf16dp)
    for (int64_t ii = 0; ii < c->lanes; ii++)
      dp_load_q(c, ii < c->nrows ? q_row(c, c->blk->h0 + ii / nq, c->blk->i0 + ii % nq) : NULL, ii);
  else
    load_q(c);
  for (int64_t d = 0; d < D; d++)
    memset(c->ot + d * BQ, 0, (size_t)c->lanes * sizeof *c->ot);
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

/*
 * The variants on a tile's scores (base 2): softcap, then the ALiBi bias.
 * Lane ii is query i0 + ii % nq of head h0 + ii / nq, so the bias is
 * -slope2[ii]·|pos[ii] + (i0 + off - j0) - jj|, exact in F32 while the
 * distances stay under 2^24. Only requests with a variant come here, so
 * a plain request pays one branch per tile.
 */
static void variant_tile(blk_ctx *c, int64_t j0, int64_t nkt) {
  const attn__variants *var = &c->a->var;
  const attn__flash_block *blk = c->blk;
  if (var->cap2 > 0) {
    const vf cap = vset1(var->cap2), inv = vset1(var->inv_cap2);
    for (int64_t jj = 0; jj < nkt; jj++)
      for (int v = 0; v < c->nv; v++) {
        float *p = c->st + jj * BQ + v * VL;
        vstore(p, vmul(cap, vtanh(vmul(vload(p), inv))));
      }
  }
  if (!var->alibi)
    return;
  float slope2[BQ], pos[BQ];
  for (int64_t ii = 0; ii < c->lanes; ii++) {
    const bool real = ii < c->nrows;
    const int64_t h = blk->h0 + ii / blk->nq;
    slope2[ii] = real ? (float)(-attn_request_alibi_slope(c->a->r, blk->b, h) * M_LOG2E) : 0.0f;
    pos[ii] = real ? (float)(ii % blk->nq) : 0.0f;
  }
  const int64_t base = blk->i0 + c->a->off - j0;
  for (int64_t jj = 0; jj < nkt; jj++) {
    const vf t = vset1((float)(base - jj));
    for (int v = 0; v < c->nv; v++) {
      float *p = c->st + jj * BQ + v * VL;
      vstore(p, vfma(vload(slope2 + v * VL), vabs(vadd(vload(pos + v * VL), t)), vload(p)));
    }
  }
}

/* Points kt, vt at key j0's rows. Dense: rows k_stride[2] apart. Paged:
 * row j0 % page_tokens of its page, rows head_dim apart; the caller ends
 * the tile at the page's end (tile_len), so the tile's rows are one run. */
static void row_ptrs(const blk_ctx *c, int64_t j0, const char **k, const char **v, int64_t *kstep,
                     int64_t *vstep) {
  const attn_request *r = c->a->r;
  const size_t es = attn_dtype_size(r->dtype);
  if (c->kpg) {
    const int64_t pt = r->page_tokens, row = (j0 % pt) * r->head_dim;
    *k = (const char *)c->kpg[j0 / pt] + (size_t)row * es;
    *v = (const char *)c->vpg[j0 / pt] + (size_t)row * es;
    *kstep = *vstep = r->head_dim;
    return;
  }
  *k = c->kbase + (size_t)(j0 * r->k_stride[2]) * es;
  *v = c->vbase + (size_t)(j0 * r->v_stride[2]) * es;
  *kstep = r->k_stride[2];
  *vstep = r->v_stride[2];
}

/* Keys of the tile starting at j0: up to BK, and in paged mode never past
 * the end of j0's page. Tiles follow jlo, which a window leaves unaligned,
 * so a page boundary can fall inside a BK-run; the dense tiling is kept. */
static int64_t tile_len(const blk_ctx *c, int64_t j0) {
  int64_t n = c->jhi - j0 + 1 < BK ? c->jhi - j0 + 1 : BK;
  if (c->kpg) {
    const int64_t left = c->a->r->page_tokens - j0 % c->a->r->page_tokens;
    n = n < left ? n : left;
  }
  return n;
}

/* The tile's K and V into a->seen, past the keys scanned already. Paged
 * K and V were checked when they were stored: never scanned here. */
static void see_tile(const blk_ctx *c, int64_t j0, int64_t nkt) {
  const attn_request *r = c->a->r;
  const int64_t s0 = j0 > c->scan_from ? j0 : c->scan_from, ns = j0 + nkt - s0;
  if (c->kpg || ns <= 0)
    return;
  const size_t es = attn_dtype_size(r->dtype);
  const int64_t kvh = c->blk->b * r->heads_kv + c->hk;
  see(c->a, 1, kvh, c->kbase + (size_t)(s0 * r->k_stride[2]) * es, s0, ns, r->k_stride[2]);
  see(c->a, 2, kvh, c->vbase + (size_t)(s0 * r->v_stride[2]) * es, s0, ns, r->v_stride[2]);
}

/* The tile's rows (kt, vt), and the next tile's (pk, pv, pn rows; pn 0 at
 * the last tile) for the decode path to prefetch. */
static void tile_rows(blk_ctx *c, int64_t j0, int64_t nkt) {
  row_ptrs(c, j0, &c->kt, &c->vt, &c->kstep, &c->vstep);
  c->pn = 0;
  if ((c->rowf || c->rowwise || c->amx) && j0 + nkt <= c->jhi) {
    row_ptrs(c, j0 + nkt, &c->pk, &c->pv, &c->pks, &c->pvs);
    c->pn = tile_len(c, j0 + nkt);
  }
}

/* Oᵀ = Oᵀ·alpha + P·V in the transposed layout; the F32 products rescale
 * Oᵀ as they load it, the BF16 ones after a pass of their own. */
static void tile_values(blk_ctx *c, const float *vp, int64_t ldv, int64_t nkt) {
  const int64_t D = c->a->r->head_dim;
  const float *alpha = ones(c->alpha, c->lanes) ? NULL : c->alpha;
  if (!c->bf16dp) {
    pv_tile(c->st, vp, ldv, c->ot, alpha, D, nkt, c->nv, c->a->wide);
    return;
  }
  scale_ot(c, c->alpha);
  dp_values(c, nkt);
}

/* One key tile: scan it, scores, mask, online softmax, O = O·alpha + P·V. */
static void tile_step(blk_ctx *c, int64_t j0, int64_t nkt) {
  const attn__flash_args *a = c->a;
  const int64_t i0 = c->blk->i0, ilast = i0 + c->blk->nq - 1;
  see_tile(c, j0, nkt);
  tile_rows(c, j0, nkt);
  const bool full = (a->wl < 0 || j0 >= ilast + a->off - a->wl) &&
                    (a->wr < 0 || j0 + nkt - 1 <= i0 + a->off + a->wr);
  if (amx_tile(c, nkt)) {
    amx_step(c, j0, nkt, full);
    return;
  }
  amx_flush(c); /* the AMX tiles' P·V before this one touches Oᵀ */
  const float *vp = NULL;
  int64_t ldv = 0;
  if (c->rowf)
    rf_scores(c, nkt);
  else if (c->amxrows)
    ar_scores(c, nkt);
  else if (c->rowwise)
    rw_scores(c, nkt);
  else if (c->bf16dp)
    dp_scores(c, nkt);
  else
    f32_scores(c, nkt, &vp, &ldv);
  if (a->var.on)
    variant_tile(c, j0, nkt);
  if (!full)
    mask_tile(c->st, a, j0, nkt, i0, c->blk->nq, c->nrows);
  softmax_tile(c->st, nkt, c->nv, c->m, c->l, c->alpha);
  if (c->rowf || c->rowwise) {
    (c->rowf ? rf_values : c->amxrows ? ar_values : rw_values)(c, nkt);
    return;
  }
  tile_values(c, vp, ldv, nkt);
}

/* A whole block: normalize once (a row with l = 0 saw no key and stays
 * O = 0) and write O and the statistics. A key-split block leaves its
 * unnormalized partial for the caller instead. */
static void finish_block(blk_ctx *c) {
  const attn_request *r = c->a->r;
  const attn__flash_block *blk = c->blk;
  const int64_t D = r->head_dim, nq = blk->nq;
  const size_t es = attn_dtype_size(r->dtype);
  const float *orows = c->orows; /* as amx_end laid them out, or from Oᵀ here */
  if (!orows) {
    transpose(c->vb, D, c->ot, BQ, D, c->lanes);
    orows = c->vb;
  }
  for (int64_t ii = 0; ii < c->nrows; ii++) {
    const float inv = blk->po ? 1.0f : c->l[ii] > 0 ? 1.0f / c->l[ii] : 0.0f;
    float *row = blk->po ? blk->po + ii * D : c->kb;
    for (int64_t d = 0; d < D; d++)
      row[d] = orows[ii * D + d] * inv;
    if (blk->po) {
      blk->pm[ii] = c->m[ii];
      blk->pl[ii] = c->l[ii];
      continue;
    }
    const int64_t h = blk->h0 + ii / nq, i = blk->i0 + ii % nq;
    if (r->o) /* NULL: only the statistics are wanted (the backward's lse) */
      store_row((char *)r->o +
                    (size_t)(blk->b * r->o_stride[0] + h * r->o_stride[1] + i * r->o_stride[2]) *
                        es,
                row, r->dtype, D);
    const size_t srow = (size_t)((blk->b * r->heads_q + h) * r->seq_q + i);
    float mm = c->m[ii] * (float)M_LN2; /* back from base 2; -inf stays -inf */
    if (r->m)
      r->m[srow] = mm;
    if (r->l)
      r->l[srow] = c->l[ii];
    if (r->lse)
      r->lse[srow] = c->l[ii] > 0 ? mm + logf(c->l[ii]) : -INFINITY;
  }
}

/* The keys any row of the block can see (every head's rows share the
 * positions i0 .. i0 + nq - 1), within the block's key range. */
static void key_range(blk_ctx *c) {
  const attn__flash_args *a = c->a;
  const int64_t i0 = c->blk->i0, ilast = i0 + c->blk->nq - 1;
  int64_t jlo = a->wl < 0 ? 0 : i0 + a->off - a->wl;
  int64_t jhi = a->wr < 0 ? a->r->seq_kv - 1 : ilast + a->off + a->wr;
  c->jlo = jlo < c->blk->j0 ? c->blk->j0 : jlo;
  c->jhi = jhi > c->blk->j1 - 1 ? c->blk->j1 - 1 : jhi;
  /* Each key of a KV head is scanned once: by the first chunk of heads
   * only, and past the keys the previous query block (whose range ends at
   * phi; ranges only move right) already saw. */
  int64_t phi = i0 == 0 ? c->blk->j0 - 1 : a->wr < 0 ? a->r->seq_kv - 1 : i0 - 1 + a->off + a->wr;
  if (c->blk->h0 % a->group != 0)
    phi = c->jhi;
  c->scan_from = phi + 1;
}

/* Where K and V of the block's (batch, KV head) are: the dense tensors'
 * rows, or that head's page tables (no pointer into r->k when it is NULL). */
static void kv_head(blk_ctx *c) {
  const attn_request *r = c->a->r;
  const int64_t b = c->blk->b, hk = c->hk;
  if (r->k_pages) {
    const int64_t t = (b * r->heads_kv + hk) * r->pages_per_head;
    c->kpg = r->k_pages + t;
    c->vpg = r->v_pages + t;
    return;
  }
  const size_t es = attn_dtype_size(r->dtype);
  c->kbase = (const char *)r->k + (size_t)(b * r->k_stride[0] + hk * r->k_stride[1]) * es;
  c->vbase = (const char *)r->v + (size_t)(b * r->v_stride[0] + hk * r->v_stride[1]) * es;
}

/*
 * Where the block's arrays are in the workspace: Qᵀ and Oᵀ (D ≤ MAXD rows
 * of BQ each), m, l and alpha, then the per-tile Sᵀ and converted K and V
 * tiles. The second block of a pair (rows_pair, D ≤ MAXD/2) takes the upper
 * halves of the Qᵀ and Oᵀ regions, and its m, l and alpha the end of the V
 * tile's, which then holds at most BK × MAXD/2; the per-tile arrays are
 * shared. So a pair needs no more workspace than one block.
 */
static void block_layout(blk_ctx *c, float *ws, bool second) {
  float *qt = ws, *ot = qt + MAXD * BQ, *stats = ot + MAXD * BQ;
  c->st = stats + 3 * BQ;
  c->kb = c->st + BK * BQ;
  c->vb = c->kb + BK * MAXD;
  if (second) {
    qt += MAXD / 2 * BQ;
    ot += MAXD / 2 * BQ;
    stats = c->vb + BK * MAXD - 3 * BQ;
  }
  c->qt = qt;
  c->ot = ot;
  c->m = stats;
  c->l = stats + BQ;
  c->alpha = stats + 2 * BQ;
}

/* Which products the block's rows take (BF16 ones, the few-rows paths,
 * AMX tiles): for block_begin, and for pair_ok before any block begins. */
static void block_kind(blk_ctx *c) {
  const attn_request *r = c->a->r;
  c->nrows = c->blk->nh * c->blk->nq;
  c->bf16dp = r->dtype == ATTN_BF16 && r->head_dim % 2 == 0 && (ATTN_DPBF16 || ATTN_AMX);
  c->rowwise = rw_ok(c);
  c->amxrows = ar_ok(c);
  c->rowf = rf_ok(c);
  c->amx16 = amx16_ok(c);
  c->amx = amx_ok(c);
}

/* Everything about the block known before its first tile; Qᵀ loaded. */
static void block_begin(blk_ctx *c) {
  block_kind(c);
  c->nv = (int)((c->nrows + VL - 1) / VL);
  c->lanes = (int64_t)c->nv * VL;
  c->hk = c->blk->h0 / c->a->group;
  kv_head(c);
  key_range(c);
  start_block(c);
  if (c->amxrows)
    ar_begin(c);
  else if (c->rowwise)
    rw_begin(c);
  if (c->rowf)
    rf_begin(c);
  amx_begin(c);
}

static void block_end(blk_ctx *c) {
  amx_end(c);
  if (c->amxrows)
    ar_end(c);
  else if (c->rowwise)
    rw_end(c);
  if (c->rowf)
    rf_end(c);
  finish_block(c);
}

static void rows_one(const attn__flash_args *a, const attn__flash_block *blk, float *ws) {
  blk_ctx c = {.a = a, .blk = blk};
  block_layout(&c, ws, false);
  block_begin(&c);
  for (int64_t j0 = c.jlo, nkt; j0 <= c.jhi; j0 += nkt) {
    nkt = tile_len(&c, j0);
    tile_step(&c, j0, nkt);
  }
  block_end(&c);
}

/*
 * Two blocks of one KV head in lockstep: each tile of K and V is used by
 * both blocks while it is in cache, so they come from memory (L3) once
 * per pair instead of once per block. Each block still takes its own
 * tiles in its own order (the one with the smaller next key goes first),
 * so its arithmetic, and its output, is that of rows_one. Only the F32
 * products in the transposed layout keep nothing of their own in the
 * per-tile arrays between tiles, which the two blocks share; other paths,
 * and head dims past MAXD/2, run the blocks one after the other.
 */
static void rows_pair(const attn__flash_args *a, const attn__flash_block *blk, float *ws) {
  blk_ctx c[2] = {{.a = a, .blk = &blk[0]}, {.a = a, .blk = &blk[1]}};
  block_layout(&c[0], ws, false);
  block_layout(&c[1], ws, true);
  block_begin(&c[0]);
  block_begin(&c[1]);
  int64_t j[2] = {c[0].jlo, c[1].jlo};
  for (;;) {
    const bool more0 = j[0] <= c[0].jhi, more1 = j[1] <= c[1].jhi;
    if (!more0 && !more1)
      break;
    const int x = !more0 || (more1 && j[1] < j[0]);
    const int64_t nkt = tile_len(&c[x], j[x]);
    tile_step(&c[x], j[x], nkt);
    j[x] += nkt;
  }
  block_end(&c[0]);
  block_end(&c[1]);
}

/* Whether the block takes the F32 products in the transposed layout (not
 * AMX's F16 split), and its half of the workspace is enough (block_layout). */
static bool pair_ok(const attn__flash_args *a, const attn__flash_block *blk) {
  blk_ctx c = {.a = a, .blk = blk};
  block_kind(&c);
  return !c.bf16dp && !c.rowf && !c.amx16 && a->r->head_dim <= MAXD / 2;
}

static void rows(const attn__flash_args *a, const attn__flash_block *blk, int nblk, void *ws) {
  if (nblk == 2 && pair_ok(a, &blk[0]) && pair_ok(a, &blk[1])) {
    rows_pair(a, blk, ws);
    return;
  }
  for (int i = 0; i < nblk; i++)
    rows_one(a, &blk[i], ws);
}

#if ATTN_AMX
/* nkt F16 rows at src (step elements apart) split into BK hi and lo rows
 * of D (zero past nkt). */
static void split_rows(const char *src, int64_t step, int64_t nkt, int64_t D, uint16_t *hi,
                       uint16_t *lo) {
  for (int64_t j = 0; j < BK; j++, hi += D, lo += D) {
    if (j < nkt)
      amx_split16(src + (size_t)(j * step) * 2, hi, lo, D);
    else
      for (int64_t d = 0; d < D; d++)
        hi[d] = lo[d] = 0;
  }
}

/* A tile's words (attn__flash_pack_words): Vᵀ; for F16 Vᵀ hi and lo (V's
 * parts split into the K rows' places first), then K's hi and lo rows. */
static void pack_tile(blk_ctx *c, int64_t j0, uint16_t *dst) {
  const int64_t D = c->a->r->head_dim, nkt = tile_len(c, j0), W = BK * D;
  row_ptrs(c, j0, &c->kt, &c->vt, &c->kstep, &c->vstep);
  if (c->a->r->dtype != ATTN_F16) {
    amx_transpose64(c->vt, (size_t)c->vstep * 2, D, dst, BK);
    return;
  }
  split_rows(c->vt, c->vstep, nkt, D, dst + 2 * W, dst + 3 * W);
  amx_transpose64((const char *)(dst + 2 * W), (size_t)D * 2, D, dst, BK);
  amx_transpose64((const char *)(dst + 3 * W), (size_t)D * 2, D, dst + W, BK);
  split_rows(c->kt, c->kstep, nkt, D, dst + 2 * W, dst + 3 * W);
}

static void pack_keys(const attn__flash_args *a, int64_t b, int64_t hk, int64_t t0, int64_t t1,
                      uint16_t *dst) {
  const attn__flash_block blk = {.b = b, .j1 = a->r->seq_kv};
  blk_ctx c = {.a = a, .blk = &blk, .hk = hk, .jhi = a->r->seq_kv - 1};
  kv_head(&c);
  for (int64_t t = t0; t < t1; t++)
    pack_tile(&c, t * BK, dst + (size_t)(t * attn__flash_pack_words(a->r)));
}
#define PACK_KEYS pack_keys
#else
#define PACK_KEYS NULL
#endif

static void scan_keys(const attn__flash_args *a, int64_t b, int64_t hk, int64_t j0, int64_t j1) {
  const attn_request *r = a->r;
  const size_t es = attn_dtype_size(r->dtype);
  if (j1 <= j0 || r->k_pages) /* pages were checked when stored */
    return;
  const char *k = (const char *)r->k +
                  (size_t)(b * r->k_stride[0] + hk * r->k_stride[1] + j0 * r->k_stride[2]) * es;
  const char *v = (const char *)r->v +
                  (size_t)(b * r->v_stride[0] + hk * r->v_stride[1] + j0 * r->v_stride[2]) * es;
  see(a, 1, b * r->heads_kv + hk, k, j0, j1 - j0, r->k_stride[2]);
  see(a, 2, b * r->heads_kv + hk, v, j0, j1 - j0, r->v_stride[2]);
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

static void tanh_array(const float *x, float *y, int64_t n) {
  int64_t i = 0;
  for (; i + VL <= n; i += VL)
    vstore(y + i, vtanh(vload(x + i)));
  for (; i < n; i++) {
    float t[VL] = {0};
    t[0] = x[i];
    vstore(t, vtanh(vload(t)));
    y[i] = t[0];
  }
}

#if ATTN_AMX
#define KERNEL_NAME "amx"
#elif ATTN_DPBF16
#define KERNEL_NAME "avx512bf16"
#else
#define KERNEL_NAME ISA_NAME
#endif

const attn__flash_isa CAT(attn__flash_, SUFFIX) = {
    /* .name      = */ KERNEL_NAME,
    /* .rows      = */ rows,
    /* .scan_keys = */ scan_keys,
    /* .scan      = */ scan,
    /* .exp2      = */ exp2_array,
    /* .tanh      = */ tanh_array,
    /* .bwd       = */ &CAT(attn__bwd_, SUFFIX),
    /* .pack_keys    = */ PACK_KEYS,
    /* .wide      = */ MR_WIDE != MR,
};
