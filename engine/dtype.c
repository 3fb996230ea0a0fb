/*
 * dtype.c — the three element types of the contract and their conversions.
 *
 * Narrowing rounds to nearest, ties to even, as IEEE 754 and PyTorch do, so
 * a value sent as JSON and rounded here matches the same value rounded by a
 * client. Inputs are finite by the time they are narrowed (the engine
 * rejects non-finite tensors), but NaN and infinity still convert correctly.
 */
#include "engine.h"

#include <math.h>
#include <string.h>

static const char *const dtype_names[ATTN_DTYPE_COUNT] = {"F32", "F16", "BF16"};

const char *attn_dtype_name(attn_dtype dt) {
  return (unsigned)dt < ATTN_DTYPE_COUNT ? dtype_names[dt] : "?";
}

int attn_dtype_parse(const char *name, attn_dtype *pdt) {
  for (int i = 0; i < ATTN_DTYPE_COUNT; i++)
    if (name && strcmp(name, dtype_names[i]) == 0) {
      *pdt = (attn_dtype)i;
      return 0;
    }
  return ATTN_EDTYPE;
}

size_t attn_dtype_size(attn_dtype dt) {
  switch (dt) {
  case ATTN_F32: return 4;
  case ATTN_F16:
  case ATTN_BF16: return 2;
  default: return 0;
  }
}

