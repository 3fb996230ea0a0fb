/*
 * engine.c — the engine handle: backends, the shared pool, job lifecycle.
 *
 * Lifecycle: open() sizes the worker pool (cores, or attn_config.threads),
 * opens every compiled-in backend (one that finds no device stays listed as
 * unavailable with its reason), and accepts jobs. submit() validates, picks
 * a backend and queues; the backend completes the job through
 * attn__job_complete(), which also lets close() know when the last job is
 * done. close() waits for in-flight jobs rather than cancelling them: a
 * caller that closes has already stopped submitting (callers cancel their
 * own jobs through attn_request.cancel).
 */
#define _GNU_SOURCE
#include "backend.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Preference order for backend "auto". */
static const struct attn_backend_ops *const backend_table[] = {
#ifdef ATTN_HAVE_CUDA
    &attn__cuda_backend,
#endif
    &attn__cpu_backend,
    &attn__reference_backend,
};
#define NBACKENDS (int)(sizeof backend_table / sizeof *backend_table)

typedef struct backend_slot {
  const struct attn_backend_ops *ops;
  void *state; /* NULL when it could not open */
  attn_status open_status;
} backend_slot;

struct attn_engine {
  attn_config cfg;
  attn_pool *pool;
  backend_slot be[NBACKENDS];
  pthread_mutex_t mu;
  pthread_cond_t idle;
  int64_t inflight;
};

double attn_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void attn_config_init(attn_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->reference_max_bytes = (uint64_t)256 << 20;
}

int attn_cuda_devices_parse(const char *spec, int *ord, int cap, attn_status *st) {
  int n = 0;
  if (!spec || !*spec) {
    ord[n++] = 0;
    return n;
  }
  for (const char *p = spec;;) {
    char *end;
    errno = 0;
    long v = strtol(p, &end, 10);
    if (end == p || *p == '-' || *p == '+' || errno || v > 1023 || (*end && *end != ','))
      return attn_status_set(st, ATTN_EINVAL,
                             "cuda devices \"%.60s\": expected comma-separated device "
                             "numbers such as 0 or 0,1",
                             spec);
    for (int i = 0; i < n; i++)
      if (ord[i] == v)
        return attn_status_set(st, ATTN_EINVAL, "cuda device %ld is listed twice", v);
    if (n == cap)
      return attn_status_set(st, ATTN_EINVAL, "at most %d cuda devices", cap);
    ord[n++] = (int)v;
    if (!*end)
      return n;
    p = end + 1;
  }
}

