/*
 * test_numtext.c — proto/numtext.c against the C library it stands in
 * for: attn__fmt_g writes what snprintf("%.*g") writes (every F16 and BF16
 * value, and random floats, at every precision the JSON encoder uses),
 * attn__parse_number reads what strtod reads, and attn__parse_float what
 * strtof reads, midpoints between floats included.
 */
#include "internal.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next_u64(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

static float bits_float(uint32_t b) {
  float f;
  memcpy(&f, &b, sizeof f);
  return f;
}

/* attn__fmt_g(x, prec) against snprintf; the first difference is reported. */
static int fmt_differs(double x, int prec) {
  char want[64], got[32];
  snprintf(want, sizeof want, "%.*g", prec, x);
  size_t n = attn__fmt_g(got, x, prec);
  if (n == strlen(want) && !strcmp(got, want))
    return 0;
  cr_expect_str_eq(got, want, "%%.%dg of %a", prec, x);
  return 1;
}

Test(numtext, fmt_g_every_f16_and_bf16) {
  int bad = 0;
  for (uint32_t b = 0; b < 65536 && bad < 5; b++) {
    double h = attn_f16_to_f32((uint16_t)b), z = attn_bf16_to_f32((uint16_t)b);
    for (int prec = 2; prec <= 5 && bad < 5; prec++) {
      if (isfinite(h))
        bad += fmt_differs(h, prec);
      if (isfinite(z))
        bad += fmt_differs(z, prec);
    }
  }
  cr_expect_eq(bad, 0);
}

Test(numtext, fmt_g_random_floats_and_edges) {
  int bad = 0;
  for (int i = 0; i < 200000 && bad < 5; i++) {
    float f = bits_float((uint32_t)next_u64());
    if (!isfinite(f))
      continue;
    for (int prec = 6; prec <= 9; prec++)
      bad += fmt_differs(f, prec);
  }
  /* values near 1, as attention's outputs are */
  for (int i = 0; i < 200000 && bad < 5; i++) {
    float f = (float)((double)(next_u64() >> 11) * 0x1p-53 * 8 - 4);
    bad += fmt_differs(f, 8) + fmt_differs(f, 9) + fmt_differs(f, 17);
  }
  const double edges[] = {0.0,    -0.0,    1.0,  -1.0,    0.5,      2.5,   9.5,       99.5,
                          999.5,  1e-4,    1e-5, 9.99995, 12345678, 1e10,  123456789, 1e38,
                          3.4e38, 1.0 / 3, 0.1f, 1e-6f,   65504,    1e-3f, 0x1p-18,   0x1p-17};
  for (size_t i = 0; i < sizeof edges / sizeof *edges; i++)
    for (int prec = 1; prec <= 9; prec++)
      bad += fmt_differs((float)edges[i], prec);
  cr_expect_eq(bad, 0);
}

/* attn__parse_number and attn__parse_float against strtod and strtof. */
static int parse_differs(const char *text) {
  char *e1, *e2;
  double want = strtod(text, &e1), got = attn__parse_number(text, &e2);
  float wf = strtof(text, NULL), gf = attn__parse_float(text);
  if (!memcmp(&want, &got, sizeof want) && e1 == e2 && !memcmp(&wf, &gf, sizeof wf))
    return 0;
  cr_expect(0, "\"%s\": strtod %a, got %a (ends %td, %td); strtof %a, got %a", text, want, got,
            e1 - text, e2 - text, (double)wf, (double)gf);
  return 1;
}

Test(numtext, parse_matches_strtod_and_strtof) {
  int bad = 0;
  char t[64];
  for (int i = 0; i < 200000 && bad < 5; i++) {
    float f = bits_float((uint32_t)next_u64());
    if (!isfinite(f))
      continue;
    snprintf(t, sizeof t, "%.*g", 1 + i % 9, f);
    bad += parse_differs(t);
    double d;
    uint64_t b = next_u64();
    memcpy(&d, &b, sizeof d);
    if (isfinite(d)) {
      snprintf(t, sizeof t, "%.*e", i % 18, d);
      bad += parse_differs(t);
    }
  }
  /* short decimals, as clients send them, with JSON's exponent forms */
  for (int i = 0; i < 200000 && bad < 5; i++) {
    unsigned long long m = next_u64() >> (11 + next_u64() % 50);
    unsigned frac = (unsigned)(next_u64() % 1000);
    int e = (int)(next_u64() % 40);
    const char *sign = next_u64() & 1 ? "-" : "";
    switch (next_u64() % 6) {
    case 0: snprintf(t, sizeof t, "%s%llu", sign, m); break;
    case 1: snprintf(t, sizeof t, "%s%llu.%03u", sign, m, frac); break;
    case 2: snprintf(t, sizeof t, "%s0.%06u%llu", sign, frac, m); break;
    case 3: snprintf(t, sizeof t, "%s%llue%d", sign, m, e); break;
    case 4: snprintf(t, sizeof t, "%s%llu.5E+%d", sign, m, e); break;
    default: snprintf(t, sizeof t, "%s%llue-%d", sign, m, e); break;
    }
    bad += parse_differs(t);
  }
  static const char *edges[] = {
      "0", "-0", "0.0", "1e22", "1e23", "1e-22", "1e-23", "9007199254740992", "9007199254740993",
      "123456789012345678", "1234567890123456789", "0.000000000000000000001",
      /* midpoints between floats: 1 + 2^-24, and just beside it */
      "1.000000059604644775390625", "1.0000000596046448", "1.00000005960464478",
      "1.00000005960464477", "16777217", "3.4028235677973366e38", "1.1754943508222875e-38", "1e-45",
      "5e-324", "1.7976931348623157e308", "2.5", "100000000000000000000"};
  for (size_t i = 0; i < sizeof edges / sizeof *edges; i++)
    bad += parse_differs(edges[i]);
  cr_expect_eq(bad, 0);
}