static uint32_t f2u(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
static float u2f(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

float attn_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  if (exp == 0x1f) /* inf or NaN */
    return u2f(sign | 0x7f800000u | (man << 13));
  if (exp == 0) { /* zero or subnormal: man * 2^-24 exactly */
    float v = (float)man * 0x1p-24f;
    return sign ? -v : v;
  }
  return u2f(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t attn_f32_to_f16(float f) {
  uint32_t u = f2u(f);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
  uint32_t a = u & 0x7fffffffu;
  if (a >= 0x7f800000u) /* inf stays inf, NaN stays a quiet NaN */
    return sign | (a > 0x7f800000u ? 0x7e00 : 0x7c00);
  if (a >= 0x477ff000u) /* rounds to 65520 or more: overflow */
    return sign | 0x7c00;
  if (a < 0x38800000u) {              /* below 2^-14: subnormal half; let the FPU round */
    float v = u2f(a) * 0x1p24f;       /* exact scaling into [0, 1024) */
    uint32_t m = (uint32_t)lrintf(v); /* ties to even in the default mode */
    return sign | (uint16_t)m;        /* m == 1024 becomes the smallest normal */
  }
  uint32_t r = a + 0xfffu + ((a >> 13) & 1); /* round mantissa to 10 bits */
  return sign | (uint16_t)((r - 0x38000000u) >> 13);
}

float attn_bf16_to_f32(uint16_t b) { return u2f((uint32_t)b << 16); }

uint16_t attn_f32_to_bf16(float f) {
  uint32_t u = f2u(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it a NaN */
    return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1);
  return (uint16_t)(u >> 16);
}

/* x to float rounded to odd: truncate toward zero, then set the last bit if
 * anything was lost. Rounding that to a format with at least two fewer
 * mantissa bits gives the correctly rounded result (Boldo & Melquiond). */
static float to_odd(double x) {
  float f = (float)x;
  if ((double)f == x || !isfinite(x))
    return f;
  if (fabs((double)f) > fabs(x))
    f = nextafterf(f, 0.0f);
  uint32_t u = f2u(f);
  return u2f(u | 1u);
}

uint16_t attn_f64_to_f16(double x) { return attn_f32_to_f16(to_odd(x)); }
uint16_t attn_f64_to_bf16(double x) { return attn_f32_to_bf16(to_odd(x)); }

double attn_load_elem(const void *p, attn_dtype dt, size_t i) {
  switch (dt) {
  case ATTN_F32: return ((const float *)p)[i];
  case ATTN_F16: return attn_f16_to_f32(((const uint16_t *)p)[i]);
  case ATTN_BF16: return attn_bf16_to_f32(((const uint16_t *)p)[i]);
  default: return NAN;
  }
}

void attn_store_elem(void *p, attn_dtype dt, size_t i, float x) {
  switch (dt) {
  case ATTN_F32: ((float *)p)[i] = x; break;
  case ATTN_F16: ((uint16_t *)p)[i] = attn_f32_to_f16(x); break;
  case ATTN_BF16: ((uint16_t *)p)[i] = attn_f32_to_bf16(x); break;
  default: break;
  }
}

/* ---- quantized session rows ------------------------------------------- */

static const char *const kvq_names[ATTN_KVQ_COUNT] = {"?", "F8_E4M3", "I8"};

const char *attn_kv_quant_name(attn_kv_quant q) {
  return (unsigned)q < ATTN_KVQ_COUNT ? kvq_names[q] : "?";
}

int attn_kv_quant_parse(const char *name, attn_kv_quant *pq) {
  for (int i = 1; i < ATTN_KVQ_COUNT; i++)
    if (name && strcmp(name, kvq_names[i]) == 0) {
      *pq = (attn_kv_quant)i;
      return 0;
    }
  return ATTN_EDTYPE;
}

float attn_kv_quant_max(attn_kv_quant q) { return q == ATTN_KVQ_I8 ? 127.0f : 448.0f; }

/* E4M3's 7 exponent and mantissa bits put at bit 7 of an F16 are that F16's
 * exponent's low 4 bits and its mantissa's top 3: the biases differ by 8,
 * so the F16 is the code's value times 2^-8, subnormals included (the
 * kernels' vector decode is the same trick). The NaN codes would read as
 * ±480: no stored row holds them (quant.c refuses them), and here they are
 * NaN. */
float attn_e4m3_to_f32(uint8_t c) {
  if ((c & 0x7fu) == 0x7fu)
    return NAN;
  const uint16_t h = (uint16_t)(((c & 0x80u) << 8) | ((c & 0x7fu) << 7));
  return attn_f16_to_f32(h) * 256.0f;
}

float attn_kv_code_value(attn_kv_quant q, uint8_t c) {
  return q == ATTN_KVQ_I8 ? (float)(int8_t)c : attn_e4m3_to_f32(c);
}

/* Below 2^-6 the codes are subnormals 2^-9 apart; from there each binade
 * holds 8 codes, and a rounding up to 2^e carries into the next binade's
 * first code, so code = (e + 6)·8 + a·2^(3-e) rounded (nearbyintf: ties
 * to even in the default mode) for 2^e <= a < 2^(e+1). */
uint8_t attn_f32_to_e4m3(float x) {
  const uint8_t sign = signbit(x) ? 0x80 : 0;
  float a = fminf(fabsf(x), 448.0f);
  if (a < 0x1p-6f)
    return sign | (uint8_t)nearbyintf(a * 512.0f);
  int e;
  (void)frexpf(a, &e); /* a = f·2^e, f in [0.5, 1): a's binade is e - 1 */
  e -= 1;
  return sign | (uint8_t)((e + 6) * 8 + (int)nearbyintf(ldexpf(a, 3 - e)));
}

uint8_t attn_f32_to_i8(float x) {
  const float r = nearbyintf(fminf(fmaxf(x, -127.0f), 127.0f));
  return (uint8_t)(int8_t)r;
}

float attn_kv_quantize_row(attn_kv_quant q, const void *src, attn_dtype dt, int64_t n,
                           uint8_t *dst) {
  float mx = 0.0f;
  for (int64_t i = 0; i < n; i++)
    mx = fmaxf(mx, fabsf((float)attn_load_elem(src, dt, (size_t)i)));
  if (mx == 0.0f) {
    memset(dst, 0, (size_t)n);
    return 0.0f;
  }
  const float scale = mx / attn_kv_quant_max(q);
  if (scale == 0.0f) { /* a row of subnormals near 2^-149: kept as zeros */
    memset(dst, 0, (size_t)n);
    return 0.0f;
  }
  for (int64_t i = 0; i < n; i++) {
    const float x = (float)attn_load_elem(src, dt, (size_t)i) / scale;
    dst[i] = q == ATTN_KVQ_I8 ? attn_f32_to_i8(x) : attn_f32_to_e4m3(x);
  }
  return scale;
}
