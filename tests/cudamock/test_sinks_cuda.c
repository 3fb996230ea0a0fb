/*
 * test_sinks_cuda.c — attention sinks on the cuda backend, on the mock
 * runtime (mock.h): a request with sinks goes to cuda (backend auto too);
 * each forward group's kernel launch is followed, on its stream and before
 * its download, by one fold (engine/cuda/sinks.h) given that group's lse,
 * its statistics and the sinks of its own query heads (a scratch lse when
 * the caller asked for none, a scratch m when it asked for l alone); a
 * backward's recomputed lse is folded (no O) before its kernels, and
 * dsinks comes from one gradient launch after them; a session whose pages
 * live on the device takes sinks. Every result is checked against the
 * float64 reference (the mock's fold and gradient compute the contract in
 * float64, apart from the kernels' code, which tests/unit/test_cuda_sinks.c
 * and tests/gpu check).
 */
#include "cuda/kernels.h"
#include "helpers.h"
#include "kvcalls.h"
#include "mock.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void reset(void) { mock_defaults(); }

static mock_op g_log[MOCK_LOG_MAX];
static mock_sink g_sk[64];

/* The n-th log entry of kind (n from 0), or NULL. */
static const mock_op *nth(const mock_op *log, int n, int kind, int k) {
  for (int i = 0; i < n; i++)
    if (log[i].kind == kind && k-- == 0)
      return &log[i];
  return NULL;
}

static int count(const mock_op *log, int n, int kind) {
  int c = 0;
  for (int i = 0; i < n; i++)
    c += log[i].kind == kind;
  return c;
}

/* Whether the latest forward job's folds are one per group, each after
 * its group's kernel on its stream and before every download that follows
 * it, with the case's statistics and its heads' sinks (group g's heads
 * from g · heads_per_group). */
static bool folds_follow_kernels(const tcase *c, int heads_per_group) {
  const int n = mock_log(g_log, MOCK_LOG_MAX), ns = mock_sinks(g_sk, 64);
  const int groups = count(g_log, n, MOCK_KERNEL);
  bool ok = groups > 0 && ns == groups;
  cr_expect_eq(ns, groups, "one fold per group (%d groups)", groups);
  for (int g = 0; ok && g < ns; g++) {
    const mock_sink *f = &g_sk[g];
    const mock_op *k = nth(g_log, n, MOCK_KERNEL, g), *fl = &g_log[f->log];
    ok = !f->grad && f->log >= 0 && fl->stream == k->stream && fl->start > k->end && f->o &&
         f->lse && f->m == (c->req.m || c->req.l) && f->l == (c->req.l != NULL) &&
         f->heads_q == (groups > 1 ? heads_per_group : (int)c->p.hq) &&
         f->sinks == g_sk[0].sinks + g * heads_per_group;
    for (int i = f->log + 1; ok && i < n; i++) /* this group's downloads come later */
      ok = g_log[i].kind != MOCK_DOWNLOAD || g_log[i].start > fl->end || g + 1 < groups;
    cr_expect(ok, "fold %d of %d: after its kernel %d, o %d m %d l %d, %d heads", g, ns,
              fl->start > k->end, f->o, f->m, f->l, f->heads_q);
  }
  return ok;
}

/* Runs c on backend (cuda or auto), checks it ran on cuda and against
 * float64 and how its folds were launched. */
static bool forward_case(attn_engine *e, const tprob *p, uint64_t seed, const char *backend) {
  tcase c;
  char desc[200];
  tdesc(p, desc, sizeof desc);
  tcase_init(&c, p, seed);
  mock_log_reset();
  const long launches = mock_launches();
  attn_status st = {0};
  int rc = trun(e, &c, backend, &st);
  cr_expect_eq(rc, 0, "%s: %s", desc, st.message);
  bool ok = rc == 0 && mock_launches() > launches;
  cr_expect(ok, "%s on %s: ran on cuda", desc, backend);
  if (ok) {
    terr err = tcheck(&c);
    ok = err.o <= ttol(p->dt) && (!p->stats || err.stats <= 1e-5);
    cr_expect(ok, "%s: O error %.3g, stats %.3g", desc, err.o, err.stats);
    ok = folds_follow_kernels(&c, (int)p->hq) && ok;
  }
  tcase_free(&c);
  return ok;
}

