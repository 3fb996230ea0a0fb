/*
 * dvcase.c — contiguous problems with a value head dim of their own, on
 * each CPU kernel against the float64 reference (see dvcase.h).
 */
#include "dvcase.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const isas[] = {"generic", "avx2", "avx512", "avx512bf16", "amx", "amxemu"};

static void *rand_tensor(attn_dtype dt, int64_t n, uint64_t *seed) {
  void *p = malloc((size_t)n * attn_dtype_size(dt));
  for (int64_t i = 0; i < n; i++)
    attn_store_elem(p, dt, (size_t)i, (float)tuniform(seed));
  return p;
}

void dvcase_init(dvcase *c, const dvspec *s, attn_dtype dt, uint64_t seed) {
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

void dvcase_backward(dvcase *c, uint64_t seed) {
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

void dvcase_free(dvcase *c) {
  free(c->q), free(c->k), free(c->v), free(c->o), free(c->dout);
  free(c->dq), free(c->dk), free(c->dv), free(c->m), free(c->l), free(c->lse);
  free(c->sinks), free(c->dsinks);
}

/* The error of a statistic relative to 1 + |ref|; a row that sees nothing
 * must match the reference's infinity exactly. */
static double stat_err1(double x, double ref) {
  if (x == ref)
    return 0;
  if (isnan(x) || isinf(x) || isinf(ref))
    return INFINITY;
  return fabs(x - ref) / (1 + fabs(ref));
}

/* The largest error of a statistic over n rows. */
static double stat_err(const float *x, const double *ref, int64_t n) {
  double worst = 0;
  for (int64_t i = 0; i < n; i++)
    worst = fmax(worst, stat_err1(x[i], ref[i]));
  return worst;
}

static int forward_case(attn_engine *e, const dvspec *s, attn_dtype dt, uint64_t seed,
                        const char *isa) {
  dvcase c;
  dvcase_init(&c, s, dt, seed);
  double *ref = malloc((size_t)(c.no_el + 3 * c.rows) * sizeof *ref);
  double *rm = ref + c.no_el, *rl = rm + c.rows, *rlse = rl + c.rows;
  attn_status st = {0};
  cr_assert_eq(attn_reference(&c.r, ref, rm, rl, rlse, &st), 0, "%s", st.message);
  int rc = attn_engine_run(e, &c.r, NULL, &st);
  cr_expect_eq(rc, 0, "%s: %s", isa, st.message);
  const double eo = rc ? INFINITY : tnerr(c.o, dt, ref, c.no_el);
  double es = rc ? INFINITY : stat_err(c.m, rm, c.rows);
  es = fmax(es, rc ? INFINITY : stat_err(c.l, rl, c.rows));
  es = fmax(es, rc ? INFINITY : stat_err(c.lse, rlse, c.rows));
  const bool ok = eo <= ttol(dt) && es <= 1e-4;
  cr_expect(ok, "%s, D %lld Dv %lld Nq %lld %s: O error %.3g, statistics %.3g", isa,
            (long long)s->d, (long long)attn_request_dv(&c.r), (long long)s->nq,
            attn_dtype_name(dt), eo, es);
  free(ref);
  dvcase_free(&c);
  return !ok;
}

/* dsinks against the reference's; 0 when c has no sinks. */
static double dsinks_err(const dvcase *c, attn_status *st) {
  if (!c->dsinks)
    return 0;
  double *ref = malloc((size_t)c->r.heads_q * sizeof *ref);
  cr_assert_eq(attn_reference_dsinks(&c->r, ref, st), 0, "%s", st->message);
  const double err = tnerr(c->dsinks, ATTN_F32, ref, c->r.heads_q);
  free(ref);
  return err;
}

static int backward_case(attn_engine *e, const dvspec *s, attn_dtype dt, uint64_t seed,
                         const char *isa) {
  dvcase c;
  dvcase_init(&c, s, dt, seed);
  dvcase_backward(&c, seed + 1);
  double *ref = malloc((size_t)(c.nq_el + c.nk_el + c.nv_el) * sizeof *ref);
  attn_status st = {0};
  cr_assert_eq(attn_reference_backward(&c.r, ref, ref + c.nq_el, ref + c.nq_el + c.nk_el, &st), 0,
               "%s", st.message);
  int rc = attn_engine_run(e, &c.r, NULL, &st);
  cr_expect_eq(rc, 0, "%s: %s", isa, st.message);
  const double eq = rc ? INFINITY : tnerr(c.dq, dt, ref, c.nq_el);
  const double ek = rc ? INFINITY : tnerr(c.dk, dt, ref + c.nq_el, c.nk_el);
  const double ev = rc ? INFINITY : tnerr(c.dv, dt, ref + c.nq_el + c.nk_el, c.nv_el);
  const double ed = rc ? INFINITY : dsinks_err(&c, &st);
  const double tol = ttol(dt);
  const bool ok = eq <= tol && ek <= tol && ev <= tol && ed <= tol;
  cr_expect(ok, "%s, D %lld Dv %lld %s: dq %.3g dk %.3g dv %.3g dsinks %.3g", isa, (long long)s->d,
            (long long)attn_request_dv(&c.r), attn_dtype_name(dt), eq, ek, ev, ed);
  free(ref);
  dvcase_free(&c);
  return !ok;
}

void dvcase_run_isa(int isa, bool backward, const dvspec *specs, int n, uint64_t seed0) {
  attn_engine *e = topen_isa(isas[isa], 2);
  if (!e)
    cr_skip_test("skipped: this CPU has no %s", isas[isa]);
  int fails = 0;
  for (int i = 0; i < n; i++)
    for (int dt = 0; dt < ATTN_DTYPE_COUNT; dt++) {
      if (backward && specs[i].nq * specs[i].nkv > 20000)
        continue;
      fails += (backward ? backward_case : forward_case)(
          e, &specs[i], (attn_dtype)dt, seed0 + 10 * (uint64_t)i + (uint64_t)dt, isas[isa]);
    }
  attn_engine_close(e);
  cr_assert_eq(fails, 0, "%d cases out of tolerance on %s", fails, isas[isa]);
}
