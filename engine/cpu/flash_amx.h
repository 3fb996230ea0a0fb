/*
 * flash_amx.h — AMX-BF16 tiles for flash.c's amx instance.
 *
 * A whole tile of BK = 64 keys against a block of up to BQ = 64 query lanes
 * runs here (amx_step); partial BF16 tiles (the edges of a window or a page)
 * keep VDPBF16PS. The tiles are used as amx.h sets them out (tmm0-3 a 2×2
 * block of F32 accumulators, tmm4-5 A rows, tmm6-7 B pairs), so with
 * flash.c's transposed layout:
 *   Sᵀ (keys × queries)  = K rows (A, read in place) · Q pairs (B, packed
 *                          once per block by amx_load_q);
 *   Oᵀ (dims × queries) += Vᵀ rows (A) · P pairs (B),
 * where a row of Vᵀ is 32 consecutive keys of one head_dim element, made by
 * 16×16 transposes of key-pair words (amx_transpose64): once per job for
 * every block of a KV head (cpu.c's packing phase, pack_keys), or per tile
 * where the job packed nothing (amx_slot_v).
 *
 * The softmax (amx_softmax) runs on the raw scores, folding the scale into
 * the exponent's FMA, and writes P straight into BF16 pairs, never as F32.
 * It rescales lazily: the reference max a lane's O and l are relative to
 * moves only when the tile's max passes it by more than AMX_SLACK (base 2),
 * so P stays below 2^AMX_SLACK (exact enough in BF16's relative precision,
 * far from F32's range) and Oᵀ is rescaled on few tiles instead of every
 * one (on random data the running max moves on most early tiles). The true
 * max is tracked beside it, and amx_end brings l and m to it (O takes the
 * factor with its normalization), so the statistics are those of the
 * eager form. Since the reference rarely
 * moves, the exponentials are taken against it in the same pass that finds
 * the tile's max, and redone only where it must move: one read of the
 * scores instead of two. P·V waits for up to AMX_SLOTS
 * tiles that share a reference max (amx_flush): a longer sum per load and
 * store of the accumulator tiles.
 *
 * F16 inputs (amx16) are split exactly into two BF16 parts, x = hi + lo:
 * hi is x rounded to BF16 and lo = x − hi the rest, at most 3 bits (F16
 * has 11), so both are BF16 values. Q·Kᵀ is then four tile products, so
 * the scores (and the statistics) are exact up to F32 sums; P·V is three,
 * hi·hi + hi·lo + lo·hi (lo·lo is below 2^-16 of it); P is split too (hi
 * truncated, lo the rest: 16 of its bits), so the F16 path keeps more than
 * F16's precision everywhere. Its K and V parts are packed once per job
 * (pack_keys: K rows and Vᵀ, the last tile zero-padded and its padding keys
 * masked), so the F16 path runs only where the job packed them (cpu.c:
 * prefill without a left window); other blocks take F32.
 */
#ifndef ATTN_CPU_FLASH_AMX_H
#define ATTN_CPU_FLASH_AMX_H

#include "flash_blk.h"

#if ATTN_AMX
#include "amx.h"

#define AMX_SLACK 8.0f
_Static_assert(BK == 64, "amx_transpose64 transposes tiles of 64 keys");

/* Whole tiles; an F16 block's every tile (its keys are packed, padded). */
static inline bool amx_tile(const blk_ctx *c, int64_t nkt) {
  return c->amx16 || (c->amx && nkt == BK);
}

/* Tiles whose P·V waits (slots of P pairs and Vᵀ): 4 (F16: 2, its P has
 * two parts). A slot reads the job's packed Vᵀ in place; a tile's Vᵀ
 * transposed where nothing was packed (amx_slot_v) takes a slot's place in
 * the V workspace, which holds amx_vfit of them (2 at D192 and D256), so
 * such a tile may wait with fewer. Four at D192 rather than two: 0.95 of
 * the time on two threads, once the next Vᵀ was prefetched (amx_prefetch). */
enum { AMX_SLOTS = 4 };
_Static_assert(sizeof(((blk_ctx *)0)->vslot) / sizeof(const uint16_t *) == AMX_SLOTS,
               "blk_ctx.vslot holds a pointer per slot");

static inline int amx_slots(const blk_ctx *c) { return c->amx16 ? AMX_SLOTS / 2 : AMX_SLOTS; }