/* Prefill with GQA, rows that see no key (O 0, lse the sink), a split
 * decode (the mock has 4 SMs), no statistics (a scratch lse), a window
 * with strides, an odd head dim; on cuda and on auto. */
Test(cuda_sinks, forward_runs_on_cuda_and_matches_float64, .init = reset) {
  attn_engine *e = topen_streams(2, 2);
  static const struct {
    int64_t b, hq, hkv, nq, nkv, d;
    attn_dtype dt;
    bool causal, stats, strided;
    int64_t wl, wr;
  } v[] = {
      {1, 4, 2, 40, 90, 64, ATTN_F16, true, true, false, -1, -1},
      {2, 6, 2, 33, 17, 64, ATTN_BF16, true, true, false, -1, -1},
      {1, 8, 2, 1, 3000, 128, ATTN_F32, false, true, false, -1, -1},
      {2, 3, 1, 77, 130, 37, ATTN_F16, true, false, false, -1, -1},
      {1, 5, 5, 20, 50, 96, ATTN_BF16, false, true, true, 5, 2},
      {1, 4, 1, 5, 700, 256, ATTN_F32, false, true, false, 300, 0},
  };
  int fails = 0;
  for (size_t i = 0; i < sizeof v / sizeof *v; i++) {
    tprob p = tprob_make(v[i].b, v[i].hq, v[i].hkv, v[i].nq, v[i].nkv, v[i].d, v[i].dt);
    p.causal = v[i].causal, p.stats = v[i].stats, p.strided = v[i].strided;
    p.wl = v[i].wl, p.wr = v[i].wr;
    p.sinks = true;
    fails += !forward_case(e, &p, 100 + i, "cuda");
    fails += !forward_case(e, &p, 200 + i, "auto");
  }
  cr_expect_eq(fails, 0, "%d sink cases failed", fails);
  attn_engine_close(e);
  cr_expect_eq(mock_device_bytes(), 0, "device memory left");
}

/* A sink far above every score (O nearly 0, lse about the sink) and one far
 * below (as if there were none): both as the reference says. */
Test(cuda_sinks, extreme_sinks, .init = reset) {
  attn_engine *e = topen_streams(2, 2);
  const float ts[2] = {40.0f, -1e30f};
  for (int k = 0; k < 2; k++) {
    tprob p = tprob_make(1, 3, 1, 12, 9, 16, ATTN_F32); /* rows 0-2 see no key */
    p.causal = true, p.stats = true, p.sinks = true;
    tcase c;
    tcase_init(&c, &p, 300 + (uint64_t)k);
    for (int h = 0; h < 3; h++)
      c.sinks[h] = ts[k];
    attn_status st = {0};
    cr_assert_eq(trun(e, &c, "cuda", &st), 0, "%s", st.message);
    terr err = tcheck(&c);
    cr_expect(err.o <= 1e-5 && err.stats <= 1e-5, "sink %g: O error %.3g, stats %.3g",
              (double)ts[k], err.o, err.stats);
    tcase_free(&c);
  }
  attn_engine_close(e);
}

/* l without m: the fold needs m (l' is relative to m'), so the job gets it
 * as scratch; l and lse still match. */
Test(cuda_sinks, l_without_m_gets_a_scratch_m, .init = reset) {
  attn_engine *e = topen_streams(2, 2);
  tprob p = tprob_make(2, 4, 2, 30, 50, 64, ATTN_BF16);
  p.causal = true, p.stats = true, p.sinks = true;
  tcase c;
  tcase_init(&c, &p, 41);
  c.req.m = NULL;
  mock_log_reset();
  attn_status st = {0};
  cr_assert_eq(trun(e, &c, "cuda", &st), 0, "%s", st.message);
  tref ref;
  cr_assert_eq(tref_compute(&c, 1, &ref, &st), 0, "%s", st.message);
  double worst = 0;
  for (int64_t r = 0; r < p.b * p.hq * p.nq; r++)
    worst = fmax(worst, fmax(fabs(c.l[r] / ref.l[r] - 1),
                             fabs(c.lse[r] - ref.lse[r]) / fmax(1, fabs(ref.lse[r]))));
  cr_expect(worst <= 1e-5, "l and lse off by %.3g", worst);
  cr_expect(folds_follow_kernels(&c, (int)p.hq));
  tref_free(&ref);
  tcase_free(&c);
  attn_engine_close(e);
}

