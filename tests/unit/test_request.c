/*
 * test_request.c — every way a request can be wrong gets its own error
 * code and a message naming the field; the engine never runs a bad one.
 */
#include "helpers.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

static float buf[4096];

static attn_request good(void) {
  attn_request r;
  attn_request_init(&r);
  r.batch = 1;
  r.heads_q = 2;
  r.heads_kv = 1;
  r.seq_q = 8;
  r.seq_kv = 8;
  r.head_dim = 16;
  r.q = r.k = r.v = buf;
  r.o = buf + 2048;
  return r;
}

static void expect_err(const attn_request *r, int code, const char *needle) {
  attn_status st = {0};
  int rc = attn_request_validate(r, &st);
  cr_expect_eq(rc, code, "want %s, got %s (%s)", attn_err_name(code), attn_err_name(rc),
               st.message);
  cr_expect_eq(st.code, code);
  cr_expect(strstr(st.message, needle) != NULL, "message \"%s\" lacks \"%s\"", st.message, needle);
}

Test(validate, good_request_passes) {
  attn_request r = good();
  attn_status st;
  cr_expect_eq(attn_request_validate(&r, &st), 0);
}

Test(validate, dimensions) {
  attn_request r;
  r = good();
  r.batch = 0;
  expect_err(&r, ATTN_ESHAPE, "batch must be at least 1 (got 0)");
  r = good();
  r.heads_q = -3;
  expect_err(&r, ATTN_ESHAPE, "heads_q");
  r = good();
  r.heads_kv = 0;
  expect_err(&r, ATTN_ESHAPE, "heads_kv");
  r = good();
  r.seq_q = 0;
  expect_err(&r, ATTN_ESHAPE, "seq_q");
  r = good();
  r.seq_kv = -1;
  expect_err(&r, ATTN_ESHAPE, "seq_kv");
  r = good();
  r.seq_kv = ATTN_MAX_DIM + 1;
  expect_err(&r, ATTN_ESHAPE, "larger than");
  r = good();
  r.head_dim = 0;
  expect_err(&r, ATTN_ESHAPE, "head_dim must be between 1 and 576 (got 0)");
  r = good();
  r.head_dim = 577;
  expect_err(&r, ATTN_ESHAPE, "(got 577)");
}

/* v_cols promises zero columns of v, o and dout that the kernels then skip:
 * the engine's own (dv.c sets it on the padded job), never a caller's. */
Test(validate, v_cols_is_the_engines) {
  attn_request r = good();
  r.v_cols = 8;
  expect_err(&r, ATTN_EINVAL, "v_cols (8) is the engine's own: leave it 0");
}

Test(validate, heads_dtype_scale_window) {
  attn_request r;
  r = good();
  r.heads_q = 6;
  r.heads_kv = 4;
  expect_err(&r, ATTN_EHEADS, "heads_q (6) is not a multiple of heads_kv (4)");
  r = good();
  r.dtype = (attn_dtype)7;
  expect_err(&r, ATTN_EDTYPE, "dtype");
  r = good();
  r.scale = INFINITY;
  expect_err(&r, ATTN_ESCALE, "scale must be a finite number");
  r = good();
  r.scale = -INFINITY;
  expect_err(&r, ATTN_ESCALE, "scale");
  r = good();
  r.window_left = -2;
  expect_err(&r, ATTN_EWINDOW, "window_left");
  r = good();
  r.window_right = -5;
  expect_err(&r, ATTN_EWINDOW, "(got -1, -5)");
  r = good();
  r.causal = true;
  r.window_right = 3;
  expect_err(&r, ATTN_EWINDOW, "contradicts");
  r = good();
  r.causal = true;
  r.window_right = 0;
  attn_status st;
  cr_expect_eq(attn_request_validate(&r, &st), 0, "causal with window_right=0 is consistent");
}

Test(validate, tensors_and_strides) {
  attn_request r;
  r = good();
  r.q = NULL;
  expect_err(&r, ATTN_EINVAL, "tensor q has no data");
  r = good();
  r.o = NULL;
  expect_err(&r, ATTN_EINVAL, "tensor o");
  r = good();
  r.k_stride[0] = -1;
  r.k_stride[2] = 16;
  expect_err(&r, ATTN_EINVAL, "tensor k: strides");
  r = good();
  r.v_stride[1] = 128;
  r.v_stride[2] = 8;
  expect_err(&r, ATTN_EINVAL, "row stride under head_dim");
}

