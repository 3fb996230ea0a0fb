/*
 * test_engine.c — the asynchronous engine: callbacks on engine threads,
 * concurrent submitters sharing one pool, close() waiting for work in
 * flight, what a result reports, and the counting of visible pairs.
 */
#include "helpers.h"

#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

typedef struct job {
  tcase c;
  atomic_int done;
  attn_result res;
  pthread_t submitter, runner;
} job;

static void on_done(const attn_result *res, void *arg) {
  job *j = arg;
  j->res = *res;
  j->runner = pthread_self();
  atomic_store(&j->done, 1);
}

typedef struct submitter {
  attn_engine *e;
  job *jobs;
  int n;
} submitter;

static void *submit_all(void *arg) {
  submitter *s = arg;
  for (int i = 0; i < s->n; i++) {
    attn_status st;
    s->jobs[i].submitter = pthread_self();
    cr_assert_eq(attn_engine_submit(s->e, &s->jobs[i].c.req, on_done, &s->jobs[i], &st), 0, "%s",
                 st.message);
  }
  return NULL;
}

/* 4 threads submit 48 mixed jobs at once to a 2-worker engine. */
Test(engine, concurrent_submitters, .timeout = 120) {
  attn_engine *e = topen(2, NULL);
  enum { T = 4, PER = 12 };
  static job jobs[T * PER];
  for (int i = 0; i < T * PER; i++) {
    tprob p = tprob_make(1 + i % 2, 2 + 2 * (i % 3), 1 + i % 2 * 0, 1 + (i * 37) % 300,
                         1 + (i * 53) % 400, 16 + (i % 5) * 16, (attn_dtype)(i % 3));
    p.causal = i % 4 == 1;
    p.stats = i % 2;
    tcase_init(&jobs[i].c, &p, (uint64_t)i);
    atomic_store(&jobs[i].done, 0);
  }
  pthread_t th[T];
  submitter subs[T];
  for (int t = 0; t < T; t++) {
    subs[t] = (submitter){e, jobs + t * PER, PER};
    pthread_create(&th[t], NULL, submit_all, &subs[t]);
  }
  for (int t = 0; t < T; t++)
    pthread_join(th[t], NULL);
  attn_engine_close(e); /* waits for every job */
  for (int i = 0; i < T * PER; i++) {
    char d[200];
    cr_expect_eq(atomic_load(&jobs[i].done), 1, "job %d never completed", i);
    cr_expect_eq(jobs[i].res.status.code, 0, "%s", jobs[i].res.status.message);
    cr_expect(!pthread_equal(jobs[i].runner, jobs[i].submitter),
              "callback ran on the submitting thread");
    cr_expect_str_eq(jobs[i].res.backend, "cpu");
    cr_expect_eq(jobs[i].res.flops, attn_request_flops(&jobs[i].c.req));
    cr_expect_gt(jobs[i].res.engine_seconds, 0);
    terr err = tcheck(&jobs[i].c);
    cr_expect_leq(err.o, ttol(jobs[i].c.p.dt), "%s: error %.3g", tdesc(&jobs[i].c.p, d, sizeof d),
                  err.o);
    tcase_free(&jobs[i].c);
  }
}

/* A failing job still completes exactly once, with its error in the result,
 * and other jobs are unaffected. */
Test(engine, failed_job_reports_through_callback) {
  attn_engine *e = topen(2, NULL);
  static job bad, ok;
  tprob p = tprob_make(1, 2, 1, 30, 30, 8, ATTN_F32);
  tcase_init(&bad.c, &p, 1);
  tcase_init(&ok.c, &p, 2);
  ((float *)bad.c.k)[17] = NAN;
  attn_status st;
  cr_assert_eq(attn_engine_submit(e, &bad.c.req, on_done, &bad, &st), 0);
  cr_assert_eq(attn_engine_submit(e, &ok.c.req, on_done, &ok, &st), 0);
  attn_engine_close(e);
  cr_expect_eq(bad.res.status.code, ATTN_ENONFINITE);
  cr_expect_eq(bad.res.flops, 0);
  cr_expect_eq(ok.res.status.code, 0);
  cr_expect_leq(tcheck(&ok.c).o, 1e-5);
  tcase_free(&bad.c);
  tcase_free(&ok.c);
}

Test(engine, backends_are_listed) {
  attn_engine *e = topen(3, NULL);
  attn_backend_info info[8];
  int n = attn_engine_backends(e, info, 8);
  /* preference order: cuda (when compiled in), cpu, reference */
#ifdef ATTN_HAVE_CUDA
  cr_assert_eq(n, 3);
  cr_expect_str_eq(info[0].name, "cuda");
  cr_expect(info[0].available || strstr(info[0].detail, "no CUDA device"), "%s", info[0].detail);
  int c = 1;
#else
  cr_assert_eq(n, 2);
  int c = 0;
#endif
  cr_expect_str_eq(info[c].name, "cpu");
  cr_expect(info[c].available);
  cr_expect(strstr(info[c].detail, "3 threads"), "%s", info[c].detail);
  cr_expect_str_eq(info[c + 1].name, "reference");
  cr_expect_eq(attn_engine_threads(e), 3);
  attn_engine_close(e);
}

