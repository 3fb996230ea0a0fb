/*
 * test_gpu.c — the CUDA backend against the float64 reference, on the GPU.
 *
 * Without a usable device (the engine lists backend "cuda" as unavailable,
 * or this build has none) it prints "gpu tests: skipped: <why>" and exits 0,
 * so `make test` passes on machines without a GPU. With one it runs, on
 * backend "cuda", in groups:
 *
 *   conf/...   every problem of the CPU suite's conformance lists (cases.h)
 *   headdims   head dims 1..256 in a sample, all dtypes, masks and layouts
 *   decode     Nq = 1 (and a few short queries) over 1..32768 keys: split-KV
 *   long       2048..8192 rows, few heads
 *   layouts    strides with gaps holding NaN, Q/K/V interleaved in one buffer
 *   errors     non-finite inputs (ENONFINITE with coordinates), overflow (ERANGE)
 *   kapi       attn_cu_select + attn_cu_launch on device buffers of our own
 *   hopper     the same on the sm_90a instance (attn_cu_select_hopper), with
 *              the conformance lists' F16/BF16 problems; skipped off 9.0
 *   backward   the backward pass (dq, dk, dv) against the float64 reference
 *              backward: head dims 1..256, all dtypes, GQA, masks and windows,
 *              rows with no visible key, strides, with and without the
 *              forward's lse (without it the backend recomputes it)
 *   backward_atomic  the same cases on an engine with cuda_bwd_atomic_dq
 *              (attnd --deterministic off): dQ by atomics in the dK/dV
 *              pass, every backward instance; fails if the self-check
 *              turned that path off
 *   pool       64 concurrent jobs on 4 streams, device memory back afterwards
 *   sinks      attention sinks: prefill and decode (split-KV, GQA packing, the
 *              Hopper instance where it runs) in every head-dim class and
 *              dtype, rows that see no key, no statistics; the backward with
 *              dsinks (lse given and recomputed, bit for bit twice); a session
 *              on the device (test_gpu_sinks.c)
 *
 * Every case draws fresh inputs from a seed printed at the start (--seed
 * reruns it), poisons the outputs (NaN bits) before each run, runs twice and
 * checks both runs (the second run's bits should equal the first's: a
 * difference is reported as nondeterministic, a hint of a race, though not
 * a failure by itself; the backward's is a failure: dq, dk and dv must
 * repeat bit for bit, as --deterministic on promises, and on the atomic dQ
 * path dk and dv, which it computes without atomics). Thresholds are those
 * of g_tol_o / g_tol_stats.
 *
 *   tests/gpu [--small] [--group NAME[,NAME]] [--seed N] [--quiet]
 *             [--timeout S] [--list]
 *
 * Exit status: 0 all passed or skipped, 1 a case failed, 2 usage, 3 watchdog.
 */
#define _GNU_SOURCE
#include "gpu_test.h"

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifndef ATTN_HAVE_CUDA
/* A build without CUDA: nothing to test here, as on a machine without a GPU. */
int main(void) {
  const char *req = getenv("ATTN_GPU_REQUIRE");
  if (req && *req && strcmp(req, "0") != 0) {
    printf("gpu tests: FAIL: this build has no CUDA backend and ATTN_GPU_REQUIRE is set\n");
    return 1;
  }
  printf("gpu tests: skipped: this build has no CUDA backend (built without CUDA)\n");
  return 0;
}
#else
#include <cuda_runtime_api.h>

gopts g_opt;
bool g_dead;
int g_sms;
/* The backend under test. --backend cpu runs the engine groups on the CPU
 * backend, with no CUDA call at all: a check of this program itself on a
 * machine without a GPU (kapi and the memory checks are left out). */
static const char *g_backend = "cuda";
static bool on_gpu(void) { return strcmp(g_backend, "cuda") == 0; }

/* ---- small utilities --------------------------------------------------- */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

uint64_t g_seed(int grp, int idx, int run) {
  uint64_t s = g_opt.seed ^ ((uint64_t)grp << 40) ^ ((uint64_t)idx << 8) ^ (uint64_t)run;
  return trand(&s);
}

static char g_current[256] = "starting";

void g_set_current(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_current, sizeof g_current, fmt, ap);
  va_end(ap);
}

static void on_alarm(int sig) {
  (void)sig;
  static const char head[] = "\ngpu tests: FAIL: watchdog fired (--timeout); running: ";
  ssize_t w = write(2, head, sizeof head - 1);
  w = write(2, g_current, strnlen(g_current, sizeof g_current));
  w = write(2, "\n", 1);
  (void)w;
  _exit(3);
}

/*
 * Normalized O error, ||O - ref|| / ||ref||, as the issue sets it: F32 runs
 * on the FMA units in F32 (the same bound as the CPU engine); F16 and BF16
 * round the inputs' products exactly but feed P to the tensor cores in the
 * 16-bit type and round O once more, 2^-11 and 2^-8 relative per element.
 */
double g_tol_o(attn_dtype dt) {
  switch (dt) {
  case ATTN_F16: return 5e-3;
  case ATTN_BF16: return 2e-2;
  default: return 1e-5;
  }
}

/*
 * Statistics error (tcheck: max over rows of |m - ref| and |lse - ref|
 * relative to max(1, |ref|), and |l / ref_l - 1|). The scores come from
 * products of the stored inputs accumulated in F32 in every dtype, so m is
 * F32-accurate everywhere: F32 keeps the CPU suite's 1e-5. For F16/BF16 a
 * kernel may sum l over P after rounding it to the 16-bit type (the P it
 * multiplies V with): each term is then off by up to 2^-11 or 2^-8
 * relative, in random directions, and l's relative error stays well below
 * 1e-3; lse = m + ln l inherits it. 1e-3 still catches any wrong mask,
 * scale or base (e vs 2), which give errors of order 1.
 */
double g_tol_stats(attn_dtype dt) { return dt == ATTN_F32 ? 1e-5 : 1e-3; }

bool g_pass(const terr *e, attn_dtype dt, bool stats) {
  return e->o <= g_tol_o(dt) && e->masked_ok && (!stats || e->stats <= g_tol_stats(dt));
}

bool g_judge(tgroup *g, attn_dtype dt, bool stats, const terr *e, int run, char *why, size_t cap) {
  tg_errors(g, dt, e, stats);
  if (g_pass(e, dt, stats))
    return true;
  snprintf(why, cap, "run %d: O error %.3g (tol %.0e), stats %.3g (tol %.0e), masked rows %s",
           run + 1, e->o, g_tol_o(dt), e->stats, g_tol_stats(dt), e->masked_ok ? "ok" : "WRONG");
  return false;
}

/* ---- groups ------------------------------------------------------------- */

void tg_begin(tgroup *g, const char *name) {
  memset(g, 0, sizeof *g);
  g->name = name;
  for (int i = 0; i < ATTN_DTYPE_COUNT; i++)
    g->worst_o[i] = -1;
  g->worst_stats = -1;
  g->seconds = now_s();
  printf("== %s ==\n", name);
  fflush(stdout);
}

void tg_end(tgroup *g) {
  g->seconds = now_s() - g->seconds;
  printf("-- %s: %d cases, %d passed, %d failed (%.1f s)%s%s\n", g->name, g->cases, g->passed,
         g->failed, g->seconds, g->note[0] ? "; " : "", g->note);
  fflush(stdout);
}

void tg_case(tgroup *g, bool ok, const char *fmt, ...) {
  g->cases++;
  if (ok)
    g->passed++;
  else
    g->failed++;
  if (ok && !g_opt.verbose)
    return;
  char line[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  printf("  %-4s %s\n", ok ? "ok" : "FAIL", line);
  fflush(stdout);
}

void tg_errors(tgroup *g, attn_dtype dt, const terr *e, bool stats) {
  if ((unsigned)dt < ATTN_DTYPE_COUNT && !(e->o <= g->worst_o[dt])) /* NaN too */
    g->worst_o[dt] = isnan(e->o) ? INFINITY : e->o;
  if (stats && !(e->stats <= g->worst_stats))
    g->worst_stats = isnan(e->stats) ? INFINITY : e->stats;
}

/* ---- CUDA checks ---------------------------------------------------------- */

int g_cuda_check(int err, const char *what, const char *file, int line) {
  if (err == cudaSuccess)
    return 0;
  cudaError_t e = (cudaError_t)err;
  fprintf(stdout, "  CUDA %s:%d: %s: %s (%s)\n", file, line, what, cudaGetErrorString(e),
          cudaGetErrorName(e));
  /* A sticky error (a fault in a kernel) breaks the context for good: it
   * comes back from every later call. A plain one is cleared here. */
  (void)cudaGetLastError();
  if (cudaDeviceSynchronize() != cudaSuccess && cudaDeviceSynchronize() != cudaSuccess) {
    if (!g_dead)
      printf("  CUDA context is broken (sticky error): the remaining GPU cases are not run\n");
    g_dead = true;
  }
  fflush(stdout);
  return -1;
}

/* After the engine failed a job with EDEVICE: is the context still usable? */
static void probe_context(void) {
  cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess)
    GCK(e);
}

