/*
 * test_cuda_backend.c — the CUDA backend's host code on a mock runtime
 * (mock.h): packing with strides and padded head dims, the staging layout,
 * the statistics, the device scan's coordinates, the stream pool under 64
 * concurrent jobs, device and pinned memory given back, and every failure
 * the backend must turn into an engine error instead of an abort or a hang:
 * no device, an old device, bad --devices, out of device memory, a failed
 * launch, a stream that faults. The backward pass's host path too: o, do
 * and lse staged, lse recomputed by a forward launch when absent, dq, dk,
 * dv unpacked through strides, its own errors and sizes, and cancellation.
 * The kernels themselves are tested elsewhere
 * (tests/unit/test_cuda_layout.c here, tests/gpu on a GPU).
 */
#include "cases.h"
#include "cuda/kernels.h"
#include "helpers.h"
#include "mock.h"

#include <criterion/criterion.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static void reset(void) { mock_defaults(); }

static attn_engine *open_cuda(int streams, const char *devices) {
  attn_config cfg;
  attn_config_init(&cfg);
  cfg.threads = 2;
  cfg.cuda_streams = streams;
  cfg.cuda_devices = devices;
  attn_engine *e;
  attn_status st;
  cr_assert_eq(attn_engine_open(&cfg, &e, &st), 0, "%s", st.message);
  return e;
}

static const attn_backend_info *cuda_info(attn_engine *e, attn_backend_info *info) {
  int n = attn_engine_backends(e, info, 4);
  for (int i = 0; i < n; i++)
    if (!strcmp(info[i].name, "cuda"))
      return &info[i];
  cr_assert_fail("no cuda backend listed");
  return NULL;
}

/* Runs c on the cuda backend and checks it against float64. */
static bool check_one(attn_engine *e, const tprob *p, uint64_t seed) {
  tcase c;
  char desc[200];
  tcase_init(&c, p, seed);
  attn_status st = {0};
  int rc = trun(e, &c, "cuda", &st);
  bool ok = rc == 0;
  cr_expect_eq(rc, 0, "%s: %s", tdesc(p, desc, sizeof desc), st.message);
  if (ok) {
    terr err = tcheck(&c);
    /* The mock computes in float64 and rounds once: the CPU's tolerances. */
    ok = err.o <= ttol(p->dt) && err.masked_ok && (!p->stats || err.stats <= 1e-5);
    cr_expect(ok, "%s: O error %.3g, stats %.3g, masked rows %s", tdesc(p, desc, sizeof desc),
              err.o, err.stats, err.masked_ok ? "ok" : "WRONG");
  }
  tcase_free(&c);
  return ok;
}

static double work(const tprob *p) {
  return (double)p->b * (double)p->hq * (double)p->nq * (double)p->nkv * (double)p->d;
}

Test(cuda_backend, conformance_lists_through_staging, .init = reset) {
  attn_engine *e = open_cuda(3, NULL);
  int (*const lists[])(tprob *) = {tcases_sizes, tcases_masks, tcases_shapes, tcases_masked_rows};
  tprob ps[TCASES_MAX];
  int ran = 0, strided = 0, padded = 0, narrow = 0;
  for (size_t l = 0; l < sizeof lists / sizeof *lists; l++) {
    int n = lists[l](ps);
    for (int i = 0; i < n; i++) {
      if (work(&ps[i]) > 3e6) /* the mock kernel is plain float64 loops */
        continue;
      check_one(e, &ps[i], 100 * l + (uint64_t)i);
      ran++;
      strided += ps[i].strided;
      padded += ps[i].d % 8 != 0;
      narrow += ps[i].dt != ATTN_F32;
    }
  }
  cr_expect_geq(ran, 60, "only %d problems ran", ran);
  cr_expect(strided > 0 && padded > 0 && narrow > 0, "strided %d, padded %d, F16/BF16 %d", strided,
            padded, narrow);
  attn_engine_close(e);
  cr_expect_eq(mock_device_bytes(), 0, "device memory left allocated");
  cr_expect_eq(mock_pinned_buffers(), 0, "pinned buffers left");
  cr_expect_eq(mock_streams(), 0, "streams left");
}

Test(cuda_backend, decode_shapes_take_the_split_path, .init = reset) {
  /* 4 multiprocessors on the mock: a single query block splits its keys,
   * so the launch carries split scratch (the mock poisons O without it). */
  attn_engine *e = open_cuda(2, NULL);
  tprob p = tprob_make(1, 2, 1, 1, 1500, 64, ATTN_BF16);
  p.stats = true;
  attn_cu_params prm;
  memset(&prm, 0, sizeof prm);
  prm.dtype = p.dt, prm.batch = 1, prm.heads_q = 2, prm.heads_kv = 1;
  prm.seq_q = 1, prm.seq_kv = 1500, prm.head_dim = 64, prm.dp = 64;
  prm.window_left = prm.window_right = -1;
  attn_cu_choice ch;
  attn_status st;
  cr_assert_eq(attn_cu_select(&prm, 4, &ch, &st), 0);
  cr_assert_gt(ch.nsplit, 1, "the shape should split on 4 SMs");
  check_one(e, &p, 7);
  attn_engine_close(e);
}

Test(cuda_backend, nonfinite_inputs_name_their_element, .init = reset) {
  attn_engine *e = open_cuda(2, NULL);
  static const char *const tn[3] = {"q", "k", "v"};
  for (int dt = 0; dt < ATTN_DTYPE_COUNT; dt++)
    for (int t = 0; t < 3; t++)
      for (int strided = 0; strided < 2; strided++) {
        /* head dim 37: padded to 40 on the device, so the element index
         * must be mapped back through the padding */
        tprob p = tprob_make(2, 4, 2, 9, 11, 37, (attn_dtype)dt);
        p.strided = strided;
        tcase c;
        tcase_init(&c, &p, 3);
        int64_t b = 1, h = t ? 1 : 3, n = t ? 10 : 8, d = 36 - t;
        const int64_t *s = t == 0 ? c.req.q_stride : t == 1 ? c.req.k_stride : c.req.v_stride;
        int64_t H = t ? p.hkv : p.hq, N = t ? p.nkv : p.nq;
        int64_t s0 = s[0], s1 = s[1], s2 = s[2];
        if (!s0 && !s1 && !s2)
          s2 = p.d, s1 = N * s2, s0 = H * s1;
        void *base = t == 0 ? c.q : t == 1 ? c.k : c.v;
        attn_store_elem(base, p.dt, (size_t)(b * s0 + h * s1 + n * s2 + d), NAN);
        attn_status st = {0};
        int rc = trun(e, &c, "cuda", &st);
        char want[128];
        snprintf(want, sizeof want,
                 "tensor %s holds a non-finite value at [%lld, %lld, %lld, %lld]", tn[t],
                 (long long)b, (long long)h, (long long)n, (long long)d);
        cr_expect(rc == ATTN_ENONFINITE && strstr(st.message, want), "%s %s strided %d: %s: %s",
                  attn_dtype_name(p.dt), tn[t], strided, attn_err_name(rc), st.message);
        tcase_free(&c);
      }
  /* scores past F32: the shared magnitude check */
  tprob p = tprob_make(1, 1, 1, 4, 4, 16, ATTN_F32);
  tcase c;
  tcase_init(&c, &p, 4);
  for (int i = 0; i < 16; i++)
    ((float *)c.q)[i] = 1e20f, ((float *)c.k)[i] = 1e20f;
  attn_status st = {0};
  cr_expect_eq(trun(e, &c, "cuda", &st), ATTN_ERANGE, "%s", st.message);
  tcase_free(&c);
  attn_engine_close(e);
}

typedef struct pool_job {
  tcase c;
  attn_result res;
  bool done;
} pool_job;

typedef struct pool_wait {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int left;
} pool_wait;

static pool_wait g_wait = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};

