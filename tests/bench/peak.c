/*
 * peak.c — the machine's matmul peak per instruction path, for
 * `make bench-peers` (tests/bench/peers.py), so that each row of its table
 * can say what fraction of the hardware the kernel in use reaches.
 *
 *   bench-peak [--threads T] [--seconds S]
 *
 * Each path runs on T threads at once (the thread count the benchmark gives
 * attnd and torch), every thread looping over one instruction on independent
 * accumulators held in registers (more chains than latency × issue width, so
 * the loop is bound by throughput, not by a dependency), for about S seconds.
 * GFLOP/s counts a multiply and an add as two FLOPs:
 *
 *   fma512     VFMADD231PS zmm (AVX-512F)      16 lanes × 2    =    32 / instr
 *   fma256     VFMADD231PS ymm (AVX2 + FMA)      8 lanes × 2    =    16 / instr
 *   vdpbf16ps  VDPBF16PS zmm (AVX512-BF16)     16 lanes × 2 × 2 =    64 / instr
 *   amx_bf16   TDPBF16PS (AMX-BF16)            16 × 16 × 32 × 2 = 16384 / instr
 *
 * A path the CPU (or, for AMX, the kernel: arch_prctl ARCH_REQ_XCOMP_PERM)
 * does not offer is reported as skipped with the reason. Output: one JSON
 * object, path -> {"gflops": G} or {"skipped": "why"}. T defaults to the
 * engine's own thread count (attn_pool_cores()).
 *
 * With --bandwidth (make bench-peak passes it; bench-peers does not: its
 * table reads the matmul paths only) memory rows follow, timed by the wall
 * clock, since memory bandwidth is shared between the threads:
 *
 *   stream_read        GB/s of T threads summing a 1 GiB buffer (far larger
 *                      than the caches) with vector loads, the best of 5;
 *   paged_decode_DT    GB/s of K and V the engine reads for one paged decode
 *                      step through attn_engine_run (Hq 32, Hkv 8, D 128,
 *                      32K keys, 1 query, pages of 256 tokens scattered in a
 *                      shuffled order) on T threads, the best of 10, and
 *                      of_stream, its ratio to stream_read: the fraction of
 *                      the machine's read bandwidth a session's decode
 *                      step reaches;
 *   paged_decode_BF16_Q  the same step over quantized pages (Q F8_E4M3 or
 *                      I8: a byte an element and a scale a row, computed
 *                      as BF16), its GB/s of codes and scales, its steps
 *                      per second and vs_bf16, their ratio to the BF16
 *                      pages' steps per second measured in turns with them
 *                      (bf16_steps_per_s; quantized sessions aim at 1.7 or
 *                      more: half the bytes of BF16 read at near the same
 *                      rate);
 *   paged_decode_BF16_pages64  the BF16 step over pages of 64 tokens (16
 *                      KiB: attnd --session-page-bytes 16K) and over 256
 *                      (the default 64 KiB), measured in turns, and
 *                      vs_pages256, the ratio of their steps per second:
 *                      what small pages cost a decode step.
 */
#include "engine.h"
#include "pool.h"

#include <immintrin.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define MAX_THREADS 256
/* Instructions between clock reads: long enough that the clock costs
 * nothing, short enough that the threads stop close to S seconds. */
#define CHUNK 200000

/* The calling thread's CPU time, not the wall clock: on a machine shared
 * with other work the scheduler takes cores away for whole time slices, and
 * the peak is what a core does while it runs (the engine and torch are
 * timed by the wall clock; the table's fraction of peak is then a lower
 * bound on a loaded machine). */
static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* One path: a loop of `chunk` rounds that returns a value depending on every
 * accumulator (so the compiler keeps them all), and the FLOPs per round. */
typedef struct path {
  const char *name;
  float (*loop)(long rounds);
  double flops_per_round;
  const char *(*unavailable)(void); /* NULL when the path can run */
} path;

/* ---- F32 FMA ------------------------------------------------------------ */

/* 16 chains: 2 FMA pipes × latency 4 need 8; 16 also covers cores with a
 * longer latency, and fits AVX-512's 32 registers with room for the inputs. */