Test(validate, sizes_overflow) {
  attn_request r;
  r = good();
  r.batch = r.seq_q = r.seq_kv = (int64_t)1 << 30;
  expect_err(&r, ATTN_EOVERFLOW, "overflows 64 bits");
  r = good();
  r.seq_q = 1;
  r.seq_kv = (int64_t)1 << 40;
  r.head_dim = 256;
  r.heads_kv = r.heads_q = (int64_t)1 << 16;
  expect_err(&r, ATTN_EOVERFLOW, "tensor k");
  r = good();
  r.q_stride[0] = INT64_MAX / 2;
  r.q_stride[1] = 1 << 20;
  r.q_stride[2] = 16;
  r.batch = 4;
  expect_err(&r, ATTN_EOVERFLOW, "tensor q");
}

Test(validate, error_names_are_distinct) {
  for (int a = ATTN__ERRNO_BASE + 1; a < ATTN__ERRNO_END; a++) {
    cr_expect_neq(strcmp(attn_strerror(a), "unknown error"), 0);
    for (int b = a + 1; b < ATTN__ERRNO_END; b++)
      cr_expect_neq(strcmp(attn_err_name(a), attn_err_name(b)), 0);
  }
  cr_expect_str_eq(attn_err_name(ATTN_EHEADS), "EHEADS");
  cr_expect_str_eq(attn_err_name(0), "OK");
  cr_expect_str_eq(attn_strerror(12345), "unknown error");
}

/* ---- errors the engine finds ----------------------------------------------- */

static int run_err(attn_engine *e, tcase *c, const char *backend, attn_status *st) {
  memset(st, 0, sizeof *st);
  return trun(e, c, backend, st);
}

Test(engine_errors, backends) {
  attn_engine *e = topen(2, NULL);
  tprob p = tprob_make(1, 1, 1, 4, 4, 8, ATTN_F32);
  tcase c;
  tcase_init(&c, &p, 1);
  attn_status st;
  cr_expect_eq(run_err(e, &c, "tpu", &st), ATTN_EBACKEND);
  cr_expect(strstr(st.message, "unknown backend \"tpu\" (choose auto, ") &&
                strstr(st.message, "cpu, reference)"),
            "%s", st.message);
  /* cuda: not compiled in, compiled without a device, or there to run */
  attn_backend_info info[4];
  int nb = attn_engine_backends(e, info, 4);
  bool cuda_up = nb > 0 && !strcmp(info[0].name, "cuda") && info[0].available;
  int rc = run_err(e, &c, "cuda", &st);
  if (cuda_up) {
    cr_expect_eq(rc, 0, "%s", st.message);
  } else {
    cr_expect_eq(rc, ATTN_ENODEV);
#ifdef ATTN_HAVE_CUDA
    cr_expect(strstr(st.message, "backend \"cuda\" is not available: no CUDA device"), "%s",
              st.message);
#else
    cr_expect(strstr(st.message, "no cuda support"), "%s", st.message);
#endif
  }
  cr_expect_eq(run_err(e, &c, "auto", &st), 0);
  cr_expect_eq(run_err(e, &c, NULL, &st), 0);
  tcase_free(&c);
  /* the reference refuses what it cannot hold */
  tprob big = tprob_make(1, 1, 1, 8192, 8192, 8, ATTN_F32);
  tcase_init(&c, &big, 1);
  cr_expect_eq(run_err(e, &c, "reference", &st), ATTN_ETOOBIG);
  cr_expect(strstr(st.message, "use backend cpu"), "%s", st.message);
  tcase_free(&c);
  cr_expect_eq(attn_engine_submit(e, &c.req, NULL, NULL, &st), ATTN_EINVAL);
  attn_engine_close(e);
}

Test(engine_errors, bad_config) {
  attn_config cfg;
  attn_config_init(&cfg);
  cfg.threads = -1;
  attn_engine *e;
  attn_status st;
  cr_expect_eq(attn_engine_open(&cfg, &e, &st), ATTN_EINVAL);
  cr_expect(strstr(st.message, "threads"));
  cfg.threads = 1;
  cfg.cpu_isa = "sse9";
  cr_assert_eq(attn_engine_open(&cfg, &e, &st), 0);
  attn_backend_info info[4];
  int nb = attn_engine_backends(e, info, 4);
  int cpu = 0;
  while (cpu < nb && strcmp(info[cpu].name, "cpu"))
    cpu++;
  cr_assert_lt(cpu, nb);
  cr_expect(!info[cpu].available);
  cr_expect(strstr(info[cpu].detail, "unknown CPU kernel \"sse9\""), "%s", info[cpu].detail);
  tprob p = tprob_make(1, 1, 1, 4, 4, 8, ATTN_F32);
  tcase c;
  tcase_init(&c, &p, 1);
  cr_expect_lt(run_err(e, &c, "cpu", &st), 0);
  cr_expect(strstr(st.message, "backend \"cpu\" is not available"), "%s", st.message);
  /* auto has nothing left but a working GPU */
  bool gpu = nb > 0 && !strcmp(info[0].name, "cuda") && info[0].available;
  cr_expect_eq(run_err(e, &c, "auto", &st), gpu ? 0 : ATTN_ENODEV);
  cr_expect_eq(run_err(e, &c, "reference", &st), 0, "the reference still runs");
  tcase_free(&c);
  attn_engine_close(e);
  /* an unknown tuning, too, leaves the cpu backend unavailable, saying why */
  cfg.cpu_isa = NULL;
  cfg.cpu_tune = "zen9";
  cr_assert_eq(attn_engine_open(&cfg, &e, &st), 0);
  nb = attn_engine_backends(e, info, 4);
  for (cpu = 0; cpu < nb && strcmp(info[cpu].name, "cpu");)
    cpu++;
  cr_assert_lt(cpu, nb);
  cr_expect(!info[cpu].available);
  cr_expect(strstr(info[cpu].detail, "unknown CPU tuning \"zen9\""), "%s", info[cpu].detail);
  attn_engine_close(e);
}