bool g_choice(const tprob *p, attn_cu_choice *ch) {
  attn_cu_params prm;
  tcu_params(p, &prm);
  attn_status st = {0};
  memset(ch, 0, sizeof *ch);
  return attn_cu_select(&prm, g_sms, ch, &st) == 0;
}

/* ---- one case on the engine ----------------------------------------------- */

/* A case plus what its layout needs for poisoning and the gap check. */
typedef struct gcase {
  tcase c;
  size_t o_elems; /* elements of the whole O buffer, gaps included */
  bool o_gaps;    /* O has gaps that the engine must leave untouched */
} gcase;

static void gcase_init(gcase *gc, const tprob *p, uint64_t seed) {
  tcase_init(&gc->c, p, seed);
  gc->o_elems = (size_t)(p->b * p->hq * p->nq * p->d);
  gc->o_gaps = false;
}

static void gcase_poison(gcase *gc) {
  tcase *c = &gc->c;
  memset(c->o, 0xff, gc->o_elems * attn_dtype_size(c->p.dt)); /* NaN in every dtype */
  size_t rows = (size_t)(c->p.b * c->p.hq * c->p.nq);
  if (c->m) {
    memset(c->m, 0xff, rows * 4);
    memset(c->l, 0xff, rows * 4);
    memset(c->lse, 0xff, rows * 4);
  }
}

/* Gap elements of O that were written (their poison changed). */
static size_t gaps_touched(const gcase *gc) {
  if (!gc->o_gaps)
    return 0;
  const tcase *c = &gc->c;
  const int64_t *s = c->req.o_stride;
  size_t es = attn_dtype_size(c->p.dt), n = 0;
  const unsigned char *o = c->o;
  for (size_t i = 0; i < gc->o_elems; i++) {
    int64_t r = (int64_t)i % s[0];
    int64_t h = r / s[1];
    r %= s[1];
    int64_t row = r / s[2], d = r % s[2];
    if (h < c->p.hq && row < c->p.nq && d < c->p.d)
      continue;
    for (size_t k = 0; k < es; k++)
      if (o[i * es + k] != 0xff) {
        n++;
        break;
      }
  }
  return n;
}

static const char *kname(const tprob *p, char *buf, size_t cap) {
  attn_cu_choice ch;
  if (!g_choice(p, &ch))
    snprintf(buf, cap, "[select refuses]");
  else
    snprintf(buf, cap, "[%s/%d]", attn_cu_kernel_name(ch.kernel), ch.nsplit);
  return buf;
}

/*
 * Runs gc on backend "cuda" twice, each time after poisoning its outputs,
 * and checks both runs against ref. Counts one case in g.
 */
static bool run_case(tgroup *g, attn_engine *e, gcase *gc, const tref *ref, uint64_t seed) {
  tcase *c = &gc->c;
  const tprob *p = &c->p;
  char desc[200], kn[48];
  tdesc(p, desc, sizeof desc);
  kname(p, kn, sizeof kn);
  attn_cu_choice ch;
  if (g_choice(p, &ch) && ch.nsplit > 1)
    g->split++;
  if (g_dead) {
    tg_case(g, false, "%s %s: not run (CUDA context broken earlier)", desc, kn);
    return false;
  }
  g_set_current("%s: %s", g->name, desc);
  size_t es = attn_dtype_size(p->dt), rows = (size_t)(p->b * p->hq * p->nq);
  size_t obytes = gc->o_elems * es;
  unsigned char *first = malloc(obytes + 3 * rows * 4);
  terr err[2];
  memset(err, 0, sizeof err);
  bool ok = true, same = true;
  char why[400] = "";
  double ms = 0;
  for (int run = 0; run < 2 && ok; run++) {
    gcase_poison(gc);
    attn_status st = {0};
    double t0 = now_s();
    int rc = trun(e, c, g_backend, &st);
    ms = 1e3 * (now_s() - t0);
    if (rc != 0) {
      snprintf(why, sizeof why, "run %d: engine returned %s: %s", run + 1, attn_err_name(rc),
               st.message);
      if (on_gpu() && (rc == ATTN_EDEVICE || rc == ATTN_ENODEV))
        probe_context();
      ok = false;
      break;
    }
    err[run] = tref_check(c, ref);
    if (!g_judge(g, p->dt, p->stats, &err[run], run, why, sizeof why))
      ok = false;
    size_t touched = gaps_touched(gc);
    if (touched) {
      snprintf(why + strlen(why), sizeof why - strlen(why),
               "%srun %d: %zu elements in the gaps of O were written", why[0] ? "; " : "", run + 1,
               touched);
      ok = false;
    }
    if (first && run == 0) {
      memcpy(first, c->o, obytes);
      if (c->m) {
        memcpy(first + obytes, c->m, rows * 4);
        memcpy(first + obytes + rows * 4, c->l, rows * 4);
        memcpy(first + obytes + 2 * rows * 4, c->lse, rows * 4);
      }
    } else if (first) {
      same = memcmp(first, c->o, obytes) == 0;
      if (c->m)
        same = same && memcmp(first + obytes, c->m, rows * 4) == 0 &&
               memcmp(first + obytes + rows * 4, c->l, rows * 4) == 0 &&
               memcmp(first + obytes + 2 * rows * 4, c->lse, rows * 4) == 0;
    }
  }
  free(first);
  if (ok && !same)
    g->nondet++;
  char sb[32] = "-";
  if (p->stats)
    snprintf(sb, sizeof sb, "%.2e", fmax(err[0].stats, err[1].stats));
  if (ok)
    tg_case(g, true, "%s %s O %.2e stats %s %.1f ms%s", desc, kn, fmax(err[0].o, err[1].o), sb, ms,
            same ? "" : " (runs differ in bits)");
  else
    tg_case(g, false, "%s %s seed %#" PRIx64 ": %s", desc, kn, seed, why);
  return ok;
}

/* Makes, runs and frees one case of problem p. */
static bool one_problem(tgroup *g, attn_engine *e, const tprob *p, uint64_t seed) {
  gcase gc;
  gcase_init(&gc, p, seed);
  tref ref;
  attn_status st = {0};
  bool ok;
  if (tref_compute(&gc.c, g_opt.ref_threads, &ref, &st) < 0) {
    char desc[200];
    tg_case(g, false, "%s: the reference failed: %s", tdesc(p, desc, sizeof desc), st.message);
    ok = false;
  } else {
    ok = run_case(g, e, &gc, &ref, seed);
    tref_free(&ref);
  }
  tcase_free(&gc.c);
  return ok;
}

static void run_list(tgroup *g, int grp, attn_engine *e, const tprob *ps, int n) {
  for (int i = 0; i < n; i++)
    one_problem(g, e, &ps[i], g_seed(grp, i, 0));
}

/* ---- problem lists of the GPU's own ------------------------------------- */

static int list_headdims(tprob *ps) {
  static const int64_t ds[] = {1,   7,   8,   37,  63,  64,  65,  80,  96,  100, 127,
                               128, 129, 150, 160, 176, 181, 192, 200, 255, 256};
  int n = 0;
  for (int i = 0; i < (int)(sizeof ds / sizeof *ds); i++)
    for (int t = 0; t < ATTN_DTYPE_COUNT; t++) {
      /* k walks every residue mod 2, 4 and 7; m mod 3 varies within a dtype */
      int k = i * 3 + t, m = i + t;
      int64_t hkv = 1 + m % 3, hq = hkv * (1 + (k / 3) % 3);
      int64_t nq = 33 + 29 * (k % 7), nkv = m % 3 == 0 ? nq : nq + 71 * (k % 4) - 20;
      tprob p = tprob_make(1 + k % 2, hq, hkv, nq, nkv, ds[i], (attn_dtype)t);
      p.causal = k % 4 == 1;
      if (k % 4 == 2) {
        p.wl = 31;
        p.wr = 5;
      }
      p.strided = m % 3 == 1;
      p.stats = k % 2 == 0;
      ps[n++] = p;
    }
  /* issue 17's softcap and ALiBi ([Hq] and [B, Hq] slopes) on each
   * instance, with causal and windowed masks */
  static const int64_t vd[] = {61, 64, 89, 125, 128, 150, 181, 253};
  enum { NVD = sizeof vd / sizeof *vd };
  for (int i = 0; i < NVD; i++)
    for (int t = 0; t < ATTN_DTYPE_COUNT; t++) {
      tprob p = tprob_make(2, 4, 2, 77, 150, vd[i], (attn_dtype)t);
      p.softcap = (i + t) % 3 == 2 ? 0 : 2.0 + i;
      p.alibi = 1 + (i + t) % 2;
      p.causal = t == 1;
      p.wl = t == 2 ? 40 : -1;
      p.stats = true;
      ps[n++] = p;
    }
  /* scales the kernels cannot fold into the exponent (negative, zero) and
   * one they do, on each instance */
  static const double sc[] = {-0.09, 0.0, 0.35};
  for (int i = 0; i < NVD; i++)
    for (int t = 0; t < ATTN_DTYPE_COUNT; t++) {
      tprob p = tprob_make(1, 4, 2, 70, 150, vd[i], (attn_dtype)t);
      p.scale = sc[(i + t) % 3];
      p.causal = i % 2 == 0;
      p.stats = true;
      ps[n++] = p;
    }
  return n;
}

