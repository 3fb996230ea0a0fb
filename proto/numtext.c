/*
 * numtext.c — numbers to decimal text and back, exactly as printf("%.*g")
 * and strtod() would, without their multi-precision arithmetic where plain
 * integers are exact (internal.h).
 *
 * glibc's printf and strtod are correct for every input, and that costs
 * them thousands of instructions a number: a JSON reply of O spent most of
 * its time in them. The tensors' values are floats (24 significant bits),
 * whose exact decimal value fits a 128-bit integer over most of their range,
 * and the numbers clients send are mostly short decimals, which Clinger's
 * fast path reads exactly in one IEEE operation. Anything outside those
 * ranges goes to the C library, so the text is byte for byte the same.
 */
#include "internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef unsigned __int128 u128;

static const uint64_t pow10_u64[20] = {1ull,
                                       10ull,
                                       100ull,
                                       1000ull,
                                       10000ull,
                                       100000ull,
                                       1000000ull,
                                       10000000ull,
                                       100000000ull,
                                       1000000000ull,
                                       10000000000ull,
                                       100000000000ull,
                                       1000000000000ull,
                                       10000000000000ull,
                                       100000000000000ull,
                                       1000000000000000ull,
                                       10000000000000000ull,
                                       100000000000000000ull,
                                       1000000000000000000ull,
                                       10000000000000000000ull};

/* 10^k, k <= 38 (10^38 < 2^127): one product of two table entries. */
static u128 pow10_u128(int k) {
  return k <= 19 ? pow10_u64[k] : (u128)pow10_u64[19] * pow10_u64[k - 19];
}

/* 5^k, k <= 54, the same way (5^27 < 2^63). */
static u128 pow5_u128(int k) {
  uint64_t p = 1;
  for (int i = 0; i < (k < 27 ? k : 27); i++)
    p *= 5;
  if (k <= 27)
    return p;
  uint64_t q = 1;
  for (int i = 27; i < k; i++)
    q *= 5;
  return (u128)p * q;
}

/* The decimal digits of n > 0: from its bit length (log10 2 ~ 1233/4096),
 * then one comparison. */
static int ndigits(u128 n) {
  uint64_t hi = (uint64_t)(n >> 64), lo = (uint64_t)n;
  int bits = hi ? 128 - __builtin_clzll(hi) : 64 - __builtin_clzll(lo);
  int d = ((bits - 1) * 1233 >> 12) + 1;
  return d < 39 && n >= pow10_u128(d) ? d + 1 : d;
}

/* |x| as n x 10^e10 exactly, n an integer: false when that needs more than
 * 128 bits (x far from 1), or x is not a float's value. */
static bool exact_decimal(double x, u128 *n, int *e10) {
  int e2;
  double m = frexp(fabs(x), &e2); /* |x| = m 2^e2, 0.5 <= m < 1 */
  double sig = ldexp(m, 24);
  if (sig != floor(sig))
    return false; /* more than 24 significant bits */
  u128 s = (u128)sig;
  int e = e2 - 24; /* |x| = s 2^e */
  if (e >= 0) {
    if (e > 103)
      return false;
    *n = s << e;
    *e10 = 0;
    return true;
  }
  if (-e > 41) /* s 5^-e must fit: 5^41 < 2^96 */
    return false;
  *n = s * pow5_u128(-e); /* |x| = s 5^-e 10^e */
  *e10 = e;
  return true;
}

/* n rounded to prec significant digits, half to even: *q (prec digits) and
 * the decimal exponent of its first digit. */
static void round_digits(u128 n, int e10, int prec, uint64_t *q, int *exp10) {
  int nd = ndigits(n);
  if (nd <= prec) {
    *q = (uint64_t)(n * pow10_u128(prec - nd));
    *exp10 = nd - 1 + e10;
    return;
  }
  u128 div = pow10_u128(nd - prec), qq = n / div, r = n - qq * div, half = div / 2;
  uint64_t v = (uint64_t)qq;
  if (r > half || (r == half && (v & 1)))
    v++;
  *exp10 = nd - 1 + e10;
  if (v == (uint64_t)pow10_u128(prec)) { /* 9.99.. rounded up to 10.0.. */
    v /= 10;
    ++*exp10;
  }
  *q = v;
}

/* "%.*g"'s layout of prec digits d[] (trailing zeros dropped) with
 * exponent x: fixed for -4 <= x < prec, else d.ddde+XX. */
