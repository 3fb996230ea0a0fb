/*
 * test_sinks.c — attention sinks (gpt-oss: one zero-valued key of logit
 * sinks[h] per query head in every row's softmax) and their gradient.
 *
 * The float64 reference is checked against the formula written out here
 * (m = max(max s, t), l = Σ e^(s−m) + e^(t−m), lse = m + ln l), and its
 * dsinks against central differences of a float64 loss; then every CPU
 * kernel this machine runs, forward (prefill, GQA, windows whose rows see
 * nothing, decode with split keys, AMX's whole tiles) and backward (dq, dk,
 * dv with the sinks' normalization, dsinks from lse and dO·O), against
 * that reference; then the refusals.
 */
#include "helpers.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const isas[] = {"generic", "avx2", "avx512", "avx512bf16", "amx", "amxemu"};
enum { NISAS = sizeof isas / sizeof *isas };

/* Element d of row `row` of a contiguous [B, H, N, D] tensor of c's dtype. */
static double at(const tcase *c, const void *x, int64_t row, int64_t d) {
  return attn_load_elem(x, c->p.dt, (size_t)(row * c->p.d + d));
}

/* The contract's formula for row (b, h, i), written out in float64. */
static void formula_row(const tcase *c, int64_t b, int64_t h, int64_t i, double *o, double *lse) {
  const tprob *p = &c->p;
  const int64_t hk = h / (p->hq / p->hkv), off = p->nkv - p->nq;
  const double scale = 1.0 / sqrt((double)p->d), t = c->sinks[h];
  double s[64], mx = t, l = 0;
  for (int64_t j = 0; j < p->nkv; j++) {
    s[j] = -INFINITY;
    if (p->causal && j > i + off)
      continue;
    double dot = 0;
    for (int64_t d = 0; d < p->d; d++)
      dot += at(c, c->q, (b * p->hq + h) * p->nq + i, d) *
             at(c, c->k, (b * p->hkv + hk) * p->nkv + j, d);
    s[j] = scale * dot;
    mx = fmax(mx, s[j]);
  }
  for (int64_t d = 0; d < p->d; d++)
    o[d] = 0;
  for (int64_t j = 0; j < p->nkv; j++) {
    const double w = exp(s[j] - mx);
    l += w;
    for (int64_t d = 0; d < p->d; d++)
      o[d] += w * at(c, c->v, (b * p->hkv + hk) * p->nkv + j, d);
  }
  l += exp(t - mx);
  for (int64_t d = 0; d < p->d; d++)
    o[d] /= l;
  *lse = mx + log(l);
}

/* Causal with Nq > Nkv, so the first rows see no key: O = 0, lse = the sink. */
Test(sinks, reference_is_the_formula) {
  tprob p = tprob_make(2, 5, 1, 9, 6, 8, ATTN_F32);
  p.causal = true;
  p.sinks = true;
  tcase c;
  tcase_init(&c, &p, 7);
  double *o = malloc((size_t)(p.b * p.hq * p.nq * p.d) * sizeof *o);
  double *lse = malloc((size_t)(p.b * p.hq * p.nq) * sizeof *lse);
  attn_status st;
  cr_assert_eq(attn_reference(&c.req, o, NULL, NULL, lse, &st), 0, "%s", st.message);
  for (int64_t b = 0; b < p.b; b++)
    for (int64_t h = 0; h < p.hq; h++)
      for (int64_t i = 0; i < p.nq; i++) {
        double fo[8], fl;
        formula_row(&c, b, h, i, fo, &fl);
        const int64_t row = (b * p.hq + h) * p.nq + i;
        cr_expect_float_eq(lse[row], fl, 1e-12, "lse of row %lld", (long long)row);
        for (int64_t d = 0; d < p.d; d++)
          cr_expect_float_eq(o[row * p.d + d], fo[d], 1e-12, "o of row %lld", (long long)row);
      }
  cr_expect_eq(lse[0], c.sinks[0], "a row with no key has lse = its sink");
  free(o);
  free(lse);
  tcase_free(&c);
}

/* Σ dO·O in float64 with sink h moved by e (the reference's own forward). */
static double loss(tcase *c, int64_t h, double e) {
  const tprob *p = &c->p;
  const size_t n = (size_t)(p->b * p->hq * p->nq * p->d);
  double *o = malloc(n * sizeof *o), sum = 0;
  attn_request r = c->req;
  r.pass = ATTN_FORWARD;
  r.dout = NULL;
  r.dq = r.dk = r.dv = NULL;
  r.dsinks = NULL;
  r.lse_in = NULL;
  const float t = c->sinks[h];
  c->sinks[h] = (float)(t + e);
  attn_status st;
  cr_assert_eq(attn_reference(&r, o, NULL, NULL, NULL, &st), 0, "%s", st.message);
  c->sinks[h] = t;
  for (size_t i = 0; i < n; i++)
    sum += o[i] * attn_load_elem(c->dout, p->dt, i);
  free(o);
  return sum;
}

