/*
 * flash_amx.h — AMX-BF16 tiles for flash_bf16.h (the amx instance only).
 *
 * A whole tile of BK = 64 keys against a block of up to BQ = 64 query lanes
 * runs here (amx_step); partial tiles (the edges of a window or a page) keep
 * VDPBF16PS. The tiles are used as amx.h sets them out (tmm0-3 a 2×2 block
 * of F32 accumulators, tmm4-5 A rows, tmm6-7 B pairs), so with flash.c's
 * transposed layout:
 *   Sᵀ (keys × queries)  = K rows (A, read in place) · Q pairs (B, packed
 *                          once per block by dp_load_q);
 *   Oᵀ (dims × queries) += Vᵀ rows (A) · P pairs (B),
 * where a row of Vᵀ is 32 consecutive keys of one head_dim element: each
 * tile's V is transposed once (amx_transpose64), in vector registers, as
 * 16×16 transposes of key-pair words.
 *
 * The softmax (amx_softmax) runs on the raw scores, folding the scale into
 * the exponent's FMA, and writes P straight into BF16 pairs, never as F32.
 * It rescales lazily: the reference max a lane's O and l are relative to
 * moves only when the tile's max passes it by more than AMX_SLACK (base 2),
 * so P stays below 2^AMX_SLACK (exact enough in BF16's relative precision,
 * far from F32's range) and Oᵀ is rescaled on few tiles instead of every
 * one (on random data the running max moves on most early tiles). The true
 * max is tracked beside it, and amx_end brings O, l and m to it, so the
 * statistics are those of the eager form.
 */
#ifndef ATTN_CPU_FLASH_AMX_H
#define ATTN_CPU_FLASH_AMX_H

#ifdef ATTN_AMX_EMU
#include "amx_emu.h"
#endif
#include "amx.h"

#define AMX_SLACK 8.0f
_Static_assert(BK == 64, "amx_transpose64 transposes tiles of 64 keys");

static inline bool amx_tile(const blk_ctx *c, int64_t nkt) { return c->amx && nkt == BK; }

/* Tiles whose P·V waits (slots of P pairs and Vᵀ): at most 4, as many as
 * the V workspace holds at this head_dim. */
enum { AMX_SLOTS = 4 };
_Static_assert(sizeof(((blk_ctx *)0)->vslot) / sizeof(const uint16_t *) == AMX_SLOTS,
               "blk_ctx.vslot holds a pointer per slot");

static inline int amx_slots(const blk_ctx *c) {
  const int64_t fit = 2 * MAXD / c->a->r->head_dim;
  return fit < AMX_SLOTS ? (int)fit : AMX_SLOTS;
}

/* The true running max per lane, past the P pairs in the K workspace. */
static inline float *amx_mtrue(const blk_ctx *c) { return c->kb + AMX_SLOTS * BK / 2 * BQ; }

static void amx_begin(blk_ctx *c) {
  c->amx = c->bf16dp && !c->rowwise && c->a->r->head_dim % 32 == 0;
  if (!c->amx)
    return;
  amx_configure();
  c->pbase = c->npend = 0;
  float *mt = amx_mtrue(c);
  for (int64_t ii = 0; ii < c->lanes; ii++)
    mt[ii] = -INFINITY;
}

/* ---- products ------------------------------------------------------------ */

/* Sᵀ rows kr·16 .. kr·16+31 × lanes v·16 .. v·16+16·nc (nc 1 or 2) for
 * the tile's keys at c->kt: raw dot products, unscaled. */