static inline int amx_vfit(const blk_ctx *c) { return (int)(2 * c->wd / c->a->r->head_dim); }

/* Part `part` (0 hi, 1 lo) of slot g's P pairs in the K workspace. */
static inline uint32_t *amx_pslot(const blk_ctx *c, int g, int part) {
  return (uint32_t *)c->kb + ((c->amx16 ? 2 * g : g) + part) * (BK / 2 * BQ);
}

/* The products of a tile pair as (A part, B part): hi·hi, then for F16
 * hi·lo and lo·hi, and for the scores lo·lo: S = Q·Kᵀ exactly (up to F32
 * sums), as the statistics need; P·V drops lo·lo, under 2^-16 of it. */
static const uint8_t amx_terms[4][2] = {{0, 0}, {0, 1}, {1, 0}, {1, 1}};
static inline int amx_nterms(const blk_ctx *c) { return c->amx16 ? 3 : 1; }
static inline int amx_score_terms(const blk_ctx *c) { return c->amx16 ? 4 : 1; }

/* The true running max per lane, past the P pairs in the K workspace. */
static inline float *amx_mtrue(const blk_ctx *c) { return c->kb + AMX_SLOTS * BK / 2 * BQ; }

/* F16 blocks whose keys the job packed (every tile of them is): split. */
static inline bool amx16_ok(const blk_ctx *c) {
  const attn_request *r = c->a->r;
  return r->dtype == ATTN_F16 && r->head_dim % 32 == 0 && c->a->kvpack && !c->rowf &&
         c->blk->j0 == 0;
}

/* n F16 values at src (n a multiple of 16) as their BF16 hi and lo parts:
 * hi rounded to nearest, lo = x − hi, exact (at most 3 significant bits),
 * |lo| <= 2^-8·|x|, so the hi·lo products' dropped lo·lo term is below
 * 2^-16 of a product. */
static void amx_split16(const char *src, uint16_t *hi, uint16_t *lo, int64_t n) {
  for (int64_t k = 0; k < n; k += 16) {
    const __m512 x = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + 2 * k)));
    const __m256i h = (__m256i)_mm512_cvtneps_pbh(x);
    const __m512 hf = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    const __m512i r = _mm512_castps_si512(_mm512_sub_ps(x, hf));
    _mm256_storeu_si256((__m256i *)(hi + k), h);
    _mm256_storeu_si256((__m256i *)(lo + k), _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16)));
  }
}

/* Whether the block runs its whole tiles on AMX: BF16 blocks past the few
 * rows path, head_dim a multiple of 32; F16 ones the job packed. */
static inline bool amx_ok(const blk_ctx *c) {
  return c->amx16 || (c->bf16dp && !c->rowwise && c->a->r->head_dim % 32 == 0);
}

/* Q part `part` of 16 lanes from the rows at src (NULL past the block's
 * rows: zero lanes), as pairs: row ii's 16 pairs per register, transposed
 * into one register of 16 lanes per pair (qt + part·D/2·BQ words). */
static void amx_q_lanes(blk_ctx *c, const uint16_t *const src[16], int v, int part) {
  const int64_t D = c->a->r->head_dim;
  uint32_t *qp = (uint32_t *)c->qt + part * (D / 2 * BQ) + v * VL;
  for (int64_t p0 = 0; p0 < D / 2; p0 += 16) {
    __m512i x[16];
    for (int r = 0; r < 16; r++)
      x[r] = src[r] ? _mm512_loadu_si512(src[r] + 2 * p0) : _mm512_setzero_si512();
    vtranspose16(x);
    for (int p = 0; p < 16; p++)
      _mm512_storeu_si512(qp + (p0 + p) * BQ, x[p]);
  }
}

/* Every lane's Q pairs (BF16 in place; F16 split into hi and lo rows in
 * the V workspace first, as the packed K and V are). */
static void amx_load_q(blk_ctx *c) {
  const int64_t D = c->a->r->head_dim, nq = c->blk->nq;
  uint16_t *hi = (uint16_t *)c->vb, *lo = hi + 16 * D;
  for (int v = 0; v < c->nv; v++) {
    const uint16_t *h[16], *l[16];
    for (int r = 0; r < 16; r++) {
      const int64_t ii = v * VL + r;
      const char *row = ii < c->nrows ? q_row(c, c->blk->h0 + ii / nq, c->blk->i0 + ii % nq) : NULL;
      h[r] = (const uint16_t *)row;
      l[r] = NULL;
      if (row && c->amx16) {
        amx_split16(row, hi + r * D, lo + r * D, D);
        h[r] = hi + r * D;
        l[r] = lo + r * D;
      }
    }
    amx_q_lanes(c, h, v, 0);
    if (c->amx16)
      amx_q_lanes(c, l, v, 1);
  }
}