int attn__online_cores(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
    return CPU_COUNT(&set);
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

int attn_engine_open(const attn_config *cfg, attn_engine **pe, attn_status *st) {
  attn_config def;
  if (!cfg) {
    attn_config_init(&def);
    cfg = &def;
  }
  if (cfg->threads < 0 || cfg->threads > 1024)
    return attn_status_set(st, ATTN_EINVAL,
                           "threads must be between 0 (one per core) and 1024 (got %d)",
                           cfg->threads);
  attn_engine *e = calloc(1, sizeof *e);
  if (!e)
    return attn_status_set(st, ATTN_ENOMEM, "out of memory opening the engine");
  e->cfg = *cfg;
  if (e->cfg.threads == 0)
    e->cfg.threads = attn__online_cores();
  size_t ws = 0;
  for (int i = 0; i < NBACKENDS; i++)
    if (backend_table[i]->workspace_bytes) {
      size_t b = backend_table[i]->workspace_bytes(&e->cfg);
      ws = b > ws ? b : ws;
    }
  if (attn_pool_open(e->cfg.threads, ws, &e->pool) < 0) {
    free(e);
    return attn_status_set(st, ATTN_ENOMEM, "cannot start %d worker threads", cfg->threads);
  }
  pthread_mutex_init(&e->mu, NULL);
  pthread_cond_init(&e->idle, NULL);
  attn_backend_env env = {.cfg = &e->cfg, .pool = e->pool};
  for (int i = 0; i < NBACKENDS; i++) {
    backend_slot *s = &e->be[i];
    s->ops = backend_table[i];
    if (s->ops->open(&env, &s->state, &s->open_status) < 0)
      s->state = NULL;
  }
  *pe = e;
  return 0;
}

void attn_engine_close(attn_engine *e) {
  if (!e)
    return;
  pthread_mutex_lock(&e->mu);
  while (e->inflight > 0)
    pthread_cond_wait(&e->idle, &e->mu);
  pthread_mutex_unlock(&e->mu);
  for (int i = 0; i < NBACKENDS; i++)
    if (e->be[i].state)
      e->be[i].ops->close(e->be[i].state);
  attn_pool_close(e->pool);
  pthread_cond_destroy(&e->idle);
  pthread_mutex_destroy(&e->mu);
  free(e);
}

int attn_engine_threads(const attn_engine *e) { return e->cfg.threads; }

static int pick_backend(attn_engine *e, const attn_request *r, backend_slot **ps, attn_status *st) {
  const char *name = r->backend;
  if (!name || !*name || strcmp(name, "auto") == 0) {
    attn_status why = {0};
    for (int i = 0; i < NBACKENDS; i++) {
      backend_slot *s = &e->be[i];
      if (!s->state || !s->ops->automatic)
        continue;
      if (s->ops->supports(s->state, r, &why) == 0) {
        *ps = s;
        return 0;
      }
    }
    if (why.code)
      return attn_status_set(st, why.code, "%s", why.message);
    return attn_status_set(st, ATTN_ENODEV, "no backend can run this request");
  }
  for (int i = 0; i < NBACKENDS; i++) {
    backend_slot *s = &e->be[i];
    if (strcmp(s->ops->name, name) != 0)
      continue;
    if (!s->state)
      return attn_status_set(st, s->open_status.code ? s->open_status.code : ATTN_ENODEV,
                             "backend \"%s\" is not available: %s", name, s->open_status.message);
    int rc = s->ops->supports(s->state, r, st);
    if (rc < 0)
      return rc;
    *ps = s;
    return 0;
  }
#ifndef ATTN_HAVE_CUDA
  if (strcmp(name, "cuda") == 0)
    return attn_status_set(st, ATTN_ENODEV,
                           "backend \"cuda\" is not available: this build has no cuda support");
#endif
  char names[128] = "auto";
  for (int i = 0; i < NBACKENDS; i++) {
    strncat(names, ", ", sizeof names - strlen(names) - 1);
    strncat(names, backend_table[i]->name, sizeof names - strlen(names) - 1);
  }
  return attn_status_set(st, ATTN_EBACKEND, "unknown backend \"%.40s\" (choose %s)", name, names);
}

/* The flag is a plain int so that engine.h stays C++-clean (nvcc reads it);
 * the GCC atomics make every access to it atomic. */
void attn_cancel_set(int *flag) { __atomic_store_n(flag, 1, __ATOMIC_RELEASE); }

bool attn_cancel_is_set(const int *flag) { return flag && __atomic_load_n(flag, __ATOMIC_ACQUIRE); }

bool attn__job_canceled(const attn_job *job) { return attn_cancel_is_set(job->req.cancel); }

int attn__canceled(attn_status *st) {
  return attn_status_set(st, ATTN_ECANCELED, "the job was canceled by its caller");
}

void attn__engine_hold(attn_engine *e, int delta) {
  pthread_mutex_lock(&e->mu);
  e->inflight += delta;
  if (e->inflight == 0)
    pthread_cond_broadcast(&e->idle);
  pthread_mutex_unlock(&e->mu);
}

attn_pool *attn__engine_pool(attn_engine *e) { return e->pool; }

int attn__engine_pick(attn_engine *e, const attn_request *r, const void **slot, attn_status *st) {
  backend_slot *s;
  int rc = pick_backend(e, r, &s, st);
  *slot = rc < 0 ? NULL : s;
  return rc;
}

int attn__engine_supports(const void *slot, const attn_request *r, attn_status *st) {
  const backend_slot *s = slot;
  return s->ops->supports(s->state, r, st);
}

const char *attn__engine_slot_name(const void *slot) {
  return ((const backend_slot *)slot)->ops->name;
}

int attn__engine_queue(attn_engine *e, const void *slot, const attn_request *r, attn_done_fn done,
                       void *arg, attn_status *st) {
  const backend_slot *s = slot;
  attn_job *job = calloc(1, sizeof *job);
  if (!job)
    return attn_status_set(st, ATTN_ENOMEM, "out of memory queueing a job");
  job->req = *r;
  attn__request_fill_strides(&job->req);
  job->done = done;
  job->arg = arg;
  job->engine = e;
  job->backend = s->ops->name;
  job->t_start = attn_now();
  attn__engine_hold(e, 1);
  int rc = s->ops->submit(s->state, job, st);
  if (rc < 0) {
    attn__engine_hold(e, -1);
    free(job);
  }
  return rc;
}

int attn_engine_submit(attn_engine *e, const attn_request *r, attn_done_fn done, void *arg,
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
  const void *slot;
  if ((rc = attn__engine_pick(e, r, &slot, st)) < 0)
    return rc;
  return attn__engine_queue(e, slot, r, done, arg, st);
}

void attn__job_complete(attn_job *job, const attn_status *st) {
  attn_result res = {0};
  if (st && st->code)
    res.status = *st;
  res.backend = job->backend;
  res.engine_seconds = attn_now() - job->t_start;
  res.flops = res.status.code ? 0 : attn_request_flops(&job->req);
  attn_engine *e = job->engine;
  job->done(&res, job->arg);
  free(job);
  attn__engine_hold(e, -1);
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

int attn_engine_run(attn_engine *e, const attn_request *r, attn_result *res, attn_status *st) {
  waiter w = {.done = false};
  pthread_mutex_init(&w.mu, NULL);
  pthread_cond_init(&w.cv, NULL);
  int rc = attn_engine_submit(e, r, wake, &w, st);
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

int attn_engine_backends(const attn_engine *e, attn_backend_info *out, int cap) {
  for (int i = 0; i < NBACKENDS && i < cap; i++) {
    const backend_slot *s = &e->be[i];
    out[i].name = s->ops->name;
    out[i].available = s->state && (!s->ops->healthy || s->ops->healthy(s->state));
    out[i].ndisabled = 0;
    if (s->state && s->ops->disabled) {
      int n = s->ops->disabled(s->state, out[i].disabled, ATTN_MAX_DISABLED);
      out[i].ndisabled = n < ATTN_MAX_DISABLED ? n : ATTN_MAX_DISABLED;
    }
    if (s->state)
      s->ops->describe(s->state, out[i].detail, sizeof out[i].detail);
    else
      snprintf(out[i].detail, sizeof out[i].detail, "%s", s->open_status.message);
  }
  return NBACKENDS;
}
