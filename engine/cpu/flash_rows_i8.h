/*
 * flash_rows_i8.h — a decode step over I8 pages under a BF16 request, in
 * BF16 and 16-bit integer products: the ri_* half of flash_rows.h's
 * few-rows path, on the avx512bf16 and amx instances.
 *
 * Included by flash_rows.h, after rf_reduce and rf_key_scales, which it
 * shares; the rest of the step (masks, variants, the softmax on the score
 * tile, the split merge) is the rf_* path's.
 *
 * Why: widening each code to F32 takes two instructions per 16 codes and
 * then an F32 FMA per query head per 16 products, so a decode step over I8
 * pages did more arithmetic than one over BF16 pages (a VDPBF16PS per 32
 * products) and lost much of what reading half the bytes gained. Here:
 *
 *  - Q·K: a code is converted to BF16, exactly (|code| <= 128 has 8
 *    significant bits), 32 at a time, once for the GQA group's heads; the
 *    BF16 Q rows are the request's own, unscaled. So the products are
 *    exact and summed in F32 as on BF16 pages (VDPBF16PS), and the scores,
 *    and with them m and l, are as accurate as F32 inputs' ([m, l] within
 *    1e-5). Score = the sum × the softmax scale × the key's scale.
 *  - P·V: after the softmax, each row's weights P·(V row scale) are
 *    rounded to 16 bits against the tile's largest weight of that row (an
 *    error of at most 2^-16 of it per weight, where BF16 products round P
 *    to 2^-9 of itself), and two keys' V codes, widened to 16 bits, are
 *    interleaved (vpunpck*wd) so that one VPDPWSSD adds 32 products of
 *    both keys, exactly, in 32-bit lanes (at most 64 keys × 32767 × 128 <
 *    2^31). Each tile's sums times the weights' scale are added to O in
 *    F32. Interleaving leaves each 32-element group of an O row with its
 *    128-bit lanes out of order, which ri_end undoes once.
 *
 * F16 and F32 requests keep the F32 products: their Q rows are not BF16,
 * and an F32 request's tolerance is F32's.
 */
#ifndef ATTN_CPU_FLASH_ROWS_I8_H
#define ATTN_CPU_FLASH_ROWS_I8_H

#if ATTN_DPBF16 || ATTN_AMX
/* Whether the block's decode step over quantized pages takes this path
 * (after rf_quant set c->incodes). */
static inline bool ri_ok(const blk_ctx *c) {
  return c->incodes && c->a->r->kv_quant == ATTN_KVQ_I8 && c->a->r->dtype == ATTN_BF16;
}

/* head_dim rounded up to the 32 codes one widening takes: the stride of
 * the BF16 Q rows and of the O rows (zero past D). */
static inline int64_t ri_d32(int64_t D) { return (D + 31) / 32 * 32; }

/* 32 codes at p as 16-bit lanes; of the row's last group when D % 32 is
 * 16, only 16 (the rest 0, never read past the row). */
INLINE __m512i ri_widen(const char *p, const bool half) {
  const __m256i b = half ? _mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)p))
                         : _mm256_loadu_si256((const __m256i *)p);
  return _mm512_cvtepi8_epi16(b);
}

/* 32 codes at p as BF16, exactly (|code| <= 128 has 8 significant bits),
 * in order; of a half group, 16. */
INLINE __m512i ri_bf16(const char *p, const bool half) {
  const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
  const __m512 hi =
      half ? _mm512_setzero_ps()
           : _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p + 16))));
  return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

/* acc += the BF16 Q rows' group at d times those of RF_KEYS keys. */
INLINE void ri_qk(const blk_ctx *c, const char *kp, int64_t ldk, int64_t nk, int64_t d,
                  __m512 acc[RF_MAX * RF_KEYS], const bool half) {
  const uint16_t *q = (const uint16_t *)c->kq;
  const int64_t D32 = ri_d32(c->a->r->head_dim);
  __m512i k[RF_KEYS];
  UNROLL for (int jj = 0; jj < RF_KEYS; jj++) k[jj] =
      jj < nk ? ri_bf16(kp + jj * ldk + d, half) : _mm512_setzero_si512();
  UNROLL for (int ii = 0; ii < RF_MAX; ii++) {
    const __m512i qv = _mm512_loadu_si512(q + ii * D32 + d);
    UNROLL for (int jj = 0; jj < RF_KEYS; jj++) acc[ii * RF_KEYS + jj] =
        _mm512_dpbf16_ps(acc[ii * RF_KEYS + jj], (__m512bh)k[jj], (__m512bh)qv);
  }
}