static void amx_begin(blk_ctx *c) {
  if (!c->amx)
    return;
  amx_configure();
  c->pbase = c->npend = 0;
  float *mt = amx_mtrue(c);
  for (int64_t ii = 0; ii < c->lanes; ii++)
    mt[ii] = -INFINITY;
}

/* The job's packed tile at j0 (attn__flash_pack_words), or NULL when it
 * has none for it (no packing, or a BF16 tile not whole and aligned). */
static const uint16_t *amx_packed(const blk_ctx *c, int64_t j0) {
  const attn_request *r = c->a->r;
  const int64_t ntiles = attn__flash_pack_tiles(r);
  if (!c->a->kvpack || j0 % BK != 0 || j0 / BK >= ntiles)
    return NULL;
  const int64_t head = c->blk->b * r->heads_kv + c->hk;
  return c->a->kvpack + (size_t)(head * ntiles + j0 / BK) * (size_t)attn__flash_pack_words(r);
}

/* ---- products ------------------------------------------------------------ */

/* The accumulators tmm0-3 (tmm1 and tmm3 only when two) to or from the
 * F32 block at p: rows BQ floats apart, the second pair 16 rows down. */
static inline void amx_store22(float *p, bool two) {
  _tile_stored(0, p, BQ * 4);
  _tile_stored(2, p + 16 * BQ, BQ * 4);
  if (two) {
    _tile_stored(1, p + 16, BQ * 4);
    _tile_stored(3, p + 16 * BQ + 16, BQ * 4);
  }
}

static inline void amx_load22(const float *p, bool two) {
  _tile_loadd(0, p, BQ * 4);
  _tile_loadd(2, p + 16 * BQ, BQ * 4);
  if (two) {
    _tile_loadd(1, p + 16, BQ * 4);
    _tile_loadd(3, p + 16 * BQ + 16, BQ * 4);
  }
}

/* Sᵀ rows kr·16 .. kr·16+31 × lanes v·16 .. v·16+16·nc (nc 1 or 2): raw
 * dot products, unscaled, summed over the terms; K part a's rows at kp[a],
 * ldk bytes apart, Q part b's pairs at qt + b·D/2·BQ words. */
static void amx_scores22(blk_ctx *c, const char *const kp[2], int64_t ldk, int kr, int v,
                         bool two) {
  const int64_t D = c->a->r->head_dim;
  const int nt = amx_score_terms(c);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t d0 = 0; d0 < D; d0 += 32)
    for (int t = 0; t < nt; t++) {
      const char *k0 = kp[amx_terms[t][0]] + kr * 16 * ldk + 2 * d0;
      const uint32_t *qp = (const uint32_t *)c->qt + amx_terms[t][1] * (D / 2 * BQ) + v * 16;
      _tile_loadd(4, k0, ldk);
      _tile_loadd(5, k0 + 16 * ldk, ldk);
      _tile_loadd(6, qp + d0 / 2 * BQ, BQ * 4);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(2, 5, 6);
      if (two) {
        _tile_loadd(7, qp + d0 / 2 * BQ + 16, BQ * 4);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(3, 5, 7);
      }
    }
  amx_store22(c->st + kr * 16 * BQ + v * 16, two);
}

/* The tile's K: rows in place (BF16), or the packed hi and lo parts of
 * the tile's packed copy t (amx_packed). */
static void amx_scores(blk_ctx *c, const uint16_t *t) {
  const int64_t D = c->a->r->head_dim;
  const char *kp[2] = {c->kt, c->kt};
  int64_t ldk = c->kstep * 2;
  if (c->amx16) {
    kp[0] = (const char *)(t + 2 * D * BK);
    kp[1] = (const char *)(t + 3 * D * BK);
    ldk = D * 2;
  }
  for (int kr = 0; kr < BK / 16; kr += 2)
    for (int v = 0; v < c->nv; v += 2)
      amx_scores22(c, kp, ldk, kr, v, v + 1 < c->nv);
}