/* GQA packing (a group's query heads in one block's rows): 32:8 and MQA
 * decodes unsplit and split, groups that fill a 128-row block (MQA's 32 x
 * 4, 8 x 16) and a 64-row one (4 x 16), half a block (4 x 16, MQA's 32 x
 * 2), 4 x 5 rows whose heads change inside a warp's 16, with masks and
 * per-row ALiBi slopes, on each tensor-core instance. */
static int list_packed(tprob *ps) {
  static const struct {
    int64_t hq, hkv, nq, nkv, d;
    attn_dtype dt;
    bool causal;
    int64_t wl;
    int alibi;
  } c[] = {
      {32, 8, 1, 70, 128, ATTN_BF16, false, -1, 0},
      {32, 8, 1, 9000, 128, ATTN_BF16, false, -1, 2},
      {32, 1, 2, 70, 64, ATTN_F16, true, 20, 1},
      {32, 1, 2, 9000, 64, ATTN_F16, true, -1, 1},
      {16, 4, 16, 300, 61, ATTN_BF16, true, -1, 2},
      {4, 1, 5, 300, 253, ATTN_F16, true, 3, 1},
      {8, 2, 3, 5000, 200, ATTN_BF16, false, 900, 0},
      {64, 8, 8, 2000, 96, ATTN_F16, true, -1, 2},
      {32, 1, 4, 300, 64, ATTN_BF16, true, 50, 1},
      {8, 1, 16, 300, 150, ATTN_F16, true, -1, 2},
      {8, 2, 16, 300, 181, ATTN_BF16, false, 100, 1},
      {32, 4, 16, 700, 128, ATTN_BF16, true, -1, 0},
      {16, 2, 4, 3000, 150, ATTN_F16, false, -1, 2},
      {12, 4, 7, 300, 181, ATTN_BF16, true, 50, 1},
  };
  int n = 0;
  for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
    tprob p = tprob_make(2, c[i].hq, c[i].hkv, c[i].nq, c[i].nkv, c[i].d, c[i].dt);
    p.causal = c[i].causal;
    p.wl = c[i].wl;
    p.alibi = c[i].alibi;
    p.softcap = i % 3 == 1 ? 20 : 0;
    p.stats = 1;
    ps[n++] = p;
  }
  return n;
}

static int list_decode(tprob *ps) {
  static const int64_t nkv[] = {1, 100, 4096, 32768};
  int n = 0;
  tprob p;
  for (int i = 0; i < 4; i++) {
    p = tprob_make(2, 32, 8, 1, nkv[i], 128, ATTN_BF16);
    p.stats = 1;
    ps[n++] = p;
    p = tprob_make(1, 8, 1, 1, nkv[i], 64, ATTN_F16);
    p.stats = 1;
    p.strided = 1;
    ps[n++] = p;
    p = tprob_make(1, 4, 4, 1, nkv[i], 37, ATTN_F32);
    p.stats = 1;
    ps[n++] = p;
    p = tprob_make(1, 16, 2, 1, nkv[i], 256, ATTN_F16);
    p.causal = 1;
    ps[n++] = p;
  }
  /* windows that leave most key ranges of a split empty */
  p = tprob_make(1, 8, 2, 1, 32768, 128, ATTN_F16);
  p.wl = 3000;
  p.stats = 1;
  ps[n++] = p;
  p = tprob_make(1, 8, 2, 1, 32768, 128, ATTN_BF16);
  p.wl = 0;
  p.wr = 0;
  p.stats = 1;
  ps[n++] = p;
  p = tprob_make(1, 4, 1, 1, 20000, 80, ATTN_F32);
  p.wl = 700;
  p.stats = 1;
  ps[n++] = p;
  /* short queries (speculative decoding), causal across the split */
  p = tprob_make(2, 8, 8, 4, 4096, 128, ATTN_F16);
  p.causal = 1;
  p.stats = 1;
  ps[n++] = p;
  p = tprob_make(1, 32, 8, 16, 32768, 128, ATTN_BF16);
  p.causal = 1;
  p.stats = 1;
  ps[n++] = p;
  p = tprob_make(1, 6, 3, 3, 5000, 100, ATTN_BF16);
  p.causal = 1;
  p.wl = 1000;
  p.stats = 1;
  ps[n++] = p;
  /* softcap and ALiBi through the split path and its merge */
  for (int t = 0; t < ATTN_DTYPE_COUNT; t++) {
    p = tprob_make(2, 32, 8, 1, 8192, t == 2 ? 64 : 128, (attn_dtype)t);
    p.softcap = 30;
    p.alibi = 2;
    p.stats = 1;
    ps[n++] = p;
  }
  return n + list_packed(ps + n);
}

static int list_long(tprob *ps) {
  int n = 0;
  tprob p;
  p = tprob_make(1, 4, 2, 2048, 2048, 128, ATTN_F16);
  p.causal = 1;
  p.stats = 1;
  ps[n++] = p;
  p = tprob_make(1, 2, 2, 4096, 4096, 64, ATTN_BF16);
  p.stats = 1;
  ps[n++] = p;
  p = tprob_make(1, 2, 1, 8192, 8192, 64, ATTN_F16);
  p.causal = 1;
  p.stats = 1;
  ps[n++] = p;
  p = tprob_make(1, 1, 1, 8192, 8192, 128, ATTN_BF16);
  p.wl = 1024;
  p.wr = 0;
  p.strided = 1;
  p.stats = 1;
  ps[n++] = p;
  p = tprob_make(1, 2, 1, 2048, 8192, 128, ATTN_F32);
  p.causal = 1;
  p.stats = 1;
  ps[n++] = p;
  p = tprob_make(2, 2, 2, 3000, 3000, 96, ATTN_BF16);
  p.causal = 1;
  ps[n++] = p;
  p = tprob_make(1, 2, 2, 8192, 2048, 64, ATTN_F16);
  p.causal = 1;
  p.stats = 1;
  ps[n++] = p;
  return n;
}

/* Problems with sinks (tcase_init draws them from -3 to 7): prefill in
 * every head-dim class and dtype (GQA, causal with Nq > Nkv so rows see no
 * key, windows, strides; some without statistics, whose lse is scratch),
 * decodes that split their keys, a job large enough to run in groups. */
static int list_sinks(tprob *ps) {
  static const int64_t ds[] = {37, 64, 96, 128, 160, 192, 256};
  int n = 0;
  for (int i = 0; i < 7; i++)
    for (int t = 0; t < ATTN_DTYPE_COUNT; t++) {
      const int k = 3 * i + t;
      tprob p = tprob_make(1 + k % 2, 8, 2 + 2 * (k % 2), 100 + 90 * (k % 3), 80 + 120 * (k % 4),
                           ds[i], (attn_dtype)t);
      p.causal = k % 3 != 2;
      p.wl = k % 3 == 2 ? 50 : -1, p.wr = k % 3 == 2 ? 0 : -1;
      p.strided = k % 5 == 1;
      p.stats = k % 4 != 3;
      ps[n++] = p;
    }
  static const int64_t nkv[] = {100, 4096, 32768};
  for (int i = 0; i < 3; i++) {
    tprob p = tprob_make(2, 32, 8, 1, nkv[i], 128, ATTN_BF16);
    p.stats = true;
    ps[n++] = p;
    p = tprob_make(1, 8, 1, 4, nkv[i], 64, ATTN_F16);
    p.causal = true;
    ps[n++] = p;
    p = tprob_make(1, 4, 4, 1, nkv[i], 256, ATTN_F32);
    p.stats = true;
    ps[n++] = p;
  }
  /* 256 MiB of K and V: groups of one KV head, each with its own two sinks */
  tprob p = tprob_make(1, 16, 8, 1, 65536, 128, ATTN_F16);
  p.stats = true;
  ps[n++] = p;
  for (int i = 0; i < n; i++)
    ps[i].sinks = true;
  return n;
}

