/*
 * test_cancel.c — the engine's cancel flag (attn_request.cancel): a job
 * canceled before it is submitted is refused, one canceled between its
 * phases completes once with ECANCELED, and neither leaks (the sanitizer
 * build checks the frees). Ordering, not timing, makes the cancel land
 * mid-job: on one worker, job B's scan runs before job A's compute, and A's
 * completion callback cancels B before B computes (waiting, if A was quick,
 * until the test has queued B).
 */
#include "helpers.h"

#include <criterion/criterion.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

typedef struct outcome {
  atomic_int calls;
  attn_result res;
  int *cancel_other;     /* set from this job's callback, when not NULL */
  atomic_int *submitted; /* the other job is queued; the callback waits for it */
} outcome;

/* Waits (a bounded while) until *flag is set: job A may finish before the
 * test thread has queued job B, and must not cancel B before B is queued. */
static void wait_for(atomic_int *flag) {
  const struct timespec ms = {0, 1000000};
  for (int i = 0; i < 60000 && !atomic_load(flag); i++)
    nanosleep(&ms, NULL);
}

static void on_done(const attn_result *res, void *arg) {
  outcome *o = arg;
  o->res = *res;
  if (o->submitted)
    wait_for(o->submitted);
  if (o->cancel_other)
    attn_cancel_set(o->cancel_other);
  atomic_fetch_add(&o->calls, 1);
}

Test(cancel, before_submit_is_refused) {
  attn_engine *e = topen(1, NULL);
  tprob p = tprob_make(1, 2, 2, 16, 16, 32, ATTN_F32);
  tcase c;
  tcase_init(&c, &p, 7);
  int flag = 0;
  attn_cancel_set(&flag);
  cr_expect(attn_cancel_is_set(&flag));
  cr_expect(!attn_cancel_is_set(NULL), "a NULL flag is never set");
  c.req.cancel = &flag;
  static const char *const backends[] = {"cpu", "reference"};
  for (int i = 0; i < 2; i++) {
    outcome o = {0};
    attn_status st = {0};
    c.req.backend = backends[i];
    int rc = attn_engine_submit(e, &c.req, on_done, &o, &st);
    cr_expect_eq(rc, ATTN_ECANCELED, "%s: submit returned %d (%s)", backends[i], rc, st.message);
    cr_expect_eq(st.code, ATTN_ECANCELED);
    cr_expect(st.message[0], "no message");
    cr_expect_eq(atomic_load(&o.calls), 0, "a refused job's callback ran");
  }
  attn_engine_close(e);
  tcase_free(&c);
}

/* Job A's callback cancels job B; B must end once, with ECANCELED. */
static void cancel_mid_job(const char *backend) {
  attn_engine *e = topen(1, NULL);
  tprob p = tprob_make(1, 4, 2, 64, 64, 32, ATTN_F32);
  tcase a, b;
  tcase_init(&a, &p, 1);
  tcase_init(&b, &p, 2);
  int flag = 0;
  b.req.cancel = &flag;
  a.req.backend = b.req.backend = backend;
  atomic_int b_queued = 0;
  outcome oa = {.cancel_other = &flag, .submitted = &b_queued}, ob = {0};
  attn_status st;
  cr_assert_eq(attn_engine_submit(e, &a.req, on_done, &oa, &st), 0, "%s", st.message);
  cr_assert_eq(attn_engine_submit(e, &b.req, on_done, &ob, &st), 0, "%s", st.message);
  atomic_store(&b_queued, 1);
  attn_engine_close(e); /* waits for both */
  cr_expect_eq(atomic_load(&oa.calls), 1, "%s: job A completed %d times", backend,
               atomic_load(&oa.calls));
  cr_expect_eq(oa.res.status.code, 0, "%s: job A: %s", backend, oa.res.status.message);
  cr_expect_leq(tcheck(&a).o, ttol(ATTN_F32), "%s: job A's result is wrong", backend);
  cr_expect_eq(atomic_load(&ob.calls), 1, "%s: job B completed %d times", backend,
               atomic_load(&ob.calls));
  cr_expect_eq(ob.res.status.code, ATTN_ECANCELED, "%s: job B ended with %d (%s)", backend,
               ob.res.status.code, ob.res.status.message);
  cr_expect_eq(ob.res.flops, 0, "%s: a canceled job reports no flops", backend);
  tcase_free(&a);
  tcase_free(&b);
}

Test(cancel, between_phases_cpu) { cancel_mid_job("cpu"); }

Test(cancel, before_it_starts_reference) { cancel_mid_job("reference"); }
