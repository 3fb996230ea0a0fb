/*
 * reference.h — standard attention in float64, the yardstick of every test.
 *
 * It does what the seed's "standard attention" does, one head at a time:
 * S = scale·Q Kᵀ materialized whole, the mask applied by the definition in
 * docs/design.md (element by element, sharing no code with the tiled kernels),
 * P = safe softmax(S) row by row, O = P V. The whole-request entries,
 * attn_reference() and attn_reference_backward(), are public in engine.h;
 * the pieces here (a head, its scratch, its inputs widened) are for the
 * tests, which need float64 outputs, and for the "reference" backend
 * (reference_backend.c), which wraps them for users. It holds no engine
 * state: any program linking libattn.a can call it.
 */
#ifndef ATTN_REFERENCE_H
#define ATTN_REFERENCE_H

#include "engine.h"

/*
 * One (batch b, query head h) of a validated request with strides filled in.
 * S and P are caller buffers of seq_q·seq_kv doubles; o receives seq_q·D
 * doubles row-major; m, l, lse (each may be NULL) seq_q doubles. Returns 0,
 * or ATTN_ENONFINITE (message names the tensor and element) when an input
 * element this head reads is not finite.
 */
int attn_reference_head(const attn_request *r, int64_t b, int64_t h, double *S, double *P,
                        double *o, double *m, double *l, double *lse, attn_status *st);

/*
 * S and P for attn_reference_head() or attn_reference_backward_group():
 * seq_q·seq_kv doubles each, for the caller to free. Returns 0 or
 * ATTN_ENOMEM with the bytes asked for.
 */
int attn_reference_scratch(const attn_request *r, double **S, double **P, attn_status *st);

/*
 * Rows [0, n) of one (batch b, head h) of a tensor (base, strides s, the
 * request's dtype) widened to float64, n × width row-major into dst (width:
 * head_dim for q and k, attn_request_dv() for v, o and do). Refuses a
 * non-finite element with ATTN_ENONFINITE, naming `name` and the element.
 */
int attn_reference_load(const attn_request *r, const char *name, const void *base,
                        const int64_t s[3], int64_t b, int64_t h, int64_t n, int64_t width,
                        double *dst, attn_status *st);

/*
 * The backward pass of one (batch b, KV head hk) of a validated backward
 * request with strides filled in: its query heads' dq (group × seq_q × D),
 * and dk, dv (seq_kv × D each, summed over the group), contiguous doubles.
 * S and P are caller buffers of seq_q·seq_kv doubles (S ends up holding dS).
 */
int attn_reference_backward_group(const attn_request *r, int64_t b, int64_t hk, double *S,
                                  double *P, double *dq, double *dk, double *dv, attn_status *st);

#endif
