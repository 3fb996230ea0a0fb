/*
 * flash.c — FlashAttention-2 forward on the CPU, one query block at a time.
 *
 * Compiled once per instruction set (see simd.h); cpu.c picks the instance.
 * The layout every path keeps (Qᵀ, Sᵀ and Oᵀ transposed, the online softmax
 * down their columns) and the F32 register blocking are set out in
 * flash_f32.h.
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
 * once (pack_keys, at the end of flash_amx.h). Its other tiles take the
 * F32 or BF16 products, after the tile unit's waiting products are summed
 * into Oᵀ. Its few rows blocks (decoding) run every tile on the tile unit
 * too, K and V rows in place (flash_amx_rows.h), instead of flash_bf16.h's
 * rw_*.
 *
 * Masks. The key range a block needs is the union of its rows' windows;
 * tiles outside it are never visited. A tile wholly inside every row's
 * window runs unmasked; only boundary tiles are masked element by element.
 *
 * Where things are: flash_blk.h the block's context and what every path
 * shares (masks, variants, where a tile's rows are); flash_f32.h the F32
 * micro-kernels and the softmax; flash_rows.h, flash_bf16.h's rw_* and
 * flash_amx_rows.h the few-rows paths; flash_bf16.h and flash_amx.h the
 * BF16 and AMX products (flash_amx.h also the key packing). Here: the input
 * scan, a block's start, tiles and finish, rows() (one block or a pair),
 * and the instance table.
 *
 * Input scan. Every tile of Q, K and V is scanned for non-finite values and
 * its largest magnitude as it is loaded for compute (V, and F16's K, of a
 * packed tile as the job's packing reads it), into a->seen; the
 * caller judges the job from that once every block has run (and discards
 * the output of a refused job). Compute on such inputs makes garbage but
 * never traps or loops longer. Paged K and V were checked when stored and
 * are not scanned again.
 */
#include "flash_f32.h"
#include "flash_rows.h"
#include "flash_bf16.h"
#include "flash_amx.h"
#include "flash_amx_rows.h"

#include <float.h>
#include <math.h>

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
  c->ot_zero = c->amx; /* zeroed on first use (amx_ot_touch, amx_values22) */
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

/* Keys [s0, j1) of tensor t (1 K, 2 V) of the block's KV head into
 * a->seen. Paged K and V were checked when they were stored: never. */
static void see_keys(const blk_ctx *c, int t, int64_t s0, int64_t j1) {
  const attn_request *r = c->a->r;
  if (c->kpg || j1 <= s0)
    return;
  const size_t es = attn_dtype_size(r->dtype);
  const int64_t stride = t == 1 ? r->k_stride[2] : r->v_stride[2];
  const char *base = t == 1 ? c->kbase : c->vbase;
  see(c->a, t, c->blk->b * r->heads_kv + c->hk, base + (size_t)(s0 * stride) * es, s0, j1 - s0,
      stride);
}

/* The tile's K and V into a->seen, past the keys scanned already: by an
 * earlier block, or (the keys of its packed tiles) by the job's packing,
 * which reads V, and F16's K, anyway. */
static void see_tile(const blk_ctx *c, int64_t j0, int64_t nkt) {
  const attn_request *r = c->a->r;
  const int64_t s0 = j0 > c->scan_from ? j0 : c->scan_from;
  const int64_t packed = c->a->kvpack ? attn__flash_pack_tiles(r) * BK : 0;
  const int64_t v0 = s0 > packed ? s0 : packed;
  see_keys(c, 1, r->dtype == ATTN_F16 ? v0 : s0, j0 + nkt);
  see_keys(c, 2, v0, j0 + nkt);
}

/* The tile's rows (kt, vt), and the next tile's (pk, pv, pn rows; pn 0 at
 * the last tile) for the decode path to prefetch. */
