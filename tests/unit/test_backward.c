/*
 * test_backward.c — the cpu backend's backward pass against the float64
 * reference backward (attn_reference_backward, itself checked by finite
 * differences in test_backward_ref.c), on the forward suite's awkward
 * shapes (cases.h), every dtype and every CPU kernel this machine runs (the
 * rest report themselves skipped), with the lse given and recomputed; then
 * bitwise determinism across thread counts, the refusals (non-finite o and
 * do, a -inf lse on a row that sees keys, magnitudes), cancellation, and
 * memory that stays O(N) at N = 65536.
 *
 * Thresholds: ttol() of the dtype for each of dq, dk, dv. F32 computes and
 * accumulates in F32 (1e-5). F16 and BF16 inputs are widened exactly and
 * computed in F32 too, so their error is the final rounding of dq, dk, dv
 * (half an ulp: 2^-11 for F16, 2^-8 for BF16) plus what O rounded to the
 * dtype does to Dᵢ = rowsum(dO∘O): the forward's own thresholds (1e-3 and
 * 8e-3) hold them with room. BF16 on the avx512bf16 and amx kernels (even
 * head_dim) runs its products on VDPBF16PS instead (flash_bwd_bf16.h; the
 * amx kernel on AMX tiles for whole 64×64 pairs, flash_bwd_amx.h): S
 * and dP from exact BF16 inputs, but P and dS rounded to BF16 for dV, dK
 * and dQ. Each rounding is a relative error of at most 2^-9 per element,
 * of random sign, so in a sum over many keys or rows it adds about as much
 * again as the final rounding, not more. Measured over the case lists
 * below: at most 2.9e-3 for head_dim >= 24 (2.4e-3 on the F32 path), and
 * 4.7e-3 for dq at head_dim 2 (3.3e-3 on the F32 path), where dQ is the
 * smallest against the dS·K terms that cancel in it; inside 8e-3.
 */
#include "cases.h"
#include "helpers.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const isas[] = {"generic", "avx2", "avx512", "avx512bf16", "amx", "amxemu"};
enum { NISAS = sizeof isas / sizeof *isas };

/* Runs c on e's cpu backend and checks it against ref; returns 1 on a failure. */
static int check_run(attn_engine *e, tcase *c, const tref_bwd *ref, const char *what) {
  char desc[200];
  attn_status st = {0};
  tcase_poison_grads(c);
  int rc = trun(e, c, "cpu", &st);
  cr_expect_eq(rc, 0, "%s, %s: engine failed: %s", tdesc(&c->p, desc, sizeof desc), what,
               st.message);
  if (rc)
    return 1;
  terr_bwd err = tref_bwd_check(c, ref);
  const double tol = ttol(c->p.dt);
  bool ok = terr_bwd_within(&err, tol) && err.zeros_ok;
  cr_expect(ok, "%s, %s: errors dq %.3g dk %.3g dv %.3g (tol %.0e), zeros %s",
            tdesc(&c->p, desc, sizeof desc), what, err.dq, err.dk, err.dv, tol,
            err.zeros_ok ? "ok" : "WRONG");
  return !ok;
}

/* Every problem on every kernel this CPU has, lse given and recomputed. */
static void run_group(int (*gen)(tprob *), uint64_t seed) {
  attn_engine *e[NISAS];
  for (int i = 0; i < NISAS; i++)
    e[i] = topen_isa(isas[i], 2);
  tprob ps[TCASES_MAX];
  int n = gen(ps), fails = 0;
  for (int i = 0; i < n; i++) {
    tcase c;
    tref_bwd ref;
    attn_status st;
    tcase_init(&c, &ps[i], seed + (uint64_t)i);
    cr_assert_eq(tcase_backward(&c, true, seed + 1000 + (uint64_t)i, &st), 0, "%s", st.message);
    cr_assert_eq(tref_bwd_compute(&c, &ref, &st), 0, "%s", st.message);
    for (int k = 0; k < NISAS; k++) {
      if (!e[k])
        continue;
      char what[64];
      snprintf(what, sizeof what, "%s, lse given", isas[k]);
      c.req.lse_in = c.lse_in;
      fails += check_run(e[k], &c, &ref, what);
      snprintf(what, sizeof what, "%s, lse recomputed", isas[k]);
      c.req.lse_in = NULL;
      fails += check_run(e[k], &c, &ref, what);
    }
    tref_bwd_free(&ref);
    tcase_free(&c);
  }
  for (int i = 0; i < NISAS; i++)
    if (e[i])
      attn_engine_close(e[i]);
  cr_assert_eq(fails, 0, "%d runs out of tolerance", fails);
}

