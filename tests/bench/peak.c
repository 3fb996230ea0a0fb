/*
 * peak.c — the machine's arithmetic peak per CPU kernel path, to state the
 * flash kernels' GFLOP/s as a fraction of it (make bench-peak).
 *
 * Each path runs a loop of independent accumulations (12 chains, enough to
 * cover the instruction latency) on every core at once and counts 2 flops
 * per multiply-add: F32 FMA (AVX-512: 16 per instruction), VDPBF16PS (32
 * BF16 products per instruction) and, where the CPU and Linux allow it,
 * AMX TDPBF16PS (16·16·32 products per instruction). Best of 5 runs: other
 * processes share the machine.
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

enum { ITERS = 20 * 1000 * 1000, AMX_ITERS = 2 * 1000 * 1000 };

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* 12 chains of acc = acc·x + y; returns flops. */
__attribute__((target("avx512f"))) static double fma_f32(float *sink) {
  __m512 a[12], x = _mm512_set1_ps(0.999f), y = _mm512_set1_ps(1e-3f);
  for (int i = 0; i < 12; i++)
    a[i] = _mm512_set1_ps((float)i);
  for (long n = 0; n < ITERS; n++)
    _Pragma("GCC unroll 12") for (int i = 0; i < 12; i++)
      a[i] = _mm512_fmadd_ps(a[i], x, y);
  for (int i = 1; i < 12; i++)
    a[0] = _mm512_add_ps(a[0], a[i]);
  *sink = _mm512_reduce_add_ps(a[0]);
  return 2.0 * 16 * 12 * ITERS;
}

__attribute__((target("avx512f,avx512bf16"))) static double dp_bf16(float *sink) {
  __m512 a[12];
  __m512i x = _mm512_set1_epi32(0x3f803f80), y = _mm512_set1_epi32(0x3a833a83);
  for (int i = 0; i < 12; i++)
    a[i] = _mm512_set1_ps((float)i);
  for (long n = 0; n < ITERS; n++)
    _Pragma("GCC unroll 12") for (int i = 0; i < 12; i++)
      a[i] = _mm512_dpbf16_ps(a[i], (__m512bh)x, (__m512bh)y);
  for (int i = 1; i < 12; i++)
    a[0] = _mm512_add_ps(a[0], a[i]);
  *sink = _mm512_reduce_add_ps(a[0]);
  return 2.0 * 32 * 12 * ITERS;
}

typedef struct amx_cfg {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} amx_cfg;

/* Four accumulators C0..C3 from A (tmm4, tmm5) and B (tmm6, tmm7). */
__attribute__((target("amx-tile,amx-bf16"))) static double amx_bf16(float *sink) {
  static uint16_t buf[16 * 32];
  static float out[16 * 16];
  amx_cfg cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.palette = 1;
  for (int t = 0; t < 8; t++) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  _tile_loadconfig(&cfg);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, buf, 64);
  _tile_loadd(5, buf, 64);
  _tile_loadd(6, buf, 64);
  _tile_loadd(7, buf, 64);
  for (long n = 0; n < AMX_ITERS; n++) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, out, 64);
  _tile_release();
  *sink = out[0];
  return 2.0 * 16 * 16 * 32 * 4 * AMX_ITERS;
}

typedef struct run {
  double (*fn)(float *);
  double flops;
  float sink;
} run;

static void *thread_main(void *p) {
  run *r = p;
  r->flops = r->fn(&r->sink);
  return NULL;
}

/* GFLOP/s of fn on `threads` threads at once, best of 5. */
static double measure(double (*fn)(float *), int threads) {
  double best = 0;
  for (int rep = 0; rep < 5; rep++) {
    pthread_t t[256];
    run r[256];
    double t0 = now(), flops = 0;
    for (int i = 0; i < threads; i++) {
      r[i].fn = fn;
      pthread_create(&t[i], NULL, thread_main, &r[i]);
    }
    for (int i = 0; i < threads; i++) {
      pthread_join(t[i], NULL);
      flops += r[i].flops;
    }
    double g = flops / (now() - t0) / 1e9;
    best = g > best ? g : best;
  }
  return best;
}

static void report(const char *name, double (*fn)(float *), int cores) {
  double one = measure(fn, 1), all = measure(fn, cores);
  printf("%-22s %10.1f %10.1f\n", name, one, all);
}

int main(void) {
  int cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
  cores = cores < 1 ? 1 : cores > 256 ? 256 : cores;
  __builtin_cpu_init();
  printf("%-22s %10s %10s   (GFLOP/s, best of 5; %d cores)\n", "path", "1 core", "all", cores);
  if (!__builtin_cpu_supports("avx512f")) {
    printf("skipped: this CPU has no AVX-512\n");
    return 0;
  }
  report("F32 FMA (AVX-512)", fma_f32, cores);
  if (__builtin_cpu_supports("avx512bf16"))
    report("BF16 VDPBF16PS", dp_bf16, cores);
  else
    printf("skipped: this CPU has no AVX512-BF16\n");
  unsigned a, b, c, d;
  __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
  if (!(d & (1u << 22)) || !(d & (1u << 24)))
    printf("skipped: this CPU has no AMX-BF16\n");
  else if (syscall(SYS_arch_prctl, 0x1023, 18) != 0)
    printf("skipped: Linux refused the AMX tile data permission\n");
  else
    report("BF16 AMX TDPBF16PS", amx_bf16, cores);
  return 0;
}
