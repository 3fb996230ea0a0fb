/*
 * deadline.c — --timeout and hung-up clients, for every admitted job
 * (deadline.h).
 *
 * One one-shot timer of the loop serves all jobs: it is due at the
 * earliest deadline of a job not yet answered, and at least every
 * ATTND_POLL_MS while any is, to peek at each client's socket. A job past
 * its deadline is answered 504 whatever it is doing (queued, decoding,
 * computing, encoding); one whose client closed or reset the connection is
 * closed without a reply. Either way the loop cancels its engine work.
 *
 * Per-request timers would each need a uv_close() before their request is
 * freed, on the loop, while requests can also be freed on the HTTP thread;
 * one timer over the loop's own list of jobs has no such lifetime.
 */
#include "deadline.h"

#include <math.h>

int attnd_deadline_due(const attnd_server *s, attnd_req *r, double now) {
  if (now >= r->t_received + s->cfg->timeout)
    return ATTND_CANCEL_TIMEOUT;
  if (s->transport->client_gone(r))
    return ATTND_CANCEL_CLIENT_CLOSED;
  return -1;
}

int64_t attnd_deadline_next(const attnd_server *s, double now) {
  double due = INFINITY;
  for (attnd_req *r = s->act_head; r; r = r->act_next)
    if (!r->answered && r->t_received + s->cfg->timeout < due)
      due = r->t_received + s->cfg->timeout;
  if (due == INFINITY)
    return -1;
  double ms = ceil((due - now) * 1e3);
  return ms <= 0 ? 0 : ms >= ATTND_POLL_MS ? ATTND_POLL_MS : (int64_t)ms;
}
