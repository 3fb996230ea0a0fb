/*
 * backend.h — what a backend implements and what the engine gives it.
 *
 * Internal to engine/: the server and clients see only engine.h. A backend is
 * a static const table of function pointers (struct attn_backend_ops) plus an
 * opaque state made by its open(). The engine validates a request once,
 * copies it into an attn_job with the strides filled in, asks the chosen
 * backend's supports() and hands the job to submit(). The backend later calls
 * attn__job_complete() exactly once, from any thread.
 *
 * To add a backend: write its ops table, declare it below, and list it in
 * engine.c's backend table in preference order.
 */
#ifndef ATTN_BACKEND_H
#define ATTN_BACKEND_H

#include "engine.h"
#include "pool.h"

typedef struct attn_job {
  attn_request req; /* a copy, strides always filled in */
  attn_done_fn done;
  void *arg;
  struct attn_engine *engine;
  const char *backend; /* name of the backend running it */
  double t_start;
  struct attn_job *next; /* for a backend's own queues */
} attn_job;

/* What open() receives: the config and the engine's shared worker pool. */
typedef struct attn_backend_env {
  const attn_config *cfg;
  attn_pool *pool;
} attn_backend_env;

struct attn_backend_ops {
  const char *name;
  /* Scratch bytes each pool worker needs for this backend (may be NULL). */
  size_t (*workspace_bytes)(const attn_config *cfg);
  /* Makes the backend's state. A backend that cannot run here (no device)
   * returns ATTN_ENODEV with a message; the engine keeps it listed as
   * unavailable so users learn why. */
  int (*open)(const attn_backend_env *env, void **pstate, attn_status *st);
  void (*close)(void *state);
  /* Whether this validated request can run here; a message says why not. */
  int (*supports)(void *state, const attn_request *r, attn_status *st);
  /* Queues the job; on error the job is not completed by the backend. */
  int (*submit)(void *state, attn_job *job, attn_status *st);
  /* One line for attn_engine_backends(), e.g. "avx512, 2 threads". */
  void (*describe)(void *state, char *buf, size_t cap);
  /* Chosen by backend "auto" when it supports the request. */
  bool automatic;
  /* Whether an open backend can still run jobs (a device that failed can
   * not); NULL means always. */
  bool (*healthy)(void *state);
  /* What a start-up self-check turned off, up to cap entries; returns how
   * many there are. NULL means none. */
  int (*disabled)(void *state, attn_disabled *out, int cap);
};

extern const struct attn_backend_ops attn__cpu_backend;
extern const struct attn_backend_ops attn__reference_backend;
#ifdef ATTN_HAVE_CUDA
extern const struct attn_backend_ops attn__cuda_backend;
#endif

/* Ends a job: fills the result, calls the user's callback, frees the job. */
void attn__job_complete(attn_job *job, const attn_status *st);

/* Whether the job's caller canceled it (attn_request.cancel). */
bool attn__job_canceled(const attn_job *job);
/* Fills st with ECANCELED and returns the code. */
int attn__canceled(attn_status *st);

/* Fills all-zero strides with the contiguous layout; r must be valid. */
void attn__request_fill_strides(attn_request *r);

/* The input checks every backend makes, with one wording: ENONFINITE for
 * element (b, h, n, d) of tensor "q", "k" or "v"; ERANGE when inputs whose
 * largest magnitudes are maxabs[q, k, v] could overflow F32 in the scores
 * or the output sums. */
int attn__nonfinite(attn_status *st, const char *tensor, int64_t b, int64_t h, int64_t n,
                    int64_t d);
int attn__check_magnitudes(const attn_request *r, const double maxabs[3], attn_status *st);
/* The same for a backward pass, maxabs[q, k, v, o, do]: the forward's
 * checks, then dP = dO·Vᵀ and Dᵢ = rowsum(dO∘O) (sums of D products), and
 * dK, dV (sums over the group's query rows) and dQ (over keys, P <= 1). */
int attn__check_magnitudes_bwd(const attn_request *r, const double maxabs[5], attn_status *st);

/* A backward request's lse_in, when given: ENONFINITE for NaN or +inf,
 * EINVAL for -inf on a row that sees keys (only a row with no visible key
 * has lse -inf). Every backend calls it before computing. */
int attn__check_lse(const attn_request *r, attn_status *st);

/* Sequence b of a valid variable-length request r as a problem of its own:
 * batch 1, the sequence's own seq_q and seq_kv (either may be 0), pointers
 * advanced to its first rows, strides filled, no cu_seqlens and no
 * statistics (m, l, lse and lse_in NULL: they are packed [Hq, total] in r
 * and the caller gathers them). */
void attn__varlen_sub(const attn_request *r, int64_t b, attn_request *sub);

/* Queues a valid variable-length request as one job per sequence on one
 * backend (engine/varlen.c); attn_engine_submit()'s contract. */
int attn__varlen_submit(struct attn_engine *e, const attn_request *r, attn_done_fn done, void *arg,
                        attn_status *st);

/* What varlen.c needs of the engine: the backend for a request (an opaque
 * slot) and its name, queueing a job there, the pool, and the count of
 * jobs in flight that close() waits for. */
int attn__engine_pick(struct attn_engine *e, const attn_request *r, const void **slot,
                      attn_status *st);
int attn__engine_supports(const void *slot, const attn_request *r, attn_status *st);
const char *attn__engine_slot_name(const void *slot);
int attn__engine_queue(struct attn_engine *e, const void *slot, const attn_request *r,
                       attn_done_fn done, void *arg, attn_status *st);
attn_pool *attn__engine_pool(struct attn_engine *e);
void attn__engine_hold(struct attn_engine *e, int delta);

/* CPUs this process may run on (affinity), at least 1. */
int attn__online_cores(void);

#endif
