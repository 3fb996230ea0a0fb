/*
 * cpu_vs_blas.c — `make bench`: the CPU flash engine against OpenBLAS, all
 * measured in the same run on the same inputs.
 *
 * Baselines:
 *  (a) sgemm: the two matrix products of standard attention (Q·Kᵀ and P·V)
 *      alone, i.e. OpenBLAS's sgemm rate on the same FLOPs;
 *  (b) standard attention as a numpy user writes it: S = scale·Q·Kᵀ (sgemm),
 *      the causal mask as np.tril, softmax in separate passes as numpy runs them
 *      (max, exp through glibc's 8-wide vector expf, sum, divide; the
 *      reductions vectorized with `omp simd`), O = P·V (sgemm). Like numpy,
 *      only the sgemms use more than one thread. (No -ffast-math here: its
 *      start-up code sets flush-to-zero, which makes OpenBLAS 0.3.21 fall
 *      back to its slowest kernel.)
 * The flash engine is credited with 4·D FLOPs per visible (query, key)
 * pair, so causal runs count half the work; the baselines compute the full
 * square whether masked or not, as they would in numpy. The last column is
 * the normalized difference between the two answers, to show they agree.
 *
 * OpenBLAS 0.3.21 (Debian 12) does not recognize every current CPU and then
 * falls back to its generic "Prescott" kernels, a quarter of the speed; on
 * such a CPU this program re-runs itself with OPENBLAS_CORETYPE set to the
 * newest kernel family the CPU supports, and prints which it used.
 */
#include "benchlib.h"

#include <cblas.h>
#include <immintrin.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void openblas_set_num_threads(int n);
char *openblas_get_corename(void);
__m256 _ZGVdN8v_expf(__m256 x); /* glibc libmvec: expf on 8 lanes */

typedef struct shape {
  int64_t heads, seq, dim;
} shape;

/* Row softmax in numpy's passes. Causal rows are handled as a careful
 * numpy user would (np.tril): the max, exp and sum over the visible prefix,
 * zeros after it. Feeding -inf to glibc's vector expf instead would send
 * every masked lane down its slow scalar path and flatter the engine. */
static void softmax_rows(float *S, int64_t n, bool causal) {
  for (int64_t i = 0; i < n; i++) {
    float *row = S + i * n, m = -INFINITY, sum = 0;
    const int64_t w = causal ? i + 1 : n;
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j < w; j++)
      m = row[j] > m ? row[j] : m;
    int64_t j = 0;
    for (; j + 8 <= w; j += 8)
      _mm256_storeu_ps(row + j,
                       _ZGVdN8v_expf(_mm256_sub_ps(_mm256_loadu_ps(row + j), _mm256_set1_ps(m))));
    for (; j < w; j++)
      row[j] = expf(row[j] - m);
    memset(row + w, 0, (size_t)(n - w) * sizeof *row);
#pragma omp simd reduction(+ : sum)
    for (j = 0; j < w; j++)
      sum += row[j];
    float inv = 1.0f / sum;
    for (j = 0; j < w; j++)
      row[j] *= inv;
  }
}

/* Seconds for one pass over all heads into out; with_softmax=false times (a). */
static double standard(const attn_request *r, float *S, float *out, bool with_softmax) {
  const int64_t n = r->seq_q, d = r->head_dim;
  const float scale = 1.0f / sqrtf((float)d);
  double t0 = tool_bench_now();
  for (int64_t h = 0; h < r->heads_q; h++) {
    const float *q = (const float *)r->q + h * n * d, *k = (const float *)r->k + h * n * d;
    const float *v = (const float *)r->v + h * n * d;
    float *o = out + h * n * d;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)n, (int)d, scale, q, (int)d,
                k, (int)d, 0.0f, S, (int)n);
    if (with_softmax)
      softmax_rows(S, n, r->causal);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)d, (int)n, 1.0f, S, (int)n,
                v, (int)d, 0.0f, o, (int)d);
  }
  return tool_bench_now() - t0;
}

static double median_of(const attn_request *r, float *S, float *out, bool sm, int reps) {
  double t[16];
  standard(r, S, out, sm); /* warm-up */
  for (int i = 0; i < reps; i++)
    t[i] = standard(r, S, out, sm);
  return tool_bench_median(t, reps);
}

