/*
 * pool.c — a fixed set of pthreads draining a queue of tasks item by item,
 * taking turns between the tasks queued.
 *
 * Items are claimed under one mutex. Items are coarse (a query tile of a
 * head: tens of microseconds at least), so the lock is not contended enough
 * to matter and keeps the scheduling obvious.
 */
#define _GNU_SOURCE
#include "pool.h"
#include "engine.h"

#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct worker {
  pthread_t tid;
  attn_pool *pool;
  void *workspace;
} worker;

struct attn_pool {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  attn_pool_task *head, *tail;
  int stopping;
  int nthreads;
  worker *workers;
  size_t ws_bytes;
  /* Workspaces lent to callers of attn_pool_run_here; an idle one holds
   * the next in its first bytes. */
  void *spare;
};

/*
 * After an item of t (the head) is claimed: t leaves the queue once every
 * item is claimed, else it goes behind the others, so that the next item
 * claimed is another task's. A job of a few items submitted behind one of
 * thousands then starts at once instead of after the whole of it: one
 * client's long job cannot hold every worker while another's waits.
 * Under the lock.
 */
static void take_turn(attn_pool *p, attn_pool_task *t) {
  bool done = t->next == t->nitems;
  if (!done && !t->qnext)
    return; /* alone in the queue */
  p->head = t->qnext;
  if (!p->head)
    p->tail = NULL;
  if (done)
    return;
  t->qnext = NULL;
  if (p->tail)
    p->tail->qnext = t;
  else
    p->head = t;
  p->tail = t;
}

static void *worker_main(void *arg) {
  worker *w = arg;
  attn_pool *p = w->pool;
  for (;;) {
    pthread_mutex_lock(&p->mu);
    while (!p->head && !p->stopping)
      pthread_cond_wait(&p->cv, &p->mu);
    attn_pool_task *t = p->head;
    if (!t) { /* stopping and drained */
      pthread_mutex_unlock(&p->mu);
      return NULL;
    }
    int64_t item = t->next++;
    take_turn(p, t);
    pthread_mutex_unlock(&p->mu);

    /* Read the count before counting this item done: once the last item
     * is counted, finish() may free t or resubmit it with another count. */
    const int64_t nitems = t->nitems;
    t->run(t, item, w->workspace);
    if (atomic_fetch_add(&t->done, 1) + 1 == nitems)
      t->finish(t);
  }
}

int attn_pool_open(int threads, size_t workspace_bytes, attn_pool **pp) {
  attn_pool *p = calloc(1, sizeof *p);
  if (!p)
    return ATTN_ENOMEM;
  if (threads < 1)
    threads = 1;
  p->workers = calloc((size_t)threads, sizeof *p->workers);
  if (!p->workers) {
    free(p);
    return ATTN_ENOMEM;
  }
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cv, NULL);
  size_t ws = (workspace_bytes + 63) / 64 * 64;
  /* room for the spare list's link */
  ws = ws < sizeof(void *) ? 64 : ws;
  p->ws_bytes = ws;
  for (int i = 0; i < threads; i++) {
    worker *w = &p->workers[i];
    w->pool = p;
    w->workspace = aligned_alloc(64, ws);
    if (!w->workspace || pthread_create(&w->tid, NULL, worker_main, w)) {
      free(w->workspace);
      p->nthreads = i;
      attn_pool_close(p);
      return ATTN_ENOMEM;
    }
  }
  p->nthreads = threads;
  *pp = p;
  return 0;
}

void attn_pool_close(attn_pool *p) {
  if (!p)
    return;
  pthread_mutex_lock(&p->mu);
  p->stopping = 1;
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
  for (int i = 0; i < p->nthreads; i++) {
    pthread_join(p->workers[i].tid, NULL);
    free(p->workers[i].workspace);
  }
  while (p->spare) {
    void *next = *(void **)p->spare;
    free(p->spare);
    p->spare = next;
  }
  pthread_cond_destroy(&p->cv);
  pthread_mutex_destroy(&p->mu);
  free(p->workers);
  free(p);
}

void attn_pool_submit(attn_pool *p, attn_pool_task *t) {
  t->next = 0;
  atomic_store(&t->done, 0);
  t->qnext = NULL;
  pthread_mutex_lock(&p->mu);
  if (p->tail)
    p->tail->qnext = t;
  else
    p->head = t;
  p->tail = t;
  /* One item per worker is the most that can start now. */
  if (t->nitems == 1)
    pthread_cond_signal(&p->cv);
  else
    pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
}

/* A workspace for a caller: an idle one, else a new one; NULL out of
 * memory. */
static void *borrow(attn_pool *p) {
  pthread_mutex_lock(&p->mu);
  void *ws = p->spare;
  if (ws)
    p->spare = *(void **)ws;
  pthread_mutex_unlock(&p->mu);
  return ws ? ws : aligned_alloc(64, p->ws_bytes);
}

static void give_back(attn_pool *p, void *ws) {
  pthread_mutex_lock(&p->mu);
  *(void **)ws = p->spare;
  p->spare = ws;
  pthread_mutex_unlock(&p->mu);
}

void attn_pool_run_here(attn_pool *p, attn_pool_task *t) {
  void *ws = borrow(p);
  if (!ws) {
    attn_pool_submit(p, t);
    return;
  }
  const int64_t nitems = t->nitems;
  t->next = nitems;
  t->qnext = NULL;
  for (int64_t i = 0; i < nitems; i++)
    t->run(t, i, ws);
  atomic_store(&t->done, nitems);
  give_back(p, ws);
  /* last: it may free t, or submit its next phase to the workers */
  t->finish(t);
}

int attn_pool_threads(const attn_pool *p) { return p->nthreads; }

int attn_pool_cores(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
    return CPU_COUNT(&set);
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}
