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
 * submitted and waited for) after two warm-up ones: best and median ms.
 * 0, or -1 with a message on stderr (the store is not on the device, a
 * call failed). */
int bench_sessions(int reps, double *best_ms, double *med_ms);

#endif
