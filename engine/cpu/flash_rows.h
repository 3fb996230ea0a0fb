/*
 * flash_rows.h — few query rows in F32 (decoding) for flash.c: vectors
 * along head_dim.
 *
 * Included by flash.c and by flash_bf16.h (which shares rf_reduce); built
 * on flash_blk.h (blk_ctx, prefetch_next).
 *
 * A decode block has few rows (a GQA group, one query each): in the
 * transposed layout most of the query lanes would be idle, and every K and
 * V element would be broadcast on its own. With nrows <= RF_MAX (and
 * head_dim a multiple of VL) the AVX-512 instances run such blocks along
 * head_dim instead, K and V rows widened in registers from where they lie:
 * scores for RF_KEYS keys x RF_MAX rows are RF_KEYS·RF_MAX vector dot
 * products whose lanes one transposing reduction sums at once (rf_reduce),
 * and O rows (in the V workspace, [nrows][D]) accumulate P·V row by row,
 * the next tile prefetched meanwhile (prefetch_next). Scores
 * and P still go through the transposed score tile, so masks, variants
 * and the softmax are shared. F32 FMAs for F32 and F16 inputs (widened
 * exactly), and for BF16 in the instance without BF16 products.
 *
 * Quantized pages. A decode step over them takes this path on every
 * AVX-512 instance, whatever the dtype (rf_quant): K and V codes are
 * widened to F32 where they lie (dq_code, E4M3 32 at a time), each key's
 * scale multiplies its 4 scores after the reduction and each value row's
 * scale its P (after the softmax, whose sums it must not change). So a
 * tile is read once, at a byte an element, with no scratch rows and no
 * rounding of code·scale to the dtype: the arithmetic is that of F32
 * inputs. Each widened K or V vector serves all the block's rows, a GQA
 * group's query heads. I8 pages under a BF16 request take BF16 and 16-bit
 * integer products instead (flash_rows_i8.h, on the instances with
 * AVX512-BF16): the same reads, less arithmetic per code. */
#ifndef ATTN_CPU_FLASH_ROWS_H
#define ATTN_CPU_FLASH_ROWS_H

#include "flash_blk.h"

#if ATTN_ISA == 512
enum { RF_MAX = 4, RF_KEYS = 4, RF_DCHUNK = 4 };

static inline bool rf_ok(const blk_ctx *c) {
  return !c->bf16dp && c->nrows <= RF_MAX && c->a->r->head_dim % VL == 0;
}

/* Whether a decode step's block (the request has one query position)
 * reads quantized pages' codes in place here, so that flash.c takes no
 * BF16 products for it. A prefill's blocks dequantize their tiles
 * (dq_tile), each reused across the block's rows: all of them, so that
 * its few-rows tail blocks round as the others do. */
static inline bool rf_quant(const blk_ctx *c) {
  return c->a->r->kv_quant && c->a->r->seq_q == 1 && c->nrows <= RF_MAX &&
         c->a->r->head_dim % VL == 0;
}

/* VL elements of a K or V row at p: of dtype dt, or q's codes (dq_code). */
INLINE vf rf_load(const char *p, attn_dtype dt, const attn_kv_quant q) {
  return q ? dq_code((const uint8_t *)p, q) : vload_cvt(p, dt);
}

/* n (1 or 2) vectors of a K or V row at p into x: E4M3 codes two at a
 * time (dq_e4m3_32), else one by one. */
INLINE void rf_load_n(const char *p, attn_dtype dt, const attn_kv_quant q, vf *x, const int n) {
  const size_t es = q ? 1 : attn_dtype_size(dt);
  if (q == ATTN_KVQ_F8_E4M3 && n == 2) {
    dq_e4m3_32((const uint8_t *)p, &x[0], &x[1]);
    return;
  }
  UNROLL for (int v = 0; v < n; v++) x[v] = rf_load(p + (size_t)(v * VL) * es, dt, q);
}

