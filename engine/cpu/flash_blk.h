/*
 * flash_blk.h — one query block's context for flash.c's instances, and what
 * every path of a block reads through it.
 *
 * Included first by flash.c and by each path's header (flash_f32.h,
 * flash_rows.h, flash_bf16.h, flash_amx.h, flash_amx_rows.h), which build
 * on it and on nothing of flash.c: the tile constants' short names, blk_ctx
 * (the workspace's pieces and where the block's tensors start), where a
 * tile's K and V rows are (kv_head, row_ptrs, tile_len), and the passes
 * every path shares on the scores (mask_tile, variant_tile) and on Oᵀ
 * (scale_ot).
 *
 * Paged K and V (attn_request.k_pages). Each tile reads its K and V rows
 * from two row-0 pointers and row steps set once per tile (tile_rows): the
 * dense tensors' rows, or a run of rows inside one page, with no gather
 * copy and no per-element indirection. A page holds a multiple of BK keys,
 * so a tile that would cross a page's end (tiles start at jlo, unaligned
 * under a window) is cut there; the dense tiling is unchanged.
 */
#ifndef ATTN_CPU_FLASH_BLK_H
#define ATTN_CPU_FLASH_BLK_H

#include "flash.h"
#include "simd.h"

#include <float.h>
#include <math.h>

#define BQ ATTN_FLASH_BQ
#define BK ATTN_FLASH_BK

/* ---- one query block ---------------------------------------------------- */

/* The pieces of the workspace and where the block's tensors start. */
typedef struct blk_ctx {
  const attn__flash_args *a;
  const attn__flash_block *blk;
  float *qt, *ot, *st, *kb, *vb, *m, *l, *alpha;
  int64_t wd;                /* the head dim the workspace is laid out for (attn__cpu_ws_d) */
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
  const float *ofac;        /* a factor per row O still owes (amx_end), or NULL */
  bool keep_tiles;          /* amx_end leaves the tiles configured (rows_pair) */
  bool ot_zero;             /* Oᵀ not written yet: zero, though its memory is not */
  /* Quantized pages (attn_request.kv_quant): BK rows of head_dim elements
   * each for the tile's K and V dequantized (dq_tile), which kt and vt
   * then point at. */
  char *kq, *vq;
  /* A decode block over quantized pages reads the tiles' codes in place
   * instead (incodes, flash_rows.h: rf_quant): kt and vt at the codes,
   * ksc and vsc at their rows' scales. kves: the bytes of a K or V
   * element as kt and vt hold it (1 for codes, else the dtype's). */
  bool incodes;
  size_t kves;
  const float *ksc, *vsc;
  /* And I8 codes in BF16 and 16-bit integer products (flash_rows_i8.h). */
  bool rowi;
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
 * evict the tile being computed. Quantized codes in place (kves 1) are a
 * quarter of an F32 tile, and go into L1: measured on Zen 5, an I8 decode
 * step at 32K keys ran about 1.1x as fast as with them into L2. */
static inline void prefetch_next(const blk_ctx *c, int64_t part, int64_t parts) {
  const size_t es = c->kves, row = (size_t)c->a->r->head_dim * es;
  for (int64_t j = part * c->pn / parts; j < (part + 1) * c->pn / parts; j++)
    for (size_t b = 0; b < row; b += 64) {
      const char *k = c->pk + (size_t)(j * c->pks) * es + b,
                 *v = c->pv + (size_t)(j * c->pvs) * es + b;
      if (es == 1) {
        _mm_prefetch(k, _MM_HINT_T0);
        _mm_prefetch(v, _MM_HINT_T0);
      } else {
        _mm_prefetch(k, _MM_HINT_T1);
        _mm_prefetch(v, _MM_HINT_T1);
      }
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
  const size_t es = c->kves;
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

/* ---- quantized pages ----------------------------------------------------- */

/*
 * A quantized tile (attn_request.kv_quant) is read one of two ways. A
 * decode step's blocks on the AVX-512 kernels read its codes in place
 * (flash_rows.h, rf_quant): dq_code widens them to F32 unscaled, and the
 * row scales (times dq_unit) multiply the scores and P instead. Every
 * other block dequantizes the tile into its scratch rows in the request's
 * dtype (dq_tile), and its path then reads them as it reads a tile of
 * that dtype; a prefill reuses each converted tile across its rows. An
 * E4M3 code becomes an F16 of its value times 2^-8 by moving its 7
 * exponent and mantissa bits to bit 7 (attn_e4m3_to_f32), whose F32 times
 * scale·2^8 is the same product code·scale the scalar tail computes.
 */
#if ATTN_ISA == 512
/* VL codes at p as F32, unscaled: an I8 code's value, an E4M3 code's
 * value times 2^-8 (dq_unit). */
static inline vf dq_code(const uint8_t *p, attn_kv_quant q) {
  const __m128i b = _mm_loadu_si128((const __m128i *)p);
  if (q == ATTN_KVQ_I8)
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
  const __m256i w = _mm256_cvtepu8_epi16(b);
  const __m256i h =
      _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x7f)), 7),
                      _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x80)), 8));
  return _mm512_cvtph_ps(h);
}
/* 32 E4M3 codes at p as two vectors, unscaled (dq_code's): the bit moves
 * on 32 lanes at once (ternary logic 0xE4: the mask's bits from w << 8,
 * the sign, the others from w << 7; bit 14 then cleared). */