__attribute__((target("avx512f"))) static float loop_fma512(long rounds) {
  __m512 acc[16], a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(1e-3f);
#pragma GCC unroll 16
  for (int i = 0; i < 16; i++)
    acc[i] = _mm512_set1_ps((float)i);
  for (long r = 0; r < rounds; r++) {
#pragma GCC unroll 16 /* unrolled, the array lives in registers, not memory */
    for (int i = 0; i < 16; i++)
      acc[i] = _mm512_fmadd_ps(acc[i], a, b);
    __asm__ volatile("" : "+v"(a)); /* a is not loop-invariant to the compiler */
  }
  __m512 s = acc[0];
#pragma GCC unroll 16
  for (int i = 1; i < 16; i++)
    s = _mm512_add_ps(s, acc[i]);
  return _mm512_reduce_add_ps(s);
}

/* 12 chains: AVX2 has 16 registers and the inputs take two. */
__attribute__((target("avx2,fma"))) static float loop_fma256(long rounds) {
  __m256 acc[12], a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(1e-3f);
#pragma GCC unroll 12
  for (int i = 0; i < 12; i++)
    acc[i] = _mm256_set1_ps((float)i);
  for (long r = 0; r < rounds; r++) {
#pragma GCC unroll 16 /* unrolled, the array lives in registers, not memory */
    for (int i = 0; i < 12; i++)
      acc[i] = _mm256_fmadd_ps(acc[i], a, b);
    __asm__ volatile("" : "+x"(a));
  }
  __m256 s = acc[0];
#pragma GCC unroll 12
  for (int i = 1; i < 12; i++)
    s = _mm256_add_ps(s, acc[i]);
  float out[8];
  _mm256_storeu_ps(out, s);
  return out[0] + out[7];
}

/* ---- AVX512-BF16 --------------------------------------------------------- */

__attribute__((target("avx512f,avx512bf16"))) static float loop_vdpbf16ps(long rounds) {
  __m512 acc[16];
  /* 0x3a83 is bf16 1.0e-3: products stay far from overflow for any run. */
  __m512bh a = (__m512bh)_mm512_set1_epi16(0x3a83), b = a;
#pragma GCC unroll 16
  for (int i = 0; i < 16; i++)
    acc[i] = _mm512_set1_ps((float)i);
  for (long r = 0; r < rounds; r++) {
#pragma GCC unroll 16 /* unrolled, the array lives in registers, not memory */
    for (int i = 0; i < 16; i++)
      acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
    __asm__ volatile("" : "+v"(a));
  }
  __m512 s = acc[0];
#pragma GCC unroll 16
  for (int i = 1; i < 16; i++)
    s = _mm512_add_ps(s, acc[i]);
  return _mm512_reduce_add_ps(s);
}

/* ---- AMX-BF16 ------------------------------------------------------------ */

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

/* Palette 1: tiles 0-3 the FP32 accumulators, 4-5 the A rows, 6-7 the B
 * rows, each 16 rows of 64 bytes (the largest tile). */
typedef struct __attribute__((aligned(64))) tilecfg {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} tilecfg;

/* Four independent TDPBF16PS per round (2 A × 2 B tiles into 4 C tiles),
 * the usual register blocking of an AMX GEMM; written in assembly so that it
 * builds with any compiler that can assemble AMX, without -mamx flags. */
static float loop_amx(long rounds) {
  static __thread uint16_t src[16 * 32] __attribute__((aligned(64)));
  static __thread float dst[16 * 16] __attribute__((aligned(64)));
  tilecfg cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.palette = 1;
  for (int t = 0; t < 8; t++) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  for (int i = 0; i < 16 * 32; i++)
    src[i] = 0x3a83;
  __asm__ volatile("ldtilecfg %0" ::"m"(cfg));
  __asm__ volatile("tilezero %%tmm0\n\ttilezero %%tmm1\n\ttilezero %%tmm2\n\t"
                   "tilezero %%tmm3\n\t"
                   "tileloadd (%0,%1,1), %%tmm4\n\ttileloadd (%0,%1,1), %%tmm5\n\t"
                   "tileloadd (%0,%1,1), %%tmm6\n\ttileloadd (%0,%1,1), %%tmm7" ::"r"(src),
                   "r"((long)64)
                   : "memory");
  for (long r = 0; r < rounds; r++)
    __asm__ volatile("tdpbf16ps %%tmm6, %%tmm4, %%tmm0\n\t"
                     "tdpbf16ps %%tmm7, %%tmm4, %%tmm1\n\t"
                     "tdpbf16ps %%tmm6, %%tmm5, %%tmm2\n\t"
                     "tdpbf16ps %%tmm7, %%tmm5, %%tmm3" ::
                         : "memory");
  __asm__ volatile("tilestored %%tmm0, (%0,%1,1)\n\ttilerelease" ::"r"(dst), "r"((long)64)
                   : "memory");
  return dst[0];
}

