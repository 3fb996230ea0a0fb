/*
 * test_amx_emu.c — the AMX emulation itself (tests/lib/amx_emu.c), which the amx
 * kernel's tests trust: TDPBF16PS against float64 on full and partial tile shapes, stores that
 * write the configured shape and nothing past it, a config that zeroes the tiles, and every
 * misuse it must refuse
 * by aborting (palette-1 config limits, unconfigured tiles, operand shapes, null pointers,
 * overlapping stores). Plain C: it runs on every machine.
 */
#include "amx_emu.h"
#include "helpers.h"

#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <math.h>
#include <signal.h>
#include <string.h>

/* flash_amx.h's amx_cfg: LDTILECFG's 64 bytes. */
typedef struct cfg {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} cfg;

static cfg shapes(int n, const int rows[], const int colsb[]) {
  cfg c;
  memset(&c, 0, sizeof c);
  c.palette = 1;
  for (int t = 0; t < n; t++) {
    c.rows[t] = (uint8_t)rows[t];
    c.colsb[t] = (uint16_t)colsb[t];
  }
  return c;
}

/* Tiles 0, 1, 2 as C (m × n F32), A (m × k pairs), B (k × n pairs). */
static void config_cab(int m, int n, int k) {
  const int rows[] = {m, m, k}, colsb[] = {4 * n, 4 * k, 4 * n};
  cfg c = shapes(3, rows, colsb);
  tamx_loadconfig(&c);
}

static double bf(uint16_t h) { return (double)attn_load_elem(&h, ATTN_BF16, 0); }

/* C = C0 + A·B on an m × n tile over k pairs, against float64. */
static void dp_against_f64(int m, int n, int k) {
  float c[16][16], c0[16][16];
  uint16_t a[16][32], b[16][32];
  uint64_t s = (uint64_t)(m * 256 + n * 16 + k);
  for (int i = 0; i < 16; i++)
    for (int j = 0; j < 32; j++) {
      a[i][j] = attn_f32_to_bf16((float)tuniform(&s));
      b[i][j] = attn_f32_to_bf16((float)tuniform(&s));
      if (j < 16)
        c0[i][j] = (float)tuniform(&s);
    }
  config_cab(m, n, k);
  const int64_t before = tamx_dpbf16ps_count();
  tamx_loadd(0, c0, sizeof c0[0]);
  tamx_loadd(1, a, sizeof a[0]);
  tamx_loadd(2, b, sizeof b[0]);
  tamx_dpbf16ps(0, 1, 2);
  memset(c, 0x7f, sizeof c);
  tamx_stored(0, c, sizeof c[0]);
  tamx_release();
  cr_assert_eq(tamx_dpbf16ps_count(), before + 1);
  for (int i = 0; i < m; i++)
    for (int j = 0; j < n; j++) {
      double want = c0[i][j];
      for (int p = 0; p < k; p++)
        want += bf(a[i][2 * p]) * bf(b[p][2 * j]) + bf(a[i][2 * p + 1]) * bf(b[p][2 * j + 1]);
      cr_assert_lt(fabs(c[i][j] - want), 1e-5, "[%d x %d x %d] C[%d][%d] = %.9g, want %.9g", m, n,
                   k, i, j, c[i][j], want);
    }
  /* the store wrote the shape and nothing past it */
  float untouched;
  memset(&untouched, 0x7f, sizeof untouched);
  for (int i = 0; i < 16; i++)
    for (int j = 0; j < 16; j++)
      if (i >= m || j >= n)
        cr_assert(!memcmp(&c[i][j], &untouched, 4), "stored past the shape at [%d][%d]", i, j);
}

Test(amx_emu, dpbf16ps_matches_f64_full_tiles) { dp_against_f64(16, 16, 16); }

Test(amx_emu, dpbf16ps_matches_f64_partial_tiles) {
  dp_against_f64(5, 16, 16);
  dp_against_f64(16, 3, 7);
  dp_against_f64(1, 1, 1);
}

/* LDTILECFG zeroes every tile: a kernel may rely on a fresh tile being 0. */
Test(amx_emu, config_zeroes_the_tiles) {
  const int rows[] = {4, 4}, colsb[] = {8, 8};
  cfg c = shapes(2, rows, colsb);
  uint8_t src[4][8], out[4][8];
  memset(src, 0xab, sizeof src);
  tamx_loadconfig(&c);
  tamx_loadd(1, src, 8);
  tamx_loadconfig(&c);
  memset(out, 0x11, sizeof out);
  tamx_stored(1, out, 8);
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 8; j++)
      cr_assert_eq(out[i][j], 0, "a new config left tile data at [%d][%d]", i, j);
}