static void pool_done(const attn_result *res, void *arg) {
  pool_job *j = arg;
  j->res = *res;
  pthread_mutex_lock(&g_wait.mu);
  j->done = true;
  g_wait.left--;
  pthread_cond_broadcast(&g_wait.cv);
  pthread_mutex_unlock(&g_wait.mu);
}

Test(cuda_backend, pool_of_4_streams_under_64_jobs, .init = reset) {
  for (int cycle = 0; cycle < 2; cycle++) {
    attn_engine *e = open_cuda(4, NULL);
    enum { JOBS = 64 };
    static pool_job jobs[JOBS];
    long launches = mock_launches();
    g_wait.left = JOBS;
    for (int i = 0; i < JOBS; i++) {
      tprob p = tprob_make(1 + i % 2, 2 + 2 * (i % 2), 1 + i % 2, 17 + 13 * (i % 5),
                           23 + 11 * (i % 7), 8 + 24 * (i % 4), (attn_dtype)(i % 3));
      p.causal = i % 4 == 1;
      p.stats = i % 3 == 0;
      p.strided = i % 5 == 2;
      tcase_init(&jobs[i].c, &p, 1000 * (uint64_t)cycle + (uint64_t)i);
      jobs[i].done = false;
      jobs[i].c.req.backend = "cuda";
      attn_status st;
      cr_assert_eq(attn_engine_submit(e, &jobs[i].c.req, pool_done, &jobs[i], &st), 0, "%s",
                   st.message);
    }
    pthread_mutex_lock(&g_wait.mu);
    while (g_wait.left > 0)
      pthread_cond_wait(&g_wait.cv, &g_wait.mu);
    pthread_mutex_unlock(&g_wait.mu);
    for (int i = 0; i < JOBS; i++) {
      char desc[200];
      cr_expect_eq(jobs[i].res.status.code, 0, "job %d: %s", i, jobs[i].res.status.message);
      cr_expect_str_eq(jobs[i].res.backend, "cuda");
      terr err = tcheck(&jobs[i].c);
      cr_expect(err.o <= ttol(jobs[i].c.p.dt) && err.masked_ok &&
                    (!jobs[i].c.p.stats || err.stats <= 1e-5),
                "job %d (%s): O error %.3g, stats %.3g", i, tdesc(&jobs[i].c.p, desc, sizeof desc),
                err.o, err.stats);
      tcase_free(&jobs[i].c);
    }
    cr_expect_eq(mock_launches() - launches, JOBS);
    cr_expect_eq(mock_device_bytes(), 0, "cycle %d: device memory not given back", cycle);
    attn_engine_close(e);
    cr_expect_eq(mock_pinned_buffers(), 0, "cycle %d: pinned buffers left", cycle);
    cr_expect_eq(mock_streams(), 0, "cycle %d: streams left", cycle);
  }
}

Test(cuda_backend, devices_and_their_failures, .init = reset) {
  attn_backend_info info[4];
  /* no device */
  mock_knobs k = MOCK_KNOBS(0, 9, (size_t)8 << 30, 0, 0, 0);
  mock_set(&k);
  attn_engine *e = open_cuda(0, NULL);
  const attn_backend_info *ci = cuda_info(e, info);
  cr_expect(!ci->available && strstr(ci->detail, "no CUDA device was found"), "%s", ci->detail);
  tprob p = tprob_make(1, 1, 1, 8, 8, 16, ATTN_F16);
  tcase c;
  tcase_init(&c, &p, 1);
  attn_status st;
  cr_expect_eq(trun(e, &c, "cuda", &st), ATTN_ENODEV);
  cr_expect_eq(trun(e, &c, "auto", &st), 0, "auto falls back to the CPU: %s", st.message);
  attn_engine_close(e);
  /* a device too old for mma.sync */
  k.devices = 1;
  k.major = 7;
  mock_set(&k);
  e = open_cuda(0, NULL);
  ci = cuda_info(e, info);
  cr_expect(!ci->available && strstr(ci->detail, "compute capability 7.0"), "%s", ci->detail);
  attn_engine_close(e);
  /* --devices */
  k.major = 9;
  k.devices = 2;
  mock_set(&k);
  e = open_cuda(2, "0,1");
  ci = cuda_info(e, info);
  cr_expect(ci->available && strstr(ci->detail, "device 0") && strstr(ci->detail, "device 1") &&
                strstr(ci->detail, "2 streams each"),
            "%s", ci->detail);
  cr_expect_eq(mock_streams(), 12, "2 devices x 2 slots x 3 streams (upload, kernels, download)");
  cr_expect_eq(trun(e, &c, "cuda", &st), 0, "%s", st.message);
  attn_engine_close(e);
  const char *bad[][2] = {
      {"5", "does not exist"}, {"0,0", "listed twice"}, {"x", "device numbers"}};
  for (int i = 0; i < 3; i++) {
    e = open_cuda(0, bad[i][0]);
    ci = cuda_info(e, info);
    cr_expect(!ci->available && strstr(ci->detail, bad[i][1]), "--devices %s: %s", bad[i][0],
              ci->detail);
    attn_engine_close(e);
  }
  tcase_free(&c);
}

Test(cuda_backend, out_of_memory_is_retryable, .init = reset) {
  attn_engine *e = open_cuda(2, NULL);
  tprob p = tprob_make(1, 2, 1, 20, 30, 64, ATTN_BF16);
  tcase c;
  tcase_init(&c, &p, 2);
  mock_knobs k = MOCK_KNOBS(1, 9, (size_t)8 << 30, 1, 0, 0);
  mock_set(&k);
  attn_status st;
  cr_expect_eq(trun(e, &c, "cuda", &st), ATTN_ENOMEM);
  cr_expect(strstr(st.message, "out of memory for this request"), "%s", st.message);
  attn_backend_info info[4];
  cr_expect(cuda_info(e, info)->available, "out of memory must not retire the device");
  tcase_free(&c);
  cr_expect(check_one(e, &p, 3), "the next job runs");
  attn_engine_close(e);
  /* bigger than the card: refused up front, and auto uses the CPU */
  k.fail_alloc = 0;
  k.mem_total = (size_t)1 << 20;
  mock_set(&k);
  e = open_cuda(2, NULL);
  tprob big = tprob_make(1, 8, 8, 256, 256, 64, ATTN_F32);
  tcase_init(&c, &big, 4);
  cr_expect_eq(trun(e, &c, "cuda", &st), ATTN_ETOOBIG, "%s", st.message);
  cr_expect_eq(trun(e, &c, "auto", &st), 0, "%s", st.message);
  tcase_free(&c);
  attn_engine_close(e);
}

Test(cuda_backend, a_failed_launch_retires_the_device, .init = reset) {
  attn_engine *e = open_cuda(2, NULL);
  tprob p = tprob_make(1, 2, 1, 20, 30, 64, ATTN_F16);
  tcase c;
  tcase_init(&c, &p, 5);
  mock_knobs k = MOCK_KNOBS(1, 9, (size_t)8 << 30, 0, 1, 0);
  mock_set(&k);
  attn_status st;
  cr_expect_eq(trun(e, &c, "cuda", &st), ATTN_EDEVICE);
  cr_expect(strstr(st.message, "the attention kernel"), "%s", st.message);
  attn_backend_info info[4];
  const attn_backend_info *ci = cuda_info(e, info);
  cr_expect(!ci->available && strstr(ci->detail, "unhealthy"), "%s", ci->detail);
  cr_expect_eq(trun(e, &c, "cuda", &st), ATTN_ENODEV, "%s", st.message);
  cr_expect_eq(trun(e, &c, "auto", &st), 0, "auto goes on with the CPU: %s", st.message);
  tcase_free(&c);
  attn_engine_close(e);
  cr_expect_eq(mock_device_bytes(), 0);
}