/* Oᵀ rows db·16 .. db·16+31 × lanes v·16 .. (nc 1 or 2 vectors) += Vᵀ · P
 * pairs over the pending tiles: slot g's Vᵀ at c->vslot[g] ([d][BK] BF16),
 * its P pairs at amx_pslot (a part per term). */
static void amx_values22(blk_ctx *c, int64_t db, int v, bool two) {
  float *o = c->ot + db * 16 * BQ + v * 16;
  if (c->ot_zero) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  } else {
    amx_load22(o, two);
  }
  const int64_t D = c->a->r->head_dim;
  for (int g = c->pbase; g < c->pbase + c->npend; g++)
    for (int t = 0; t < amx_nterms(c); t++) {
      const uint16_t *vt = c->vslot[g] + amx_terms[t][0] * D * BK + db * 16 * BK;
      const uint32_t *pp = amx_pslot(c, g, amx_terms[t][1]) + v * 16;
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
  amx_store22(o, two);
}

/* Oᵀ's memory zeroed for a path that reads it (a VDPBF16PS tile, O's rows)
 * while no P·V has written it: an amx block starts from zero tiles instead
 * (amx_values22), without a pass over Oᵀ (32 KiB at D128), nor a rescale of
 * it when the first tiles move the max. */
static inline void amx_ot_touch(blk_ctx *c) {
  if (!c->ot_zero)
    return;
  memset(c->ot, 0, (size_t)(c->a->r->head_dim * BQ) * sizeof *c->ot);
  c->ot_zero = false;
}

/* Oᵀ += the pending tiles' products, which share one reference max: a
 * longer sum per accumulator tile loaded and stored. */
static void amx_flush(blk_ctx *c) {
  const int64_t D = c->a->r->head_dim, vw = attn__flash_v_width(c->a->r);
  if (c->npend) {
    if (c->ot_zero && vw < D) /* rows no P·V writes */
      memset(c->ot + vw * BQ, 0, (size_t)((D - vw) * BQ) * sizeof *c->ot);
    for (int64_t db = 0; db < vw / 16; db += 2)
      for (int v = 0; v < c->nv; v += 2)
        amx_values22(c, db, v, v + 1 < c->nv);
    c->ot_zero = false;
  }
  c->pbase += c->npend;
  c->npend = 0;
}

/* ---- V transposed -------------------------------------------------------- */

/* The tile's Vᵀ for slot `slot`: its packed copy t (amx_packed), or,
 * without one, transposed into the slot's place in the V workspace. */
static void amx_slot_v(blk_ctx *c, int slot, const uint16_t *t) {
  const int64_t D = c->a->r->head_dim;
  if ((c->vslot[slot] = t))
    return;
  uint16_t *dst = (uint16_t *)c->vb + slot * D * BK;
  amx_transpose64(c->vt, (size_t)c->vstep * 2, attn__flash_v_width(c->a->r), dst, BK);
  c->vslot[slot] = dst;
}

/* ---- softmax ------------------------------------------------------------- */

/* One vector of lanes given the tile's raw max mx: the scaled max (sc >
 * 0) into the true max; returns the lanes whose reference max must move,
 * those it passes by more than the slack. */
static __mmask16 amx_track(blk_ctx *c, int v, float sc, vf mx, vf *mtrue) {
  float *mt = amx_mtrue(c) + v * VL;
  *mtrue = vmax(vload(mt), vmul(mx, vset1(sc)));
  vstore(mt, *mtrue);
  return _mm512_cmp_ps_mask(*mtrue, vadd(vload(c->m + v * VL), vset1(AMX_SLACK)), _CMP_GT_OQ);
}

/* amx_track, then those lanes' reference moved: alpha, and the reference
 * the exponents subtract (mu). */
static vf amx_ref(blk_ctx *c, int v, float sc, vf mx, vf *pref) {
  vf mtrue;
  const __mmask16 up = amx_track(c, v, sc, mx, &mtrue);
  const vf mo = vload(c->m + v * VL);
  const vf mn = _mm512_mask_blend_ps(up, mo, mtrue);
  const vf mu = vmax(mn, vset1(-FLT_MAX)); /* no -inf - -inf */
  const vf al = _mm512_mask_blend_ps(up, vset1(1.0f), vexp2(vsub(mo, mu)));
  vstore(c->m + v * VL, mn);
  vstore(c->alpha + v * VL, al);
  *pref = mu;
  return al;
}

