/*
 * backend.h — what a backend implements and what the engine gives it.
 *
 * Internal to engine/: the server and clients see only engine.h. A backend is
 * a static const table of function pointers (struct attn_backend_ops, written
 * with designated initializers) plus an opaque state made by its open().
 * Only name, open and submit are required: when the engine opens a backend
 * it copies the table into an attn_backend and fills every op left NULL
 * with its default (attn__backend_init, as curl's Curl_cf_def_*), so no
 * caller ever checks an op for NULL.
 *
 * The engine validates a request once, copies it into an attn_job with the
 * strides filled in (job.h, attn__backend_queue), asks the chosen backend's supports() and hands
 * the job to submit(). The backend later calls attn__job_complete() exactly
 * once, from any thread.
 *
 * To add a backend: write its ops table, declare it below, and list it in
 * handle.c's backend table in preference order.
 */
#ifndef ATTN_BACKEND_H
#define ATTN_BACKEND_H

#include "engine.h"
#include "job.h"
#include "pool.h"

/* What open() receives: the config and the engine's shared worker pool. */
typedef struct attn_backend_env {
  const attn_config *cfg;
  attn_pool *pool;
} attn_backend_env;

struct attn_backend_ops {
  const char *name; /* required */
  /* Scratch bytes each pool worker needs for this backend. Default: 0. */
  size_t (*workspace_bytes)(const attn_config *cfg);
  /* Required. Makes the backend's state. A backend that cannot run here (no
   * device) returns ATTN_ENODEV with a message; the engine keeps it listed
   * as unavailable so users learn why. */
  int (*open)(const attn_backend_env *env, void **pstate, attn_status *st);
  /* Frees what open() made. Default: nothing to free. */
  void (*close)(void *state);
  /* Whether this validated request can run here; a message says why not.
   * Default: every valid request. */
  int (*supports)(void *state, const attn_request *r, attn_status *st);
  /* Required. Queues the job; on error the job is not completed by the
   * backend. */
  int (*submit)(void *state, attn_job *job, attn_status *st);
  /* One line for attn_engine_backends(), e.g. "avx512, 2 threads".
   * Default: an empty line. */
  void (*describe)(void *state, char *buf, size_t cap);
  /* Chosen by backend "auto" when it supports the request. */
  bool automatic;
  /* Whether an open backend can still run jobs (a device that failed can
   * not). Default: always. */
  bool (*healthy)(void *state);
  /* What a start-up self-check turned off, up to cap entries; returns how
   * many there are. Default: none. */
  int (*disabled)(void *state, attn_disabled *out, int cap);
  /* Host memory this backend copies from without staging
   * (attn_engine_host_alloc), and taking it back: false for memory not its
   * own. Default: none lent. */
  void *(*host_alloc)(void *state, size_t n);
  bool (*host_free)(void *state, void *p);
  void (*host_stats)(void *state, attn_host_stats *out);
  /* Device memory for a session store's pages, zeroed (*base: its device
   * address; one store per backend), and given back. Default: none
   * (EUNSUPPORTED), and the store keeps its pages in host memory. The
   * store cuts it into pages of ATTN_KV_PAGE_BYTES, below. */
  int (*pages_open)(void *state, uint64_t bytes, void **base, attn_status *st);
  void (*pages_close)(void *state, void *base);
  /* rows rows of width bytes between host memory and those pages (either
   * side; pitches are the bytes from one row to the next), done when it
   * returns. */
  int (*pages_copy)(void *state, void *dst, size_t dpitch, const void *src, size_t spitch,
                    size_t width, size_t rows, attn_status *st);
};

/* Bytes of one page of a paged K/V (attn_request.k_pages): 64 KiB, 64 to
 * 16384 tokens of one KV head. The session store (engine/kv/) lays its
 * pool out in pages of this size, and a backend that lends the pool
 * (pages_open) finds a page's number from its address with it. */
#define ATTN_KV_PAGE_BYTES ((size_t)64 << 10)

/* A backend as an engine holds it: its ops with the defaults filled in,
 * its state once open() succeeded, and otherwise why it did not. */
typedef struct attn_backend {
  struct attn_backend_ops ops;
  void *state;
  bool opened;
  attn_status open_status;
} attn_backend;

/* Copies ops into be and fills the ops it leaves NULL with the defaults;
 * be is not open yet. */
void attn__backend_init(attn_backend *be, const struct attn_backend_ops *ops);
/* Opens an initialized backend; on failure be->open_status says why, and
 * the backend stays listed as unavailable. Returns 0 or the error. */
int attn__backend_open(attn_backend *be, const attn_backend_env *env);
/* Closes an open backend (nothing for one that did not open). */
void attn__backend_close(attn_backend *be);
/* A new job for r (job.h), counted in jobs, queued on be (open, and
 * supporting r); here: run on the calling thread if be can (job.h). On
 * error nothing is queued and the callback will not run. */
int attn__backend_queue(const attn_backend *be, attn_jobs *jobs, const attn_request *r, bool here,
                        attn_done_fn done, void *arg, attn_status *st);

extern const struct attn_backend_ops attn__cpu_backend;
extern const struct attn_backend_ops attn__reference_backend;
#ifdef ATTN_HAVE_CUDA
extern const struct attn_backend_ops attn__cuda_backend;
#endif

#endif
