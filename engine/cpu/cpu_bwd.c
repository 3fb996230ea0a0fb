/*
 * cpu_bwd.c — the cpu backend's backward pass: three phases on the pool.
 *
 * Phase 1 (one task): Dᵢ = rowsum(dO∘O) and the scan of q, o and do, one
 * item per (batch, query head, block of rows); the scan of k and v, one
 * item per (batch, KV head); and, when the caller gave no lse, the forward
 * kernel on every query block with O discarded, for its lse (the forward's
 * own statistics path, not a second forward). Its finish judges the inputs
 * (lse_in, non-finite values, magnitudes) before any gradient is computed.
 *
 * Phase 2: one item per (batch, KV head, chunk of key blocks) computes dK
 * and dV of its keys outright, and its own partial of dQ (flash_bwd.h).
 * Phase 3: one item per (batch, query head, block of rows) sums the dQ
 * partials in chunk order and writes dQ.
 *
 * Determinism: the chunks depend on the shape alone (never on the thread
 * count), each item's arithmetic only on its inputs, and the partials are
 * summed in a fixed order, so the bits are the same on any thread count.
 * Memory beyond the per-worker workspace: lse and Dᵢ (B·Hq·Nq floats each)
 * and at most MAX_CHUNKS F32 copies of dQ.
 */
#include "cpu_bwd.h"

#include "check.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define BQ ATTN_BWD_BQ
#define BK ATTN_BWD_BK
/* Chunks of keys per (batch, KV head): enough items for many threads when
 * B·Hkv is small, and at most this many dQ partials. */
#define TARGET_ITEMS 32
#define MAX_CHUNKS 4

enum { T_Q, T_K, T_V, T_O, T_DO, NTENSORS };
static const char *const tensor_names[NTENSORS] = {"q", "k", "v", "o", "do"};

typedef struct bwd_job {
  attn_pool_task task;
  attn_job *job;
  attn_pool *pool;
  const attn__flash_isa *isa;
  attn_request fwd;       /* the forward for the lse: O discarded */
  attn__flash_args fargs; /* its arguments */
  attn__bwd_args args;
  int64_t nqb;        /* query blocks per head */
  int64_t nfwd, nrow; /* phase 1: forward items, then row items, then B·Hkv */
  float *lse, *di, *dqp;
  int64_t *bad; /* seen, per tensor and (batch, head) */
  uint32_t *maxbits;
  attn__flash_seen seen[NTENSORS];
  int overflow;
} bwd_job;

static void bwd_free(bwd_job *bj) {
  free(bj->lse);
  free(bj->di);
  free(bj->dqp);
  free(bj->bad);
  free(bj->maxbits);
  free(bj);
}

static void finish_job(bwd_job *bj, const attn_status *st) {
  attn__job_complete(bj->job, st);
  bwd_free(bj);
}

/* Scans n rows of (b, h) of tensor t, the first at row i0. */
static void scan_rows(bwd_job *bj, int t, const void *base, const int64_t s[3], int64_t b,
                      int64_t h, int64_t nh, int64_t i0, int64_t n) {
  const attn_request *r = &bj->job->req;
  const char *p =
      (const char *)base + (size_t)(b * s[0] + h * s[1] + i0 * s[2]) * attn_dtype_size(r->dtype);
  float mx = 0.0f;
  int64_t bad = bj->isa->scan(p, r->dtype, n, r->head_dim, s[2], &mx);
  attn__seen_record(&bj->seen[t], b * nh + h, bad < 0 ? -1 : i0 * r->head_dim + bad, mx);
}

/* Phase 1, a block of query rows: forward (for the lse) or Dᵢ and scans. */
static void prep_run(attn_pool_task *task, int64_t item, void *ws) {
  bwd_job *bj = (bwd_job *)task;
  const attn_request *r = &bj->job->req;
  if (attn__job_canceled(bj->job))
    return;
  if (item >= bj->nfwd + bj->nrow) { /* (b, hk): all of k and v */
    const int64_t bh = item - bj->nfwd - bj->nrow, b = bh / r->heads_kv, hk = bh % r->heads_kv;
    scan_rows(bj, T_K, r->k, r->k_stride, b, hk, r->heads_kv, 0, r->seq_kv);
    scan_rows(bj, T_V, r->v, r->v_stride, b, hk, r->heads_kv, 0, r->seq_kv);
    return;
  }
  const bool fwd = item < bj->nfwd;
  const int64_t it = fwd ? item : item - bj->nfwd, bh = it / bj->nqb, i0 = it % bj->nqb * BQ;
  const int64_t b = bh / r->heads_q, h = bh % r->heads_q;
  const int64_t n = r->seq_q - i0 < BQ ? r->seq_q - i0 : BQ;
  if (fwd) {
    attn__flash_block blk = {.b = b, .h0 = h, .nh = 1, .i0 = i0, .nq = n, .j1 = r->seq_kv};
    bj->isa->rows(&bj->fargs, &blk, 1, ws);
    return;
  }
  scan_rows(bj, T_Q, r->q, r->q_stride, b, h, r->heads_q, i0, n);
  scan_rows(bj, T_O, r->o, r->o_stride, b, h, r->heads_q, i0, n);
  scan_rows(bj, T_DO, r->dout, r->do_stride, b, h, r->heads_q, i0, n);
  bj->isa->bwd->rowdot(&bj->args, b, h, i0, n);
}