/* A non-finite value anywhere is refused with its coordinates, on both
 * backends and in every dtype; nothing is computed from it. */
Test(engine_errors, non_finite_inputs) {
  attn_engine *e = topen(2, NULL);
  static const char *const be[] = {"cpu", "reference"};
  for (int b = 0; b < 2; b++)
    for (int dt = 0; dt < 3; dt++)
      for (int t = 0; t < 3; t++) {
        tprob p = tprob_make(2, 2, 1, 10, 12, 20, (attn_dtype)dt);
        tcase c;
        tcase_init(&c, &p, 9);
        void *tensor = t == 0 ? c.q : t == 1 ? c.k : c.v;
        /* element [1, 0, 3, 17] of q, or [1, 0, 3, 17] of k / v */
        size_t at = t == 0 ? ((1 * 2 + 0) * 10 + 3) * 20 + 17 : ((1 * 1 + 0) * 12 + 3) * 20 + 17;
        attn_store_elem(tensor, (attn_dtype)dt, at, t == 1 ? -INFINITY : NAN);
        attn_status st;
        cr_expect_eq(run_err(e, &c, be[b], &st), ATTN_ENONFINITE, "%s %s tensor %d", be[b],
                     attn_dtype_name((attn_dtype)dt), t);
        char want[64];
        snprintf(want, sizeof want, "tensor %s", t == 0 ? "q" : t == 1 ? "k" : "v");
        cr_expect(strstr(st.message, want) && strstr(st.message, "[1, 0, 3, 17]"), "%s",
                  st.message);
        tcase_free(&c);
      }
  attn_engine_close(e);
}

/* Finite inputs whose scores or sums would overflow F32 are refused rather
 * than answered with inf or NaN. */
Test(engine_errors, overflow_is_range_error) {
  attn_engine *e = topen(2, NULL);
  tprob p = tprob_make(1, 1, 1, 8, 8, 16, ATTN_F32);
  tcase c;
  tcase_init(&c, &p, 2);
  ((float *)c.q)[5] = 1e30f;
  ((float *)c.k)[7] = -1e20f;
  attn_status st;
  cr_expect_eq(run_err(e, &c, "cpu", &st), ATTN_ERANGE);
  cr_expect(strstr(st.message, "scale q or k down"), "%s", st.message);
  tcase_free(&c);
  tcase_init(&c, &p, 2);
  ((float *)c.v)[3] = 1e38f;
  cr_expect_eq(run_err(e, &c, "cpu", &st), ATTN_ERANGE);
  cr_expect(strstr(st.message, "scale v down"), "%s", st.message);
  /* large but safe values still compute */
  ((float *)c.v)[3] = 1e30f;
  cr_expect_eq(run_err(e, &c, "cpu", &st), 0, "%s", st.message);
  terr err = tcheck(&c);
  cr_expect_lt(err.o, 1e-5);
  tcase_free(&c);
  attn_engine_close(e);
}

Test(engine_errors, cuda_device_lists) {
  int ord[ATTN_MAX_CUDA_DEVICES];
  attn_status st;
  cr_expect_eq(attn_cuda_devices_parse(NULL, ord, 4, &st), 1);
  cr_expect_eq(ord[0], 0);
  cr_expect_eq(attn_cuda_devices_parse("3,0,7", ord, 4, &st), 3);
  cr_expect(ord[0] == 3 && ord[1] == 0 && ord[2] == 7);
  const char *bad[][2] = {{"0,x", "expected comma-separated"},
                          {"1,1", "listed twice"},
                          {"-1", "expected"},
                          {"0,", "expected"},
                          {"0,1,2,3,4", "at most 4"},
                          {"99999999999", "expected"}};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    cr_expect_eq(attn_cuda_devices_parse(bad[i][0], ord, 4, &st), ATTN_EINVAL, "%s", bad[i][0]);
    cr_expect(strstr(st.message, bad[i][1]), "%s: %s", bad[i][0], st.message);
  }
}

