/*
 * bench_gpu.c — TFLOP/s of the CUDA kernels themselves (attn_cu_launch on
 * device-resident tensors: no packing, no copies, no engine), on the shapes
 * tests/gpu/sdpa_bench.py times PyTorch's SDPA on:
 *
 *   prefill  B=4, H=16, N in 1024, 4096, 8192, D in 64, 128, F16 and BF16,
 *            causal and not; FLOPs 4*B*H*Nq*Nkv*D, halved for causal
 *   decode   B=1 and 4, Hq=32, Hkv=8, Nq=1, Nkv=32768, D=128 (BF16; F16 at
 *            B=1): time in microseconds and GB/s of K and V read
 *   backward B=4, H=16, N in 1024, 4096, D in 64, 128, F16 and BF16, causal
 *            and not: the three backward kernels (preprocess, dK/dV, dQ),
 *            given the forward's O and lse; FLOPs 2.5 times the forward's
 *            (FlashAttention's convention)
 *
 * Method (.library/device/METHOD.md): random inputs (uniform in [-1, 1),
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
 * 128, 256, --hopper N in 4k, 8k, 16k at D=128 and N=8k at D=64 and 256.
 *
 *   bench-gpu [--quick | --hopper | --hopper-full] [--csv FILE] [--min-ms MS]
 *             [--min-reps N]
 *
 * Without a device: "bench-gpu: skipped: no CUDA device (...)", exit 0.
 * Exit status 1 when a case failed (a CUDA error or a BAD output).
 */
#define _GNU_SOURCE
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
  const char *kind; /* "prefill", "decode" or "backward" */
  int b, hq, hkv, nq, nkv, d;
  attn_dtype dt;
  bool causal;
} bshape;

typedef struct bopts {
  bool quick;
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
  s[n++] = (bshape){"decode", 1, 32, 8, 1, 32768, 128, ATTN_BF16, false};
  if (!quick) {
    s[n++] = (bshape){"decode", 4, 32, 8, 1, 32768, 128, ATTN_BF16, false};
    s[n++] = (bshape){"decode", 1, 32, 8, 1, 32768, 128, ATTN_F16, false};
  }
  for (int t = 0; t < 2; t++)
    for (int j = 0; j < 2; j++)
      for (int i = 0; i < 2; i++)
        for (int c = 0; c < 2; c++) {
          if (quick && (ds[j] != 128 || ns[i + 1] != 4096))
            continue;
          s[n++] = (bshape){"backward", 4, 16, 16, ns[i], ns[i], ds[j], dts[t], c == 1};
        }
  return n;
}