/* rf_scores4 on BF16 products: scores of RF_KEYS keys (nk real) into st
 * rows j..j+nk, times the softmax scale and the keys' scales. */
INLINE void ri_scores4(const blk_ctx *c, const char *kp, int64_t ldk, int64_t j, int64_t nk) {
  const int64_t D = c->a->r->head_dim;
  __m512 acc[RF_MAX * RF_KEYS];
  UNROLL for (int n = 0; n < RF_MAX * RF_KEYS; n++) acc[n] = _mm512_setzero_ps();
  int64_t d = 0;
  for (; d + 32 <= D; d += 32)
    ri_qk(c, kp, ldk, nk, d, acc, false);
  if (d < D)
    ri_qk(c, kp, ldk, nk, d, acc, true);
  const __m512 s =
      vmul(vmul(rf_reduce(acc), vset1(c->a->scale2)), rf_key_scales(c->ksc + j, nk, ATTN_KVQ_I8));
  UNROLL for (int jj = 0; jj < RF_KEYS; jj++) if (jj < nk)
      _mm_storeu_ps(c->st + (j + jj) * BQ, _mm512_extractf32x4_ps(s, jj));
}

static void ri_scores(blk_ctx *c, int64_t nkt) {
  const int64_t parts = (nkt + RF_KEYS - 1) / RF_KEYS;
  for (int64_t j = 0; j < nkt; j += RF_KEYS) {
    prefetch_next(c, j / RF_KEYS, parts);
    ri_scores4(c, c->kt + j * c->kstep, c->kstep, j, nkt - j < RF_KEYS ? nkt - j : RF_KEYS);
  }
}

/* The tile's weights (st: P times the V rows' scales, as rf_values left
 * them) per row as 16-bit pairs of keys (2i, 2i+1) at vq ([pair][RF_MAX]
 * int32, a missing odd key 0), and each row's weight scale into ws. */
static void ri_weights(blk_ctx *c, int64_t nkt, float ws[RF_MAX]) {
  __m128 mx = _mm_setzero_ps();
  for (int64_t j = 0; j < nkt; j++)
    mx = _mm_max_ps(mx, _mm_loadu_ps(c->st + j * BQ));
  float m[RF_MAX], inv[RF_MAX];
  _mm_storeu_ps(m, mx);
  for (int ii = 0; ii < RF_MAX; ii++) {
    ws[ii] = m[ii] / 32767.0f;
    inv[ii] = m[ii] > 0 ? 32767.0f / m[ii] : 0.0f;
  }
  int32_t *wp = (int32_t *)c->vq;
  const __m128 iv = _mm_loadu_ps(inv);
  for (int64_t j = 0; j < nkt; j += 2) {
    const __m128i a = _mm_cvtps_epi32(_mm_mul_ps(_mm_loadu_ps(c->st + j * BQ), iv));
    const __m128i b = j + 1 < nkt
                          ? _mm_cvtps_epi32(_mm_mul_ps(_mm_loadu_ps(c->st + (j + 1) * BQ), iv))
                          : _mm_setzero_si128();
    _mm_storeu_si128((__m128i *)(wp + j / 2 * RF_MAX),
                     _mm_or_si128(_mm_and_si128(a, _mm_set1_epi32(0xffff)), _mm_slli_epi32(b, 16)));
  }
}

/* O's groups g0 .. g0 + ng of 32 elements (rows D32 apart in vb, lane
 * order) = alpha·O + ws·(the tile's weights times V codes). half: the last
 * group holds 16 codes. */
INLINE void ri_values_chunk(blk_ctx *c, int64_t nkt, int64_t g0, const int nr, const int ng,
                            const bool half, const float ws[RF_MAX]) {
  const int64_t D32 = ri_d32(c->a->r->head_dim);
  const int32_t *wp = (const int32_t *)c->vq;
  __m512i acc[RF_MAX][4];
  UNROLL for (int ii = 0; ii < nr; ii++) UNROLL for (int v = 0; v < 2 * ng; v++) acc[ii][v] =
      _mm512_setzero_si512();
  const char *vr = c->vt + g0 * 32;
  for (int64_t j = 0; j < nkt; j += 2, vr += 2 * c->vstep) {
    __m512i lo[2], hi[2];
    UNROLL for (int g = 0; g < ng; g++) {
      const bool h = half && g == ng - 1;
      const __m512i x = ri_widen(vr + g * 32, h);
      const __m512i y = j + 1 < nkt ? ri_widen(vr + c->vstep + g * 32, h) : _mm512_setzero_si512();
      lo[g] = _mm512_unpacklo_epi16(x, y);
      hi[g] = _mm512_unpackhi_epi16(x, y);
    }
    UNROLL for (int ii = 0; ii < nr; ii++) {
      const __m512i w = _mm512_set1_epi32(wp[j / 2 * RF_MAX + ii]);
      UNROLL for (int g = 0; g < ng; g++) {
        acc[ii][2 * g] = _mm512_dpwssd_epi32(acc[ii][2 * g], lo[g], w);
        acc[ii][2 * g + 1] = _mm512_dpwssd_epi32(acc[ii][2 * g + 1], hi[g], w);
      }
    }
  }
  UNROLL for (int ii = 0; ii < nr; ii++) UNROLL for (int v = 0; v < 2 * ng; v++) {
    float *o = c->vb + ii * D32 + g0 * 32 + v * VL;
    vstore(o, vfma(_mm512_cvtepi32_ps(acc[ii][v]), vset1(ws[ii]),
                   vmul(vload(o), vset1(c->alpha[ii]))));
  }
}

