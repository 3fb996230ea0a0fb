/*
 * test_memory.c — the flash engine's extra memory is O(tile), not O(N²):
 * one head with N = 65536, D = 64 (standard attention would hold S and P,
 * 2 x 65536² x 4 bytes = 32 GiB) runs with its peak resident memory under
 * what the inputs and outputs already take plus 64 MiB. Rows are spot-checked
 * against float64 computed directly.
 */
#include "helpers.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

Test(memory, n65536_runs_in_tile_memory, .timeout = 600) {
  attn_engine *e = topen(0, NULL); /* workspaces are allocated here */
  tprob p = tprob_make(1, 1, 1, 65536, 65536, 64, ATTN_F32);
  tcase c;
  tcase_init(&c, &p, 77); /* writes every input and poisons O: all resident */
  if (!treset_peak_rss())
    cr_skip_test("cannot reset the peak RSS counter (/proc/self/clear_refs)");
  long before = tproc_kib("VmRSS");
  attn_status st;
  cr_assert_eq(trun(e, &c, "cpu", &st), 0, "%s", st.message);
  long peak = tproc_kib("VmHWM");
  cr_assert_gt(before, 64 * 1024, "inputs and outputs (64 MiB) should be resident");
  cr_expect_lt(peak - before, 64 * 1024, "the run added %ld KiB to the peak RSS", peak - before);

  /* float64 rows, directly from the definition */
  const float *q = c.q, *k = c.k, *v = c.v, *o = c.o;
  const int64_t n = 65536, d = 64;
  double *s = malloc((size_t)n * sizeof *s);
  const int64_t rows[] = {0, 1, 4095, 30000, 65535};
  for (size_t ri = 0; ri < sizeof rows / sizeof *rows; ri++) {
    int64_t i = rows[ri];
    double m = -INFINITY, l = 0, num = 0, den = 0;
    for (int64_t j = 0; j < n; j++) {
      double x = 0;
      for (int64_t t = 0; t < d; t++)
        x += (double)q[i * d + t] * k[j * d + t];
      s[j] = x / 8.0;
      m = fmax(m, s[j]);
    }
    for (int64_t j = 0; j < n; j++)
      l += (s[j] = exp(s[j] - m));
    for (int64_t t = 0; t < d; t++) {
      double y = 0;
      for (int64_t j = 0; j < n; j++)
        y += s[j] * v[j * d + t];
      y /= l;
      num += (o[i * d + t] - y) * (o[i * d + t] - y);
      den += y * y;
    }
    cr_expect_lt(sqrt(num / den), 1e-5, "row %lld: normalized error %.3g", (long long)i,
                 sqrt(num / den));
  }
  free(s);
  tcase_free(&c);
  attn_engine_close(e);
}