/* The CPU kernels scan each tile as they load it: a non-finite value is
 * still found, with the coordinates of the first one in (tensor, batch,
 * head, row, column) order, where only a late query block loads it, where
 * no query row can see it, and in a decode job whose keys are split. */
static void scan_case(const char *isa, tprob p, int t, const size_t *at, int nat,
                      const char *want) {
  attn_config cfg;
  attn_config_init(&cfg);
  cfg.threads = 2;
  cfg.cpu_isa = isa;
  attn_engine *e;
  attn_status st;
  cr_assert_eq(attn_engine_open(&cfg, &e, &st), 0);
  tcase c;
  tcase_init(&c, &p, 4);
  void *tensor = t == 0 ? c.q : t == 1 ? c.k : c.v;
  for (int i = 0; i < nat; i++)
    attn_store_elem(tensor, p.dt, at[i], i % 2 ? INFINITY : NAN);
  int rc = run_err(e, &c, "cpu", &st);
  if (rc != ATTN_ENONFINITE && strstr(st.message, "cannot run"))
    printf("skipped: this CPU has no %s\n", isa);
  else
    cr_expect(rc == ATTN_ENONFINITE && strstr(st.message, want), "%s %s: %s (want %s)", isa,
              attn_dtype_name(p.dt), st.message, want);
  tcase_free(&c);
  attn_engine_close(e);
}

Test(engine_errors, fused_scan_coordinates, .timeout = 120) {
  static const char *const isas[] = {"generic", "avx2", "avx512", "avx512bf16", "amx"};
  for (int i = 0; i < 5; i++)
    for (int dt = 0; dt < 3; dt++) {
      /* causal, 300 rows: key 290 is loaded by the last query block only;
       * key 100 of the same head comes first */
      tprob p = tprob_make(1, 2, 1, 300, 300, 64, (attn_dtype)dt);
      p.causal = true;
      size_t k1[] = {290 * 64 + 5, 100 * 64 + 63};
      scan_case(isas[i], p, 1, k1, 2, "tensor k holds a non-finite value at [0, 0, 100, 63]");
      /* a diagonal window with 40 more keys than rows: keys 0..39 are
       * visible to no row */
      p = tprob_make(2, 2, 2, 100, 140, 32, (attn_dtype)dt);
      p.wl = p.wr = 0;
      size_t v1[] = {((1 * 2 + 1) * 140 + 7) * 32 + 3};
      scan_case(isas[i], p, 2, v1, 1, "tensor v holds a non-finite value at [1, 1, 7, 3]");
      /* decode with split keys, MQA */
      p = tprob_make(1, 8, 1, 1, 5000, 128, (attn_dtype)dt);
      size_t k2[] = {4999 * 128 + 127, 2500 * 128};
      scan_case(isas[i], p, 1, k2, 2, "tensor k holds a non-finite value at [0, 0, 2500, 0]");
    }
}

Test(validate, softcap) {
  attn_request r = good();
  attn_status st;
  r.softcap = 50;
  cr_expect_eq(attn_request_validate(&r, &st), 0, "%s", st.message);
  const double bad[] = {-1, NAN, INFINITY, 1e13, 1e-13};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    r.softcap = bad[i];
    expect_err(&r, ATTN_EINVAL, "softcap must be 0 (off) or a number between");
  }
}

Test(validate, alibi_slopes) {
  attn_request r = good();
  attn_status st;
  float slopes[4] = {0.5f, 0.25f, 0.125f, -0.5f}; /* [B=2, Hq=2] */
  r.batch = 2;
  r.alibi_slopes = slopes;
  cr_expect_eq(attn_request_validate(&r, &st), 0, "%s", st.message);
  r.alibi_stride_b = 2;
  cr_expect_eq(attn_request_validate(&r, &st), 0, "%s", st.message);
  r.alibi_stride_b = 3;
  expect_err(&r, ATTN_EINVAL, "alibi_stride_b must be 0 (slopes [Hq]) or heads_q = 2");
  r.alibi_stride_b = 2;
  slopes[3] = NAN;
  expect_err(&r, ATTN_ENONFINITE, "tensor alibi_slopes holds a non-finite value (nan) at [1, 1]");
  r.alibi_stride_b = 0; /* [Hq]: the bad slope is not read */
  cr_expect_eq(attn_request_validate(&r, &st), 0, "%s", st.message);
  slopes[1] = -INFINITY;
  expect_err(&r, ATTN_ENONFINITE, "at [1]; slopes must be finite");
  slopes[1] = 1e37f;
  expect_err(&r, ATTN_ERANGE, "alibi_slopes: slope 1e+37 times a distance of up to 16");
}