/* A few small problems for the sanitizers (--small). */
static int list_small(tprob *ps) {
  int n = 0;
  tprob p;
  p = tprob_make(2, 4, 2, 65, 65, 64, ATTN_F32);
  ps[n++] = p;
  p = tprob_make(1, 4, 2, 77, 50, 128, ATTN_F16);
  p.causal = 1;
  p.stats = 1;
  ps[n++] = p;
  p = tprob_make(1, 2, 1, 40, 60, 37, ATTN_F16);
  p.strided = 1;
  p.stats = 1;
  ps[n++] = p;
  p = tprob_make(1, 6, 2, 33, 90, 80, ATTN_BF16);
  p.wl = 20;
  p.wr = 2;
  p.stats = 1;
  ps[n++] = p;
  p = tprob_make(1, 2, 1, 70, 30, 16, ATTN_BF16);
  p.causal = 1;
  p.stats = 1;
  ps[n++] = p;
  p = tprob_make(1, 4, 1, 1, 4096, 128, ATTN_BF16);
  p.stats = 1;
  ps[n++] = p;
  p = tprob_make(1, 2, 2, 1, 3000, 7, ATTN_F16);
  p.wl = 500;
  p.stats = 1;
  ps[n++] = p;
  p = tprob_make(1, 2, 1, 50, 50, 256, ATTN_BF16);
  p.causal = 1;
  ps[n++] = p;
  return n;
}

/* ---- layouts: gaps that hold NaN, Q/K/V interleaved --------------------- */

/* Re-lays tensor x (contiguous [B, H, N, D]) out with gaps after each row,
 * head and batch; gaps hold all-ones bits (NaN). Returns the new buffer. */
static void *gapped(const void *x, int64_t B, int64_t H, int64_t N, int64_t D, size_t es,
                    int64_t s[3], size_t *pelems) {
  s[2] = D + 3;
  s[1] = N * s[2] + 5;
  s[0] = H * s[1] + 7;
  size_t elems = (size_t)(B * s[0]);
  unsigned char *y = malloc(elems * es);
  if (!y)
    return NULL;
  memset(y, 0xff, elems * es);
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++)
      for (int64_t n = 0; n < N; n++)
        memcpy(y + (size_t)(b * s[0] + h * s[1] + n * s[2]) * es,
               (const unsigned char *)x + (size_t)(((b * H + h) * N + n) * D) * es, (size_t)D * es);
  *pelems = elems;
  return y;
}

static bool make_gapped(gcase *gc) {
  tcase *c = &gc->c;
  const tprob *p = &c->p;
  size_t es = attn_dtype_size(p->dt), elems;
  void **bufs[4] = {&c->q, &c->k, &c->v, &c->o};
  int64_t *strides[4] = {c->req.q_stride, c->req.k_stride, c->req.v_stride, c->req.o_stride};
  for (int t = 0; t < 4; t++) {
    int64_t H = t == 0 || t == 3 ? p->hq : p->hkv, N = t == 0 || t == 3 ? p->nq : p->nkv;
    void *y = gapped(*bufs[t], p->b, H, N, p->d, es, strides[t], &elems);
    if (!y)
      return false;
    free(*bufs[t]);
    *bufs[t] = y;
    if (t == 3)
      gc->o_elems = elems;
  }
  c->req.q = c->q;
  c->req.k = c->k;
  c->req.v = c->v;
  c->req.o = c->o;
  gc->o_gaps = true;
  return true;
}

/* Q, K and V of a self-attention problem interleaved as [B, N, 3, H, D]. */
static bool make_qkv_packed(gcase *gc) {
  tcase *c = &gc->c;
  const tprob *p = &c->p;
  if (p->hq != p->hkv || p->nq != p->nkv || p->strided)
    return false;
  size_t es = attn_dtype_size(p->dt);
  int64_t H = p->hq, N = p->nq, D = p->d;
  unsigned char *buf = malloc((size_t)(p->b * N * 3 * H * D) * es);
  if (!buf)
    return false;
  const void *src[3] = {c->q, c->k, c->v};
  for (int t = 0; t < 3; t++)
    for (int64_t b = 0; b < p->b; b++)
      for (int64_t h = 0; h < H; h++)
        for (int64_t n = 0; n < N; n++)
          memcpy(buf + (size_t)((((b * N + n) * 3 + t) * H + h) * D) * es,
                 (const unsigned char *)src[t] + (size_t)(((b * H + h) * N + n) * D) * es,
                 (size_t)D * es);
  free(c->q);
  free(c->k);
  free(c->v);
  c->q = buf; /* owns the buffer; k and v point into it */
  c->k = c->v = NULL;
  int64_t *st[3] = {c->req.q_stride, c->req.k_stride, c->req.v_stride};
  for (int t = 0; t < 3; t++) {
    st[t][0] = N * 3 * H * D;
    st[t][1] = D;
    st[t][2] = 3 * H * D;
  }
  c->req.q = buf;
  c->req.k = buf + (size_t)(H * D) * es;
  c->req.v = buf + (size_t)(2 * H * D) * es;
  return true;
}

static void group_layouts(tgroup *g, int grp, attn_engine *e) {
  struct {
    tprob p;
    bool packed;
  } L[6];
  int n = 0;
  tprob p;
  p = tprob_make(2, 4, 2, 70, 90, 40, ATTN_F16);
  p.causal = 1;
  p.stats = 1;
  L[n].p = p;
  L[n++].packed = false;
  p = tprob_make(1, 2, 1, 1, 3000, 128, ATTN_BF16);
  p.stats = 1;
  L[n].p = p;
  L[n++].packed = false;
  p = tprob_make(2, 2, 2, 33, 33, 7, ATTN_F32);
  p.wl = 4;
  p.wr = 1;
  L[n].p = p;
  L[n++].packed = false;
  p = tprob_make(2, 4, 4, 129, 129, 64, ATTN_BF16);
  p.causal = 1;
  p.stats = 1;
  L[n].p = p;
  L[n++].packed = true;
  p = tprob_make(1, 3, 3, 200, 200, 128, ATTN_F16);
  L[n].p = p;
  L[n++].packed = true;
  p = tprob_make(1, 2, 2, 50, 50, 24, ATTN_F32);
  p.stats = 1;
  L[n].p = p;
  L[n++].packed = true;
  if (g_opt.small)
    n = 2;
  for (int i = 0; i < n; i++) {
    gcase gc;
    uint64_t seed = g_seed(grp, i, 0);
    gcase_init(&gc, &L[i].p, seed);
    char desc[200];
    tdesc(&L[i].p, desc, sizeof desc);
    bool made = L[i].packed ? make_qkv_packed(&gc) : make_gapped(&gc);
    tref ref;
    attn_status st = {0};
    if (!made) {
      tg_case(g, false, "%s: could not build the layout", desc);
    } else if (tref_compute(&gc.c, g_opt.ref_threads, &ref, &st) < 0) {
      tg_case(g, false, "%s: the reference failed: %s", desc, st.message);
    } else {
      printf("  (%s)\n", L[i].packed ? "Q, K, V interleaved [B, N, 3, H, D]"
                                     : "gaps of NaN after rows, heads and batches");
      run_case(g, e, &gc, &ref, seed);
      tref_free(&ref);
    }
    tcase_free(&gc.c);
  }
}

/* ---- errors --------------------------------------------------------------- */

/* Writes x at element (b, h, n, d) of tensor t (0 q, 1 k, 2 v) of c. */
static void plant(tcase *c, int t, int64_t b, int64_t h, int64_t n, int64_t d, float x) {
  void *base[3] = {c->q, c->k, c->v};
  const int64_t *s[3] = {c->req.q_stride, c->req.k_stride, c->req.v_stride};
  int64_t H = t == 0 ? c->p.hq : c->p.hkv, N = t == 0 ? c->p.nq : c->p.nkv;
  int64_t s0 = s[t][0], s1 = s[t][1], s2 = s[t][2];
  if (!s0 && !s1 && !s2) {
    s2 = c->p.d;
    s1 = N * s2;
    s0 = H * s1;
  }
  attn_store_elem(base[t], c->p.dt, (size_t)(b * s0 + h * s1 + n * s2 + d), x);
}

