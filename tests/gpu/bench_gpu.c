/*
 * bench_gpu.c — TFLOP/s of the CUDA kernels themselves (attn_cu_launch on
 * device-resident tensors: no packing, no copies, no engine), on the shapes
 * tests/gpu/sdpa_bench.py times PyTorch's SDPA on:
 *
 *   prefill  B=4, H=16, N in 1024, 4096, 8192, D in 64, 128, F16 and BF16,
 *            causal and not; FLOPs 4*B*H*Nq*Nkv*D, halved for causal
 *   decode   B=1 and 4, Hq=32, Hkv=8, Nq=1, Nkv=32768, D=128 (BF16; F16 at
 *            B=1; D=64 BF16 at B=1): time in microseconds and GB/s of K
 *            and V read; "decode" rows on the decode kernel attn_cu_select
 *            picks, "decode-mma" rows on the tiled forward and its merge
 *            (the decode kernel masked off) for the comparison
 *   backward B=4, H=16, N in 1024, 4096, D in 64, 128, F16 and BF16, causal
 *            and not: the three backward kernels (preprocess, dK/dV, dQ),
 *            given the forward's O and lse; FLOPs 2.5 times the forward's
 *            (FlashAttention's convention)
 *   bwd_atomic  each backward shape again on the atomic dQ path (attnd
 *            --deterministic off: no dQ kernel, dQ by atomics in the dK/dV
 *            pass, then its conversion), FLOPs counted as the backward's
 *
 * Method: random inputs (uniform in [-1, 1),
 * never zeros) copied from a host pool; warm-up launches until 30 ms of
 * device time; then launches with a CUDA event between consecutive ones,
 * at least 20 and until 200 ms, the median of the per-launch times.
 * When one input set (Q, K, V, O) is under 3x the L2 cache, launches rotate
 * over enough sets to exceed that, so the numbers are not the cache's.
 * O is poisoned before the warm-up and checked for non-finite values after
 * it: a case whose output is garbage is reported BAD, not timed quietly.
 *
 * With --hopper (or --hopper-full) the shapes are instead the Hopper
 * instance's table (issue 19): B=4, H=16, BF16, causal and not, each timed
 * as "prefill" (the mma.sync instance attn_cu_select picks) and as
 * "hopper" (the sm_90a instance, turned on by attn_cu_select_hopper as the
 * self-check would); --hopper-full is N in 1k, 2k, 4k, 8k, 16k and D in 64,
 * 96, 128, 192, 256, --hopper N in 4k, 8k, 16k at D=128 and N=8k at D=64,
 * 96, 192 and 256.
 *
 * With --staging it instead takes one job (B=4, H=16, N=4096, D=128, BF16)
 * step by step: the host pack into pinned memory, the upload from pinned
 * and from pageable memory, the kernel alone, the download, the same steps
 * for one of the job's (batch, head) groups, and the whole job through
 * attn_engine_run twice: from ordinary memory (packed through the chunks)
 * and from memory the engine lent (attn_engine_host_alloc: uploaded and
 * downloaded in place, groups overlapped); one table and the whole job
 * against its steps.
 *
 * With --sessions: a session's decode step at 32768 cached tokens through
 * the engine's store (pages on the device) against the kernel alone
 * (bench_sessions.c).
 *
 *   bench-gpu [--quick | --hopper | --hopper-full | --staging | --sessions]
 *             [--csv FILE] [--min-ms MS] [--min-reps N]
 *
 * Without a device: "bench-gpu: skipped: no CUDA device (...)", exit 0.
 * Exit status 1 when a case failed (a CUDA error or a BAD output).
 */
#define _GNU_SOURCE
#include "bench_sessions.h"
#include "engine.h"
#include "kernels.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef ATTN_HAVE_CUDA
int main(void) {
  printf("bench-gpu: skipped: no CUDA device (this build has no CUDA backend)\n");
  return 0;
}
#else
#include <cuda_runtime_api.h>

static int check(cudaError_t e, const char *what, int line) {
  if (e == cudaSuccess)
    return 0;
  fprintf(stderr, "bench-gpu: line %d: %s: %s (%s)\n", line, what, cudaGetErrorString(e),
          cudaGetErrorName(e));
  return -1;
}
#define CK(call) check((cudaError_t)(call), #call, __LINE__)

typedef struct bshape {
  const char *kind; /* "prefill", "decode", "decode-mma", "backward", "bwd_atomic" or "hopper" */
  int b, hq, hkv, nq, nkv, d;
  attn_dtype dt;
  bool causal;
} bshape;

typedef struct bopts {
  bool quick, staging, sessions;
  int hopper; /* 1: --hopper, 2: --hopper-full */
  const char *csv;
  double min_ms;
  int min_reps, max_reps;
  double max_ms;
} bopts;

static bopts o = {.min_ms = 200, .min_reps = 20, .max_reps = 3000, .max_ms = 3000};

/* ---- the shapes (sdpa_bench.py lists the same) ----------------------------- */

