/*
 * hold_backend.c — the float64 reference backend behind a gate, for
 * build/tests/attnd-hold only: a test that needs a job still running when
 * it acts (a deadline, a hang-up, a full slot) gets one whatever the
 * machine's speed, instead of a problem big enough to be slow.
 *
 * The test server is linked with -Wl,--wrap=attn__reference_backend, so the
 * engine's table names this one where it names the reference; the engine
 * itself is unchanged and attnd never contains it. A job of backend
 * "reference" then waits, polling every few milliseconds, until
 *
 *   - its caller cancels it, when $ATTN_HOLD_RELEASE is unset: it completes
 *     with ATTN_ECANCELED, as a reference job stopped between heads does;
 *   - the file named by $ATTN_HOLD_RELEASE exists (a test creates it), or
 *     $ATTN_HOLD_MAX_S seconds (default 60) have passed. A job canceled by
 *     then completes with ATTN_ECANCELED (with the variable set, a job is as
 *     one long head: canceled, it still holds its slot until released);
 *     any other runs on the real reference backend, so a held job is never
 *     answered wrongly, only late.
 *
 * The cpu backend is wrapped the same way (-Wl,--wrap=attn__cpu_backend):
 * with $ATTN_HOLD_CPU_Q0 set, its F32 jobs whose first query element is that
 * value are held as above (session calls run on the cpu backend, and a
 * batch of calls gathers the first call's q first, so a test marks the calls
 * it wants held by their q and leaves every other running); every other cpu
 * job goes straight to the real backend. And with $ATTN_HOLD_COPY_ROWS set, a
 * copy of exactly that many rows into or out of a session's pages
 * (attn__kvpages_copy, wrapped too) waits for the release file (or
 * $ATTN_HOLD_MAX_S) before it copies: an append still being stored. A
 * held job or copy creates "<release file>.held" when it starts waiting,
 * so that the test knows it is under way.
 *
 * (ATTN_, not ATTND_: the test harness clears ATTND_* from a server's
 * environment, and attnd reads ATTND_* as flags.)
 */
#define _GNU_SOURCE
#include "backend.h"
#include "kv/pages.h"

#include <errno.h>
#include <stdio.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

/* The engine's reference backend, under its own name (ld's --wrap). */
extern const struct attn_backend_ops __real_attn__reference_backend;
extern const struct attn_backend_ops __wrap_attn__reference_backend;
extern const struct attn_backend_ops __real_attn__cpu_backend;
extern struct attn_backend_ops __wrap_attn__cpu_backend;
#define REAL (&__real_attn__reference_backend)
#define REAL_CPU (&__real_attn__cpu_backend)

typedef struct hold_job {
  attn_job *job;
  void *real_state;
  const struct attn_backend_ops *real; /* the backend that runs it once released */
} hold_job;

static double hold_max_s(void) {
  const char *v = getenv("ATTN_HOLD_MAX_S");
  double s = v ? atof(v) : 0;
  return s > 0 ? s : 60;
}

static const char *release_path(void) {
  const char *path = getenv("ATTN_HOLD_RELEASE");
  return path && *path ? path : NULL;
}

static bool released(void) {
  const char *path = release_path();
  return path && access(path, F_OK) == 0;
}

static void nap(void) {
  struct timespec t = {0, 2 * 1000 * 1000};
  while (nanosleep(&t, &t) < 0 && errno == EINTR)
    ;
}

/* "<release file>.held": something is held now, for the test to see. */
static void mark_held(void) {
  char mark[512];
  snprintf(mark, sizeof mark, "%s.held", release_path());
  FILE *f = fopen(mark, "w");
  if (f)
    fclose(f);
}