/* The tile's raw max per lane of vector v, in a pass of its own. */
static vf amx_max(const blk_ctx *c, int v) {
  vf m4[4] = {vset1(-INFINITY), vset1(-INFINITY), vset1(-INFINITY), vset1(-INFINITY)};
  for (int64_t j = 0; j < BK; j += 4) /* four chains: vmaxps's latency, not its rate */
    UNROLL for (int u = 0; u < 4; u++) m4[u] = vmax(m4[u], vload(c->st + (j + u) * BQ + v * VL));
  return vmax(vmax(m4[0], m4[1]), vmax(m4[2], m4[3]));
}

/* Part `part` of `parts` of the next tile's operands. A packed tile (Vᵀ,
 * 16 KiB at D128; F16's four parts) into L2: P·V reads each waiting
 * slot's Vᵀ in 4 KiB pieces a page apart, which the hardware prefetcher
 * does not follow, and stalled on L3. Its K is then left to the hardware:
 * prefetched too, into L1 or L2, it measured no faster (nor did a K tile
 * kept hot on purpose). Unpacked rows: K into L1, where the scores stalled
 * on their first tile loads without it, and V into L2. */
static inline void amx_prefetch(const blk_ctx *c, int64_t part, int64_t parts) {
  const size_t row = (size_t)c->a->r->head_dim * 2;
  if (c->pvt) {
    const char *v = (const char *)c->pvt;
    const size_t n = (size_t)attn__flash_pack_words(c->a->r) * 2;
    for (size_t b = (size_t)part * n / (size_t)parts; b < (size_t)(part + 1) * n / (size_t)parts;
         b += 64)
      _mm_prefetch(v + b, _MM_HINT_T1);
    return;
  }
  for (int64_t j = part * c->pn / parts; j < (part + 1) * c->pn / parts; j++)
    for (size_t b = 0; b < row; b += 64) {
      _mm_prefetch(c->pk + (size_t)(j * c->pks) * 2 + b, _MM_HINT_T0);
      _mm_prefetch(c->pv + (size_t)(j * c->pvs) * 2 + b, _MM_HINT_T1);
    }
}

/* 2^x for P rounded to BF16 (relative precision 2^-9): 2^f on f = x −
 * floor(x) in [0, 1) (one VREDUCEPS) by a degree-4 polynomial fitted for
 * relative error (3.0e-6 in F32 arithmetic, against simd.h's 1.2e-7 at
 * degree 6), times 2^floor(x) (VSCALEFPS floors by itself). Neither needs
 * a clamp: VREDUCEPS gives 0 for ±inf and for every |x| >= 2^23, so x =
 * -inf (a masked score) and any finite x below -150 give exactly 0, as
 * vexp2 does. 6 operations instead of vexp2's 11: the softmax is most of
 * the amx kernel's vector work. l sums the same values, so m, l and lse
 * keep that 3e-6. */
static inline vf amx_exp2(vf x) {
  const vf f = _mm512_reduce_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  vf p = vfma(vset1(0.0134266844f), f, vset1(0.0522424739f));
  p = vfma(p, f, vset1(0.241280205f));
  p = vfma(p, f, vset1(0.693044845f));
  p = vfma(p, f, vset1(1.0f));
  return _mm512_scalef_ps(p, x);
}

/* P = 2^(sc·s − mu) for vector v's lanes of the tile, packed as BF16 key
 * pairs in slot `slot` of c->kb ([BK/2][BQ] words, as dp_pack_p lays them
 * out); returns their sum, and the raw scores' max in *mx when asked.
 * f16 and mx constant in each caller's copy (amx_exp_pass): the loop then
 * tests neither, nor the prefetch's turn, on each key pair. */
