/*
 * job.h — a job's life: made, handed to one backend, completed once.
 *
 * Internal to engine/. Every accepted request, plain or variable-length,
 * is an attn_job and ends in attn__job_complete(), the one place that
 * builds the caller's attn_result and calls its callback. The jobs of an
 * engine are counted (attn_jobs) so that closing it waits for the last.
 */
#ifndef ATTN_JOB_H
#define ATTN_JOB_H

#include "engine.h"

#include <pthread.h>

/* The jobs in flight of one engine: attn_engine_close() waits until none
 * is left. */
typedef struct attn_jobs {
  pthread_mutex_t mu;
  pthread_cond_t idle;
  int64_t inflight;
} attn_jobs;

void attn__jobs_init(attn_jobs *jobs);
/* Waits until no job is in flight, then frees the counter's locks. */
void attn__jobs_drain(attn_jobs *jobs);

typedef struct attn_job {
  attn_request req; /* a copy, strides always filled in */
  attn_done_fn done;
  void *arg;
  attn_jobs *jobs;     /* where it is counted until it completes */
  const char *backend; /* name of the backend running it */
  bool here;           /* run on the submitting thread where the backend can */
  double t_start;
  struct attn_job *next; /* for a backend's own queues */
} attn_job;

/* A job for request r (copied, strides filled), counted in jobs from now
 * on; NULL out of memory. It must end in attn__job_complete(), or, never
 * handed to a backend, in attn__job_drop(). */
attn_job *attn__job_new(attn_jobs *jobs, const attn_request *r, attn_done_fn done, void *arg);
/* Frees a job that will not run, without calling its callback. */
void attn__job_drop(attn_job *job);

/* Ends a job: fills the result, calls the user's callback, frees the job. */
void attn__job_complete(attn_job *job, const attn_status *st);

/*
 * The synchronous form of an asynchronous call: start(ctx, done, arg, st)
 * queues work whose callback is done(result, arg), as attn_engine_submit
 * and attn_kv_submit do; this waits for that callback and returns the
 * start's error or the result's code (into *st as well), the result into
 * *res when res is set.
 */
typedef int (*attn__start_fn)(void *ctx, attn_done_fn done, void *arg, attn_status *st);
int attn__run_waiting(attn__start_fn start, void *ctx, attn_result *res, attn_status *st);

/* Whether the job's caller canceled it (attn_request.cancel). */
bool attn__job_canceled(const attn_job *job);
/* Fills st with ECANCELED and returns the code. */
int attn__canceled(attn_status *st);

#endif