/* A large decode runs in groups of KV heads: each group's fold gets the
 * sinks of its own query heads. */
Test(cuda_sinks, each_group_folds_its_own_heads, .init = reset) {
  attn_engine *e = topen_streams(2, 2);
  /* K and V of 32 MiB each: four groups, one KV head (2 query heads) each */
  tprob p = tprob_make(1, 8, 4, 1, 32768, 64, ATTN_F32);
  p.stats = true, p.sinks = true;
  tcase c;
  tcase_init(&c, &p, 51);
  mock_log_reset();
  attn_status st = {0};
  cr_assert_eq(trun(e, &c, "cuda", &st), 0, "%s", st.message);
  const int n = mock_log(g_log, MOCK_LOG_MAX);
  cr_expect_eq(count(g_log, n, MOCK_KERNEL), 4, "four groups");
  cr_expect(folds_follow_kernels(&c, 2));
  terr err = tcheck(&c);
  cr_expect(err.o <= ttol(p.dt) && err.stats <= 1e-5, "O error %.3g, stats %.3g", err.o, err.stats);
  tcase_free(&c);
  attn_engine_close(e);
}

/* The backward job's launches: [forward, fold of lse alone,] backward,
 * then the gradient (when dsinks is wanted), all on one stream in order. */
static bool backward_launches(const tcase *c, bool with_lse, bool want) {
  const int n = mock_log(g_log, MOCK_LOG_MAX), ns = mock_sinks(g_sk, 64);
  const int kernels = count(g_log, n, MOCK_KERNEL);
  const mock_op *kf = nth(g_log, n, MOCK_KERNEL, 0), *kb = nth(g_log, n, MOCK_KERNEL, kernels - 1);
  bool ok = kernels == (with_lse ? 1 : 2) && ns == !with_lse + want;
  for (int i = 0; ok && i < ns; i++) {
    const mock_sink *s = &g_sk[i];
    const mock_op *at = &g_log[s->log];
    const bool fold = !with_lse && i == 0;
    ok = s->log >= 0 && at->stream == kb->stream && s->sinks && s->heads_q == c->p.hq &&
         s->grad == !fold &&
         (fold ? !s->o && !s->m && !s->l && at->start > kf->end && at->end < kb->start
               : at->start > kb->end && s->dsinks);
  }
  cr_expect(ok, "%d kernels, %d sink launches (lse %s, dsinks %s)", kernels, ns,
            with_lse ? "given" : "recomputed", want ? "wanted" : "not wanted");
  return ok;
}

static bool backward_case(attn_engine *e, tcase *c, const tref_bwd *ref, const double *dref,
                          bool with_lse, bool want) {
  char desc[200];
  attn_status st = {0};
  tcase_poison_grads(c);
  c->req.lse_in = with_lse ? c->lse_in : NULL;
  c->req.dsinks = want ? c->dsinks : NULL;
  mock_log_reset();
  int rc = trun(e, c, "auto", &st);
  cr_expect_eq(rc, 0, "%s: %s", tdesc(&c->p, desc, sizeof desc), st.message);
  if (rc)
    return false;
  terr_bwd err = tref_bwd_check(c, ref);
  const double tol = ttol(c->p.dt), ds = want ? tdsinks_err(c, dref) : 0;
  bool ok = terr_bwd_within(&err, tol) && ds <= tol;
  cr_expect(ok, "%s, lse %s: dq %.3g dk %.3g dv %.3g dsinks %.3g (tol %.0e)",
            tdesc(&c->p, desc, sizeof desc), with_lse ? "given" : "recomputed", err.dq, err.dk,
            err.dv, ds, tol);
  return backward_launches(c, with_lse, want) && ok;
}

/* Every dtype; GQA, rows with no visible key and strides, a window; lse
 * given and recomputed; dsinks wanted and not. */
