/*
 * job.c — a job's life, the engine's clock, the cancel flag, and waiting for a
 * callback (attn__run_waiting).
 *
 * One completion path: a plain job ends when its backend calls
 * attn__job_complete(); a variable-length batch is one such job for the
 * whole request, completed when its last sequence's job is (varlen.c).
 * The in-flight count drops only after the callback has returned, so that
 * attn_engine_close() never frees what a callback still runs in.
 */
#include "job.h"

#include "request_int.h"

#include <stdlib.h>
#include <time.h>

double attn_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The flag is a plain int so that engine.h stays C++-clean (nvcc reads it);
 * the GCC atomics make every access to it atomic. */
void attn_cancel_set(int *flag) { __atomic_store_n(flag, 1, __ATOMIC_RELEASE); }

bool attn_cancel_is_set(const int *flag) { return flag && __atomic_load_n(flag, __ATOMIC_ACQUIRE); }

bool attn__job_canceled(const attn_job *job) { return attn_cancel_is_set(job->req.cancel); }

int attn__canceled(attn_status *st) {
  return attn_status_set(st, ATTN_ECANCELED, "the job was canceled by its caller");
}

void attn__jobs_init(attn_jobs *jobs) {
  pthread_mutex_init(&jobs->mu, NULL);
  pthread_cond_init(&jobs->idle, NULL);
  jobs->inflight = 0;
}

void attn__jobs_drain(attn_jobs *jobs) {
  pthread_mutex_lock(&jobs->mu);
  while (jobs->inflight > 0)
    pthread_cond_wait(&jobs->idle, &jobs->mu);
  pthread_mutex_unlock(&jobs->mu);
  pthread_cond_destroy(&jobs->idle);
  pthread_mutex_destroy(&jobs->mu);
}

static void jobs_add(attn_jobs *jobs, int delta) {
  pthread_mutex_lock(&jobs->mu);
  jobs->inflight += delta;
  if (jobs->inflight == 0)
    pthread_cond_broadcast(&jobs->idle);
  pthread_mutex_unlock(&jobs->mu);
}

attn_job *attn__job_new(attn_jobs *jobs, const attn_request *r, attn_done_fn done, void *arg) {
  attn_job *job = calloc(1, sizeof *job);
  if (!job)
    return NULL;
  job->req = *r;
  attn__request_fill_strides(&job->req);
  job->done = done;
  job->arg = arg;
  job->jobs = jobs;
  job->t_start = attn_now();
  jobs_add(jobs, 1);
  return job;
}

void attn__job_drop(attn_job *job) {
  attn_jobs *jobs = job->jobs;
  free(job);
  jobs_add(jobs, -1);
}

void attn__job_complete(attn_job *job, const attn_status *st) {
  attn_result res = {0};
  if (st && st->code)
    res.status = *st;
  res.backend = job->backend;
  res.engine_seconds = attn_now() - job->t_start;
  res.flops = res.status.code ? 0 : attn_request_flops(&job->req);
  attn_jobs *jobs = job->jobs;
  job->done(&res, job->arg);
  free(job);
  jobs_add(jobs, -1);
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

int attn__run_waiting(attn__start_fn start, void *ctx, attn_result *res, attn_status *st) {
  waiter w = {.done = false};
  pthread_mutex_init(&w.mu, NULL);
  pthread_cond_init(&w.cv, NULL);
  int rc = start(ctx, wake, &w, st);
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
