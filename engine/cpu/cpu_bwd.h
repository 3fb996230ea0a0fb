/*
 * cpu_bwd.h — the cpu backend's backward job (cpu_bwd.c), for cpu.c.
 */
#ifndef ATTN_CPU_BWD_H
#define ATTN_CPU_BWD_H

#include "backend.h"
#include "flash.h"

/* Queues a validated backward job on the pool with kernel isa; the job
 * completes through attn__job_complete(). On error nothing is queued. */
int attn__cpu_bwd_submit(attn_pool *pool, const attn__flash_isa *isa, attn_job *job,
                         attn_status *st);

/* Key chunks per (batch, KV head), each of *pchunk_blocks key blocks: a
 * function of the shape only (never of the thread count), so that dQ's
 * partials sum in the same order on any pool. The job holds one F32 copy
 * of dQ per chunk. */
int64_t attn__cpu_bwd_chunks(const attn_request *r, int64_t *pchunk_blocks);

#endif