static void amx_scores22(blk_ctx *c, int kr, int v, bool two) {
  const int64_t D = c->a->r->head_dim, ldk = c->kstep * 2;
  const uint32_t *qp = (const uint32_t *)c->qt + v * 16;
  const char *k0 = c->kt + kr * 16 * ldk, *k1 = k0 + 16 * ldk;
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t d0 = 0; d0 < D; d0 += 32) {
    _tile_loadd(4, k0 + 2 * d0, ldk);
    _tile_loadd(5, k1 + 2 * d0, ldk);
    _tile_loadd(6, qp + d0 / 2 * BQ, BQ * 4);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(2, 5, 6);
    if (two) {
      _tile_loadd(7, qp + d0 / 2 * BQ + 16, BQ * 4);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  float *s = c->st + kr * 16 * BQ + v * 16;
  _tile_stored(0, s, BQ * 4);
  _tile_stored(2, s + 16 * BQ, BQ * 4);
  if (two) {
    _tile_stored(1, s + 16, BQ * 4);
    _tile_stored(3, s + 16 * BQ + 16, BQ * 4);
  }
}

static void amx_scores(blk_ctx *c) {
  for (int kr = 0; kr < BK / 16; kr += 2)
    for (int v = 0; v < c->nv; v += 2)
      amx_scores22(c, kr, v, v + 1 < c->nv);
}

/* Oᵀ rows db·16 .. db·16+31 × lanes v·16 .. (nc 1 or 2 vectors) += Vᵀ · P
 * pairs over the pending tiles: slot g's Vᵀ at c->vslot[g] ([d][BK] BF16),
 * its P pairs at c->kb + g·BK/2·BQ ([BK/2][BQ] words). */
static void amx_values22(blk_ctx *c, int64_t db, int v, bool two) {
  float *o = c->ot + db * 16 * BQ + v * 16;
  _tile_loadd(0, o, BQ * 4);
  _tile_loadd(2, o + 16 * BQ, BQ * 4);
  if (two) {
    _tile_loadd(1, o + 16, BQ * 4);
    _tile_loadd(3, o + 16 * BQ + 16, BQ * 4);
  }
  for (int g = c->pbase; g < c->pbase + c->npend; g++) {
    const uint16_t *vt = c->vslot[g] + db * 16 * BK;
    const uint32_t *pp = (const uint32_t *)c->kb + g * (BK / 2 * BQ) + v * 16;
    for (int kc = 0; kc < BK / 32; kc++) {
      _tile_loadd(4, vt + kc * 32, BK * 2);
      _tile_loadd(5, vt + 16 * BK + kc * 32, BK * 2);
      _tile_loadd(6, pp + kc * 16 * BQ, BQ * 4);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(2, 5, 6);
      if (two) {
        _tile_loadd(7, pp + kc * 16 * BQ + 16, BQ * 4);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(3, 5, 7);
      }
    }
  }
  _tile_stored(0, o, BQ * 4);
  _tile_stored(2, o + 16 * BQ, BQ * 4);
  if (two) {
    _tile_stored(1, o + 16, BQ * 4);
    _tile_stored(3, o + 16 * BQ + 16, BQ * 4);
  }
}

/* Oᵀ += the pending tiles' products, which share one reference max: a
 * longer sum per accumulator tile loaded and stored. */
static void amx_flush(blk_ctx *c) {
  const int64_t D = c->a->r->head_dim;
  if (c->npend)
    for (int64_t db = 0; db < D / 16; db += 2)
      for (int v = 0; v < c->nv; v += 2)
        amx_values22(c, db, v, v + 1 < c->nv);
  c->pbase += c->npend;
  c->npend = 0;
}

/* ---- V transposed -------------------------------------------------------- */

/* The job's packed Vᵀ of the tile at j0, or NULL when it has none for it
 * (no packing, or not a whole aligned tile). */
static const uint16_t *amx_packed(const blk_ctx *c, int64_t j0) {
  const attn_request *r = c->a->r;
  const int64_t ntiles = r->seq_kv / BK;
  if (!c->a->vpack || j0 % BK != 0 || j0 / BK >= ntiles)
    return NULL;
  const int64_t head = c->blk->b * r->heads_kv + c->hk;
  return c->a->vpack + ((size_t)(head * ntiles + j0 / BK) * BK) * (size_t)r->head_dim;
}

/* The tile at j0's Vᵀ for slot `slot`: the job's packed copy, or
 * transposed into the slot's place in the V workspace. */
static void amx_slot_v(blk_ctx *c, int slot, int64_t j0) {
  const int64_t D = c->a->r->head_dim;
  if ((c->vslot[slot] = amx_packed(c, j0)))
    return;
  uint16_t *dst = (uint16_t *)c->vb + slot * D * BK;
  amx_transpose64(c->vt, (size_t)c->vstep * 2, D, dst, BK);
  c->vslot[slot] = dst;
}

/* ---- softmax ------------------------------------------------------------- */

/* One vector of lanes: the tile max (raw scores times sc > 0) into the
 * true max; the reference max moves only past the slack; alpha, l. */
static vf amx_max(blk_ctx *c, int v, float sc, vf *pref) {
  vf m4[4] = {vset1(-INFINITY), vset1(-INFINITY), vset1(-INFINITY), vset1(-INFINITY)};
  for (int64_t j = 0; j < BK; j += 4) /* four chains: vmaxps's latency, not its rate */
    UNROLL for (int u = 0; u < 4; u++) m4[u] = vmax(m4[u], vload(c->st + (j + u) * BQ + v * VL));
  const vf mx = vmax(vmax(m4[0], m4[1]), vmax(m4[2], m4[3]));
  float *mt = amx_mtrue(c) + v * VL;
  const vf mtrue = vmax(vload(mt), vmul(mx, vset1(sc)));
  vstore(mt, mtrue);
  const vf mo = vload(c->m + v * VL);
  const __mmask16 up = _mm512_cmp_ps_mask(mtrue, vadd(mo, vset1(AMX_SLACK)), _CMP_GT_OQ);
  const vf mn = _mm512_mask_blend_ps(up, mo, mtrue);
  const vf mu = vmax(mn, vset1(-FLT_MAX)); /* no -inf - -inf */
  const vf al = _mm512_mask_blend_ps(up, vset1(1.0f), vexp2(vsub(mo, mu)));
  vstore(c->m + v * VL, mn);
  vstore(c->alpha + v * VL, al);
  *pref = mu;
  return al;
}

/* Part `part` of `parts` of the next tile's K rows into L1 and its Vᵀ
 * (packed) or V rows into L2: the products stalled on their first tile
 * loads without it. */
static inline void amx_prefetch(const blk_ctx *c, int64_t part, int64_t parts) {
  const size_t row = (size_t)c->a->r->head_dim * 2;
  for (int64_t j = part * c->pn / parts; j < (part + 1) * c->pn / parts; j++)
    for (size_t b = 0; b < row; b += 64) {
      _mm_prefetch(c->pk + (size_t)(j * c->pks) * 2 + b, _MM_HINT_T0);
      if (c->pvt)
        _mm_prefetch((const char *)c->pvt + (size_t)j * row + b, _MM_HINT_T1);
      else
        _mm_prefetch(c->pv + (size_t)(j * c->pvs) * 2 + b, _MM_HINT_T1);
    }
}

/* P = 2^(sc·s − m) for the whole tile, summed into l and packed as BF16
 * key pairs in slot `slot` of c->kb ([BK/2][BQ] words, as dp_pack_p lays
 * them out). Returns whether any lane's reference max moved. */
static bool amx_softmax(blk_ctx *c, float sc, int slot) {
  const __m512i idx = amx_pair_idx();
  uint32_t *pp = (uint32_t *)c->kb + slot * (BK / 2 * BQ);
  const vf scv = vset1(sc);
  bool moved = false;
  for (int v = 0; v < c->nv; v++) {
    vf mu;
    const vf al = amx_max(c, v, sc, &mu);
    moved |= _mm512_cmp_ps_mask(al, vset1(1.0f), _CMP_NEQ_UQ) != 0;
    vf sum0 = vset1(0.0f), sum1 = vset1(0.0f);
    for (int64_t jp = 0; jp < BK / 2; jp++) {
      if (jp % 8 == 0) /* the next tile's K and V, over the exponentials */
        amx_prefetch(c, v * 4 + jp / 8, c->nv * 4);
      const float *s = c->st + 2 * jp * BQ + v * VL;
      const vf p0 = vexp2(_mm512_fmsub_ps(vload(s), scv, mu));
      const vf p1 = vexp2(_mm512_fmsub_ps(vload(s + BQ), scv, mu));
      sum0 = vadd(sum0, p0);
      sum1 = vadd(sum1, p1);
      const __m512i w = (__m512i)_mm512_cvtne2ps_pbh(p1, p0);
      _mm512_storeu_si512(pp + jp * BQ + v * VL, _mm512_permutexvar_epi16(idx, w));
    }
    vstore(c->l + v * VL, vfma(vload(c->l + v * VL), al, vadd(sum0, sum1)));
  }
  return moved;
}

/* Oᵀ columns whose reference max moved, times alpha. */
static void amx_rescale(blk_ctx *c) {
  const int64_t D = c->a->r->head_dim;
  for (int v = 0; v < c->nv; v++) {
    const vf al = vload(c->alpha + v * VL);
    if (!_mm512_cmp_ps_mask(al, vset1(1.0f), _CMP_NEQ_UQ))
      continue;
    for (int64_t d = 0; d < D; d++) {
      float *op = c->ot + d * BQ + v * VL;
      vstore(op, vmul(vload(op), al));
    }
  }
}

/* One whole tile at c->kt, c->vt (keys j0 ..): flash.c's tile_step for AMX.
 * Variants and a scale <= 0 need the scaled scores: they get a scale pass
 * and the softmax a factor of 1. */
static void amx_step(blk_ctx *c, int64_t j0, bool full) {
  const attn__flash_args *a = c->a;
  float sc = a->scale2;
  c->pvt = c->pn ? amx_packed(c, j0 + BK) : NULL;
  amx_scores(c);
  if (a->var.on || !(sc > 0)) {
    for (int64_t j = 0; j < BK; j++)
      for (int v = 0; v < c->nv; v++)
        vstore(c->st + j * BQ + v * VL, vmul(vload(c->st + j * BQ + v * VL), vset1(sc)));
    if (a->var.on)
      variant_tile(c, j0, BK);
    sc = 1.0f;
  }
  if (!full)
    mask_tile(c->st, a, j0, BK, c->blk->i0, c->blk->nq, c->nrows);
  if (c->pbase + c->npend == amx_slots(c)) {
    amx_flush(c);
    c->pbase = 0;
  }
  const int slot = c->pbase + c->npend;
  if (amx_softmax(c, sc, slot)) { /* the pending tiles are relative to the old max */
    amx_flush(c);
    amx_rescale(c);
  }
  amx_slot_v(c, slot, j0);
  c->npend++;
}

/* O, l and m from the reference max to the true one (a lane whose max
 * stayed within the slack, or that a VDPBF16PS tile moved), then the tile
 * registers back. */
static void amx_end(blk_ctx *c) {
  if (!c->amx)
    return;
  amx_flush(c);
  const int64_t D = c->a->r->head_dim;
  const float *mt = amx_mtrue(c);
  for (int v = 0; v < c->nv; v++) {
    const vf mo = vload(c->m + v * VL), mn = vmax(vload(mt + v * VL), mo);
    const vf f = vexp2(vsub(mo, vmax(mn, vset1(-FLT_MAX))));
    vstore(c->m + v * VL, mn);
    vstore(c->l + v * VL, vmul(vload(c->l + v * VL), f));
    if (!_mm512_cmp_ps_mask(f, vset1(1.0f), _CMP_NEQ_UQ))
      continue;
    for (int64_t d = 0; d < D; d++)
      vstore(c->ot + d * BQ + v * VL, vmul(vload(c->ot + d * BQ + v * VL), f));
  }
  _tile_release();
}

#endif
