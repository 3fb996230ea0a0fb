/*
 * deadline.c — --timeout and hung-up clients, for every admitted job.
 *
 * One one-shot libuv timer serves all jobs: it is due at the earliest
 * deadline of a job not yet answered, and at least every ATTND_POLL_MS
 * while any is, to peek at each client's socket. A job past its deadline
 * (counted from its headers' arrival) is answered 504 whatever it is doing
 * (queued, decoding, computing, encoding); one whose client closed or reset the
 * connection is closed without a reply. Either way its engine work is
 * canceled (attnd_loop_cancel).
 *
 * Per-request timers would each need a uv_close() before their request is
 * freed, on the loop, while requests can also be freed on the HTTP thread;
 * one timer over the loop's own list of jobs has no such lifetime.
 */
#include "server.h"

#include <math.h>

static void on_tick(uv_timer_t *t) {
  attnd_server *s = t->data;
  double now = attn_now();
  attnd_req *next;
  for (attnd_req *r = s->act_head; r; r = next) {
    next = r->act_next; /* canceling a queued job unlinks (and may free) it */
    if (r->answered)
      continue;
    if (now >= r->t_received + s->cfg->timeout)
      attnd_loop_cancel(s, r, ATTND_CANCEL_TIMEOUT);
    else if (s->transport->client_gone(r))
      attnd_loop_cancel(s, r, ATTND_CANCEL_CLIENT_CLOSED);
  }
  attnd_deadline_arm(s);
}

void attnd_deadline_arm(attnd_server *s) {
  double due = INFINITY;
  for (attnd_req *r = s->act_head; r; r = r->act_next)
    if (!r->answered && r->t_received + s->cfg->timeout < due)
      due = r->t_received + s->cfg->timeout;
  if (due == INFINITY) {
    uv_timer_stop(&s->tick);
    return;
  }
  double ms = ceil((due - attn_now()) * 1e3);
  uint64_t delay = ms <= 0 ? 0 : ms >= ATTND_POLL_MS ? ATTND_POLL_MS : (uint64_t)ms;
  /* Never postpone a tick already due sooner: a steady stream of
   * admissions must not starve the polling for resets. */
  if (uv_is_active((uv_handle_t *)&s->tick) && uv_timer_get_due_in(&s->tick) <= delay)
    return;
  uv_timer_start(&s->tick, on_tick, delay, 0);
}

int attnd_deadline_init(attnd_server *s) {
  s->tick.data = s;
  return uv_timer_init(&s->loop, &s->tick);
}
