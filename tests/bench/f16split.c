/*
 * f16split.c — F16 attention products two ways, for the issue "F16 inputs
 * must not lose precision by passing through BF16: split exactly into
 * hi + lo BF16, or keep the product in F32 — which is faster?".
 *
 *   bench-f16split [--reps R]
 *
 * Benchmark only: the engine is not changed. One block of BQ = 64 F16 query
 * rows against N = 4096 F16 keys, head_dim 128 and 64, one thread, in the
 * engine's transposed layout (flash.c, flash_bf16.h): Sᵀ[j][ii] and
 * Oᵀ[d][ii] with the 64 query lanes as 4 zmm vectors, key tiles of BK = 64,
 * micro-kernels of MR = 4 broadcast rows × NR = 4 query vectors.
 *
 *   f32      what the engine does: K and V tiles widened to F32 (vcvtph2ps)
 *            per tile, S = Q·Kᵀ and O += P·V on VFMADD231PS. Exact products.
 *   split3   every F16 x as hi = bf16(x), lo = bf16(x - hi) (exact: checked
 *            below over all finite F16), S = Qh·Khᵀ + Qh·Klᵀ + Ql·Khᵀ on
 *            VDPBF16PS; Ql·Klᵀ (|.| <= 2^-16 |q k|) is dropped. P (F32) is
 *            split the same way, which is not exact: 24 bits do not fit in
 *            two BF16 (16 bits).
 *   split4   the same with the fourth product, Ql·Klᵀ and Pl·Vl: every F16
 *            product is then exact, as in f32.
 *   bf16     for scale: hi only (the precision loss the issue forbids).
 * The splitting is timed with the products: Q once per call, K and V once
 * per key tile, P per tile. The softmax between S and P·V is the same work
 * for every variant and is left out: P is a fixed 64×64 tile of
 * probabilities, reused for each key tile (it is as hot in cache as the
 * engine's, which has just written it).
 *
 * GFLOP/s counts 4·D·64·N per call (two matmuls, multiply + add), from the
 * median of R calls. Errors are max |x - ref| / max |ref| over all of S
 * (64 × N) and of O (D × 64), against a float64 reference.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BQ 64 /* query rows per block, as ATTN_FLASH_BQ */
#define BK 64 /* keys per tile, as ATTN_FLASH_BK */
#define N 4096
#define MR 4
#define NR 4
#define VL 16
#define DMAX 128

/* Target attributes, not -m flags: the binary runs (and says skipped) on
 * any x86-64, as bench-peak does. */
#define TGT __attribute__((target("avx512f,avx512bw,avx512bf16,f16c")))
#define INL static inline __attribute__((always_inline)) TGT
#define UNROLL _Pragma("GCC unroll 16")

/* All inputs and scratch, 64-byte aligned so tiles start on cache lines. */
typedef struct bench {
  int D;
  uint16_t q16[BQ * DMAX], k16[N * DMAX], v16[N * DMAX]; /* F16, row-major */
  float pt[BK * BQ];                                     /* Pᵀ[j][ii], in [0, 1) */
  /* f32 */
  float qt[DMAX * BQ], kb[BK * DMAX], vb[BK * DMAX], st[BK * BQ], ot[DMAX * BQ];
  /* split: Q and P as BF16 pairs along the reduction (flash_bf16.h), K as
   * BF16 rows read in place, V as pairs of keys */
  uint32_t qhp[DMAX / 2 * BQ], qlp[DMAX / 2 * BQ];
  uint16_t kh[BK * DMAX], kl[BK * DMAX];
  uint32_t vhp[BK / 2 * DMAX], vlp[BK / 2 * DMAX];
  uint32_t php[BK / 2 * BQ], plp[BK / 2 * BQ];
} __attribute__((aligned(64))) bench;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- conversions --------------------------------------------------------- */

TGT static float h2f(uint16_t h) { return _cvtsh_ss(h); }
TGT static uint16_t f2h(float f) { return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }

/* 16 F32 to BF16 hi and lo, each zero-extended in a 32-bit lane: hi rounds
 * to nearest even, lo rounds the remainder x - hi (exact in F32). */
INL void split16(__m512 x, __m512i *hi, __m512i *lo) {
  __m512i h = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(x));
  __m512 r = _mm512_sub_ps(x, _mm512_castsi512_ps(_mm512_slli_epi32(h, 16)));
  *hi = h;
  *lo = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(r));
}

