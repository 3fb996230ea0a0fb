/*
 * gpu_test.h — what the files of the GPU test program (tests/gpu/test_*.c)
 * share: options, groups of cases with their counts and worst errors, the
 * thresholds, and CUDA error checks that report and carry on (a failed call
 * fails its case; a context that a fault has broken ends the run cleanly).
 */
#ifndef ATTN_GPU_TEST_H
#define ATTN_GPU_TEST_H

#include "cases.h"
#include "helpers.h"
#include "kernels.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct gopts {
  uint64_t seed;   /* base seed; each case and run derives its own */
  bool small;      /* a handful of small cases (for compute-sanitizer) */
  bool verbose;    /* a line for every case, not only failures */
  int ref_threads; /* threads of the float64 reference */
  int timeout_s;   /* watchdog for the whole program */
} gopts;

extern gopts g_opt;
/* Set once a CUDA call reports a sticky error: the context is unusable. */
extern bool g_dead;
/* Multiprocessors of device 0 (for attn_cu_select). */
extern int g_sms;

typedef struct tgroup {
  const char *name;
  int cases, passed, failed;
  double worst_o[ATTN_DTYPE_COUNT]; /* -1: no case of that dtype */
  double worst_stats;               /* -1: no statistics checked */
  int nondet;                       /* cases whose two runs differ in bits */
  int split;                        /* cases the selector splits (nsplit > 1) */
  double seconds;
  char note[160];
} tgroup;

void tg_begin(tgroup *g, const char *name);
void tg_end(tgroup *g);
/* Counts a case and prints its line (always when it failed). */
void tg_case(tgroup *g, bool ok, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Records a case's errors in the group's worst. */
void tg_errors(tgroup *g, attn_dtype dt, const terr *e, bool stats);

/* Thresholds on the normalized O error and the statistics error. */
double g_tol_o(attn_dtype dt);
double g_tol_stats(attn_dtype dt);
/* Whether e passes for a problem of dtype dt (with or without stats). */
bool g_pass(const terr *e, attn_dtype dt, bool stats);
/* Records run's errors in g and judges them; on failure writes why. */
bool g_judge(tgroup *g, attn_dtype dt, bool stats, const terr *e, int run, char *why, size_t cap);

/* Seed of case idx of group grp, run `run`. */
uint64_t g_seed(int grp, int idx, int run);

/* What the watchdog prints if the program hangs. */
void g_set_current(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Checks a cudaError_t; prints what failed and returns -1, or 0. */
int g_cuda_check(int err, const char *what, const char *file, int line);
#define GCK(call) g_cuda_check((int)(call), #call, __FILE__, __LINE__)

/* The kernel the selector picks for p on this device (false: it refuses). */
bool g_choice(const tprob *p, attn_cu_choice *ch);

/* Group d: attn_cu_select + attn_cu_launch on buffers of our own. */
void group_kapi(tgroup *g, int grp);
/* Group "hopper": the same on the Hopper instance (skipped off sm_90a). */
void group_hopper(tgroup *g, int grp);
/* Group "sessions": a session store on the device through the engine. */
void group_sessions(tgroup *g, int grp, attn_engine *e);
/* Group "sinks" after its forward list: the backward with dsinks on
 * backend, and (backend cuda) a session on the device with sinks. */
void group_sinks(tgroup *g, int grp, attn_engine *e, const char *backend);

#endif