static void tile_rows(blk_ctx *c, int64_t j0, int64_t nkt) {
  if (c->a->r->kv_quant && !c->incodes) {
    dq_tile(c, j0, nkt);
    return;
  }
  row_ptrs(c, j0, &c->kt, &c->vt, &c->kstep, &c->vstep);
  c->pn = 0;
  if ((c->rowf || c->rowwise || c->amx) && j0 + nkt <= c->jhi) {
    row_ptrs(c, j0 + nkt, &c->pk, &c->pv, &c->pks, &c->pvs);
    c->pn = tile_len(c, j0 + nkt);
  }
  if (!c->incodes)
    return;
  c->ksc = dq_scales(c, c->kpg, j0);
  c->vsc = dq_scales(c, c->vpg, j0);
  if (!c->pn)
    return;
  const char *ks = (const char *)dq_scales(c, c->kpg, j0 + nkt);
  const char *vs = (const char *)dq_scales(c, c->vpg, j0 + nkt);
  /* the next tile's scales, into L1 as its codes: into L2, the load of
   * each tile's key scales was where a profile of the I8 step stalled */
  for (int64_t b = 0; b < c->pn * 4; b += 64) {
    __builtin_prefetch(ks + b, 0, 3);
    __builtin_prefetch(vs + b, 0, 3);
  }
}

/* Oᵀ = Oᵀ·alpha + P·V in the transposed layout; the F32 products rescale
 * Oᵀ as they load it, the BF16 ones after a pass of their own. */