/* Two rows' BF16 (low halves of 32-bit lanes) interleaved: (a, b) pairs. */
INL __m512i pair(__m512i a, __m512i b) { return _mm512_or_si512(a, _mm512_slli_epi32(b, 16)); }

INL __m512 dp(__m512 acc, __m512i a, __m512i b) {
  return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
}

static uint32_t ld32(const uint16_t *p) {
  uint32_t x;
  memcpy(&x, p, sizeof x);
  return x;
}

/* Every finite F16 value x == hi + lo exactly (the premise of the split):
 * the number of values where it fails, 0 expected. */
TGT static int split_failures(void) {
  int bad = 0;
  for (uint32_t h = 0; h < 0x10000; h += 16) {
    uint16_t in[16];
    for (int i = 0; i < 16; i++)
      in[i] = (uint16_t)(h + (uint32_t)i);
    __m512 x = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)in));
    __m512i hi, lo;
    split16(x, &hi, &lo);
    float xs[16], hs[16], ls[16];
    _mm512_storeu_ps(xs, x);
    _mm512_storeu_ps(hs, _mm512_castsi512_ps(_mm512_slli_epi32(hi, 16)));
    _mm512_storeu_ps(ls, _mm512_castsi512_ps(_mm512_slli_epi32(lo, 16)));
    for (int i = 0; i < 16; i++)
      if (isfinite(xs[i]) && (double)hs[i] + (double)ls[i] != (double)xs[i])
        bad++;
  }
  return bad;
}

/* ---- f32: the engine's way ------------------------------------------------ */

/* Sᵀ rows j..j+MR, all four query vectors (flash.c's qk_micro). */
INL void f32_qk_micro(const float *restrict qt, const float *restrict kb, float *restrict st, int D,
                      int j) {
  __m512 acc[MR][NR];
  UNROLL for (int r = 0; r < MR; r++) UNROLL for (int c = 0; c < NR; c++) acc[r][c] =
      _mm512_setzero_ps();
  for (int d = 0; d < D; d++) {
    __m512 q[NR];
    UNROLL for (int c = 0; c < NR; c++) q[c] = _mm512_loadu_ps(qt + d * BQ + c * VL);
    UNROLL for (int r = 0; r < MR; r++) {
      __m512 k = _mm512_set1_ps(kb[(j + r) * D + d]);
      UNROLL for (int c = 0; c < NR; c++) acc[r][c] = _mm512_fmadd_ps(k, q[c], acc[r][c]);
    }
  }
  UNROLL for (int r = 0; r < MR; r++) UNROLL for (int c = 0; c < NR; c++)
      _mm512_storeu_ps(st + (j + r) * BQ + c * VL, acc[r][c]);
}

/* Oᵀ rows d0..d0+MR += Σ_j V[j][d]·Pᵀ[j][:] (flash.c's pv_micro). */
INL void f32_pv_micro(const float *restrict pt, const float *restrict vb, float *restrict ot, int D,
                      int d0) {
  __m512 acc[MR][NR];
  UNROLL for (int r = 0; r < MR; r++) UNROLL for (int c = 0; c < NR; c++) acc[r][c] =
      _mm512_loadu_ps(ot + (d0 + r) * BQ + c * VL);
  for (int j = 0; j < BK; j++) {
    __m512 p[NR];
    UNROLL for (int c = 0; c < NR; c++) p[c] = _mm512_loadu_ps(pt + j * BQ + c * VL);
    UNROLL for (int r = 0; r < MR; r++) {
      __m512 v = _mm512_set1_ps(vb[j * D + d0 + r]);
      UNROLL for (int c = 0; c < NR; c++) acc[r][c] = _mm512_fmadd_ps(v, p[c], acc[r][c]);
    }
  }
  UNROLL for (int r = 0; r < MR; r++) UNROLL for (int c = 0; c < NR; c++)
      _mm512_storeu_ps(ot + (d0 + r) * BQ + c * VL, acc[r][c]);
}

/* n F16 values widened to F32 (load_row's vcvtph2ps); n % 16 == 0. */
TGT static void widen(float *dst, const uint16_t *src, int n) {
  for (int i = 0; i < n; i += VL)
    _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i))));
}

