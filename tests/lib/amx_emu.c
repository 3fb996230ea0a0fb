/* amx_emu.c — the tile instructions of amx_emu.h, in C, with the checks it lists. */
#include "amx_emu.h"

#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Palette 1: eight tiles of at most 16 rows of 64 bytes. */
enum { NTILES = 8, MAX_ROWS = 16, MAX_COLSB = 64 };

/* LDTILECFG's 64 bytes (the SDM's layout, as flash_amx.h's amx_cfg). */
typedef struct tamx_cfg {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} tamx_cfg;
_Static_assert(sizeof(tamx_cfg) == 64, "LDTILECFG reads 64 bytes");

/* One thread's tile unit, as the real one keeps per thread (XSAVE state). */
typedef struct tamx_unit {
  bool configured;
  tamx_cfg cfg;
  uint8_t tile[NTILES][MAX_ROWS][MAX_COLSB];
} tamx_unit;

static _Thread_local tamx_unit unit;
static atomic_int_fast64_t dp_count;

__attribute__((format(printf, 1, 2), noreturn)) static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "amx emulation: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, " (the real unit would fault or compute garbage)\n");
  va_end(ap);
  abort();
}

/* Tile t of the current config, which must exist and give it a shape. */
static void need_tile(const char *insn, int t) {
  if (!unit.configured)
    die("%s on tmm%d before any LDTILECFG (or after TILERELEASE)", insn, t);
  if (t < 0 || t >= NTILES)
    die("%s on tmm%d: palette 1 has tiles 0..%d", insn, t, NTILES - 1);
  if (unit.cfg.rows[t] == 0)
    die("%s on tmm%d, which the config leaves unconfigured (rows 0, colsb 0)", insn, t);
}

/* What LDTILECFG refuses with #GP for palette 1. */
static void check_cfg(const tamx_cfg *c) {
  if (c->palette != 1)
    die("LDTILECFG with palette %u: this kernel's unit has palette 1 only", c->palette);
  if (c->start_row != 0)
    die("LDTILECFG with start_row %u: only an interrupted instruction restarts there",
        c->start_row);
  for (int i = 0; i < 14; i++)
    if (c->reserved[i])
      die("LDTILECFG with reserved byte %d set (%u)", 2 + i, c->reserved[i]);
  for (int t = 0; t < 16; t++) {
    if (t >= NTILES && (c->rows[t] || c->colsb[t]))
      die("LDTILECFG configures tmm%d (rows %u, colsb %u): palette 1 has %d tiles", t, c->rows[t],
          c->colsb[t], NTILES);
    if (c->rows[t] > MAX_ROWS || c->colsb[t] > MAX_COLSB)
      die("LDTILECFG gives tmm%d %u rows of %u bytes: at most %d of %d", t, c->rows[t], c->colsb[t],
          MAX_ROWS, MAX_COLSB);
    if ((c->rows[t] == 0) != (c->colsb[t] == 0))
      die("LDTILECFG gives tmm%d rows %u and colsb %u: both zero or neither", t, c->rows[t],
          c->colsb[t]);
  }
}

void tamx_loadconfig(const void *cfg) {
  if (!cfg)
    die("LDTILECFG from a null pointer");
  tamx_cfg c;
  memcpy(&c, cfg, sizeof c);
  memset(&unit, 0, sizeof unit); /* a new config zeroes every tile */
  if (c.palette == 0)            /* palette 0: the same as TILERELEASE */
    return;
  check_cfg(&c);
  unit.cfg = c;
  unit.configured = true;
}

void tamx_storeconfig(void *cfg) {
  if (!cfg)
    die("STTILECFG to a null pointer");
  tamx_cfg c;
  memset(&c, 0, sizeof c); /* unconfigured: 64 zero bytes */
  if (unit.configured)
    c = unit.cfg;
  memcpy(cfg, &c, sizeof c);
}

void tamx_release(void) { memset(&unit, 0, sizeof unit); }

void tamx_zero(int t) {
  need_tile("TILEZERO", t);
  memset(unit.tile[t], 0, sizeof unit.tile[t]);
}

/* The configured rows × colsb bytes from base, rows stride bytes apart; the
 * rest of the tile becomes zero, as on the unit. */
