/*
 * simd.h — the handful of vector operations the flash kernel is written in.
 *
 * flash.c is compiled once per instruction set with ATTN_ISA set to 512
 * (AVX-512F/BW/VL + FMA + F16C), 256 (AVX2 + FMA + F16C) or 0 (portable C,
 * one float per "vector"); cpu.c picks one at run time from CPU detection.
 * Everything ISA-specific lives here so the kernel reads the same for all.
 *
 * vexp2(x) = 2^x: x = n + f with n = round(x), f in [-1/2, 1/2]; 2^f from a
 * degree-6 polynomial fitted for relative error on that interval (fit error
 * 8e-9), then scaled by 2^n. Measured against exp2() in double over
 * [-126, 0] (tests/unit/test_kernel.c) the relative error stays below
 * 1.2e-7, about 1 ulp (measured: 6.9e-8 with FMA, 9.2e-8 without).
 * Results below 2^-126 may flush to zero (the AVX2 and portable forms do),
 * and any x <= -150, -inf included, gives exactly 0, which is what masked
 * scores need.
 */
#ifndef ATTN_CPU_SIMD_H
#define ATTN_CPU_SIMD_H

#include "engine.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* 2^f on [-1/2, 1/2], c0 = 1 exactly. */
#define EXP2_C1 0.693147196162669f
#define EXP2_C2 0.24022637389912296f
#define EXP2_C3 0.05550347346349765f
#define EXP2_C4 0.009619673566200419f
#define EXP2_C5 0.0013393085694465364f
#define EXP2_C6 0.00014990877786865388f

#if ATTN_ISA == 512
#include <immintrin.h>
#define ISA_NAME "avx512"
#define VL 16
typedef __m512 vf;
static inline vf vload(const float *p) { return _mm512_loadu_ps(p); }
static inline void vstore(float *p, vf x) { _mm512_storeu_ps(p, x); }
static inline vf vset1(float x) { return _mm512_set1_ps(x); }
static inline vf vfma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
static inline vf vmul(vf a, vf b) { return _mm512_mul_ps(a, b); }
static inline vf vadd(vf a, vf b) { return _mm512_add_ps(a, b); }
static inline vf vsub(vf a, vf b) { return _mm512_sub_ps(a, b); }
static inline vf vmax(vf a, vf b) { return _mm512_max_ps(a, b); }
static inline vf vabs(vf a) { return _mm512_abs_ps(a); }
static inline vf vmin(vf a, vf b) { return _mm512_min_ps(a, b); }
static inline vf vdiv(vf a, vf b) { return _mm512_div_ps(a, b); }
/* vexp2's pieces: clamp into the range vldexp handles, round to nearest,
 * p·2^n (scalef underflows to 0 by itself). */