/* Key scales ks[0..nk) times dq_unit(q) in lanes 4·jj..4·jj+3, as rf_reduce
 * lays out the scores of key jj (a masked load: no scale past the tile's). */
INLINE __m512 rf_key_scales(const float *ks, int64_t nk, attn_kv_quant q) {
  const __m512 k = nk == RF_KEYS ? _mm512_castps128_ps512(_mm_loadu_ps(ks))
                                 : _mm512_maskz_loadu_ps((__mmask16)((1u << nk) - 1), ks);
  const __m512i idx = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
  return vmul(_mm512_permutexvar_ps(idx, k), vset1(dq_unit(q)));
}

/* 16 vectors a[4·ii + jj] to one: lane 4·jj + ii holds the sum of a[4·ii +
 * jj]'s lanes (two 256-bit, then 128-bit, then in-lane halvings). */
INLINE __m512 rf_reduce(__m512 a[16]) {
  __m512 b[8], d[4], e[2];
  UNROLL for (int m = 0; m < 8; m++) b[m] =
      _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * m], a[2 * m + 1], 0x44),
                    _mm512_shuffle_f32x4(a[2 * m], a[2 * m + 1], 0xee));
  UNROLL for (int m = 0; m < 4; m++) d[m] =
      _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * m], b[2 * m + 1], 0x88),
                    _mm512_shuffle_f32x4(b[2 * m], b[2 * m + 1], 0xdd));
  UNROLL for (int m = 0; m < 2; m++) e[m] =
      _mm512_add_ps(_mm512_shuffle_ps(d[2 * m], d[2 * m + 1], 0x44),
                    _mm512_shuffle_ps(d[2 * m], d[2 * m + 1], 0xee));
  return _mm512_add_ps(_mm512_shuffle_ps(e[0], e[1], 0x88), _mm512_shuffle_ps(e[0], e[1], 0xdd));
}

#include "flash_rows_i8.h"

/* acc += Q rows' n vectors from d times those of RF_KEYS keys (nk real). */
INLINE void rf_qk(const blk_ctx *c, const char *kp, int64_t ldk, int64_t nk, int64_t d,
                  const attn_kv_quant q, __m512 acc[RF_MAX * RF_KEYS], const int n) {
  const attn_dtype dt = c->a->r->dtype;
  const size_t es = q ? 1 : attn_dtype_size(dt);
  const int64_t D = c->a->r->head_dim;
  vf k[RF_KEYS][2];
  UNROLL for (int jj = 0; jj < RF_KEYS; jj++) {
    if (jj < nk)
      rf_load_n(kp + (size_t)(jj * ldk + d) * es, dt, q, k[jj], n);
    else
      UNROLL for (int v = 0; v < n; v++) k[jj][v] = vset1(0.0f);
  }
  UNROLL for (int ii = 0; ii < RF_MAX; ii++) UNROLL for (int v = 0; v < n; v++) {
    const vf qv = vload(c->qt + ii * D + d + v * VL);
    UNROLL for (int jj = 0; jj < RF_KEYS; jj++) acc[ii * RF_KEYS + jj] =
        vfma(k[jj][v], qv, acc[ii * RF_KEYS + jj]);
  }
}

/* Scores of RF_KEYS keys (nk of them real) at kp, rows ldk elements apart,
 * into st rows j..j+nk (lanes 0..RF_MAX-1). Q rows are pre-scaled (rf_begin);
 * codes read in place are scaled here, per key. */
