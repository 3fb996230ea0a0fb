/*
 * plan.c — the memory plan of seed exercise 1, for any shape.
 *
 * Standard attention keeps S and P, each [B, Hq, Nq, Nkv] in the input
 * dtype, alive at once: that is its O(N²) bottleneck. The flash path keeps
 * only m and l ([B, Hq, Nq] F32) and one tile workspace per worker thread.
 * Backward, standard attention holds four such matrices (S, P, dP, dS);
 * the flash path recomputes them per tile from lse and D = rowsum(dO∘O).
 * Arithmetic is in unsigned 128 bits so no shape within the limits can
 * wrap; results that do not fit 64 bits are refused.
 */
#include "cpu/cpu_bwd.h"
#include "cpu/flash.h"
#include "cpu/flash_bwd.h"
#include "pool.h"

typedef unsigned __int128 u128;

static int fit(attn_status *st, const char *what, u128 v, uint64_t *out) {
  if (v > UINT64_MAX)
    return attn_status_set(st, ATTN_EOVERFLOW, "%s does not fit in 64 bits", what);
  *out = (uint64_t)v;
  return 0;
}

static int validate(const attn_plan_params *pp, attn_request *r, attn_status *st) {
  attn_request_init(r);
  r->batch = pp->batch;
  r->heads_q = pp->heads_q;
  r->heads_kv = pp->heads_kv ? pp->heads_kv : pp->heads_q;
  r->seq_q = pp->seq_q;
  r->seq_kv = pp->seq_kv;
  r->head_dim = pp->head_dim;
  r->dtype = pp->dtype;
  /* The shape rules are the request's; give validation dummy tensors. */
  static char dummy;
  r->q = r->k = r->v = r->o = &dummy;
  int rc = attn_request_validate(r, st);
  if (rc < 0)
    return rc;
  if (pp->threads < 0)
    return attn_status_set(st, ATTN_EINVAL, "threads must be at least 0 (got %d)", pp->threads);
  if (pp->pass != ATTN_FORWARD && pp->pass != ATTN_BACKWARD)
    return attn_status_set(st, ATTN_EINVAL, "unknown pass %d (forward or backward)", (int)pp->pass);
  return 0;
}

/* The backward pass's gradients and intermediates; the forward's are set. */
static int plan_backward(const attn_request *r, attn_plan *plan, attn_status *st) {
  const u128 bq = (u128)r->batch * (u128)r->heads_q;
  int rc;
  plan->dout = plan->dq = plan->o;
  plan->dk = plan->k;
  plan->dv = plan->v;
  plan->dp = plan->ds = plan->s;
  plan->delta = plan->lse;
  /* What the CPU backend holds: one F32 copy of dQ (rows padded to its
   * vector width) per key chunk. */
  int64_t chunk_blocks, nchunk = attn__cpu_bwd_chunks(r, &chunk_blocks);
  const u128 dld = (u128)((r->head_dim + ATTN_BWD_DALIGN - 1) / ATTN_BWD_DALIGN * ATTN_BWD_DALIGN);
  if ((rc = fit(st, "the dq accumulators", (u128)nchunk * bq * (u128)r->seq_q * dld * 4,
                &plan->dq_accum)))
    return rc;
  u128 io =
      (u128)plan->q + plan->k + plan->v + plan->o + plan->dout + plan->dq + plan->dk + plan->dv;
  u128 sp4 = 2 * (u128)plan->s_plus_p;
  if ((rc = fit(st, "the standard total", io + sp4, &plan->standard_total)) ||
      (rc = fit(st, "the flash total",
                io + (u128)plan->lse + plan->delta + plan->dq_accum + plan->workspace,
                &plan->flash_total)))
    return rc;
  return 0;
}

int attn_plan_compute(const attn_plan_params *pp, attn_plan *plan, attn_status *st) {
  attn_request r;
  int rc = validate(pp, &r, st);
  if (rc < 0)
    return rc;
  const u128 es = attn_dtype_size(r.dtype);
  const u128 bq = (u128)r.batch * (u128)r.heads_q, bk = (u128)r.batch * (u128)r.heads_kv;
  const u128 D = (u128)r.head_dim;
  *plan = (attn_plan){0};
  plan->pass = pp->pass;
  plan->threads = pp->threads;
  if (plan->threads == 0)
    plan->threads = attn_pool_cores();
  if ((rc = fit(st, "Q", bq * (u128)r.seq_q * D * es, &plan->q)) ||
      (rc = fit(st, "K", bk * (u128)r.seq_kv * D * es, &plan->k)) ||
      (rc = fit(st, "V", bk * (u128)r.seq_kv * D * es, &plan->v)) ||
      (rc = fit(st, "O", bq * (u128)r.seq_q * D * es, &plan->o)) ||
      (rc = fit(st, "S", bq * (u128)r.seq_q * (u128)r.seq_kv * es, &plan->s)) ||
      (rc = fit(st, "S + P", 2 * bq * (u128)r.seq_q * (u128)r.seq_kv * es, &plan->s_plus_p)) ||
      (rc = fit(st, "m", bq * (u128)r.seq_q * 4, &plan->m)))
    return rc;
  plan->p = plan->s;
  plan->l = plan->lse = plan->m;
  /* the tile workspace of the pass's CPU kernel, per worker: the part a
   * block of this head dim lays out and touches */
  plan->workspace_per_thread =
      (pp->pass == ATTN_BACKWARD ? ATTN_BWD_WS_FLOATS_D(attn__cpu_ws_d(r.head_dim))
                                 : ATTN_FLASH_WS_FLOATS_D(attn__cpu_ws_d(r.head_dim))) *
      sizeof(float);
  plan->workspace = plan->workspace_per_thread * (uint64_t)plan->threads;
  u128 io = (u128)plan->q + plan->k + plan->v + plan->o;
  if (pp->pass == ATTN_BACKWARD)
    rc = plan_backward(&r, plan, st);
  else if ((rc = fit(st, "the standard total", io + plan->s_plus_p, &plan->standard_total)) == 0)
    rc = fit(st, "the flash total", io + 2 * (u128)plan->m + plan->workspace, &plan->flash_total);
  if (rc < 0)
    return rc;
  plan->s_over_q = (double)plan->s / (double)plan->q;
  plan->standard_over_flash = (double)plan->standard_total / (double)plan->flash_total;
  return 0;
}
