/*
 * dvcase.h — contiguous attention problems whose values may have a head dim
 * of their own (head_dim_v), run forward and backward on each CPU kernel
 * against the float64 reference: the harness of test_dv.c and
 * test_wide_heads.c, which differ only in their problems.
 */
#ifndef ATTN_TEST_DVCASE_H
#define ATTN_TEST_DVCASE_H

#include "helpers.h"

#include <criterion/criterion.h>

typedef struct dvspec {
  int64_t b, hq, hkv, nq, nkv, d, dv; /* dv 0: v as wide as q */
  bool causal;
  int64_t wl, wr; /* -1 unbounded */
  bool sinks;     /* a sink logit per query head, drawn */
} dvspec;

/* A problem's tensors, contiguous [B, H, N, width], and its request. */
typedef struct dvcase {
  attn_request r;
  int64_t nq_el, nk_el, nv_el, no_el, rows; /* elements of q, k, v, o; query rows */
  void *q, *k, *v, *o, *dout, *dq, *dk, *dv;
  float *m, *l, *lse, *sinks, *dsinks;
} dvcase;

/* Inputs drawn from seed, outputs zeroed, the statistics m, l, lse asked. */
void dvcase_init(dvcase *c, const dvspec *s, attn_dtype dt, uint64_t seed);
/* Makes c a backward case: O and lse from the float64 forward, dO drawn. */
void dvcase_backward(dvcase *c, uint64_t seed);
void dvcase_free(dvcase *c);

/*
 * Every spec in every dtype on CPU kernel isa (an index into generic, avx2,
 * avx512, avx512bf16, amx, amxemu; the test skips where this CPU lacks it),
 * forward (O, m, l, lse) or backward (dq, dk, dv, dsinks), against the
 * reference; spec i in dtype t draws from seed0 + 10 i + t. Problems of
 * more than 20000 query-key pairs run forward only (the reference
 * backward's S and P). Fails the test when any is out of tolerance.
 */
void dvcase_run_isa(int isa, bool backward, const dvspec *specs, int n, uint64_t seed0);

/* The forward and backward tests of a suite on each CPU kernel; run(isa,
 * backward) calls dvcase_run_isa with the suite's problems. */
#define DVCASE_ISA_TESTS(suite, run)                                 \
  Test(suite, forward_generic, .timeout = 300) { run(0, false); }    \
  Test(suite, backward_generic, .timeout = 300) { run(0, true); }    \
  Test(suite, forward_avx2, .timeout = 300) { run(1, false); }       \
  Test(suite, backward_avx2, .timeout = 300) { run(1, true); }       \
  Test(suite, forward_avx512, .timeout = 300) { run(2, false); }     \
  Test(suite, backward_avx512, .timeout = 300) { run(2, true); }     \
  Test(suite, forward_avx512bf16, .timeout = 300) { run(3, false); } \
  Test(suite, backward_avx512bf16, .timeout = 300) { run(3, true); } \
  Test(suite, forward_amx, .timeout = 300) { run(4, false); }        \
  Test(suite, backward_amx, .timeout = 300) { run(4, true); }        \
  Test(suite, forward_amxemu, .timeout = 300) { run(5, false); }     \
  Test(suite, backward_amxemu, .timeout = 300) { run(5, true); }

#endif
