/* load_sched.c — see load_sched.h. */
#include "load_sched.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

#define TICK_MS 100

static void conn_issue(tool_load *L, tool_load_conn *c);
static void dispatch_due(tool_load *L);
static void load_stop(tool_load *L);

static tool_load *owner(const tool_load_conn *c) { return c->w->owner; }

/* ---- request life ------------------------------------------------------- */

static bool limit_reached(const tool_load *L) {
  return L->max_requests > 0 && L->n.sent >= (uint64_t)L->max_requests;
}

static void check_done(tool_load *L) {
  if (L->max_requests > 0 && !L->stopping) {
    uint64_t ended = L->n.answered;
    for (int t = 0; t < TOOL_TERR_COUNT; t++)
      ended += L->n.terr[t];
    if (ended >= (uint64_t)L->max_requests)
      load_stop(L);
  }
}

/* --duration is over (checked where work is started, since a loop iteration
 * that writes many large bodies can delay the end timer). */
static bool past_end(tool_load *L) {
  if (L->max_requests > 0 || L->stopping)
    return L->stopping;
  if (tool_load_now_ns() - L->t0 >= (uint64_t)(L->duration * 1e9)) {
    load_stop(L);
    return true;
  }
  return false;
}

/* Starts a request on c whose latency counts from start. */
static void start(tool_load *L, tool_load_conn *c, uint64_t t) {
  L->n.sent++;
  tool_load_conn_start(c, t);
}

/* Closed loop: the connection's next request, if the plan wants one. */
static void conn_issue(tool_load *L, tool_load_conn *c) {
  if (past_end(L) || limit_reached(L) || c->active || c->write_pending)
    return;
  if (c->state == TOOL_LOAD_FREE && c->connect_failed && tool_load_now_ns() < c->retry_ns)
    return; /* the tick retries it */
  if (c->state == TOOL_LOAD_OPEN || c->state == TOOL_LOAD_FREE)
    start(L, c, tool_load_now_ns());
}

/* ---- what the connections report ----------------------------------------- */

static void on_connected(tool_load_conn *c, bool busy) {
  tool_load *L = owner(c);
  L->ever_connected = true;
  if (!busy && L->open_loop)
    dispatch_due(L);
}

static bool on_answered(tool_load_conn *c, int status) {
  tool_load *L = owner(c);
  uint64_t t = tool_load_now_ns();
  L->n.answered++;
  if (status >= 200 && status < 300)
    L->n.ok++;
  if (status >= 100 && status < 600)
    L->n.status[status]++;
  else
    L->n.status_other++;
  tool_hist_record(&L->hist, t > c->start_ns ? (t - c->start_ns + 500) / 1000 : 0);
  check_done(L);
  return !L->stopping;
}

/* The connection is free for another request. */
static void on_ready(tool_load_conn *c) {
  tool_load *L = owner(c);
  if (past_end(L))
    return;
  if (L->open_loop)
    dispatch_due(L);
  else
    conn_issue(L, c);
}

static void on_failed(tool_load_conn *c, int kind, int err, bool busy) {
  tool_load *L = owner(c);
  if (kind == TOOL_TERR_CONNECT)
    L->connect_err = err;
  if (busy)
    L->n.terr[kind]++;
  check_done(L);
}

/* Nothing has ever connected: the server is not there, and the run stops. */
static bool on_unreachable(tool_load_conn *c, int err) {
  tool_load *L = owner(c);
  if (L->ever_connected)
    return false;
  L->connect_err = err;
  if (tool_load_conn_drop(c))
    L->n.terr[TOOL_TERR_CONNECT]++;
  L->no_connect = true;
  load_stop(L);
  return true;
}

static const tool_load_conn_ops conn_ops = {.connected = on_connected,
                                            .answered = on_answered,
                                            .ready = on_ready,
                                            .failed = on_failed,
                                            .unreachable = on_unreachable};

static tool_load_conn *pool_add(tool_load *L) {
  tool_load_conn *c = tool_load_conn_new(&L->wire);
  if (c)
    L->pool[L->npool++] = c;
  return c;
}

/* ---- the open loop -------------------------------------------------------- */

static uint64_t due_ns(const tool_load *L, uint64_t i) {
  return L->t0 + (uint64_t)((double)i * 1e9 / L->rate);
}

static bool sched_more(const tool_load *L) {
  if (L->max_requests > 0)
    return L->next_i < (uint64_t)L->max_requests;
  return due_ns(L, L->next_i) < L->t0 + (uint64_t)(L->duration * 1e9);
}

/* An idle open connection, else a free one to connect, else a new one. */
static tool_load_conn *pool_get(tool_load *L) {
  uint64_t t = tool_load_now_ns();
  tool_load_conn *free_c = NULL;
  for (int i = 0; i < L->npool; i++) {
    tool_load_conn *c = L->pool[i];
    if (c->active || c->write_pending)
      continue;
    if (c->state == TOOL_LOAD_OPEN && attn_http_reply_idle(&c->rp))
      return c;
    if (!free_c && c->state == TOOL_LOAD_FREE && (!c->connect_failed || t >= c->retry_ns))
      free_c = c;
  }
  if (free_c)
    return free_c;
  if (L->npool < L->max_pool)
    return pool_add(L);
  return NULL;
}

static void on_sched(uv_timer_t *t) { dispatch_due(t->data); }

