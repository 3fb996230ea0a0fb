/*
 * submit.c — attn_engine_submit() and attn_engine_run(): a request
 * validated, given a backend and queued as a job.
 *
 * The top of the engine: a plain request becomes one job on the backend
 * picked for it (run on the caller's thread for attn_engine_run_here, where
 * the backend can); a variable-length batch goes to varlen.c, which makes one
 * job per sequence on one backend; values with a head dim of their own go
 * to dv.c, which pads them and comes back here. Either way the caller's callback runs
 * once, through attn__job_complete() (job.c).
 */
#include "dv.h"
#include "handle.h"
#include "varlen.h"

/* A valid request to its backend. dv.c's padded request comes back here,
 * not through submit: its width max(D, Dv) is D's and may pass Dv's limit
 * as the values' width, which the contract counts as Dv in a request. */
static int route(attn_engine *e, const attn_request *r, bool here, attn_done_fn done, void *arg,
                 attn_status *st) {
  int rc;
  if (attn_cancel_is_set(r->cancel))
    return attn_status_set(st, ATTN_ECANCELED, "the job was canceled before it was queued");
  if (!done)
    return attn_status_set(st, ATTN_EINVAL, "no completion callback");
  if (attn_request_dv(r) != r->head_dim)
    return attn__dv_submit(e, r, here, done, arg, route, st);
  if (r->cu_seqlens_q)
    return attn__varlen_submit(e, r, here, done, arg, st);
  const attn_backend *be;
  if ((rc = attn__engine_pick(e, r, &be, st)) < 0)
    return rc;
  return attn__backend_queue(be, attn__engine_jobs(e), r, here, done, arg, st);
}

static int submit(attn_engine *e, const attn_request *r, bool here, attn_done_fn done, void *arg,
                  attn_status *st) {
  int rc = attn_request_validate(r, st);
  return rc < 0 ? rc : route(e, r, here, done, arg, st);
}

int attn_engine_submit(attn_engine *e, const attn_request *r, attn_done_fn done, void *arg,
                       attn_status *st) {
  return submit(e, r, false, done, arg, st);
}

/* attn_engine_run's call, for attn__run_waiting. */
typedef struct run_ctx {
  attn_engine *e;
  const attn_request *r;
  bool here;
} run_ctx;

static int start_run(void *ctx, attn_done_fn done, void *arg, attn_status *st) {
  const run_ctx *c = ctx;
  return submit(c->e, c->r, c->here, done, arg, st);
}

static int run(attn_engine *e, const attn_request *r, bool here, attn_result *res,
               attn_status *st) {
  run_ctx c = {e, r, here};
  return attn__run_waiting(start_run, &c, res, st);
}

int attn_engine_run(attn_engine *e, const attn_request *r, attn_result *res, attn_status *st) {
  return run(e, r, false, res, st);
}

int attn_engine_run_here(attn_engine *e, const attn_request *r, attn_result *res, attn_status *st) {
  return run(e, r, true, res, st);
}