static int shapes(bshape *s, bool quick) {
  static const int ns[] = {1024, 4096, 8192};
  static const int ds[] = {64, 128};
  static const attn_dtype dts[] = {ATTN_F16, ATTN_BF16};
  int n = 0;
  for (int t = 0; t < 2; t++)
    for (int j = 0; j < 2; j++)
      for (int i = 0; i < 3; i++)
        for (int c = 0; c < 2; c++) {
          if (quick && (ds[j] != 128 || ns[i] != 4096))
            continue;
          s[n++] = (bshape){"prefill", 4, 16, 16, ns[i], ns[i], ds[j], dts[t], c == 1};
        }
  /* the instances between 64, 128 and 256 (FlashAttention-2 has 96, 160, 192) */
  static const int mids[] = {96, 160, 192};
  for (int j = 0; j < 3 && !quick; j++)
    for (int c = 0; c < 2; c++)
      s[n++] = (bshape){"prefill", 4, 16, 16, 4096, 4096, mids[j], ATTN_BF16, c == 1};
  /* "decode" is what attn_cu_select picks (the decode kernel, decode.cuh);
   * "decode-mma" the same shapes on the tiled forward with its split-KV
   * merge, as they ran before it, for the comparison */
  for (int k = 0; k < 2; k++) {
    const char *kind = k ? "decode-mma" : "decode";
    s[n++] = (bshape){kind, 1, 32, 8, 1, 32768, 128, ATTN_BF16, false};
    if (!quick) {
      s[n++] = (bshape){kind, 4, 32, 8, 1, 32768, 128, ATTN_BF16, false};
      s[n++] = (bshape){kind, 1, 32, 8, 1, 32768, 128, ATTN_F16, false};
      s[n++] = (bshape){kind, 1, 32, 8, 1, 32768, 64, ATTN_BF16, false};
    }
  }
  for (int t = 0; t < 2; t++)
    for (int j = 0; j < 2; j++)
      for (int i = 0; i < 2; i++)
        for (int c = 0; c < 2; c++) {
          if (quick && (ds[j] != 128 || ns[i + 1] != 4096))
            continue;
          s[n++] = (bshape){"backward", 4, 16, 16, ns[i], ns[i], ds[j], dts[t], c == 1};
          s[n++] = (bshape){"bwd_atomic", 4, 16, 16, ns[i], ns[i], ds[j], dts[t], c == 1};
        }
  return n;
}

/* The Hopper table: each shape as "prefill" and as "hopper". */
static int hopper_shapes(bshape *s, bool full) {
  static const int ns[] = {1024, 2048, 4096, 8192, 16384};
  static const int ds[] = {64, 96, 128, 192, 256};
  int n = 0;
  for (int j = 0; j < 5; j++)
    for (int i = 0; i < 5; i++)
      for (int c = 0; c < 2; c++) {
        if (!full && !(ds[j] == 128 ? ns[i] >= 4096 : ns[i] == 8192))
          continue;
        s[n++] = (bshape){"prefill", 4, 16, 16, ns[i], ns[i], ds[j], ATTN_BF16, c == 1};
        s[n++] = (bshape){"hopper", 4, 16, 16, ns[i], ns[i], ds[j], ATTN_BF16, c == 1};
      }
  return n;
}

/* ---- random inputs ------------------------------------------------------------ */

/* A pool of random 16-bit elements per dtype; tensors copy rows out of it
 * at a moving position (a length prime to every row size, so tensors and
 * sets differ). */
#define POOL_N ((size_t)(1u << 22) + 4099u)
#define STAGE_BYTES ((size_t)32 << 20)

static uint16_t *pool[ATTN_DTYPE_COUNT];
static unsigned char *stage; /* pinned */

static uint64_t rng = 0x243f6a8885a308d3ull;
static double uniform(void) { /* [-1, 1) */
  uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return (double)(z >> 11) * 0x1p-52 - 1.0;
}

static int make_pools(void) {
  for (int t = ATTN_F16; t <= ATTN_BF16; t++) {
    pool[t] = malloc(POOL_N * sizeof(uint16_t));
    if (!pool[t])
      return -1;
    for (size_t i = 0; i < POOL_N; i++)
      pool[t][i] = t == ATTN_F16 ? attn_f64_to_f16(uniform()) : attn_f64_to_bf16(uniform());
  }
  return CK(cudaMallocHost((void **)&stage, STAGE_BYTES));
}

/* rows x d random elements into host memory as rows x dp, zero columns
 * after d. */
static void fill_host(uint16_t *dst, size_t rows, int d, int dp, attn_dtype dt, size_t *pos) {
  for (size_t r = 0; r < rows; r++, dst += dp) {
    for (int i = 0; i < d; i++) {
      dst[i] = pool[dt][*pos];
      if (++*pos == POOL_N)
        *pos = 0;
    }
    for (int i = d; i < dp; i++)
      dst[i] = 0;
  }
}

/* rows x d random elements into dev as rows x dp, zero columns after d. */
static int fill(void *dev, size_t rows, int d, int dp, attn_dtype dt, size_t *pos) {
  size_t es = 2, row_bytes = (size_t)dp * es, per = STAGE_BYTES / row_bytes;
  for (size_t r0 = 0; r0 < rows; r0 += per) {
    size_t nr = rows - r0 < per ? rows - r0 : per;
    fill_host((uint16_t *)stage, nr, d, dp, dt, pos);
    if (CK(cudaMemcpy((unsigned char *)dev + r0 * row_bytes, stage, nr * row_bytes,
                      cudaMemcpyHostToDevice)))
      return -1;
  }
  return 0;
}

/* ---- one shape ------------------------------------------------------------------ */

typedef struct bset {
  void *q, *k, *v, *o;
  void *dout, *dq, *dk, *dv; /* backward only */
  float *lse;
} bset;

static void point(attn_cu_params *p, const bset *b) {
  p->q = b->q, p->k = b->k, p->v = b->v, p->o = b->o;
  p->dout = b->dout, p->dq = b->dq, p->dk = b->dk, p->dv = b->dv, p->lse = b->lse;
}

/* A backward set: dO random, dQ/dK/dV poisoned, and O and lse from the
 * forward on the set's Q, K, V (unsplit, so it needs no scratch). */
