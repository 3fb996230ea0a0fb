/*
 * backend.c — a backend as an engine holds it: the ops with their
 * defaults, opened, closed, and given jobs.
 *
 * The defaults live here and nowhere else, so that a backend writes only
 * the ops it has something to say in, and the engine calls every op
 * without asking whether it exists.
 */
#include "backend.h"

#include <string.h>

static size_t def_workspace_bytes(const attn_config *cfg) {
  (void)cfg;
  return 0;
}

static void def_close(void *state) { (void)state; }

static int def_supports(void *state, const attn_request *r, attn_status *st) {
  (void)state, (void)r, (void)st;
  return 0;
}

static void def_describe(void *state, char *buf, size_t cap) {
  (void)state;
  if (cap)
    buf[0] = 0;
}

static bool def_healthy(void *state) {
  (void)state;
  return true;
}

static int def_disabled(void *state, attn_disabled *out, int cap) {
  (void)state, (void)out, (void)cap;
  return 0;
}

static void *def_host_alloc(void *state, size_t n) {
  (void)state, (void)n;
  return NULL;
}

static bool def_host_free(void *state, void *p) {
  (void)state, (void)p;
  return false;
}

static void def_host_stats(void *state, attn_host_stats *out) {
  (void)state;
  memset(out, 0, sizeof *out);
}

static int def_pages_open(void *state, uint64_t bytes, void **base, attn_status *st) {
  (void)state, (void)bytes, (void)base;
  return attn_status_set(st, ATTN_EUNSUPPORTED, "this backend lends no device memory for pages");
}

static void def_pages_close(void *state, void *base) { (void)state, (void)base; }

static int def_pages_copy(void *state, void *dst, size_t dpitch, const void *src, size_t spitch,
                          size_t width, size_t rows, attn_status *st) {
  (void)state, (void)dst, (void)dpitch, (void)src, (void)spitch, (void)width, (void)rows;
  return attn_status_set(st, ATTN_EUNSUPPORTED, "this backend holds no pages");
}

void attn__backend_init(attn_backend *be, const struct attn_backend_ops *ops) {
  memset(be, 0, sizeof *be);
  be->ops = *ops;
  struct attn_backend_ops *o = &be->ops;
  o->workspace_bytes = o->workspace_bytes ? o->workspace_bytes : def_workspace_bytes;
  o->close = o->close ? o->close : def_close;
  o->supports = o->supports ? o->supports : def_supports;
  o->describe = o->describe ? o->describe : def_describe;
  o->healthy = o->healthy ? o->healthy : def_healthy;
  o->disabled = o->disabled ? o->disabled : def_disabled;
  o->host_alloc = o->host_alloc ? o->host_alloc : def_host_alloc;
  o->host_free = o->host_free ? o->host_free : def_host_free;
  o->host_stats = o->host_stats ? o->host_stats : def_host_stats;
  o->pages_open = o->pages_open ? o->pages_open : def_pages_open;
  o->pages_close = o->pages_close ? o->pages_close : def_pages_close;
  o->pages_copy = o->pages_copy ? o->pages_copy : def_pages_copy;
}

int attn__backend_open(attn_backend *be, const attn_backend_env *env) {
  be->state = NULL;
  int rc = be->ops.open(env, &be->state, &be->open_status);
  be->opened = rc == 0;
  if (!be->opened)
    be->state = NULL;
  return rc;
}

void attn__backend_close(attn_backend *be) {
  if (be->opened)
    be->ops.close(be->state);
  be->opened = false;
  be->state = NULL;
}

int attn__backend_queue(const attn_backend *be, attn_jobs *jobs, const attn_request *r, bool here,
                        attn_done_fn done, void *arg, attn_status *st) {
  attn_job *job = attn__job_new(jobs, r, done, arg);
  if (!job)
    return attn_status_set(st, ATTN_ENOMEM, "out of memory queueing a job");
  job->backend = be->ops.name;
  job->here = here;
  int rc = be->ops.submit(be->state, job, st);
  if (rc < 0)
    attn__job_drop(job);
  return rc;
}
