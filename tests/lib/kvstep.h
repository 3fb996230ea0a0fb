/*
 * kvstep.h — a session step checked for the Criterion suites: tokens
 * [pos, pos + n) of s appended to layer `layer` of session id, and its
 * output against the float64 reference over s's [0, pos + n), the test
 * stopped on a miss. Apart from kvcalls.h because the GPU tests, which
 * link kvcalls.c, run without Criterion.
 */
#ifndef ATTN_TEST_KVSTEP_H
#define ATTN_TEST_KVSTEP_H

#include "helpers.h"
#include "kvcalls.h"

#include <criterion/criterion.h>
#include <math.h>

static inline void tkv_step_on(attn_kv_store *kv, const char *id, const tkv_stream *s,
                               int64_t layer, int64_t pos, int64_t n) {
  attn_status st;
  tkv_opts op = tkv_plain;
  op.layer = layer;
  double err = tkv_step_error(kv, id, s, &op, pos, n, &st);
  cr_assert_lt(err, ttol(s->dt), "%s [%lld, %lld): error %g (%s)", id, (long long)pos,
               (long long)(pos + n), err, err == INFINITY ? st.message : "");
}

/* The same on layer 0. */
static inline void tkv_step_ok(attn_kv_store *kv, const char *id, const tkv_stream *s, int64_t pos,
                               int64_t n) {
  tkv_step_on(kv, id, s, 0, pos, n);
}

#endif