static void group_errors(tgroup *g, int grp, attn_engine *e) {
  static const char *const tn[3] = {"q", "k", "v"};
  const float bad[3] = {NAN, INFINITY, -INFINITY};
  int idx = 0;
  char desc[200], want[160];
  /* Non-finite values: every dtype, tensor and layout. */
  for (int dt = 0; dt < ATTN_DTYPE_COUNT; dt++)
    for (int t = 0; t < 3; t++)
      for (int strided = 0; strided < 2; strided++, idx++) {
        if (g_opt.small && idx % 5 != 0)
          continue;
        tprob p = tprob_make(2, 4, 2, 37, 45, 40, (attn_dtype)dt);
        p.strided = strided;
        p.causal = idx % 2;
        tcase c;
        tcase_init(&c, &p, g_seed(grp, idx, 0));
        int64_t b = 1, h = t == 0 ? 3 : 1, n = t == 0 ? 17 : 29, d = 5 + t;
        plant(&c, t, b, h, n, d, bad[t]);
        snprintf(want, sizeof want,
                 "tensor %s holds a non-finite value at [%lld, %lld, %lld, %lld]", tn[t],
                 (long long)b, (long long)h, (long long)n, (long long)d);
        attn_status st = {0};
        g_set_current("errors: %s", want);
        int rc = g_dead ? ATTN_EDEVICE : trun(e, &c, g_backend, &st);
        bool ok = rc == ATTN_ENONFINITE && strstr(st.message, want) != NULL;
        tg_case(g, ok, "%g in %s %s: %s: %s%s%s", (double)bad[t], tn[t],
                tdesc(&p, desc, sizeof desc), attn_err_name(rc), st.message,
                ok ? "" : "; expected ENONFINITE with: ", ok ? "" : want);
        tcase_free(&c);
      }
  /* A non-finite key that no query sees is rejected all the same (docs/design.md:
   * inputs must be finite), as the CPU backend does. */
  {
    tprob p = tprob_make(1, 2, 1, 5, 50, 32, ATTN_F16);
    p.wl = 0;
    p.wr = 0; /* rows see keys 45..49 only */
    tcase c;
    tcase_init(&c, &p, g_seed(grp, idx++, 0));
    plant(&c, 1, 0, 0, 3, 0, INFINITY);
    attn_status st = {0}, sc = {0};
    int rc = g_dead ? ATTN_EDEVICE : trun(e, &c, g_backend, &st);
    int rcpu = trun(e, &c, "cpu", &sc);
    bool ok = rc == ATTN_ENONFINITE && rcpu == ATTN_ENONFINITE;
    tg_case(g, ok, "inf in a key no query sees: %s %s (%s), cpu %s", g_backend, attn_err_name(rc),
            st.message, attn_err_name(rcpu));
    tcase_free(&c);
  }
  /* Scores that overflow F32 for real (not only by the magnitude bound):
   * a query row and a key row of 1e20 (F32, BF16), or scale 1e37 (F16). */
  for (int dt = 0; dt < ATTN_DTYPE_COUNT; dt++) {
    tprob p = tprob_make(1, 2, 1, 64, 64, 64, (attn_dtype)dt);
    float big = 1e20f;
    if (dt == ATTN_F16) {
      p.scale = 1e37;
      big = 2.0f;
    }
    tcase c;
    tcase_init(&c, &p, g_seed(grp, idx++, 0));
    for (int d = 0; d < 64; d++) {
      plant(&c, 0, 0, 1, 5, d, big);
      plant(&c, 1, 0, 0, 9, d, big);
    }
    attn_status st = {0}, sc = {0};
    g_set_current("errors: ERANGE %s", attn_dtype_name(p.dt));
    int rc = g_dead ? ATTN_EDEVICE : trun(e, &c, g_backend, &st);
    int rcpu = trun(e, &c, "cpu", &sc);
    tg_case(g, rc == ATTN_ERANGE, "scores past FLT_MAX, %s: %s %s: %s (cpu: %s)",
            tdesc(&p, desc, sizeof desc), g_backend, attn_err_name(rc), st.message,
            attn_err_name(rcpu));
    tcase_free(&c);
  }
  /* Values near FLT_MAX: the output (a convex combination) is finite, but
   * unnormalized sums may not be. ERANGE (the shared magnitude check) or
   * the exact answer pass; inf or NaN in O fails. */
  {
    tprob p = tprob_make(1, 1, 1, 8, 8, 16, ATTN_F32);
    p.stats = 1;
    gcase gc;
    gcase_init(&gc, &p, g_seed(grp, idx++, 0));
    uint64_t s = g_seed(grp, idx, 1);
    for (int n = 0; n < 8; n++)
      for (int d = 0; d < 16; d++)
        plant(&gc.c, 2, 0, 0, n, d, tuniform(&s) < 0 ? -3e38f : 3e38f);
    attn_status st = {0};
    int rc = g_dead ? ATTN_EDEVICE : trun(e, &gc.c, g_backend, &st);
    bool ok = rc == ATTN_ERANGE;
    double eo = -1;
    if (rc == 0) {
      terr er = tcheck(&gc.c);
      eo = er.o;
      ok = g_pass(&er, p.dt, true);
    }
    tg_case(g, ok, "values of 3e38 (F32): %s %s%s%s (O error %.3g)", g_backend, attn_err_name(rc),
            rc ? ": " : "", st.message, eo);
    tcase_free(&gc.c);
  }
  /* The backend still serves after refusing inputs. */
  tprob p = tprob_make(1, 4, 2, 100, 120, 64, ATTN_BF16);
  p.causal = 1;
  p.stats = 1;
  one_problem(g, e, &p, g_seed(grp, idx++, 0));
}

/* ---- the stream pool -------------------------------------------------------- */

#define POOL_JOBS 64

typedef struct pjob {
  gcase gc;
  tref ref;
  bool have_ref;
  unsigned char *first; /* O of the first cycle */
  int calls, rc;
  char msg[ATTN_MSG_MAX + 16];
  const char *backend;
  bool submitted;
} pjob;

typedef struct pool_ctx {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int pending;
  pjob *jobs;
  int njobs, nthreads, t;
  attn_engine *e;
} pool_ctx;

typedef struct pool_arg {
  pool_ctx *ctx;
  pjob *job;
} pool_arg;

static pool_arg g_pool_args[POOL_JOBS];

static void pool_done(const attn_result *res, void *arg) {
  pool_arg *a = arg;
  pool_ctx *ctx = a->ctx;
  pthread_mutex_lock(&ctx->mu);
  a->job->calls++;
  a->job->rc = res->status.code;
  snprintf(a->job->msg, sizeof a->job->msg, "%s", res->status.message);
  a->job->backend = res->backend;
  if (--ctx->pending == 0)
    pthread_cond_broadcast(&ctx->cv);
  pthread_mutex_unlock(&ctx->mu);
}

typedef struct submitter {
  pool_ctx *ctx;
  int first;
  pthread_t tid;
} submitter;

/* Submits jobs first, first + nthreads, ... */
static void *submit_some(void *arg) {
  submitter *sb = arg;
  pool_ctx *ctx = sb->ctx;
  for (int i = sb->first; i < ctx->njobs; i += ctx->nthreads) {
    pjob *j = &ctx->jobs[i];
    j->gc.c.req.backend = g_backend;
    attn_status st = {0};
    int rc = attn_engine_submit(ctx->e, &j->gc.c.req, pool_done, &g_pool_args[i], &st);
    pthread_mutex_lock(&ctx->mu);
    j->submitted = rc == 0;
    if (rc != 0) {
      j->rc = rc;
      snprintf(j->msg, sizeof j->msg, "submit: %s", st.message);
      if (--ctx->pending == 0)
        pthread_cond_broadcast(&ctx->cv);
    }
    pthread_mutex_unlock(&ctx->mu);
  }
  return NULL;
}

static tprob pool_prob(int j) {
  static const int64_t ns[] = {1, 17, 64, 100, 257, 512, 777};
  static const int64_t ds[] = {16, 37, 64, 80, 128, 256, 8, 100};
  int64_t hkv = 1 + j % 4, hq = hkv * (1 + (j / 4) % 3);
  int64_t nq = ns[j % 7], nkv = ns[(j * 3 + 2) % 7], d = ds[(j * 5) % 8];
  tprob p = tprob_make(1 + (j / 12) % 2, hq, hkv, nq, nkv, d, (attn_dtype)(j % 3));
  if (j % 16 == 15) { /* a few larger jobs among the small ones */
    p = tprob_make(1, 8, 2, 1024, 1024, 128, j % 32 == 15 ? ATTN_F16 : ATTN_BF16);
  }
  if (j % 21 == 20) /* and a decode that splits */
    p = tprob_make(1, 16, 4, 1, 16384, 128, ATTN_BF16);
  p.causal = j % 3 == 1;
  if (j % 5 == 4) {
    p.wl = 50;
    p.wr = p.causal ? 0 : 10;
  }
  p.stats = j % 2 == 0;
  p.strided = j % 4 == 3;
  return p;
}

/*
 * One open / run-all / close cycle on an engine with 4 streams. Cycle 0
 * draws the inputs and computes the references; later cycles rerun the same
 * inputs and also compare bits with cycle 0. Returns failed jobs.
 */
