/*
 * load_report.h — what `attn load` counts during a run, and its report:
 * the text an operator reads, or one JSON object for scripts (--json).
 */
#ifndef TOOL_LOAD_REPORT_H
#define TOOL_LOAD_REPORT_H

#include "hist.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Transport errors: a sent request that got no HTTP answer. */
enum {
  TOOL_TERR_CONNECT,
  TOOL_TERR_WRITE,
  TOOL_TERR_READ,
  TOOL_TERR_TIMEOUT,
  TOOL_TERR_PROTOCOL,
  TOOL_TERR_COUNT
};

/* Each sent request ends once: sent = answered + transport errors + in
 * flight at the end (the report checks it). */
typedef struct tool_load_counts {
  uint64_t sent, answered, ok, terr[TOOL_TERR_COUNT], in_flight_end, backlog_end;
  uint64_t status[600], status_other; /* answers by HTTP status (100..599) */
  uint64_t bytes_sent, bytes_recv;
} tool_load_counts;

/* The run as planned and as it went, besides the counts. */
typedef struct tool_load_report {
  const char *url, *body_kind, *body_desc;
  size_t body_len;
  double flops, elapsed; /* flops per request (< 0: unknown), seconds */
  bool open_loop;
  double rate, duration;
  int concurrency, max_pool, connections;
  int64_t max_requests; /* 0: by duration */
} tool_load_report;

uint64_t tool_load_transport_errors(const tool_load_counts *n);
void tool_load_print_text(const tool_load_report *R, const tool_load_counts *n, const tool_hist *h);
void tool_load_print_json(const tool_load_report *R, const tool_load_counts *n, const tool_hist *h);

#endif