static int fill_backward(bset *b, const attn_cu_params *p0, size_t rq, size_t qb, size_t kvb,
                         size_t *pos, cudaStream_t st) {
  attn_cu_params fp = *p0;
  attn_cu_choice fch;
  attn_status as = {0};
  fp.pass = ATTN_FORWARD;
  if (CK(cudaMalloc(&b->dout, qb)) || CK(cudaMalloc(&b->dq, qb)) || CK(cudaMalloc(&b->dk, kvb)) ||
      CK(cudaMalloc(&b->dv, kvb)) || CK(cudaMalloc((void **)&b->lse, rq * sizeof(float))) ||
      fill(b->dout, rq, p0->head_dim, p0->dp, p0->dtype, pos) || CK(cudaMemset(b->dq, 0xff, qb)) ||
      CK(cudaMemset(b->dk, 0xff, kvb)) || CK(cudaMemset(b->dv, 0xff, kvb)))
    return -1;
  if (attn_cu_select(&fp, 0, &fch, &as) != 0) {
    fprintf(stderr, "bench-gpu: attn_cu_select: %s\n", as.message);
    return -1;
  }
  point(&fp, b);
  fp.split_ws = NULL;
  return CK(attn_cu_launch(&fp, &fch, st)) || CK(cudaStreamSynchronize(st)) ? -1 : 0;
}