Test(backward, sizes, .timeout = 600) { run_group(tcases_sizes, 100); }
Test(backward, masks, .timeout = 600) { run_group(tcases_masks, 200); }
Test(backward, shapes, .timeout = 600) { run_group(tcases_shapes, 300); }
Test(backward, decode, .timeout = 600) { run_group(tcases_decode, 400); }
Test(backward, masked_rows, .timeout = 600) { run_group(tcases_masked_rows, 500); }
Test(backward, variants, .timeout = 600) { run_group(tcases_variants, 700); }
Test(backward, diag, .timeout = 600) { run_group(tcases_diag, 550); }

/* BF16 shapes for the pairs of the avx512bf16 kernel's products: head_dim
 * 2 (one pair), 24 and 40 (a tail after whole vectors of 16) and 256 (the
 * most the workspace holds); odd query and key counts, so that a block
 * pairs its last row, and a key block its last key, with zeros; strided
 * rows, GQA and MQA, windows, and rows that see no key. */
static int bf16_pair_cases(tprob *ps) {
  int n = 0;
  ps[n++] = tprob_make(1, 2, 1, 67, 75, 2, ATTN_BF16);
  ps[n] = tprob_make(2, 4, 2, 129, 99, 24, ATTN_BF16);
  ps[n].causal = ps[n].strided = 1;
  n++;
  ps[n] = tprob_make(1, 3, 1, 65, 131, 40, ATTN_BF16);
  ps[n].wl = 9, ps[n].wr = 30;
  n++;
  ps[n] = tprob_make(1, 2, 2, 45, 77, 256, ATTN_BF16);
  ps[n++].strided = 1;
  ps[n] = tprob_make(1, 4, 2, 90, 33, 64, ATTN_BF16);
  ps[n++].causal = 1; /* rows 0..56 see no key */
  ps[n++] = tprob_make(1, 1, 1, 1, 1, 2, ATTN_BF16);
  return n;
}

Test(backward, bf16_pairs, .timeout = 600) { run_group(bf16_pair_cases, 600); }

/* BF16 shapes for the amx kernel's tiles (flash_bwd_amx.h), which take the
 * pairs of a whole block of 64 query rows and 64 keys at a head_dim that
 * is a multiple of 32: every such head_dim class (32, 64, 96, 128, 256),
 * GQA and MQA, strided rows, causal with and without a diagonal offset
 * (blocks that start mid-way through a 64-row stretch), windows (whole
 * blocks masked inside), rows that see no key, softcap and ALiBi; partial
 * blocks beside them keep VDPBF16PS in the same key block. */
static int amx_block_cases(tprob *ps) {
  int n = 0;
  ps[n] = tprob_make(1, 4, 2, 256, 256, 64, ATTN_BF16);
  ps[n++].strided = 1;
  ps[n] = tprob_make(2, 2, 1, 200, 256, 128, ATTN_BF16);
  ps[n++].causal = 1;
  ps[n] = tprob_make(1, 2, 2, 320, 320, 96, ATTN_BF16);
  ps[n].wl = 100, ps[n].wr = 30;
  n++;
  ps[n] = tprob_make(1, 3, 1, 128, 192, 256, ATTN_BF16);
  ps[n++].strided = 1;
  ps[n] = tprob_make(1, 2, 1, 150, 300, 32, ATTN_BF16);
  ps[n++].causal = 1; /* offset 150: blocks start at j0 - 150 */
  ps[n] = tprob_make(1, 2, 2, 256, 128, 64, ATTN_BF16);
  ps[n++].causal = 1; /* rows 0..127 see no key */
  ps[n] = tprob_make(1, 4, 2, 192, 192, 64, ATTN_BF16);
  ps[n].causal = 1, ps[n].softcap = 2.0, ps[n].alibi = 1;
  n++;
  ps[n] = tprob_make(2, 2, 1, 256, 256, 128, ATTN_BF16);
  ps[n].wl = 70, ps[n].wr = 64, ps[n].softcap = 5.0, ps[n].alibi = 2, ps[n].scale = 0.05;
  n++;
  return n;
}

