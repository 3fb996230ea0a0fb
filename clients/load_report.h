/*
 * load_report.h — what `attn load` counts during a run, and its report:
 * the text an operator reads, or one JSON object for scripts (--json).
 */
#ifndef ATTN_LOAD_REPORT_H
#define ATTN_LOAD_REPORT_H

#include "hist.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Transport errors: a sent request that got no HTTP answer. */
enum {
  ATTN_TERR_CONNECT,
  ATTN_TERR_WRITE,
  ATTN_TERR_READ,
  ATTN_TERR_TIMEOUT,
  ATTN_TERR_PROTOCOL,
  ATTN_TERR_COUNT
};

/* Each sent request ends once: sent = answered + transport errors + in
 * flight at the end (the report checks it). */
typedef struct attn_load_counts {
  uint64_t sent, answered, ok, terr[ATTN_TERR_COUNT], in_flight_end, backlog_end;
  uint64_t status[600], status_other; /* answers by HTTP status (100..599) */
  uint64_t bytes_sent, bytes_recv;
} attn_load_counts;

/* The run as planned and as it went, besides the counts. */
typedef struct attn_load_report {
  const char *url, *body_kind, *body_desc;
  size_t body_len;
  double flops, elapsed; /* flops per request (< 0: unknown), seconds */
  bool open_loop;
  double rate, duration;
  int concurrency, max_pool, connections;
  int64_t max_requests; /* 0: by duration */
} attn_load_report;

uint64_t attn_load_transport_errors(const attn_load_counts *n);
void attn_load_print_text(const attn_load_report *R, const attn_load_counts *n, const attn_hist *h);
void attn_load_print_json(const attn_load_report *R, const attn_load_counts *n, const attn_hist *h);

#endif