Test(cuda_backend, a_faulting_stream_fails_its_job_without_hanging, .init = reset, .timeout = 30) {
  attn_engine *e = open_cuda(2, NULL);
  tprob p = tprob_make(1, 2, 1, 20, 30, 64, ATTN_BF16);
  tcase c;
  tcase_init(&c, &p, 6);
  mock_knobs k = MOCK_KNOBS(1, 9, (size_t)8 << 30, 0, 0, 1);
  mock_set(&k);
  attn_status st;
  cr_expect_eq(trun(e, &c, "cuda", &st), ATTN_EDEVICE);
  cr_expect(strstr(st.message, "stream failed") && strstr(st.message, "illegal memory access"),
            "%s", st.message);
  attn_backend_info info[4];
  cr_expect(!cuda_info(e, info)->available);
  tcase_free(&c);
  attn_engine_close(e);
}

/* The cancel flag: on one stream, job B waits for job A's slot; A's
 * completion callback cancels B, which is then never staged and ends once
 * with ECANCELED, its memory given back. Ordering, not timing: A's
 * callback waits until the test has queued B (A may end before that on a
 * fast machine, and B would then be refused at its submit instead). */
typedef struct cancel_outcome {
  int calls;
  attn_result res;
  int *cancel_other;
  int *submitted; /* the other job is queued; the callback waits for it */
} cancel_outcome;

static void cancel_done(const attn_result *res, void *arg) {
  cancel_outcome *o = arg;
  o->res = *res;
  const struct timespec ms = {0, 1000000};
  for (int i = 0; o->submitted && i < 20000 && !__atomic_load_n(o->submitted, __ATOMIC_SEQ_CST);
       i++)
    nanosleep(&ms, NULL);
  if (o->cancel_other)
    attn_cancel_set(o->cancel_other);
  __atomic_add_fetch(&o->calls, 1, __ATOMIC_SEQ_CST);
}

Test(cuda_backend, a_canceled_job_is_never_staged, .init = reset, .timeout = 30) {
  attn_engine *e = open_cuda(1, NULL);
  tprob p = tprob_make(1, 2, 1, 20, 30, 64, ATTN_F16);
  tcase a, b;
  tcase_init(&a, &p, 11);
  tcase_init(&b, &p, 12);
  int flag = 0;
  b.req.cancel = &flag;
  a.req.backend = b.req.backend = "cuda";
  int b_queued = 0;
  cancel_outcome oa = {.cancel_other = &flag, .submitted = &b_queued}, ob = {0};
  attn_status st;
  cr_assert_eq(attn_engine_submit(e, &a.req, cancel_done, &oa, &st), 0, "%s", st.message);
  cr_assert_eq(attn_engine_submit(e, &b.req, cancel_done, &ob, &st), 0, "%s", st.message);
  __atomic_store_n(&b_queued, 1, __ATOMIC_SEQ_CST);
  attn_engine_close(e);
  cr_expect_eq(oa.calls, 1);
  cr_expect_eq(oa.res.status.code, 0, "job A: %s", oa.res.status.message);
  cr_expect_eq(ob.calls, 1, "job B completed %d times", ob.calls);
  cr_expect_eq(ob.res.status.code, ATTN_ECANCELED, "job B: %d %s", ob.res.status.code,
               ob.res.status.message);
  cr_expect_eq(mock_device_bytes(), 0);
  tcase_free(&a);
  tcase_free(&b);
}

/* ---- the backward pass ------------------------------------------------------ */

/* Runs a backward case on backend cuda; checks it against float64 and how
 * many kernel launches it took (a forward first when lse is absent). */
static bool check_bwd(attn_engine *e, const tprob *p, uint64_t seed, bool with_lse) {
  tcase c;
  tref_bwd ref;
  char desc[200];
  attn_status st = {0};
  tdesc(p, desc, sizeof desc);
  tcase_init(&c, p, seed);
  cr_assert_eq(tcase_backward(&c, with_lse, ~seed, &st), 0, "%s: %s", desc, st.message);
  cr_assert_eq(tref_bwd_compute(&c, &ref, &st), 0, "%s: %s", desc, st.message);
  long launches = mock_launches();
  int rc = trun(e, &c, "cuda", &st);
  bool ok = rc == 0;
  cr_expect_eq(rc, 0, "%s lse %d: %s", desc, with_lse, st.message);
  if (ok) {
    terr_bwd err = tref_bwd_check(&c, &ref);
    ok = terr_bwd_within(&err, ttol(p->dt)) && mock_launches() - launches == (with_lse ? 1 : 2);
    cr_expect(ok, "%s lse %d: dq %.3g dk %.3g dv %.3g (tol %.0e), %ld launches", desc, with_lse,
              err.dq, err.dk, err.dv, ttol(p->dt), mock_launches() - launches);
  }
  tref_bwd_free(&ref);
  tcase_free(&c);
  return ok;
}

/* Awkward shapes of the backward: every dtype, GQA and MQA, masks and
 * windows, rows with no visible key, strided layouts, padded head dims. */
static int bwd_problems(tprob *ps) {
  int n = 0;
  for (int dt = 0; dt < ATTN_DTYPE_COUNT; dt++) {
    tprob p = tprob_make(2, 4, 2, 19, 23, 37, (attn_dtype)dt);
    ps[n++] = p;
    p = tprob_make(1, 6, 2, 33, 17, 64, (attn_dtype)dt);
    p.causal = true; /* Nq > Nkv: the first 16 rows see no key */
    p.strided = true;
    ps[n++] = p;
    p = tprob_make(1, 3, 1, 40, 40, 8, (attn_dtype)dt);
    p.wl = 5;
    p.wr = 2;
    ps[n++] = p;
    p = tprob_make(2, 2, 2, 1, 70, 80, (attn_dtype)dt);
    p.scale = 0.3;
    ps[n++] = p;
    p = tprob_make(1, 2, 1, 9, 30, 16, (attn_dtype)dt);
    p.wl = 0;
    p.wr = 0; /* the diagonal only */
    p.strided = true;
    ps[n++] = p;
  }
  return n;
}

Test(cuda_backend, backward_through_staging, .init = reset) {
  attn_engine *e = open_cuda(2, NULL);
  tprob ps[TCASES_MAX];
  int n = bwd_problems(ps), passed = 0;
  for (int i = 0; i < n; i++)
    for (int with_lse = 0; with_lse < 2; with_lse++)
      passed += check_bwd(e, &ps[i], 500 + 2 * (uint64_t)i + (uint64_t)with_lse, with_lse);
  cr_expect_eq(passed, 2 * n);
  attn_engine_close(e);
  cr_expect_eq(mock_device_bytes(), 0, "device memory left allocated");
  cr_expect_eq(mock_pinned_buffers(), 0, "pinned buffers left");
}

/* The backward with attn_config.cuda_bwd_atomic_dq: every case takes the
 * atomic path (one launch, no dQ grid), matches float64 as the default
 * does, and its job holds the F32 dQ accumulator [B, Hq, Nq, dp] more of
 * device memory; the default engine never takes it. */
static bool lists_disabled(attn_engine *e, const char *kernel);

static attn_engine *open_atomic(bool atomic, bool check) {
  attn_config cfg;
  attn_config_init(&cfg);
  cfg.threads = 2;
  cfg.cuda_streams = 2;
  cfg.cuda_self_check_off = !check;
  cfg.cuda_bwd_atomic_dq = atomic;
  attn_engine *e;
  attn_status st;
  cr_assert_eq(attn_engine_open(&cfg, &e, &st), 0, "%s", st.message);
  return e;
}