static inline void dq_e4m3_32(const uint8_t *p, vf *lo, vf *hi) {
  const __m512i w = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)p));
  const __m512i h = _mm512_ternarylogic_epi32(_mm512_slli_epi16(w, 8), _mm512_slli_epi16(w, 7),
                                              _mm512_set1_epi16((short)0x8000), 0xE4);
  const __m512i m = _mm512_and_si512(h, _mm512_set1_epi16((short)0xBF80));
  *lo = _mm512_cvtph_ps(_mm512_castsi512_si256(m));
  *hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(m, 1));
}
#elif ATTN_ISA == 256
static inline vf dq_code(const uint8_t *p, attn_kv_quant q) {
  const __m128i b = _mm_loadl_epi64((const __m128i *)p);
  if (q == ATTN_KVQ_I8)
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
  const __m128i w = _mm_cvtepu8_epi16(b);
  const __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x7f)), 7),
                                 _mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x80)), 8));
  return _mm256_cvtph_ps(h);
}
#endif
#if ATTN_ISA
static inline vf dq_vec(const uint8_t *p, attn_kv_quant q, vf s) { return vmul(dq_code(p, q), s); }
#endif

/* What dq_code's values are multiplied by besides the row's scale. */
static inline float dq_unit(attn_kv_quant q) { return q == ATTN_KVQ_I8 ? 1.0f : 256.0f; }

/* VL dequantized values stored in dtype dt: the BF16 instances round with
 * their own instruction (to nearest even, as vstore_cvt). */
static inline void dq_store(char *out, vf x, attn_dtype dt) {
#if ATTN_ISA == 512 && (ATTN_DPBF16 || ATTN_AMX)
  if (dt == ATTN_BF16) {
    _mm256_storeu_si256((__m256i *)out, (__m256i)_mm512_cvtneps_pbh(x));
    return;
  }
#endif
  vstore_cvt(out, x, dt);
}

/* n rows of W codes at src (W apart), row i's scale sc[i], into rows of W
 * elements of dtype dt at dst; inlined into dq_rows once per (q, dt), so
 * that neither is a branch in the loop (the generic loop ran at a quarter
 * of the speed). */
