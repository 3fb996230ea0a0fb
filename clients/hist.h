/*
 * hist.h — a log-linear latency histogram (HdrHistogram-like) for `attn load`.
 *
 * Values are unsigned integers (microseconds for attn load); every value of
 * 0 .. 2^64 - 1 can be recorded (1 µs to far beyond an hour). Values below
 * 256 have a bucket each (exact). Above, each power-of-two range
 * [2^k, 2^(k+1)) is split into 128 equal sub-buckets of width 2^(k-7), so a
 * bucket spans at most 1/128 of its lowest value. A percentile reports the
 * middle of its bucket, clamped to [min, max]: its relative error is at most
 * 1/256 (0.4%), and never more than 1/128 (0.8%) of the true order statistic,
 * which is below the 1% bound. min, max, count and mean are exact (the mean
 * from an exact sum of the values).
 *
 * Memory: 7424 64-bit counters (58 KiB) per histogram.
 */
#ifndef TOOL_HIST_H
#define TOOL_HIST_H

#include <stdint.h>

#define TOOL_HIST_SUB_BITS 7 /* 128 sub-buckets per power of two */
#define TOOL_HIST_BUCKETS \
  ((2u << TOOL_HIST_SUB_BITS) + (64u - TOOL_HIST_SUB_BITS - 1u) * (1u << TOOL_HIST_SUB_BITS))

typedef struct tool_hist {
  uint64_t *counts; /* TOOL_HIST_BUCKETS */
  uint64_t total, min, max;
  long double sum; /* exact up to 2^64 for integer sums */
} tool_hist;

/* 0, or -1 when out of memory. */
int tool_hist_init(tool_hist *h);
void tool_hist_free(tool_hist *h);

void tool_hist_record(tool_hist *h, uint64_t value);
/* The same value n times. */
void tool_hist_record_n(tool_hist *h, uint64_t value, uint64_t n);
/* Adds src's values to dst. */
void tool_hist_merge(tool_hist *dst, const tool_hist *src);

/* The value at percentile p (0..100): the smallest recorded value v such
 * that at least p% of the values are <= v, within the error bound above;
 * p <= 0 gives min, p >= 100 gives max. 0 when empty. */
double tool_hist_percentile(const tool_hist *h, double p);
uint64_t tool_hist_max(const tool_hist *h); /* 0 when empty */
uint64_t tool_hist_min(const tool_hist *h); /* 0 when empty */
double tool_hist_mean(const tool_hist *h);  /* 0 when empty */
uint64_t tool_hist_count(const tool_hist *h);

/* Bucket arithmetic (exposed for the tests): the index of v, and the lowest
 * and highest value of bucket i. */
unsigned tool_hist_index(uint64_t v);
uint64_t tool_hist_bucket_lo(unsigned i);
uint64_t tool_hist_bucket_hi(unsigned i);

#endif
