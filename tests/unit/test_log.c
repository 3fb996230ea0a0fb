/*
 * test_log.c — the durations of log lines and Server-Timing
 * (attnd_fmt_fixed, server/log.c) against printf("%.*f"), which they
 * stand in for: random durations from a microsecond to hours, at the
 * decimals the server writes (0 for microseconds, 3 for milliseconds), and
 * the edges printf words itself (NaN, infinities, huge values).
 * tests/server/test_request_ids.c reads the lines attnd writes.
 */
#include "log.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static uint64_t rng = 0x243f6a8885a308d3ull;
static double next_unit(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (double)(rng >> 11) * 0x1p-53;
}

static int differs(double v, int decimals) {
  char want[400], got[400];
  snprintf(want, sizeof want, "%.*f", decimals, v);
  size_t n = attnd_fmt_fixed(got, sizeof got, v, decimals);
  if (n == strlen(want) && !strcmp(got, want))
    return 0;
  cr_expect_str_eq(got, want, "%%.%df of %a", decimals, v);
  return 1;
}

Test(log, fixed_point_durations_are_printf_s) {
  int bad = 0;
  for (int i = 0; i < 500000 && bad < 5; i++) {
    double seconds = pow(10, -6 + 10 * next_unit()); /* 1 us to ~3 h */
    bad += differs(seconds * 1e6, 0) + differs(seconds * 1e3, 3);
    bad += differs(-seconds * 1e-3, 0); /* a clock step backwards: "-0" */
  }
  const double edges[] = {0.0,  -0.0,  0.5,    1.5,      2.5,       0.0005, 1e17,
                          1e18, 1e300, -1e300, INFINITY, -INFINITY, NAN};
  for (size_t i = 0; i < sizeof edges / sizeof *edges; i++)
    for (int d = 0; d <= 6; d++)
      bad += differs(edges[i], d);
  cr_expect_eq(bad, 0);
}

Test(log, fixed_point_is_cut_to_the_buffer) {
  char small[5];
  size_t n = attnd_fmt_fixed(small, sizeof small, 123456.789, 3);
  cr_expect_eq(n, 4);
  cr_expect_str_eq(small, "1234");
  n = attnd_fmt_fixed(small, sizeof small, 1e300, 0);
  cr_expect_eq(n, 4);
  cr_expect_eq(strlen(small), 4);
  cr_expect_eq(attnd_fmt_fixed(small, 0, 1.0, 0), 0);
}