INLINE void rf_scores4(const blk_ctx *c, const char *kp, int64_t ldk, int64_t j, int64_t nk,
                       const attn_kv_quant q) {
  const int64_t D = c->a->r->head_dim;
  __m512 acc[RF_MAX * RF_KEYS];
  UNROLL for (int n = 0; n < RF_MAX * RF_KEYS; n++) acc[n] = vset1(0.0f);
  int64_t d = 0;
  for (; d + 2 * VL <= D; d += 2 * VL)
    rf_qk(c, kp, ldk, nk, d, q, acc, 2);
  if (d < D)
    rf_qk(c, kp, ldk, nk, d, q, acc, 1);
  __m512 s = rf_reduce(acc);
  if (q)
    s = vmul(s, rf_key_scales(c->ksc + j, nk, q));
  UNROLL for (int jj = 0; jj < RF_KEYS; jj++) if (jj < nk)
      _mm_storeu_ps(c->st + (j + jj) * BQ, _mm512_extractf32x4_ps(s, jj));
}

INLINE void rf_scores_q(blk_ctx *c, int64_t nkt, const attn_kv_quant q) {
  const int64_t parts = (nkt + RF_KEYS - 1) / RF_KEYS;
  for (int64_t j = 0; j < nkt; j += RF_KEYS) {
    prefetch_next(c, j / RF_KEYS, parts);
    rf_scores4(c, c->kt + (size_t)(j * c->kstep) * c->kves, c->kstep, j,
               nkt - j < RF_KEYS ? nkt - j : RF_KEYS, q);
  }
}

static void rf_scores(blk_ctx *c, int64_t nkt) {
  if (c->rowi) {
    ri_scores(c, nkt);
    return;
  }
  switch (c->incodes ? c->a->r->kv_quant : ATTN_KVQ_NONE) {
  case ATTN_KVQ_I8: rf_scores_q(c, nkt, ATTN_KVQ_I8); break;
  case ATTN_KVQ_F8_E4M3: rf_scores_q(c, nkt, ATTN_KVQ_F8_E4M3); break;
  default: rf_scores_q(c, nkt, ATTN_KVQ_NONE); break;
  }
}

/* O rows d0 .. d0 + nc·VL (rf_o, [nr][D] in the V workspace) = alpha·O +
 * P·V: nr·nc accumulators in registers, V rows widened once per key. */
INLINE void rf_values_chunk(blk_ctx *c, int64_t nkt, int64_t d0, const int nr, const int nc,
                            const attn_kv_quant q) {
  const attn_dtype dt = c->a->r->dtype;
  const size_t es = q ? 1 : attn_dtype_size(dt);
  const int64_t D = c->a->r->head_dim;
  vf acc[RF_MAX][RF_DCHUNK];
  UNROLL for (int ii = 0; ii < nr; ii++) UNROLL for (int v = 0; v < nc; v++) acc[ii][v] =
      vmul(vload(c->vb + ii * D + d0 + v * VL), vset1(c->alpha[ii]));
  const char *vr = c->vt + (size_t)d0 * es;
  for (int64_t j = 0; j < nkt; j++, vr += (size_t)c->vstep * es) {
    vf x[RF_DCHUNK];
    UNROLL for (int v = 0; v < nc; v += 2)
        rf_load_n(vr + (size_t)(v * VL) * es, dt, q, x + v, nc - v < 2 ? 1 : 2);
    UNROLL for (int ii = 0; ii < nr; ii++) {
      const vf p = vset1(c->st[j * BQ + ii]);
      UNROLL for (int v = 0; v < nc; v++) acc[ii][v] = vfma(p, x[v], acc[ii][v]);
    }
  }
  UNROLL for (int ii = 0; ii < nr; ii++) UNROLL for (int v = 0; v < nc; v++)
      vstore(c->vb + ii * D + d0 + v * VL, acc[ii][v]);
}

#define RF_NC(NR, NC)                                            \
  switch (NC) {                                                  \
  case 1: rf_values_chunk(c, nkt, d0, NR, 1, q); break;          \
  case 2: rf_values_chunk(c, nkt, d0, NR, 2, q); break;          \
  case 3: rf_values_chunk(c, nkt, d0, NR, 3, q); break;          \
  default: rf_values_chunk(c, nkt, d0, NR, RF_DCHUNK, q); break; \
  }

