/*
 * softmax.h — softmax of one row in float64, two ways (seed exercise 2).
 *
 * Safe softmax subtracts the row maximum in a first pass. Online softmax
 * keeps a running maximum m and sum l and rescales l whenever m grows; the
 * merge rule below is the whole trick, and it is the same rule that merges
 * the partial statistics of two key ranges (FlashAttention's tiles, a
 * split-KV decode's chunks):
 *
 *   m = max(m1, m2),  l = l1·e^(m1-m) + l2·e^(m2-m)
 *
 * Conventions for the edge cases, shared by both: -inf entries get weight 0;
 * a row whose entries are all -inf (or empty) is fully masked: y = 0, m =
 * -inf, l = 0; a row holding +inf gives its +inf entries equal weight and the
 * rest 0, with m = +inf and l = the count of +inf entries. Never NaN for
 * non-NaN input.
 */
#ifndef ATTN_SOFTMAX_H
#define ATTN_SOFTMAX_H

#include "engine.h"

#include <stddef.h>

/* Two passes: m = max x, then y = e^(x-m) / l. y may alias x; y may be
 * NULL when only the statistics are wanted. */
void attn_softmax_safe(const double *x, size_t n, double *y, double *pm, double *pl);

/* One pass for m and l (element by element through attn_softmax_merge),
 * then one for y. Same results as attn_softmax_safe up to rounding. */
void attn_softmax_online(const double *x, size_t n, double *y, double *pm, double *pl);

/* attn_softmax_merge() and attn_softmax_weight(), the merge rule and its
 * weight with the conventions above, are declared in engine.h: attn
 * infer's shards merge by them too. */

#endif
