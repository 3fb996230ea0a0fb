/*
 * check.c — the verdicts on a job's values that every backend shares.
 *
 * Each backend scans its inputs its own way (the CPU kernels as they load
 * tiles, the CUDA backend on the device, the reference element by
 * element); what it found is judged here, so the limits and the messages
 * are the same whichever backend ran the job.
 */
#include "check.h"

#include "request_int.h"

#include <float.h>
#include <math.h>
#include <string.h>

int attn__check_lse(const attn_request *r, attn_status *st) {
  if (!r->lse_in)
    return 0;
  for (int64_t bh = 0; bh < r->batch * r->heads_q; bh++)
    for (int64_t i = 0; i < r->seq_q; i++) {
      float x = r->lse_in[bh * r->seq_q + i];
      int64_t lo, hi;
      attn__request_keys(r, i, &lo, &hi);
      if (isnan(x) || x == INFINITY || (x == -INFINITY && hi >= lo))
        return attn_status_set(st, x == -INFINITY ? ATTN_EINVAL : ATTN_ENONFINITE,
                               "tensor lse holds %g at [%lld, %lld, %lld], a row that %s; "
                               "pass the lse of the forward call on the same inputs",
                               (double)x, (long long)(bh / r->heads_q),
                               (long long)(bh % r->heads_q), (long long)i,
                               hi >= lo ? "sees keys" : "sees no key");
    }
  return 0;
}

int attn__nonfinite(attn_status *st, const char *tensor, int64_t b, int64_t h, int64_t n,
                    int64_t d) {
  return attn_status_set(st, ATTN_ENONFINITE,
                         "tensor %s holds a non-finite value at [%lld, %lld, %lld, %lld]; "
                         "inputs must be finite",
                         tensor, (long long)b, (long long)h, (long long)n, (long long)d);
}

int attn__check_magnitudes(const attn_request *r, const double maxabs[3], attn_status *st) {
  /* Bounds on every intermediate: a scaled query element, a score (a sum of
   * D products, in log2 units) and an unnormalized output (a sum of seq_kv
   * terms p·v with p <= 1). Half of FLT_MAX leaves room for rounding. */
  const double lim = FLT_MAX / 2;
  double sc = fabs(attn_request_scale(r)) * M_LOG2E;
  double score = sc * maxabs[0] * maxabs[1] * (double)r->head_dim;
  if (sc * maxabs[0] > lim || score > lim)
    return attn_status_set(st, ATTN_ERANGE,
                           "attention scores could overflow float32: |scale| x "
                           "max|q| x max|k| x head_dim = %.3g; scale q or k down",
                           score / M_LOG2E);
  if (maxabs[2] * (double)r->seq_kv > lim)
    return attn_status_set(st, ATTN_ERANGE,
                           "values could overflow float32 when summed: max|v| x "
                           "seq_kv = %.3g; scale v down",
                           maxabs[2] * (double)r->seq_kv);
  return 0;
}

int attn__check_magnitudes_bwd(const attn_request *r, const double maxabs[5], attn_status *st) {
  int rc = attn__check_magnitudes(r, maxabs, st);
  if (rc)
    return rc;
  const double lim = FLT_MAX / 2, D = (double)r->head_dim;
  const double rows = (double)r->seq_q * (double)(r->heads_q / r->heads_kv);
  const double sc = fmax(1.0, fabs(attn_request_scale(r)));
  /* |dS| <= P·(|dP| + |Dᵢ|) with P <= 1; dQ sums P-weighted terms of a row
   * (Σ P = 1), dK and dV sum over every query row of the group. */
  double dp = maxabs[4] * maxabs[2] * D, di = maxabs[4] * maxabs[3] * D, ds = dp + di;
  if (dp > lim || di > lim || ds > lim)
    return attn_status_set(st, ATTN_ERANGE,
                           "gradients could overflow float32: max|do| x max(|v|, |o|) x "
                           "head_dim = %.3g; scale do down",
                           fmax(dp, di));
  double dk = sc * ds * maxabs[0] * rows, dq = sc * ds * maxabs[1], dv = maxabs[4] * rows;
  if (dk > lim || dq > lim || dv > lim)
    return attn_status_set(st, ATTN_ERANGE,
                           "gradients could overflow float32 when summed over %.0f query rows: "
                           "dk up to %.3g, dq up to %.3g, dv up to %.3g; scale do down",
                           rows, dk, dq, dv);
  return 0;
}

/* The largest magnitude's bits, eight lanes at a time: every request's
 * inputs pass here once, and the compiler vectorizes lanes of eight (SSE2's
 * unsigned max is emulated, still several times the scalar loop). */
static uint32_t top_bits32(const uint32_t *x, size_t n) {
  uint32_t lane[8] = {0};
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; k++)
      lane[k] = (x[i + k] & 0x7fffffffu) > lane[k] ? x[i + k] & 0x7fffffffu : lane[k];
  for (; i < n; i++)
    lane[0] = (x[i] & 0x7fffffffu) > lane[0] ? x[i] & 0x7fffffffu : lane[0];
  uint32_t top = 0;
  for (int k = 0; k < 8; k++)
    top = lane[k] > top ? lane[k] : top;
  return top;
}

/* The same for 16-bit elements, sixteen lanes at a time (SSE2's signed
 * max suffices: the sign bit is masked off). */
static uint32_t top_bits16(const uint16_t *x, size_t n) {
  uint16_t lane[16] = {0};
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int k = 0; k < 16; k++)
      lane[k] = (uint16_t)(x[i + k] & 0x7fffu) > lane[k] ? (uint16_t)(x[i + k] & 0x7fffu) : lane[k];
  for (; i < n; i++)
    lane[0] = (uint16_t)(x[i] & 0x7fffu) > lane[0] ? (uint16_t)(x[i] & 0x7fffu) : lane[0];
  uint32_t top = 0;
  for (int k = 0; k < 16; k++)
    top = lane[k] > top ? lane[k] : top;
  return top;
}

float attn__absmax(const void *p, attn_dtype dt, size_t n) {
  uint32_t top = 0;
  if (dt == ATTN_F32) {
    top = top_bits32(p, n);
    float f;
    memcpy(&f, &top, sizeof f);
    return top >= 0x7f800000u ? -1.0f : f;
  }
  top = top_bits16(p, n);
  if (top >= (dt == ATTN_BF16 ? 0x7f80u : 0x7c00u))
    return -1.0f;
  uint16_t t = (uint16_t)top;
  return (float)attn_load_elem(&t, dt, 0);
}