#define RI_NG(NR)                                        \
  if (ng == 2)                                           \
    ri_values_chunk(c, nkt, g0, NR, 2, half &&last, ws); \
  else                                                   \
    ri_values_chunk(c, nkt, g0, NR, 1, half &&last, ws);

/* O rows = alpha·O rows + P·V, two groups of 32 elements at a time. */
static void ri_values(blk_ctx *c, int64_t nkt) {
  const int64_t D = c->a->r->head_dim, groups = ri_d32(D) / 32;
  const bool half = D % 32 != 0;
  float ws[RF_MAX];
  ri_weights(c, nkt, ws);
  for (int64_t g0 = 0; g0 < groups; g0 += 2) {
    const int ng = groups - g0 < 2 ? 1 : 2;
    const bool last = g0 + ng == groups;
    switch (c->nrows) {
    case 1: RI_NG(1) break;
    case 2: RI_NG(2) break;
    case 3: RI_NG(3) break;
    default: RI_NG(4) break;
    }
  }
}
#undef RI_NG

/* Instead of rf_begin's F32 Q rows: the block's BF16 Q rows, unscaled
 * (kq, D32 apart, 0 past D and for padding rows), and O's rows (vb) 0 at
 * the D32 stride. */
static void ri_begin(blk_ctx *c) {
  const attn__flash_block *blk = c->blk;
  const int64_t D = c->a->r->head_dim, D32 = ri_d32(D);
  uint16_t *q = (uint16_t *)c->kq;
  memset(q, 0, (size_t)(RF_MAX * D32) * sizeof *q);
  for (int64_t ii = 0; ii < c->nrows; ii++)
    memcpy(q + ii * D32, q_row(c, blk->h0 + ii / blk->nq, blk->i0 + ii % blk->nq),
           (size_t)D * sizeof *q);
  memset(c->vb, 0, (size_t)(c->nrows * D32) * sizeof *c->vb);
}

/* The O rows out of ri_values_chunk's lane order, into kq (the 16-bit Q
 * rows are done with) for finish_block: per group, the 128-bit lanes of
 * its low and high halves alternate (elements 8l..8l+3 are the low
 * half's lane l, 8l+4..8l+7 the high half's). */
static void ri_end(blk_ctx *c) {
  const int64_t D = c->a->r->head_dim, D32 = ri_d32(D);
  const __m512i i0 = _mm512_set_epi32(23, 22, 21, 20, 7, 6, 5, 4, 19, 18, 17, 16, 3, 2, 1, 0);
  const __m512i i1 = _mm512_set_epi32(31, 30, 29, 28, 15, 14, 13, 12, 27, 26, 25, 24, 11, 10, 9, 8);
  float *out = (float *)c->kq;
  for (int64_t ii = 0; ii < c->nrows; ii++)
    for (int64_t g = 0; g < D32; g += 32) {
      const vf lo = vload(c->vb + ii * D32 + g), hi = vload(c->vb + ii * D32 + g + VL);
      vstore(out + ii * D + g, _mm512_permutex2var_ps(lo, i0, hi));
      if (g + VL < D)
        vstore(out + ii * D + g + VL, _mm512_permutex2var_ps(lo, i1, hi));
    }
  c->orows = out;
}
#else
static inline bool ri_ok(const blk_ctx *c) {
  (void)c;
  return false;
}
static inline void ri_scores(blk_ctx *c, int64_t nkt) { (void)c, (void)nkt; }
static inline void ri_values(blk_ctx *c, int64_t nkt) { (void)c, (void)nkt; }
static inline void ri_begin(blk_ctx *c) { (void)c; }
static inline void ri_end(blk_ctx *c) { (void)c; }
#endif

#endif