static inline vf vexp2_clamp(vf x) { return _mm512_max_ps(x, _mm512_set1_ps(-200.0f)); }
static inline vf vround(vf x) {
  return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
static inline vf vldexp(vf p, vf n) { return _mm512_scalef_ps(p, n); }
/* VL elements of dtype dt at p, widened to F32. */
static inline vf vload_cvt(const void *p, attn_dtype dt) {
  switch (dt) {
  case ATTN_F16: return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
  case ATTN_BF16:
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
  default: return _mm512_loadu_ps((const float *)p);
  }
}
/* Stores VL floats rounded (to nearest even) to dtype dt. */
static inline void vstore_cvt(void *p, vf x, attn_dtype dt) {
  switch (dt) {
  case ATTN_F16:
    _mm256_storeu_si256((__m256i *)p,
                        _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    break;
  case ATTN_BF16: {
    __m512i u = _mm512_castps_si512(x);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    u = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtepi32_epi16(_mm512_srli_epi32(u, 16)));
    break;
  }
  default: _mm512_storeu_ps((float *)p, x);
  }
}

#elif ATTN_ISA == 256
#include <immintrin.h>
#define ISA_NAME "avx2"
#define VL 8
typedef __m256 vf;
static inline vf vload(const float *p) { return _mm256_loadu_ps(p); }
static inline void vstore(float *p, vf x) { _mm256_storeu_ps(p, x); }
static inline vf vset1(float x) { return _mm256_set1_ps(x); }
static inline vf vfma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
static inline vf vmul(vf a, vf b) { return _mm256_mul_ps(a, b); }
static inline vf vadd(vf a, vf b) { return _mm256_add_ps(a, b); }
static inline vf vsub(vf a, vf b) { return _mm256_sub_ps(a, b); }
static inline vf vmax(vf a, vf b) { return _mm256_max_ps(a, b); }
static inline vf vabs(vf a) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), a); }
static inline vf vmin(vf a, vf b) { return _mm256_min_ps(a, b); }
static inline vf vdiv(vf a, vf b) { return _mm256_div_ps(a, b); }
static inline vf vexp2_clamp(vf x) {
  return _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(128.0f));
}
static inline vf vround(vf x) {
  return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
/* 2^n through the exponent field: n = -127 gives the bit pattern of 0,
 * n = 128 that of +inf. */
static inline vf vldexp(vf p, vf n) {
  __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
static inline vf vload_cvt(const void *p, attn_dtype dt) {
  switch (dt) {
  case ATTN_F16: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
  case ATTN_BF16:
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
  default: return _mm256_loadu_ps((const float *)p);
  }
}
static inline void vstore_cvt(void *p, vf x, attn_dtype dt) {
  switch (dt) {
  case ATTN_F16:
    _mm_storeu_si128((__m128i *)p,
                     _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    break;
  case ATTN_BF16: {
    __m256i u = _mm256_castps_si256(x);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    u = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))),
                          16);
    /* packus works within 128-bit lanes: pack, then put the quads in order */
    __m256i packed = _mm256_packus_epi32(u, u);
    packed = _mm256_permute4x64_epi64(packed, 0x08);
    _mm_storeu_si128((__m128i *)p, _mm256_castsi256_si128(packed));
    break;
  }
  default: _mm256_storeu_ps((float *)p, x);
  }
}

#else /* portable C: a "vector" is one float */
#define ISA_NAME "generic"
#define VL 1
typedef float vf;
static inline vf vload(const float *p) { return *p; }
static inline void vstore(float *p, vf x) { *p = x; }
static inline vf vset1(float x) { return x; }
static inline vf vfma(vf a, vf b, vf c) { return a * b + c; }
static inline vf vmul(vf a, vf b) { return a * b; }
static inline vf vadd(vf a, vf b) { return a + b; }
static inline vf vsub(vf a, vf b) { return a - b; }
static inline vf vmax(vf a, vf b) { return a > b ? a : b; }
static inline vf vabs(vf a) { return fabsf(a); }
static inline vf vmin(vf a, vf b) { return a < b ? a : b; }
static inline vf vdiv(vf a, vf b) { return a / b; }
static inline vf vexp2_clamp(vf x) { return x < -150.0f ? -150.0f : x > 128.0f ? 128.0f : x; }
static inline vf vround(vf x) { return rintf(x); }
/* NaN only reaches here from inputs the scan refuses; (int)NaN is undefined. */
static inline vf vldexp(vf p, vf n) { return n != n ? n : ldexpf(p, (int)n); }
static inline vf vload_cvt(const void *p, attn_dtype dt) { return (float)attn_load_elem(p, dt, 0); }
static inline void vstore_cvt(void *p, vf x, attn_dtype dt) { attn_store_elem(p, dt, 0, x); }
#endif

/* 2^x: x = n + f, 2^f by Horner's rule on the polynomial, times 2^n. */
static inline vf vexp2(vf x) {
  x = vexp2_clamp(x);
  vf n = vround(x);
  vf f = vsub(x, n);
  vf p = vset1(EXP2_C6);
  p = vfma(p, f, vset1(EXP2_C5));
  p = vfma(p, f, vset1(EXP2_C4));
  p = vfma(p, f, vset1(EXP2_C3));
  p = vfma(p, f, vset1(EXP2_C2));
  p = vfma(p, f, vset1(EXP2_C1));
  p = vfma(p, f, vset1(1.0f));
  return vldexp(p, n);
}

/*
 * tanh(x), for soft-capping: Eigen's rational approximation (odd degree 13
 * over even degree 6, inputs clamped to ±7.905, where it gives 1 - 2 ulp
 * and tanh is within 3e-7 of ±1). Measured against tanh() in double over [-20, 20] in steps of
 * 1e-5: relative error below 2.8e-7 (tests/unit/test_kernel.c checks 5e-7), including the smallest
 * inputs, where 1 - 2/(e^2x + 1) would cancel.
 */
