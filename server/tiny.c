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

/* Whether r's body is worth decoding here: small, plain, and for a server
 * whose engine computes on the CPU (a GPU job would block this thread on
 * the device's round trip). */
static bool may_be_tiny(const attnd_req *r) {
  return attnd_req_computes(r) && r->route->kind->tiny && r->encoding == ATTND_ENC_IDENTITY &&
         r->len <= ATTND_TINY_BODY && !strcmp(r->srv->backend, "cpu");
}

/* Whether the decoded request is a tiny job: one the CPU backend computes
 * on the calling thread (attn_engine_run_here), and small. */
static bool is_tiny(const attnd_req *r) {
  const attn_request *q = &r->pr.req;
  return q->pass == ATTN_FORWARD && !q->cu_seqlens_q && !strcmp(q->backend, "cpu") &&
         attn_request_flops(q) <= ATTND_TINY_FLOPS;
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

/* The job itself, holding its place: computed, encoded, made the reply. */
static void compute(attnd_req *r) {
  attnd_server *s = r->srv;
  attn_status st = {0};
  attnd_metrics_gauge_add(s->metrics, ATTND_GAUGE_INFLIGHT, 1);
  attnd_metrics_queue_wait(s->metrics, 0);
  int rc = attn_engine_run_here(s->engine, &r->pr.req, &r->res, &st);
  if (rc && !r->res.status.code)
    r->res.status = st; /* refused before it ran: no result was filled */
  r->t_engine = attn_now();
  attnd_work_encode_result(r);
  attnd_work_reply(r);
  if (r->status == 200)
    attnd_metrics_engine(s->metrics, r->res.backend, r->res.engine_seconds, r->res.flops);
  attnd_metrics_gauge_add(s->metrics, ATTND_GAUGE_INFLIGHT, -1);
}

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
  if (!is_tiny(r))
    return false;
  if (!attnd_jobs_take_place(r)) {
    attnd_work_drop_inputs(r);
    return true;
  }
  if (in_time(r, r->t_started))
    compute(r); /* its encode frees the inputs */
  else
    attnd_work_drop_inputs(r);
  r->srv->admitted--;
  return true;
}
