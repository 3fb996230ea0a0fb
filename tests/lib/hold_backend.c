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
 * (ATTN_, not ATTND_: the test harness clears ATTND_* from a server's
 * environment, and attnd reads ATTND_* as flags.)
 */
#define _GNU_SOURCE
#include "backend.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

/* The engine's reference backend, under its own name (ld's --wrap). */
extern const struct attn_backend_ops __real_attn__reference_backend;
extern const struct attn_backend_ops __wrap_attn__reference_backend;
#define REAL (&__real_attn__reference_backend)

typedef struct hold_job {
  attn_job *job;
  void *real_state;
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

static void *hold_run(void *arg) {
  hold_job h = *(hold_job *)arg;
  free(arg);
  double until = attn_now() + hold_max_s();
  bool gated = release_path() != NULL;
  while (!(attn__job_canceled(h.job) && !gated) && !released() && attn_now() < until)
    nap();
  attn_status st = {0};
  if (attn__job_canceled(h.job)) {
    attn__canceled(&st);
    attn__job_complete(h.job, &st);
  } else if (REAL->submit(h.real_state, h.job, &st) < 0) {
    attn__job_complete(h.job, &st);
  }
  return NULL;
}

static int hold_submit(void *state, attn_job *job, attn_status *st) {
  hold_job *h = malloc(sizeof *h);
  if (!h)
    return attn_status_set(st, ATTN_ENOMEM, "hold backend: out of memory");
  h->job = job;
  h->real_state = state;
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