/* O rows = alpha·O rows + P·V, RF_DCHUNK vectors of head_dim at a time. */
INLINE void rf_values_q(blk_ctx *c, int64_t nkt, const attn_kv_quant q) {
  const int64_t D = c->a->r->head_dim;
  for (int64_t d0 = 0; d0 < D; d0 += RF_DCHUNK * VL) {
    const int nc = (D - d0) / VL < RF_DCHUNK ? (int)((D - d0) / VL) : RF_DCHUNK;
    switch (c->nrows) {
    case 1: RF_NC(1, nc) break;
    case 2: RF_NC(2, nc) break;
    case 3: RF_NC(3, nc) break;
    default: RF_NC(4, nc) break;
    }
  }
}
#undef RF_NC

static void rf_values(blk_ctx *c, int64_t nkt) {
  const attn_kv_quant q = c->incodes ? c->a->r->kv_quant : ATTN_KVQ_NONE;
  if (q) /* each row's V scale into its P: the codes times P, then */
    for (int64_t j = 0; j < nkt; j++)
      _mm_storeu_ps(c->st + j * BQ,
                    _mm_mul_ps(_mm_loadu_ps(c->st + j * BQ), _mm_set1_ps(c->vsc[j] * dq_unit(q))));
  if (c->rowi) {
    ri_values(c, nkt);
    return;
  }
  switch (q) {
  case ATTN_KVQ_I8: rf_values_q(c, nkt, ATTN_KVQ_I8); break;
  case ATTN_KVQ_F8_E4M3: rf_values_q(c, nkt, ATTN_KVQ_F8_E4M3); break;
  default: rf_values_q(c, nkt, ATTN_KVQ_NONE); break;
  }
}

/* The score tile's lanes 0 (lanes past RF_MAX are never written, only
 * read), and the Q rows pre-scaled in qt ([RF_MAX][D], padding rows 0) and
 * O rows 0, or the integer path's (ri_begin). */
static void rf_begin(blk_ctx *c) {
  const attn__flash_block *blk = c->blk;
  const int64_t D = c->a->r->head_dim;
  for (int64_t j = 0; j < BK; j++)
    vstore(c->st + j * BQ, vset1(0.0f));
  if (c->rowi) { /* its own Q and O rows */
    ri_begin(c);
    return;
  }
  for (int64_t ii = 0; ii < RF_MAX; ii++) {
    float *q = c->qt + ii * D;
    if (ii < c->nrows)
      load_row(q, q_row(c, blk->h0 + ii / blk->nq, blk->i0 + ii % blk->nq), c->a->r->dtype, D);
    for (int64_t d = 0; d < D; d++)
      q[d] = ii < c->nrows ? q[d] * c->a->scale2 : 0.0f;
  }
  memset(c->vb, 0, (size_t)(c->nrows * D) * sizeof *c->vb);
}

/* O's rows for finish_block: vb as they are, or out of the integer
 * path's lane order. */
static void rf_end(blk_ctx *c) {
  if (c->rowi)
    ri_end(c);
  else
    c->orows = c->vb;
}
#else
/* Only the AVX-512 instances run few rows along head_dim in F32. */
static inline bool rf_ok(const blk_ctx *c) {
  (void)c;
  return false;
}
static inline bool rf_quant(const blk_ctx *c) {
  (void)c;
  return false;
}
static inline bool ri_ok(const blk_ctx *c) {
  (void)c;
  return false;
}
static inline void rf_scores(blk_ctx *c, int64_t nkt) { (void)c, (void)nkt; }
static inline void rf_values(blk_ctx *c, int64_t nkt) { (void)c, (void)nkt; }
static inline void rf_begin(blk_ctx *c) { (void)c; }
static inline void rf_end(blk_ctx *c) { (void)c; }
#endif

#endif
