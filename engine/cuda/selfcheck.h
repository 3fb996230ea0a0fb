/*
 * selfcheck.h — the cases of the CUDA backend's start-up self-check.
 *
 * Small, awkward problems that together reach every kernel instance the
 * selection (attn_cu_select) can choose: each head-dim instance of the
 * forward and the backward pass, F16, BF16 and F32, GQA, causal and
 * windowed masks, and a decode row long enough to take the split-KV path
 * and its merge. Each case comes with its inputs and its float64 answer;
 * the backend (cuda.c) runs it on a device and asks whether the outputs
 * match. Host code only, no CUDA call. A few more cases carry sinks
 * (sinks.h), forward and backward, apart from these (their failure turns
 * sinks off, not a kernel).
 */
#ifndef ATTN_CUDA_SELFCHECK_H
#define ATTN_CUDA_SELFCHECK_H

#include "engine.h"

/* The most query rows (heads_q x seq_q) and query heads of a case. */
#define ATTN_CU_CHECK_ROWS 512
#define ATTN_CU_CHECK_HEADS 32

typedef struct attn_cu_check {
  attn_request req; /* contiguous tensors; outputs written by the device */
  void *buf;        /* every tensor of req, one allocation */
  double *ref;      /* the float64 answer: o (+ lse), or dq dk dv */
  /* the forward's lse (a backward case's lse_in, or stats) */
  float lse[ATTN_CU_CHECK_ROWS];
  float slopes[ATTN_CU_CHECK_HEADS]; /* the ALiBi slopes of a case with them */
  float sinks[ATTN_CU_CHECK_HEADS], dsinks[ATTN_CU_CHECK_HEADS]; /* a sinks case's */
  bool atomic; /* a backward case of the atomic dQ path (attn_cu_check_is_atomic) */
} attn_cu_check;

/* How many cases there are. */
int attn_cu_check_count(void);

/* Whether case i is one of the Hopper instance's (run with that instance
 * allowed, and passed only when the selection reached it). */
bool attn_cu_check_is_hopper(int i);

/* Whether case i is a backward case run on the atomic dQ path (kernels.h):
 * every backward shape once more, after the others, so a wrong atomic path
 * is laid at its own door and the two-kernel path stays on. */
bool attn_cu_check_is_atomic(int i);

/* Case i with its inputs and reference; 0 or an error (out of memory). */
int attn_cu_check_make(int i, attn_cu_check *c, attn_status *st);

/* The sinks cases: the fold after a forward (tiled with rows that see no
 * key, split-KV, the decode kernel, F32), and a backward whose lse the
 * device recomputes and folds, with dsinks; made as attn_cu_check_make
 * makes a case, with sinks, their reference (dsinks's too) by the
 * definition. */
int attn_cu_check_sinks_count(void);
int attn_cu_check_sinks_make(int i, attn_cu_check *c, attn_status *st);

/* Whether the device's outputs match the reference within the dtype's
 * tolerance; when not, why (the tensor and its normalized error). */
bool attn_cu_check_verify(const attn_cu_check *c, char *why, size_t cap);

void attn_cu_check_free(attn_cu_check *c);

#endif
