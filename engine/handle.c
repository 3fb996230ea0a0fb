/*
 * handle.c — the engine handle: its backends, its pool, its jobs.
 *
 * Lifecycle: open() sizes the worker pool (cores, or attn_config.threads),
 * opens every compiled-in backend (one that finds no device stays listed as
 * unavailable with its reason), and the engine accepts jobs (submit.c).
 * close() waits for in-flight jobs rather than cancelling them: a caller
 * that closes has already stopped submitting (callers cancel their own
 * jobs through attn_request.cancel).
 */
#include "handle.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Preference order for backend "auto". */
static const struct attn_backend_ops *const backend_table[] = {
#ifdef ATTN_HAVE_CUDA
    &attn__cuda_backend,
#endif
    &attn__cpu_backend,
    &attn__reference_backend,
};
#define NBACKENDS (int)(sizeof backend_table / sizeof *backend_table)

struct attn_engine {
  attn_config cfg;
  attn_pool *pool;
  attn_backend be[NBACKENDS];
  attn_jobs jobs;
};

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
    e->cfg.threads = attn_pool_cores();
  size_t ws = 0;
  for (int i = 0; i < NBACKENDS; i++) {
    attn__backend_init(&e->be[i], backend_table[i]);
    size_t b = e->be[i].ops.workspace_bytes(&e->cfg);
    ws = b > ws ? b : ws;
  }
  if (attn_pool_open(e->cfg.threads, ws, &e->pool) < 0) {
    free(e);
    return attn_status_set(st, ATTN_ENOMEM, "cannot start %d worker threads", cfg->threads);
  }
  attn__jobs_init(&e->jobs);
  attn_backend_env env = {.cfg = &e->cfg, .pool = e->pool};
  for (int i = 0; i < NBACKENDS; i++)
    attn__backend_open(&e->be[i], &env);
  *pe = e;
  return 0;
}

void attn_engine_close(attn_engine *e) {
  if (!e)
    return;
  attn__jobs_drain(&e->jobs);
  for (int i = 0; i < NBACKENDS; i++)
    attn__backend_close(&e->be[i]);
  attn_pool_close(e->pool);
  free(e);
}

int attn_engine_threads(const attn_engine *e) { return e->cfg.threads; }

attn_jobs *attn__engine_jobs(attn_engine *e) { return &e->jobs; }

attn_pool *attn__engine_pool(attn_engine *e) { return e->pool; }

int attn__engine_pages_open(attn_engine *e, uint64_t bytes, const attn_backend **pbe, void **base,
                            attn_status *st) {
  attn_status why = {0};
  for (int i = 0; i < NBACKENDS; i++) {
    const attn_backend *be = &e->be[i];
    if (!be->opened || !be->ops.automatic || !be->ops.healthy(be->state))
      continue;
    int rc = be->ops.pages_open(be->state, bytes, base, &why);
    if (rc == 0) {
      *pbe = be;
      return 0;
    }
    if (rc != ATTN_EUNSUPPORTED) /* a device that cannot hold them: say why */
      return attn_status_set(st, rc, "%s", why.message);
  }
  return attn_status_set(st, ATTN_EUNSUPPORTED, "no backend holds session pages on a device");
}

void *attn_engine_host_alloc(attn_engine *e, size_t n) {
  for (int i = 0; i < NBACKENDS; i++) {
    attn_backend *be = &e->be[i];
    void *p = be->opened ? be->ops.host_alloc(be->state, n) : NULL;
    if (p)
      return p;
  }
  return NULL;
}

bool attn_engine_host_free(attn_engine *e, void *p) {
  for (int i = 0; p && i < NBACKENDS; i++)
    if (e->be[i].opened && e->be[i].ops.host_free(e->be[i].state, p))
      return true;
  return false;
}

void attn_engine_host_stats(attn_engine *e, attn_host_stats *out) {
  memset(out, 0, sizeof *out);
  for (int i = 0; i < NBACKENDS; i++)
    if (e->be[i].opened) {
      attn_host_stats s;
      e->be[i].ops.host_stats(e->be[i].state, &s);
      out->cap += s.cap, out->lent += s.lent, out->pinned += s.pinned, out->refused += s.refused;
    }
}

static int pick_auto(attn_engine *e, const attn_request *r, const attn_backend **pbe,
                     attn_status *st) {
  attn_status why = {0};
  for (int i = 0; i < NBACKENDS; i++) {
    const attn_backend *be = &e->be[i];
    if (!be->opened || !be->ops.automatic)
      continue;
    if (be->ops.supports(be->state, r, &why) == 0) {
      *pbe = be;
      return 0;
    }
  }
  if (why.code)
    return attn_status_set(st, why.code, "%s", why.message);
  return attn_status_set(st, ATTN_ENODEV, "no backend can run this request");
}

static int unknown_backend(const char *name, attn_status *st) {
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

int attn__engine_pick(attn_engine *e, const attn_request *r, const attn_backend **pbe,
                      attn_status *st) {
  const char *name = r->backend;
  *pbe = NULL;
  if (!name || !*name || strcmp(name, "auto") == 0)
    return pick_auto(e, r, pbe, st);
  for (int i = 0; i < NBACKENDS; i++) {
    const attn_backend *be = &e->be[i];
    if (strcmp(be->ops.name, name) != 0)
      continue;
    if (!be->opened)
      return attn_status_set(st, be->open_status.code ? be->open_status.code : ATTN_ENODEV,
                             "backend \"%s\" is not available: %s", name, be->open_status.message);
    int rc = be->ops.supports(be->state, r, st);
    if (rc < 0)
      return rc;
    *pbe = be;
    return 0;
  }
  return unknown_backend(name, st);
}

int attn_engine_backends(const attn_engine *e, attn_backend_info *out, int cap) {
  for (int i = 0; i < NBACKENDS && i < cap; i++) {
    const attn_backend *be = &e->be[i];
    out[i].name = be->ops.name;
    out[i].available = be->opened && be->ops.healthy(be->state);
    out[i].ndisabled = 0;
    if (!be->opened) {
      snprintf(out[i].detail, sizeof out[i].detail, "%s", be->open_status.message);
      continue;
    }
    int n = be->ops.disabled(be->state, out[i].disabled, ATTN_MAX_DISABLED);
    out[i].ndisabled = n < ATTN_MAX_DISABLED ? n : ATTN_MAX_DISABLED;
    be->ops.describe(be->state, out[i].detail, sizeof out[i].detail);
  }
  return NBACKENDS;
}