TGT static void f32_call(bench *b, float *s_all) {
  const int D = b->D;
  for (int ii = 0; ii < BQ; ii++)
    for (int d = 0; d < D; d++)
      b->qt[d * BQ + ii] = h2f(b->q16[ii * D + d]);
  memset(b->ot, 0, sizeof b->ot);
  for (int j0 = 0; j0 < N; j0 += BK) {
    widen(b->kb, b->k16 + j0 * D, BK * D);
    widen(b->vb, b->v16 + j0 * D, BK * D);
    for (int j = 0; j < BK; j += MR)
      f32_qk_micro(b->qt, b->kb, b->st, D, j);
    if (s_all)
      memcpy(s_all + j0 * BQ, b->st, sizeof b->st);
    for (int d0 = 0; d0 < D; d0 += MR)
      f32_pv_micro(b->pt, b->vb, b->ot, D, d0);
  }
}

/* ---- split: hi/lo BF16 on VDPBF16PS ---------------------------------------- */

/* Q as hi and lo pairs along head_dim, qhp[p][ii] (flash_bf16.h's dp_load_q). */
TGT static void split_q(bench *b) {
  const int D = b->D;
  uint16_t h[DMAX], l[DMAX];
  for (int ii = 0; ii < BQ; ii++) {
    for (int d = 0; d < D; d += VL) {
      __m512i hi, lo;
      split16(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(b->q16 + ii * D + d))), &hi,
              &lo);
      _mm256_storeu_si256((__m256i *)(h + d), _mm512_cvtepi32_epi16(hi));
      _mm256_storeu_si256((__m256i *)(l + d), _mm512_cvtepi32_epi16(lo));
    }
    for (int p = 0; p < D / 2; p++) {
      b->qhp[p * BQ + ii] = ld32(h + 2 * p);
      b->qlp[p * BQ + ii] = ld32(l + 2 * p);
    }
  }
}

/* A K tile as BF16 hi and lo rows: a row's pair is then one broadcast. */
TGT static void split_k(bench *b, int j0) {
  const int n = BK * b->D;
  const uint16_t *src = b->k16 + j0 * b->D;
  for (int i = 0; i < n; i += VL) {
    __m512i hi, lo;
    split16(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i))), &hi, &lo);
    _mm256_storeu_si256((__m256i *)(b->kh + i), _mm512_cvtepi32_epi16(hi));
    _mm256_storeu_si256((__m256i *)(b->kl + i), _mm512_cvtepi32_epi16(lo));
  }
}

/* A V tile as hi and lo pairs of keys, vhp[jp][d] (dp_pack_v). */
TGT static void split_v(bench *b, int j0) {
  const int D = b->D;
  for (int jp = 0; jp < BK / 2; jp++) {
    const uint16_t *a = b->v16 + (j0 + 2 * jp) * D, *c = a + D;
    for (int d = 0; d < D; d += VL) {
      __m512i ah, al, ch, cl;
      split16(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(a + d))), &ah, &al);
      split16(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(c + d))), &ch, &cl);
      _mm512_storeu_si512(b->vhp + jp * D + d, pair(ah, ch));
      _mm512_storeu_si512(b->vlp + jp * D + d, pair(al, cl));
    }
  }
}

/* P (F32) as hi and lo pairs of keys, php[jp][ii] (dp_pack_p): not exact,
 * the lo part rounds away the last 8 of P's 24 bits. */
TGT static void split_p(bench *b) {
  for (int jp = 0; jp < BK / 2; jp++)
    for (int c = 0; c < NR; c++) {
      __m512i ah, al, ch, cl;
      split16(_mm512_loadu_ps(b->pt + 2 * jp * BQ + c * VL), &ah, &al);
      split16(_mm512_loadu_ps(b->pt + (2 * jp + 1) * BQ + c * VL), &ch, &cl);
      _mm512_storeu_si512(b->php + jp * BQ + c * VL, pair(ah, ch));
      _mm512_storeu_si512(b->plp + jp * BQ + c * VL, pair(al, cl));
    }
}

/* acc += a·b over `terms` of the split products: 1 hi·hi, 3 adds hi·lo and
 * lo·hi, 4 adds lo·lo. The small terms go first (better rounding, and no
 * longer a dependency chain than the big one alone). */
INL __m512 dp_split(__m512 acc, __m512i ah, __m512i al, __m512i bh, __m512i bl, const int terms) {
  if (terms >= 4)
    acc = dp(acc, al, bl);
  if (terms >= 3) {
    acc = dp(acc, ah, bl);
    acc = dp(acc, al, bh);
  }
  return dp(acc, ah, bh);
}