void tamx_loadd(int t, const void *base, long stride) {
  need_tile("TILELOADD", t);
  if (!base)
    die("TILELOADD tmm%d from a null pointer", t);
  const int rows = unit.cfg.rows[t], colsb = unit.cfg.colsb[t];
  memset(unit.tile[t], 0, sizeof unit.tile[t]);
  for (int m = 0; m < rows; m++)
    memcpy(unit.tile[t][m], (const char *)base + (long)m * stride, (size_t)colsb);
}

void tamx_stored(int t, void *base, long stride) {
  need_tile("TILESTORED", t);
  if (!base)
    die("TILESTORED tmm%d to a null pointer", t);
  const int rows = unit.cfg.rows[t], colsb = unit.cfg.colsb[t];
  if (rows > 1 && labs(stride) < colsb)
    die("TILESTORED tmm%d with stride %ld: its rows of %d bytes overlap", t, stride, colsb);
  for (int m = 0; m < rows; m++)
    memcpy((char *)base + (long)m * stride, unit.tile[t][m], (size_t)colsb);
}

/* What TDPBF16PS refuses with #UD (the SDM's AMX-E4 list). */
static void check_dp(int c, int a, int b) {
  need_tile("TDPBF16PS (C)", c);
  need_tile("TDPBF16PS (A)", a);
  need_tile("TDPBF16PS (B)", b);
  if (c == a || c == b || a == b)
    die("TDPBF16PS tmm%d, tmm%d, tmm%d: the three operands must be distinct tiles", c, a, b);
  const tamx_cfg *g = &unit.cfg;
  if (g->colsb[c] % 4 || g->colsb[a] % 4 || g->colsb[b] % 4)
    die("TDPBF16PS with colsb %u, %u, %u (C, A, B): each must hold whole F32 or BF16 pairs",
        g->colsb[c], g->colsb[a], g->colsb[b]);
  if (g->colsb[a] / 4 != g->rows[b])
    die("TDPBF16PS: A (tmm%d) has %u pairs a row but B (tmm%d) has %u rows", a, g->colsb[a] / 4, b,
        g->rows[b]);
  if (g->rows[c] != g->rows[a])
    die("TDPBF16PS: C (tmm%d) has %u rows but A (tmm%d) %u", c, g->rows[c], a, g->rows[a]);
  if (g->colsb[c] != g->colsb[b])
    die("TDPBF16PS: C (tmm%d) has %u bytes a row but B (tmm%d) %u", c, g->colsb[c], b, g->colsb[b]);
}

/* A BF16 element as F32, denormals read as zero. */
static float bf16_daz(const uint8_t *p) {
  uint16_t h;
  memcpy(&h, p, 2);
  uint32_t u = (h & 0x7f80u) ? (uint32_t)h << 16 : (uint32_t)(h & 0x8000u) << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static float ftz(float x) { return fpclassify(x) == FP_SUBNORMAL ? copysignf(0.0f, x) : x; }

void tamx_dpbf16ps(int c, int a, int b) {
  check_dp(c, a, b);
  atomic_fetch_add_explicit(&dp_count, 1, memory_order_relaxed);
  const int rows = unit.cfg.rows[c], n_out = unit.cfg.colsb[c] / 4, k_pairs = unit.cfg.colsb[a] / 4;
  for (int m = 0; m < rows; m++)
    for (int n = 0; n < n_out; n++) {
      float acc;
      memcpy(&acc, unit.tile[c][m] + 4 * n, 4);
      for (int k = 0; k < k_pairs; k++) {
        /* BF16 × BF16 is exact in F32: each step rounds once */
        acc = ftz(acc + bf16_daz(unit.tile[a][m] + 4 * k) * bf16_daz(unit.tile[b][k] + 4 * n));
        acc = ftz(acc +
                  bf16_daz(unit.tile[a][m] + 4 * k + 2) * bf16_daz(unit.tile[b][k] + 4 * n + 2));
      }
      memcpy(unit.tile[c][m] + 4 * n, &acc, 4);
    }
}

int64_t tamx_dpbf16ps_count(void) {
  return (int64_t)atomic_load_explicit(&dp_count, memory_order_relaxed);
}