/* ---- availability -------------------------------------------------------- */

static const char *no_avx512(void) {
  return __builtin_cpu_supports("avx512f") ? NULL : "the CPU has no AVX-512F";
}

static const char *no_avx2(void) {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")
             ? NULL
             : "the CPU has no AVX2/FMA";
}

static const char *no_avx512bf16(void) {
  return __builtin_cpu_supports("avx512bf16") ? NULL : "the CPU has no AVX512-BF16";
}

/* CPUID.(EAX=7,ECX=0):EDX bit 22 is AMX-BF16, bit 24 AMX-TILE; then Linux
 * must grant the tile data state to this process (5.16 and later). */
static const char *no_amx(void) {
  unsigned a, b, c, d;
  __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
  if (!(d & (1u << 22)) || !(d & (1u << 24)))
    return "the CPU has no AMX-BF16";
  if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0)
    return "the kernel refused AMX tile data (arch_prctl ARCH_REQ_XCOMP_PERM)";
  return NULL;
}

static const path paths[] = {
    {"fma512", loop_fma512, 16 * 32, no_avx512},
    {"fma256", loop_fma256, 12 * 16, no_avx2},
    {"vdpbf16ps", loop_vdpbf16ps, 16 * 64, no_avx512bf16},
    {"amx_bf16", loop_amx, 4 * 16384, no_amx},
};

/* ---- running on T threads ------------------------------------------------- */

typedef struct worker {
  const path *p;
  double seconds;
  pthread_barrier_t *start;
  long rounds;    /* out */
  double elapsed; /* out */
  float sink;     /* out */
} worker;

static void *work(void *arg) {
  worker *w = arg;
  pthread_barrier_wait(w->start);
  double t0 = now(), t;
  long rounds = 0;
  float sink = 0;
  do {
    sink += w->p->loop(CHUNK);
    rounds += CHUNK;
  } while ((t = now()) - t0 < w->seconds);
  w->rounds = rounds;
  w->elapsed = t - t0;
  w->sink = sink;
  return NULL;
}

/* GFLOP/s of T threads on path p: every thread's FLOPs over its own time,
 * summed (they start together and run the same time). */
static double measure(const path *p, int threads, double seconds) {
  pthread_t tid[MAX_THREADS];
  worker w[MAX_THREADS];
  pthread_barrier_t start;
  pthread_barrier_init(&start, NULL, (unsigned)threads);
  for (int i = 0; i < threads; i++) {
    w[i] = (worker){.p = p, .seconds = seconds, .start = &start};
    pthread_create(&tid[i], NULL, work, &w[i]);
  }
  double gflops = 0, sink = 0;
  for (int i = 0; i < threads; i++) {
    pthread_join(tid[i], NULL);
    gflops += (double)w[i].rounds * p->flops_per_round / w[i].elapsed * 1e-9;
    sink += w[i].sink;
  }
  pthread_barrier_destroy(&start);
  if (sink == 12345.678) /* keeps the sums observable; never true in practice */
    fprintf(stderr, "#");
  return gflops;
}

/* ---- memory bandwidth (--bandwidth) --------------------------------------- */

#define STREAM_BYTES ((size_t)1 << 30)

static double wall(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct slice {
  const char *p;
  size_t n;
  pthread_barrier_t *start;
  float sum; /* out: keeps the loads observable */
} slice;

/* Four independent sums of 64-byte loads: bound by memory, not by the adds. */
__attribute__((target("avx512f"))) static float sum512(const char *p, size_t n) {
  __m512 s[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                 _mm512_setzero_ps()};
  for (size_t i = 0; i + 256 <= n; i += 256)
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++)
      s[k] = _mm512_add_ps(s[k], _mm512_load_ps((const float *)(const void *)(p + i + 64 * k)));
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s[0], s[1]), _mm512_add_ps(s[2], s[3])));
}

