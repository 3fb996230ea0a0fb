/*
 * reference_backend.c — the "reference" backend: the float64 reference
 * (reference.h) on the engine's worker pool, one item per (batch, head).
 *
 * It refuses problems whose S and P would not fit its budget
 * (attn_config.reference_max_bytes per head) or that would take minutes: it
 * exists to check answers, not to serve traffic.
 */
#include "backend.h"
#include "reference.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

/* A budget of multiply-adds: about ten seconds of plain double loops. */
#define REFERENCE_MAX_MACS ((uint64_t)1 << 34)

/* Row (b, h, i) of an output tensor, from D doubles. */
static void store_row(const attn_request *r, void *base, const int64_t s[3], int64_t b, int64_t h,
                      int64_t i, const double *x) {
  size_t off = (size_t)(b * s[0] + h * s[1] + i * s[2]);
  for (int64_t d = 0; d < r->head_dim; d++)
    attn_store_elem(base, r->dtype, off + (size_t)d, (float)x[d]);
}

typedef struct ref_job {
  attn_pool_task task;
  attn_job *job;
  atomic_int failed;
  attn_status err; /* written by the first item that fails */
} ref_job;

typedef struct ref_state {
  attn_pool *pool;
  uint64_t max_bytes;
} ref_state;

/* Forward item (b, h): computes in float64, stores rounded to the dtype. */
static int ref_forward_item(const attn_request *r, int64_t item, attn_status *st) {
  int64_t b = item / r->heads_q, h = item % r->heads_q;
  const int64_t nq = r->seq_q, D = r->head_dim;
  double *S = NULL, *P = NULL;
  double *o = malloc((size_t)(nq * D + 3 * nq) * sizeof *o);
  int rc = o ? attn_reference_scratch(r, &S, &P, st)
             : attn_status_set(st, ATTN_ENOMEM, "out of memory in the reference");
  double *m = rc == 0 ? o + nq * D : NULL, *l = m ? m + nq : NULL, *lse = l ? l + nq : NULL;
  if (rc == 0 && (rc = attn_reference_head(r, b, h, S, P, o, m, l, lse, st)) == 0) {
    size_t row = (size_t)((b * r->heads_q + h) * nq);
    for (int64_t i = 0; i < nq; i++) {
      store_row(r, r->o, r->o_stride, b, h, i, o + i * D);
      if (r->m)
        r->m[row + i] = (float)m[i];
      if (r->l)
        r->l[row + i] = (float)l[i];
      if (r->lse)
        r->lse[row + i] = (float)lse[i];
    }
  }
  free(S);
  free(P);
  free(o);
  return rc;
}

/* Backward item (b, hk): the group's dq rows, and dk, dv of the KV head. */
static int ref_backward_item(const attn_request *r, int64_t item, attn_status *st) {
  int64_t b = item / r->heads_kv, hk = item % r->heads_kv;
  const int64_t nq = r->seq_q, nk = r->seq_kv, D = r->head_dim;
  const int64_t group = r->heads_q / r->heads_kv;
  double *S = NULL, *P = NULL;
  double *dq = malloc((size_t)((group * nq + 2 * nk) * D) * sizeof *dq);
  int rc = dq ? attn_reference_scratch(r, &S, &P, st)
              : attn_status_set(st, ATTN_ENOMEM, "out of memory in the reference");
  double *dk = rc == 0 ? dq + group * nq * D : NULL, *dv = dk ? dk + nk * D : NULL;
  if (rc == 0 && (rc = attn_reference_backward_group(r, b, hk, S, P, dq, dk, dv, st)) == 0) {
    for (int64_t g = 0; g < group; g++)
      for (int64_t i = 0; i < nq; i++)
        store_row(r, r->dq, r->dq_stride, b, hk * group + g, i, dq + (g * nq + i) * D);
    for (int64_t j = 0; j < nk; j++) {
      store_row(r, r->dk, r->dk_stride, b, hk, j, dk + j * D);
      store_row(r, r->dv, r->dv_stride, b, hk, j, dv + j * D);
    }
  }
  free(S);
  free(P);
  free(dq);
  return rc;
}