static size_t layout_g(char *out, bool neg, const char *d, int prec, int x) {
  int keep = prec;
  while (keep > 1 && d[keep - 1] == '0')
    keep--;
  char *o = out;
  if (neg)
    *o++ = '-';
  if (x < -4 || x >= prec) {
    *o++ = d[0];
    if (keep > 1) {
      *o++ = '.';
      memcpy(o, d + 1, (size_t)keep - 1);
      o += keep - 1;
    }
    o += sprintf(o, "e%c%02d", x < 0 ? '-' : '+', x < 0 ? -x : x);
    return (size_t)(o - out);
  }
  if (x < 0) {
    memcpy(o, "0.", 2);
    o += 2;
    for (int i = 0; i < -x - 1; i++)
      *o++ = '0';
    memcpy(o, d, (size_t)keep);
    o += keep;
  } else {
    memcpy(o, d, (size_t)x + 1 > (size_t)keep ? (size_t)keep : (size_t)x + 1);
    o += x + 1 > keep ? keep : x + 1;
    for (int i = keep; i < x + 1; i++)
      *o++ = '0';
    if (keep > x + 1) {
      *o++ = '.';
      memcpy(o, d + x + 1, (size_t)(keep - x - 1));
      o += keep - x - 1;
    }
  }
  *o = 0;
  return (size_t)(o - out);
}

size_t attn__fmt_g(char out[32], double x, int prec) {
  u128 n;
  int e10, x10;
  uint64_t q;
  if (prec < 1 || prec > 17 || !isfinite(x) || x == 0 || !exact_decimal(x, &n, &e10))
    return (size_t)snprintf(out, 32, "%.*g", prec, x);
  round_digits(n, e10, prec, &q, &x10);
  char d[24];
  for (int i = prec - 1; i >= 0; i--, q /= 10)
    d[i] = (char)('0' + q % 10);
  return layout_g(out, signbit(x), d, prec, x10);
}

/* 10^k exactly, k <= 22. */
static const double exact_pow10[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                                       1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                                       1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* A JSON number's digits (the grammar is checked before: -?int frac? exp?)
 * as m x 10^e: false when m passes 2^53 or e is out of int range. */
static bool split_number(const char *s, const char **end, uint64_t *m, int *e, bool *neg) {
  const char *p = s;
  uint64_t v = 0;
  int digits = 0, scale = 0;
  *neg = *p == '-';
  p += *neg;
  for (; *p >= '0' && *p <= '9'; p++)
    if (v || *p != '0')
      v = v * 10 + (uint64_t)(*p - '0'), digits++;
  if (*p == '.')
    for (p++; *p >= '0' && *p <= '9'; p++, scale--)
      if (v || *p != '0')
        v = v * 10 + (uint64_t)(*p - '0'), digits++;
  if (digits > 18)
    return false;
  if (*p == 'e' || *p == 'E') {
    p++;
    bool eneg = *p == '-';
    p += *p == '-' || *p == '+';
    int x = 0;
    for (; *p >= '0' && *p <= '9'; p++)
      if ((x = x * 10 + (*p - '0')) > 100000)
        return false;
    scale += eneg ? -x : x;
  }
  *end = p;
  *m = v;
  *e = scale;
  return v <= (1ull << 53);
}

double attn__parse_number(const char *s, char **end) {
  uint64_t m;
  int e;
  bool neg;
  const char *p;
  if (split_number(s, &p, &m, &e, &neg) && e >= -22 && e <= 22) {
    /* m and 10^|e| are exact doubles: one rounding, as strtod's */
    double v = e < 0 ? (double)m / exact_pow10[-e] : (double)m * exact_pow10[e];
    *end = (char *)(uintptr_t)p;
    return neg ? -v : v;
  }
  return strtod(s, end);
}

float attn__parse_float(const char *s) {
  char *end;
  double d = attn__parse_number(s, &end);
  /* Rounding d to float is rounding the text to float unless d sits on
   * the midpoint between two floats, where the text may lie on either side
   * of it; d far outside float's range goes to strtof too. */
  if (fabs(d) < 0x1p-126 || fabs(d) > 0x1p127)
    return strtof(s, NULL);
  float f = (float)d;
  if ((double)f != d) {
    float g = nextafterf(f, d > (double)f ? INFINITY : -INFINITY);
    if (((double)f + (double)g) / 2 == d)
      return strtof(s, NULL);
  }
  return f;
}
