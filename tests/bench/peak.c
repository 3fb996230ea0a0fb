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
 * object, path -> {"gflops": G} or {"skipped": "why"}.
 */
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

int main(int argc, char **argv) {
  int threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
  double seconds = 0.5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--threads") == 0)
      threads = atoi(argv[i + 1]);
    else if (strcmp(argv[i], "--seconds") == 0)
      seconds = atof(argv[i + 1]);
  }
  if (threads < 1 || threads > MAX_THREADS || !(seconds > 0)) {
    fprintf(stderr, "usage: bench-peak [--threads 1..%d] [--seconds S]\n", MAX_THREADS);
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
  printf("}\n");
  return 0;
}