Test(cuda_sinks, backward_folds_lse_and_computes_dsinks, .init = reset) {
  attn_engine *e = topen_streams(2, 2);
  int fails = 0;
  for (int dt = 0; dt < ATTN_DTYPE_COUNT; dt++) {
    tprob ps[3] = {tprob_make(2, 4, 2, 19, 23, 37, (attn_dtype)dt),
                   tprob_make(1, 6, 2, 33, 17, 64, (attn_dtype)dt),
                   tprob_make(1, 3, 1, 40, 40, 8, (attn_dtype)dt)};
    ps[1].causal = true, ps[1].strided = true; /* Nq > Nkv: rows that see no key */
    ps[2].wl = 5, ps[2].wr = 2;
    for (int i = 0; i < 3; i++) {
      ps[i].sinks = true;
      tcase c;
      tref_bwd ref;
      attn_status st;
      double dref[8];
      tcase_init(&c, &ps[i], 600 + (uint64_t)(3 * dt + i));
      cr_assert_eq(tcase_backward(&c, true, 700 + (uint64_t)i, &st), 0, "%s", st.message);
      cr_assert_eq(tref_bwd_compute(&c, &ref, &st), 0, "%s", st.message);
      cr_assert_eq(attn_reference_dsinks(&c.req, dref, &st), 0, "%s", st.message);
      for (int k = 0; k < 4; k++)
        fails += !backward_case(e, &c, &ref, dref, k & 1, k < 2 || i == 0);
      tref_bwd_free(&ref);
      tcase_free(&c);
    }
  }
  cr_expect_eq(fails, 0, "%d backward checks failed", fails);
  attn_engine_close(e);
  cr_expect_eq(mock_device_bytes(), 0, "device memory left");
}

/* A step of session "s" (kvcalls' tkv_step_error), a refused call failing
 * the test with its why. */
static double session_call(attn_kv_store *kv, const tkv_stream *s, const tkv_opts *op, int64_t q0,
                           int64_t nq) {
  attn_status st = {0};
  const double err = tkv_step_error(kv, "s", s, op, q0, nq, &st);
  cr_expect(err < INFINITY, "call at %lld: %s", (long long)q0, st.message);
  return err;
}

/* Prefill and decode steps of a session whose pages are on the device,
 * with sinks: the paged kernel reads the pages, the fold follows it. */
Test(cuda_sinks, a_session_on_the_device_takes_sinks, .init = reset) {
  attn_engine *e = topen_streams(2, 2);
  attn_kv_store *kv = tkv_open_store(e, (uint64_t)64 << 20, false, NULL);
  attn_kv_stats ks;
  attn_kv_stats_get(kv, &ks);
  cr_assert_str_eq(ks.where, "cuda", "the pages live on the GPU");
  tkv_stream s = tkv_stream_make(4, 2, 64, 140, ATTN_BF16, 61);
  tkv_make(kv, "", "s", &s, 1, 200, 60, 0);
  const float sinks[4] = {-2.0f, 0.5f, 3.0f, -1e30f};
  tkv_opts op = tkv_plain;
  op.stats = true, op.sinks = sinks;
  double worst = 0;
  mock_log_reset();
  worst = fmax(worst, session_call(kv, &s, &op, 0, 100));
  for (int64_t pos = 100; pos < 104; pos++)
    worst = fmax(worst, session_call(kv, &s, &op, pos, 1));
  cr_expect(worst <= ttol(s.dt), "worst error %.3g", worst);
  const int ns = mock_sinks(g_sk, 64);
  cr_expect_eq(ns, 5, "a fold per call");
  for (int i = 0; i < ns; i++)
    cr_expect(!g_sk[i].grad && g_sk[i].o && g_sk[i].lse, "fold %d", i);
  tkv_stream_free(&s);
  attn_kv_close(kv);
  attn_engine_close(e);
  cr_expect_eq(mock_device_bytes(), 0, "device memory left");
}

static attn_engine *open_config(bool self_check) {
  attn_config cfg;
  attn_config_init(&cfg);
  cfg.threads = 2;
  cfg.cuda_self_check_off = !self_check;
  return topen_config(&cfg);
}