static inline vf vtanh(vf x) {
  const vf c = vset1(7.90531110763549805f);
  x = vmin(vmax(x, vsub(vset1(0.0f), c)), c);
  const vf x2 = vmul(x, x);
  vf p = vset1(-2.76076847742355e-16f);
  p = vfma(p, x2, vset1(2.00018790482477e-13f));
  p = vfma(p, x2, vset1(-8.60467152213735e-11f));
  p = vfma(p, x2, vset1(5.12229709037114e-08f));
  p = vfma(p, x2, vset1(1.48572235717979e-05f));
  p = vfma(p, x2, vset1(6.37261928875436e-04f));
  p = vfma(p, x2, vset1(4.89352455891786e-03f));
  vf q = vset1(1.19825839466702e-06f);
  q = vfma(q, x2, vset1(1.18534705686654e-04f));
  q = vfma(q, x2, vset1(2.26843463243900e-03f));
  q = vfma(q, x2, vset1(4.89352518554385e-03f));
  return vdiv(vmul(p, x), q);
}

/* Largest element of a vector (only off the hot path). */
static inline float vhmax(vf x) {
  float t[VL];
  memcpy(t, &x, sizeof t);
  float m = t[0];
  for (int i = 1; i < VL; i++)
    m = t[i] > m ? t[i] : m;
  return m;
}

/* Whether any lane is NaN (an accumulator of x·0 is NaN iff some x was not finite). */
static inline int vany_nan(vf x) {
  float t[VL];
  memcpy(t, &x, sizeof t);
  for (int i = 0; i < VL; i++)
    if (t[i] != t[i])
      return 1;
  return 0;
}

/* The BF16-product and AMX instances are built with ATTN_DPBF16 and
 * ATTN_AMX set to 1 (the Makefile's ISA_FLAGS_*); the others with 0. */
#ifndef ATTN_DPBF16
#define ATTN_DPBF16 0
#endif
#ifndef ATTN_AMX
#define ATTN_AMX 0
#endif

/* The instance's symbol suffix: flash.c and flash_bwd.c are compiled once
 * per kernel (the Makefile's ISA_FLAGS_*), and cpu.c picks one at run time.
 * amxemu is the amx kernel on tests/lib/amx_emu.h's emulation of the tile
 * instructions, built for the unit tests only. */
#if ATTN_ISA == 512 && defined(ATTN_AMX_EMU) && ATTN_AMX_EMU
#define SUFFIX amxemu
#elif ATTN_ISA == 512 && defined(ATTN_AMX) && ATTN_AMX
#define SUFFIX amx
#elif ATTN_ISA == 512 && defined(ATTN_DPBF16) && ATTN_DPBF16
#define SUFFIX avx512bf16
#elif ATTN_ISA == 512
#define SUFFIX avx512
#elif ATTN_ISA == 256
#define SUFFIX avx2
#else
#define SUFFIX generic
#endif

#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)
#define INLINE static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 16")

#if ATTN_ISA == 512
/* x[r][col] ← x[col][r] for a 16×16 matrix of 32-bit words, one row a
 * register: four butterfly stages, stage b swapping bit b of the row and
 * column indices (row r with bit b clear takes columns with bit b set from
 * row r + b, which takes the others from row r). */
INLINE void vtranspose16(__m512i x[16]) {
  UNROLL for (int s = 0; s < 4; s++) {
    const int b = 1 << s;
    int ia[16], ib[16];
    for (int col = 0; col < 16; col++) {
      ia[col] = col & b ? 16 + col - b : col;
      ib[col] = col & b ? 16 + col : col + b;
    }
    const __m512i pa = _mm512_loadu_si512(ia), pb = _mm512_loadu_si512(ib);
    UNROLL for (int r = 0; r < 16; r++) if (!(r & b)) {
      const __m512i lo = x[r], hi = x[r + b];
      x[r] = _mm512_permutex2var_epi32(lo, pa, hi);
      x[r + b] = _mm512_permutex2var_epi32(lo, pb, hi);
    }
  }
}
#endif

/* Columns c0 .. c0 + 15 of a [D][ldt] array t (a transposed tile: a row a
 * head_dim element) as 16 rows of ld floats at out, elements from D on
 * zero: 16×16 transposes where the ISA has them. */