INLINE vf amx_exp_pass_as(blk_ctx *c, int v, float sc, vf mu, int slot, vf *mx, const bool f16) {
  const __m512i idx = amx_pair_idx();
  uint32_t *pp = amx_pslot(c, slot, 0), *pl = amx_pslot(c, slot, 1);
  const vf scv = vset1(sc);
  vf sum0 = vset1(0.0f), sum1 = vset1(0.0f), mx0 = vset1(-INFINITY), mx1 = mx0;
  for (int64_t j8 = 0; j8 < BK / 2; j8 += 8) {
    amx_prefetch(c, v * 4 + j8 / 8, c->nv * 4); /* the next tile's, over the exponentials */
    for (int64_t jp = j8; jp < j8 + 8; jp++) {
      const float *s = c->st + 2 * jp * BQ + v * VL;
      const vf s0 = vload(s), s1 = vload(s + BQ);
      if (mx) {
        mx0 = vmax(mx0, s0);
        mx1 = vmax(mx1, s1);
      }
      const vf x0 = _mm512_fmsub_ps(s0, scv, mu), x1 = _mm512_fmsub_ps(s1, scv, mu);
      vf p0 = f16 ? vexp2(x0) : amx_exp2(x0), p1 = f16 ? vexp2(x1) : amx_exp2(x1);
      sum0 = vadd(sum0, p0);
      sum1 = vadd(sum1, p1);
      if (f16) { /* hi truncated (exact in BF16), lo the rest, rounded */
        const __m512i hm = _mm512_set1_epi32((int)0xffff0000u);
        const vf h0 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(p0), hm));
        const vf h1 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(p1), hm));
        const __m512i w = (__m512i)_mm512_cvtne2ps_pbh(vsub(p1, h1), vsub(p0, h0));
        _mm512_storeu_si512(pl + jp * BQ + v * VL, _mm512_permutexvar_epi16(idx, w));
        p0 = h0;
        p1 = h1;
      }
      const __m512i w = (__m512i)_mm512_cvtne2ps_pbh(p1, p0);
      _mm512_storeu_si512(pp + jp * BQ + v * VL, _mm512_permutexvar_epi16(idx, w));
    }
  }
  if (mx)
    *mx = vmax(mx0, mx1);
  return vadd(sum0, sum1);
}

static vf amx_exp_pass(blk_ctx *c, int v, float sc, vf mu, int slot, vf *mx) {
  if (c->amx16)
    return mx ? amx_exp_pass_as(c, v, sc, mu, slot, mx, true)
              : amx_exp_pass_as(c, v, sc, mu, slot, NULL, true);
  return mx ? amx_exp_pass_as(c, v, sc, mu, slot, mx, false)
            : amx_exp_pass_as(c, v, sc, mu, slot, NULL, false);
}

/* The whole tile's softmax into slot `slot`, summed into l. A vector of
 * lanes whose reference maxima are all set takes one pass, exponents
 * relative to them and the max found on the way; only when a lane's
 * reference must move (rare past a block's first tiles) is it redone from
 * a max pass, as a lane with no reference yet always is. Either way the
 * bits are those of the two passes. Returns whether any reference moved. */
static bool amx_softmax(blk_ctx *c, float sc, int slot) {
  bool moved = false;
  for (int v = 0; v < c->nv; v++) {
    const vf mo = vload(c->m + v * VL);
    vf mu, mx, mtrue;
    if (_mm512_cmp_ps_mask(mo, vset1(-INFINITY), _CMP_EQ_OQ) == 0) {
      const vf sum = amx_exp_pass(c, v, sc, mo, slot, &mx);
      if (!amx_track(c, v, sc, mx, &mtrue)) {
        vstore(c->l + v * VL, vadd(vload(c->l + v * VL), sum));
        vstore(c->alpha + v * VL, vset1(1.0f));
        continue;
      }
    }
    const vf al = amx_ref(c, v, sc, amx_max(c, v), &mu);
    moved |= _mm512_cmp_ps_mask(al, vset1(1.0f), _CMP_NEQ_UQ) != 0;
    const vf sum = amx_exp_pass(c, v, sc, mu, slot, NULL);
    vstore(c->l + v * VL, vfma(vload(c->l + v * VL), al, sum));
  }
  return moved;
}

/* mask_tile on vectors: key j0 + jj hides from lane ii (query position
 * i0 + ii % nq) outside j − off − wr <= i <= j − off + wl; the bounds are
 * taken relative to i0, clamped to 32 bits (a lane position is under BQ). */