Test(backward, amx_blocks, .timeout = 600) { run_group(amx_block_cases, 800); }

/* ---- determinism --------------------------------------------------------------- */

/* dq, dk, dv of c after a run on an engine of `threads` workers and kernel isa. */
static int run_threads(const char *isa, int threads, tcase *c, attn_status *st) {
  attn_config cfg;
  attn_config_init(&cfg);
  cfg.threads = threads;
  cfg.cpu_isa = isa;
  attn_engine *e;
  cr_assert_eq(attn_engine_open(&cfg, &e, st), 0, "%s", st->message);
  tcase_poison_grads(c);
  int rc = trun(e, c, "cpu", st);
  attn_engine_close(e);
  return rc;
}

static bool same_grads(const tcase *a, const tcase *b) {
  const tprob *p = &a->p;
  size_t es = attn_dtype_size(p->dt);
  size_t nq = (size_t)(p->b * p->hq * p->nq * p->d) * es,
         nk = (size_t)(p->b * p->hkv * p->nkv * p->d) * es;
  return !memcmp(a->dq, b->dq, nq) && !memcmp(a->dk, b->dk, nk) && !memcmp(a->dv, b->dv, nk);
}

/* 1, 2, 3 and 7 threads give the same bits, for every kernel and dtype,
 * the lse given and recomputed, on a causal GQA shape with several key
 * chunks and a batch of one KV head (the most chunks). */
Test(backward, bit_identical_across_threads, .timeout = 600) {
  static const int threads[] = {1, 2, 3, 7};
  for (int k = 0; k < NISAS; k++)
    for (int dt = 0; dt < 3; dt++)
      for (int shape = 0; shape < 2; shape++) {
        tprob p = shape ? tprob_make(1, 3, 1, 200, 700, 40, (attn_dtype)dt)
                        : tprob_make(2, 4, 2, 300, 333, 64, (attn_dtype)dt);
        p.causal = !shape;
        tcase ref, c;
        attn_status st;
        tcase_init(&ref, &p, 11);
        tcase_init(&c, &p, 11);
        cr_assert_eq(tcase_backward(&ref, shape, 12, &st), 0, "%s", st.message);
        cr_assert_eq(tcase_backward(&c, shape, 12, &st), 0, "%s", st.message);
        int rc = run_threads(isas[k], 1, &ref, &st);
        if (rc == 0)
          for (int t = 1; t < 4; t++) {
            cr_assert_eq(run_threads(isas[k], threads[t], &c, &st), 0, "%s", st.message);
            cr_expect(same_grads(&ref, &c), "%s %s shape %d: %d threads differ from 1", isas[k],
                      attn_dtype_name(p.dt), shape, threads[t]);
          }
        else if (dt == 0 && shape == 0)
          printf("skipped: this CPU has no %s (%s)\n", isas[k], st.message);
        tcase_free(&ref);
        tcase_free(&c);
      }
}

/* ---- refusals -------------------------------------------------------------------- */

/* Runs c on the cpu backend; returns the code, message in st. */
static int run_cpu(tcase *c, attn_status *st) {
  attn_engine *e = topen(2, NULL);
  int rc = trun(e, c, "cpu", st);
  attn_engine_close(e);
  return rc;
}

static void expect_refused(tcase *c, int code, const char *needle) {
  attn_status st = {0};
  int rc = run_cpu(c, &st);
  cr_expect_eq(rc, code, "got %d (%s), want %s", rc, st.message, attn_err_name(code));
  cr_expect(strstr(st.message, needle), "message \"%s\" lacks \"%s\"", st.message, needle);
}

/* A non-finite element of o or do (or q, k, v) is refused with the forward's
 * wording, naming the tensor and the element, whichever path computes the lse. */
