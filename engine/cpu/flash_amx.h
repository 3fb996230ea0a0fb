/*
 * flash_amx.h — AMX-BF16 tiles for flash_bf16.h (the amx instance only).
 *
 * Three tile registers, all 16 rows × 64 bytes: tmm0 the F32 accumulator
 * (16×16), tmm1 the A operand (16 rows of 32 BF16), tmm2 the B operand (16
 * rows of 16 BF16 pairs). TDPBF16PS computes
 *   C[m][n] += Σ_k A[m][2k]·B[k][2n] + A[m][2k+1]·B[k][2n+1],
 * so with the layouts of flash_bf16.h:
 *   Sᵀ (16 keys × 16 queries) = K rows (A, in place) · Q pairs (B);
 *   Oᵀ (16 dims × 16 queries) += Vᵀ rows (A) · P pairs (B),
 * where a row of Vᵀ is 16 pairs of keys, i.e. the 32-bit transpose of the
 * V pairs. Accumulators go through memory (Sᵀ, Oᵀ in the workspace) each
 * time: simple rather than fast. The process must hold the XTILEDATA
 * permission (cpu.c asks for it before choosing this instance).
 */
#ifndef ATTN_CPU_FLASH_AMX_H
#define ATTN_CPU_FLASH_AMX_H

/* The LDTILECFG memory layout (palette 1). */
typedef struct amx_cfg {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} amx_cfg;

static inline bool amx_tile(const blk_ctx *c, int64_t nkt) { return c->amx && nkt == BK; }

static void amx_begin(blk_ctx *c) {
  c->amx = c->bf16dp && !c->rowwise && c->a->r->head_dim % 32 == 0;
  if (!c->amx)
    return;
  amx_cfg cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.palette = 1;
  for (int t = 0; t < 3; t++) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  _tile_loadconfig(&cfg);
}

static void amx_end(blk_ctx *c) {
  if (c->amx)
    _tile_release();
}

/* Sᵀ for a whole tile of BK keys at kp (rows ldk bytes apart). */
static void amx_scores(blk_ctx *c, const char *kp, int64_t ldk) {
  const int64_t D = c->a->r->head_dim;
  const uint32_t *qp = (const uint32_t *)c->qt;
  for (int kr = 0; kr < BK / 16; kr++)
    for (int v = 0; v < c->nv; v++) {
      _tile_zero(0);
      for (int64_t d0 = 0; d0 < D; d0 += 32) {
        _tile_loadd(1, kp + kr * 16 * ldk + d0 * 2, ldk);
        _tile_loadd(2, qp + d0 / 2 * BQ + v * 16, BQ * 4);
        _tile_dpbf16ps(0, 1, 2);
      }
      _tile_stored(0, c->st + kr * 16 * BQ + v * 16, BQ * 4);
    }
  const vf sc = vset1(c->a->scale2);
  for (int64_t j = 0; j < BK; j++)
    for (int v = 0; v < c->nv; v++)
      vstore(c->st + j * BQ + v * VL, vmul(vload(c->st + j * BQ + v * VL), sc));
}

/* Oᵀ += Vᵀ·P for a whole tile of BK keys at c->vt (P pairs packed). */
static void amx_values(blk_ctx *c) {
  const int64_t D = c->a->r->head_dim, step = c->vstep * 2;
  uint32_t *vt = (uint32_t *)c->vb; /* vt[d][jp] = (v_2jp[d], v_2jp+1[d]) */
  for (int64_t jp = 0; jp < BK / 2; jp++) {
    const char *a = c->vt + 2 * jp * step;
    for (int64_t d = 0; d < D; d++) {
      uint16_t x, y;
      memcpy(&x, a + 2 * d, 2);
      memcpy(&y, a + step + 2 * d, 2);
      vt[d * (BK / 2) + jp] = x | (uint32_t)y << 16;
    }
  }
  const uint32_t *pp = (const uint32_t *)c->kb;
  for (int64_t db = 0; db < D / 16; db++)
    for (int v = 0; v < c->nv; v++) {
      float *o = c->ot + db * 16 * BQ + v * 16;
      _tile_loadd(0, o, BQ * 4);
      for (int kc = 0; kc < BK / 32; kc++) {
        _tile_loadd(1, vt + db * 16 * (BK / 2) + kc * 16, BK / 2 * 4);
        _tile_loadd(2, pp + kc * 16 * BQ + v * 16, BQ * 4);
        _tile_dpbf16ps(0, 1, 2);
      }
      _tile_stored(0, o, BQ * 4);
    }
}

#endif