__attribute__((target("avx2"))) static float sum256(const char *p, size_t n) {
  __m256 s[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                 _mm256_setzero_ps()};
  for (size_t i = 0; i + 128 <= n; i += 128)
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++)
      s[k] = _mm256_add_ps(s[k], _mm256_load_ps((const float *)(const void *)(p + i + 32 * k)));
  float out[8];
  _mm256_storeu_ps(out, _mm256_add_ps(_mm256_add_ps(s[0], s[1]), _mm256_add_ps(s[2], s[3])));
  return out[0] + out[7];
}

static void *sum_slice(void *arg) {
  slice *sl = arg;
  pthread_barrier_wait(sl->start);
  sl->sum = __builtin_cpu_supports("avx512f") ? sum512(sl->p, sl->n) : sum256(sl->p, sl->n);
  return NULL;
}

/* GB/s of `threads` threads each summing its slice of buf, the best of 5. */
static double stream_read(const char *buf, int threads) {
  double best = 0;
  for (int rep = 0; rep < 5; rep++) {
    pthread_t tid[MAX_THREADS];
    slice sl[MAX_THREADS];
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, (unsigned)threads + 1);
    const size_t per = STREAM_BYTES / (size_t)threads / 256 * 256;
    for (int i = 0; i < threads; i++) {
      sl[i] = (slice){.p = buf + per * (size_t)i, .n = per, .start = &start};
      pthread_create(&tid[i], NULL, sum_slice, &sl[i]);
    }
    pthread_barrier_wait(&start);
    double t0 = wall(), sink = 0;
    for (int i = 0; i < threads; i++) {
      pthread_join(tid[i], NULL);
      sink += sl[i].sum;
    }
    double gbps = (double)(per * (size_t)threads) / (wall() - t0) * 1e-9;
    best = gbps > best ? gbps : best;
    pthread_barrier_destroy(&start);
    if (sink == 12345.678)
      fprintf(stderr, "#");
  }
  return best;
}

/* One paged decode step's inputs: pages of K and V in one shuffled pool. */
typedef struct decode {
  attn_request r;
  char *pool;
  const void **kp, **vp;
  void *q, *o;
  size_t kv_bytes;
} decode;

/* DEC_PAGE: a default session page's tokens of BF16 D 128 (64 KiB); DEC_SMALL_PAGE: a 16 KiB
 * page's (attnd --session-page-bytes 16K) */
enum {
  DEC_HQ = 32,
  DEC_HKV = 8,
  DEC_D = 128,
  DEC_KEYS = 32768,
  DEC_PAGE = 256,
  DEC_SMALL_PAGE = 64
};

/* Element i of a page of kind q (NONE: of dtype dt), a small finite value:
 * codes of values -6/8 .. 6/8 (E4M3: exact), their scales 1. */
static void page_fill(char *page, size_t bytes, attn_dtype dt, attn_kv_quant q, int64_t pt) {
  const size_t at = attn_kv_quant_scales_at(pt, DEC_D);
  for (size_t i = 0; !q && i < bytes / attn_dtype_size(dt); i++)
    attn_store_elem(page, dt, i, (float)((int)(i % 13) - 6) / 8.0f);
  for (size_t i = 0; q && i < at; i++) {
    const float x = (float)((int)(i % 13) - 6) / 8.0f;
    page[i] = (char)(q == ATTN_KVQ_I8 ? attn_f32_to_i8(x * 8) : attn_f32_to_e4m3(x));
  }
  for (size_t i = 0; q && i < (size_t)pt; i++)
    ((float *)(page + at))[i] = q == ATTN_KVQ_I8 ? 0.125f : 1.0f;
}

