/*
 * test_wide_heads.c — head dims past 256, up to the contract's limits: q and
 * k of D up to 576, v of Dv up to 512 (DeepSeek's absorbed MLA decode: D
 * 576, Dv 512).
 *
 * Every CPU kernel this machine runs, forward (O and the statistics m, l,
 * lse) and backward (dq, dk, dv, and dsinks where the case has sinks),
 * against the float64 reference: causal prefill, a decode row whose keys
 * are split across threads, GQA, D 512 with v as wide, D 320, D 300 and odd
 * widths, D 384, sinks and a window at D 576. Then the refusals past the
 * limits. (Paged K and V at D 512: test_paged.c.)
 */
#include "helpers.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const isas[] = {"generic", "avx2", "avx512", "avx512bf16", "amx", "amxemu"};

typedef struct wspec {
  int64_t b, hq, hkv, nq, nkv, d, dv; /* dv 0: v as wide as q */
  bool causal;
  int64_t wl, wr;
  bool sinks;
} wspec;

static const wspec specs[] = {
    {1, 2, 2, 130, 150, 576, 512, true, -1, -1, false}, /* causal prefill */
    {1, 8, 1, 1, 1100, 576, 512, false, -1, -1, false}, /* decode: GQA, the keys split */
    {2, 4, 2, 70, 90, 576, 512, true, -1, -1, false},   /* GQA prefill */
    {1, 2, 2, 80, 100, 512, 0, true, -1, -1, false},    /* v as wide as q */
    {1, 2, 1, 65, 70, 320, 0, false, -1, -1, false},    /* D 320 */
    {1, 3, 1, 33, 47, 300, 300, true, -1, -1, false},   /* D 300, odd sizes */
    {1, 2, 1, 29, 41, 301, 263, false, -1, -1, false},  /* odd widths */
    {1, 2, 2, 90, 120, 576, 512, false, 40, 3, true},   /* sinks and a window */
    {1, 4, 2, 70, 80, 384, 384, true, -1, -1, false},   /* D 384 */
    {1, 4, 1, 2, 1200, 576, 512, false, 700, -1, true}, /* decode split, sinks, window */
};
enum { NSPECS = sizeof specs / sizeof *specs };

/* A problem's tensors, contiguous [B, H, N, width], and its request. */
typedef struct wcase {
  attn_request r;
  int64_t nq_el, nk_el, nv_el, no_el, rows;
  void *q, *k, *v, *o, *dout, *dq, *dk, *dv;
  float *m, *l, *lse, *sinks, *dsinks;
} wcase;

static void *rand_tensor(attn_dtype dt, int64_t n, uint64_t *seed) {
  void *p = malloc((size_t)n * attn_dtype_size(dt));
  for (int64_t i = 0; i < n; i++)
    attn_store_elem(p, dt, (size_t)i, (float)tuniform(seed));
  return p;
}

static void wcase_init(wcase *c, const wspec *s, attn_dtype dt, uint64_t seed) {
  memset(c, 0, sizeof *c);
  attn_request *r = &c->r;
  attn_request_init(r);
  r->batch = s->b, r->heads_q = s->hq, r->heads_kv = s->hkv, r->seq_q = s->nq;
  r->seq_kv = s->nkv, r->head_dim = s->d, r->head_dim_v = s->dv, r->dtype = dt;
  r->causal = s->causal, r->window_left = s->wl, r->window_right = s->wr;
  const int64_t dv = attn_request_dv(r);
  c->rows = s->b * s->hq * s->nq;
  c->nq_el = c->rows * s->d, c->nk_el = s->b * s->hkv * s->nkv * s->d;
  c->nv_el = s->b * s->hkv * s->nkv * dv, c->no_el = c->rows * dv;
  c->q = rand_tensor(dt, c->nq_el, &seed);
  c->k = rand_tensor(dt, c->nk_el, &seed);
  c->v = rand_tensor(dt, c->nv_el, &seed);
  c->o = calloc((size_t)c->no_el, attn_dtype_size(dt));
  c->m = calloc((size_t)c->rows, sizeof *c->m);
  c->l = calloc((size_t)c->rows, sizeof *c->l);
  c->lse = calloc((size_t)c->rows, sizeof *c->lse);
  if (s->sinks) {
    c->sinks = malloc((size_t)s->hq * sizeof *c->sinks);
    for (int64_t h = 0; h < s->hq; h++)
      c->sinks[h] = (float)(2 * tuniform(&seed));
    r->sinks = c->sinks;
  }
  r->q = c->q, r->k = c->k, r->v = c->v, r->o = c->o;
  r->m = c->m, r->l = c->l, r->lse = c->lse;
}

