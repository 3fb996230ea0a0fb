/*
 * cpu.c — the "cpu" backend: FlashAttention on the engine's worker pool.
 *
 * A job runs in two phases on the pool. The scan phase reads Q, K and V once
 * (one item per tensor head) for non-finite values and their largest
 * magnitudes; from those it either fails the job (ENONFINITE, or ERANGE when
 * scores could overflow F32) or starts the compute phase, one item per
 * (batch, query head, block of ATTN_FLASH_BQ query rows), or, for short
 * query sequences under GQA, per block of several query heads of one KV
 * head. Items of a head are handed out last block first: under a causal
 * mask the last blocks see the most keys, and starting them early evens out
 * the tail of the job.
 *
 * Every item's arithmetic depends only on its inputs, never on which thread
 * runs it or in what order, so results are bit-identical for any thread
 * count.
 */
#include "backend.h"
#include "flash.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct cpu_state {
  attn_pool *pool;
  const attn__flash_isa *isa;
} cpu_state;

typedef struct cpu_job {
  attn_pool_task task;
  attn_job *job;
  cpu_state *s;
  attn__flash_args args;
  int64_t nqt;     /* query blocks per head */
  int64_t hb;      /* query heads packed into one block (GQA decode), >= 1 */
  int64_t hchunks; /* blocks of hb heads per KV head: ceil(group / hb) */
  float *maxabs;   /* scan phase: one per item */
  int64_t *bad;    /* scan phase: first non-finite element per item, or -1 */
} cpu_job;

static const char *const scan_names[3] = {"q", "k", "v"};

/* Scan item -> tensor (0 q, 1 k, 2 v), batch, head. */
static void scan_item(const attn_request *r, int64_t item, int *t, int64_t *b,
                      int64_t *h) {
  int64_t nq = r->batch * r->heads_q, nkv = r->batch * r->heads_kv;
  int64_t heads = r->heads_q;
  *t = 0;
  if (item >= nq) {
    item -= nq;
    heads = r->heads_kv;
    *t = 1 + (int)(item / nkv);
    item %= nkv;
  }
  *b = item / heads;
  *h = item % heads;
}

static void scan_run(attn_pool_task *task, int64_t item, void *ws) {
  (void)ws;
  cpu_job *cj = (cpu_job *)task;
  const attn_request *r = &cj->job->req;
  /* Canceled: the remaining items are claimed and skipped, which ends the
   * task within one item's time on each worker. */
  if (attn__job_canceled(cj->job))
    return;
  int t;
  int64_t b, h;
  scan_item(r, item, &t, &b, &h);
  const void *base[3] = {r->q, r->k, r->v};
  const int64_t *s[3] = {r->q_stride, r->k_stride, r->v_stride};
  int64_t n = t == 0 ? r->seq_q : r->seq_kv;
  const char *p = (const char *)base[t] +
                  (size_t)(b * s[t][0] + h * s[t][1]) * attn_dtype_size(r->dtype);
  cj->maxabs[item] = 0;
  cj->bad[item] = cj->s->isa->scan(p, r->dtype, n, r->head_dim, s[t][2],
                                    &cj->maxabs[item]);
}

/* Item -> (batch, KV head, chunk of hb query heads, query block). */
static void compute_run(attn_pool_task *task, int64_t item, void *ws) {
  cpu_job *cj = (cpu_job *)task;
  const attn_request *r = &cj->job->req;
  if (attn__job_canceled(cj->job))
    return;
  const int64_t g = cj->args.group;
  int64_t qblk = cj->nqt - 1 - item % cj->nqt;
  item /= cj->nqt;
  int64_t chunk = item % cj->hchunks;
  item /= cj->hchunks;
  attn__flash_block blk;
  blk.b = item / r->heads_kv;
  blk.h0 = (item % r->heads_kv) * g + chunk * cj->hb;
  blk.nh = g - chunk * cj->hb < cj->hb ? g - chunk * cj->hb : cj->hb;
  blk.i0 = qblk * ATTN_FLASH_BQ;
  blk.nq = r->seq_q - blk.i0 < ATTN_FLASH_BQ ? r->seq_q - blk.i0 : ATTN_FLASH_BQ;
  cj->s->isa->rows(&cj->args, &blk, ws);
}

static void compute_finish(attn_pool_task *task) {
  cpu_job *cj = (cpu_job *)task;
  attn_status st = {0};
  /* Items may have been skipped: a canceled job's outputs are not whole. */
  if (attn__job_canceled(cj->job))
    attn__canceled(&st);
  attn__job_complete(cj->job, st.code ? &st : NULL);
  free(cj);
}

/* The whole scan, in item order: the first problem found, or 0. */
static int scan_verdict(cpu_job *cj, attn_status *st) {
  const attn_request *r = &cj->job->req;
  double mx[3] = {0, 0, 0};
  for (int64_t i = 0; i < cj->task.nitems; i++) {
    int t;
    int64_t b, h;
    scan_item(r, i, &t, &b, &h);
    if (cj->bad[i] >= 0)
      return attn__nonfinite(st, scan_names[t], b, h, cj->bad[i] / r->head_dim,
                             cj->bad[i] % r->head_dim);
    mx[t] = fmax(mx[t], cj->maxabs[i]);
  }
  return attn__check_magnitudes(r, mx, st);
}

