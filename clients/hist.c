/*
 * hist.c — the log-linear histogram of hist.h.
 *
 * Index layout (S = 128 sub-buckets): values 0 .. 2S-1 map to themselves;
 * a value v >= 2S with k = floor(log2 v) maps to 2S + (k - 8)·S + (v >> (k - 7)) - S.
 */
#include "hist.h"

#include <stdlib.h>
#include <string.h>

#define SUB (1u << TOOL_HIST_SUB_BITS)

unsigned tool_hist_index(uint64_t v) {
  if (v < 2 * SUB)
    return (unsigned)v;
  unsigned k = 63u - (unsigned)__builtin_clzll(v);
  unsigned shift = k - TOOL_HIST_SUB_BITS;
  return 2 * SUB + (k - TOOL_HIST_SUB_BITS - 1) * SUB + (unsigned)(v >> shift) - SUB;
}

uint64_t tool_hist_bucket_lo(unsigned i) {
  if (i < 2 * SUB)
    return i;
  unsigned r = i - 2 * SUB;
  unsigned k = r / SUB + TOOL_HIST_SUB_BITS + 1;
  uint64_t sub = SUB + r % SUB;
  return sub << (k - TOOL_HIST_SUB_BITS);
}

uint64_t tool_hist_bucket_hi(unsigned i) {
  if (i < 2 * SUB)
    return i;
  unsigned r = i - 2 * SUB;
  unsigned k = r / SUB + TOOL_HIST_SUB_BITS + 1;
  return tool_hist_bucket_lo(i) + ((uint64_t)1 << (k - TOOL_HIST_SUB_BITS)) - 1;
}

int tool_hist_init(tool_hist *h) {
  memset(h, 0, sizeof *h);
  h->counts = calloc(TOOL_HIST_BUCKETS, sizeof *h->counts);
  if (!h->counts)
    return -1;
  h->min = UINT64_MAX;
  return 0;
}

void tool_hist_free(tool_hist *h) {
  free(h->counts);
  h->counts = NULL;
}

void tool_hist_record_n(tool_hist *h, uint64_t v, uint64_t n) {
  if (!n)
    return;
  h->counts[tool_hist_index(v)] += n;
  h->total += n;
  h->sum += (long double)v * (long double)n;
  if (v < h->min)
    h->min = v;
  if (v > h->max)
    h->max = v;
}

void tool_hist_record(tool_hist *h, uint64_t v) { tool_hist_record_n(h, v, 1); }

void tool_hist_merge(tool_hist *dst, const tool_hist *src) {
  if (!src->total)
    return;
  for (unsigned i = 0; i < TOOL_HIST_BUCKETS; i++)
    dst->counts[i] += src->counts[i];
  dst->total += src->total;
  dst->sum += src->sum;
  if (src->min < dst->min)
    dst->min = src->min;
  if (src->max > dst->max)
    dst->max = src->max;
}

double tool_hist_percentile(const tool_hist *h, double p) {
  if (!h->total)
    return 0;
  if (p <= 0)
    return (double)h->min;
  if (p >= 100)
    return (double)h->max;
  /* the rank of the order statistic: ceil(p/100 · count), at least 1 */
  long double want = (long double)p / 100.0L * (long double)h->total;
  uint64_t rank = (uint64_t)want;
  if ((long double)rank < want)
    rank++;
  if (rank < 1)
    rank = 1;
  if (rank > h->total)
    rank = h->total;
  uint64_t seen = 0;
  for (unsigned i = 0; i < TOOL_HIST_BUCKETS; i++) {
    seen += h->counts[i];
    if (seen >= rank) {
      uint64_t lo = tool_hist_bucket_lo(i), hi = tool_hist_bucket_hi(i);
      if (lo < h->min)
        lo = h->min;
      if (hi > h->max)
        hi = h->max;
      return ((double)lo + (double)hi) / 2;
    }
  }
  return (double)h->max;
}

uint64_t tool_hist_max(const tool_hist *h) { return h->max; }
uint64_t tool_hist_min(const tool_hist *h) { return h->total ? h->min : 0; }
double tool_hist_mean(const tool_hist *h) {
  return h->total ? (double)(h->sum / (long double)h->total) : 0;
}
uint64_t tool_hist_count(const tool_hist *h) { return h->total; }
