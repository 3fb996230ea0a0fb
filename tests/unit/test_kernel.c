/*
 * test_kernel.c — pieces of the CPU kernel checked on their own: the vector
 * exp2's documented error bound, the input scan, and the conversion of the
 * output to F16/BF16 (round to nearest even, bit for bit) for the kernels
 * that compute in F32.
 */
#include "helpers.h"

#include "cpu/flash.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *const isas[] = {"generic", "avx2", "avx512", "avx512bf16", "amx"};
enum { NISAS = sizeof isas / sizeof *isas };

static const attn__flash_isa *isa_or_skip(const char *name) {
  attn_status st;
  const attn__flash_isa *k = attn__flash_select(name, &st);
  if (!k)
    cr_skip_test("%s", st.message);
  return k;
}

/* simd.h documents: relative error < 1.2e-7 for results >= 2^-126, exactly
 * 0 for x <= -150 (and for -inf, the masked score). */
static void exp2_bound(const char *name) {
  const attn__flash_isa *k = isa_or_skip(name);
  enum { N = 1 << 20 };
  float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
  for (int i = 0; i < N; i++) /* [-126, 0], denser than every float spacing of f */
    x[i] = -126.0f * (float)i / (float)(N - 1);
  k->exp2(x, y, N);
  double worst = 0;
  float at = 0;
  for (int i = 0; i < N; i++) {
    double ref = exp2((double)x[i]);
    double e = fabs(y[i] - ref) / ref;
    if (e > worst) {
      worst = e;
      at = x[i];
    }
  }
  cr_expect_lt(worst, 1.2e-7, "%s: exp2 relative error %.3g at x = %.9g", name, worst, at);
  float special[] = {-INFINITY, -1000.0f, -200.0f, -150.0f, -151.5f, 0.0f, 1.0f, 10.5f};
  float out[8];
  k->exp2(special, out, 8);
  for (int i = 0; i < 5; i++)
    cr_expect_eq(out[i], 0.0f, "%s: exp2(%g) = %g, want 0", name, special[i], out[i]);
  cr_expect_eq(out[5], 1.0f, "%s: exp2(0) = %.9g", name, out[5]);
  cr_expect_eq(out[6], 2.0f, "%s: exp2(1) = %.9g", name, out[6]);
  cr_expect_lt(fabs(out[7] / exp2(10.5) - 1), 1.2e-7);
  free(x);
  free(y);
}

Test(kernel, exp2_generic) { exp2_bound("generic"); }
Test(kernel, exp2_avx2) { exp2_bound("avx2"); }
Test(kernel, exp2_avx512) { exp2_bound("avx512"); }
Test(kernel, exp2_avx512bf16) { exp2_bound("avx512bf16"); }
Test(kernel, exp2_amx) { exp2_bound("amx"); }

/* simd.h documents vtanh (softcap): relative error < 5e-7 over [-20, 20],
 * the smallest inputs included, and within that of ±1 far out (the clamp
 * leaves 1 - 2 ulp there). */
static void tanh_bound(const char *name) {
  const attn__flash_isa *k = isa_or_skip(name);
  enum { N = 1 << 22 };
  float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
  for (int i = 0; i < N; i++)
    x[i] = -20.0f + 40.0f * (float)i / (float)(N - 1);
  k->tanh(x, y, N);
  double worst = 0;
  float at = 0;
  for (int i = 0; i < N; i++) {
    double ref = tanh((double)x[i]);
    double e = ref == 0 ? fabs(y[i]) : fabs(y[i] - ref) / fabs(ref);
    if (e > worst) {
      worst = e;
      at = x[i];
    }
  }
  cr_expect_lt(worst, 5e-7, "%s: tanh relative error %.3g at x = %.9g", name, worst, at);
  float special[] = {1e-30f, -3e-8f, 1e-4f, 100.0f, -1e30f};
  float out[5];
  k->tanh(special, out, 5);
  for (int i = 0; i < 3; i++)
    cr_expect_lt(fabs(out[i] / tanh((double)special[i]) - 1), 5e-7, "%s: tanh(%g) = %.9g", name,
                 special[i], out[i]);
  cr_expect_lt(fabs(out[3] - 1.0), 5e-7, "%s: tanh(100) = %.9g", name, out[3]);
  cr_expect_lt(fabs(out[4] + 1.0), 5e-7, "%s: tanh(-1e30) = %.9g", name, out[4]);
  free(x);
  free(y);
}

