/*
 * flash_amx_rows.h — few query rows (decoding) on AMX tiles for flash.c's
 * amx instance.
 *
 * Included by flash.c; built on flash_amx.h. A decode block of nrows <=
 * RW_MAX rows (BF16, head_dim a multiple of 32) reads each K and V element
 * once for a few products, so on VDPBF16PS (flash_bf16.h's rw_*) its
 * arithmetic was as slow as the memory it streams, and the two hardly
 * overlapped (a decode step reached half the machine's read bandwidth).
 * A TDPBF16PS costs the same whatever its shape, 16 keys × 32 elements ×
 * 16 lanes each, so here both products run on tiles with K and V rows read
 * in place, neither transposed nor paired:
 *   Sᵀ = K·Q pairs: K rows as A, Q pairs as B (amx_scores22, as wide
 *        blocks do; lanes past nrows are zero rows of Q);
 *   O += P·V: V rows as B, as they lie. A V row is 16 pairs of adjacent
 *        elements (v[2n], v[2n+1]), so a product sums the two. A's row 2r
 *        holds row r's P in the low half of each word and row 2r+1 in the
 *        high half, so C's row 2r takes the even elements of O row r and
 *        row 2r+1 the odd ones: one product per 16 keys × 32 elements.
 * O stays in that layout (ar_o: a 16 × 16 F32 tile per 32 elements of
 * head_dim) until ar_end writes it as rows. Scores and P go through the
 * transposed score tile, so masks, variants and the softmax are shared.
 * A partial tile (a window's or the keys' end) is copied zero-padded to 64
 * keys first, so no tile load reads past the keys.
 */
#ifndef ATTN_CPU_FLASH_AMX_ROWS_H
#define ATTN_CPU_FLASH_AMX_ROWS_H

#include "flash_amx.h" /* amx_prefetch, amx_scores22 */

#if ATTN_AMX
/* The few rows path's blocks, on the amx instance: all of them. */
static inline bool ar_ok(const blk_ctx *c) { return c->rowwise; }

/* O's tiles (D/32 of 16 × 16 F32) at the start of Oᵀ's workspace. */
static inline float *ar_o(const blk_ctx *c) { return c->ot; }

/* P's A tiles (BK/16 of 16 rows × 16 words) in the K workspace. */
static inline uint32_t *ar_p(const blk_ctx *c) { return (uint32_t *)c->kb; }

static void ar_begin(blk_ctx *c) {
  amx_configure();
  memset(ar_o(c), 0, (size_t)(c->a->r->head_dim / 32 * 256) * sizeof(float));
  memset(ar_p(c), 0, (size_t)(BK / 16 * 256) * sizeof(uint32_t)); /* rows past 2·nrows stay 0 */
}

/* nkt rows at src (step elements apart) into BK rows of D at dst, zero
 * past nkt. */
static void ar_pad(const char *src, int64_t step, int64_t nkt, int64_t D, uint16_t *dst) {
  for (int64_t j = 0; j < BK; j++)
    if (j < nkt)
      memcpy(dst + j * D, src + (size_t)(j * step) * 2, (size_t)D * 2);
    else
      memset(dst + j * D, 0, (size_t)D * 2);
}

/* A partial tile's K and V rows as zero-padded copies in the V workspace:
 * the tile's rows (kt, vt) from here on. */
static void ar_pad_tile(blk_ctx *c, int64_t nkt) {
  const int64_t D = c->a->r->head_dim;
  uint16_t *k = (uint16_t *)c->vb, *v = k + BK * D;
  ar_pad(c->kt, c->kstep, nkt, D, k);
  ar_pad(c->vt, c->vstep, nkt, D, v);
  c->kt = (const char *)k, c->vt = (const char *)v;
  c->kstep = c->vstep = D;
}

/*
 * The next tile's rows are prefetched in AR_PARTS parts (amx_prefetch: K
 * into L1, where the tile loads stalled on L2, V into L2), parts [from, to)
 * spread over `of` steps of a loop, this call step `at`. A decode step is
 * bound by how many lines are in flight at once (the fill buffers); in few
 * large bursts the core stalled on each and they then drained while it
 * computed, so small bursts run through the whole tile.
 */
enum { AR_PARTS = 16 };

static inline void ar_prefetch(const blk_ctx *c, int64_t at, int64_t of, int from, int to) {
  for (int64_t p = from + (to - from) * at / of; p < from + (to - from) * (at + 1) / of; p++)
    amx_prefetch(c, p, AR_PARTS);
}

/* Scores of the tile's keys times the scale, into the score tile. */
static void ar_scores(blk_ctx *c, int64_t nkt) {
  if (nkt < BK)
    ar_pad_tile(c, nkt);
  const char *const kp[2] = {c->kt, c->kt};
  const int64_t steps = (nkt + 31) / 32;
  for (int kr = 0; 16 * kr < nkt; kr += 2) {
    ar_prefetch(c, kr / 2, steps, 0, 4);
    amx_scores22(c, kp, c->kstep * 2, kr, 0, false);
  }
  const vf sc = vset1(c->a->scale2);
  for (int64_t j = 0; j < nkt; j++)
    vstore(c->st + j * BQ, vmul(vload(c->st + j * BQ), sc));
}