static void wcase_free(wcase *c) {
  free(c->q), free(c->k), free(c->v), free(c->o), free(c->dout);
  free(c->dq), free(c->dk), free(c->dv), free(c->m), free(c->l), free(c->lse);
  free(c->sinks), free(c->dsinks);
}

/* ||x - ref|| / ||ref|| over n elements of dtype dt (a NaN: infinite). */
static double nerr(const void *x, attn_dtype dt, const double *ref, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; i++) {
    const double a = attn_load_elem(x, dt, (size_t)i);
    num += isnan(a) ? INFINITY : (a - ref[i]) * (a - ref[i]);
    den += ref[i] * ref[i];
  }
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* The largest error of a statistic, relative to 1 + |ref| (every row here
 * sees a key or a sink, so none is infinite). */
static double stat_err(const float *x, const double *ref, int64_t n) {
  double worst = 0;
  for (int64_t i = 0; i < n; i++) {
    const double e = isnan(x[i]) ? INFINITY : fabs(x[i] - ref[i]) / (1 + fabs(ref[i]));
    worst = e > worst ? e : worst;
  }
  return worst;
}

static int forward_case(attn_engine *e, const wspec *s, attn_dtype dt, uint64_t seed,
                        const char *isa) {
  wcase c;
  wcase_init(&c, s, dt, seed);
  double *ref = malloc((size_t)(c.no_el + 3 * c.rows) * sizeof *ref);
  double *rm = ref + c.no_el, *rl = rm + c.rows, *rlse = rl + c.rows;
  attn_status st = {0};
  cr_assert_eq(attn_reference(&c.r, ref, rm, rl, rlse, &st), 0, "%s", st.message);
  int rc = attn_engine_run(e, &c.r, NULL, &st);
  cr_expect_eq(rc, 0, "%s: %s", isa, st.message);
  const double eo = rc ? INFINITY : nerr(c.o, dt, ref, c.no_el);
  double es = rc ? INFINITY : stat_err(c.m, rm, c.rows);
  es = fmax(es, rc ? INFINITY : stat_err(c.l, rl, c.rows));
  es = fmax(es, rc ? INFINITY : stat_err(c.lse, rlse, c.rows));
  const bool ok = eo <= ttol(dt) && es <= 1e-4;
  cr_expect(ok, "%s, D %lld Dv %lld Nq %lld %s: O error %.3g, statistics %.3g", isa,
            (long long)s->d, (long long)attn_request_dv(&c.r), (long long)s->nq,
            attn_dtype_name(dt), eo, es);
  free(ref);
  wcase_free(&c);
  return !ok;
}

/* The backward's inputs: O and lse from the float64 forward, dO drawn. */
static void wcase_backward(wcase *c, uint64_t seed) {
  attn_request *r = &c->r;
  double *o = malloc((size_t)(c->no_el + c->rows) * sizeof *o), *lse = o + c->no_el;
  attn_status st;
  cr_assert_eq(attn_reference(r, o, NULL, NULL, lse, &st), 0, "%s", st.message);
  for (int64_t i = 0; i < c->no_el; i++)
    attn_store_elem(c->o, r->dtype, (size_t)i, (float)o[i]);
  for (int64_t i = 0; i < c->rows; i++)
    c->lse[i] = (float)lse[i];
  free(o);
  c->dout = rand_tensor(r->dtype, c->no_el, &seed);
  const size_t es = attn_dtype_size(r->dtype);
  c->dq = malloc((size_t)c->nq_el * es);
  c->dk = malloc((size_t)c->nk_el * es);
  c->dv = malloc((size_t)c->nv_el * es);
  r->pass = ATTN_BACKWARD;
  r->m = r->l = r->lse = NULL;
  r->lse_in = c->lse;
  r->dout = c->dout, r->dq = c->dq, r->dk = c->dk, r->dv = c->dv;
  if (r->sinks) {
    c->dsinks = calloc((size_t)r->heads_q, sizeof *c->dsinks);
    r->dsinks = c->dsinks;
  }
}

