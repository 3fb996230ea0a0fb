/*
 * bench_sessions.h — bench-gpu --sessions: a session's decode step through
 * the engine's store, its pages on the device (bench_sessions.c).
 */
#ifndef ATTN_BENCH_SESSIONS_H
#define ATTN_BENCH_SESSIONS_H

#include <stdint.h>

/* The shape: one session of SES_HQ query heads over SES_HKV KV heads,
 * head dim SES_D, BF16, SES_TOKENS cached before the timed steps. */
#define SES_HQ 32
#define SES_HKV 8
#define SES_D 128
#define SES_TOKENS 32768

/* Times reps decode steps (one token appended and attended, the call
 * submitted and waited for: one upload, which carries the new token's
 * rows, and one download) after two warm-up ones: best and median ms;
 * and, in *rows_ms (median), the same new rows written as the store wrote
 * them before its jobs carried them: one synchronous copy per KV head, K
 * and V, which a step then cost on top of its job. 0, or -1 with a
 * message on stderr (the store is not on the device, a call failed). */
int bench_sessions(int reps, double *best_ms, double *med_ms, double *rows_ms);

#endif