/* attn_request_visible_pairs against a brute-force count of the mask. */
Test(engine, visible_pairs) {
  static const int64_t cfg[][5] = {/* nq, nkv, causal, wl, wr */
                                   {7, 7, 0, -1, -1},  {7, 7, 1, -1, -1}, {10, 4, 1, -1, -1},
                                   {4, 10, 1, -1, -1}, {20, 20, 0, 3, 2}, {20, 9, 0, 0, 0},
                                   {5, 30, 1, 4, -1},  {30, 5, 0, -1, 0}};
  for (size_t t = 0; t < sizeof cfg / sizeof *cfg; t++) {
    attn_request r;
    attn_request_init(&r);
    r.batch = 2;
    r.heads_q = 3;
    r.heads_kv = 1;
    r.seq_q = cfg[t][0];
    r.seq_kv = cfg[t][1];
    r.head_dim = 8;
    r.causal = cfg[t][2];
    r.window_left = cfg[t][3];
    r.window_right = cfg[t][4];
    uint64_t want = 0;
    int64_t off = r.seq_kv - r.seq_q, wl = r.window_left, wr = r.causal ? 0 : r.window_right;
    for (int64_t i = 0; i < r.seq_q; i++)
      for (int64_t j = 0; j < r.seq_kv; j++)
        want += (wl < 0 || j >= i + off - wl) && (wr < 0 || j <= i + off + wr);
    cr_expect_eq(attn_request_visible_pairs(&r), want * 6, "case %zu", t);
    cr_expect_eq(attn_request_flops(&r), 4.0 * 8 * (double)(want * 6));
    /* the work asked for, which --max-pairs caps, ignores the mask */
    cr_expect_eq(attn_request_pairs(&r), (uint64_t)(6 * r.seq_q * r.seq_kv), "case %zu", t);
  }
}

/* Many small jobs at once, whose phases have different item counts (6 scan
 * items, then 1 compute item): a worker that counted a scan item done must
 * not mistake the next phase's count for its own (a race once seen as heap
 * corruption under load). */
static void count_done(const attn_result *res, void *arg) {
  (void)res;
  atomic_fetch_add((atomic_int *)arg, 1);
}

Test(engine, phases_with_different_item_counts, .timeout = 120) {
  attn_engine *e = topen(2, NULL);
  enum { N = 3000, NO = 4 * 8 * 8 };
  tprob p = tprob_make(1, 4, 1, 8, 8, 8, ATTN_F32);
  tcase c;
  tcase_init(&c, &p, 1);
  static attn_request reqs[N];
  static float outs[N][NO];
  atomic_int done = 0;
  attn_status st;
  for (int i = 0; i < N; i++) {
    reqs[i] = c.req; /* shared inputs, an output of its own */
    reqs[i].o = outs[i];
    cr_assert_eq(attn_engine_submit(e, &reqs[i], count_done, &done, &st), 0);
  }
  attn_engine_close(e);
  cr_expect_eq(atomic_load(&done), N);
  attn_engine *lone = topen(2, NULL);
  cr_assert_eq(trun(lone, &c, "cpu", &st), 0);
  attn_engine_close(lone);
  int differ = 0;
  for (int i = 0; i < N; i++)
    differ += memcmp(outs[i], c.o, sizeof outs[i]) != 0;
  cr_expect_eq(differ, 0, "%d of %d outputs differ from a lone run", differ, N);
  cr_expect_leq(tcheck(&c).o, 1e-5);
  tcase_free(&c);
}

/* attn_engine_run_here: as right as a queued job, forward, which the CPU
 * backend computes on the caller's thread (tests/unit/test_pool.c checks
 * attn_pool_run_here's thread). */
Test(engine, run_here_is_as_right_as_a_queued_job) {
  attn_engine *e = topen(2, NULL);
  for (int i = 0; i < 6; i++) {
    tprob p = tprob_make(1, 2 + i % 2 * 2, 1 + i % 2, 1 + i * 5, 3 + i * 17, 16 + i * 8,
                         (attn_dtype)(i % 3));
    p.causal = i % 3 == 1;
    p.stats = true;
    tcase c;
    tcase_init(&c, &p, 40 + (uint64_t)i);
    attn_status st;
    attn_result res;
    cr_assert_eq(attn_engine_run_here(e, &c.req, &res, &st), 0, "%s", st.message);
    cr_expect_str_eq(res.backend, "cpu");
    cr_expect_eq(res.flops, attn_request_flops(&c.req));
    char d[200];
    terr err = tcheck(&c);
    cr_expect_leq(err.o, ttol(p.dt), "%s: error %.3g", tdesc(&p, d, sizeof d), err.o);
    cr_expect_leq(err.stats, 1e-4, "%s: statistics error %.3g", d, err.stats);
    cr_expect(err.masked_ok, "%s: a masked row", d);
    tcase_free(&c);
  }
  attn_engine_close(e);
}