Test(cuda_backend, backward_atomic_dq_when_configured, .init = reset) {
  attn_engine *det = open_atomic(false, false), *at = open_atomic(true, false);
  tprob ps[TCASES_MAX];
  int n = bwd_problems(ps);
  for (int i = 0; i < n; i++) {
    size_t b_det, b_at;
    cr_expect(check_bwd(det, &ps[i], 700 + (uint64_t)i, true));
    cr_expect(!mock_last_bwd_atomic(&b_det), "case %d: the default took the atomic path", i);
    cr_expect(check_bwd(at, &ps[i], 700 + (uint64_t)i, true));
    cr_expect(mock_last_bwd_atomic(&b_at), "case %d: the atomic path was not taken", i);
    size_t acc = (size_t)(ps[i].b * ps[i].hq * ps[i].nq) * (size_t)attn_cu_dp(ps[i].d) * 4;
    cr_expect(b_at >= b_det + acc && b_at < b_det + acc + 512,
              "case %d: %zu device bytes, the deterministic path %zu, the accumulator %zu", i, b_at,
              b_det, acc);
  }
  attn_engine_close(det);
  attn_engine_close(at);
  cr_expect_eq(mock_device_bytes(), 0, "device memory left allocated");
}

/* A wrong atomic path fails its self-check cases and is turned off alone:
 * the backward instances stay on and serve on the two-kernel path. */
Test(cuda_backend, a_wrong_atomic_path_turns_it_off, .init = reset) {
  mock_knobs k = MOCK_KNOBS(1, 9, (size_t)8 << 30, 0, 0, 0);
  k.wrong_atomic_dq = true;
  mock_set(&k);
  attn_engine *e = open_atomic(true, true);
  cr_expect(lists_disabled(e, "bwd_atomic_dq"));
  for (int i = ATTN_CU_BWD_MMA_D64; i <= ATTN_CU_BWD_SIMT_F32; i++)
    cr_expect(!lists_disabled(e, attn_cu_kernel_name((attn_cu_kernel)i)), "%s disabled",
              attn_cu_kernel_name((attn_cu_kernel)i));
  tprob p = tprob_make(1, 4, 2, 19, 23, 120, ATTN_BF16);
  cr_expect(check_bwd(e, &p, 86, true));
  cr_expect(!mock_last_bwd_atomic(NULL), "the disabled path still served");
  attn_engine_close(e);
}

/* A value planted in tensor `name` ("o", "do") of c at (b, h, n, d). */
static void plant_q_shaped(tcase *c, const char *name, int64_t b, int64_t h, int64_t n, int64_t d,
                           float x) {
  const attn_request *r = &c->req;
  const int64_t *s = !strcmp(name, "o") ? r->o_stride : r->do_stride;
  int64_t s0 = s[0], s1 = s[1], s2 = s[2];
  if (!s0 && !s1 && !s2)
    s2 = c->p.d, s1 = c->p.nq * s2, s0 = c->p.hq * s1;
  void *base = !strcmp(name, "o") ? c->o : c->dout;
  attn_store_elem(base, c->p.dt, (size_t)(b * s0 + h * s1 + n * s2 + d), x);
}

Test(cuda_backend, backward_refuses_what_forward_refuses, .init = reset) {
  attn_engine *e = open_cuda(2, NULL);
  static const char *const tn[2] = {"o", "do"};
  for (int dt = 0; dt < ATTN_DTYPE_COUNT; dt++)
    for (int t = 0; t < 2; t++)
      for (int strided = 0; strided < 2; strided++) {
        tprob p = tprob_make(2, 4, 2, 9, 11, 37, (attn_dtype)dt);
        p.strided = strided;
        tcase c;
        attn_status st = {0};
        tcase_init(&c, &p, 21);
        cr_assert_eq(tcase_backward(&c, true, ~21ull, &st), 0, "%s", st.message);
        plant_q_shaped(&c, tn[t], 1, 3 - t, 8 - t, 36 - t, INFINITY);
        int rc = trun(e, &c, "cuda", &st);
        char want[128];
        snprintf(want, sizeof want, "tensor %s holds a non-finite value at [1, %d, %d, %d]", tn[t],
                 3 - t, 8 - t, 36 - t);
        cr_expect(rc == ATTN_ENONFINITE && strstr(st.message, want), "%s %s strided %d: %s: %s",
                  attn_dtype_name(p.dt), tn[t], strided, attn_err_name(rc), st.message);
        tcase_free(&c);
      }
  /* lse: NaN is non-finite; -inf on a row that sees keys is a wrong lse */
  tprob p = tprob_make(1, 2, 1, 6, 6, 16, ATTN_BF16);
  tcase c;
  attn_status st = {0};
  tcase_init(&c, &p, 22);
  cr_assert_eq(tcase_backward(&c, true, ~22ull, &st), 0, "%s", st.message);
  long launches = mock_launches();
  c.lse_in[7] = NAN;
  cr_expect_eq(trun(e, &c, "cuda", &st), ATTN_ENONFINITE, "%s", st.message);
  cr_expect(strstr(st.message, "tensor lse") && strstr(st.message, "[0, 1, 1]"), "%s", st.message);
  c.lse_in[7] = -INFINITY;
  cr_expect_eq(trun(e, &c, "cuda", &st), ATTN_EINVAL, "%s", st.message);
  cr_expect_eq(mock_launches(), launches, "a refused lse launches nothing");
  /* m, l or lse outputs: a backward pass returns no statistics */
  c.lse_in[7] = 0;
  float stat[12];
  c.req.lse = stat;
  cr_expect_eq(trun(e, &c, "cuda", &st), ATTN_EINVAL, "%s", st.message);
  tcase_free(&c);
  attn_engine_close(e);
}

Test(cuda_backend, backward_sizes_and_device_failures, .init = reset) {
  attn_engine *e = open_cuda(2, NULL);
  tprob p = tprob_make(1, 2, 1, 20, 30, 64, ATTN_F16);
  /* out of device memory: retryable, the device stays */
  mock_knobs k = MOCK_KNOBS(1, 9, (size_t)8 << 30, 1, 0, 0);
  mock_set(&k);
  tcase c;
  attn_status st = {0};
  tcase_init(&c, &p, 31);
  cr_assert_eq(tcase_backward(&c, false, ~31ull, &st), 0, "%s", st.message);
  cr_expect_eq(trun(e, &c, "cuda", &st), ATTN_ENOMEM, "%s", st.message);
  cr_expect(check_bwd(e, &p, 32, false), "the next backward runs");
  /* the forward that recomputes lse fails to launch: the device is done */
  k.fail_alloc = 0;
  k.fail_launch = 1;
  mock_set(&k);
  cr_expect_eq(trun(e, &c, "cuda", &st), ATTN_EDEVICE, "%s", st.message);
  cr_expect(strstr(st.message, "the forward pass that recomputes lse"), "%s", st.message);
  tcase_free(&c);
  attn_engine_close(e);
  cr_expect_eq(mock_device_bytes(), 0);
  /* bigger than the card: refused up front; a forward of the same shape
   * (fewer buffers) still fits */
  mock_defaults();
  k = MOCK_KNOBS(1, 9, (size_t)3 << 20, 0, 0, 0);
  mock_set(&k);
  e = open_cuda(2, NULL);
  tprob big = tprob_make(1, 8, 8, 256, 256, 64, ATTN_F32);
  tcase_init(&c, &big, 33);
  cr_assert_eq(tcase_backward(&c, true, ~33ull, &st), 0, "%s", st.message);
  cr_expect_eq(trun(e, &c, "cuda", &st), ATTN_ETOOBIG, "%s", st.message);
  cr_expect(strstr(st.message, "MiB of device memory"), "%s", st.message);
  tcase f;
  tcase_init(&f, &big, 34);
  cr_expect_eq(trun(e, &f, "cuda", &st), 0, "forward: %s", st.message);
  tcase_free(&f);
  tcase_free(&c);
  attn_engine_close(e);
}