static double dsinks_err(const wcase *c, attn_status *st) {
  if (!c->dsinks)
    return 0;
  double ref[16];
  cr_assert_eq(attn_reference_dsinks(&c->r, ref, st), 0, "%s", st->message);
  double num = 0, den = 0;
  for (int64_t h = 0; h < c->r.heads_q; h++) {
    const double x = c->dsinks[h];
    num += isnan(x) ? INFINITY : (x - ref[h]) * (x - ref[h]);
    den += ref[h] * ref[h];
  }
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

static int backward_case(attn_engine *e, const wspec *s, attn_dtype dt, uint64_t seed,
                         const char *isa) {
  wcase c;
  wcase_init(&c, s, dt, seed);
  wcase_backward(&c, seed + 1);
  double *ref = malloc((size_t)(c.nq_el + c.nk_el + c.nv_el) * sizeof *ref);
  attn_status st = {0};
  cr_assert_eq(attn_reference_backward(&c.r, ref, ref + c.nq_el, ref + c.nq_el + c.nk_el, &st), 0,
               "%s", st.message);
  int rc = attn_engine_run(e, &c.r, NULL, &st);
  cr_expect_eq(rc, 0, "%s: %s", isa, st.message);
  const double eq = rc ? INFINITY : nerr(c.dq, dt, ref, c.nq_el);
  const double ek = rc ? INFINITY : nerr(c.dk, dt, ref + c.nq_el, c.nk_el);
  const double ev = rc ? INFINITY : nerr(c.dv, dt, ref + c.nq_el + c.nk_el, c.nv_el);
  const double ed = rc ? INFINITY : dsinks_err(&c, &st);
  const double tol = ttol(dt);
  const bool ok = eq <= tol && ek <= tol && ev <= tol && ed <= tol;
  cr_expect(ok, "%s, D %lld Dv %lld %s: dq %.3g dk %.3g dv %.3g dsinks %.3g", isa, (long long)s->d,
            (long long)attn_request_dv(&c.r), attn_dtype_name(dt), eq, ek, ev, ed);
  free(ref);
  wcase_free(&c);
  return !ok;
}

static void run_on(int isa, bool backward) {
  attn_engine *e = topen_isa(isas[isa], 2);
  if (!e)
    cr_skip_test("skipped: this CPU has no %s", isas[isa]);
  int fails = 0;
  for (int i = 0; i < NSPECS; i++)
    for (int dt = 0; dt < ATTN_DTYPE_COUNT; dt++) {
      if (backward && specs[i].nq * specs[i].nkv > 20000) /* decode rows: forward only */
        continue;
      fails += (backward ? backward_case : forward_case)(
          e, &specs[i], (attn_dtype)dt, 60 + 10 * (uint64_t)i + (uint64_t)dt, isas[isa]);
    }
  attn_engine_close(e);
  cr_assert_eq(fails, 0, "%d cases out of tolerance on %s", fails, isas[isa]);
}

#define ISA_TESTS(i, name)                                               \
  Test(wide_heads, forward_##name, .timeout = 300) { run_on(i, false); } \
  Test(wide_heads, backward_##name, .timeout = 300) { run_on(i, true); }

ISA_TESTS(0, generic)
ISA_TESTS(1, avx2)
ISA_TESTS(2, avx512)
ISA_TESTS(3, avx512bf16)
ISA_TESTS(4, amx)
ISA_TESTS(5, amxemu)

/* Past the limits: each refusal names the limit and what was asked. */
Test(wide_heads, refusals) {
  static const struct {
    int64_t d, dv;
    const char *words[3];
  } bad[] = {
      {577, 512, {"head_dim", "576", "577"}},
      {576, 513, {"head_dim_v", "512", "513"}},
      {520, 0, {"head_dim_v", "512", "520"}}, /* v as wide as q: Dv 520 */
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    const wspec s = {1, 1, 1, 2, 2, 4, 0, false, -1, -1, false};
    wcase c;
    wcase_init(&c, &s, ATTN_F32, 3);
    c.r.head_dim = bad[i].d, c.r.head_dim_v = bad[i].dv;
    attn_status st = {0};
    cr_expect_eq(attn_request_validate(&c.r, &st), ATTN_ESHAPE, "D %lld Dv %lld",
                 (long long)bad[i].d, (long long)bad[i].dv);
    for (int w = 0; w < 3; w++)
      cr_expect(strstr(st.message, bad[i].words[w]), "no \"%s\" in %s", bad[i].words[w],
                st.message);
    wcase_free(&c);
  }
}
