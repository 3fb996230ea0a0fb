/*
 * submit.c — attn_engine_submit() and attn_engine_run(): a request
 * validated, given a backend and queued as a job.
 *
 * The top of the engine: a plain request becomes one job on the backend
 * picked for it (run on the caller's thread for attn_engine_run_here, where
 * the backend can); a variable-length batch goes to varlen.c, which makes one
 * job per sequence on one backend. Either way the caller's callback runs
 * once, through attn__job_complete() (job.c).
 */
#include "handle.h"
#include "varlen.h"

#include <pthread.h>

static int submit(attn_engine *e, const attn_request *r, bool here, attn_done_fn done, void *arg,
                  attn_status *st) {
  int rc = attn_request_validate(r, st);
  if (rc < 0)
    return rc;
  if (attn_cancel_is_set(r->cancel))
    return attn_status_set(st, ATTN_ECANCELED, "the job was canceled before it was queued");
  if (!done)
    return attn_status_set(st, ATTN_EINVAL, "no completion callback");
  if (r->cu_seqlens_q)
    return attn__varlen_submit(e, r, done, arg, st);
  const attn_backend *be;
  if ((rc = attn__engine_pick(e, r, &be, st)) < 0)
    return rc;
  return attn__backend_queue(be, attn__engine_jobs(e), r, here, done, arg, st);
}

int attn_engine_submit(attn_engine *e, const attn_request *r, attn_done_fn done, void *arg,
                       attn_status *st) {
  return submit(e, r, false, done, arg, st);
}

typedef struct waiter {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool done;
  attn_result res;
} waiter;

static void wake(const attn_result *res, void *arg) {
  waiter *w = arg;
  pthread_mutex_lock(&w->mu);
  w->res = *res;
  w->done = true;
  pthread_cond_signal(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

static int run(attn_engine *e, const attn_request *r, bool here, attn_result *res,
               attn_status *st) {
  waiter w = {.done = false};
  pthread_mutex_init(&w.mu, NULL);
  pthread_cond_init(&w.cv, NULL);
  int rc = submit(e, r, here, wake, &w, st);
  if (rc == 0) {
    pthread_mutex_lock(&w.mu);
    while (!w.done)
      pthread_cond_wait(&w.cv, &w.mu);
    pthread_mutex_unlock(&w.mu);
    rc = w.res.status.code;
    if (rc && st)
      *st = w.res.status;
    if (res)
      *res = w.res;
  }
  pthread_cond_destroy(&w.cv);
  pthread_mutex_destroy(&w.mu);
  return rc;
}

int attn_engine_run(attn_engine *e, const attn_request *r, attn_result *res, attn_status *st) {
  return run(e, r, false, res, st);
}

int attn_engine_run_here(attn_engine *e, const attn_request *r, attn_result *res, attn_status *st) {
  return run(e, r, true, res, st);
}