/* Why the cuda backend lists sinks as off, or NULL. */
static const char *sinks_off(attn_engine *e, attn_backend_info *info, int cap) {
  int n = attn_engine_backends(e, info, cap);
  for (int i = 0; i < n && i < cap; i++)
    for (int k = 0; !strcmp(info[i].name, "cuda") && k < info[i].ndisabled; k++)
      if (!strcmp(info[i].disabled[k].kernel, "sinks"))
        return info[i].disabled[k].why;
  return NULL;
}

/* Sinks off: cuda declines them saying why, auto runs them on the cpu
 * (no launch), right; a request without sinks still runs on cuda. */
static void expect_sinks_on_the_cpu(attn_engine *e, const char *why) {
  attn_backend_info info[4];
  const char *off = sinks_off(e, info, 4);
  cr_assert(off, "sinks not listed as off");
  cr_expect(strstr(off, why), "sinks off because: %s", off);
  tprob p = tprob_make(1, 4, 2, 40, 90, 64, ATTN_F16);
  p.causal = true, p.stats = true, p.sinks = true;
  tcase c;
  tcase_init(&c, &p, 77);
  attn_status st = {0};
  cr_expect_eq(trun(e, &c, "cuda", &st), ATTN_EUNSUPPORTED);
  cr_expect(strstr(st.message, "sinks") && strstr(st.message, why), "%s", st.message);
  const long launches = mock_launches();
  cr_assert_eq(trun(e, &c, "auto", &st), 0, "%s", st.message);
  cr_expect_eq(mock_launches(), launches, "auto ran it on the cpu");
  terr err = tcheck(&c);
  cr_expect(err.o <= ttol(p.dt) && err.stats <= 1e-5, "O error %.3g, stats %.3g", err.o, err.stats);
  tcase_free(&c);
  p.sinks = false;
  tcase_init(&c, &p, 78);
  cr_expect_eq(trun(e, &c, "cuda", &st), 0, "%s", st.message);
  tcase_free(&c);
}

/* A fold or gradient that computes wrong fails its self-check cases:
 * sinks are off (the kernels stay on). */
Test(cuda_sinks, a_wrong_fold_turns_sinks_off, .init = reset) {
  mock_knobs k = MOCK_KNOBS(1, 9, (size_t)8 << 30, 0, 0, 0);
  k.wrong_sinks = true;
  mock_set(&k);
  attn_engine *e = open_config(true);
  expect_sinks_on_the_cpu(e, "sinks");
  attn_backend_info info[4];
  int n = attn_engine_backends(e, info, 4);
  for (int i = 0; i < n; i++)
    for (int j = 0; !strcmp(info[i].name, "cuda") && j < info[i].ndisabled; j++)
      cr_expect(!strcmp(info[i].disabled[j].kernel, "sinks") ||
                    strstr(info[i].disabled[j].why, "no sm_90a code"),
                "only sinks are off, not %s: %s", info[i].disabled[j].kernel,
                info[i].disabled[j].why);
  attn_engine_close(e);
}

/* Without the self-check, sinks stay off as the other unchecked paths do. */
Test(cuda_sinks, sinks_wait_for_the_self_check, .init = reset) {
  attn_engine *e = open_config(false);
  expect_sinks_on_the_cpu(e, "compile-verified only");
  attn_engine_close(e);
  e = open_config(true);
  attn_backend_info info[4];
  cr_expect_null(sinks_off(e, info, 4), "sinks off after a passing self-check");
  attn_engine_close(e);
}

/* A caller's lse far below the truth makes e^(t − lse) overflow dsinks:
 * ERANGE, as on the cpu, never an infinite gradient. */
Test(cuda_sinks, an_overflowing_dsinks_is_erange, .init = reset) {
  attn_engine *e = topen_streams(2, 2);
  tprob p = tprob_make(1, 2, 1, 5, 9, 16, ATTN_F32);
  p.sinks = true;
  tcase c;
  tcase_init(&c, &p, 81);
  attn_status st = {0};
  cr_assert_eq(tcase_backward(&c, true, 82, &st), 0, "%s", st.message);
  c.lse_in[0] = -100.0f; /* its row sees every key: D is not 0 */
  cr_expect_eq(trun(e, &c, "cuda", &st), ATTN_ERANGE);
  cr_expect(strstr(st.message, "overflow"), "%s", st.message);
  tcase_free(&c);
  attn_engine_close(e);
}