static int pool_cycle(tgroup *g, int grp, int cycle, pjob *jobs, int njobs) {
  attn_config cfg;
  attn_config_init(&cfg);
  cfg.cuda_streams = 4;
  attn_engine *e = NULL;
  attn_status st = {0};
  if (attn_engine_open(&cfg, &e, &st) < 0) {
    tg_case(g, false, "cycle %d: engine open failed: %s", cycle, st.message);
    return njobs;
  }
  pool_ctx ctx = {.jobs = jobs, .njobs = njobs, .nthreads = 4, .e = e, .pending = njobs};
  pthread_mutex_init(&ctx.mu, NULL);
  pthread_cond_init(&ctx.cv, NULL);
  for (int i = 0; i < njobs; i++) {
    pjob *j = &jobs[i];
    if (cycle == 0) {
      tprob p = pool_prob(i);
      gcase_init(&j->gc, &p, g_seed(grp, i, 0));
    }
    gcase_poison(&j->gc);
    j->calls = 0;
    j->rc = -1;
    j->msg[0] = 0;
    j->backend = NULL;
    j->submitted = false;
    g_pool_args[i].ctx = &ctx;
    g_pool_args[i].job = j;
  }
  g_set_current("pool: cycle %d, %d jobs in flight", cycle, njobs);
  double t0 = now_s();
  submitter sb[4];
  for (int t = 0; t < ctx.nthreads; t++) {
    sb[t].ctx = &ctx;
    sb[t].first = t;
    if (pthread_create(&sb[t].tid, NULL, submit_some, &sb[t]) != 0)
      submit_some(&sb[t]), sb[t].tid = 0;
  }
  for (int t = 0; t < ctx.nthreads; t++)
    if (sb[t].tid)
      pthread_join(sb[t].tid, NULL);
  /* Wait for the callbacks, at most two minutes: a job that never completes
   * must fail this test, not hang it (close would wait for it forever). */
  struct timespec dl;
  clock_gettime(CLOCK_REALTIME, &dl);
  dl.tv_sec += 120;
  pthread_mutex_lock(&ctx.mu);
  int rcw = 0;
  while (ctx.pending > 0 && rcw == 0)
    rcw = pthread_cond_timedwait(&ctx.cv, &ctx.mu, &dl);
  int left = ctx.pending;
  pthread_mutex_unlock(&ctx.mu);
  double secs = now_s() - t0;
  if (left > 0) {
    tg_case(g, false, "cycle %d: %d of %d jobs never completed within 120 s", cycle, left, njobs);
    printf("gpu tests: FAIL: the stream pool hung; exiting without closing the engine\n");
    fflush(stdout);
    _exit(1);
  }
  printf("  cycle %d: %d jobs completed in %.2f s\n", cycle, njobs, secs);
  attn_engine_close(e);
  pthread_cond_destroy(&ctx.cv);
  pthread_mutex_destroy(&ctx.mu);
  int fails = 0;
  for (int i = 0; i < njobs; i++) {
    pjob *j = &jobs[i];
    tcase *c = &j->gc.c;
    char desc[200];
    tdesc(&c->p, desc, sizeof desc);
    if (cycle == 0 && !j->have_ref) {
      if (tref_compute(c, g_opt.ref_threads, &j->ref, &st) < 0) {
        tg_case(g, false, "job %d %s: the reference failed: %s", i, desc, st.message);
        fails++;
        continue;
      }
      j->have_ref = true;
    }
    bool ok = j->submitted && j->calls == 1 && j->rc == 0 && j->backend &&
              strcmp(j->backend, g_backend) == 0;
    terr er = {.o = INFINITY};
    ok = ok && j->have_ref;
    if (ok) {
      er = tref_check(c, &j->ref);
      tg_errors(g, c->p.dt, &er, c->p.stats);
      ok = g_pass(&er, c->p.dt, c->p.stats);
    }
    size_t obytes = j->gc.o_elems * attn_dtype_size(c->p.dt);
    if (ok && cycle == 0) {
      j->first = malloc(obytes);
      if (j->first)
        memcpy(j->first, c->o, obytes);
    } else if (ok && j->first && memcmp(j->first, c->o, obytes) != 0) {
      g->nondet++;
    }
    tg_case(g, ok, "cycle %d job %2d %s: %s%s%s, %d callback(s), backend %s, O %.2e stats %.2e",
            cycle, i, desc, j->rc == 0 ? "OK" : attn_err_name(j->rc), j->msg[0] ? ": " : "", j->msg,
            j->calls, j->backend ? j->backend : "-", er.o, er.stats);
    fails += !ok;
  }
  return fails;
}

static int mem_free(size_t *pfree) {
  size_t fr = 0, total = 0;
  if (GCK(cudaSetDevice(0)) || GCK(cudaFree(0)) || GCK(cudaMemGetInfo(&fr, &total)))
    return -1;
  *pfree = fr;
  return 0;
}

static void group_pool(tgroup *g, int grp) {
  static pjob jobs[POOL_JOBS];
  memset(jobs, 0, sizeof jobs);
  int njobs = g_opt.small ? 8 : POOL_JOBS;
  if (g_dead) {
    tg_case(g, false, "not run (CUDA context broken earlier)");
    return;
  }
  /*
   * Device memory before the first open and after each close. cudaMemGetInfo
   * counts the whole device, in pages of 2 MiB. After the first cycle we
   * allow 64 MiB: what the CUDA context (not the engine) keeps for the rest
   * of the process, such as code of kernels this process runs for the first
   * time (lazy module loading) and a grown local-memory reservation for
   * kernels with stack frames; an engine that leaked its jobs' buffers would
   * keep ~160 MiB here (what the 64 jobs' tensors add up to). The second cycle
   * runs the same kernels, so the context does not grow again: memory that
   * goes missing then (over 16 MiB) is a leak per open/close.
   */
  size_t f0 = 0, f1 = 0, f2 = 0, stack0 = 0, stack1 = 0;
  bool mem = !g_opt.small && on_gpu(); /* the sanitizers change the device's memory use */
  if (mem && (mem_free(&f0) < 0 || GCK(cudaDeviceGetLimit(&stack0, cudaLimitStackSize))))
    mem = false;
  pool_cycle(g, grp, 0, jobs, njobs);
  if (mem && (mem_free(&f1) < 0 || GCK(cudaDeviceGetLimit(&stack1, cudaLimitStackSize))))
    mem = false;
  if (!g_opt.small)
    pool_cycle(g, grp, 1, jobs, njobs);
  if (mem && mem_free(&f2) < 0)
    mem = false;
  if (mem) {
    double d1 = ((double)f0 - (double)f1) / (1 << 20), d2 = ((double)f1 - (double)f2) / (1 << 20);
    printf("  device memory free: %.0f MiB before, %.0f after cycle 0, %.0f after cycle 1"
           " (stack limit %zu -> %zu bytes)\n",
           (double)f0 / (1 << 20), (double)f1 / (1 << 20), (double)f2 / (1 << 20), stack0, stack1);
    tg_case(g, d1 < 64, "device memory after the first open/close: %.0f MiB less free (limit 64)",
            d1);
    tg_case(g, d2 < 16, "device memory after the second open/close: %.0f MiB less free (limit 16)",
            d2);
    snprintf(g->note, sizeof g->note, "memory lost: %.0f MiB after cycle 0, %.0f after cycle 1", d1,
             d2);
  } else if (!g_opt.small && on_gpu()) {
    tg_case(g, false, "device memory could not be measured");
  }
  for (int i = 0; i < njobs; i++) {
    tcase_free(&jobs[i].gc.c);
    if (jobs[i].have_ref)
      tref_free(&jobs[i].ref);
    free(jobs[i].first);
  }
}

/* ---- the backward pass ---------------------------------------------------------- */

static int list_backward(tprob *ps) {
  static const int64_t ds[] = {1, 16, 37, 64, 80, 128, 200, 256};
  int n = 0;
  for (int i = 0; i < (int)(sizeof ds / sizeof *ds); i++)
    for (int t = 0; t < ATTN_DTYPE_COUNT; t++) {
      int k = i * 3 + t;
      int64_t hkv = 1 + k % 2, hq = hkv * (1 + k % 3);
      int64_t nq = 1 + 37 * (k % 5) + (k % 3) * 64,
              nkv = k % 4 == 3 ? nq / 2 + 1 : nq + 19 * (k % 4);
      tprob p = tprob_make(1 + k % 2, hq, hkv, nq, nkv, ds[i], (attn_dtype)t);
      p.causal = k % 4 == 1 || k % 4 == 3; /* k % 4 == 3: Nq > Nkv, rows with no key */
      if (k % 4 == 2) {
        p.wl = 40;
        p.wr = 3;
      }
      p.strided = k % 3 == 1;
      ps[n++] = p;
    }
  /* explicit diag_offset: top-left causal, and shifts that mask whole rows */
  static const int64_t diag[] = {0, -50, 90};
  for (int i = 0; i < 3; i++) {
    tprob p = tprob_make(1, 4, 2, 130, 200 - 60 * i, i == 1 ? 37 : 64, (attn_dtype)i);
    p.diag = diag[i];
    p.causal = true;
    p.wl = i == 2 ? 30 : -1;
    ps[n++] = p;
  }
  /* softcap (dS times 1 − tanh²) and ALiBi on every backward instance */
  static const int64_t vd[] = {61, 128, 253};
  for (int i = 0; i < 3; i++)
    for (int t = 0; t < ATTN_DTYPE_COUNT; t++) {
      tprob p = tprob_make(2, 4, 2, 90, 130, vd[i], (attn_dtype)t);
      p.softcap = (i + t) % 3 == 2 ? 0 : 1.5 + i;
      p.alibi = 1 + (i + t) % 2;
      p.causal = (i + t) % 2 == 0;
      ps[n++] = p;
    }
  return n;
}

/* Where c's gradient t (dq, dk, dv) lies and its bytes: the region
 * tcase_poison_grads covers. */
