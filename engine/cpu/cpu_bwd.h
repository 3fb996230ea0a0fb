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

#endif
