/*
 * load_sched.h — the scheduler of `attn load`: when each request goes out,
 * on which connection (load_conn.h), and how each one ended.
 *
 * Closed loop (concurrency N): N connections, each sends its next request
 * as soon as the previous answer has arrived; a request's latency runs from
 * its send. Open loop (rate R): request i is due at t0 + i/R whatever the
 * server does; it goes out on an idle connection of a pool that grows (up to
 * TOOL_LOAD_MAX_POOL connections) while all are busy, and its latency runs
 * from that intended start, so a stalled server shows in the percentiles
 * instead of silently slowing the sender (no coordinated omission). Requests
 * that are due while the pool is full wait (the backlog) and are sent as
 * connections free up, still timed from their intended start.
 *
 * Counting: a request is "sent" when it is handed to a connection (a failed
 * connect counts it as a connect error). Each sent request ends exactly once:
 * answered (any HTTP status), a transport error (connect, write, read,
 * timeout, protocol), or still in flight when the run stops, so
 * sent = answered + transport errors + in flight. Latencies of answered
 * requests (every status) go to a log-linear histogram (hist.h, within 1%).
 */
#ifndef TOOL_LOAD_SCHED_H
#define TOOL_LOAD_SCHED_H

#include "hist.h"
#include "load_conn.h"
#include "load_report.h"

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#define TOOL_LOAD_MAX_POOL 1024

typedef struct tool_load {
  /* The plan, the caller's: wire's addr, head and body, and these. */
  tool_load_wire wire;
  bool open_loop; /* by rate, else by concurrency */
  int concurrency;
  double rate;
  double duration;
  int64_t max_requests; /* 0: by duration */
  double timeout;       /* a request unanswered this long (s) is an error */
  bool progress;        /* a progress line on stdout each second */
  int max_pool;
  tool_hist hist; /* initialised by the caller */
  /* How it went, once tool_load_run returns. */
  tool_load_counts n;
  uint64_t t0, t_end;
  int npool;       /* connections made */
  bool no_connect; /* nothing ever connected: the server is not there */
  int connect_err; /* libuv's error of the last failed connect */
  /* The scheduler's own. */
  uv_timer_t tick, sched, end;
  uv_signal_t sigint;
  tool_load_conn *pool[TOOL_LOAD_MAX_POOL];
  uint64_t next_i; /* open loop: the next scheduled request */
  bool stopping, ever_connected;
  uint64_t last_prog_ns, last_prog_answered;
} tool_load;

/* Runs the plan on one libuv loop until it stops (its duration or request
 * count, or SIGINT); 0, or 1 after a message when out of memory for a
 * connection. */
int tool_load_run(tool_load *L);
/* Frees the pool and the histogram. */
void tool_load_free(tool_load *L);

#endif