/* ||a - b|| / ||b|| */
static double nerr(const float *a, const float *b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    den += (double)b[i] * b[i];
  }
  return sqrt(num / den);
}

static void pick_openblas_kernel(char **argv) {
  const char *core = openblas_get_corename();
  if (getenv("OPENBLAS_CORETYPE") || strcmp(core, "Prescott") != 0)
    return;
  const char *want = NULL;
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw"))
    want = "SkylakeX";
  else if (__builtin_cpu_supports("avx2"))
    want = "Haswell";
  if (!want)
    return;
  fprintf(stderr,
          "bench: OpenBLAS did not recognize this CPU (kernel %s); re-running "
          "with OPENBLAS_CORETYPE=%s\n",
          core, want);
  setenv("OPENBLAS_CORETYPE", want, 1);
  execv("/proc/self/exe", argv);
  perror("bench: re-exec failed; continuing with the generic kernel");
}

int main(int argc, char **argv) {
  pick_openblas_kernel(argv);
  int reps = argc > 1 ? atoi(argv[1]) : 3;
  if (reps < 1 || reps > 16)
    reps = 3;
  static const shape shapes[] = {{8, 1024, 64}, {8, 4096, 64}, {8, 4096, 128}, {1, 16384, 64}};
  printf("CPU flash engine vs OpenBLAS (%s), F32, batch 1, median of %d runs\n",
         openblas_get_corename(), reps);
  printf("%3s %6s %4s %-6s %3s | %9s %9s | %9s | %9s %9s | %11s %13s | %8s\n", "H", "N", "D",
         "causal", "thr", "flash ms", "GFLOP/s", "sgemm GF/s", "std ms", "GFLOP/s", "flash/sgemm",
         "std/flash time", "diff");
  int rc = 0;
  for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
    const shape *s = &shapes[si];
    float *S = malloc((size_t)(s->seq * s->seq) * sizeof *S);
    float *out = malloc((size_t)(s->heads * s->seq * s->dim) * sizeof *out);
    if (!S || !out) {
      fprintf(stderr, "bench: out of memory for S (%lld x %lld)\n", (long long)s->seq,
              (long long)s->seq);
      return 1;
    }
    for (int causal = 0; causal < 2; causal++)
      for (int threads = 1; threads <= 2; threads++) {
        tool_bench_case c;
        if (tool_bench_case_init(&c, 1, s->heads, s->heads, s->seq, s->seq, s->dim, ATTN_F32,
                                 causal, 7) < 0) {
          fprintf(stderr, "bench: out of memory\n");
          return 1;
        }
        attn_status st;
        attn_engine *e = tool_bench_open(threads, NULL, NULL, &st);
        if (!e) {
          fprintf(stderr, "bench: %s\n", st.message);
          return 1;
        }
        c.req.backend = "cpu";
        double tf = tool_bench_engine(e, &c.req, reps, &st);
        attn_engine_close(e);
        if (tf < 0) {
          fprintf(stderr, "bench: %s\n", st.message);
          rc = 1;
          tool_bench_case_free(&c);
          continue;
        }
        double flops = attn_request_flops(&c.req);
        double full = 4.0 * (double)s->heads * (double)s->seq * (double)s->seq * (double)s->dim;
        openblas_set_num_threads(threads);
        double tg = median_of(&c.req, S, out, false, reps);
        double ts = median_of(&c.req, S, out, true, reps);
        double diff = nerr(c.req.o, out, (size_t)(s->heads * s->seq * s->dim));
        printf("%3lld %6lld %4lld %-6s %3d | %9.1f %9.1f | %9.1f | %9.1f %9.1f | %11.2f "
               "%13.2f | %8.1e\n",
               (long long)s->heads, (long long)s->seq, (long long)s->dim, causal ? "yes" : "no",
               threads, tf * 1e3, flops / tf * 1e-9, full / tg * 1e-9, ts * 1e3, flops / ts * 1e-9,
               (flops / tf) / (full / tg), ts / tf, diff);
        fflush(stdout);
        tool_bench_case_free(&c);
      }
    free(S);
    free(out);
  }
  printf("\nflash/sgemm: the engine's GFLOP/s over OpenBLAS sgemm's on the same products.\n"
         "std/flash time: how many times longer numpy-style standard attention takes.\n"
         "diff: ||O_flash - O_standard|| / ||O_standard||.\n");
  return rc;
}
