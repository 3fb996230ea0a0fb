/*
 * selfcheck.h — the cpu backend's start-up self-check of a kernel (the amx one).
 *
 * Internal to engine/cpu/. A few small BF16 problems — head_dim 64 and 128,
 * 80 queries over 150 keys, causal and not, a GQA group — each run through
 * the kernel under check by the caller's run() (cpu.c sends them through
 * the backend's own items, splits and merges) and compared with the float64
 * reference at the unit tests' thresholds: normalized O error 8e-3 (BF16),
 * lse within 1e-5 relative. It is there to catch a kernel that is wrong on
 * this unit (a layout or index the emulation cannot see, a microcode or
 * hardware fault), not rounding. Costs tens of milliseconds, once per engine.
 */
#ifndef ATTN_CPU_SELFCHECK_H
#define ATTN_CPU_SELFCHECK_H

#include "engine.h"

/* Runs the validated request r (strides filled, outputs o and lse) on the
 * kernel under check and waits for it; 0 or the run's error. */
typedef int (*attn__cpu_check_run)(void *ctx, const attn_request *r, attn_status *st);

/*
 * Whether every case matches the reference; when not, false and why, in
 * cap bytes: the case's shape and the error that failed it, or the error
 * that stopped it (out of memory included: a kernel that was not checked
 * is not trusted). fault is for the tests that force a failure: the first
 * case's output is negated before it is compared, as a wrong kernel's
 * would be.
 */
bool attn__cpu_self_check(attn__cpu_check_run run, void *ctx, bool fault, char *why, size_t cap);

#endif
