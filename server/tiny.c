/*
 * tiny.c — tiny jobs computed on the HTTP thread (tiny.h).
 */
#include "tiny.h"
#include "kind.h"
#include "route.h"
#include "errors.h"
#include "jobs.h"
#include "work.h"

#include <stdio.h>
#include <string.h>

/* Whether r's body is worth decoding here: small, plain, of a kind that
 * may run here, and for a server whose engine computes on the CPU (a GPU
 * job would block this thread on the device's round trip). */
static bool may_be_tiny(const attnd_req *r) {
  return r->srv->cfg->tiny_flops > 0 && attnd_req_computes(r) && r->route->kind->here &&
         r->encoding == ATTND_ENC_IDENTITY && r->len <= ATTND_TINY_BODY &&
         !strcmp(r->srv->backend, "cpu");
}

/* --timeout, as the loop's tick would find it: false with r's 504 set. */
static bool in_time(attnd_req *r, double now) {
  double late = now - r->t_received;
  if (late < r->srv->cfg->timeout)
    return true;
  char msg[200];
  snprintf(msg, sizeof msg,
           "no reply within the %g s deadline (--timeout): %.3f s had passed when its body "
           "was whole, and its job did not run",
           r->srv->cfg->timeout, late);
  attnd_req_fail(r, ATTND_ETIMEOUT, msg);
  return false;
}

/* The job itself, holding its place: computed by its kind if it is tiny
 * and can go at once, then encoded and made the reply; false (nothing
 * done) when it goes the queued way. */
static bool compute(attnd_req *r) {
  attnd_server *s = r->srv;
  attnd_metrics_gauge_add(s->metrics, ATTND_GAUGE_INFLIGHT, 1);
  bool done = r->route->kind->here(r) == 0;
  if (done) {
    attnd_metrics_tiny(s->metrics);
    r->t_engine = attn_now();
    attnd_work_encode_result(r);
    attnd_work_reply(r);
    if (r->status == 200)
      attnd_metrics_engine(s->metrics, r->res.backend, r->res.engine_seconds, r->res.flops);
  }
  attnd_metrics_gauge_add(s->metrics, ATTND_GAUGE_INFLIGHT, -1);
  return done;
}

/* Decoded here, r is computed here when its kind finds it tiny; a body that
 * does not decode, a full queue and a passed deadline are answered here
 * too. False when r goes the queued way, decoded. */
bool attnd_tiny_run(attnd_req *r) {
  if (!may_be_tiny(r))
    return false;
  r->t_admitted = r->t_started = attn_now();
  if (!attnd_work_reserve(r))
    return true;
  attn_status st;
  if (attnd_work_decode(r, &st) < 0) {
    attnd_req_fail(r, st.code, st.message);
    r->t_done = attn_now();
    attnd_work_drop_inputs(r);
    return true;
  }
  if (!attnd_jobs_take_place(r)) {
    attnd_work_drop_inputs(r);
    return true;
  }
  bool done = true;
  if (!in_time(r, r->t_started))
    attnd_work_drop_inputs(r);
  else
    done = compute(r); /* its encode frees the inputs */
  r->srv->admitted--;
  return done;
}