Test(cuda_backend, a_canceled_backward_is_never_staged, .init = reset, .timeout = 30) {
  attn_engine *e = open_cuda(1, NULL);
  tprob p = tprob_make(1, 2, 1, 20, 30, 64, ATTN_BF16);
  tcase a, b;
  tref_bwd ref;
  attn_status st = {0};
  tcase_init(&a, &p, 41);
  tcase_init(&b, &p, 42);
  cr_assert_eq(tcase_backward(&a, true, ~41ull, &st), 0, "%s", st.message);
  cr_assert_eq(tcase_backward(&b, false, ~42ull, &st), 0, "%s", st.message);
  cr_assert_eq(tref_bwd_compute(&a, &ref, &st), 0, "%s", st.message);
  int flag = 0;
  b.req.cancel = &flag;
  a.req.backend = b.req.backend = "cuda";
  /* A's end cancels B only once B is queued: on a busy machine A can end
   * before B is submitted, and a canceled job is refused at submit. */
  int b_queued = 0;
  cancel_outcome oa = {.cancel_other = &flag, .submitted = &b_queued}, ob = {0};
  long launches = mock_launches();
  cr_assert_eq(attn_engine_submit(e, &a.req, cancel_done, &oa, &st), 0, "%s", st.message);
  cr_assert_eq(attn_engine_submit(e, &b.req, cancel_done, &ob, &st), 0, "%s", st.message);
  __atomic_store_n(&b_queued, 1, __ATOMIC_SEQ_CST);
  attn_engine_close(e);
  cr_expect(oa.calls == 1 && oa.res.status.code == 0, "job A: %s", oa.res.status.message);
  terr_bwd err = tref_bwd_check(&a, &ref);
  cr_expect(terr_bwd_within(&err, ttol(p.dt)), "job A: dq %.3g dk %.3g dv %.3g", err.dq, err.dk,
            err.dv);
  cr_expect(ob.calls == 1 && ob.res.status.code == ATTN_ECANCELED, "job B: %d calls, %s", ob.calls,
            ob.res.status.message);
  cr_expect_eq(mock_launches() - launches, 1, "only job A launched");
  cr_expect_eq(mock_device_bytes(), 0);
  tref_bwd_free(&ref);
  tcase_free(&a);
  tcase_free(&b);
}

/* ---- issue 18: host-code bugs ---------------------------------------------- */

/* A request whose every tensor is one broadcast row (strides {0, 0, D}):
 * any batch and head count validate while needing D elements of memory. */
static void broadcast_request(attn_request *r, void *buf, int64_t b, int64_t hq, int64_t hkv,
                              int64_t nq, int64_t nkv) {
  attn_request_init(r);
  r->batch = b, r->heads_q = hq, r->heads_kv = hkv, r->seq_q = nq, r->seq_kv = nkv;
  r->head_dim = 8;
  r->dtype = ATTN_F16;
  r->q = r->k = r->v = r->o = buf;
  const int64_t s[3] = {0, 0, 8};
  memcpy(r->q_stride, s, sizeof s);
  memcpy(r->k_stride, s, sizeof s);
  memcpy(r->v_stride, s, sizeof s);
  memcpy(r->o_stride, s, sizeof s);
  r->backend = "cuda";
}

Test(cuda_backend, batch_and_heads_past_the_grid_are_refused_before_narrowing, .init = reset,
     .timeout = 30) {
  /* 2^32 + 1 narrowed to int is 1: the staging buffer would be sized for
   * one batch entry and packing would write 2^32 + 1 rows into it. */
  attn_engine *e = open_cuda(1, NULL);
  static uint16_t buf[8];
  const int64_t big = ((int64_t)1 << 32) + 1;
  const int64_t shapes[][3] = {{big, 1, 1}, {1, big + 1, 2}, {1, big - 1, big - 1}};
  for (int i = 0; i < 3; i++) {
    attn_request r;
    broadcast_request(&r, buf, shapes[i][0], shapes[i][1], shapes[i][2], 1, 1);
    attn_status st = {0};
    int rc = attn_engine_run(e, &r, NULL, &st);
    cr_expect(rc == ATTN_EUNSUPPORTED && strstr(st.message, "65535"), "shape %d: %s: %s", i,
              attn_err_name(rc), st.message);
  }
  attn_engine_close(e);
}

/* Head dims past the kernels' 256 (the contract takes 576): cuda declines
 * them naming the limit, and auto runs them on the cpu, right against
 * float64. */
Test(cuda_backend, heads_past_256_are_declined_and_auto_runs_them_on_the_cpu, .init = reset) {
  attn_engine *e = open_cuda(2, NULL);
  tprob p = tprob_make(1, 4, 2, 40, 90, 320, ATTN_F16);
  p.causal = true, p.stats = true;
  tcase c;
  tcase_init(&c, &p, 78);
  attn_status st = {0};
  cr_expect_eq(trun(e, &c, "cuda", &st), ATTN_EUNSUPPORTED);
  cr_expect(strstr(st.message, "head_dim 320") && strstr(st.message, "256"), "%s", st.message);
  cr_assert_eq(trun(e, &c, "auto", &st), 0, "%s", st.message);
  terr err = tcheck(&c);
  cr_expect(err.o <= ttol(p.dt) && err.stats <= 1e-5, "O error %.3g, stats %.3g", err.o, err.stats);
  tcase_free(&c);
  attn_engine_close(e);
}

Test(cuda_backend, a_sequence_of_exactly_2_30_is_taken, .init = reset, .timeout = 30) {
  /* Accepted at submission, then canceled while it waits for the one slot
   * (job a holds it), so the broadcast buffer is never staged. */
  mock_knobs k = MOCK_KNOBS(1, 9, (size_t)1 << 42, 0, 0, 0);
  mock_set(&k);
  attn_engine *e = open_cuda(1, NULL);
  k.hold_kernels = true; /* after the self-check */
  mock_set(&k);
  tprob p = tprob_make(1, 1, 1, 4, 4, 8, ATTN_F16);
  tcase a;
  tcase_init(&a, &p, 51);
  a.req.backend = "cuda";
  cancel_outcome oa = {0}, ob = {0};
  attn_status st = {0};
  cr_assert_eq(attn_engine_submit(e, &a.req, cancel_done, &oa, &st), 0, "%s", st.message);
  static uint16_t buf[8];
  attn_request r;
  const int64_t max = (int64_t)1 << 30;
  int flag = 0;
  broadcast_request(&r, buf, 1, 1, 1, 1, max);
  r.cancel = &flag;
  int rc = attn_engine_submit(e, &r, cancel_done, &ob, &st);
  cr_expect_eq(rc, 0, "2^30 keys: %s: %s", attn_err_name(rc), st.message);
  attn_cancel_set(&flag);
  mock_open_gate();
  broadcast_request(&r, buf, 1, 1, 1, max + 1, 1);
  rc = attn_engine_submit(e, &r, cancel_done, &ob, &st);
  cr_expect(rc == ATTN_EUNSUPPORTED && strstr(st.message, "at most 1073741824") &&
                strstr(st.message, "seq_q 1073741825"),
            "2^30 + 1 queries: %s: %s", attn_err_name(rc), st.message);
  attn_engine_close(e);
  cr_expect_eq(oa.res.status.code, 0, "%s", oa.res.status.message);
  cr_expect_eq(ob.res.status.code, ATTN_ECANCELED, "%s", ob.res.status.message);
  tcase_free(&a);
}

/* Jobs submitted until `flag` is set or `rounds` ran: each wakes the
 * dispatcher well within its poll interval. */