static inline __attribute__((always_inline)) void dq_rows_as(const uint8_t *src, const float *sc,
                                                             int64_t n, int64_t W, attn_kv_quant q,
                                                             attn_dtype dt, char *dst) {
  const size_t es = dt == ATTN_F32 ? 4 : 2;
  for (int64_t i = 0; i < n; i++) {
    const uint8_t *row = src + i * W;
    char *out = dst + (size_t)(i * W) * es;
    int64_t k = 0;
#if ATTN_ISA
    const vf s = vset1(sc[i] * dq_unit(q));
    /* the next tile's row, from memory while this one converts */
    for (int64_t b = 0; b < W; b += 64)
      _mm_prefetch((const char *)row + BK * W + b, _MM_HINT_T0);
#if ATTN_ISA == 512
    for (; q == ATTN_KVQ_F8_E4M3 && k + 2 * VL <= W; k += 2 * VL) {
      vf lo, hi;
      dq_e4m3_32(row + k, &lo, &hi);
      dq_store(out + (size_t)k * es, vmul(lo, s), dt);
      dq_store(out + (size_t)(k + VL) * es, vmul(hi, s), dt);
    }
#endif
    for (; k + VL <= W; k += VL)
      dq_store(out + (size_t)k * es, dq_vec(row + k, q, s), dt);
#endif
    for (; k < W; k++)
      attn_store_elem(out, dt, (size_t)k, attn_kv_code_value(q, row[k]) * sc[i]);
  }
}

static void dq_rows(const uint8_t *src, const float *sc, int64_t n, int64_t W, attn_kv_quant q,
                    attn_dtype dt, char *dst) {
  if (q == ATTN_KVQ_I8 && dt == ATTN_BF16)
    dq_rows_as(src, sc, n, W, ATTN_KVQ_I8, ATTN_BF16, dst);
  else if (q == ATTN_KVQ_I8 && dt == ATTN_F16)
    dq_rows_as(src, sc, n, W, ATTN_KVQ_I8, ATTN_F16, dst);
  else if (q == ATTN_KVQ_I8)
    dq_rows_as(src, sc, n, W, ATTN_KVQ_I8, ATTN_F32, dst);
  else if (dt == ATTN_BF16)
    dq_rows_as(src, sc, n, W, ATTN_KVQ_F8_E4M3, ATTN_BF16, dst);
  else if (dt == ATTN_F16)
    dq_rows_as(src, sc, n, W, ATTN_KVQ_F8_E4M3, ATTN_F16, dst);
  else
    dq_rows_as(src, sc, n, W, ATTN_KVQ_F8_E4M3, ATTN_F32, dst);
}

/* Key j0's row scale in its page of the table pg (c->kpg or c->vpg). */
static const float *dq_scales(const blk_ctx *c, const void *const *pg, int64_t j0) {
  const attn_request *r = c->a->r;
  const int64_t pt = r->page_tokens;
  const char *page = pg[j0 / pt];
  return (const float *)(page + attn_kv_quant_scales_at(pt, r->head_dim)) + j0 % pt;
}

/* The tile of nkt keys from j0 (within one page) dequantized: kt and vt
 * point at it, head_dim elements a row; no next tile to prefetch (dq_rows
 * does). A latent session's V pages are its K pages: converted once. */
static void dq_tile(blk_ctx *c, int64_t j0, int64_t nkt) {
  const attn_request *r = c->a->r;
  const int64_t pt = r->page_tokens, W = r->head_dim, i = j0 % pt;
  const uint8_t *kp = c->kpg[j0 / pt], *vp = c->vpg[j0 / pt];
  dq_rows(kp + i * W, dq_scales(c, c->kpg, j0), nkt, W, r->kv_quant, r->dtype, c->kq);
  if (vp != kp)
    dq_rows(vp + i * W, dq_scales(c, c->vpg, j0), nkt, W, r->kv_quant, r->dtype, c->vq);
  c->kt = c->kq;
  c->vt = vp != kp ? c->vq : c->kq;
  c->kstep = c->vstep = W;
  c->pn = 0;
}

/* Where K and V of the block's (batch, KV head) are: the dense tensors'
 * rows, or that head's page tables (no pointer into r->k when it is NULL);
 * and their element's bytes as kt and vt will hold it (after incodes is
 * known). */
static void kv_head(blk_ctx *c) {
  const attn_request *r = c->a->r;
  const int64_t b = c->blk->b, hk = c->hk;
  c->kves = c->incodes ? 1 : attn_dtype_size(r->dtype);
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

#endif
