/*
 * test_backend.c — engine/backend.c and engine/job.c: a backend that
 * writes only the required ops (name, open, submit) gets every default,
 * the ops it writes are kept, a backend that does not open stays closed
 * with its reason, and a job queued on it completes once through
 * attn__job_complete() with the result built there.
 */
#include "backend.h"

#include <criterion/criterion.h>
#include <string.h>

static int bare_open(const attn_backend_env *env, void **pstate, attn_status *st) {
  (void)env, (void)st;
  *pstate = NULL; /* a backend may have no state at all */
  return 0;
}

/* Completes at once on the submitting thread: enough for job.c's path. */
static int bare_submit(void *state, attn_job *job, attn_status *st) {
  (void)state, (void)st;
  attn__job_complete(job, NULL);
  return 0;
}

static const struct attn_backend_ops bare_ops = {
    .name = "bare",
    .open = bare_open,
    .submit = bare_submit,
};

Test(backend, defaults_fill_every_optional_op) {
  attn_backend be;
  attn__backend_init(&be, &bare_ops);
  attn_config cfg;
  attn_config_init(&cfg);
  cr_assert_eq(be.ops.workspace_bytes(&cfg), 0);
  attn_request r;
  attn_request_init(&r);
  attn_status st = {0};
  cr_assert_eq(be.ops.supports(NULL, &r, &st), 0);
  char buf[16] = "x";
  be.ops.describe(NULL, buf, sizeof buf);
  cr_assert_str_eq(buf, "");
  cr_assert(be.ops.healthy(NULL));
  attn_disabled off[2];
  cr_assert_eq(be.ops.disabled(NULL, off, 2), 0);
  cr_assert(!be.opened);
  attn_backend_env env = {.cfg = &cfg, .pool = NULL};
  cr_assert_eq(attn__backend_open(&be, &env), 0);
  cr_assert(be.opened);
  attn__backend_close(&be); /* the default close: nothing to free */
  cr_assert(!be.opened);
}

static bool never_healthy(void *state) {
  (void)state;
  return false;
}

static int refuse_open(const attn_backend_env *env, void **pstate, attn_status *st) {
  (void)env, (void)pstate;
  return attn_status_set(st, ATTN_ENODEV, "no such device here");
}

Test(backend, written_ops_are_kept_and_a_failed_open_says_why) {
  struct attn_backend_ops ops = bare_ops;
  ops.open = refuse_open;
  ops.healthy = never_healthy;
  attn_backend be;
  attn__backend_init(&be, &ops);
  cr_assert_eq(be.ops.healthy, never_healthy);
  attn_config cfg;
  attn_config_init(&cfg);
  attn_backend_env env = {.cfg = &cfg, .pool = NULL};
  cr_assert_eq(attn__backend_open(&be, &env), ATTN_ENODEV);
  cr_assert(!be.opened);
  cr_assert_eq(be.open_status.code, ATTN_ENODEV);
  cr_assert_str_eq(be.open_status.message, "no such device here");
  attn__backend_close(&be); /* never opened: close is not called */
}

static void on_done(const attn_result *res, void *arg) { *(attn_result *)arg = *res; }

Test(backend, a_job_completes_once_with_its_result) {
  attn_backend be;
  attn__backend_init(&be, &bare_ops);
  attn_jobs jobs;
  attn__jobs_init(&jobs);
  float q[4] = {1, 2, 3, 4}, o[4];
  attn_request r;
  attn_request_init(&r);
  r.batch = r.heads_q = r.heads_kv = r.seq_q = r.seq_kv = 1;
  r.head_dim = 4;
  r.q = r.k = r.v = q;
  r.o = o;
  attn_result res = {.backend = NULL};
  attn_status st = {0};
  cr_assert_eq(attn__backend_queue(&be, &jobs, &r, false, on_done, &res, &st), 0, "%s", st.message);
  cr_assert_str_eq(res.backend, "bare");
  cr_assert_eq(res.status.code, 0);
  cr_assert_eq(res.flops, 4.0 * 4); /* 4·D per visible pair */
  cr_assert_eq(jobs.inflight, 0);
  attn__jobs_drain(&jobs); /* returns at once: nothing in flight */
}
