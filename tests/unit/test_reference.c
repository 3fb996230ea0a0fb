/*
 * test_reference.c — engine/reference.c and reference_bwd.c, the float64
 * yardstick, against values worked out by hand: one query, two keys,
 * D = 1, scale ln 3, so that the scores are 0 and ln 3 and P = [1/4, 3/4].
 */
#include "reference.h"

#include <criterion/criterion.h>
#include <math.h>

static float q[2] = {1, 1}, k[2] = {0, 1}, v[2] = {4, 8};

static void tiny(attn_request *r, int64_t nq) {
  attn_request_init(r);
  r->batch = r->heads_q = r->heads_kv = r->head_dim = 1;
  r->seq_q = nq;
  r->seq_kv = 2;
  r->scale = log(3.0);
  r->q = q;
  r->k = k;
  r->v = v;
}

Test(reference, forward_by_hand) {
  attn_request r;
  float o32[1];
  tiny(&r, 1);
  r.o = o32;
  double o, m, l, lse;
  attn_status st = {0};
  cr_assert_eq(attn_reference(&r, &o, &m, &l, &lse, &st), 0, "%s", st.message);
  cr_assert_float_eq(o, 0.25 * 4 + 0.75 * 8, 1e-12); /* 7 */
  cr_assert_float_eq(m, log(3.0), 1e-12);
  cr_assert_float_eq(l, 4.0 / 3.0, 1e-12); /* e^-ln3 + e^0 */
  cr_assert_float_eq(lse, log(4.0), 1e-12);
}

Test(reference, causal_row_sees_one_key) {
  attn_request r;
  float o32[2];
  tiny(&r, 2);
  r.causal = true;
  r.o = o32;
  double o[2], lse[2];
  attn_status st = {0};
  cr_assert_eq(attn_reference(&r, o, NULL, NULL, lse, &st), 0, "%s", st.message);
  cr_assert_float_eq(o[0], 4, 1e-12); /* row 0: key 0 alone */
  cr_assert_float_eq(lse[0], 0, 1e-12);
  cr_assert_float_eq(o[1], 7, 1e-12);
}

/* dV = Pᵀ·dO, dS = P∘(dP - rowsum(P∘dP)) with dP = dO·Vᵀ = [4, 8] and
 * rowsum 7: dS = [-3/4, 3/4]; dQ = scale·dS·K, dK = scale·dSᵀ·Q. */
Test(reference, backward_by_hand) {
  attn_request r;
  float o32[1] = {7}, dout[1] = {1}, dq32[1], dk32[2], dv32[2];
  tiny(&r, 1);
  r.pass = ATTN_BACKWARD;
  r.o = o32;
  r.dout = dout;
  r.dq = dq32;
  r.dk = dk32;
  r.dv = dv32;
  double dq, dk[2], dv[2];
  attn_status st = {0};
  cr_assert_eq(attn_reference_backward(&r, &dq, dk, dv, &st), 0, "%s", st.message);
  const double ln3 = log(3.0);
  cr_assert_float_eq(dv[0], 0.25, 1e-12);
  cr_assert_float_eq(dv[1], 0.75, 1e-12);
  cr_assert_float_eq(dq, ln3 * 0.75, 1e-12);
  cr_assert_float_eq(dk[0], -ln3 * 0.75, 1e-12);
  cr_assert_float_eq(dk[1], ln3 * 0.75, 1e-12);
}