/* lse_in, then the first non-finite element (q, k, v, o, do in (batch,
 * head) order), then magnitudes. */
static int verdict(const bwd_job *bj, attn_status *st) {
  const attn_request *r = &bj->job->req;
  const int64_t heads[NTENSORS] = {r->heads_q, r->heads_kv, r->heads_kv, r->heads_q, r->heads_q};
  double mx[NTENSORS] = {0};
  int rc = attn__check_lse(r, st);
  if (!rc)
    rc = attn__seen_verdict(r, bj->seen, NTENSORS, tensor_names, heads, mx, st);
  return rc ? rc : attn__check_magnitudes_bwd(r, mx, st);
}

static void keys_run(attn_pool_task *task, int64_t item, void *ws) {
  bwd_job *bj = (bwd_job *)task;
  const attn_request *r = &bj->job->req;
  if (attn__job_canceled(bj->job))
    return;
  const int64_t c = item % bj->args.nchunk, bh = item / bj->args.nchunk;
  bj->isa->bwd->keys(&bj->args, bh / r->heads_kv, bh % r->heads_kv, c, ws);
}

static void dq_run(attn_pool_task *task, int64_t item, void *ws) {
  bwd_job *bj = (bwd_job *)task;
  const attn_request *r = &bj->job->req;
  if (attn__job_canceled(bj->job))
    return;
  const int64_t bh = item / bj->nqb, i0 = item % bj->nqb * BQ;
  const int64_t n = r->seq_q - i0 < BQ ? r->seq_q - i0 : BQ;
  bj->isa->bwd->store_dq(&bj->args, bh / r->heads_q, bh % r->heads_q, i0, n, ws);
}

/* Each finish ends the job (canceled: items were skipped) or starts the
 * next phase; a later phase's run() reads nothing of an earlier one's
 * state but its outputs. */
static bool stop_canceled(bwd_job *bj) {
  if (!attn__job_canceled(bj->job))
    return false;
  attn_status st;
  attn__canceled(&st);
  finish_job(bj, &st);
  return true;
}

/* dsinks from phase 1's lse and Dᵢ: the sink's logit t enters each row's
 * softmax with P = e^(t − lse) and dP = 0, so dL/dt = −Σ P·Dᵢ over the
 * head's rows of every batch (in double, in row order: the same bits on
 * any thread count). A row with Dᵢ = 0 (O = 0: it saw no key) adds
 * nothing, whatever lse_in says of it. False when a sum overflows. */
static bool sinks_grad(const bwd_job *bj) {
  const attn_request *r = &bj->job->req;
  bool ok = true;
  for (int64_t h = 0; h < r->heads_q; h++) {
    double sum = 0;
    for (int64_t b = 0; b < r->batch; b++)
      for (int64_t i = 0, row = (b * r->heads_q + h) * r->seq_q; i < r->seq_q; i++, row++)
        if (bj->di[row] != 0)
          sum += exp((double)r->sinks[h] - bj->args.lse[row]) * bj->di[row];
    r->dsinks[h] = (float)-sum;
    ok = ok && isfinite(r->dsinks[h]);
  }
  return ok;
}

static void dq_finish(attn_pool_task *task) {
  bwd_job *bj = (bwd_job *)task;
  if (stop_canceled(bj))
    return;
  attn_status st = {0};
  const bool sinks_ok = !bj->job->req.dsinks || sinks_grad(bj);
  if (__atomic_load_n(&bj->overflow, __ATOMIC_RELAXED) || !sinks_ok)
    attn_status_set(&st, ATTN_ERANGE,
                    "the gradients overflow float32; if lse was given, pass the lse of the "
                    "forward call on the same inputs");
  finish_job(bj, st.code ? &st : NULL);
}

static void keys_finish(attn_pool_task *task) {
  bwd_job *bj = (bwd_job *)task;
  if (stop_canceled(bj))
    return;
  bj->task.nitems = bj->job->req.batch * bj->job->req.heads_q * bj->nqb;
  bj->task.run = dq_run;
  bj->task.finish = dq_finish;
  attn_pool_submit(bj->pool, &bj->task);
}

