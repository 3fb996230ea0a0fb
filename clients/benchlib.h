/*
 * benchlib.h — what `attn bench` and the OpenBLAS comparison share: random
 * inputs for a shape, and timing of engine runs. (Request bodies of these
 * inputs come from proto's request encoders, attn_proto_encode_request_*.)
 */
#ifndef TOOL_BENCHLIB_H
#define TOOL_BENCHLIB_H

#include "engine.h"

typedef struct tool_bench_case {
  attn_request req;
  void *mem;  /* q, k, v, o in one allocation */
  void *bmem; /* a backward case's do, dq, dk, dv and lse, or NULL */
} tool_bench_case;

/* Q [B,H,N,D], K and V [B,Hkv,Nkv,D] uniform in [-1, 1) from seed; O
 * allocated. Returns 0 or ATTN_ENOMEM. */
int tool_bench_case_init(tool_bench_case *c, int64_t batch, int64_t heads, int64_t heads_kv,
                         int64_t seq_q, int64_t seq_kv, int64_t head_dim, attn_dtype dt,
                         bool causal, uint64_t seed);
void tool_bench_case_free(tool_bench_case *c);

/* Makes c a backward case: dO uniform in [-1, 1) from seed, O and lse_in
 * from a forward run on e (backend cpu), dq, dk, dv allocated; the request
 * becomes pass = ATTN_BACKWARD with lse_in given, as a training step that
 * kept the forward's lse runs it. Returns 0 or an error (st says why). */
int tool_bench_case_backward(tool_bench_case *c, attn_engine *e, uint64_t seed, attn_status *st);

/* An engine with `threads` workers (0: cores) and CPU kernel isa (NULL:
 * best), or NULL with st filled. */
attn_engine *tool_bench_open(int threads, const char *isa, const char *tune, attn_status *st);

/* Monotonic seconds. */
double tool_bench_now(void);

/* Runs r once to warm up, then reps times; the median seconds per run, or a
 * negative error code (st says why). */
double tool_bench_engine(attn_engine *e, const attn_request *r, int reps, attn_status *st);

/* Median of n values (sorts v). */
double tool_bench_median(double *v, int n);

#endif
