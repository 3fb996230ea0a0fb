/*
 * selfcheck.c — the cases of the cpu backend's start-up self-check and their verdict (see
 * selfcheck.h).
 *
 * The shapes reach the amx kernel's tile path and its edges: 80 queries are
 * a whole block of 64 and a part block of 16 (more rows than the few-rows
 * path takes), 150 keys are two whole tiles of 64 and a part tile that takes
 * VDPBF16PS; causal rows see part of a tile, and a GQA group shares K and V.
 * A decode step's group of 4 rows takes the few rows path, on tiles too,
 * its part tile through a padded copy.
 * Inputs are uniform in [-1, 1) from a fixed xorshift, so a failure
 * reproduces.
 */
#include "selfcheck.h"

#include "reference.h"
#include "request_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct check_shape {
  int hq, hkv, nq, nkv, d;
  bool causal;
} check_shape;

static const check_shape shapes[] = {
    {2, 2, 80, 150, 64, true},
    {2, 2, 80, 150, 128, false},
    {4, 1, 80, 150, 128, true}, /* GQA 4:1 */
    {8, 2, 1, 150, 128, true},  /* decode: the few rows path's tiles (flash_amx_rows.h) */
};
enum { NSHAPES = sizeof shapes / sizeof *shapes };

/* The thresholds of the unit tests (tests/lib/helpers.h: ttol, tcheck). */
#define TOL_O 8e-3
#define TOL_LSE 1e-5

/* One case: the request over one buffer (q, k, v, o in BF16, lse) and the
 * reference's o and lse. */
typedef struct check_case {
  attn_request req;
  void *buf;
  double *ref;
} check_case;

static void fill(void *p, size_t n, uint64_t *x) {
  for (size_t i = 0; i < n; i++) {
    *x ^= *x << 13, *x ^= *x >> 7, *x ^= *x << 17;
    attn_store_elem(p, ATTN_BF16, i, (float)((double)(*x >> 11) / (double)(1ull << 52) - 1.0));
  }
}

static void case_free(check_case *c) {
  free(c->buf);
  free(c->ref);
}

/* Case i's request, inputs and reference; 0 or an error. */
static int case_make(int i, check_case *c, attn_status *st) {
  const check_shape *s = &shapes[i];
  attn_request *r = &c->req;
  attn_request_init(r);
  r->dtype = ATTN_BF16;
  r->batch = 1, r->heads_q = s->hq, r->heads_kv = s->hkv;
  r->seq_q = s->nq, r->seq_kv = s->nkv, r->head_dim = s->d;
  r->causal = s->causal;
  const size_t nq = (size_t)(s->hq * s->nq * s->d), nk = (size_t)(s->hkv * s->nkv * s->d);
  const size_t rows = (size_t)(s->hq * s->nq);
  c->buf = malloc(2 * (nq + nk) * 2 + rows * sizeof(float));
  c->ref = malloc((nq + rows) * sizeof *c->ref);
  if (!c->buf || !c->ref) {
    case_free(c);
    return attn_status_set(st, ATTN_ENOMEM, "out of memory for the cpu self-check");
  }
  char *b = c->buf;
  r->q = b, r->k = b + 2 * nq, r->v = b + 2 * (nq + nk), r->o = b + 2 * (nq + 2 * nk);
  r->lse = (float *)(void *)(b + 2 * (2 * nq + 2 * nk));
  uint64_t x = 0x9e3779b97f4a7c15ull + (uint64_t)i;
  fill(c->buf, nq + 2 * nk, &x); /* q, k, v lie one after another */
  attn__request_fill_strides(r);
  int rc = attn_reference(r, c->ref, NULL, NULL, c->ref + nq, st);
  if (rc < 0)
    case_free(c);
  return rc;
}

/* ||o - ref|| / ||ref||, NaN as infinite. */
static double o_error(const attn_request *r, const double *ref) {
  const size_t n = (size_t)(r->heads_q * r->seq_q * r->head_dim);
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    const double a = attn_load_elem(r->o, ATTN_BF16, i);
    if (isnan(a))
      return INFINITY;
    num += (a - ref[i]) * (a - ref[i]);
    den += ref[i] * ref[i];
  }
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* The largest |lse - ref| / max(1, |ref|) over the rows, NaN as infinite. */
static double lse_error(const attn_request *r, const double *ref) {
  double worst = 0;
  for (int64_t i = 0; i < r->heads_q * r->seq_q; i++) {
    const double e = fabs(r->lse[i] - ref[i]) / fmax(1.0, fabs(ref[i]));
    worst = isnan(e) ? INFINITY : fmax(worst, e);
  }
  return worst;
}

/* What a wrong kernel would leave: O negated. */
static void negate_o(const attn_request *r) {
  for (size_t k = 0; k < (size_t)(r->heads_q * r->seq_q * r->head_dim); k++)
    attn_store_elem(r->o, ATTN_BF16, k, -(float)attn_load_elem(r->o, ATTN_BF16, k));
}

/* Case c's outputs against its reference; false with why when they differ. */
static bool case_verdict(const check_case *c, const char *shape, bool fault, char *why,
                         size_t cap) {
  const attn_request *r = &c->req;
  const size_t nq = (size_t)(r->heads_q * r->seq_q * r->head_dim);
  const double eo = o_error(r, c->ref), el = lse_error(r, c->ref + nq);
  if (!(eo <= TOL_O))
    snprintf(why, cap, "o error %.2g > %.0e on %s%s", eo, TOL_O, shape,
             fault ? ", a forced failure" : "");
  else if (!(el <= TOL_LSE))
    snprintf(why, cap, "lse error %.2g > %.0e on %s", el, TOL_LSE, shape);
  return eo <= TOL_O && el <= TOL_LSE;
}

/* Case i's verdict; false with why when it fails or cannot run. */
static bool case_run(attn__cpu_check_run run, void *ctx, int i, bool fault, char *why, size_t cap) {
  const check_shape *s = &shapes[i];
  char shape[80];
  snprintf(shape, sizeof shape, "BF16 [%d, %d, %d, %d, %d]%s", s->hq, s->hkv, s->nq, s->nkv, s->d,
           s->causal ? " causal" : "");
  check_case c;
  attn_status st = {0};
  if (case_make(i, &c, &st) < 0) {
    snprintf(why, cap, "%s: %s", shape, st.message);
    return false;
  }
  bool ok = run(ctx, &c.req, &st) == 0;
  if (!ok)
    snprintf(why, cap, "%s: %s", shape, st.message);
  if (ok && fault)
    negate_o(&c.req);
  ok = ok && case_verdict(&c, shape, fault, why, cap);
  case_free(&c);
  return ok;
}

bool attn__cpu_self_check(attn__cpu_check_run run, void *ctx, bool fault, char *why, size_t cap) {
  for (int i = 0; i < NSHAPES; i++)
    if (!case_run(run, ctx, i, fault && i == 0, why, cap))
      return false;
  return true;
}