static void ref_run(attn_pool_task *t, int64_t item, void *ws) {
  (void)ws;
  ref_job *rj = (ref_job *)t;
  const attn_request *r = &rj->job->req;
  if (atomic_load(&rj->failed))
    return;
  attn_status st = {0};
  /* A head is the unit of work: a canceled job skips the heads not begun. */
  int rc = attn__job_canceled(rj->job) ? attn__canceled(&st)
           : r->pass == ATTN_BACKWARD  ? ref_backward_item(r, item, &st)
                                       : ref_forward_item(r, item, &st);
  if (rc < 0 && atomic_exchange(&rj->failed, 1) == 0)
    rj->err = st;
}

/* dsinks sums over the batch, across the items: once, at the end. */
static void ref_dsinks(ref_job *rj) {
  const attn_request *r = &rj->job->req;
  double *d = malloc((size_t)r->heads_q * sizeof *d);
  attn_status st = {0};
  int rc = d ? attn_reference_dsinks(r, d, &st)
             : attn_status_set(&st, ATTN_ENOMEM, "out of memory in the reference");
  for (int64_t h = 0; rc == 0 && h < r->heads_q; h++)
    r->dsinks[h] = (float)d[h];
  if (rc < 0 && atomic_exchange(&rj->failed, 1) == 0)
    rj->err = st;
  free(d);
}

static void ref_finish(attn_pool_task *t) {
  ref_job *rj = (ref_job *)t;
  if (rj->job->req.dsinks && !atomic_load(&rj->failed) && !attn__job_canceled(rj->job))
    ref_dsinks(rj);
  attn__job_complete(rj->job, atomic_load(&rj->failed) ? &rj->err : NULL);
  free(rj);
}

static int ref_open(const attn_backend_env *env, void **pstate, attn_status *st) {
  ref_state *s = calloc(1, sizeof *s);
  if (!s)
    return attn_status_set(st, ATTN_ENOMEM, "out of memory");
  s->pool = env->pool;
  s->max_bytes = env->cfg->reference_max_bytes;
  *pstate = s;
  return 0;
}

static void ref_close(void *state) { free(state); }

static int ref_supports(void *state, const attn_request *r, attn_status *st) {
  ref_state *s = state;
  /* The reference reads dense k and v only (reference.c); pages are the
   * cpu kernel's. */
  if (r->k_pages)
    return attn_status_set(st, ATTN_EUNSUPPORTED, "paged K/V (sessions) runs on the cpu backend");
  double bytes = 2.0 * 8.0 * (double)r->seq_q * (double)r->seq_kv;
  if (bytes > (double)s->max_bytes)
    return attn_status_set(st, ATTN_ETOOBIG,
                           "the reference backend materializes S and P in float64: "
                           "%.0f bytes per head for seq_q=%lld, seq_kv=%lld is over "
                           "its limit of %llu; use backend cpu",
                           bytes, (long long)r->seq_q, (long long)r->seq_kv,
                           (unsigned long long)s->max_bytes);
  double macs = 2.0 * (double)r->batch * (double)r->heads_q * (double)r->seq_q * (double)r->seq_kv *
                (double)r->head_dim;
  if (macs > (double)REFERENCE_MAX_MACS)
    return attn_status_set(st, ATTN_ETOOBIG,
                           "the reference backend is for small problems: %.3g "
                           "multiply-adds is over its limit of %.3g; use backend cpu",
                           macs, (double)REFERENCE_MAX_MACS);
  return 0;
}

static int ref_submit(void *state, attn_job *job, attn_status *st) {
  ref_state *s = state;
  ref_job *rj = calloc(1, sizeof *rj);
  if (!rj)
    return attn_status_set(st, ATTN_ENOMEM, "out of memory queueing a job");
  rj->job = job;
  const attn_request *r = &job->req;
  rj->task.nitems = r->batch * (r->pass == ATTN_BACKWARD ? r->heads_kv : r->heads_q);
  rj->task.run = ref_run;
  rj->task.finish = ref_finish;
  attn_pool_submit(s->pool, &rj->task);
  return 0;
}

static void ref_describe(void *state, char *buf, size_t cap) {
  ref_state *s = state;
  snprintf(buf, cap, "float64 standard attention, S+P up to %llu bytes per head",
           (unsigned long long)s->max_bytes);
}

const struct attn_backend_ops attn__reference_backend = {
    .name = "reference",
    .open = ref_open,
    .close = ref_close,
    .supports = ref_supports,
    .submit = ref_submit,
    .describe = ref_describe,
};
