/*
 * test_softmax.c — seed exercise 2: safe softmax and online softmax agree,
 * on values scaled by 10 (where the naive form overflows) and with ±inf.
 */
#include "helpers.h"

#include "softmax.h"

#include <criterion/criterion.h>
#include <math.h>

static void agree(const double *x, size_t n) {
  double ys[64], yo[64], ms, ls, mo, lo;
  attn_softmax_safe(x, n, ys, &ms, &ls);
  attn_softmax_online(x, n, yo, &mo, &lo);
  cr_expect(ms == mo || (isnan(ms) && isnan(mo)), "m: safe %g online %g", ms, mo);
  cr_expect(fabs(ls - lo) <= 1e-12 * fmax(1, ls), "l: safe %.17g online %.17g", ls, lo);
  double sum = 0;
  for (size_t i = 0; i < n; i++) {
    cr_expect(!isnan(ys[i]) && !isnan(yo[i]), "NaN at %zu", i);
    cr_expect(fabs(ys[i] - yo[i]) <= 1e-12, "y[%zu]: safe %.17g online %.17g", i, ys[i], yo[i]);
    sum += ys[i];
  }
  if (ls > 0)
    cr_expect(fabs(sum - 1) < 1e-12, "softmax sums to %.17g", sum);
}

Test(softmax, random_rows_times_ten) {
  uint64_t s = 42;
  for (int t = 0; t < 200; t++) {
    double x[64];
    size_t n = 1 + trand(&s) % 64;
    for (size_t i = 0; i < n; i++)
      x[i] = 10.0 * 4.0 * tuniform(&s); /* randn-like spread, x10 as in the seed */
    agree(x, n);
  }
}

Test(softmax, large_values_do_not_overflow) {
  double x[4] = {1000, 999, 998, -1000}, y[4], m, l;
  attn_softmax_online(x, 4, y, &m, &l);
  cr_expect_eq(m, 1000);
  cr_expect(fabs(y[0] - 1 / (1 + exp(-1) + exp(-2))) < 1e-15);
  agree(x, 4);
}

Test(softmax, minus_infinity_is_weight_zero) {
  double x[5] = {-INFINITY, 1, -INFINITY, 2, -INFINITY}, y[5], m, l;
  agree(x, 5);
  attn_softmax_safe(x, 5, y, &m, &l);
  cr_expect_eq(y[0], 0);
  cr_expect_eq(y[4], 0);
  cr_expect(fabs(y[3] - 1 / (1 + exp(-1))) < 1e-15);
}

Test(softmax, all_minus_infinity_is_fully_masked) {
  double x[3] = {-INFINITY, -INFINITY, -INFINITY}, y[3] = {7, 7, 7}, m, l;
  attn_softmax_online(x, 3, y, &m, &l);
  cr_expect(isinf(m) && m < 0);
  cr_expect_eq(l, 0);
  for (int i = 0; i < 3; i++)
    cr_expect_eq(y[i], 0);
  agree(x, 3);
  attn_softmax_safe(x, 0, y, &m, &l); /* empty row: the same */
  cr_expect(isinf(m) && m < 0 && l == 0);
}

Test(softmax, plus_infinity_takes_all_weight) {
  double x[5] = {3, INFINITY, -INFINITY, INFINITY, 1e300}, y[5], m, l;
  attn_softmax_online(x, 5, y, &m, &l);
  cr_expect(isinf(m) && m > 0);
  cr_expect_eq(l, 2);
  cr_expect_eq(y[1], 0.5);
  cr_expect_eq(y[3], 0.5);
  cr_expect_eq(y[0], 0);
  cr_expect_eq(y[4], 0);
  agree(x, 5);
}

/* Merging the statistics of two halves equals the statistics of the whole,
 * in either order: the rule tiles and split-KV chunks rely on. */
Test(softmax, merge_of_halves) {
  uint64_t s = 9;
  for (int t = 0; t < 100; t++) {
    double x[40];
    for (int i = 0; i < 40; i++)
      x[i] = i % 7 == 3 ? -INFINITY : 30 * tuniform(&s);
    size_t cut = trand(&s) % 41;
    double m, l, m1, l1, m2, l2;
    attn_softmax_safe(x, 40, NULL, &m, &l);
    attn_softmax_safe(x, cut, NULL, &m1, &l1);
    attn_softmax_safe(x + cut, 40 - cut, NULL, &m2, &l2);
    double ma = m1, la = l1, mb = m2, lb = l2;
    attn_softmax_merge(&ma, &la, m2, l2);
    attn_softmax_merge(&mb, &lb, m1, l1);
    cr_expect_eq(ma, m);
    cr_expect_eq(mb, m);
    cr_expect(fabs(la - l) < 1e-12 * l && fabs(lb - l) < 1e-12 * l);
  }
}