static int decode_init(decode *dc, attn_dtype dt, attn_kv_quant q, int64_t pt) {
  memset(dc, 0, sizeof *dc);
  const size_t es = attn_dtype_size(dt);
  const size_t page =
      q ? attn_kv_quant_scales_at(pt, DEC_D) + 4 * (size_t)pt : (size_t)pt * DEC_D * es;
  const int64_t pph = DEC_KEYS / pt, n = DEC_HKV * pph;
  dc->kv_bytes = 2 * (size_t)n * page;
  dc->pool = aligned_alloc(4096, dc->kv_bytes);
  dc->kp = calloc((size_t)n, sizeof *dc->kp);
  dc->vp = calloc((size_t)n, sizeof *dc->vp);
  dc->q = calloc(DEC_HQ * DEC_D, es);
  dc->o = calloc(DEC_HQ * DEC_D, es);
  if (!dc->pool || !dc->kp || !dc->vp || !dc->q || !dc->o)
    return -1;
  for (int64_t i = 0; i < 2 * n; i++) /* small finite values */
    page_fill(dc->pool + (size_t)i * page, page, dt, q, pt);
  for (size_t i = 0; i < DEC_HQ * DEC_D; i++)
    attn_store_elem(dc->q, dt, i, (float)((int)(i % 7) - 3) / 4.0f);
  int64_t *order = malloc((size_t)(2 * n) * sizeof *order);
  if (!order)
    return -1;
  for (int64_t i = 0; i < 2 * n; i++)
    order[i] = i;
  uint64_t x = 88172645463325252ull; /* xorshift: a fixed shuffle of the pages */
  for (int64_t i = 2 * n - 1; i > 0; i--) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    int64_t j = (int64_t)(x % (uint64_t)(i + 1)), t = order[i];
    order[i] = order[j], order[j] = t;
  }
  for (int64_t i = 0; i < n; i++) {
    dc->kp[i] = dc->pool + page * (size_t)order[2 * i];
    dc->vp[i] = dc->pool + page * (size_t)order[2 * i + 1];
  }
  free(order);
  attn_request *r = &dc->r;
  attn_request_init(r);
  r->batch = 1, r->heads_q = DEC_HQ, r->heads_kv = DEC_HKV, r->seq_q = 1, r->seq_kv = DEC_KEYS;
  r->head_dim = DEC_D, r->dtype = dt, r->causal = true, r->backend = "cpu";
  r->q = dc->q, r->o = dc->o, r->k_pages = dc->kp, r->v_pages = dc->vp;
  r->page_tokens = pt, r->pages_per_head = pph;
  r->kv_absmax[0] = r->kv_absmax[1] = 0.75f;
  r->kv_quant = q;
  return 0;
}

static void decode_free(decode *dc) {
  free(dc->pool);
  free(dc->kp);
  free(dc->vp);
  free(dc->q);
  free(dc->o);
}

/* GB/s of K and V read by one paged decode step, the best of 10, and its
 * steps per second into *steps; -1 on error. */
static double paged_decode(attn_engine *e, attn_dtype dt, attn_kv_quant q, int64_t pt,
                           double *steps, attn_status *st) {
  decode dc;
  double best = -1;
  if (decode_init(&dc, dt, q, pt) < 0) {
    attn_status_set(st, ATTN_ENOMEM, "out of memory");
  } else {
    for (int rep = 0; rep < 10; rep++) {
      double t0 = wall();
      if (attn_engine_run(e, &dc.r, NULL, st) < 0) {
        best = -1;
        break;
      }
      double dt_s = wall() - t0, gbps = (double)dc.kv_bytes / dt_s * 1e-9;
      if (gbps > best)
        best = gbps, *steps = 1 / dt_s;
    }
  }
  decode_free(&dc);
  return best;
}

/* The BF16 step over pages of kind q and page_tokens pt (index 1 below)
 * against the BF16 step over 256-token pages (index 0), measured in turns (3 of each, the
 * best of 10 steps each) so that what else the machine runs meanwhile
 * weighs on both alike: each one's best steps per second into best[], and
 * the GB/s of its best into g[]; -1 on error. */
static int in_turns(attn_engine *e, attn_kv_quant q, int64_t pt, double best[2], double g[2],
                    attn_status *st) {
  best[0] = best[1] = g[0] = g[1] = 0;
  for (int turn = 0; turn < 6; turn++) {
    const int i = turn % 2;
    double steps = 0,
           x = paged_decode(e, ATTN_BF16, i ? q : ATTN_KVQ_NONE, i ? pt : DEC_PAGE, &steps, st);
    if (x < 0)
      return -1;
    if (steps > best[i])
      best[i] = steps, g[i] = x;
  }
  return 0;
}

/* The quantized rows: BF16 computed over F8_E4M3 and I8 pages, against
 * the BF16 pages' steps per second measured in the same turns. */