Test(backward, nonfinite_inputs_named) {
  tprob p = tprob_make(2, 4, 2, 70, 90, 24, ATTN_F32);
  p.causal = true;
  for (int lse = 0; lse < 2; lse++) {
    tcase c;
    attn_status st;
    tcase_init(&c, &p, 3);
    cr_assert_eq(tcase_backward(&c, lse, 4, &st), 0, "%s", st.message);
    float *o = c.o, *g = c.dout, *k = c.k;
    size_t at = (size_t)((((1 * 4 + 3) * 70) + 65) * 24 + 7); /* [1, 3, 65, 7] */
    float keep = o[at];
    o[at] = NAN;
    expect_refused(&c, ATTN_ENONFINITE, "tensor o holds a non-finite value at [1, 3, 65, 7]");
    o[at] = keep;
    g[at - 24] = INFINITY; /* [1, 3, 64, 7] */
    expect_refused(&c, ATTN_ENONFINITE, "tensor do holds a non-finite value at [1, 3, 64, 7]");
    g[at - 24] = 0;
    k[(size_t)((1 * 90 + 80) * 24 + 2)] = -INFINITY; /* [0, 1, 80, 2] */
    expect_refused(&c, ATTN_ENONFINITE, "tensor k holds a non-finite value at [0, 1, 80, 2]");
    tcase_free(&c);
  }
}

/* lse_in: -inf on a row that sees keys is EINVAL, NaN is ENONFINITE; -inf on
 * a row that sees no key is its true value and runs. */
Test(backward, lse_in_checked) {
  tprob p = tprob_make(1, 2, 1, 40, 30, 16, ATTN_F32);
  p.causal = true; /* rows 0..9 see no key */
  tcase c;
  attn_status st;
  tcase_init(&c, &p, 5);
  cr_assert_eq(tcase_backward(&c, true, 6, &st), 0, "%s", st.message);
  cr_assert(isinf(c.lse_in[3]) && c.lse_in[3] < 0, "row 3 should see no key");
  cr_assert_eq(run_cpu(&c, &st), 0, "%s", st.message);
  float keep = c.lse_in[40 + 20];
  c.lse_in[40 + 20] = -INFINITY;
  expect_refused(&c, ATTN_EINVAL, "tensor lse holds -inf at [0, 1, 20]");
  c.lse_in[40 + 20] = NAN;
  expect_refused(&c, ATTN_ENONFINITE, "tensor lse holds nan at [0, 1, 20]");
  c.lse_in[40 + 20] = keep;
  tcase_free(&c);
}

/* Gradients that could overflow F32 are refused before they are computed. */
Test(backward, magnitudes_refused) {
  tprob p = tprob_make(1, 1, 1, 8, 8, 16, ATTN_F32);
  tcase c;
  attn_status st;
  tcase_init(&c, &p, 7);
  cr_assert_eq(tcase_backward(&c, true, 8, &st), 0, "%s", st.message);
  ((float *)c.dout)[5] = 3e37f;
  expect_refused(&c, ATTN_ERANGE, "gradients could overflow float32");
  tcase_free(&c);
}

/* An lse_in far below the forward's makes P overflow: the gradients come
 * out infinite or NaN, and every kernel fails the job with ERANGE instead
 * of returning them (store_kv and store_dq check what they write). */
Test(backward, lse_in_mismatch_overflows) {
  for (int dt = 0; dt < 3; dt += 2) {
    tprob p = tprob_make(1, 2, 1, 128, 128, 64, dt ? ATTN_BF16 : ATTN_F32);
    tcase c;
    attn_status st;
    tcase_init(&c, &p, 13);
    cr_assert_eq(tcase_backward(&c, true, 14, &st), 0, "%s", st.message);
    c.lse_in[77] -= 200.0f;
    for (int k = 0; k < NISAS; k++) {
      attn_engine *e = topen_isa(isas[k], 2);
      if (!e)
        continue;
      int rc = trun(e, &c, "cpu", &st);
      cr_expect_eq(rc, ATTN_ERANGE, "%s %s: got %d (%s)", isas[k], attn_dtype_name(p.dt), rc,
                   st.message);
      cr_expect(strstr(st.message, "the gradients overflow float32"), "%s: message \"%s\"", isas[k],
                st.message);
      attn_engine_close(e);
    }
    tcase_free(&c);
  }
}