/* The step 1/64 keeps t ± e exact in F32, so the difference is of the
 * sinks the loss really saw; its O(e²) error is below 1e-4 relative. */
Test(sinks, reference_dsinks_by_finite_differences) {
  tprob p = tprob_make(2, 4, 2, 7, 11, 6, ATTN_F32);
  p.causal = true;
  p.sinks = true;
  tcase c;
  tcase_init(&c, &p, 11);
  attn_status st;
  cr_assert_eq(tcase_backward(&c, true, 12, &st), 0, "%s", st.message);
  double d[4];
  cr_assert_eq(attn_reference_dsinks(&c.req, d, &st), 0, "%s", st.message);
  const double e = 1.0 / 64;
  for (int64_t h = 0; h < p.hq; h++) {
    const double fd = (loss(&c, h, e) - loss(&c, h, -e)) / (2 * e);
    cr_expect(fabs(d[h] - fd) <= 1e-4 * fmax(1e-3, fabs(fd)), "dsinks[%lld] %.9g, differences %.9g",
              (long long)h, d[h], fd);
  }
  tcase_free(&c);
}

/* Forward problems: prefill, GQA causal, a window, Nq > Nkv (rows that see
 * no key), an odd head_dim, decode rows with split keys, AMX's whole tiles. */
static int sink_cases(tprob *ps) {
  static const struct {
    int64_t b, hq, hkv, nq, nkv, d;
    bool causal;
    int64_t wl, wr;
  } v[] = {
      {1, 5, 5, 200, 200, 64, false, -1, -1}, {2, 8, 2, 129, 70, 64, true, -1, -1},
      {1, 5, 1, 90, 333, 96, false, 40, 7},   {2, 3, 1, 77, 130, 37, true, -1, -1},
      {1, 8, 2, 1, 3000, 128, false, -1, -1}, {2, 10, 5, 3, 2500, 64, true, 900, -1},
      {1, 5, 5, 192, 256, 128, true, -1, -1},
  };
  int n = 0;
  for (size_t i = 0; i < sizeof v / sizeof *v; i++)
    for (int dt = 0; dt < ATTN_DTYPE_COUNT; dt++) {
      tprob p = tprob_make(v[i].b, v[i].hq, v[i].hkv, v[i].nq, v[i].nkv, v[i].d, (attn_dtype)dt);
      p.causal = v[i].causal;
      p.wl = v[i].wl;
      p.wr = v[i].wr;
      p.stats = true;
      p.sinks = true;
      p.strided = i == 2;
      ps[n++] = p;
    }
  return n;
}

static void forward_on(int isa) {
  attn_engine *e = topen_isa(isas[isa], 2);
  if (!e)
    cr_skip_test("skipped: this CPU has no %s", isas[isa]);
  tprob ps[32];
  const int n = sink_cases(ps);
  int fails = 0;
  for (int i = 0; i < n; i++) {
    tcase c;
    char desc[200];
    tcase_init(&c, &ps[i], 300 + (uint64_t)i);
    attn_status st = {0};
    int rc = trun(e, &c, "cpu", &st);
    cr_expect_eq(rc, 0, "%s: engine failed: %s", tdesc(&ps[i], desc, sizeof desc), st.message);
    terr err = rc ? (terr){.o = INFINITY} : tcheck(&c);
    const bool ok = err.o <= ttol(ps[i].dt) && err.stats <= 1e-5;
    cr_expect(ok, "%s on %s: O error %.3g (tol %.0e), stats error %.3g",
              tdesc(&ps[i], desc, sizeof desc), isas[isa], err.o, ttol(ps[i].dt), err.stats);
    fails += !ok;
    tcase_free(&c);
  }
  attn_engine_close(e);
  cr_assert_eq(fails, 0, "%d of %d problems out of tolerance on %s", fails, n, isas[isa]);
}

/* One backward case on e, lse given or recomputed: dq, dk, dv and dsinks. */
static int backward_case(attn_engine *e, tcase *c, const tref_bwd *ref, const double *dref,
                         bool with_lse, const char *isa) {
  char desc[200];
  attn_status st = {0};
  tcase_poison_grads(c);
  c->req.lse_in = with_lse ? c->lse_in : NULL;
  int rc = trun(e, c, "cpu", &st);
  cr_expect_eq(rc, 0, "%s on %s: engine failed: %s", tdesc(&c->p, desc, sizeof desc), isa,
               st.message);
  if (rc)
    return 1;
  terr_bwd err = tref_bwd_check(c, ref);
  const double tol = ttol(c->p.dt), ds = tdsinks_err(c, dref);
  const bool ok = terr_bwd_within(&err, tol) && ds <= tol;
  cr_expect(ok, "%s on %s, lse %s: dq %.3g dk %.3g dv %.3g dsinks %.3g (tol %.0e)",
            tdesc(&c->p, desc, sizeof desc), isa, with_lse ? "given" : "recomputed", err.dq, err.dk,
            err.dv, ds, tol);
  return !ok;
}