static void dispatch_due(tool_load *L) {
  if (!L->open_loop || past_end(L))
    return;
  uint64_t t = tool_load_now_ns();
  while (sched_more(L) && due_ns(L, L->next_i) <= t) {
    if (past_end(L))
      return;
    tool_load_conn *c = pool_get(L);
    if (!c)
      return; /* backlog: a connection that frees up calls again */
    uint64_t due = due_ns(L, L->next_i);
    L->next_i++;
    start(L, c, due);
    if (L->stopping)
      return;
  }
  if (sched_more(L)) {
    uint64_t d = due_ns(L, L->next_i);
    uv_timer_start(&L->sched, on_sched, d > t ? (d - t) / 1000000 : 0, 0);
  }
}

/* ---- timers --------------------------------------------------------------- */

static void print_progress(tool_load *L, uint64_t t) {
  double secs = (double)(t - L->t0) * 1e-9;
  double dt = (double)(t - L->last_prog_ns) * 1e-9;
  double rps = dt > 0 ? (double)(L->n.answered - L->last_prog_answered) / dt : 0;
  uint64_t terr = tool_load_transport_errors(&L->n);
  printf("\r%6.1f s  %9.1f requests/s  p99 %9.3f ms  answered %llu  errors %llu\033[K", secs, rps,
         tool_hist_percentile(&L->hist, 99) / 1e3, (unsigned long long)L->n.answered,
         (unsigned long long)(L->n.answered - L->n.ok + terr));
  fflush(stdout);
  L->last_prog_ns = t;
  L->last_prog_answered = L->n.answered;
}

static void on_tick(uv_timer_t *tm) {
  tool_load *L = tm->data;
  uint64_t t = tool_load_now_ns();
  uint64_t limit = (uint64_t)(L->timeout * 1e9);
  for (int i = 0; i < L->npool && !L->stopping; i++) {
    tool_load_conn *c = L->pool[i];
    if (c->active && t - c->sent_ns > limit)
      tool_load_conn_fail(c, TOOL_TERR_TIMEOUT);
    else if (!L->open_loop && !c->active && c->state == TOOL_LOAD_FREE)
      conn_issue(L, c); /* retries after a failed connect */
  }
  if (L->open_loop && !L->stopping)
    dispatch_due(L);
  if (L->progress && !L->stopping && t - L->last_prog_ns >= 1000000000ull)
    print_progress(L, t);
}

static void on_end(uv_timer_t *t) { load_stop(t->data); }

static void on_sigint(uv_signal_t *s, int signum) {
  (void)signum;
  load_stop(s->data);
}

static void load_stop(tool_load *L) {
  if (L->stopping)
    return;
  L->stopping = true;
  L->t_end = tool_load_now_ns();
  for (int i = 0; i < L->npool; i++) {
    tool_load_conn *c = L->pool[i];
    if (c->active && L->no_connect && c->state == TOOL_LOAD_CONNECTING)
      L->n.terr[TOOL_TERR_CONNECT]++; /* it would fail the same way */
    else if (c->active)
      L->n.in_flight_end++;
    tool_load_conn_drop(c);
    tool_load_conn_close(c);
  }
  if (L->open_loop && sched_more(L)) {
    uint64_t t = L->t_end;
    while (sched_more(L) && due_ns(L, L->next_i) <= t) {
      L->n.backlog_end++;
      L->next_i++;
    }
  }
  uv_close((uv_handle_t *)&L->tick, NULL);
  uv_close((uv_handle_t *)&L->sched, NULL);
  uv_close((uv_handle_t *)&L->end, NULL);
  uv_close((uv_handle_t *)&L->sigint, NULL);
}

/* ---- the run -------------------------------------------------------------- */

/* The first requests: the closed loop's connections, or the open loop's
 * due ones. 0, or 1 after a message when out of memory. */
static int load_begin(tool_load *L) {
  if (L->open_loop) {
    dispatch_due(L);
    return 0;
  }
  for (int i = 0; i < L->concurrency && !L->stopping; i++) {
    tool_load_conn *cn = pool_add(L);
    if (!cn) {
      fprintf(stderr, "attn load: out of memory\n");
      load_stop(L);
      return 1;
    }
    conn_issue(L, cn);
  }
  return 0;
}

int tool_load_run(tool_load *L) {
  uv_loop_t loop;
  uv_loop_init(&loop);
  L->wire.loop = &loop;
  L->wire.ops = &conn_ops;
  L->wire.owner = L;
  uv_timer_init(&loop, &L->tick);
  uv_timer_init(&loop, &L->sched);
  uv_timer_init(&loop, &L->end);
  uv_signal_init(&loop, &L->sigint);
  L->tick.data = L->sched.data = L->end.data = L->sigint.data = L;
  uv_signal_start(&L->sigint, on_sigint, SIGINT);
  L->t0 = L->last_prog_ns = tool_load_now_ns();
  uv_timer_start(&L->tick, on_tick, TICK_MS, TICK_MS);
  if (L->max_requests == 0)
    uv_timer_start(&L->end, on_end, (uint64_t)(L->duration * 1e3 + 0.5), 0);
  int rc = load_begin(L);
  uv_run(&loop, UV_RUN_DEFAULT);
  if (!L->stopping) /* cannot happen: the timers keep the loop alive */
    load_stop(L);
  uv_run(&loop, UV_RUN_DEFAULT);
  if (uv_loop_close(&loop) != 0)
    fprintf(stderr, "attn load: warning: handles left open\n");
  for (int i = 0; i < L->npool; i++) {
    L->n.bytes_sent += L->pool[i]->bytes_sent;
    L->n.bytes_recv += L->pool[i]->bytes_recv;
  }
  return rc;
}

void tool_load_free(tool_load *L) {
  for (int i = 0; i < L->npool; i++)
    tool_load_conn_free(L->pool[i]);
  tool_hist_free(&L->hist);
}
