/*
 * quant.c — a quantized session's rows (attn_kv_shape.kv_quant) as they
 * move: a row's codes followed by its F32 scale, the form a call's new
 * rows are quantized into, a replay compares with what its pages hold,
 * and saving, loading, export and import carry (file.c's spans). The page
 * keeps the codes as rows W bytes apart and the scales after them
 * (engine.h, attn_kv_quant_scales_at); rows.c's rows_put and rows_get
 * call here to go between the two.
 */
#include "kv_int.h"

#include <float.h>
#include <math.h>
#include <string.h>

size_t attn__kv_xrow(const attn_kv_shape *sh, int t) {
  const size_t cols = (size_t)attn__kv_cols(sh, t);
  return sh->kv_quant ? cols + sizeof(float) : cols * attn_dtype_size(sh->dtype);
}

void attn__kv_quantize(const attn_kv_shape *sh, int t, const void *src, int64_t n, char *dst) {
  const int64_t cols = attn__kv_cols(sh, t);
  const size_t es = attn_dtype_size(sh->dtype), xr = attn__kv_xrow(sh, t);
  for (int64_t i = 0; i < n; i++) {
    char *row = dst + (size_t)i * xr;
    float sc = attn_kv_quantize_row(sh->kv_quant, (const char *)src + (size_t)(i * cols) * es,
                                    sh->dtype, cols, (uint8_t *)row);
    memcpy(row + cols, &sc, sizeof sc);
  }
}

/* One moved row: its largest |code·scale| (bounded by qmax·scale, as the
 * stored bound is), or -1 when it is no row a quantizer writes. */
static double xrow_absmax(attn_kv_quant q, const uint8_t *row, int64_t cols) {
  float sc;
  memcpy(&sc, row + cols, sizeof sc);
  if (!(sc >= 0 && (double)sc * attn_kv_quant_max(q) <= FLT_MAX))
    return -1;
  for (int64_t k = 0; k < cols; k++)
    if ((q == ATTN_KVQ_F8_E4M3 && (row[k] & 0x7f) == 0x7f) || (sc == 0 && row[k] != 0))
      return -1;
  return (double)sc * attn_kv_quant_max(q);
}

float attn__kv_xrows_absmax(const attn_kv_shape *sh, int t, const void *rows, int64_t n,
                            int64_t *bad) {
  const int64_t cols = attn__kv_cols(sh, t);
  const size_t xr = attn__kv_xrow(sh, t);
  double mx = 0;
  for (int64_t i = 0; i < n; i++) {
    double m = xrow_absmax(sh->kv_quant, (const uint8_t *)rows + (size_t)i * xr, cols);
    if (m < 0) {
      *bad = i;
      return -1;
    }
    mx = m > mx ? m : mx;
  }
  return (float)mx;
}

void attn__kv_qput(const kv_session *ks, char *page, int64_t i, int64_t n, int t, const void *src) {
  const int64_t cols = attn__kv_cols(&ks->shape, t), W = ks->pitch;
  const size_t xr = attn__kv_xrow(&ks->shape, t);
  float *sc = (float *)(page + attn_kv_quant_scales_at(ks->page_tokens, W));
  for (int64_t r = 0; r < n; r++) {
    const char *x = (const char *)src + (size_t)r * xr;
    memcpy(page + (i + r) * W, x, (size_t)cols);
    memset(page + (i + r) * W + cols, 0, (size_t)(W - cols));
    memcpy(&sc[i + r], x + cols, sizeof(float));
  }
}

void attn__kv_qget(const kv_session *ks, const char *page, int64_t i, int64_t n, int t, void *dst) {
  const int64_t cols = attn__kv_cols(&ks->shape, t), W = ks->pitch;
  const size_t xr = attn__kv_xrow(&ks->shape, t);
  const float *sc = (const float *)(page + attn_kv_quant_scales_at(ks->page_tokens, W));
  for (int64_t r = 0; r < n; r++) {
    char *x = (char *)dst + (size_t)r * xr;
    memcpy(x, page + (i + r) * W, (size_t)cols);
    memcpy(x + cols, &sc[i + r], sizeof(float));
  }
}