static void backward_on(int isa) {
  attn_engine *e = topen_isa(isas[isa], 2);
  if (!e)
    cr_skip_test("skipped: this CPU has no %s", isas[isa]);
  tprob ps[32];
  const int n = sink_cases(ps);
  int fails = 0;
  for (int i = 0; i < n; i++) {
    if (ps[i].nkv > 1000) /* the reference backward's S and P: prefill shapes only */
      continue;
    tcase c;
    tref_bwd ref;
    attn_status st;
    double dref[16];
    tcase_init(&c, &ps[i], 500 + (uint64_t)i);
    cr_assert_eq(tcase_backward(&c, true, 700 + (uint64_t)i, &st), 0, "%s", st.message);
    cr_assert_eq(tref_bwd_compute(&c, &ref, &st), 0, "%s", st.message);
    cr_assert_eq(attn_reference_dsinks(&c.req, dref, &st), 0, "%s", st.message);
    fails += backward_case(e, &c, &ref, dref, true, isas[isa]);
    fails += backward_case(e, &c, &ref, dref, false, isas[isa]);
    tref_bwd_free(&ref);
    tcase_free(&c);
  }
  attn_engine_close(e);
  cr_assert_eq(fails, 0, "%d backward checks failed on %s", fails, isas[isa]);
}

#define ISA_TESTS(i, name)                                       \
  Test(sinks, forward_##name, .timeout = 300) { forward_on(i); } \
  Test(sinks, backward_##name, .timeout = 300) { backward_on(i); }

ISA_TESTS(0, generic)
ISA_TESTS(1, avx2)
ISA_TESTS(2, avx512)
ISA_TESTS(3, avx512bf16)
ISA_TESTS(4, amx)
ISA_TESTS(5, amxemu)

/* The reference backend takes sinks too, dsinks included. */
Test(sinks, reference_backend) {
  attn_engine *e = topen(2, NULL);
  tprob p = tprob_make(2, 4, 2, 30, 50, 16, ATTN_F32);
  p.causal = true;
  p.sinks = true;
  p.stats = true;
  tcase c;
  tcase_init(&c, &p, 21);
  attn_status st = {0};
  cr_assert_eq(trun(e, &c, "reference", &st), 0, "%s", st.message);
  terr err = tcheck(&c);
  cr_expect(err.o <= 1e-6 && err.stats <= 1e-6, "O error %.3g, stats %.3g", err.o, err.stats);
  double dref[4];
  cr_assert_eq(tcase_backward(&c, true, 22, &st), 0, "%s", st.message);
  cr_assert_eq(attn_reference_dsinks(&c.req, dref, &st), 0, "%s", st.message);
  cr_assert_eq(trun(e, &c, "reference", &st), 0, "%s", st.message);
  cr_expect(tdsinks_err(&c, dref) <= 1e-6, "dsinks error %.3g", tdsinks_err(&c, dref));
  tcase_free(&c);
  attn_engine_close(e);
}

Test(sinks, refusals) {
  tprob p = tprob_make(1, 3, 1, 4, 4, 8, ATTN_F32);
  p.sinks = true;
  tcase c;
  tcase_init(&c, &p, 31);
  attn_status st = {0};
  c.sinks[2] = NAN;
  cr_expect_eq(attn_request_validate(&c.req, &st), ATTN_ENONFINITE);
  cr_expect(strstr(st.message, "sinks") && strstr(st.message, "[2]"), "%s", st.message);
  c.sinks[2] = 1.0f;
  float d[3];
  c.req.dsinks = d;
  cr_expect_eq(attn_request_validate(&c.req, &st), ATTN_EINVAL, "dsinks in a forward pass");
  cr_expect(strstr(st.message, "dsinks"), "%s", st.message);
  c.req.dsinks = NULL;
  cr_assert_eq(tcase_backward(&c, true, 32, &st), 0, "%s", st.message);
  c.req.sinks = NULL;
  cr_expect_eq(attn_request_validate(&c.req, &st), ATTN_EINVAL, "dsinks without sinks");
  cr_expect(strstr(st.message, "needs sinks"), "%s", st.message);
  tcase_free(&c);
}