INL void sp_qk_micro(bench *b, int j, const int terms) {
  const int D = b->D;
  __m512 acc[MR][NR];
  UNROLL for (int r = 0; r < MR; r++) UNROLL for (int c = 0; c < NR; c++) acc[r][c] =
      _mm512_setzero_ps();
  for (int p = 0; p < D / 2; p++) {
    __m512i qh[NR], ql[NR];
    UNROLL for (int c = 0; c < NR; c++) {
      qh[c] = _mm512_loadu_si512(b->qhp + p * BQ + c * VL);
      ql[c] = _mm512_loadu_si512(b->qlp + p * BQ + c * VL);
    }
    UNROLL for (int r = 0; r < MR; r++) {
      __m512i kh = _mm512_set1_epi32((int)ld32(b->kh + (j + r) * D + 2 * p));
      __m512i kl = _mm512_set1_epi32((int)ld32(b->kl + (j + r) * D + 2 * p));
      UNROLL for (int c = 0; c < NR; c++) acc[r][c] =
          dp_split(acc[r][c], qh[c], ql[c], kh, kl, terms);
    }
  }
  UNROLL for (int r = 0; r < MR; r++) UNROLL for (int c = 0; c < NR; c++)
      _mm512_storeu_ps(b->st + (j + r) * BQ + c * VL, acc[r][c]);
}

INL void sp_pv_micro(bench *b, int d0, const int terms) {
  const int D = b->D;
  __m512 acc[MR][NR];
  UNROLL for (int r = 0; r < MR; r++) UNROLL for (int c = 0; c < NR; c++) acc[r][c] =
      _mm512_loadu_ps(b->ot + (d0 + r) * BQ + c * VL);
  for (int jp = 0; jp < BK / 2; jp++) {
    __m512i ph[NR], pl[NR];
    UNROLL for (int c = 0; c < NR; c++) {
      ph[c] = _mm512_loadu_si512(b->php + jp * BQ + c * VL);
      pl[c] = _mm512_loadu_si512(b->plp + jp * BQ + c * VL);
    }
    UNROLL for (int r = 0; r < MR; r++) {
      __m512i vh = _mm512_set1_epi32((int)b->vhp[jp * D + d0 + r]);
      __m512i vl = _mm512_set1_epi32((int)b->vlp[jp * D + d0 + r]);
      UNROLL for (int c = 0; c < NR; c++) acc[r][c] =
          dp_split(acc[r][c], ph[c], pl[c], vh, vl, terms);
    }
  }
  UNROLL for (int r = 0; r < MR; r++) UNROLL for (int c = 0; c < NR; c++)
      _mm512_storeu_ps(b->ot + (d0 + r) * BQ + c * VL, acc[r][c]);
}

/* One call with `terms` products (a constant after inlining, so each
 * variant below is its own loop with no branch on it). */
INL void sp_call(bench *b, float *s_all, const int terms) {
  const int D = b->D;
  split_q(b);
  memset(b->ot, 0, sizeof b->ot);
  for (int j0 = 0; j0 < N; j0 += BK) {
    split_k(b, j0);
    split_v(b, j0);
    for (int j = 0; j < BK; j += MR)
      sp_qk_micro(b, j, terms);
    if (s_all)
      memcpy(s_all + j0 * BQ, b->st, sizeof b->st);
    split_p(b); /* the engine splits each tile's fresh P */
    for (int d0 = 0; d0 < D; d0 += MR)
      sp_pv_micro(b, d0, terms);
  }
}

TGT static void split4_call(bench *b, float *s_all) { sp_call(b, s_all, 4); }
TGT static void split3_call(bench *b, float *s_all) { sp_call(b, s_all, 3); }
TGT static void bf16_call(bench *b, float *s_all) { sp_call(b, s_all, 1); }

/* ---- reference, errors, timing --------------------------------------------- */

/* Sᵀ[j][ii] and Oᵀ[d][ii] in float64 from the same F16 inputs and F32 P. */
static void reference(const bench *b, double *s_ref, double *o_ref) {
  const int D = b->D;
  for (int j = 0; j < N; j++)
    for (int ii = 0; ii < BQ; ii++) {
      double s = 0;
      for (int d = 0; d < D; d++)
        s += (double)h2f(b->q16[ii * D + d]) * (double)h2f(b->k16[j * D + d]);
      s_ref[j * BQ + ii] = s;
    }
  memset(o_ref, 0, sizeof(double) * (size_t)(D * BQ));
  for (int j = 0; j < N; j++)
    for (int d = 0; d < D; d++) {
      const double v = (double)h2f(b->v16[j * D + d]);
      for (int ii = 0; ii < BQ; ii++)
        o_ref[d * BQ + ii] += (double)b->pt[(j % BK) * BQ + ii] * v;
    }
}