static inline void vcols16_to_rows(const float *t, int64_t ldt, int64_t D, int64_t c0, float *out,
                                   int64_t ld) {
#if ATTN_ISA == 512
  for (int64_t d0 = 0; d0 < ld; d0 += 16) {
    __m512i x[16];
    for (int64_t rr = 0; rr < 16; rr++)
      x[rr] = d0 + rr < D ? _mm512_loadu_si512(t + (d0 + rr) * ldt + c0) : _mm512_setzero_si512();
    vtranspose16(x);
    for (int64_t c = 0; c < 16; c++)
      _mm512_storeu_si512(out + c * ld + d0, x[c]);
  }
#else
  for (int64_t c = 0; c < 16; c++)
    for (int64_t d = 0; d < ld; d++)
      out[c * ld + d] = d < D ? t[d * ldt + c0 + c] : 0.0f;
#endif
}

/* Register blocking of the micro-kernels of both passes: MR rows broadcast
 * against NR vectors, MR·NR accumulators plus NR operands in registers
 * (AVX2 has 16 vector registers, AVX-512 32). The forward's F32 products
 * have a wide form, MR_WIDE rows, for CPUs with two 512-bit FMA pipes
 * (attn__flash_args.wide): 24 accumulators, 4 operands and a broadcast
 * leave 3 of 32 registers, and each operand loaded feeds 6 FMAs, not 4. */
#if ATTN_ISA == 256
#define MR 4
#define NR 2
#define MR_WIDE MR
#elif ATTN_ISA == 512
#define MR 4
#define NR 4
#define MR_WIDE 6
#else
#define MR 4
#define NR 4
#define MR_WIDE MR
#endif

/* Each switch turns a run-time (mr, nr) into a micro-kernel specialization,
 * for the register blocking MR × NR (at most 4 × 4). */
#define NR_CASES(CALL, MRV)                   \
  switch (nr) {                               \
  case 1: CALL(MRV, 1); break;                \
  case 2: CALL(MRV, 2 <= NR ? 2 : 1); break;  \
  case 3: CALL(MRV, 3 <= NR ? 3 : 1); break;  \
  default: CALL(MRV, 4 <= NR ? 4 : 1); break; \
  }
#define MR_CASES(CALL, mr)                        \
  switch (mr) {                                   \
  case 1: NR_CASES(CALL, 1) break;                \
  case 2: NR_CASES(CALL, 2 <= MR ? 2 : 1) break;  \
  case 3: NR_CASES(CALL, 3 <= MR ? 3 : 1) break;  \
  default: NR_CASES(CALL, 4 <= MR ? 4 : 1) break; \
  }

/* The same for up to MR_WIDE (6) rows. */
#define MR_WIDE_CASES(CALL, mr)                        \
  switch (mr) {                                        \
  case 1: NR_CASES(CALL, 1) break;                     \
  case 2: NR_CASES(CALL, 2 <= MR_WIDE ? 2 : 1) break;  \
  case 3: NR_CASES(CALL, 3 <= MR_WIDE ? 3 : 1) break;  \
  case 4: NR_CASES(CALL, 4 <= MR_WIDE ? 4 : 1) break;  \
  case 5: NR_CASES(CALL, 5 <= MR_WIDE ? 5 : 1) break;  \
  default: NR_CASES(CALL, 6 <= MR_WIDE ? 6 : 1) break; \
  }

/* The cache line at p into L2 (a hint; nothing without vector ISA). */
static inline void vprefetch_l2(const float *p) {
#if ATTN_ISA
  _mm_prefetch((const char *)p, _MM_HINT_T1);
#else
  (void)p;
#endif
}

/* n elements of dtype dt at src widened to F32 at dst, and back (rounded to
 * nearest even); whole vectors, then the tail one by one. */
static inline void load_row(float *dst, const void *src, attn_dtype dt, int64_t n) {
  const size_t es = attn_dtype_size(dt);
  int64_t k = 0;
  for (; k + VL <= n; k += VL)
    vstore(dst + k, vload_cvt((const char *)src + k * es, dt));
  for (; k < n; k++)
    dst[k] = (float)attn_load_elem(src, dt, (size_t)k);
}

static inline void store_row(void *dst, const float *src, attn_dtype dt, int64_t n) {
  const size_t es = attn_dtype_size(dt);
  int64_t k = 0;
  for (; k + VL <= n; k += VL)
    vstore_cvt((char *)dst + k * es, vload(src + k), dt);
  for (; k < n; k++)
    attn_store_elem(dst, dt, (size_t)k, src[k]);
}

#endif