static void scan_finish(attn_pool_task *task) {
  cpu_job *cj = (cpu_job *)task;
  attn_status st = {0};
  int rc = attn__job_canceled(cj->job) ? attn__canceled(&st) : scan_verdict(cj, &st);
  free(cj->maxabs);
  free(cj->bad);
  cj->maxabs = NULL;
  cj->bad = NULL;
  if (rc < 0) {
    attn__job_complete(cj->job, &st);
    free(cj);
    return;
  }
  const attn_request *r = &cj->job->req;
  cj->task.nitems = r->batch * r->heads_kv * cj->hchunks * cj->nqt;
  cj->task.run = compute_run;
  cj->task.finish = compute_finish;
  attn_pool_submit(cj->s->pool, &cj->task);
}

static int cpu_submit(void *state, attn_job *job, attn_status *st) {
  cpu_state *s = state;
  const attn_request *r = &job->req;
  cpu_job *cj = calloc(1, sizeof *cj);
  int64_t nscan = r->batch * (r->heads_q + 2 * r->heads_kv);
  if (cj) {
    cj->maxabs = malloc((size_t)nscan * sizeof *cj->maxabs);
    cj->bad = malloc((size_t)nscan * sizeof *cj->bad);
  }
  if (!cj || !cj->maxabs || !cj->bad) {
    if (cj) {
      free(cj->maxabs);
      free(cj->bad);
    }
    free(cj);
    return attn_status_set(st, ATTN_ENOMEM, "out of memory queueing a job");
  }
  cj->job = job;
  cj->s = s;
  cj->args.r = r;
  cj->args.scale2 = (float)(attn_request_scale(r) * M_LOG2E);
  attn_request_window(r, &cj->args.wl, &cj->args.wr);
  cj->args.off = r->seq_kv - r->seq_q;
  cj->args.group = r->heads_q / r->heads_kv;
  cj->nqt = (r->seq_q + ATTN_FLASH_BQ - 1) / ATTN_FLASH_BQ;
  /* Short query sequences (decoding) pack the heads of a GQA group into one
   * block, so each K/V tile is read and converted once for the group. Long
   * ones keep one head per block: there are blocks enough to go round. */
  int64_t fit = r->seq_q <= ATTN_FLASH_BQ / 2 ? ATTN_FLASH_BQ / r->seq_q : 1;
  cj->hb = fit < cj->args.group ? fit : cj->args.group;
  cj->hchunks = (cj->args.group + cj->hb - 1) / cj->hb;
  cj->task.nitems = nscan;
  cj->task.run = scan_run;
  cj->task.finish = scan_finish;
  attn_pool_submit(s->pool, &cj->task);
  return 0;
}

const attn__flash_isa *attn__flash_select(const char *want, attn_status *st) {
  const attn__flash_isa *best = &attn__flash_generic;
  const attn__flash_isa *all[3] = {NULL, NULL, &attn__flash_generic};
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c"))
    all[1] = &attn__flash_avx2;
  if (all[1] && __builtin_cpu_supports("avx512f") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq"))
    all[0] = &attn__flash_avx512;
#endif
  for (int i = 0; i < 3; i++)
    if (all[i]) {
      best = all[i];
      break;
    }
  if (!want || !*want || strcmp(want, "auto") == 0)
    return best;
  for (int i = 0; i < 3; i++) {
    static const char *const names[3] = {"avx512", "avx2", "generic"};
    if (strcmp(want, names[i]) != 0)
      continue;
    if (all[i])
      return all[i];
    attn_status_set(st, ATTN_EUNSUPPORTED,
                    "this CPU cannot run the %s kernel (best: %s)", want, best->name);
    return NULL;
  }
  attn_status_set(st, ATTN_EINVAL,
                  "unknown CPU kernel \"%.40s\" (choose auto, avx512, avx2 or generic)",
                  want);
  return NULL;
}

static size_t cpu_workspace_bytes(const attn_config *cfg) {
  (void)cfg;
  return ATTN_FLASH_WS_FLOATS * sizeof(float);
}

static int cpu_open(const attn_backend_env *env, void **pstate, attn_status *st) {
  const attn__flash_isa *isa = attn__flash_select(env->cfg->cpu_isa, st);
  if (!isa)
    return st ? st->code : ATTN_EUNSUPPORTED;
  cpu_state *s = calloc(1, sizeof *s);
  if (!s)
    return attn_status_set(st, ATTN_ENOMEM, "out of memory");
  s->pool = env->pool;
  s->isa = isa;
  *pstate = s;
  return 0;
}

static void cpu_close(void *state) { free(state); }

static int cpu_supports(void *state, const attn_request *r, attn_status *st) {
  (void)state;
  (void)r;
  (void)st;
  return 0; /* every valid request */
}

static void cpu_describe(void *state, char *buf, size_t cap) {
  cpu_state *s = state;
  snprintf(buf, cap, "%s kernel, %d threads", s->isa->name,
           attn_pool_threads(s->pool));
}

const struct attn_backend_ops attn__cpu_backend = {
    /* .name            = */ "cpu",
    /* .workspace_bytes = */ cpu_workspace_bytes,
    /* .open            = */ cpu_open,
    /* .close           = */ cpu_close,
    /* .supports        = */ cpu_supports,
    /* .submit          = */ cpu_submit,
    /* .describe        = */ cpu_describe,
    /* .automatic       = */ true,
    /* .healthy         = */ NULL,
};