#define MAX_SETS 8

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The median of n sorted values. */
static double median(const double *t, int n) {
  return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

/* Non-finite elements of a 16-bit O [rows, dp] on the device, columns < d. */
static long nonfinite(const void *dev, size_t rows, int d, int dp, attn_dtype dt) {
  size_t n = rows * (size_t)dp;
  uint16_t *h = malloc(n * 2);
  if (!h)
    return -1;
  long bad = -1;
  if (!CK(cudaMemcpy(h, dev, n * 2, cudaMemcpyDeviceToHost))) {
    uint16_t mask = dt == ATTN_F16 ? 0x7c00 : 0x7f80;
    bad = 0;
    for (size_t i = 0; i < n; i++)
      bad += (int)(i % (size_t)dp) < d && (h[i] & mask) == mask;
  }
  free(h);
  return bad;
}

typedef struct bresult {
  double med_ms, min_ms;
  int reps, sets;
  attn_cu_choice ch;
  const char *status; /* "ok", "BAD" or "ERROR" */
} bresult;

/* The launch parameters of shape s (the default scale, causal or not). */
static void shape_params(const bshape *s, attn_cu_params *p) {
  memset(p, 0, sizeof *p);
  p->dtype = s->dt;
  p->batch = s->b;
  p->heads_q = s->hq;
  p->heads_kv = s->hkv;
  p->seq_q = s->nq;
  p->seq_kv = s->nkv;
  p->head_dim = s->d;
  p->dp = attn_cu_dp(s->d);
  p->scale_log2 = (float)(1.0 / sqrt((double)s->d) * M_LOG2E);
  p->scale = (float)(1.0 / sqrt((double)s->d));
  p->bwd_atomic_dq = strcmp(s->kind, "bwd_atomic") == 0;
  p->pass = strcmp(s->kind, "backward") == 0 || p->bwd_atomic_dq ? ATTN_BACKWARD : ATTN_FORWARD;
  p->window_left = -1;
  p->window_right = s->causal ? 0 : -1;
}

/* How many input sets rotate through the launches: enough that together
 * they exceed the L2 three times, so no launch finds its inputs cached. */
static int sets_for(size_t set_bytes, size_t l2) {
  if (set_bytes >= 3 * l2)
    return 1;
  int n = (int)((3 * l2 + set_bytes - 1) / set_bytes);
  return n < 2 ? 2 : n > MAX_SETS ? MAX_SETS : n;
}

/* Allocates and fills n input sets of shape s (0, or -1 after a CUDA
 * error; free_sets() frees what was allocated either way). */
static int alloc_sets(bset *sets, int n, const bshape *s, const attn_cu_params *p,
                      cudaStream_t st) {
  const bool bwd = p->pass == ATTN_BACKWARD;
  size_t es = attn_dtype_size(s->dt);
  size_t rq = (size_t)s->b * s->hq * s->nq, rkv = (size_t)s->b * s->hkv * s->nkv;
  size_t qb = rq * p->dp * es, kvb = rkv * p->dp * es;
  size_t pos = (size_t)s->nkv * 7919u % POOL_N;
  for (int i = 0; i < n; i++) {
    bset *b = &sets[i];
    if (CK(cudaMalloc(&b->q, qb)) || CK(cudaMalloc(&b->k, kvb)) || CK(cudaMalloc(&b->v, kvb)) ||
        CK(cudaMalloc(&b->o, qb)) || fill(b->q, rq, s->d, p->dp, s->dt, &pos) ||
        fill(b->k, rkv, s->d, p->dp, s->dt, &pos) || fill(b->v, rkv, s->d, p->dp, s->dt, &pos) ||
        CK(cudaMemset(b->o, 0xff, qb)) || (bwd && fill_backward(b, p, rq, qb, kvb, &pos, st)))
      return -1;
  }
  return 0;
}

static void free_sets(bset *sets, int n) {
  for (int i = 0; i < n; i++) {
    void *all[9] = {sets[i].q,  sets[i].k,  sets[i].v,  sets[i].o,  sets[i].dout,
                    sets[i].dq, sets[i].dk, sets[i].dv, sets[i].lse};
    for (int j = 0; j < 9; j++)
      if (all[j])
        CK(cudaFree(all[j]));
  }
}

/* Launches until 30 ms of device time have passed (clocks up, code
 * loaded); 0, or -1 after a CUDA error. */
static int warm_up(attn_cu_params *p, const attn_cu_choice *ch, const bset *sets, int nsets,
                   cudaEvent_t *ev, cudaStream_t st) {
  double warm = 0;
  for (int it = 0; it < 200 && warm < 30; it++) {
    point(p, &sets[it % nsets]);
    float ms = 0;
    if (CK(cudaEventRecord(ev[0], st)) || CK(attn_cu_launch(p, ch, st)) ||
        CK(cudaEventRecord(ev[1], st)) || CK(cudaEventSynchronize(ev[1])) ||
        CK(cudaGetLastError()) || CK(cudaEventElapsedTime(&ms, ev[0], ev[1])))
      return -1;
    warm += ms;
  }
  return 0;
}

/* The timed launches, an event between consecutive ones, 64 a round, into
 * times (o.max_reps of room); the count, or -1 after a CUDA error. */
static int time_launches(attn_cu_params *p, const attn_cu_choice *ch, const bset *sets, int nsets,
                         cudaEvent_t *ev, cudaStream_t st, double *times) {
  double total = 0;
  int reps = 0;
  while (reps < o.max_reps && (reps < o.min_reps || total < o.min_ms) && total < o.max_ms) {
    int k = o.max_reps - reps < 64 ? o.max_reps - reps : 64;
    if (CK(cudaEventRecord(ev[0], st)))
      return -1;
    for (int i = 0; i < k; i++) {
      point(p, &sets[(reps + i) % nsets]);
      if (CK(attn_cu_launch(p, ch, st)) || CK(cudaEventRecord(ev[i + 1], st)))
        return -1;
    }
    if (CK(cudaEventSynchronize(ev[k])) || CK(cudaGetLastError()))
      return -1;
    for (int i = 0; i < k; i++) {
      float ms = 0;
      if (CK(cudaEventElapsedTime(&ms, ev[i], ev[i + 1])))
        return -1;
      times[reps + i] = ms;
      total += ms;
    }
    reps += k;
  }
  return reps;
}

/* Whether the first set's outputs are all finite after the launches (they
 * were poisoned before); says what was not. */
static bool outputs_finite(const bshape *s, const attn_cu_params *p, const bset *b) {
  const bool bwd = p->pass == ATTN_BACKWARD;
  long bad = nonfinite(bwd ? b->dq : b->o, (size_t)s->b * s->hq * s->nq, s->d, p->dp, s->dt);
  if (bad == 0 && bwd)
    bad = nonfinite(b->dk, (size_t)s->b * s->hkv * s->nkv, s->d, p->dp, s->dt);
  if (bad != 0)
    fprintf(stderr, "bench-gpu: %ld non-finite elements in %s (poisoned before the launches)\n",
            bad, bwd ? "dQ or dK" : "O");
  return bad == 0;
}

static int choose(attn_cu_params *p, const bshape *s, int sms, attn_cu_choice *ch) {
  attn_status as = {0};
  const unsigned off = strcmp(s->kind, "decode-mma") == 0
                           ? ATTN_CU_HOPPER_OFF | ATTN_CU_DECODE_KERNELS
                           : ATTN_CU_HOPPER_OFF;
  if (attn_cu_select_masked(p, sms, off, ch, &as) != 0) {
    fprintf(stderr, "bench-gpu: attn_cu_select: %s\n", as.message);
    return -1;
  }
  if (strcmp(s->kind, "hopper") == 0 && !attn_cu_select_hopper(p, sms, ch)) {
    fprintf(stderr, "bench-gpu: attn_cu_select_hopper refused the shape\n");
    return -1;
  }
  return 0;
}

static int run_shape(const bshape *s, int sms, size_t l2, cudaStream_t st, bresult *res) {
  memset(res, 0, sizeof *res);
  res->status = "ERROR";
  attn_cu_params p;
  shape_params(s, &p);
  if (choose(&p, s, sms, &res->ch) < 0)
    return -1;
  const bool bwd = p.pass == ATTN_BACKWARD;
  size_t es = attn_dtype_size(s->dt);
  size_t qb = (size_t)s->b * s->hq * s->nq * p.dp * es,
         kvb = (size_t)s->b * s->hkv * s->nkv * p.dp * es;
  const int nsets = sets_for((bwd ? 4 : 2) * (qb + kvb), l2);
  res->sets = nsets;
  bset sets[MAX_SETS];
  memset(sets, 0, sizeof sets);
  void *ws = NULL;
  size_t wsb = attn_cu_split_bytes(&p, &res->ch) + attn_cu_bwd_bytes(&p);
  cudaEvent_t ev[65];
  int nev = 0, rc = -1, reps;
  double *times = malloc((size_t)o.max_reps * sizeof *times);
  if (!times || alloc_sets(sets, nsets, s, &p, st) < 0 || (wsb && CK(cudaMalloc(&ws, wsb))))
    goto out;
  for (; nev < 65; nev++)
    if (CK(cudaEventCreate(&ev[nev])))
      goto out;
  p.split_ws = bwd ? NULL : ws;
  p.bwd_ws = bwd ? (float *)ws : NULL;
  if (warm_up(&p, &res->ch, sets, nsets, ev, st) < 0)
    goto out;
  if (!outputs_finite(s, &p, &sets[0])) {
    res->status = "BAD";
    goto out;
  }
  if ((reps = time_launches(&p, &res->ch, sets, nsets, ev, st, times)) < 0)
    goto out;
  qsort(times, (size_t)reps, sizeof *times, cmp_double);
  res->reps = reps;
  res->med_ms = median(times, reps);
  res->min_ms = times[0];
  res->status = "ok";
  rc = 0;
out:
  for (int i = 0; i < nev; i++)
    CK(cudaEventDestroy(ev[i]));
  free_sets(sets, nsets);
  if (ws)
    CK(cudaFree(ws));
  free(times);
  return rc;
}

/* ---- --staging: a large job's steps, and the job through the engine -------- */

/*
 * The rows time each step of one large job, so the whole job through the
 * engine can be set against them: the best (and the median) of --min-reps
 * repetitions after SWARM warm-up ones; GPU copies by CUDA events, host
 * copies and the jobs by the wall clock. The engine runs the job in
 * SGROUPS groups of one batch entry (engine/cuda/stage.c); the group rows
 * time one of them.
 */
#define SWARM 2
#define SB 4
#define SH 16
#define SN 4096
#define SD 128
#define SGROUPS SB
/* A safetensors body's data follows an 8-byte length and a JSON header
 * padded to 8 bytes: 8-byte but not 256-byte aligned, as here. */
#define BODY_HEADER 232

typedef struct sbufs {
  size_t tb;               /* bytes of one tensor */
  unsigned char *pageable; /* Q, K, V, O back to back (malloc, as request bodies were) */
  unsigned char *staging;  /* pinned: Q, K, V, O packed */
  unsigned char *body;     /* lent by the engine: a body, BODY_HEADER bytes then Q, K, V */
  unsigned char *reply;    /* lent by the engine: O */
  unsigned char *dev;      /* Q, K, V, O */
  cudaStream_t st;
  cudaEvent_t ev[2];
  attn_engine *e;
  attn_request req, req_lent; /* the job on the pageable tensors, and on the lent ones */
} sbufs;

/* One repetition of a row: wall-clock ms and CUDA-event ms (-1: none). */
typedef int (*srep_fn)(sbufs *b, double *wall_ms, double *ev_ms);

typedef struct srow {
  const char *name;
  srep_fn fn;     /* NULL: a kernel alone, by run_shape */
  double tensors; /* bytes moved, in tensors (0: no GB/s) */
  int reps;
  double best, med; /* ms */
  const char *clock;
} srow;

static int rep_pack(sbufs *b, double *wall, double *ev) {
  double t0 = attn_now();
  for (int i = 0; i < 3; i++) /* what packing a contiguous tensor costs */
    memcpy(b->staging + i * b->tb, b->pageable + i * b->tb, b->tb);
  *wall = (attn_now() - t0) * 1e3;
  *ev = -1;
  return 0;
}

static int rep_unpack(sbufs *b, double *wall, double *ev) {
  double t0 = attn_now();
  memcpy(b->pageable + 3 * b->tb, b->staging + 3 * b->tb, b->tb);
  *wall = (attn_now() - t0) * 1e3;
  *ev = -1;
  return 0;
}

/* k copies of n bytes, dst[i] <- src[i], between two events. */
static int copies(sbufs *b, unsigned char *const *dst, const unsigned char *const *src, int k,
                  size_t n, enum cudaMemcpyKind kind, double *wall, double *ev) {
  float ms = 0;
  double t0 = attn_now();
  if (CK(cudaEventRecord(b->ev[0], b->st)))
    return -1;
  for (int i = 0; i < k; i++)
    if (CK(cudaMemcpyAsync(dst[i], src[i], n, kind, b->st)))
      return -1;
  if (CK(cudaEventRecord(b->ev[1], b->st)) || CK(cudaEventSynchronize(b->ev[1])) ||
      CK(cudaEventElapsedTime(&ms, b->ev[0], b->ev[1])))
    return -1;
  *wall = (attn_now() - t0) * 1e3;
  *ev = ms;
  return 0;
}

/* Q, K, V (parts of them: n bytes each) uploaded where they lie. */
static int up_from(sbufs *b, const unsigned char *base, size_t n, double *wall, double *ev) {
  unsigned char *d[3];
  const unsigned char *s[3];
  for (int i = 0; i < 3; i++)
    d[i] = b->dev + i * b->tb, s[i] = base + i * b->tb;
  return copies(b, d, s, 3, n, cudaMemcpyHostToDevice, wall, ev);
}

static int rep_up_pinned(sbufs *b, double *wall, double *ev) {
  return up_from(b, b->body + BODY_HEADER, b->tb, wall, ev);
}

static int rep_up_pageable(sbufs *b, double *wall, double *ev) {
  return up_from(b, b->pageable, b->tb, wall, ev);
}

static int rep_up_group(sbufs *b, double *wall, double *ev) {
  return up_from(b, b->body + BODY_HEADER, b->tb / SGROUPS, wall, ev);
}

static int down_part(sbufs *b, size_t n, double *wall, double *ev) {
  unsigned char *d[1] = {b->reply};
  const unsigned char *s[1] = {b->dev + 3 * b->tb};
  return copies(b, d, s, 1, n, cudaMemcpyDeviceToHost, wall, ev);
}

static int rep_download(sbufs *b, double *wall, double *ev) {
  return down_part(b, b->tb, wall, ev);
}

static int rep_down_group(sbufs *b, double *wall, double *ev) {
  return down_part(b, b->tb / SGROUPS, wall, ev);
}

static int run_job(sbufs *b, attn_request *r, double *wall, double *ev) {
  attn_result res;
  attn_status st = {0};
  double t0 = attn_now();
  if (attn_engine_run(b->e, r, &res, &st) != 0) {
    fprintf(stderr, "bench-gpu: the engine's job failed: %s\n", st.message);
    return -1;
  }
  *wall = (attn_now() - t0) * 1e3;
  *ev = -1;
  if (!res.backend || strcmp(res.backend, "cuda") != 0) {
    fprintf(stderr, "bench-gpu: the job ran on %s, not cuda\n", res.backend ? res.backend : "?");
    return -1;
  }
  return 0;
}

static int rep_job(sbufs *b, double *wall, double *ev) { return run_job(b, &b->req, wall, ev); }

static int rep_job_lent(sbufs *b, double *wall, double *ev) {
  return run_job(b, &b->req_lent, wall, ev);
}

enum {
  R_PACK,
  R_UP_PINNED,
  R_UP_PAGEABLE,
  R_KERNEL,
  R_DOWN,
  R_UNPACK,
  R_G_UP,
  R_G_KERNEL,
  R_G_DOWN,
  R_JOB,
  R_JOB_LENT,
  R_N
};

static srow srows[R_N] = {
    [R_PACK] = {"pack: pageable -> pinned (CPU)", rep_pack, 3},
    [R_UP_PINNED] = {"upload: from pinned memory", rep_up_pinned, 3},
    [R_UP_PAGEABLE] = {"upload: from pageable (reference)", rep_up_pageable, 3},
    [R_KERNEL] = {"kernel alone (non-causal)", NULL, 0},
    [R_DOWN] = {"download: O into pinned memory", rep_download, 1},
    [R_UNPACK] = {"unpack: O to pageable (CPU)", rep_unpack, 1},
    [R_G_UP] = {"group: upload (1 of 4 batch entries)", rep_up_group, 3.0 / SGROUPS},
    [R_G_KERNEL] = {"group: kernel", NULL, 0},
    [R_G_DOWN] = {"group: download", rep_down_group, 1.0 / SGROUPS},
    [R_JOB] = {"job: engine, ordinary memory", rep_job, 0},
    [R_JOB_LENT] = {"job: engine, lent memory (in place)", rep_job_lent, 0},
};
/* Best and median of o.min_reps repetitions after SWARM. */
static int best_of(sbufs *b, srow *row) {
  int n = o.min_reps, rc = 0;
  double *t = malloc((size_t)n * sizeof *t);
  if (!t)
    return -1;
  for (int i = -SWARM; i < n && rc == 0; i++) {
    double wall = 0, ev = -1;
    rc = row->fn(b, &wall, &ev);
    if (i >= 0)
      t[i] = ev >= 0 ? ev : wall;
    row->clock = ev >= 0 ? "events" : "wall";
  }
  if (rc == 0) {
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    row->reps = n;
    row->best = t[0];
    row->med = median(t, n);
  }
  free(t);
  return rc;
}

/* The kernel on device buffers, as bench-gpu's prefill rows time it: the
 * whole job's batch, or one group's. */
static int kernel_row(srow *row, int batch, const struct cudaDeviceProp *prop, cudaStream_t st) {
  const bshape s = {"prefill", batch, SH, SH, SN, SN, SD, ATTN_BF16, false};
  bresult r;
  if (run_shape(&s, prop->multiProcessorCount, (size_t)prop->l2CacheSize, st, &r) != 0)
    return -1;
  row->reps = r.reps;
  row->best = r.min_ms;
  row->med = r.med_ms;
  row->clock = "events";
  return 0;
}

/* A job on the tensors at qkv (Q, K, V back to back) writing O to out. */
static void job_on(attn_request *r, unsigned char *qkv, unsigned char *out, size_t tb) {
  attn_request_init(r);
  r->batch = SB, r->heads_q = r->heads_kv = SH, r->seq_q = r->seq_kv = SN, r->head_dim = SD;
  r->dtype = ATTN_BF16;
  r->backend = "cuda";
  r->q = qkv, r->k = qkv + tb, r->v = qkv + 2 * tb;
  r->o = out;
}

/* An engine with one stream (jobs run one at a time) that lends pinned
 * memory, and a body and a reply buffer from it, as the server takes them. */
static int staging_engine(sbufs *b) {
  attn_config cfg;
  attn_config_init(&cfg);
  cfg.cuda_streams = 1;
  cfg.cuda_pinned_bytes = 5 * b->tb;
  attn_status st = {0};
  if (attn_engine_open(&cfg, &b->e, &st) < 0) {
    fprintf(stderr, "bench-gpu: attn_engine_open: %s\n", st.message);
    return -1;
  }
  b->body = attn_engine_host_alloc(b->e, BODY_HEADER + 3 * b->tb);
  b->reply = attn_engine_host_alloc(b->e, b->tb);
  if (!b->body || !b->reply) {
    fprintf(stderr, "bench-gpu: the engine lent no pinned memory\n");
    return -1;
  }
  memcpy(b->body + BODY_HEADER, b->pageable, 3 * b->tb); /* a received body */
  job_on(&b->req, b->pageable, b->pageable + 3 * b->tb, b->tb);
  job_on(&b->req_lent, b->body + BODY_HEADER, b->reply, b->tb);
  return 0;
}

static int staging_setup(sbufs *b, cudaStream_t st) {
  b->tb = (size_t)SB * SH * SN * SD * 2;
  b->st = st;
  b->pageable = malloc(4 * b->tb);
  if (!b->pageable) {
    fprintf(stderr, "bench-gpu: out of memory for %zu MiB of inputs\n", (4 * b->tb) >> 20);
    return -1;
  }
  size_t pos = 7919;
  fill_host((uint16_t *)b->pageable, (size_t)3 * SB * SH * SN, SD, SD, ATTN_BF16, &pos);
  memset(b->pageable + 3 * b->tb, 0xff, b->tb); /* O: poisoned, and its pages touched */
  if (CK(cudaHostAlloc((void **)&b->staging, 4 * b->tb, cudaHostAllocPortable)) ||
      CK(cudaMalloc((void **)&b->dev, 4 * b->tb)) || CK(cudaEventCreate(&b->ev[0])) ||
      CK(cudaEventCreate(&b->ev[1])))
    return -1;
  return staging_engine(b);
}

static void staging_free(sbufs *b) {
  if (b->e) {
    attn_engine_host_free(b->e, b->body);
    attn_engine_host_free(b->e, b->reply);
    attn_engine_close(b->e);
  }
  for (int i = 0; i < 2; i++)
    if (b->ev[i])
      CK(cudaEventDestroy(b->ev[i]));
  if (b->dev)
    CK(cudaFree(b->dev));
  if (b->staging)
    CK(cudaFreeHost(b->staging));
  free(b->pageable);
}

/* The table, the verdict line and (with --csv) the rows; "staging" begins
 * every line, so check.sh can pick them out of its log. */
static int staging_report(double tb) {
  const double job = srows[R_JOB].best, mib = tb / (1 << 20);
  /* %job: of the job from lent memory, the path the server takes */
  FILE *csv = o.csv ? fopen(o.csv, "w") : NULL;
  if (o.csv && !csv) {
    perror(o.csv);
    return -1;
  }
  if (csv)
    fprintf(csv, "step,mib,reps,best_ms,median_ms,gbps,clock,pct_of_job\n");
  printf("staging: Q, K, V [%d, %d, %d, %d] BF16, %.0f MiB each, O downloaded; best of %d\n", SB,
         SH, SN, SD, mib, o.min_reps);
  printf("staging  %-40s %6s %9s %9s %7s %-6s %5s\n", "step", "MiB", "best_ms", "median_ms", "GB/s",
         "clock", "%job");
  for (int i = 0; i < R_N; i++) {
    const srow *r = &srows[i];
    double gbps = r->tensors ? r->tensors * tb / (r->best * 1e-3) / 1e9 : 0;
    char m[16] = "-", g[16] = "-";
    if (r->tensors)
      snprintf(m, sizeof m, "%.0f", r->tensors * mib), snprintf(g, sizeof g, "%.1f", gbps);
    double of = 100 * r->best / srows[R_JOB_LENT].best;
    printf("staging  %-40s %6s %9.3f %9.3f %7s %-6s %5.1f\n", r->name, m, r->best, r->med, g,
           r->clock, of);
    if (csv)
      fprintf(csv, "%s,%.1f,%d,%.4f,%.4f,%.2f,%s,%.2f\n", r->name, r->tensors * mib, r->reps,
              r->best, r->med, gbps, r->clock, of);
  }
  if (csv)
    fclose(csv);
  const double lent = srows[R_JOB_LENT].best;
  const double steps = srows[R_UP_PINNED].best + srows[R_KERNEL].best + srows[R_DOWN].best;
  const double group = srows[R_G_UP].best + srows[R_G_KERNEL].best + srows[R_G_DOWN].best;
  printf("staging: the job from lent memory %.2f ms: %.2fx its kernel, %.2fx upload + kernel + "
         "download in series (%.2f ms), %.2fx one group's (%.2f ms); from ordinary memory %.2f "
         "ms\n",
         lent, lent / srows[R_KERNEL].best, lent / steps, steps, lent / group, group, job);
  return 0;
}

/* --staging: the rows above, one after another; 0 or 1 (a failure). */
static int staging_main(const struct cudaDeviceProp *prop, cudaStream_t st) {
  sbufs b;
  memset(&b, 0, sizeof b);
  int rc = staging_setup(&b, st);
  for (int i = 0; i < R_N && rc == 0; i++)
    rc = srows[i].fn ? best_of(&b, &srows[i])
                     : kernel_row(&srows[i], i == R_G_KERNEL ? SB / SGROUPS : SB, prop, st);
  double tb = (double)b.tb;
  staging_free(&b);
  if (rc == 0)
    rc = staging_report(tb);
  return rc ? 1 : 0;
}

/* --sessions: a decode step through the store against the kernel alone
 * (the packed decode kernel on device buffers, as the decode rows time it:
 * the paged one reads the same bytes through its tables). */
static int sessions_main(const struct cudaDeviceProp *prop, cudaStream_t st) {
  const bshape s = {"decode", 1, SES_HQ, SES_HKV, 1, SES_TOKENS, SES_D, ATTN_BF16, false};
  bresult k;
  double best = 0, med = 0, rows = 0;
  if (run_shape(&s, prop->multiProcessorCount, (size_t)prop->l2CacheSize, st, &k) != 0 ||
      bench_sessions(o.min_reps, &best, &med, &rows) != 0)
    return 1;
  printf("sessions: decode B1 Hq%d Hkv%d D%d BF16 at %d cached tokens, best of %d\n", SES_HQ,
         SES_HKV, SES_D, SES_TOKENS, o.min_reps);
  printf("sessions  %-44s %9s %9s\n", "step", "best_ms", "median_ms");
  printf("sessions  %-44s %9.4f %9.4f\n", "kernel alone (packed K/V on the device)", k.min_ms,
         k.med_ms);
  printf("sessions  %-44s %9.4f %9.4f\n", "decode step through the store (pages on GPU)", best,
         med);
  printf("sessions  %-44s %9s %9.4f\n", "its rows as 2*Hkv synchronous copies (before)", "-", rows);
  printf("sessions: the step is %.2fx the kernel alone (target <= 1.5x); with its rows copied "
         "the way before, it would be %.2fx\n",
         best / k.min_ms, (med + rows) / k.min_ms);
  return 0;
}

static void usage(FILE *f) {
  fprintf(f, "usage: bench-gpu [--quick | --hopper | --hopper-full | --staging | --sessions]\n"
             "                 [--csv FILE] [--min-ms MS] [--min-reps N]\n"
             "  --quick     N=4096, D=128 prefill and backward (both dtypes, causal and not)\n"
             "              and one decode\n"
             "  --hopper    the sm_90a instance beside mma.sync (BF16, B=4, H=16): N=4k..16k\n"
             "              at D=128, N=8k at D=64, 96, 192, 256; --hopper-full: N=1k..16k,\n"
             "              D=64..256\n"
             "  --staging   one job (B=4, H=16, N=4096, D=128, BF16) step by step (pack,\n"
             "              upload, kernel, download, one group's), and the whole job\n"
             "              through the engine from ordinary and from lent pinned memory;\n"
             "              best of --min-reps repetitions\n"
             "  --sessions  a session's decode step at 32768 cached tokens (B1, Hq 32, Hkv 8,\n"
             "              D 128, BF16; pages on the GPU) through the engine's store against\n"
             "              the kernel alone; best of --min-reps steps\n"
             "  --csv FILE  also write the results as CSV\n"
             "  --min-ms    time each shape at least this long (default 200)\n"
             "  --min-reps  and at least this many launches (default 20); with --staging,\n"
             "              the repetitions of each step\n");
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--hopper") == 0)
      o.hopper = 1;
    else if (strcmp(argv[i], "--hopper-full") == 0)
      o.hopper = 2;
    else if (strcmp(argv[i], "--quick") == 0)
      o.quick = true;
    else if (strcmp(argv[i], "--staging") == 0)
      o.staging = true;
    else if (strcmp(argv[i], "--sessions") == 0)
      o.sessions = true;
    else if (strcmp(argv[i], "--csv") == 0 && i + 1 < argc)
      o.csv = argv[++i];
    else if (strcmp(argv[i], "--min-ms") == 0 && i + 1 < argc)
      o.min_ms = atof(argv[++i]);
    else if (strcmp(argv[i], "--min-reps") == 0 && i + 1 < argc)
      o.min_reps = atoi(argv[++i]);
    else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      usage(stdout);
      return 0;
    } else {
      usage(stderr);
      return 2;
    }
  }
  if (o.min_reps < 1)
    o.min_reps = 1;
  if (o.min_reps > o.max_reps)
    o.max_reps = o.min_reps;
  int ndev = 0;
  cudaError_t e = cudaGetDeviceCount(&ndev);
  if (e != cudaSuccess || ndev == 0) {
    printf("bench-gpu: skipped: no CUDA device (%s)\n",
           e != cudaSuccess ? cudaGetErrorString(e) : "the runtime found none");
    return 0;
  }
  struct cudaDeviceProp prop;
  int drv = 0, rt = 0;
  if (CK(cudaSetDevice(0)) || CK(cudaGetDeviceProperties(&prop, 0)) ||
      CK(cudaDriverGetVersion(&drv)) || CK(cudaRuntimeGetVersion(&rt)) || CK(attn_cu_prepare()))
    return 1;
  printf("bench-gpu: %s, %d SMs, L2 %d MiB, sm_%d%d, driver %d.%d, runtime %d.%d%s\n", prop.name,
         prop.multiProcessorCount, prop.l2CacheSize >> 20, prop.major, prop.minor, drv / 1000,
         drv % 1000 / 10, rt / 1000, rt % 1000 / 10,
         o.staging    ? ", --staging"
         : o.sessions ? ", --sessions"
         : o.quick    ? ", --quick"
                      : "");
  cudaStream_t st;
  if (make_pools() || CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking)))
    return 1;
  if (o.staging)
    return staging_main(&prop, st);
  if (o.sessions)
    return sessions_main(&prop, st);
  FILE *csv = NULL;
  if (o.csv) {
    csv = fopen(o.csv, "w");
    if (!csv) {
      perror(o.csv);
      return 1;
    }
    fprintf(csv, "kind,b,hq,hkv,nq,nkv,d,dtype,causal,kernel,nsplit,sets,reps,median_ms,min_ms,"
                 "tflops,gbps,status\n");
  }
  printf("%-10s %2s %3s %3s %5s %6s %4s %-5s %6s %-12s %6s %4s %5s %10s %9s %8s %6s\n", "kind", "B",
         "Hq", "Hkv", "Nq", "Nkv", "D", "dtype", "causal", "kernel", "nsplit", "sets", "reps",
         "median_ms", "TFLOP/s", "GB/s", "status");
  bshape sh[112]; /* shapes() lists 65, hopper_shapes() up to 100 */
  int n = o.hopper ? hopper_shapes(sh, o.hopper == 2) : shapes(sh, o.quick), fails = 0;
  for (int i = 0; i < n; i++) {
    const bshape *s = &sh[i];
    bresult r;
    int rc = run_shape(s, prop.multiProcessorCount, (size_t)prop.l2CacheSize, st, &r);
    double flops = 4.0 * s->b * s->hq * (double)s->nq * s->nkv * s->d * (s->causal ? 0.5 : 1.0) *
                   (strncmp(s->kind, "b", 1) == 0 ? 2.5 : 1.0); /* backward, bwd_atomic */
    double kvbytes = 2.0 * s->b * s->hkv * (double)s->nkv * s->d * (double)attn_dtype_size(s->dt);
    double tflops = rc == 0 ? flops / (r.med_ms * 1e-3) / 1e12 : 0;
    double gbps = rc == 0 ? kvbytes / (r.med_ms * 1e-3) / 1e9 : 0;
    bool dec = strncmp(s->kind, "decode", 6) == 0;
    printf("%-10s %2d %3d %3d %5d %6d %4d %-5s %6d %-12s %6d %4d %5d %10.4f %9.1f %8.0f %6s",
           s->kind, s->b, s->hq, s->hkv, s->nq, s->nkv, s->d, attn_dtype_name(s->dt), s->causal,
           attn_cu_kernel_name(r.ch.kernel), r.ch.nsplit, r.sets, r.reps, r.med_ms, tflops,
           dec ? gbps : 0.0, r.status);
    if (dec && rc == 0)
      printf("  (%.1f us)", r.med_ms * 1e3);
    printf("\n");
    fflush(stdout);
    if (csv)
      fprintf(csv, "%s,%d,%d,%d,%d,%d,%d,%s,%d,%s,%d,%d,%d,%.6f,%.6f,%.3f,%.1f,%s\n", s->kind, s->b,
              s->hq, s->hkv, s->nq, s->nkv, s->d, attn_dtype_name(s->dt), s->causal,
              attn_cu_kernel_name(r.ch.kernel), r.ch.nsplit, r.sets, r.reps, r.med_ms, r.min_ms,
              tflops, dec ? gbps : 0.0, r.status);
    if (rc != 0) {
      fails++;
      /* a fault in a kernel leaves the context unusable: stop there */
      if (cudaDeviceSynchronize() != cudaSuccess) {
        fprintf(stderr, "bench-gpu: the CUDA context is broken; stopping\n");
        break;
      }
    }
  }
  if (csv)
    fclose(csv);
  CK(cudaStreamDestroy(st));
  CK(cudaFreeHost(stage));
  free(pool[ATTN_F16]);
  free(pool[ATTN_BF16]);
  printf("bench-gpu: %d of %d shapes %s\n", n - fails, n, fails ? "ran (see errors above)" : "ran");
  return fails ? 1 : 0;
}
#endif /* ATTN_HAVE_CUDA */
