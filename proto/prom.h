/*
 * prom.h — the Prometheus text exposition format (version 0.0.4) written
 * on an attn_sbuf: family headers, counters, gauges and histograms, with
 * the format's escapes. Every module that exposes series for GET /metrics
 * writes them through here, so the text is well formed in one place.
 *
 * A family is its `# HELP` and `# TYPE` lines (attn_prom_family) followed
 * by its samples; attn_prom_counter and attn_prom_gauge write a family of
 * one sample without labels in one call. Names (of metrics and of labels)
 * are the caller's fixed identifiers and go out as they are; label values
 * may be any bytes and are escaped (backslash, double quote, newline), as
 * is HELP text (backslash, newline). Like every attn_sbuf writer, these
 * never fail on their own: a failed allocation leaves b->oom set.
 *
 *   attn_prom_family(b, "x_total", "counter", "Things done, by kind.");
 *   attn_prom_label l[] = {{"kind", "big"}};
 *   attn_prom_sample_u64(b, "x_total", l, 1, 42);   // x_total{kind="big"} 42
 *
 * It lives beside attn_sbuf, which it writes on, but has a header of its
 * own: proto.h is the contract of the request and reply codecs that the
 * clients share, and this is the server's exposition, a separate job.
 */
#ifndef ATTN_PROM_H
#define ATTN_PROM_H

#include "proto.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One label of a sample: name as it is, value escaped. */
typedef struct attn_prom_label {
  const char *name;
  const char *value;
} attn_prom_label;

/* The `# HELP` and `# TYPE` lines; type is "counter", "gauge" or
 * "histogram". */
void attn_prom_family(attn_sbuf *b, const char *name, const char *type, const char *help);

/* One sample: name, then {labels} when n > 0, then its value. Integers
 * are written in full; a double in the shortest form that reads back as
 * the same double (NaN, +Inf, -Inf as the format spells them). */
void attn_prom_sample_u64(attn_sbuf *b, const char *name, const attn_prom_label *l, int n,
                          uint64_t v);
void attn_prom_sample_i64(attn_sbuf *b, const char *name, const attn_prom_label *l, int n,
                          int64_t v);
void attn_prom_sample_f64(attn_sbuf *b, const char *name, const attn_prom_label *l, int n,
                          double v);

/* A whole family of one sample without labels. A gauge is signed: it can
 * go down, and a bug that takes one below zero shows as a negative value. */
void attn_prom_counter(attn_sbuf *b, const char *name, const char *help, uint64_t v);
void attn_prom_gauge(attn_sbuf *b, const char *name, const char *help, int64_t v);

/* One histogram's observations: counts[i] fell in bucket i (at most les[i]
 * and above the bound before it; the last, counts[nbounds], above every
 * bound). les[i] is bound i as `le` shows it, ascending. */
typedef struct attn_prom_hist {
  const char *const *les;
  const uint64_t *counts; /* nbounds + 1 */
  int nbounds;
  double sum;
} attn_prom_hist;

/* One histogram series (its family's header is the caller's): name_bucket
 * for each bound and +Inf, cumulative, with the labels and then le; then
 * name_sum and name_count, whose count is the +Inf bucket's by
 * construction. */
void attn_prom_histogram(attn_sbuf *b, const char *name, const attn_prom_label *l, int n,
                         const attn_prom_hist *h);

#ifdef __cplusplus
}
#endif

#endif