static void *hold_run(void *arg) {
  hold_job h = *(hold_job *)arg;
  free(arg);
  if (release_path())
    mark_held();
  double until = attn_now() + hold_max_s();
  bool gated = release_path() != NULL;
  while (!(attn__job_canceled(h.job) && !gated) && !released() && attn_now() < until)
    nap();
  attn_status st = {0};
  if (attn__job_canceled(h.job)) {
    attn__canceled(&st);
    attn__job_complete(h.job, &st);
  } else if (h.real->submit(h.real_state, h.job, &st) < 0) {
    attn__job_complete(h.job, &st);
  }
  return NULL;
}

static int hold_start(const struct attn_backend_ops *real, void *state, attn_job *job,
                      attn_status *st) {
  hold_job *h = malloc(sizeof *h);
  if (!h)
    return attn_status_set(st, ATTN_ENOMEM, "hold backend: out of memory");
  h->job = job;
  h->real_state = state;
  h->real = real;
  pthread_attr_t a;
  pthread_attr_init(&a);
  pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
  pthread_t t;
  int rc = pthread_create(&t, &a, hold_run, h);
  pthread_attr_destroy(&a);
  if (rc != 0) {
    free(h);
    return attn_status_set(st, ATTN_ENOMEM, "hold backend: cannot start a thread");
  }
  return 0;
}

static int hold_submit(void *state, attn_job *job, attn_status *st) {
  return hold_start(REAL, state, job, st);
}

/* Whether a cpu job is one $ATTN_HOLD_CPU_Q0 asks to hold. */
static bool cpu_held(const attn_job *job) {
  const char *v = getenv("ATTN_HOLD_CPU_Q0");
  return v && *v && job->req.dtype == ATTN_F32 && job->req.q &&
         *(const float *)job->req.q == (float)atof(v);
}

static int hold_cpu_submit(void *state, attn_job *job, attn_status *st) {
  return cpu_held(job) ? hold_start(REAL_CPU, state, job, st) : REAL_CPU->submit(state, job, st);
}

/* Everything but submit is the reference's own. */
static int hold_open(const attn_backend_env *env, void **pstate, attn_status *st) {
  return REAL->open(env, pstate, st);
}
static void hold_close(void *state) { REAL->close(state); }
static int hold_supports(void *state, const attn_request *r, attn_status *st) {
  return REAL->supports(state, r, st);
}
static void hold_describe(void *state, char *buf, size_t cap) { REAL->describe(state, buf, cap); }

const struct attn_backend_ops __wrap_attn__reference_backend = {
    .name = "reference",
    .open = hold_open,
    .close = hold_close,
    .supports = hold_supports,
    .submit = hold_submit,
    .describe = hold_describe,
    .automatic = false,
};

/* The cpu backend's table with hold_cpu_submit: its own ops otherwise,
 * filled in at start-up (a const table cannot copy another's fields). */
struct attn_backend_ops __wrap_attn__cpu_backend;
__attribute__((constructor)) static void hold_cpu_init(void) {
  __wrap_attn__cpu_backend = *REAL_CPU;
  __wrap_attn__cpu_backend.submit = hold_cpu_submit;
}

int __real_attn__kvpages_copy(const attn_kvpages *p, void *dst, size_t dpitch, const void *src,
                              size_t spitch, size_t width, size_t rows, attn_status *st);
int __wrap_attn__kvpages_copy(const attn_kvpages *p, void *dst, size_t dpitch, const void *src,
                              size_t spitch, size_t width, size_t rows, attn_status *st);
int __wrap_attn__kvpages_copy(const attn_kvpages *p, void *dst, size_t dpitch, const void *src,
                              size_t spitch, size_t width, size_t rows, attn_status *st) {
  const char *v = getenv("ATTN_HOLD_COPY_ROWS");
  if (v && *v && (size_t)atoll(v) == rows && release_path()) {
    mark_held();
    double until = attn_now() + hold_max_s();
    while (!released() && attn_now() < until)
      nap();
  }
  return __real_attn__kvpages_copy(p, dst, dpitch, src, spitch, width, rows, st);
}
