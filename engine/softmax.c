/*
 * softmax.c — the float64 row softmax used by the reference backend, and its
 * online form (see softmax.h for the conventions at infinities).
 */
#include "softmax.h"

#include <math.h>

double attn_softmax_weight(double x, double m) {
  if (isinf(m)) /* all -inf (nothing visible) or some +inf entries */
    return x == m && m > 0 ? 1.0 : 0.0;
  return exp(x - m);
}

void attn_softmax_merge(double *pm, double *pl, double m2, double l2) {
  double m1 = *pm, l1 = *pl;
  if (l2 == 0) /* an empty range changes nothing */
    return;
  if (l1 == 0) {
    *pm = m2;
    *pl = l2;
    return;
  }
  double m = m1 > m2 ? m1 : m2;
  *pm = m;
  *pl = l1 * attn_softmax_weight(m1, m) + l2 * attn_softmax_weight(m2, m);
}

static void normalize(const double *x, size_t n, double *y, double m, double l) {
  for (size_t i = 0; y && i < n; i++)
    y[i] = l > 0 ? attn_softmax_weight(x[i], m) / l : 0.0;
}

void attn_softmax_safe(const double *x, size_t n, double *y, double *pm, double *pl) {
  double m = -INFINITY, l = 0;
  for (size_t i = 0; i < n; i++)
    m = x[i] > m ? x[i] : m;
  if (m != -INFINITY)
    for (size_t i = 0; i < n; i++)
      l += attn_softmax_weight(x[i], m);
  normalize(x, n, y, m, l);
  if (pm)
    *pm = m;
  if (pl)
    *pl = l;
}

void attn_softmax_online(const double *x, size_t n, double *y, double *pm, double *pl) {
  double m = -INFINITY, l = 0;
  for (size_t i = 0; i < n; i++)
    if (x[i] != -INFINITY) /* a -inf element is an empty range */
      attn_softmax_merge(&m, &l, x[i], 1.0);
  normalize(x, n, y, m, l);
  if (pm)
    *pm = m;
  if (pl)
    *pl = l;
}