Test(kernel, tanh_generic) { tanh_bound("generic"); }
Test(kernel, tanh_avx2) { tanh_bound("avx2"); }
Test(kernel, tanh_avx512) { tanh_bound("avx512"); }

/* The scan finds the largest magnitude and the first non-finite element, in
 * every dtype, in the vector body and in the tail. */
Test(kernel, scan) {
  for (int ii = 0; ii < NISAS; ii++) {
    attn_status st;
    const attn__flash_isa *k = attn__flash_select(isas[ii], &st);
    if (!k)
      continue;
    for (int dt = 0; dt < 3; dt++) {
      const int64_t n = 5, d = 37, stride = 40;
      uint16_t buf16[5 * 40];
      float buf32[5 * 40];
      void *p = dt == ATTN_F32 ? (void *)buf32 : (void *)buf16;
      for (int64_t i = 0; i < n * stride; i++)
        attn_store_elem(p, (attn_dtype)dt, (size_t)i, 0.25f * (float)(i % 7) - 0.5f);
      attn_store_elem(p, (attn_dtype)dt, 3 * 40 + 35, -9.5f); /* in the tail */
      attn_store_elem(p, (attn_dtype)dt, 2 * 40 + 38, NAN);   /* in the gap: ignored */
      float mx = 0;
      cr_expect_eq(k->scan(p, (attn_dtype)dt, n, d, stride, &mx), -1);
      cr_expect_eq(mx, 9.5f, "%s %s: max %g", isas[ii], attn_dtype_name((attn_dtype)dt), mx);
      attn_store_elem(p, (attn_dtype)dt, 4 * 40 + 3, INFINITY);
      attn_store_elem(p, (attn_dtype)dt, 1 * 40 + 20, NAN);
      cr_expect_eq(k->scan(p, (attn_dtype)dt, n, d, stride, &mx), 1 * 37 + 20,
                   "%s %s: first non-finite element", isas[ii], attn_dtype_name((attn_dtype)dt));
    }
  }
}

/* The kernel's F16/BF16 output is its F32 result rounded to nearest even:
 * with inputs exactly representable in the narrow dtype, the F32 run and the
 * narrow run compute the same floats, so O must match bit for bit. */
Test(kernel, narrow_output_is_rounded_f32) {
  for (int ii = 0; ii < NISAS; ii++) {
    attn_status why;
    if (!attn__flash_select(isas[ii], &why))
      continue;
    attn_config cfg;
    attn_config_init(&cfg);
    cfg.threads = 2;
    cfg.cpu_isa = isas[ii];
    attn_engine *e;
    attn_status st;
    cr_assert_eq(attn_engine_open(&cfg, &e, &st), 0);
    for (int dt = 1; dt < 3; dt++) {
      /* Kernels with BF16 products round P to BF16 by design (flash.c):
       * their BF16 output is not the F32 run's. */
      if (dt == ATTN_BF16 && ii >= 3)
        continue;
      tprob p = tprob_make(1, 2, 1, 70, 90, 40, (attn_dtype)dt);
      p.causal = true;
      tcase narrow, wide;
      tcase_init(&narrow, &p, 3);
      p.dt = ATTN_F32;
      tcase_init(&wide, &p, 3);
      size_t n = 2 * 70 * 40;
      for (size_t i = 0; i < 90 * 40; i++) { /* same values in both */
        ((float *)wide.k)[i] = (float)attn_load_elem(narrow.k, (attn_dtype)dt, i);
        ((float *)wide.v)[i] = (float)attn_load_elem(narrow.v, (attn_dtype)dt, i);
      }
      for (size_t i = 0; i < n; i++)
        ((float *)wide.q)[i] = (float)attn_load_elem(narrow.q, (attn_dtype)dt, i);
      int r1 = trun(e, &narrow, "cpu", &st), r2 = trun(e, &wide, "cpu", &st);
      if (r1 == 0 && r2 == 0) {
        int bad = 0;
        for (size_t i = 0; i < n; i++) {
          float f = ((float *)wide.o)[i];
          uint16_t want = dt == ATTN_F16 ? attn_f32_to_f16(f) : attn_f32_to_bf16(f);
          bad += ((uint16_t *)narrow.o)[i] != want;
        }
        cr_expect_eq(bad, 0, "%s %s: %d outputs not the rounded F32 result", isas[ii],
                     attn_dtype_name((attn_dtype)dt), bad);
      } else {
        cr_expect(0, "%s: runs failed: %s", isas[ii], st.message);
      }
      tcase_free(&narrow);
      tcase_free(&wide);
    }
    attn_engine_close(e);
  }
}