/* The Hopper table: each shape as "prefill" and as "hopper". */
static int hopper_shapes(bshape *s, bool full) {
  static const int ns[] = {1024, 2048, 4096, 8192, 16384};
  static const int ds[] = {64, 128, 256};
  int n = 0;
  for (int j = 0; j < 3; j++)
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

/* rows x d random elements into dev as rows x dp, zero columns after d. */
static int fill(void *dev, size_t rows, int d, int dp, attn_dtype dt, size_t *pos) {
  size_t es = 2, row_bytes = (size_t)dp * es, per = STAGE_BYTES / row_bytes;
  for (size_t r0 = 0; r0 < rows; r0 += per) {
    size_t nr = rows - r0 < per ? rows - r0 : per;
    for (size_t r = 0; r < nr; r++) {
      uint16_t *dst = (uint16_t *)(stage + r * row_bytes);
      for (int i = 0; i < d; i++) {
        dst[i] = pool[dt][*pos];
        if (++*pos == POOL_N)
          *pos = 0;
      }
      for (int i = d; i < dp; i++)
        dst[i] = 0;
    }
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

static int run_shape(const bshape *s, int sms, size_t l2, cudaStream_t st, bresult *res) {
  memset(res, 0, sizeof *res);
  res->status = "ERROR";
  attn_cu_params p;
  memset(&p, 0, sizeof p);
  p.dtype = s->dt;
  p.batch = s->b;
  p.heads_q = s->hq;
  p.heads_kv = s->hkv;
  p.seq_q = s->nq;
  p.seq_kv = s->nkv;
  p.head_dim = s->d;
  p.dp = attn_cu_dp(s->d);
  p.scale_log2 = (float)(1.0 / sqrt((double)s->d) * M_LOG2E);
  p.scale = (float)(1.0 / sqrt((double)s->d));
  const bool bwd = strcmp(s->kind, "backward") == 0;
  p.pass = bwd ? ATTN_BACKWARD : ATTN_FORWARD;
  p.window_left = -1;
  p.window_right = s->causal ? 0 : -1;
  attn_status as = {0};
  if (attn_cu_select(&p, sms, &res->ch, &as) != 0) {
    fprintf(stderr, "bench-gpu: attn_cu_select: %s\n", as.message);
    return -1;
  }
  if (strcmp(s->kind, "hopper") == 0 && !attn_cu_select_hopper(&p, sms, &res->ch)) {
    fprintf(stderr, "bench-gpu: attn_cu_select_hopper refused the shape\n");
    return -1;
  }
  size_t es = attn_dtype_size(s->dt);
  size_t rq = (size_t)s->b * s->hq * s->nq, rkv = (size_t)s->b * s->hkv * s->nkv;
  size_t qb = rq * p.dp * es, kvb = rkv * p.dp * es;
  size_t set_bytes = (bwd ? 4 : 2) * qb + (bwd ? 4 : 2) * kvb;
  int nsets = 1;
  if (set_bytes < 3 * l2) {
    nsets = (int)((3 * l2 + set_bytes - 1) / set_bytes);
    nsets = nsets < 2 ? 2 : nsets > MAX_SETS ? MAX_SETS : nsets;
  }
  res->sets = nsets;
  bset sets[MAX_SETS];
  memset(sets, 0, sizeof sets);
  void *ws = NULL;
  size_t wsb = attn_cu_split_bytes(&p, &res->ch);
  cudaEvent_t ev[65];
  int nev = 0;
  double *times = malloc((size_t)o.max_reps * sizeof *times);
  int rc = -1;
  size_t pos = (size_t)s->nkv * 7919u % POOL_N;
  if (!times)
    goto out;
  for (int i = 0; i < nsets; i++) {
    bset *b = &sets[i];
    if (CK(cudaMalloc(&b->q, qb)) || CK(cudaMalloc(&b->k, kvb)) || CK(cudaMalloc(&b->v, kvb)) ||
        CK(cudaMalloc(&b->o, qb)) || fill(b->q, rq, s->d, p.dp, s->dt, &pos) ||
        fill(b->k, rkv, s->d, p.dp, s->dt, &pos) || fill(b->v, rkv, s->d, p.dp, s->dt, &pos) ||
        CK(cudaMemset(b->o, 0xff, qb)) || (bwd && fill_backward(b, &p, rq, qb, kvb, &pos, st)))
      goto out;
  }
  wsb += attn_cu_bwd_bytes(&p);
  if (wsb && CK(cudaMalloc(&ws, wsb)))
    goto out;
  for (; nev < 65; nev++)
    if (CK(cudaEventCreate(&ev[nev])))
      goto out;
  p.split_ws = bwd ? NULL : ws;
  p.bwd_ws = bwd ? (float *)ws : NULL;
  /* warm-up: until 30 ms of device time (clocks up, code loaded) */
  double warm = 0;
  for (int it = 0; it < 200 && warm < 30; it++) {
    bset *b = &sets[it % nsets];
    point(&p, b);
    float ms = 0;
    if (CK(cudaEventRecord(ev[0], st)) || CK(attn_cu_launch(&p, &res->ch, st)) ||
        CK(cudaEventRecord(ev[1], st)) || CK(cudaEventSynchronize(ev[1])) ||
        CK(cudaGetLastError()) || CK(cudaEventElapsedTime(&ms, ev[0], ev[1])))
      goto out;
    warm += ms;
  }
  long bad = nonfinite(bwd ? sets[0].dq : sets[0].o, rq, s->d, p.dp, s->dt);
  if (bad == 0 && bwd)
    bad = nonfinite(sets[0].dk, (size_t)s->b * s->hkv * s->nkv, s->d, p.dp, s->dt);
  if (bad != 0) {
    fprintf(stderr, "bench-gpu: %ld non-finite elements in %s (poisoned before the launches)\n",
            bad, bwd ? "dQ or dK" : "O");
    res->status = "BAD";
    goto out;
  }
  /* timed: an event between consecutive launches, 64 launches a round */
  double total = 0;
  int reps = 0;
  while (reps < o.max_reps && (reps < o.min_reps || total < o.min_ms) && total < o.max_ms) {
    int k = o.max_reps - reps < 64 ? o.max_reps - reps : 64;
    if (CK(cudaEventRecord(ev[0], st)))
      goto out;
    for (int i = 0; i < k; i++) {
      bset *b = &sets[(reps + i) % nsets];
      point(&p, b);
      if (CK(attn_cu_launch(&p, &res->ch, st)) || CK(cudaEventRecord(ev[i + 1], st)))
        goto out;
    }
    if (CK(cudaEventSynchronize(ev[k])) || CK(cudaGetLastError()))
      goto out;
    for (int i = 0; i < k; i++) {
      float ms = 0;
      if (CK(cudaEventElapsedTime(&ms, ev[i], ev[i + 1])))
        goto out;
      times[reps + i] = ms;
      total += ms;
    }
    reps += k;
  }
  qsort(times, (size_t)reps, sizeof *times, cmp_double);
  res->reps = reps;
  res->med_ms = reps % 2 ? times[reps / 2] : 0.5 * (times[reps / 2 - 1] + times[reps / 2]);
  res->min_ms = times[0];
  res->status = "ok";
  rc = 0;
out:
  for (int i = 0; i < nev; i++)
    CK(cudaEventDestroy(ev[i]));
  for (int i = 0; i < nsets; i++) {
    if (sets[i].q)
      CK(cudaFree(sets[i].q));
    if (sets[i].k)
      CK(cudaFree(sets[i].k));
    if (sets[i].v)
      CK(cudaFree(sets[i].v));
    if (sets[i].o)
      CK(cudaFree(sets[i].o));
    void *extra[5] = {sets[i].dout, sets[i].dq, sets[i].dk, sets[i].dv, sets[i].lse};
    for (int j = 0; j < 5; j++)
      if (extra[j])
        CK(cudaFree(extra[j]));
  }
  if (ws)
    CK(cudaFree(ws));
  free(times);
  return rc;
}

static void usage(FILE *f) {
  fprintf(f, "usage: bench-gpu [--quick | --hopper | --hopper-full] [--csv FILE] [--min-ms MS]\n"
             "                 [--min-reps N]\n"
             "  --quick     N=4096, D=128 prefill and backward (both dtypes, causal and not)\n"
             "              and one decode\n"
             "  --hopper    the sm_90a instance beside mma.sync (BF16, B=4, H=16): N=4k..16k\n"
             "              at D=128, N=8k at D=64 and 256; --hopper-full: N=1k..16k, D=64..256\n"
             "  --csv FILE  also write the results as CSV\n"
             "  --min-ms    time each shape at least this long (default 200)\n"
             "  --min-reps  and at least this many launches (default 20)\n");
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--hopper") == 0)
      o.hopper = 1;
    else if (strcmp(argv[i], "--hopper-full") == 0)
      o.hopper = 2;
    else if (strcmp(argv[i], "--quick") == 0)
      o.quick = true;
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
         drv % 1000 / 10, rt / 1000, rt % 1000 / 10, o.quick ? ", --quick" : "");
  cudaStream_t st;
  if (make_pools() || CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking)))
    return 1;
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
  printf("%-8s %2s %3s %3s %5s %6s %4s %-5s %6s %-12s %6s %4s %5s %10s %9s %8s %6s\n", "kind", "B",
         "Hq", "Hkv", "Nq", "Nkv", "D", "dtype", "causal", "kernel", "nsplit", "sets", "reps",
         "median_ms", "TFLOP/s", "GB/s", "status");
  bshape sh[64];
  int n = o.hopper ? hopper_shapes(sh, o.hopper == 2) : shapes(sh, o.quick), fails = 0;
  for (int i = 0; i < n; i++) {
    const bshape *s = &sh[i];
    bresult r;
    int rc = run_shape(s, prop.multiProcessorCount, (size_t)prop.l2CacheSize, st, &r);
    double flops = 4.0 * s->b * s->hq * (double)s->nq * s->nkv * s->d * (s->causal ? 0.5 : 1.0) *
                   (strcmp(s->kind, "backward") == 0 ? 2.5 : 1.0);
    double kvbytes = 2.0 * s->b * s->hkv * (double)s->nkv * s->d * (double)attn_dtype_size(s->dt);
    double tflops = rc == 0 ? flops / (r.med_ms * 1e-3) / 1e12 : 0;
    double gbps = rc == 0 ? kvbytes / (r.med_ms * 1e-3) / 1e9 : 0;
    bool dec = strcmp(s->kind, "decode") == 0;
    printf("%-8s %2d %3d %3d %5d %6d %4d %-5s %6d %-12s %6d %4d %5d %10.4f %9.1f %8.0f %6s",
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