/* Backend auto runs a backward request on the cpu backend. */
Test(backward, auto_picks_cpu) {
  tprob p = tprob_make(1, 2, 1, 20, 30, 8, ATTN_BF16);
  tcase c;
  attn_status st;
  tcase_init(&c, &p, 9);
  cr_assert_eq(tcase_backward(&c, false, 10, &st), 0, "%s", st.message);
  attn_engine *e = topen(2, NULL);
  attn_result res;
  c.req.backend = "auto";
  cr_assert_eq(attn_engine_run(e, &c.req, &res, &st), 0, "%s", st.message);
  cr_expect_str_eq(res.backend, "cpu");
  cr_expect_eq(res.flops, attn_request_flops(&c.req));
  attn_engine_close(e);
  tcase_free(&c);
}

/* ---- cancellation ------------------------------------------------------------------ */

typedef struct outcome {
  int calls;
  attn_result res;
  attn_engine *e;
  tcase *submit_b, *submit_a; /* submitted from this job's callback, in order */
  struct outcome *ob, *oa;
  int *cancel; /* set from this job's callback, when not NULL */
} outcome;

static void on_done(const attn_result *res, void *arg) {
  outcome *o = arg;
  o->res = *res;
  __atomic_add_fetch(&o->calls, 1, __ATOMIC_SEQ_CST);
  attn_status st;
  if (o->submit_b) {
    cr_assert_eq(attn_engine_submit(o->e, &o->submit_b->req, on_done, o->ob, &st), 0);
    cr_assert_eq(attn_engine_submit(o->e, &o->submit_a->req, on_done, o->oa, &st), 0);
  }
  if (o->cancel)
    attn_cancel_set(o->cancel);
}

/*
 * A backward job B canceled between its phases completes once, with
 * ECANCELED and no flops. Ordering, not timing, puts the cancel there: on
 * one worker, job X's callback (which holds the worker) queues B, then a
 * forward job A; B's first phase runs, its next phase queues behind A, and
 * A's callback cancels B.
 */
Test(backward, canceled_between_phases) {
  attn_engine *e = topen(1, NULL);
  tprob p = tprob_make(1, 4, 2, 64, 64, 32, ATTN_F32);
  tcase x, a, b;
  attn_status st;
  tcase_init(&x, &p, 1);
  tcase_init(&a, &p, 2);
  tcase_init(&b, &p, 3);
  cr_assert_eq(tcase_backward(&b, false, 4, &st), 0, "%s", st.message);
  int flag = 0;
  b.req.cancel = &flag;
  x.req.backend = a.req.backend = b.req.backend = "cpu";
  outcome oa = {.cancel = &flag}, ob = {0};
  outcome ox = {.e = e, .submit_b = &b, .submit_a = &a, .ob = &ob, .oa = &oa};
  cr_assert_eq(attn_engine_submit(e, &x.req, on_done, &ox, &st), 0, "%s", st.message);
  attn_engine_close(e); /* waits for all three */
  cr_expect_eq(oa.calls, 1);
  cr_expect_eq(oa.res.status.code, 0, "job A: %s", oa.res.status.message);
  cr_expect_eq(ob.calls, 1, "job B completed %d times", ob.calls);
  cr_expect_eq(ob.res.status.code, ATTN_ECANCELED, "job B ended with %d (%s)", ob.res.status.code,
               ob.res.status.message);
  cr_expect_eq(ob.res.flops, 0);
  tcase_free(&x);
  tcase_free(&a);
  tcase_free(&b);
}

/* ---- memory ------------------------------------------------------------------------- */

/* dV and dK of key j directly from the definition in float64, for a causal
 * window of wl keys on one head with Nq = Nkv = n; Dᵢ = rowsum(dO∘O) of the
 * caller's o, as the kernel defines it. */