static int keep_waking(attn_engine *e, const int *flag, int rounds) {
  tprob p = tprob_make(1, 1, 1, 4, 4, 8, ATTN_F16);
  int n = 0;
  for (; n < rounds && !__atomic_load_n(flag, __ATOMIC_SEQ_CST); n++) {
    tcase c;
    tcase_init(&c, &p, (uint64_t)n);
    attn_status st;
    trun(e, &c, "cuda", &st);
    tcase_free(&c);
    struct timespec ts = {0, 5 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  return n;
}

Test(cuda_backend, a_fault_is_noticed_while_requests_keep_arriving, .init = reset, .timeout = 60) {
  attn_engine *e = open_cuda(2, NULL);
  tprob p = tprob_make(1, 2, 1, 20, 30, 64, ATTN_BF16);
  tcase c;
  tcase_init(&c, &p, 61);
  c.req.backend = "cuda";
  mock_knobs k = MOCK_KNOBS(1, 9, (size_t)8 << 30, 0, 0, 1);
  mock_set(&k);
  cancel_outcome o = {0};
  attn_status st;
  long before = mock_launches();
  cr_assert_eq(attn_engine_submit(e, &c.req, cancel_done, &o, &st), 0, "%s", st.message);
  /* the fault is the next launch's: it must be this job's, not a waker's */
  const struct timespec ms = {0, 1000000};
  for (int i = 0; i < 30000 && mock_launches() == before; i++)
    nanosleep(&ms, NULL);
  cr_assert_gt(mock_launches(), before, "the faulting job never launched");
  /* about 10 s of wake-ups, far past the one-second poll */
  keep_waking(e, &o.calls, 2000);
  cr_expect_eq(__atomic_load_n(&o.calls, __ATOMIC_SEQ_CST), 1,
               "the faulted job is still pending while other jobs arrive");
  attn_engine_close(e);
  cr_expect_eq(o.res.status.code, ATTN_EDEVICE, "%s", o.res.status.message);
  tcase_free(&c);
}

Test(cuda_backend, the_fault_poll_and_a_host_function_race_once, .init = reset, .timeout = 60) {
  /* The poll finds the slot busy and not done, the host function runs
   * before the poll's query, and the query then reports the poisoned
   * context: the job must complete exactly once. */
  attn_engine *e = open_cuda(1, NULL);
  tprob p = tprob_make(1, 2, 1, 20, 30, 64, ATTN_F16);
  tcase c;
  tcase_init(&c, &p, 62);
  c.req.backend = "cuda";
  mock_knobs k = MOCK_KNOBS(1, 9, (size_t)8 << 30, 0, 0, 0);
  k.hold_kernels = true;
  k.race_query = 1;
  mock_set(&k);
  cancel_outcome o = {0};
  attn_status st;
  cr_assert_eq(attn_engine_submit(e, &c.req, cancel_done, &o, &st), 0, "%s", st.message);
  attn_engine_close(e);
  cr_expect_eq(o.calls, 1, "the job completed %d times", o.calls);
  cr_expect_eq(mock_device_bytes(), 0);
  tcase_free(&c);
}

Test(cuda_backend, a_refused_launch_fails_its_job_alone, .init = reset) {
  attn_engine *e = open_cuda(2, NULL);
  tprob p = tprob_make(1, 2, 1, 20, 30, 64, ATTN_F16);
  tcase c;
  tcase_init(&c, &p, 71);
  mock_knobs k = MOCK_KNOBS(1, 9, (size_t)8 << 30, 0, 1, 0);
  k.launch_error = cudaErrorInvalidValue;
  mock_set(&k);
  attn_status st;
  cr_expect_eq(trun(e, &c, "cuda", &st), ATTN_EDEVICE);
  cr_expect(strstr(st.message, "the attention kernel") && strstr(st.message, "InvalidValue"), "%s",
            st.message);
  attn_backend_info info[4];
  const attn_backend_info *ci = cuda_info(e, info);
  cr_expect(ci->available, "a refused launch retired the device: %s", ci->detail);
  tcase_free(&c);
  cr_expect(check_one(e, &p, 72), "the next job runs on the device");
  attn_engine_close(e);
  cr_expect_eq(mock_device_bytes(), 0);
}

/* ---- the start-up self-check ------------------------------------------------ */

static attn_engine *open_checked(bool check) {
  attn_config cfg;
  attn_config_init(&cfg);
  cfg.threads = 2;
  cfg.cuda_streams = 2;
  cfg.cuda_self_check_off = !check;
  attn_engine *e;
  attn_status st;
  cr_assert_eq(attn_engine_open(&cfg, &e, &st), 0, "%s", st.message);
  return e;
}

/* Whether the engine's cuda entry lists `kernel` as disabled, with a why. */
static bool lists_disabled(attn_engine *e, const char *kernel) {
  attn_backend_info info[4];
  const attn_backend_info *ci = cuda_info(e, info);
  for (int i = 0; i < ci->ndisabled; i++)
    if (!strcmp(ci->disabled[i].kernel, kernel))
      return strstr(ci->disabled[i].why, "device 0: ") && strstr(ci->disabled[i].why, "error");
  return false;
}

Test(cuda_backend, self_check_passes_every_instance, .init = reset) {
  long before = mock_launches();
  attn_engine *e = open_checked(true);
  attn_backend_info info[4];
  const attn_backend_info *ci = cuda_info(e, info);
  /* without sm_90a code the Hopper instances stay listed, saying so */
  int expect = attn_cu_hopper_built() ? 0 : 3;
  cr_expect(ci->available && ci->ndisabled == expect, "%d disabled, first %s: %s", ci->ndisabled,
            ci->ndisabled ? ci->disabled[0].kernel : "", ci->ndisabled ? ci->disabled[0].why : "");
  for (int i = 0; i < ci->ndisabled; i++)
    cr_expect(!strncmp(ci->disabled[i].kernel, "hopper_", 7) &&
                  strstr(ci->disabled[i].why, "no sm_90a code"),
              "%s: %s", ci->disabled[i].kernel, ci->disabled[i].why);
  cr_expect_geq(mock_launches() - before, 10, "every case launched");
  attn_engine_close(e);
  before = mock_launches();
  e = open_checked(false);
  cr_expect_eq(mock_launches(), before, "--gpu-self-check off launches nothing");
  attn_engine_close(e);
}

/* Each forward and backward instance runs at least one self-check case of
 * its own, neither split nor packed (so a failure disables that instance,
 * not the split or packing path), and a 128-row instance one with a full
 * block and a partial second. */
Test(cuda_backend, self_check_reaches_every_instance_plain, .init = reset) {
  mock_knobs k = MOCK_KNOBS(1, 8, (size_t)8 << 30, 0, 0, 0);
  mock_set(&k);
  long before[ATTN_CU_KERNEL_COUNT], multi_before = 0, multi = 0;
  for (int i = 0; i < ATTN_CU_KERNEL_COUNT; i++)
    before[i] = mock_plain_launches(i, i == ATTN_CU_MMA_D128 ? &multi_before : NULL);
  attn_engine *e = open_checked(true);
  attn_backend_info info[4];
  const attn_backend_info *ci = cuda_info(e, info);
  for (int i = 0; i < ci->ndisabled; i++)
    cr_expect(!strncmp(ci->disabled[i].kernel, "hopper_", 7), "%s disabled: %s",
              ci->disabled[i].kernel, ci->disabled[i].why);
  for (int i = ATTN_CU_MMA_D64; i <= ATTN_CU_BWD_SIMT_F32; i++)
    cr_expect_gt(mock_plain_launches(i, i == ATTN_CU_MMA_D128 ? &multi : NULL), before[i],
                 "no plain self-check case ran %s", attn_cu_kernel_name((attn_cu_kernel)i));
  cr_expect_gt(multi, multi_before, "no case ran two query tiles of mma_d128's 128-row blocks");
  attn_engine_close(e);
}

Test(cuda_backend, a_wrong_head_dim_instance_falls_back_to_the_next, .init = reset) {
  /* compute capability 8: the Hopper instance, which would take this F16
   * forward on a 9.0 device, is out of the picture */
  mock_knobs k = MOCK_KNOBS(1, 8, (size_t)8 << 30, 0, 0, 0);
  k.wrong_kernel = ATTN_CU_MMA_D64 + 1;
  mock_set(&k);
  attn_engine *e = open_checked(true);
  cr_expect(lists_disabled(e, "mma_d64"), "mma_d64 not listed");
  cr_expect(!lists_disabled(e, "mma_d96"));
  tprob p = tprob_make(1, 4, 2, 19, 40, 64, ATTN_F16);
  p.causal = true;
  cr_expect(check_one(e, &p, 81), "a head dim of 64 still runs, right");
  cr_expect_eq(mock_last_kernel(NULL), ATTN_CU_MMA_D96, "ran on %s",
               attn_cu_kernel_name((attn_cu_kernel)mock_last_kernel(NULL)));
  attn_engine_close(e);
  /* unchecked, the same kernel answers wrong: the check is what guards */
  e = open_checked(false);
  tcase c;
  tcase_init(&c, &p, 81);
  attn_status st;
  cr_assert_eq(trun(e, &c, "cuda", &st), 0, "%s", st.message);
  cr_expect_gt(tcheck(&c).o, ttol(p.dt), "the wrong kernel was right after all");
  tcase_free(&c);
  attn_engine_close(e);
}

/* Whether the disabled list has `kernel` with `why` in its reason. */
static bool disabled_because(attn_engine *e, const char *kernel, const char *why) {
  attn_backend_info info[4];
  const attn_backend_info *ci = cuda_info(e, info);
  for (int i = 0; i < ci->ndisabled; i++)
    if (!strcmp(ci->disabled[i].kernel, kernel))
      return strstr(ci->disabled[i].why, why) != NULL;
  return false;
}

/* A wrong decode kernel (decode.cuh): its self-check cases, which pack
 * and split, disable that instance, not the GQA packing nor the split
 * merge; its decodes then take the next decode instance, and with every
 * decode instance wrong, the tiled forward (packed and split). */
Test(cuda_backend, a_wrong_decode_kernel_is_disabled_alone, .init = reset) {
  mock_knobs k = MOCK_KNOBS(1, 8, (size_t)8 << 30, 0, 0, 0);
  k.wrong_kernel = ATTN_CU_DECODE_D64 + 1;
  mock_set(&k);
  attn_engine *e = open_checked(true);
  cr_expect(lists_disabled(e, "decode_d64"), "decode_d64 not listed");
  cr_expect(!lists_disabled(e, "decode_d128") && !lists_disabled(e, "gqa_pack") &&
                !lists_disabled(e, "split_kv_merge") && !lists_disabled(e, "mma_d64"),
            "a wrong decode kernel took something else down");
  tprob p = tprob_make(1, 8, 2, 1, 2000, 64, ATTN_F16);
  cr_expect(check_one(e, &p, 82), "a decode of head dim 64 still runs, right");
  cr_expect_eq(mock_last_kernel(NULL), ATTN_CU_DECODE_D128, "ran on %s",
               attn_cu_kernel_name((attn_cu_kernel)mock_last_kernel(NULL)));
  attn_engine_close(e);
}

/* The decode kernel is compile-verified only: with the self-check off it
 * is off, saying so, and decodes take the tiled forward; checked, it
 * serves them. */
Test(cuda_backend, the_decode_kernel_waits_for_the_self_check, .init = reset) {
  mock_knobs k = MOCK_KNOBS(1, 8, (size_t)8 << 30, 0, 0, 0);
  mock_set(&k);
  tprob p = tprob_make(1, 8, 2, 1, 2000, 128, ATTN_BF16);
  attn_engine *e = open_checked(false);
  cr_expect(disabled_because(e, "decode_d128", "self-check, which is off"));
  cr_expect(check_one(e, &p, 83));
  cr_expect_eq(mock_last_kernel(NULL), ATTN_CU_MMA_D128, "unchecked, the decode kernel serves");
  attn_engine_close(e);
  e = open_checked(true);
  cr_expect(!disabled_because(e, "decode_d128", ""), "passed, yet still listed");
  cr_expect(check_one(e, &p, 83));
  cr_expect_eq(mock_last_kernel(NULL), ATTN_CU_DECODE_D128, "ran on %s",
               attn_cu_kernel_name((attn_cu_kernel)mock_last_kernel(NULL)));
  attn_engine_close(e);
}

/* One of the new head-dim instances: its head dims go to mma_d192, the
 * others keep their own, and /v1/info's backends[].disabled (the engine's
 * backend info) names it with the case that failed. */
Test(cuda_backend, a_wrong_d160_instance_falls_back_to_d192, .init = reset) {
  mock_knobs k = MOCK_KNOBS(1, 8, (size_t)8 << 30, 0, 0, 0);
  k.wrong_kernel = ATTN_CU_MMA_D160 + 1;
  mock_set(&k);
  attn_engine *e = open_checked(true);
  cr_expect(disabled_because(e, "mma_d160", "device 0: o error"), "mma_d160 not listed");
  cr_expect(disabled_because(e, "mma_d160", "[4, 2, 65, 70, 150]"), "not the plain case's shape");
  cr_expect(!lists_disabled(e, "mma_d192") && !lists_disabled(e, "mma_d128") &&
                !lists_disabled(e, "gqa_pack") && !lists_disabled(e, "split_kv_merge"),
            "the failure was laid on another instance or path");
  attn_backend_info info[4];
  const attn_backend_info *ci = cuda_info(e, info);
  for (int i = 0; i < ci->ndisabled; i++)
    cr_expect(!strcmp(ci->disabled[i].kernel, "mma_d160") ||
                  !strncmp(ci->disabled[i].kernel, "hopper_", 7),
              "%s disabled too", ci->disabled[i].kernel);
  const int dims[] = {130, 150, 160};
  for (int i = 0; i < 3; i++) {
    tprob p = tprob_make(1, 4, 2, 40, 50, dims[i], i == 1 ? ATTN_BF16 : ATTN_F16);
    p.causal = i != 2;
    cr_expect(check_one(e, &p, 86 + (uint64_t)i), "a head dim of %d still runs, right", dims[i]);
    cr_expect_eq(mock_last_kernel(NULL), ATTN_CU_MMA_D192, "d %d ran on %s", dims[i],
                 attn_cu_kernel_name((attn_cu_kernel)mock_last_kernel(NULL)));
  }
  tprob p = tprob_make(1, 4, 2, 40, 50, 128, ATTN_F16);
  cr_expect(check_one(e, &p, 89));
  cr_expect_eq(mock_last_kernel(NULL), ATTN_CU_MMA_D128, "a head dim of 128 keeps its instance");
  attn_engine_close(e);
}

Test(cuda_backend, a_wrong_f32_kernel_leaves_f32_to_the_cpu, .init = reset) {
  mock_knobs k = MOCK_KNOBS(1, 9, (size_t)8 << 30, 0, 0, 0);
  k.wrong_kernel = ATTN_CU_SIMT_F32 + 1;
  mock_set(&k);
  attn_engine *e = open_checked(true);
  cr_expect(lists_disabled(e, "simt_f32"));
  tprob p = tprob_make(1, 2, 1, 9, 30, 40, ATTN_F32);
  tcase c;
  tcase_init(&c, &p, 82);
  attn_status st;
  cr_expect_eq(trun(e, &c, "cuda", &st), ATTN_EUNSUPPORTED, "%s", st.message);
  cr_expect(strstr(st.message, "self-check"), "%s", st.message);
  attn_result res;
  c.req.backend = "auto";
  cr_expect_eq(attn_engine_run(e, &c.req, &res, &st), 0, "%s", st.message);
  cr_expect_str_eq(res.backend, "cpu");
  tcase_free(&c);
  tprob h = tprob_make(1, 2, 1, 9, 30, 40, ATTN_BF16);
  cr_expect(check_one(e, &h, 83), "BF16 still runs on the device");
  attn_engine_close(e);
}

Test(cuda_backend, a_wrong_merge_turns_split_kv_off, .init = reset) {
  mock_knobs k = MOCK_KNOBS(1, 9, (size_t)8 << 30, 0, 0, 0);
  k.wrong_merge = true;
  mock_set(&k);
  attn_engine *e = open_checked(true);
  cr_expect(lists_disabled(e, "split_kv_merge"));
  cr_expect(!lists_disabled(e, "mma_d64") && !lists_disabled(e, "simt_f32"));
  tprob p = tprob_make(1, 2, 1, 1, 1500, 64, ATTN_BF16);
  p.stats = true;
  cr_expect(check_one(e, &p, 84), "the decode runs unsplit");
  int nsplit = 0;
  mock_last_kernel(&nsplit);
  cr_expect_eq(nsplit, 1);
  attn_engine_close(e);
}

Test(cuda_backend, a_wrong_backward_instance_falls_back, .init = reset) {
  mock_knobs k = MOCK_KNOBS(1, 9, (size_t)8 << 30, 0, 0, 0);
  k.wrong_kernel = ATTN_CU_BWD_MMA_D128 + 1;
  mock_set(&k);
  attn_engine *e = open_checked(true);
  cr_expect(lists_disabled(e, "bwd_mma_d128"));
  cr_expect(!lists_disabled(e, "mma_d128"), "the forward instance is fine");
  tprob p = tprob_make(1, 4, 2, 19, 23, 120, ATTN_BF16);
  cr_expect(check_bwd(e, &p, 85, true));
  cr_expect_eq(mock_last_kernel(NULL), ATTN_CU_BWD_MMA_D256);
  attn_engine_close(e);
}

/* The Hopper instance is compile-verified only: it serves an F16/BF16
 * forward only on a 9.0 device, with the sm_90a code built in, after it
 * passed its self-check cases there. */
Test(cuda_backend, hopper_serves_only_after_its_self_check, .init = reset) {
  if (!attn_cu_hopper_built()) {
    printf("skipped: this build has no sm_90a code (CUDA_ARCHS without 90a)\n");
    return;
  }
  /* MHA: a GQA group of 19-row queries would be packed into one mma.sync
   * block, which the Hopper instance never takes (select.c) */
  tprob p = tprob_make(1, 4, 4, 19, 40, 64, ATTN_F16);
  attn_engine *e = open_checked(false);
  cr_expect(disabled_because(e, "hopper_d64", "self-check, which is off"));
  cr_expect(check_one(e, &p, 91));
  cr_expect_eq(mock_last_kernel(NULL), ATTN_CU_MMA_D64, "unchecked, the Hopper instance serves");
  attn_engine_close(e);
  e = open_checked(true);
  cr_expect(!disabled_because(e, "hopper_d64", ""), "passed, yet still listed");
  cr_expect(check_one(e, &p, 91));
  cr_expect_eq(mock_last_kernel(NULL), ATTN_CU_HOPPER_D64, "ran on %s",
               attn_cu_kernel_name((attn_cu_kernel)mock_last_kernel(NULL)));
  /* it has no softcap or ALiBi path: such a request takes mma.sync */
  for (int v = 1; v <= 2; v++) {
    p.softcap = v == 1 ? 3.0 : 0;
    p.alibi = v == 2;
    cr_expect(check_one(e, &p, 93));
    cr_expect_eq(mock_last_kernel(NULL), ATTN_CU_MMA_D64, "variant %d ran on %s", v,
                 attn_cu_kernel_name((attn_cu_kernel)mock_last_kernel(NULL)));
  }
  attn_engine_close(e);
}

Test(cuda_backend, a_wrong_hopper_instance_stays_off, .init = reset) {
  if (!attn_cu_hopper_built()) {
    printf("skipped: this build has no sm_90a code (CUDA_ARCHS without 90a)\n");
    return;
  }
  mock_knobs k = MOCK_KNOBS(1, 9, (size_t)8 << 30, 0, 0, 0);
  k.wrong_kernel = ATTN_CU_HOPPER_D128 + 1;
  mock_set(&k);
  attn_engine *e = open_checked(true);
  cr_expect(disabled_because(e, "hopper_d128", "error"), "hopper_d128 not listed as failing");
  cr_expect(!disabled_because(e, "hopper_d64", ""), "the D=64 instance passed");
  cr_expect(!disabled_because(e, "mma_d128", ""), "the mma.sync instance is fine");
  tprob p = tprob_make(1, 4, 2, 19, 40, 128, ATTN_BF16);
  cr_expect(check_one(e, &p, 92));
  cr_expect_eq(mock_last_kernel(NULL), ATTN_CU_MMA_D128, "ran on %s",
               attn_cu_kernel_name((attn_cu_kernel)mock_last_kernel(NULL)));
  attn_engine_close(e);
  k.wrong_kernel = 0;
  k.major = 8;
  mock_set(&k);
  e = open_checked(true);
  cr_expect(disabled_because(e, "hopper_d64", "compute capability 9.0"));
  attn_engine_close(e);
}

/* softcap and ALiBi run on the cuda backend, forward and backward: the
 * host path sets the launch's log2-unit parameters and uploads the slopes
 * ([Hq] and [B, Hq], expanded to [B, Hq] in log2 units), which the mock
 * kernels read to match the float64 reference; a decode row takes the
 * split path with them. */
Test(cuda_backend, variants_run_on_cuda, .init = reset) {
  attn_engine *e = open_cuda(2, NULL);
  for (int v = 0; v < 4; v++) {
    tprob p = tprob_make(2, 4, 2, v == 3 ? 1 : 20, v == 3 ? 1500 : 30, 64, ATTN_F16);
    p.softcap = v == 1 ? 0 : 5.0;
    p.alibi = v % 3;
    p.causal = v == 2;
    cr_expect(check_one(e, &p, 9 + (uint64_t)v), "variant case %d", v);
    cr_expect(check_bwd(e, &p, 19 + (uint64_t)v, v % 2 == 0), "variant case %d", v);
  }
  attn_engine_close(e);
}

/* ---- GQA packing ------------------------------------------------------------- */

Test(cuda_backend, gqa_decodes_pack_their_heads, .init = reset) {
  attn_engine *e = open_cuda(2, NULL);
  /* 32:8: 8 blocks of 4 heads (too many to split on the mock's 4 SMs) */
  tprob p = tprob_make(1, 32, 8, 1, 300, 128, ATTN_BF16);
  p.stats = true;
  cr_expect(check_one(e, &p, 91));
  int nsplit = 0;
  mock_last_kernel(&nsplit);
  cr_expect(mock_last_pack() == 4 && nsplit == 1, "pack %d, %d splits", mock_last_pack(), nsplit);
  /* MQA, 2 queries, ALiBi per row, causal: one block of 16 rows, split */
  p = tprob_make(2, 8, 1, 2, 1500, 64, ATTN_F16);
  p.alibi = 2, p.causal = true, p.stats = true;
  cr_expect(check_one(e, &p, 92));
  mock_last_kernel(&nsplit);
  cr_expect(mock_last_pack() == 8 && nsplit > 1, "pack %d, %d splits", mock_last_pack(), nsplit);
  /* 8 x 16 rows fill a 128-row block; 8 x 17 do not fit: one head per
   * block */
  p = tprob_make(1, 8, 1, 16, 40, 64, ATTN_F16);
  cr_expect(check_one(e, &p, 93));
  cr_expect_eq(mock_last_pack(), 8);
  p = tprob_make(1, 8, 1, 17, 40, 64, ATTN_F16);
  cr_expect(check_one(e, &p, 93));
  cr_expect_eq(mock_last_pack(), 1);
  attn_engine_close(e);
}

Test(cuda_backend, a_wrong_packing_turns_packing_off, .init = reset) {
  mock_knobs k = MOCK_KNOBS(1, 9, (size_t)8 << 30, 0, 0, 0);
  k.wrong_pack = true;
  mock_set(&k);
  attn_engine *e = open_checked(true);
  cr_expect(lists_disabled(e, "gqa_pack"), "gqa_pack not listed");
  const char *kept[] = {"mma_d64",  "mma_d96",  "mma_d128",      "mma_d160",
                        "mma_d192", "mma_d256", "split_kv_merge"};
  for (int i = 0; i < 7; i++)
    cr_expect(!lists_disabled(e, kept[i]), "the packing's failure was laid on %s", kept[i]);
  tprob p = tprob_make(1, 32, 8, 1, 300, 128, ATTN_BF16);
  cr_expect(check_one(e, &p, 94), "the decode runs unpacked, right");
  cr_expect_eq(mock_last_pack(), 1);
  attn_engine_close(e);
}
