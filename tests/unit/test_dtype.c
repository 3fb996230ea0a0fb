/*
 * test_dtype.c — the dtype names and the scalar conversions every codec and
 * backend uses: exact widening, round-to-nearest-even narrowing, overflow,
 * subnormals, infinities and NaN.
 */
#include "engine.h"

#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

Test(dtype, names_and_sizes) {
  attn_dtype dt;
  cr_expect_eq(attn_dtype_parse("BF16", &dt), 0);
  cr_expect_eq(dt, ATTN_BF16);
  cr_expect_eq(attn_dtype_parse("f32", &dt), ATTN_EDTYPE); /* names are case-sensitive */
  cr_expect_eq(attn_dtype_parse("F64", &dt), ATTN_EDTYPE);
  cr_expect_eq(attn_dtype_parse(NULL, &dt), ATTN_EDTYPE);
  cr_expect_str_eq(attn_dtype_name(ATTN_F16), "F16");
  cr_expect_str_eq(attn_dtype_name((attn_dtype)9), "?");
  cr_expect_eq(attn_dtype_size(ATTN_F32), 4);
  cr_expect_eq(attn_dtype_size(ATTN_BF16), 2);
  cr_expect_eq(attn_dtype_size((attn_dtype)9), 0);
}

/* Every F16 bit pattern widens exactly and narrows back to itself; the
 * widening agrees with the value computed from the bit fields in double. */
Test(dtype, f16_every_pattern_round_trips) {
  for (uint32_t h = 0; h < 65536; h++) {
    float f = attn_f16_to_f32((uint16_t)h);
    uint32_t e = (h >> 10) & 31, m = h & 1023;
    double want = e == 0    ? ldexp(m, -24)
                  : e == 31 ? (m ? NAN : INFINITY)
                            : ldexp(1024 + m, (int)e - 25);
    if (h & 0x8000)
      want = -want;
    if (e == 31 && m) {
      cr_assert(isnan(f));
      cr_assert(isnan(attn_f16_to_f32(attn_f32_to_f16(f))));
      continue;
    }
    cr_assert_eq((double)f, want, "pattern %04x", h);
    cr_assert_eq(attn_f32_to_f16(f), h, "pattern %04x does not round-trip", h);
  }
}

Test(dtype, bf16_every_pattern_round_trips) {
  for (uint32_t b = 0; b < 65536; b++) {
    float f = attn_bf16_to_f32((uint16_t)b);
    uint32_t u;
    memcpy(&u, &f, 4);
    cr_assert_eq(u, b << 16);
    if (isnan(f))
      cr_assert(isnan(attn_bf16_to_f32(attn_f32_to_bf16(f))));
    else
      cr_assert_eq(attn_f32_to_bf16(f), b, "pattern %04x", b);
  }
}

Test(dtype, narrowing_rounds_to_nearest_even) {
  /* F16 around 1: spacing 2^-10. Halfway cases go to the even mantissa. */
  cr_expect_eq(attn_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);            /* tie -> even (1.0) */
  cr_expect_eq(attn_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);        /* tie -> even (up) */
  cr_expect_eq(attn_f32_to_f16(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01); /* above tie -> up */
  cr_expect_eq(attn_f32_to_f16(65504.0f), 0x7bff);
  cr_expect_eq(attn_f32_to_f16(65519.0f), 0x7bff); /* below the overflow threshold */
  cr_expect_eq(attn_f32_to_f16(65520.0f), 0x7c00); /* rounds to infinity */
  cr_expect_eq(attn_f32_to_f16(-1e9f), 0xfc00);
  cr_expect_eq(attn_f32_to_f16(0x1p-24f), 0x0001);     /* smallest subnormal */
  cr_expect_eq(attn_f32_to_f16(0x1p-25f), 0x0000);     /* tie -> even (0) */
  cr_expect_eq(attn_f32_to_f16(0x1.8p-24f), 0x0002);   /* 1.5 ulp: tie -> even (2) */
  cr_expect_eq(attn_f32_to_f16(0x1.ff8p-15f), 0x03ff); /* the largest subnormal */
  cr_expect_eq(attn_f32_to_f16(0x1.ffcp-15f), 0x0400); /* tie -> even: the smallest normal */
  cr_expect_eq(attn_f32_to_f16(-0.0f), 0x8000);
  /* BF16 around 1: spacing 2^-7. */
  cr_expect_eq(attn_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
  cr_expect_eq(attn_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
  cr_expect_eq(attn_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
  cr_expect_eq(attn_f32_to_bf16(INFINITY), 0x7f80);
  cr_expect_eq(attn_f32_to_bf16(3.4028235e38f), 0x7f80); /* FLT_MAX rounds up to inf */
}

Test(dtype, load_and_store_elements) {
  uint16_t h[3];
  float f[3];
  attn_store_elem(h, ATTN_F16, 1, 0.333333f);
  cr_expect_eq(h[1], attn_f32_to_f16(0.333333f));
  cr_expect_eq(attn_load_elem(h, ATTN_F16, 1), attn_f16_to_f32(h[1]));
  attn_store_elem(h, ATTN_BF16, 2, -2.5f);
  cr_expect_eq(attn_load_elem(h, ATTN_BF16, 2), -2.5);
  attn_store_elem(f, ATTN_F32, 0, 1.25f);
  cr_expect_eq(attn_load_elem(f, ATTN_F32, 0), 1.25);
  cr_expect(isnan(attn_load_elem(f, (attn_dtype)7, 0)));
}

/* Doubles round once: a value just above an F16 tie rounds up even though
 * rounding it to float first would land exactly on the tie. */
Test(dtype, doubles_round_once) {
  double tie = 1.0 + 0x1p-11;                 /* halfway between F16 1.0 and its successor */
  cr_expect_eq(attn_f64_to_f16(tie), 0x3c00); /* tie -> even */
  cr_expect_eq(attn_f64_to_f16(tie + 0x1p-40), 0x3c01);          /* float would say tie */
  cr_expect_eq(attn_f32_to_f16((float)(tie + 0x1p-40)), 0x3c00); /* the double rounding */
  cr_expect_eq(attn_f64_to_f16(tie - 0x1p-40), 0x3c00);
  double btie = 1.0 + 0x1p-8;
  cr_expect_eq(attn_f64_to_bf16(btie + 0x1p-40), 0x3f81);
  cr_expect_eq(attn_f64_to_bf16(btie), 0x3f80);
  cr_expect_eq(attn_f64_to_f16(-65519.9), 0xfbff);
  cr_expect_eq(attn_f64_to_f16(1e300), 0x7c00);
  cr_expect_eq(attn_f64_to_bf16(0.1), attn_f32_to_bf16(0.1f));
  /* every F16 value is exact as a double and maps to itself */
  for (uint32_t h = 0; h < 0x7c00; h++)
    cr_assert_eq(attn_f64_to_f16((double)attn_f16_to_f32((uint16_t)h)), h);
}
