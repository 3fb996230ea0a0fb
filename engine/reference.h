/*
 * reference.h — standard attention in float64, the yardstick of every test.
 *
 * It does what the seed's "standard attention" does, one head at a time:
 * S = scale·Q Kᵀ materialized whole, the mask applied by the definition in
 * DESIGN.md (element by element, sharing no code with the tiled kernels),
 * P = safe softmax(S) row by row, O = P V. Exposed here for the tests, which
 * need float64 outputs; the "reference" backend wraps it for users.
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
 * The whole request: o is [B, Hq, Nq, D] and m, l, lse [B, Hq, Nq], all
 * contiguous doubles (the statistics may be NULL). Allocates S and P for one
 * head at a time. Returns 0 or an error.
 */
int attn_reference(const attn_request *r, double *o, double *m, double *l, double *lse,
                   attn_status *st);

#endif
