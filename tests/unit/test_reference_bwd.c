/*
 * test_reference_bwd.c — the float64 reference backward against an oracle that
 * shares no algebra with it: central finite differences of the float64
 * forward. With L = Σ O∘dO, dL/dx for every input element x of q, k and v
 * is (L(x + h) − L(x − h)) / 2h, which must match dq, dk, dv.
 */
#include "helpers.h"
#include "reference.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>

typedef struct fdcase {
  int64_t b, hq, hkv, nq, nkv, d;
  bool causal;
  int64_t wl, wr;
  double softcap; /* 0: off */
  int alibi;      /* 0: off; 1: slopes [Hq]; 2: slopes [B, Hq] */
} fdcase;

/* L = Σ O∘dO of the float64 forward on r's current inputs. */
static double loss(const attn_request *r, const float *dout, size_t no) {
  double *o = malloc(no * sizeof *o);
  attn_status st;
  cr_assert_eq(attn_reference(r, o, NULL, NULL, NULL, &st), 0, "%s", st.message);
  double L = 0;
  for (size_t i = 0; i < no; i++)
    L += o[i] * (double)dout[i];
  free(o);
  return L;
}

/* Largest |fd − analytic| over a tensor, relative to its largest |analytic|. */
static double fd_error(attn_request *r, float *x, size_t nx, const double *grad, const float *dout,
                       size_t no) {
  double worst = 0, scale = 1e-30;
  for (size_t i = 0; i < nx; i++) {
    float x0 = x[i];
    x[i] = x0 + 1e-2f;
    float xp = x[i];
    double lp = loss(r, dout, no);
    x[i] = x0 - 1e-2f;
    float xm = x[i];
    double lm = loss(r, dout, no);
    x[i] = x0;
    double fd = (lp - lm) / ((double)xp - (double)xm);
    worst = fmax(worst, fabs(fd - grad[i]));
    scale = fmax(scale, fabs(grad[i]));
  }
  return worst / scale;
}

static void check_case(const fdcase *c, uint64_t seed) {
  size_t nq = (size_t)(c->b * c->hq * c->nq * c->d), nk = (size_t)(c->b * c->hkv * c->nkv * c->d);
  float *q = malloc(nq * sizeof *q), *dout = malloc(nq * sizeof *q), *o = malloc(nq * sizeof *q);
  float *k = malloc(nk * sizeof *k), *v = malloc(nk * sizeof *k);
  float *dq = malloc(nq * sizeof *q), *dk = malloc(nk * sizeof *k), *dv = malloc(nk * sizeof *k);
  for (size_t i = 0; i < nq; i++) {
    q[i] = (float)tuniform(&seed);
    dout[i] = (float)tuniform(&seed);
  }
  for (size_t i = 0; i < nk; i++) {
    k[i] = (float)tuniform(&seed);
    v[i] = (float)tuniform(&seed);
  }
  attn_request r;
  attn_request_init(&r);
  r.batch = c->b, r.heads_q = c->hq, r.heads_kv = c->hkv;
  r.seq_q = c->nq, r.seq_kv = c->nkv, r.head_dim = c->d;
  r.causal = c->causal, r.window_left = c->wl, r.window_right = c->wr;
  r.q = q, r.k = k, r.v = v, r.o = o;
  /* Scores of about ±1 against a cap of 0.5 put the pairs on tanh's curve,
   * where its derivative is far from 1. */
  r.softcap = c->softcap;
  float slopes[16];
  for (int64_t i = 0; i < c->b * c->hq; i++)
    slopes[i] = (float)(0.5 * (1 + tuniform(&seed)));
  if (c->alibi) {
    r.alibi_slopes = slopes;
    r.alibi_stride_b = c->alibi == 2 ? c->hq : 0;
  }
  double *g = malloc((nq + 2 * nk) * sizeof *g);
  attn_status st;
  /* The forward output is an input of the backward: any finite o will do for
   * the reference, which does not use it. */
  for (size_t i = 0; i < nq; i++)
    o[i] = 0;
  attn_request br = r;
  br.pass = ATTN_BACKWARD;
  br.dout = dout, br.dq = dq, br.dk = dk, br.dv = dv;
  cr_assert_eq(attn_reference_backward(&br, g, g + nq, g + nq + nk, &st), 0, "%s", st.message);
  double eq = fd_error(&r, q, nq, g, dout, nq);
  double ek = fd_error(&r, k, nk, g + nq, dout, nq);
  double ev = fd_error(&r, v, nk, g + nq + nk, dout, nq);
  cr_expect_lt(eq, 1e-4, "dq vs finite differences: %g", eq);
  cr_expect_lt(ek, 1e-4, "dk vs finite differences: %g", ek);
  cr_expect_lt(ev, 1e-4, "dv vs finite differences: %g", ev);
  free(q), free(dout), free(o), free(k), free(v), free(dq), free(dk), free(dv), free(g);
}

Test(backward_ref, finite_differences) {
  static const fdcase cases[] = {
      {1, 1, 1, 3, 4, 5, false, -1, -1, 0, 0},   /* plain, Nq < Nkv */
      {1, 2, 1, 4, 4, 3, true, -1, -1, 0, 0},    /* causal, GQA 2:1 */
      {2, 2, 2, 5, 3, 4, true, -1, -1, 0, 0},    /* causal with Nq > Nkv: rows see nothing */
      {1, 3, 1, 4, 6, 2, false, 1, 1, 0, 0},     /* sliding window, MQA */
      {1, 1, 1, 6, 6, 7, false, 0, 0, 0, 0},     /* diagonal only: P is one-hot */
      {1, 2, 1, 4, 5, 6, false, -1, -1, 0.5, 0}, /* softcap */
      {2, 2, 1, 5, 4, 3, true, -1, -1, 0, 2},    /* ALiBi [B, Hq], causal, Nq > Nkv */
      {1, 3, 3, 4, 7, 4, false, 2, 1, 0.3, 1},   /* both, in a window */
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
    check_case(&cases[i], 1000 + i);
}
