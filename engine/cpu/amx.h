/*
 * amx.h — what the forward's and the backward's AMX-BF16 kernels share
 * (flash_amx.h for flash.c, flash_bwd_amx.h for flash_bwd.c): the one tile
 * configuration, and the transpose in vector registers (simd.h's
 * vtranspose16) that builds their transposed BF16 operands.
 *
 * Every tile register is 16 rows × 64 bytes, all eight in use:
 *   tmm0-3  F32 accumulators (16×16), a 2×2 block of the product;
 *   tmm4-5  A operands, 16 rows of 32 BF16;
 *   tmm6-7  B operands, 16 rows of 16 BF16 pairs.
 * TDPBF16PS computes C[m][n] += Σ_k A[m][2k]·B[k][2n] + A[m][2k+1]·B[k][2n+1]:
 * A holds the reduction along its rows, B in pairs ("VNNI" layout), one
 * 32-bit word per output column. The kernels use only _tile_loadconfig,
 * _tile_release, _tile_zero, _tile_loadd, _tile_stream_loadd, _tile_stored
 * and _tile_dpbf16ps (the unit tests emulate exactly these). The process
 * must hold the XTILEDATA permission (cpu.c asks for it before choosing the
 * amx instance), and a thread configures the tiles before its first use.
 */
#ifndef ATTN_CPU_AMX_H
#define ATTN_CPU_AMX_H

/* The LDTILECFG memory layout (palette 1). */
typedef struct amx_cfg {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} amx_cfg;

/* All eight tiles 16 rows × 64 bytes. */
static void amx_configure(void) {
  amx_cfg cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.palette = 1;
  for (int t = 0; t < 8; t++) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  /* GCC 12's _tile_loadconfig tells the compiler it reads 8 bytes of cfg
   * (an "m" operand of pointer size), so the stores to colsb and rows may
   * be dropped as dead, and were once the caller inlined this: ldtilecfg
   * then loaded garbage and faulted. The empty asm reads the whole struct. */
  __asm__ volatile("" : : "m"(cfg));
  _tile_loadconfig(&cfg);
}

/* The word permutation that interleaves the low and the high 16 BF16 of a
 * register: [a0..a15, b0..b15] → [a0, b0, a1, b1, ...], i.e. two rows (as
 * _mm512_cvtne2ps_pbh or two 256-bit loads leave them) into 16 pairs. */
static inline __m512i amx_pair_idx(void) {
  return _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22,
                          6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
}

/* 64 rows of D BF16 at src (`step` bytes apart) transposed: dst[d·ld + r]
 * = row r's element d. Rows 2p and 2p+1 of a group of 32 become one
 * register of 16 pairs (a word per element); the 16×16 transpose then
 * makes each register one element's 16 pairs, i.e. its 32 rows in order.
 * D a multiple of 16. */
static void amx_transpose64(const char *src, size_t step, int64_t D, uint16_t *dst, int64_t ld) {
  const __m512i il = amx_pair_idx();
  for (int jb = 0; jb < 2; jb++)
    for (int64_t d0 = 0; d0 < D; d0 += 16) {
      __m512i x[16];
      const char *r0 = src + (size_t)(32 * jb) * step + 2 * (size_t)d0;
      for (int p = 0; p < 16; p++, r0 += 2 * step) {
        const __m512i two =
            _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)r0)),
                               _mm256_loadu_si256((const __m256i *)(r0 + step)), 1);
        x[p] = _mm512_permutexvar_epi16(il, two);
      }
      vtranspose16(x);
      for (int d = 0; d < 16; d++)
        _mm512_storeu_si512(dst + (d0 + d) * ld + 32 * jb, x[d]);
    }
}

#endif
