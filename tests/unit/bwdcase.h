/*
 * bwdcase.h — backward-pass test cases for the suites that run a backend
 * on them (the mock-runtime tests, the GPU tests): inputs drawn like
 * tcase's, the forward's O (in the input dtype) and lse from the float64
 * reference so that they are what a caller would pass, dO random, outputs
 * poisoned (NaN), and the float64 reference backward to compare with by
 * normalized error.
 */
#ifndef ATTN_TEST_BWDCASE_H
#define ATTN_TEST_BWDCASE_H

#include "helpers.h"

typedef struct tbwd {
  tcase c; /* q, k, v, o and the request (pass ATTN_BACKWARD) */
  void *dout, *dq, *dk, *dv;
  float *lse;  /* the forward's lse, [B, Hq, Nq]; req.lse_in when given */
  double *ref; /* reference dq [B,Hq,Nq,D], then dk, dv [B,Hkv,Nkv,D] */
} tbwd;

/* Makes the case (p->stats is ignored); with_lse passes the forward's lse
 * as req.lse_in. Returns 0, or the reference's error code with st set. */
int tbwd_init(tbwd *t, const tprob *p, uint64_t seed, bool with_lse, attn_status *st);
void tbwd_poison(tbwd *t);
void tbwd_free(tbwd *t);

/* ||x - ref||_2 / ||ref||_2 of each output (absolute when ref is 0; NaN
 * anywhere gives infinity). */
typedef struct tbwd_err {
  double dq, dk, dv;
} tbwd_err;
tbwd_err tbwd_check(const tbwd *t);
/* Whether every error is within tol. */
bool tbwd_pass(const tbwd_err *e, double tol);

#endif