static void direct_dkdv(const tcase *c, int64_t n, int64_t d, int64_t wl, int64_t j, double *dk,
                        double *dv) {
  const float *q = c->q, *k = c->k, *v = c->v, *g = c->dout, *o = c->o;
  const double scale = 1.0 / sqrt((double)d);
  double s[256], dp[256];
  for (int64_t t = 0; t < d; t++)
    dk[t] = dv[t] = 0;
  for (int64_t i = j; i <= j + wl && i < n; i++) {
    const int64_t lo = i - wl > 0 ? i - wl : 0, nk = i - lo + 1;
    double m = -INFINITY, l = 0, di = 0;
    for (int64_t t = 0; t < d; t++)
      di += (double)g[i * d + t] * o[i * d + t];
    for (int64_t jj = 0; jj < nk; jj++) {
      double x = 0, y = 0;
      for (int64_t t = 0; t < d; t++) {
        x += (double)q[i * d + t] * k[(lo + jj) * d + t];
        y += (double)g[i * d + t] * v[(lo + jj) * d + t];
      }
      s[jj] = x * scale;
      dp[jj] = y;
      m = fmax(m, s[jj]);
    }
    for (int64_t jj = 0; jj < nk; jj++)
      l += (s[jj] = exp(s[jj] - m));
    const double pij = s[j - lo] / l, ds = pij * (dp[j - lo] - di);
    for (int64_t t = 0; t < d; t++) {
      dv[t] += pij * g[i * d + t];
      dk[t] += scale * ds * q[i * d + t];
    }
  }
}

/* One head with N = 65536 (S and P would take 2 x 16 GiB in F32) and a
 * causal window of 128 keys (to keep the arithmetic small, not the
 * memory): the run adds at most the dQ partials (MAX_CHUNKS = 4 copies of
 * dQ in F32, 64 MiB here) and 32 MiB to the peak RSS. Rows of dk and dv are
 * checked against float64 computed directly. */
Test(backward, n65536_memory_is_linear, .timeout = 600) {
  attn_engine *e = topen(0, NULL);
  const int64_t n = 65536, d = 64, wl = 128;
  tprob p = tprob_make(1, 1, 1, n, n, d, ATTN_F32);
  p.causal = true;
  p.wl = wl;
  tcase c;
  attn_status st;
  tcase_init(&c, &p, 21);
  size_t nq = (size_t)(n * d);
  c.req.pass = ATTN_BACKWARD;
  c.dout = malloc(nq * 4), c.dq = malloc(nq * 4), c.dk = malloc(nq * 4), c.dv = malloc(nq * 4);
  uint64_t seed = 22;
  for (size_t i = 0; i < nq; i++) {
    ((float *)c.dout)[i] = (float)tuniform(&seed);
    ((float *)c.o)[i] = (float)tuniform(&seed); /* any o: Dᵢ is checked as defined */
  }
  c.req.dout = c.dout, c.req.dq = c.dq, c.req.dk = c.dk, c.req.dv = c.dv;
  tcase_poison_grads(&c);
  if (!treset_peak_rss())
    cr_skip_test("cannot reset the peak RSS counter (/proc/self/clear_refs)");
  long before = tproc_kib("VmRSS");
  cr_assert_eq(trun(e, &c, "cpu", &st), 0, "%s", st.message);
  long peak = tproc_kib("VmHWM");
  cr_assert_gt(before, 8 * 16 * 1024, "the eight tensors (128 MiB) should be resident");
  cr_expect_lt(peak - before, (64 + 32) * 1024, "the run added %ld KiB to the peak RSS",
               peak - before);
  static const int64_t rows[] = {0, 1, 30000, 65535 - 100, 65535};
  double dk[64], dv[64];
  for (size_t ri = 0; ri < sizeof rows / sizeof *rows; ri++) {
    const int64_t j = rows[ri];
    direct_dkdv(&c, n, d, wl, j, dk, dv);
    double ek = 0, nk = 0, ev = 0, nv = 0;
    for (int64_t t = 0; t < d; t++) {
      double xk = ((float *)c.dk)[j * d + t], xv = ((float *)c.dv)[j * d + t];
      ek += (xk - dk[t]) * (xk - dk[t]), nk += dk[t] * dk[t];
      ev += (xv - dv[t]) * (xv - dv[t]), nv += dv[t] * dv[t];
    }
    cr_expect_lt(sqrt(ev / nv), 1e-5, "key %lld: dv error %.3g", (long long)j, sqrt(ev / nv));
    cr_expect_lt(sqrt(ek / nk), 1e-5, "key %lld: dk error %.3g", (long long)j, sqrt(ek / nk));
  }
  tcase_free(&c);
  attn_engine_close(e);
}
