/*
 * pool.h — the one worker pool of an engine.
 *
 * Every CPU-side backend (cpu, reference) splits a job into independent
 * items and submits it as a task. Workers take items from the queued tasks
 * in turn (round-robin: one item of each, in the order they came), so
 * concurrent requests share one set of threads sized to the cores instead
 * of oversubscribing them, and a small job behind a long one starts at
 * once rather than after it; a task's last items overlap with the first
 * items of the next one. Each worker owns a scratch area (its workspace) whose
 * size is fixed when the pool opens: per-thread memory never grows with the
 * problem.
 *
 * finish() runs once per submission, on the worker that completed the last
 * item; it may free the task or submit it again (the next phase of a job).
 */
#ifndef ATTN_POOL_H
#define ATTN_POOL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

typedef struct attn_pool attn_pool;
typedef struct attn_pool_task attn_pool_task;

struct attn_pool_task {
  int64_t nitems; /* >= 1 */
  void (*run)(attn_pool_task *t, int64_t item, void *workspace);
  void (*finish)(attn_pool_task *t);
  /* private to the pool */
  int64_t next;
  atomic_int_fast64_t done;
  attn_pool_task *qnext;
};

/* threads >= 1; workspace_bytes per worker, 64-byte aligned. Returns 0 or
 * ATTN_ENOMEM. */
int attn_pool_open(int threads, size_t workspace_bytes, attn_pool **pp);
/* Lets the workers finish every queued task, then joins them. */
void attn_pool_close(attn_pool *p);
void attn_pool_submit(attn_pool *p, attn_pool_task *t);
/* Runs every item of t on the calling thread, then finish(), before it
 * returns: a job too small to be worth waking a worker for. The caller
 * borrows a workspace of the pool's size (made on first use, kept until
 * close); without memory for one, t is submitted instead. */
void attn_pool_run_here(attn_pool *p, attn_pool_task *t);
int attn_pool_threads(const attn_pool *p);

/* CPUs this process may run on (its affinity), at least 1: the threads a
 * pool gets when none are asked for. */
int attn_pool_cores(void);

#endif