/* P's A tiles: for 16 keys, row 2r = row r's P (BF16, rounded as
 * dp_pack_p does) in each word's low half, row 2r+1 the same in the high
 * half; keys past nkt 0. */
static void ar_pack_p(blk_ctx *c, int64_t nkt) {
  const __m512i idx =
      _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                         _mm512_set1_epi32(BQ));
  for (int64_t kc = 0; 16 * kc < nkt; kc++) {
    ar_prefetch(c, kc, (nkt + 15) / 16, 4, 8);
    const __mmask16 live = nkt - 16 * kc >= 16 ? 0xffff : (__mmask16)((1u << (nkt - 16 * kc)) - 1);
    uint32_t *a = ar_p(c) + kc * 256;
    for (int64_t r = 0; r < c->nrows; r++) {
      const vf p = _mm512_mask_i32gather_ps(vset1(0.0f), live, idx, c->st + 16 * kc * BQ + r, 4);
      const __m512i w = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(p));
      _mm512_storeu_si512(a + 2 * r * 16, w);
      _mm512_storeu_si512(a + (2 * r + 1) * 16, _mm512_slli_epi32(w, 16));
    }
  }
}

/* O rows r times alpha[r] (rows 2r and 2r+1 of every tile), unless no
 * row's max moved. */
static void ar_rescale(blk_ctx *c) {
  if (ones(c->alpha, c->nrows))
    return;
  const int64_t nt = c->a->r->head_dim / 32;
  for (int64_t t = 0; t < nt; t++)
    for (int64_t i = 0; i < 2 * c->nrows; i++) {
      float *o = ar_o(c) + t * 256 + i * 16;
      vstore(o, vmul(vload(o), vset1(c->alpha[i / 2])));
    }
}

/* O tiles t and t+1 (one when two is false) += P·V over the tile's keys,
 * step i of n (prefetch parts 8 .. 15). */
static void ar_values2(blk_ctx *c, int64_t nkt, int64_t t, bool two, int64_t i, int64_t n) {
  const int64_t nkc = (nkt + 15) / 16;
  const int64_t ldv = c->vstep * 2;
  float *o = ar_o(c) + t * 256;
  _tile_loadd(0, o, 64);
  if (two)
    _tile_loadd(1, o + 256, 64);
  for (int64_t kc = 0; 16 * kc < nkt; kc++) {
    const char *vr = c->vt + kc * 16 * ldv + t * 64;
    ar_prefetch(c, i * nkc + kc, n * nkc, 8, AR_PARTS);
    _tile_loadd(4, ar_p(c) + kc * 256, 64);
    _tile_loadd(6, vr, ldv);
    _tile_dpbf16ps(0, 4, 6);
    if (two) {
      _tile_loadd(7, vr + 64, ldv);
      _tile_dpbf16ps(1, 4, 7);
    }
  }
  _tile_stored(0, o, 64);
  if (two)
    _tile_stored(1, o + 256, 64);
}

/* O = alpha·O + P·V, two O tiles (64 elements) at a time. */
static void ar_values(blk_ctx *c, int64_t nkt) {
  ar_rescale(c);
  ar_pack_p(c, nkt);
  const int64_t nt = c->a->r->head_dim / 32, n = (nt + 1) / 2;
  for (int64_t i = 0; i < n; i++)
    ar_values2(c, nkt, 2 * i, 2 * i + 1 < nt, i, n);
}

/* O as rows in the V workspace for finish_block (even and odd elements
 * interleaved back), and the tile registers back. */
static void ar_end(blk_ctx *c) {
  const int64_t D = c->a->r->head_dim;
  const __m512i lo = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const __m512i hi = _mm512_add_epi32(lo, _mm512_set1_epi32(8));
  for (int64_t r = 0; r < c->nrows; r++)
    for (int64_t t = 0; t < D / 32; t++) {
      const vf ev = vload(ar_o(c) + t * 256 + 2 * r * 16),
               od = vload(ar_o(c) + t * 256 + (2 * r + 1) * 16);
      vstore(c->vb + r * D + 32 * t, _mm512_permutex2var_ps(ev, lo, od));
      vstore(c->vb + r * D + 32 * t + 16, _mm512_permutex2var_ps(ev, hi, od));
    }
  c->orows = c->vb;
  _tile_release();
}
#else
/* Without the tile unit c->amxrows is always false: never called. */
static inline bool ar_ok(const blk_ctx *c) {
  (void)c;
  return false;
}
static inline void ar_begin(blk_ctx *c) { (void)c; }
static inline void ar_scores(blk_ctx *c, int64_t nkt) { (void)c, (void)nkt; }
static inline void ar_values(blk_ctx *c, int64_t nkt) { (void)c, (void)nkt; }
static inline void ar_end(blk_ctx *c) { (void)c; }
#endif

#endif
