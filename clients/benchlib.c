/* benchlib.c — see benchlib.h. */
#include "benchlib.h"

#include "proto.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t next(uint64_t *s) { /* splitmix64 */
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

int tool_bench_case_init(tool_bench_case *c, int64_t batch, int64_t heads, int64_t heads_kv,
                         int64_t seq_q, int64_t seq_kv, int64_t head_dim, attn_dtype dt,
                         bool causal, uint64_t seed) {
  attn_request *r = &c->req;
  attn_request_init(r);
  r->batch = batch;
  r->heads_q = heads;
  r->heads_kv = heads_kv;
  r->seq_q = seq_q;
  r->seq_kv = seq_kv;
  r->head_dim = head_dim;
  r->dtype = dt;
  r->causal = causal;
  size_t es = attn_dtype_size(dt);
  size_t nq = (size_t)(batch * heads * seq_q * head_dim);
  size_t nk = (size_t)(batch * heads_kv * seq_kv * head_dim);
  char *m = malloc((2 * nq + 2 * nk) * es);
  if (!m)
    return ATTN_ENOMEM;
  c->mem = m;
  r->q = m;
  r->k = m + nq * es;
  r->v = m + (nq + nk) * es;
  r->o = m + (nq + 2 * nk) * es;
  for (size_t i = 0; i < nq + 2 * nk; i++) {
    float x = (float)((double)(next(&seed) >> 40) * 0x1p-23 - 1.0);
    attn_store_elem(m, dt, i, x);
  }
  memset(r->o, 0, nq * es);
  c->bmem = NULL;
  return 0;
}

void tool_bench_case_free(tool_bench_case *c) {
  free(c->mem);
  free(c->bmem);
  c->mem = c->bmem = NULL;
}

int tool_bench_case_backward(tool_bench_case *c, attn_engine *e, uint64_t seed, attn_status *st) {
  attn_request *r = &c->req;
  size_t es = attn_dtype_size(r->dtype);
  size_t nq = (size_t)(r->batch * r->heads_q * r->seq_q * r->head_dim);
  size_t nk = (size_t)(r->batch * r->heads_kv * r->seq_kv * r->head_dim);
  size_t rows = (size_t)(r->batch * r->heads_q * r->seq_q);
  char *m = malloc((2 * nq + 2 * nk) * es + rows * sizeof(float));
  if (!m)
    return attn_status_set(st, ATTN_ENOMEM, "out of memory for the backward's buffers");
  c->bmem = m;
  float *lse = (float *)(void *)(m + (2 * nq + 2 * nk) * es);
  for (size_t i = 0; i < nq; i++)
    attn_store_elem(m, r->dtype, i, (float)((double)(next(&seed) >> 40) * 0x1p-23 - 1.0));
  r->backend = "cpu";
  r->lse = lse;
  int rc = attn_engine_run(e, r, NULL, st);
  r->lse = NULL;
  if (rc < 0)
    return rc;
  r->pass = ATTN_BACKWARD;
  r->dout = m;
  r->dq = m + nq * es;
  r->dk = m + 2 * nq * es;
  r->dv = m + (2 * nq + nk) * es;
  r->lse_in = lse;
  return 0;
}

attn_engine *tool_bench_open(int threads, const char *isa, const char *tune, attn_status *st) {
  attn_config cfg;
  attn_config_init(&cfg);
  cfg.threads = threads;
  cfg.cpu_isa = isa;
  cfg.cpu_tune = tune;
  attn_engine *e;
  if (attn_engine_open(&cfg, &e, st) < 0)
    return NULL;
  /* A kernel asked for by name that this CPU cannot run leaves the cpu
   * backend closed: say why now, not "no backend can run" at the first job. */
  attn_backend_info info[8];
  int n = attn_engine_backends(e, info, 8);
  for (int i = 0; isa && *isa && strcmp(isa, "auto") && i < n && i < 8; i++)
    if (!strcmp(info[i].name, "cpu") && !info[i].available) {
      attn_status_set(st, ATTN_EUNSUPPORTED, "--isa %s: %s", isa, info[i].detail);
      attn_engine_close(e);
      return NULL;
    }
  return e;
}

double tool_bench_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

double tool_bench_median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double tool_bench_engine(attn_engine *e, const attn_request *r, int reps, attn_status *st) {
  double t[64];
  if (reps < 1)
    reps = 1;
  if (reps > 64)
    reps = 64;
  int rc = attn_engine_run(e, r, NULL, st);
  for (int i = 0; rc == 0 && i < reps; i++) {
    double t0 = tool_bench_now();
    rc = attn_engine_run(e, r, NULL, st);
    t[i] = tool_bench_now() - t0;
  }
  return rc < 0 ? rc : tool_bench_median(t, reps);
}
