/*
 * test_hist.c — the latency histogram of clients/hist.h: percentiles of known
 * synthetic distributions within the stated bound (1%; the header promises
 * 1/128 of the exact order statistic), merge, exact min/max/mean, huge values
 * and the bucket arithmetic itself.
 */
#include "hist.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#define BOUND (1.0 / 128)

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

/* Exact order statistic: the smallest v with at least p% of values <= v. */
static uint64_t exact_pct(const uint64_t *sorted, size_t n, double p) {
  if (p <= 0)
    return sorted[0];
  double want = p / 100.0 * (double)n;
  size_t rank = (size_t)ceil(want - 1e-9);
  if (rank < 1)
    rank = 1;
  if (rank > n)
    rank = n;
  return sorted[rank - 1];
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static double unif(void) { /* (0, 1) */
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return ((double)(rng_state >> 11) + 0.5) * 0x1p-53;
}

static void check_all(uint64_t *v, size_t n, const char *what) {
  tool_hist h;
  cr_assert_eq(tool_hist_init(&h), 0);
  long double sum = 0;
  for (size_t i = 0; i < n; i++) {
    tool_hist_record(&h, v[i]);
    sum += v[i];
  }
  qsort(v, n, sizeof *v, cmp_u64);
  cr_expect_eq(tool_hist_count(&h), n, "%s: count", what);
  cr_expect_eq(tool_hist_min(&h), v[0], "%s: min", what);
  cr_expect_eq(tool_hist_max(&h), v[n - 1], "%s: max", what);
  cr_expect(fabs(tool_hist_mean(&h) - (double)(sum / n)) <= 1e-9 * (double)(sum / n) + 1e-9,
            "%s: mean", what);
  static const double ps[] = {0, 1, 10, 25, 50, 75, 90, 95, 99, 99.9, 99.99, 100};
  for (size_t i = 0; i < sizeof ps / sizeof *ps; i++) {
    double got = tool_hist_percentile(&h, ps[i]);
    double want = (double)exact_pct(v, n, ps[i]);
    cr_expect(fabs(got - want) <= BOUND * want, "%s: p%g = %.1f, exact %.0f (error %.3f%%)", what,
              ps[i], got, want, want ? 100 * fabs(got - want) / want : 0);
    cr_expect(fabs(got - want) <= 0.01 * want, "%s: p%g beyond 1%%", what, ps[i]);
  }
  tool_hist_free(&h);
}

#define N 200000

Test(hist, uniform_1_to_10000_us) {
  uint64_t *v = malloc(N * sizeof *v);
  for (size_t i = 0; i < N; i++)
    v[i] = 1 + (uint64_t)(unif() * 10000);
  check_all(v, N, "uniform");
  /* and the textbook values for the exact grid 1..10000 */
  tool_hist h;
  tool_hist_init(&h);
  for (uint64_t x = 1; x <= 10000; x++)
    tool_hist_record(&h, x);
  cr_expect(fabs(tool_hist_percentile(&h, 50) - 5000) <= 5000 * BOUND);
  cr_expect(fabs(tool_hist_percentile(&h, 99) - 9900) <= 9900 * BOUND);
  cr_expect(fabs(tool_hist_percentile(&h, 99.9) - 9990) <= 9990 * BOUND);
  cr_expect_eq(tool_hist_percentile(&h, 100), 10000);
  cr_expect_eq(tool_hist_mean(&h), 5000.5);
  tool_hist_free(&h);
  free(v);
}

Test(hist, exponential) {
  uint64_t *v = malloc(N * sizeof *v);
  for (size_t i = 0; i < N; i++)
    v[i] = 1 + (uint64_t)(-log(unif()) * 2000); /* mean 2 ms */
  check_all(v, N, "exponential");
  free(v);
}

Test(hist, bimodal) {
  uint64_t *v = malloc(N * sizeof *v);
  for (size_t i = 0; i < N; i++)
    v[i] = unif() < 0.9 ? 200 + (uint64_t)(unif() * 100)         /* 0.2-0.3 ms */
                        : 500000 + (uint64_t)(unif() * 1000000); /* 0.5-1.5 s */
  check_all(v, N, "bimodal");
  free(v);
}

Test(hist, constant) {
  uint64_t *v = malloc(1000 * sizeof *v);
  for (size_t i = 0; i < 1000; i++)
    v[i] = 123457;
  check_all(v, 1000, "constant");
  /* a single value is reported exactly (clamped to [min, max]) */
  tool_hist h;
  tool_hist_init(&h);
  tool_hist_record_n(&h, 123457, 1000);
  cr_expect_eq(tool_hist_percentile(&h, 50), 123457);
  cr_expect_eq(tool_hist_percentile(&h, 99.9), 123457);
  tool_hist_free(&h);
  free(v);
}

Test(hist, small_values_exact) {
  tool_hist h;
  tool_hist_init(&h);
  for (uint64_t x = 0; x < 256; x++)
    tool_hist_record(&h, x);
  for (int p = 1; p <= 100; p++)
    cr_expect_eq(tool_hist_percentile(&h, p), ceil(p * 2.56) - 1, "p%d", p);
  tool_hist_free(&h);
}

Test(hist, huge_values) {
  tool_hist h;
  tool_hist_init(&h);
  uint64_t hour = 3600ull * 1000000, big = UINT64_MAX - 5;
  tool_hist_record(&h, 1);
  tool_hist_record(&h, hour);
  tool_hist_record(&h, big);
  cr_expect_eq(tool_hist_max(&h), big);
  cr_expect_eq(tool_hist_min(&h), 1);
  cr_expect_eq(tool_hist_percentile(&h, 100), (double)big);
  double p60 = tool_hist_percentile(&h, 60);
  cr_expect(fabs(p60 - (double)hour) <= BOUND * (double)hour, "p60 %.0f", p60);
  cr_expect(tool_hist_index(UINT64_MAX) == TOOL_HIST_BUCKETS - 1);
  /* a day of microseconds, many times */
  tool_hist_record_n(&h, 86400ull * 1000000, 1000000);
  double p50 = tool_hist_percentile(&h, 50);
  cr_expect(fabs(p50 - 86400e6) <= BOUND * 86400e6);
  tool_hist_free(&h);
}

Test(hist, merge) {
  tool_hist a, b, all;
  tool_hist_init(&a);
  tool_hist_init(&b);
  tool_hist_init(&all);
  for (uint64_t x = 1; x <= 5000; x++) {
    tool_hist_record(x % 2 ? &a : &b, x * 7);
    tool_hist_record(&all, x * 7);
  }
  tool_hist_record(&b, 9999999);
  tool_hist_record(&all, 9999999);
  tool_hist_merge(&a, &b);
  cr_expect_eq(tool_hist_count(&a), tool_hist_count(&all));
  cr_expect_eq(tool_hist_min(&a), 7);
  cr_expect_eq(tool_hist_max(&a), 9999999);
  cr_expect_eq(tool_hist_mean(&a), tool_hist_mean(&all));
  for (double p = 0; p <= 100; p += 0.5)
    cr_expect_eq(tool_hist_percentile(&a, p), tool_hist_percentile(&all, p), "p%g", p);
  /* merging an empty histogram changes nothing; into an empty one copies */
  tool_hist e;
  tool_hist_init(&e);
  tool_hist_merge(&a, &e);
  cr_expect_eq(tool_hist_min(&a), 7);
  tool_hist_merge(&e, &all);
  cr_expect_eq(tool_hist_percentile(&e, 99), tool_hist_percentile(&all, 99));
  cr_expect_eq(tool_hist_min(&e), 7);
  tool_hist_free(&a);
  tool_hist_free(&b);
  tool_hist_free(&all);
  tool_hist_free(&e);
}

Test(hist, empty) {
  tool_hist h;
  tool_hist_init(&h);
  cr_expect_eq(tool_hist_count(&h), 0);
  cr_expect_eq(tool_hist_percentile(&h, 99), 0);
  cr_expect_eq(tool_hist_min(&h), 0);
  cr_expect_eq(tool_hist_max(&h), 0);
  cr_expect_eq(tool_hist_mean(&h), 0);
  tool_hist_free(&h);
}

Test(hist, buckets) {
  /* every bucket's range maps back to it, ranges tile the line, width <= lo/128 */
  for (unsigned i = 0; i < TOOL_HIST_BUCKETS; i++) {
    uint64_t lo = tool_hist_bucket_lo(i), hi = tool_hist_bucket_hi(i);
    cr_assert_eq(tool_hist_index(lo), i, "lo of %u", i);
    cr_assert_eq(tool_hist_index(hi), i, "hi of %u", i);
    if (i + 1 < TOOL_HIST_BUCKETS)
      cr_assert_eq(tool_hist_bucket_lo(i + 1), hi + 1, "bucket %u", i);
    if (lo >= 256)
      cr_assert_leq(hi - lo + 1, lo / 128, "width of %u", i);
  }
  cr_assert_eq(tool_hist_bucket_hi(TOOL_HIST_BUCKETS - 1), UINT64_MAX);
}