static void tile_values(blk_ctx *c, const float *vp, int64_t ldv, int64_t nkt) {
  const float *alpha = ones(c->alpha, c->lanes) ? NULL : c->alpha;
  if (!c->bf16dp) { /* Oᵀ's rows past v's width stay 0 */
    pv_tile(c->st, vp, ldv, c->ot, alpha, attn__flash_v_width(c->a->r), nkt, c->nv, c->a->wide);
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
  amx_ot_touch(c);
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

/* Row ii's factor 1/l (1 for a split's partial), and its m (natural
 * units) and l as the request reports them: with the head's sink folded
 * in (a split's partials take it when they are merged). */
static float row_norm(const blk_ctx *c, int64_t ii, int64_t h, double *mm, double *ll) {
  const attn_request *r = c->a->r;
  *mm = c->m[ii] * (float)M_LN2; /* back from base 2; -inf stays -inf */
  *ll = c->l[ii];
  if (!r->sinks || c->blk->po)
    return c->blk->po ? 1.0f : c->l[ii] > 0 ? 1.0f / c->l[ii] : 0.0f;
  const double a = attn__sink_fold(r->sinks[h], mm, ll);
  return (float)(a / *ll);
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
    const int64_t h = blk->h0 + ii / nq, i = blk->i0 + ii % nq;
    double mm, ll;
    const float inv = row_norm(c, ii, h, &mm, &ll) * (c->ofac ? c->ofac[ii] : 1.0f);
    float *row = blk->po ? blk->po + ii * D : c->kb;
    for (int64_t d = 0; d < D; d++)
      row[d] = orows[ii * D + d] * inv;
    if (blk->po) {
      blk->pm[ii] = c->m[ii];
      blk->pl[ii] = c->l[ii];
      continue;
    }
    if (r->o) /* NULL: only the statistics are wanted (the backward's lse) */
      store_row((char *)r->o +
                    (size_t)(blk->b * r->o_stride[0] + h * r->o_stride[1] + i * r->o_stride[2]) *
                        es,
                row, r->dtype, D);
    const size_t srow = (size_t)((blk->b * r->heads_q + h) * r->seq_q + i);
    if (r->m)
      r->m[srow] = (float)mm;
    if (r->l)
      r->l[srow] = (float)ll;
    if (r->lse)
      r->lse[srow] = ll > 0 ? (float)mm + logf((float)ll) : -INFINITY;
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

/*
 * Where the block's arrays are in the workspace: Qᵀ and Oᵀ (D ≤ wd rows of
 * BQ each), m, l and alpha, then the per-tile Sᵀ and converted K and V
 * tiles. The second block of a pair (rows_pair, D ≤ ATTN_FLASH_PAIR_MAX_D,
 * half the narrow wd) takes the upper halves of the Qᵀ and Oᵀ regions, and
 * its m, l and alpha the end of the V tile's, which then holds at most BK ×
 * wd/2; the per-tile arrays are shared. So a pair needs no more workspace
 * than one block.
 */
static void block_layout(blk_ctx *c, float *ws, bool second) {
  const int64_t wd = attn__cpu_ws_d(c->a->r->head_dim);
  float *qt = ws, *ot = qt + wd * BQ, *stats = ot + wd * BQ;
  c->wd = wd;
  c->st = stats + 3 * BQ;
  c->kb = c->st + BK * BQ;
  c->vb = c->kb + BK * wd;
  c->kq = (char *)(ws + ATTN_FLASH_WS_FLOATS_D(wd)); /* past what a block uses */
  c->vq = c->kq + (size_t)(BK * wd) * sizeof(float);
  if (second) {
    qt += wd / 2 * BQ;
    ot += wd / 2 * BQ;
    stats = c->vb + BK * wd - 3 * BQ;
  }
  c->qt = qt;
  c->ot = ot;
  c->m = stats;
  c->l = stats + BQ;
  c->alpha = stats + 2 * BQ;
}

/* The second of two amx blocks in lockstep (rows_pair): Qᵀ, Oᵀ, m, l,
 * alpha and the P slots (and true maxima) of its own, past all the first
 * block and the dequantized tiles use; the score tile and the V workspace
 * shared, as neither outlives a tile or the block's end once the job has
 * packed Vᵀ (pair_kind). */
static void block_layout_amx2(blk_ctx *c, float *ws) {
  block_layout(c, ws, false);
  const int64_t wd = c->wd;
  c->qt = ws + ATTN_FLASH_WS_FLOATS_D(wd) + 2 * BK * wd;
  c->ot = c->qt + wd * BQ;
  c->m = c->ot + wd * BQ;
  c->l = c->m + BQ;
  c->alpha = c->l + BQ;
  c->kb = c->alpha + BQ;
}
_Static_assert(ATTN_FLASH_WS_FLOATS_D(ATTN_CPU_NARROW_D) + 2 * BK * ATTN_CPU_NARROW_D +
                       2 * ATTN_CPU_NARROW_D * BQ + 3 * BQ + BK * ATTN_CPU_NARROW_D <=
                   ATTN_FLASH_WS_FLOATS,
               "two amx blocks of the narrow layout fit one worker's workspace");

/* Which products the block's rows take (BF16 ones, the few-rows paths,
 * AMX tiles): for block_begin, and for pair_ok before any block begins. */
static void block_kind(blk_ctx *c) {
  const attn_request *r = c->a->r;
  c->nrows = c->blk->nh * c->blk->nq;
  c->incodes = rf_quant(c); /* then rf_* (ri_* for I8 under BF16): rowf below */
  c->rowi = ri_ok(c);
  c->bf16dp =
      r->dtype == ATTN_BF16 && r->head_dim % 2 == 0 && (ATTN_DPBF16 || ATTN_AMX) && !c->incodes;
  c->rowwise = rw_ok(c);
  c->amxrows = ar_ok(c);
  c->rowf = rf_ok(c);
  c->amx16 = amx16_ok(c);
  c->amx = amx_ok(c);
}

/* The block's first tile, on the paths that prefetch each next one
 * (tile_rows): no tile before it did, and a split chunk has few tiles (32
 * in a 2048-key chunk, 8 in a 512-key one), so its first one stalled with
 * nothing ahead. */
static void prefetch_first(blk_ctx *c) {
#if ATTN_ISA == 512
  const bool dq = c->a->r->kv_quant && !c->incodes; /* dq_tile reads it */
  if (!(c->rowf || c->rowwise || c->amx) || dq || c->jlo > c->jhi)
    return;
  row_ptrs(c, c->jlo, &c->pk, &c->pv, &c->pks, &c->pvs);
  c->pn = tile_len(c, c->jlo);
  prefetch_next(c, 0, 1);
  c->pn = 0;
#else
  (void)c;
#endif
}

/* Everything about the block known before its first tile; Qᵀ loaded. */
static void block_begin(blk_ctx *c) {
  block_kind(c);
  c->nv = (int)((c->nrows + VL - 1) / VL);
  c->lanes = (int64_t)c->nv * VL;
  c->hk = c->blk->h0 / c->a->group;
  kv_head(c);
  key_range(c);
  prefetch_first(c);
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
 * so its arithmetic, and its output, is that of rows_one (pair_kind says
 * which paths can). The AMX tiles stay configured until both are done.
 */
static void rows_pair(const attn__flash_args *a, const attn__flash_block *blk, float *ws,
                      bool amx) {
  blk_ctx c[2] = {{.a = a, .blk = &blk[0]}, {.a = a, .blk = &blk[1]}};
  block_layout(&c[0], ws, false);
  if (amx)
    block_layout_amx2(&c[1], ws);
  else
    block_layout(&c[1], ws, true);
  c[0].keep_tiles = c[1].keep_tiles = amx;
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
#if ATTN_AMX
  if (amx)
    _tile_release();
#endif
}

enum { PAIR_NONE, PAIR_F32, PAIR_AMX };

/* How a block can run in lockstep with another: the F32 products in the
 * transposed layout keep nothing of their own in the per-tile arrays
 * between tiles, so two share them, each in half the workspace (up to
 * ATTN_FLASH_PAIR_MAX_D); BF16 blocks on AMX tiles keep their P slots, so
 * the second takes its own arrays (block_layout_amx2), and only where the
 * job packed Vᵀ (the V workspace is then free between tiles). */
static int pair_kind(const attn__flash_args *a, const attn__flash_block *blk) {
  blk_ctx c = {.a = a, .blk = blk};
  block_kind(&c);
  if (c.amx && !c.amx16 && a->kvpack && attn__cpu_ws_d(a->r->head_dim) == ATTN_CPU_NARROW_D)
    return PAIR_AMX;
  return !c.bf16dp && !c.rowf && !c.amx16 && a->r->head_dim <= ATTN_FLASH_PAIR_MAX_D ? PAIR_F32
                                                                                     : PAIR_NONE;
}

static void rows(const attn__flash_args *a, const attn__flash_block *blk, int nblk, void *ws) {
  const int kind = nblk == 2 ? pair_kind(a, &blk[0]) : PAIR_NONE;
  if (kind != PAIR_NONE && pair_kind(a, &blk[1]) == kind) {
    rows_pair(a, blk, ws, kind == PAIR_AMX);
    return;
  }
  for (int i = 0; i < nblk; i++)
    rows_one(a, &blk[i], ws);
}

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

#if ATTN_AMX
/* The job's packing phase: tiles t0 .. t1-1 of (b, hk) packed (pack_tile),
 * each one's V (and F16's K, which it splits) scanned while in cache, so
 * the blocks (see_tile) need not read them from memory again. */
static void pack_keys(const attn__flash_args *a, int64_t b, int64_t hk, int64_t t0, int64_t t1,
                      uint16_t *dst) {
  const attn__flash_block blk = {.b = b, .j1 = a->r->seq_kv};
  blk_ctx c = {.a = a, .blk = &blk, .hk = hk, .jhi = a->r->seq_kv - 1};
  kv_head(&c);
  for (int64_t t = t0; t < t1; t++) {
    const int64_t j0 = t * BK, j1 = j0 + tile_len(&c, j0);
    pack_tile(&c, j0, dst + (size_t)(t * attn__flash_pack_words(a->r)));
    if (a->r->dtype == ATTN_F16)
      see_keys(&c, 1, j0, j1);
    see_keys(&c, 2, j0, j1);
  }
}
#define PACK_KEYS pack_keys
#else
#define PACK_KEYS NULL
#endif

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