Test(amx_emu, zero_and_storeconfig) {
  const int rows[] = {2}, colsb[] = {8};
  cfg c = shapes(1, rows, colsb), back;
  tamx_loadconfig(&c);
  tamx_storeconfig(&back);
  cr_assert(!memcmp(&c, &back, sizeof c));
  float one[2][2] = {{1, 1}, {1, 1}}, out[2][2];
  tamx_loadd(0, one, 8);
  tamx_zero(0);
  tamx_stored(0, out, 8);
  cr_assert(out[0][0] == 0 && out[1][1] == 0);
  tamx_release();
  tamx_storeconfig(&back);
  cr_assert_eq(back.palette, 0, "released, yet a config is still stored");
}

/* ---- what must abort ------------------------------------------------------ */

#define REFUSED(name) Test(amx_emu, name, .signal = SIGABRT, .init = cr_redirect_stderr)

REFUSED(tile_use_before_config) { tamx_zero(0); }

REFUSED(tile_use_after_release) {
  config_cab(16, 16, 16);
  tamx_release();
  tamx_zero(0);
}

REFUSED(config_rows_over_16) {
  const int rows[] = {17}, colsb[] = {64};
  cfg c = shapes(1, rows, colsb);
  tamx_loadconfig(&c);
}

REFUSED(config_colsb_over_64) {
  const int rows[] = {16}, colsb[] = {68};
  cfg c = shapes(1, rows, colsb);
  tamx_loadconfig(&c);
}

REFUSED(config_rows_without_colsb) {
  const int rows[] = {16}, colsb[] = {0};
  cfg c = shapes(1, rows, colsb);
  tamx_loadconfig(&c);
}

REFUSED(config_tile_8) {
  const int rows[] = {1, 1, 1, 1, 1, 1, 1, 1, 1}, colsb[] = {4, 4, 4, 4, 4, 4, 4, 4, 4};
  cfg c = shapes(9, rows, colsb);
  tamx_loadconfig(&c);
}

REFUSED(config_palette_2) {
  cfg c = shapes(0, NULL, NULL);
  c.palette = 2;
  tamx_loadconfig(&c);
}

REFUSED(config_reserved_byte) {
  const int rows[] = {1}, colsb[] = {4};
  cfg c = shapes(1, rows, colsb);
  c.reserved[3] = 1;
  tamx_loadconfig(&c);
}

REFUSED(config_from_null) { tamx_loadconfig(NULL); }

REFUSED(unconfigured_tile) {
  config_cab(16, 16, 16);
  tamx_zero(3);
}

REFUSED(tile_past_7) {
  config_cab(16, 16, 16);
  tamx_zero(8);
}

REFUSED(load_from_null) {
  config_cab(16, 16, 16);
  tamx_loadd(1, NULL, 64);
}

REFUSED(store_to_null) {
  config_cab(16, 16, 16);
  tamx_stored(0, NULL, 64);
}

REFUSED(store_rows_overlap) {
  float out[16][16];
  config_cab(16, 16, 16);
  tamx_stored(0, out, 32);
}

/* A has 16 pairs a row, B only 8 rows. */
REFUSED(dp_a_colsb_not_b_rows) {
  const int rows[] = {16, 16, 8}, colsb[] = {64, 64, 64};
  cfg c = shapes(3, rows, colsb);
  tamx_loadconfig(&c);
  tamx_dpbf16ps(0, 1, 2);
}

REFUSED(dp_c_rows_not_a_rows) {
  const int rows[] = {8, 16, 16}, colsb[] = {64, 64, 64};
  cfg c = shapes(3, rows, colsb);
  tamx_loadconfig(&c);
  tamx_dpbf16ps(0, 1, 2);
}

REFUSED(dp_c_colsb_not_b_colsb) {
  const int rows[] = {16, 16, 16}, colsb[] = {32, 64, 64};
  cfg c = shapes(3, rows, colsb);
  tamx_loadconfig(&c);
  tamx_dpbf16ps(0, 1, 2);
}

REFUSED(dp_colsb_not_whole_pairs) {
  const int rows[] = {2, 2, 1}, colsb[] = {6, 4, 6};
  cfg c = shapes(3, rows, colsb);
  tamx_loadconfig(&c);
  tamx_dpbf16ps(0, 1, 2);
}

REFUSED(dp_operands_share_a_tile) {
  config_cab(16, 16, 16);
  tamx_dpbf16ps(0, 1, 1);
}