static void *grad_at(const tcase *c, int t, size_t *bytes) {
  const tprob *p = &c->p;
  int64_t rows = t == 0 ? p->b * p->hq * p->nq : p->b * p->hkv * p->nkv;
  *bytes = (size_t)(rows * p->d) * attn_dtype_size(p->dt);
  return t == 0 ? c->dq : t == 1 ? c->dk : c->dv;
}

/* Whether the second run's gradients equal the first's (saved) bit for
 * bit: all three, or on the atomic path dk and dv; why when not. */
static bool grads_repeat(const tcase *c, void *const saved[3], bool atomic, char *why, size_t cap) {
  static const char *const names[3] = {"dq", "dk", "dv"};
  for (int t = atomic ? 1 : 0; t < 3; t++) {
    size_t n;
    const void *x = grad_at(c, t, &n);
    if (saved[t] && memcmp(x, saved[t], n) != 0) {
      snprintf(why, cap, "run 2's %s differs from run 1's bit for bit (%s)", names[t],
               atomic ? "the atomic path computes dk and dv without atomics"
                      : "the deterministic backward must repeat exactly");
      return false;
    }
  }
  return true;
}

/* One backward problem on the backend, with and without the forward's
 * lse, each run twice after poisoning dq, dk, dv; atomic: the engine takes
 * the atomic dQ path (the kernel named in the report says so). */
static void backward_problem(tgroup *g, attn_engine *e, const tprob *p, uint64_t seed,
                             bool atomic) {
  char desc[200], kn[48];
  tdesc(p, desc, sizeof desc);
  for (int with_lse = 0; with_lse < 2; with_lse++) {
    tcase c;
    tref_bwd ref = {0};
    attn_status st = {0};
    tcase_init(&c, p, seed);
    if (tcase_backward(&c, with_lse, ~seed, &st) < 0 || tref_bwd_compute(&c, &ref, &st) < 0) {
      tg_case(g, false, "%s: the reference failed: %s", desc, st.message);
      tcase_free(&c);
      continue;
    }
    attn_cu_params prm;
    attn_cu_choice ch;
    tcu_params(p, &prm);
    prm.pass = ATTN_BACKWARD;
    prm.bwd_atomic_dq = atomic;
    bool sel = attn_cu_select(&prm, g_sms, &ch, &st) == 0;
    snprintf(kn, sizeof kn, "[%s%s]", sel ? attn_cu_kernel_name(ch.kernel) : "select refuses",
             sel && attn_cu_is_atomic_dq(&ch) ? " atomic dQ" : "");
    g_set_current("%s: %s lse %d", g->name, desc, with_lse);
    bool ok = !g_dead;
    char why[300] = "";
    terr_bwd worst = {0, 0, 0, true};
    void *saved[3] = {NULL, NULL, NULL}; /* run 1's gradients */
    for (int run = 0; run < 2 && ok; run++) {
      tcase_poison_grads(&c);
      int rc = trun(e, &c, g_backend, &st);
      if (rc != 0) {
        snprintf(why, sizeof why, "run %d: %s: %s", run + 1, attn_err_name(rc), st.message);
        if (on_gpu() && (rc == ATTN_EDEVICE || rc == ATTN_ENODEV))
          probe_context();
        ok = false;
        break;
      }
      terr_bwd err = tref_bwd_check(&c, &ref);
      worst.dq = fmax(worst.dq, err.dq), worst.dk = fmax(worst.dk, err.dk);
      worst.dv = fmax(worst.dv, err.dv);
      terr te = {.o = fmax(err.dq, fmax(err.dk, err.dv)), .masked_ok = true};
      tg_errors(g, p->dt, &te, false);
      if (!terr_bwd_within(&err, g_tol_o(p->dt))) {
        snprintf(why, sizeof why, "run %d: dq %.3g dk %.3g dv %.3g (tol %.0e)", run + 1, err.dq,
                 err.dk, err.dv, g_tol_o(p->dt));
        ok = false;
      }
      for (int t = 0; ok && run == 0 && t < 3; t++) {
        size_t n;
        const void *x = grad_at(&c, t, &n);
        if ((saved[t] = malloc(n)))
          memcpy(saved[t], x, n);
      }
      if (ok && run == 1)
        ok = grads_repeat(&c, saved, atomic, why, sizeof why);
    }
    for (int t = 0; t < 3; t++)
      free(saved[t]);
    if (ok)
      tg_case(g, true, "%s %s lse %d: dq %.2e dk %.2e dv %.2e", desc, kn, with_lse, worst.dq,
              worst.dk, worst.dv);
    else
      tg_case(g, false, "%s %s lse %d seed %#" PRIx64 ": %s", desc, kn, with_lse, seed,
              g_dead ? "not run (CUDA context broken earlier)" : why);
    tref_bwd_free(&ref);
    tcase_free(&c);
  }
}

static void group_backward(tgroup *g, int grp, attn_engine *e, bool atomic) {
  tprob ps[TCASES_MAX];
  int n = list_backward(ps);
  for (int i = 0; i < n && (!g_opt.small || i < 6); i++)
    backward_problem(g, e, &ps[i], g_seed(grp, i, 0), atomic);
}

/* Why the engine's cuda backend lists the atomic dQ path as disabled, or
 * NULL. */
static const char *atomic_disabled(attn_engine *e, attn_backend_info *info, int cap) {
  int n = attn_engine_backends(e, info, cap);
  for (int i = 0; i < n && i < cap; i++)
    for (int k = 0; !strcmp(info[i].name, "cuda") && k < info[i].ndisabled; k++)
      if (!strcmp(info[i].disabled[k].kernel, "bwd_atomic_dq"))
        return info[i].disabled[k].why;
  return NULL;
}

/* The backward cases on an engine that takes the atomic dQ path: the same
 * float64 check (dQ's last bits vary from run to run, within the same
 * tolerance). A path the self-check turned off fails the group, or these
 * cases would pass on the two-kernel path and prove nothing. */
static void group_backward_atomic(tgroup *g, int grp) {
  attn_config cfg;
  attn_config_init(&cfg);
  cfg.cuda_bwd_atomic_dq = true;
  attn_engine *e;
  attn_status st;
  if (attn_engine_open(&cfg, &e, &st) < 0) {
    tg_case(g, false, "opening an engine with cuda_bwd_atomic_dq: %s", st.message);
    return;
  }
  attn_backend_info info[4];
  const char *why = atomic_disabled(e, info, 4);
  if (why)
    tg_case(g, false, "the self-check turned the atomic dQ path off: %s", why);
  else
    group_backward(g, grp, e, true);
  attn_engine_close(e);
}

/* ---- main ------------------------------------------------------------------- */

enum {
  G_SIZES,
  G_MASKS,
  G_SHAPES,
  G_MASKED,
  G_DIAG,
  G_HEADDIMS,
  G_DECODE,
  G_LONG,
  G_LAYOUTS,
  G_ERRORS,
  G_KAPI,
  G_HOPPER,
  G_POOL,
  G_BACKWARD,
  G_BACKWARD_ATOMIC,
  G_SMALL,
  G_SESSIONS,
  G_SINKS,
  G_COUNT
};
static const char *const gnames[G_COUNT] = {
    "conf/sizes", "conf/masks", "conf/shapes",     "conf/masked", "conf/diag", "headdims",
    "decode",     "long",       "layouts",         "errors",      "kapi",      "hopper",
    "pool",       "backward",   "backward_atomic", "small",       "sessions",  "sinks"};

static bool wanted(const char *filter, const char *name) {
  if (!filter)
    return true;
  size_t n = strlen(name);
  for (const char *p = filter; *p;) {
    const char *end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    if ((len == n && strncmp(p, name, n) == 0) ||
        (len > 0 && p[len - 1] == '*' && strncmp(p, name, len - 1) == 0))
      return true;
    p += len + (end ? 1 : 0);
  }
  return false;
}

static void usage(FILE *f) {
  fprintf(f, "usage: tests/gpu [--small] [--group NAME[,NAME...]] [--seed N] [--quiet]\n"
             "                 [--timeout SECONDS] [--list]\n"
             "  --small    a handful of small cases per group (for compute-sanitizer)\n"
             "  --group    only these groups (a trailing * matches a prefix: conf/*)\n"
             "  --seed     base seed of the inputs (printed by every run)\n"
             "  --quiet    print failed cases only\n"
             "  --timeout  watchdog for the whole run (default 600 s)\n"
             "  --backend  cpu: run the engine groups on the CPU backend (a self-check of\n"
             "             this program on a machine without a GPU)\n"
             "Without a usable CUDA device it prints 'gpu tests: skipped: ...' and exits 0;\n"
             "with ATTN_GPU_REQUIRE=1 in the environment that is a failure instead.\n");
}