/* max |x - ref| / max |ref|. */
static double max_err(const float *x, const double *ref, int n) {
  double e = 0, m = 0;
  for (int i = 0; i < n; i++) {
    e = fmax(e, fabs((double)x[i] - ref[i]));
    m = fmax(m, fabs(ref[i]));
  }
  return m > 0 ? e / m : e;
}

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

typedef struct variant {
  const char *name, *how;
  void (*call)(bench *b, float *s_all);
} variant;

static const variant variants[] = {
    {"f32", "F16 widened, F32 FMA (the engine)", f32_call},
    {"split3", "hi/lo BF16, 3 products, VDPBF16PS", split3_call},
    {"split4", "hi/lo BF16, 4 products, VDPBF16PS", split4_call},
    {"bf16", "hi only (lossy, for scale)", bf16_call},
};

/* GFLOP/s from the median of reps calls, after one warm-up call. */
static double gflops(const variant *v, bench *b, int reps) {
  double t[201];
  v->call(b, NULL);
  for (int i = 0; i < reps; i++) {
    const double t0 = now();
    v->call(b, NULL);
    t[i] = now() - t0;
  }
  qsort(t, (size_t)reps, sizeof *t, cmp_double);
  return 4.0 * b->D * BQ * N / t[reps / 2] * 1e-9;
}

/* Inputs in [-1, 1) rounded to F16 (11 significant bits, so lo is rarely
 * 0), P in [0, 1); a fixed seed, the same data on every run. */
static void fill(bench *b, int D) {
  srand(12345);
  b->D = D;
  for (int i = 0; i < BQ * D; i++)
    b->q16[i] = f2h(2.0f * (float)rand() / (float)RAND_MAX - 1.0f);
  for (int i = 0; i < N * D; i++) {
    b->k16[i] = f2h(2.0f * (float)rand() / (float)RAND_MAX - 1.0f);
    b->v16[i] = f2h(2.0f * (float)rand() / (float)RAND_MAX - 1.0f);
  }
  for (int i = 0; i < BK * BQ; i++)
    b->pt[i] = (float)rand() / ((float)RAND_MAX + 1.0f);
}

static void run_d(bench *b, int D, int reps, float *s_all, double *s_ref, double *o_ref) {
  fill(b, D);
  reference(b, s_ref, o_ref);
  for (size_t i = 0; i < sizeof variants / sizeof *variants; i++) {
    const variant *v = &variants[i];
    v->call(b, s_all);
    const double es = max_err(s_all, s_ref, N * BQ), eo = max_err(b->ot, o_ref, D * BQ);
    const double g = gflops(v, b, reps);
    printf("D=%-3d  %-6s  %7.1f GFLOP/s   S err %.2e   O err %.2e   %s\n", D, v->name, g, es, eo,
           v->how);
    fflush(stdout);
  }
}

int main(int argc, char **argv) {
  int reps = 31;
  if (argc == 3 && strcmp(argv[1], "--reps") == 0)
    reps = atoi(argv[2]);
  if (reps < 1 || reps > 201) {
    fprintf(stderr, "usage: bench-f16split [--reps 1..201]\n");
    return 2;
  }
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
      !__builtin_cpu_supports("f16c")) {
    printf("skipped: the CPU has no AVX-512F/BW or F16C\n");
    return 0;
  }
  if (!__builtin_cpu_supports("avx512bf16")) {
    printf("skipped: the CPU has no AVX512-BF16\n");
    return 0;
  }
  const int bad = split_failures();
  printf("F16 split hi = bf16(x), lo = bf16(x - hi): %s over all finite F16\n",
         bad ? "NOT exact" : "hi + lo == x exactly");
  if (bad)
    printf("  (%d values differ)\n", bad);
  printf("one thread, %d query rows x %d F16 keys, tiles of %d, median of %d calls, "
         "GFLOP/s = 4*D*%d*%d / time\n",
         BQ, N, BK, reps, BQ, N);
  bench *b = aligned_alloc(64, sizeof *b);
  float *s_all = malloc(sizeof(float) * N * BQ);
  double *s_ref = malloc(sizeof(double) * N * BQ), *o_ref = malloc(sizeof(double) * DMAX * BQ);
  if (!b || !s_all || !s_ref || !o_ref)
    return 1;
  run_d(b, 128, reps, s_all, s_ref, o_ref);
  run_d(b, 64, reps, s_all, s_ref, o_ref);
  free(b);
  free(s_all);
  free(s_ref);
  free(o_ref);
  return 0;
}