static void prep_finish(attn_pool_task *task) {
  bwd_job *bj = (bwd_job *)task;
  if (stop_canceled(bj))
    return;
  attn_status st = {0};
  if (verdict(bj, &st) < 0) {
    finish_job(bj, &st);
    return;
  }
  const attn_request *r = &bj->job->req;
  bj->task.nitems = r->batch * r->heads_kv * bj->args.nchunk;
  bj->task.run = keys_run;
  bj->task.finish = keys_finish;
  attn_pool_submit(bj->pool, &bj->task);
}

int64_t attn__cpu_bwd_chunks(const attn_request *r, int64_t *pchunk_blocks) {
  const int64_t nkb = (r->seq_kv + BK - 1) / BK, bhk = r->batch * r->heads_kv;
  int64_t n = (TARGET_ITEMS + bhk - 1) / bhk;
  n = n < MAX_CHUNKS ? n : MAX_CHUNKS;
  n = n < nkb ? n : nkb;
  *pchunk_blocks = (nkb + n - 1) / n;
  return (nkb + *pchunk_blocks - 1) / *pchunk_blocks;
}

/* The forward request whose only output is the lse. */
static void plan_forward(bwd_job *bj) {
  const attn_request *r = &bj->job->req;
  bj->fwd = *r;
  bj->fwd.pass = ATTN_FORWARD;
  bj->fwd.o = NULL;
  bj->fwd.m = bj->fwd.l = NULL;
  bj->fwd.lse = bj->lse;
  bj->fargs.r = &bj->fwd;
  bj->fargs.seen[0] = bj->seen[T_Q];
  bj->fargs.seen[1] = bj->seen[T_K];
  bj->fargs.seen[2] = bj->seen[T_V];
  bj->fargs.scale2 = (float)(attn_request_scale(r) * M_LOG2E);
  bj->fargs.wl = bj->args.wl;
  bj->fargs.wr = bj->args.wr;
  bj->fargs.off = bj->args.off;
  bj->fargs.group = bj->args.group;
  bj->fargs.var = bj->args.var;
}

/* The seen arrays of q, k, v, o and do. */
static int plan_seen(bwd_job *bj) {
  const attn_request *r = &bj->job->req;
  const int64_t heads[NTENSORS] = {r->heads_q, r->heads_kv, r->heads_kv, r->heads_q, r->heads_q};
  return attn__seen_init(r, bj->seen, NTENSORS, heads, &bj->bad, &bj->maxbits);
}

static int plan(bwd_job *bj) {
  const attn_request *r = &bj->job->req;
  const size_t rows = (size_t)(r->batch * r->heads_q * r->seq_q);
  attn__bwd_args *a = &bj->args;
  a->r = r;
  a->scale = (float)attn_request_scale(r);
  a->scale2 = (float)(attn_request_scale(r) * M_LOG2E);
  attn_request_window(r, &a->wl, &a->wr);
  a->off = attn_request_offset(r);
  a->group = r->heads_q / r->heads_kv;
  attn__variants_init(r, &a->var);
  a->dld = (r->head_dim + ATTN_BWD_DALIGN - 1) / ATTN_BWD_DALIGN * ATTN_BWD_DALIGN;
  a->overflow = &bj->overflow;
  a->nchunk = attn__cpu_bwd_chunks(r, &a->chunk_blocks);
  bj->nqb = (r->seq_q + BQ - 1) / BQ;
  bj->nrow = r->batch * r->heads_q * bj->nqb;
  bj->di = malloc(rows * sizeof *bj->di);
  bj->dqp = malloc((size_t)a->nchunk * rows * (size_t)a->dld * sizeof *bj->dqp);
  if (!r->lse_in)
    bj->lse = malloc(rows * sizeof *bj->lse);
  if (!bj->di || !bj->dqp || (!r->lse_in && !bj->lse) || plan_seen(bj) < 0)
    return -1;
  a->di = bj->di;
  a->dqp = bj->dqp;
  a->lse = r->lse_in ? r->lse_in : bj->lse;
  if (!r->lse_in) {
    plan_forward(bj);
    bj->nfwd = bj->nrow;
  }
  return 0;
}

int attn__cpu_bwd_submit(attn_pool *pool, const attn__flash_isa *isa, attn_job *job,
                         attn_status *st) {
  bwd_job *bj = calloc(1, sizeof *bj);
  if (!bj)
    return attn_status_set(st, ATTN_ENOMEM, "out of memory queueing a job");
  bj->job = job;
  bj->pool = pool;
  bj->isa = isa;
  if (plan(bj) < 0) {
    bwd_free(bj);
    return attn_status_set(st, ATTN_ENOMEM,
                           "out of memory for the backward pass's F32 accumulators of dQ");
  }
  const attn_request *r = &job->req;
  bj->task.nitems = bj->nfwd + bj->nrow + r->batch * r->heads_kv;
  bj->task.run = prep_run;
  bj->task.finish = prep_finish;
  attn_pool_submit(pool, &bj->task);
  return 0;
}