static void summary(tgroup *gs, int n, double secs) {
  int cases = 0, failed = 0;
  printf("\ngpu tests: summary (seed %#" PRIx64 ", %.1f s)\n", g_opt.seed, secs);
  printf("%-12s %5s %5s %5s  %-9s %-9s %-9s %-9s %6s %5s %6s\n", "group", "cases", "pass", "fail",
         "O F32", "O F16", "O BF16", "stats", "split", "nondet", "secs");
  for (int i = 0; i < n; i++) {
    tgroup *g = &gs[i];
    char w[4][16];
    for (int t = 0; t < 3; t++)
      if (g->worst_o[t] < 0)
        snprintf(w[t], sizeof w[t], "-");
      else
        snprintf(w[t], sizeof w[t], "%.2e", g->worst_o[t]);
    if (g->worst_stats < 0)
      snprintf(w[3], sizeof w[3], "-");
    else
      snprintf(w[3], sizeof w[3], "%.2e", g->worst_stats);
    printf("%-12s %5d %5d %5d  %-9s %-9s %-9s %-9s %6d %5d %6.1f\n", g->name, g->cases, g->passed,
           g->failed, w[0], w[1], w[2], w[3], g->split, g->nondet, g->seconds);
    cases += g->cases;
    failed += g->failed;
  }
  printf("thresholds: O F32 %.0e, F16 %.0e, BF16 %.0e; stats F32 %.0e, F16/BF16 %.0e\n",
         g_tol_o(ATTN_F32), g_tol_o(ATTN_F16), g_tol_o(ATTN_BF16), g_tol_stats(ATTN_F32),
         g_tol_stats(ATTN_F16));
  if (failed)
    printf("gpu tests: FAIL (%d of %d cases failed; rerun with --seed %#" PRIx64 ")\n", failed,
           cases, g_opt.seed);
  else
    printf("gpu tests: PASS (%d cases in %d groups)\n", cases, n);
  fflush(stdout);
}

int main(int argc, char **argv) {
  const char *filter = NULL;
  bool have_seed = false, list = false;
  g_opt.verbose = true;
  g_opt.timeout_s = 600;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--small") == 0) {
      g_opt.small = true;
    } else if (strcmp(a, "--quiet") == 0 || strcmp(a, "-q") == 0) {
      g_opt.verbose = false;
    } else if (strcmp(a, "--list") == 0) {
      list = true;
    } else if ((strcmp(a, "--group") == 0 || strcmp(a, "--filter") == 0) && i + 1 < argc) {
      filter = argv[++i];
    } else if (strcmp(a, "--seed") == 0 && i + 1 < argc) {
      char *end;
      g_opt.seed = strtoull(argv[++i], &end, 0);
      if (*end) {
        fprintf(stderr, "tests/gpu: bad --seed %s\n", argv[i]);
        return 2;
      }
      have_seed = true;
    } else if (strcmp(a, "--backend") == 0 && i + 1 < argc) {
      g_backend = argv[++i];
    } else if (strcmp(a, "--timeout") == 0 && i + 1 < argc) {
      g_opt.timeout_s = atoi(argv[++i]);
    } else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      usage(stdout);
      return 0;
    } else {
      fprintf(stderr, "tests/gpu: unknown argument %s\n", a);
      usage(stderr);
      return 2;
    }
  }
  if (list) {
    for (int i = 0; i < G_COUNT; i++)
      printf("%s\n", gnames[i]);
    return 0;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);

  /* Is there a device the cuda backend can use? */
  int ndev = 0;
  cudaError_t de = on_gpu() ? cudaGetDeviceCount(&ndev) : cudaSuccess;
  attn_engine *e = NULL;
  attn_status st = {0};
  attn_config cfg;
  attn_config_init(&cfg);
  if (attn_engine_open(&cfg, &e, &st) < 0) {
    printf("gpu tests: FAIL: engine open failed: %s\n", st.message);
    return 1;
  }
  attn_backend_info info[8];
  int nb = attn_engine_backends(e, info, 8);
  const attn_backend_info *cu = NULL;
  for (int i = 0; i < nb && i < 8; i++)
    if (strcmp(info[i].name, "cuda") == 0)
      cu = &info[i];
  if (on_gpu() && (!cu || !cu->available)) {
    char why[200];
    if (!cu)
      snprintf(why, sizeof why, "this build has no CUDA backend (built without CUDA)");
    else
      snprintf(why, sizeof why, "%s", cu->detail);
    attn_engine_close(e);
    const char *req = getenv("ATTN_GPU_REQUIRE");
    if (cu && de == cudaSuccess && ndev > 0) {
      printf("gpu tests: FAIL: the CUDA runtime sees %d device(s) but backend cuda is "
             "unavailable: %s\n",
             ndev, why);
      return 1;
    }
    if (req && *req && strcmp(req, "0") != 0) {
      printf("gpu tests: FAIL: no usable CUDA device (%s; runtime: %s) and ATTN_GPU_REQUIRE "
             "is set\n",
             why, de == cudaSuccess ? "no device" : cudaGetErrorString(de));
      return 1;
    }
    printf("gpu tests: skipped: %s\n", why);
    return 0;
  }

  if (!have_seed) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    g_opt.seed = ((uint64_t)ts.tv_sec << 20) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 40);
  }
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  g_opt.ref_threads = cpus > 0 ? (int)(cpus < 32 ? cpus : 32) : 1;
  g_sms = 132; /* an H100/H200, for the kernel choices printed with --backend cpu */
  if (on_gpu() && (GCK(cudaSetDevice(0)) ||
                   GCK(cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, 0)))) {
    printf("gpu tests: FAIL: cannot query device 0\n");
    attn_engine_close(e);
    return 1;
  }
  signal(SIGALRM, on_alarm);
  if (g_opt.timeout_s > 0)
    alarm((unsigned)g_opt.timeout_s);
  if (on_gpu())
    printf("gpu tests: backend cuda: %s\n", cu->detail);
  else
    printf("gpu tests: backend %s (a self-check: no CUDA call is made)\n", g_backend);
  printf("gpu tests: seed %#" PRIx64 " (rerun: --seed %#" PRIx64 "), %d SMs, reference on %d "
         "threads%s\n",
         g_opt.seed, g_opt.seed, g_sms, g_opt.ref_threads, g_opt.small ? ", --small" : "");

  double t0 = now_s();
  tgroup groups[G_COUNT];
  int ng = 0;
  tprob ps[TCASES_MAX];
  static const int order[G_COUNT] = {
      G_SMALL,    G_SIZES,  G_MASKS,    G_SHAPES,          G_MASKED,   G_DIAG,
      G_HEADDIMS, G_DECODE, G_LONG,     G_LAYOUTS,         G_ERRORS,   G_KAPI,
      G_HOPPER,   G_POOL,   G_BACKWARD, G_BACKWARD_ATOMIC, G_SESSIONS, G_SINKS};
  for (int oi = 0; oi < G_COUNT; oi++) {
    int gi = order[oi];
    /* --small replaces the long case lists by "small"; the rest shrink */
    if (g_opt.small ? gi <= G_LONG : gi == G_SMALL)
      continue;
    if (!wanted(filter, gnames[gi]) ||
        ((gi == G_KAPI || gi == G_HOPPER || gi == G_SESSIONS || gi == G_BACKWARD_ATOMIC) &&
         !on_gpu()))
      continue;
    tgroup *g = &groups[ng++];
    tg_begin(g, gnames[gi]);
    int n = 0;
    switch (gi) {
    case G_SIZES: n = tcases_sizes(ps); break;
    case G_MASKS: n = tcases_masks(ps); break;
    case G_SHAPES: n = tcases_shapes(ps); break;
    case G_MASKED: n = tcases_masked_rows(ps); break;
    case G_DIAG: n = tcases_diag(ps); break;
    case G_HEADDIMS: n = list_headdims(ps); break;
    case G_DECODE: n = list_decode(ps); break;
    case G_LONG: n = list_long(ps); break;
    case G_SMALL: n = list_small(ps); break;
    case G_LAYOUTS: group_layouts(g, gi, e); break;
    case G_ERRORS: group_errors(g, gi, e); break;
    case G_KAPI: group_kapi(g, gi); break;
    case G_HOPPER: group_hopper(g, gi); break;
    case G_POOL: group_pool(g, gi); break;
    case G_BACKWARD: group_backward(g, gi, e, false); break;
    case G_BACKWARD_ATOMIC: group_backward_atomic(g, gi); break;
    case G_SESSIONS: group_sessions(g, gi, e); break;
    case G_SINKS:
      n = list_sinks(ps);
      n = g_opt.small && n > 4 ? 4 : n;
      break;
    default: break;
    }
    if (n)
      run_list(g, gi, e, ps, n);
    if (gi == G_SINKS)
      group_sinks(g, gi, e, g_backend);
    if (gi == G_DECODE && !g->split)
      snprintf(g->note, sizeof g->note, "WARNING: no case took the split-KV path");
    tg_end(g);
  }
  attn_engine_close(e);
  alarm(0);
  summary(groups, ng, now_s() - t0);
  int failed = 0;
  for (int i = 0; i < ng; i++)
    failed += groups[i].failed;
  return failed || g_dead ? 1 : 0;
}
#endif /* ATTN_HAVE_CUDA */