static void amx_mask(blk_ctx *c, int64_t j0) {
  const attn__flash_args *a = c->a;
  const int64_t i0 = c->blk->i0, nq = c->blk->nq;
  int32_t pos[BQ];
  for (int64_t ii = 0; ii < BQ; ii++)
    pos[ii] = (int32_t)(ii % nq);
  for (int64_t jj = 0; jj < BK; jj++) {
    const int64_t j = j0 + jj - a->off - i0;
    int64_t lo = a->wr < 0 ? -1 : j - a->wr, hi = a->wl < 0 ? BQ : j + a->wl;
    lo = lo < -1 ? -1 : lo > BQ ? BQ : lo;
    hi = hi < -1 ? -1 : hi > BQ ? BQ : hi;
    const __m512i vlo = _mm512_set1_epi32((int)lo), vhi = _mm512_set1_epi32((int)hi);
    for (int v = 0; v < c->nv; v++) {
      const __m512i p = _mm512_loadu_si512(pos + v * VL);
      const __mmask16 out = _mm512_cmplt_epi32_mask(p, vlo) | _mm512_cmpgt_epi32_mask(p, vhi);
      float *s = c->st + jj * BQ + v * VL;
      vstore(s, _mm512_mask_mov_ps(vload(s), out, vset1(-INFINITY)));
    }
  }
}

/* One tile at c->kt, c->vt (keys j0 .. j0 + nkt, nkt < BK only for F16's
 * padded tiles): flash.c's tile_step for AMX.
 * Variants and a scale <= 0 need the scaled scores: they get a scale pass
 * and the softmax a factor of 1. */
static void amx_step(blk_ctx *c, int64_t j0, int64_t nkt, bool full) {
  const attn__flash_args *a = c->a;
  float sc = a->scale2;
  const uint16_t *packed = amx_packed(c, j0);
  c->pvt = c->pn ? amx_packed(c, j0 + BK) : NULL;
  amx_scores(c, packed);
  if (a->var.on || !(sc > 0)) {
    for (int64_t j = 0; j < BK; j++)
      for (int v = 0; v < c->nv; v++)
        vstore(c->st + j * BQ + v * VL, vmul(vload(c->st + j * BQ + v * VL), vset1(sc)));
    if (a->var.on)
      variant_tile(c, j0, BK);
    sc = 1.0f;
  }
  if (!full)
    amx_mask(c, j0);
  for (int64_t j = nkt; j < BK; j++) /* an F16 tile's padding keys, after the variants */
    for (int v = 0; v < c->nv; v++)
      vstore(c->st + j * BQ + v * VL, vset1(-INFINITY));
  const int used = c->pbase + c->npend;
  if (used == amx_slots(c) || (used >= amx_vfit(c) && !packed)) {
    amx_flush(c);
    c->pbase = 0;
  }
  const int slot = c->pbase + c->npend;
  if (amx_softmax(c, sc, slot)) { /* the pending tiles are relative to the old max */
    amx_flush(c);
    if (!c->ot_zero) /* a block's first tiles: nothing to rescale yet */
      scale_ot(c, c->alpha);
  }
  amx_slot_v(c, slot, packed);
  c->npend++;
}

/* O as rows in the V workspace for finish_block: Oᵀ's 16×16 blocks
 * transposed, instead of a gather of strided lanes per row. */
static void amx_o_rows(blk_ctx *c) {
  const int64_t D = c->a->r->head_dim;
  for (int v = 0; v < c->nv; v++) /* every lane's row: the V workspace holds BQ of them */
    vcols16_to_rows(c->ot, BQ, D, v * VL, c->vb + v * VL * D, D);
  c->orows = c->vb;
}

/* l and m from the reference max to the true one (a lane whose max stayed
 * within the slack, or that a VDPBF16PS tile moved), then the tile
 * registers back (unless a block in lockstep with it still runs). O owes the same factor:
 * finish_block applies it with the normalization (c->ofac), instead of a pass over Oᵀ here. */
static void amx_end(blk_ctx *c) {
  if (!c->amx)
    return;
  amx_flush(c);
  const float *mt = amx_mtrue(c);
  for (int v = 0; v < c->nv; v++) {
    const vf mo = vload(c->m + v * VL), mn = vmax(vload(mt + v * VL), mo);
    const vf f = vexp2(vsub(mo, vmax(mn, vset1(-FLT_MAX))));
    vstore(c->m + v * VL, mn);
    vstore(c->l + v * VL, vmul(vload(c->l + v * VL), f));
    vstore(c->alpha + v * VL, f);
  }
  c->ofac = c->alpha;
  amx_ot_touch(c);
  amx_o_rows(c);
  if (!c->keep_tiles)
    _tile_release();
}

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
static inline void amx_ot_touch(blk_ctx *c) { (void)c; }
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
#endif

#endif