static void print_quantized(attn_engine *e, double stream) {
  static const attn_kv_quant qs[] = {ATTN_KVQ_F8_E4M3, ATTN_KVQ_I8};
  attn_status st = {0};
  for (int i = 0; i < 2; i++) {
    double best[2], g[2];
    if (in_turns(e, qs[i], DEC_PAGE, best, g, &st) < 0)
      printf(", \"paged_decode_BF16_%s\": {\"skipped\": \"%s\"}", attn_kv_quant_name(qs[i]),
             st.message);
    else
      printf(", \"paged_decode_BF16_%s\": {\"gbps\": %.1f, \"of_stream\": %.2f, \"steps_per_s\": "
             "%.1f, \"bf16_steps_per_s\": %.1f, \"vs_bf16\": %.2f}",
             attn_kv_quant_name(qs[i]), g[1], g[1] / stream, best[1], best[0], best[1] / best[0]);
    fflush(stdout);
  }
}

/* The BF16 step over pages of 64 tokens (16 KiB) against 256 (64 KiB). */
static void print_small_pages(attn_engine *e) {
  attn_status st = {0};
  double best[2], g[2];
  if (in_turns(e, ATTN_KVQ_NONE, DEC_SMALL_PAGE, best, g, &st) < 0) {
    printf(", \"paged_decode_BF16_pages64\": {\"skipped\": \"%s\"}", st.message);
    return;
  }
  printf(", \"paged_decode_BF16_pages64\": {\"gbps\": %.1f, \"steps_per_s\": %.1f, "
         "\"pages256_steps_per_s\": %.1f, \"vs_pages256\": %.3f}",
         g[1], best[1], best[0], best[1] / best[0]);
  fflush(stdout);
}

static void print_bandwidth(int threads) {
  char *buf = aligned_alloc(4096, STREAM_BYTES);
  if (!buf) {
    printf(", \"stream_read\": {\"skipped\": \"no 1 GiB buffer\"}");
    return;
  }
  memset(buf, 1, STREAM_BYTES); /* faulted in, and small finite floats */
  const double stream = stream_read(buf, threads);
  free(buf);
  printf(", \"stream_read\": {\"gbps\": %.1f}", stream);
  fflush(stdout);
  attn_config cfg;
  attn_config_init(&cfg);
  cfg.threads = threads;
  attn_engine *e = NULL;
  attn_status st = {0};
  if (attn_engine_open(&cfg, &e, &st) < 0) {
    printf(", \"paged_decode\": {\"skipped\": \"%s\"}", st.message);
    return;
  }
  static const attn_dtype dts[] = {ATTN_BF16, ATTN_F16, ATTN_F32};
  double steps = 0;
  for (int i = 0; i < 3; i++) {
    double g = paged_decode(e, dts[i], ATTN_KVQ_NONE, DEC_PAGE, &steps, &st);
    if (g < 0)
      printf(", \"paged_decode_%s\": {\"skipped\": \"%s\"}", attn_dtype_name(dts[i]), st.message);
    else
      printf(", \"paged_decode_%s\": {\"gbps\": %.1f, \"of_stream\": %.2f, \"steps_per_s\": %.1f}",
             attn_dtype_name(dts[i]), g, g / stream, steps);
    fflush(stdout);
  }
  print_quantized(e, stream);
  print_small_pages(e);
  attn_engine_close(e);
}

int main(int argc, char **argv) {
  int threads = attn_pool_cores(); /* the engine's default thread count */
  double seconds = 0.5;
  bool bandwidth = false;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--bandwidth") == 0)
      bandwidth = true;
    else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc)
      threads = atoi(argv[++i]);
    else if (strcmp(argv[i], "--seconds") == 0 && i + 1 < argc)
      seconds = atof(argv[++i]);
  }
  if (threads < 1 || threads > MAX_THREADS || !(seconds > 0)) {
    fprintf(stderr, "usage: bench-peak [--threads 1..%d] [--seconds S] [--bandwidth]\n",
            MAX_THREADS);
    return 2;
  }
  __builtin_cpu_init();
  printf("{\"threads\": %d", threads);
  for (size_t i = 0; i < sizeof paths / sizeof *paths; i++) {
    const char *why = paths[i].unavailable();
    if (why) {
      printf(", \"%s\": {\"skipped\": \"%s\"}", paths[i].name, why);
      continue;
    }
    /* The best of three: other load on the machine only ever lowers it. */
    double best = 0;
    for (int k = 0; k < 3; k++) {
      double g = measure(&paths[i], threads, seconds / 3);
      best = g > best ? g : best;
    }
    printf(", \"%s\": {\"gflops\": %.1f}", paths[i].name, best);
    fflush(stdout);
  }
  if (bandwidth)
    print_bandwidth(threads);
  printf("}\n");
  return 0;
}
