/*
 * sinks.h — attention sinks (engine.h's attn_request.sinks) on the CUDA
 * backend, as two small kernels around the attention kernels, which never
 * see a sink.
 *
 * A sink is one more key of logit t = sinks[h] and a zero value, so it adds
 * e^(t − m) to a row's sum and nothing to its output: folding it in after
 * the forward is exact. From a row's lse over its real keys (−inf when it
 * saw none), lse' = logaddexp(lse, t), O' = O · e^(lse − lse'), and the
 * contract's m' = max(m, t), l' = l e^(m − m') + e^(t − m'); a row that saw
 * no key ends with O = 0, m = lse = t, l = 1. attn_cu_sink_fold() does that
 * to every row after a forward launch (and its split-KV merge, which the
 * launch includes), so every forward path (packed, paged, decode, Hopper)
 * takes sinks the same way; the forward must write lse (the backend gives
 * it scratch when the caller did not ask for lse).
 *
 * The backward needs no change of its own: P = e^(s − lse') is the
 * softmax with the sink when its lse is lse', and D = dO·O is the same sum
 * (the sink's value is zero). Only the sinks' gradient is new:
 * dsinks[h] = −Σ e^(t − lse'ᵢ) Dᵢ over the head's rows of every batch
 * entry, which attn_cu_sink_grad() reduces in a fixed order (one block per
 * head, no atomics), so it repeats bit for bit.
 *
 * The per-row arithmetic is attn_cu_sink_row(), compiled for the device
 * and the host alike, so the unit tests run exactly the kernel's math.
 */
#ifndef ATTN_CUDA_SINKS_H
#define ATTN_CUDA_SINKS_H

#include "kernels.h"
#include "layout.h"

/* A row's statistics with its sink folded in, and the factor its O is
 * multiplied by. */
typedef struct attn_cu_sink_stats {
  float m, l, lse;
  float o_scale;
} attn_cu_sink_stats;

/*
 * Row arithmetic: t the sink, m, l and lse the kernel's statistics of the
 * row's real keys in natural-log units (a row that saw none: −inf, 0,
 * −inf; m and l may be those placeholders when the launch did not write
 * them, their results then being unused). logaddexp by the larger operand
 * plus log1p of the smaller's weight, so a sink far below the scores (−1e30)
 * leaves lse as it was and one far above gives lse' = t to F32 precision.
 */
ATTN_HD attn_cu_sink_stats attn_cu_sink_row(float t, float m, float l, float lse) {
  attn_cu_sink_stats r;
  const float hi = lse > t ? lse : t, lo = lse > t ? t : lse;
  r.lse = hi + log1pf(expf(lo - hi)); /* lo = −inf: e^−inf = 0, lse' = t */
  r.o_scale = lse == -INFINITY ? 0.0f : expf(lse - r.lse);
  r.m = m > t ? m : t;
  r.l = (l > 0.0f ? l * expf(m - r.m) : 0.0f) + expf(t - r.m);
  return r;
}

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Folds the sinks into a forward launch's outputs, on stream (after that
 * launch): for each row of p's packed [B, Hq, Nq] rows, p->lse (required)
 * and p->m, p->l (each when set; l only with m, which l' depends on)
 * become the statistics with the sink, and O (p->o in p->dtype, rows of
 * p->dp; NULL: no O to fix, as for the backward's recomputed lse) is
 * rescaled. sinks is device F32 [heads_q]:
 * the sink of each of p's query heads, row r's being sinks[r / seq_q %
 * heads_q] (a launch on some heads of a larger problem passes a pointer at
 * its first head's). Returns a cudaError_t (cudaErrorInvalidValue without
 * launching for a NULL lse or sinks, or l without m).
 */
int attn_cu_sink_fold(const attn_cu_params *p, const float *sinks, void *stream);

/*
 * dsinks, device F32 [heads_q], from a backward launch's p->lse (the lse
 * with the sinks) and the D = dO·O its preprocess left in p->bwd_ws
 * (kernels.h), on stream after that launch: dsinks[h] = −Σ e^(sinks[h] −
 * lseᵢ) Dᵢ over rows i of head h in every batch entry, rows with D = 0 (O =
 * 0: no key seen) adding nothing whatever their lse; accumulated in double,
 * in a fixed order. Returns a cudaError_t (cudaErrorInvalidValue without
 * launching for a NULL pointer).
 */
int attn_cu_sink_grad(const attn_cu_params *p, const float *sinks, float *dsinks, void *stream);

#ifdef __cplusplus
}
#endif
#endif
