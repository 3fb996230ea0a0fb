/*
 * test_pool.c — the engine's worker pool (engine/pool.c): every item of
 * every task runs once and each task finishes once, and queued tasks take
 * turns, so a one-item task behind a long one runs before the long one
 * ends. Order is checked by the sequence of events, never by time.
 */
#include "pool.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

typedef struct rec {
  attn_pool_task t;
  atomic_int *seq;     /* the order items ran in, shared */
  int *order;          /* per item: its place in that order */
  atomic_int finished; /* finish() calls */
  atomic_int ran;
  /* item 0 waits until the gate opens */
  pthread_mutex_t *mu;
  pthread_cond_t *cv;
  bool *open, *started;
} rec;

static void run_item(attn_pool_task *t, int64_t item, void *ws) {
  (void)ws;
  rec *r = (rec *)t;
  if (item == 0 && r->mu) {
    pthread_mutex_lock(r->mu);
    *r->started = true;
    pthread_cond_broadcast(r->cv);
    while (!*r->open)
      pthread_cond_wait(r->cv, r->mu);
    pthread_mutex_unlock(r->mu);
  }
  r->order[item] = atomic_fetch_add(r->seq, 1);
  atomic_fetch_add(&r->ran, 1);
}

static void finish_task(attn_pool_task *t) { atomic_fetch_add(&((rec *)t)->finished, 1); }

static void rec_init(rec *r, int64_t n, atomic_int *seq) {
  *r = (rec){.t = {.nitems = n, .run = run_item, .finish = finish_task}, .seq = seq};
  r->order = calloc((size_t)n, sizeof *r->order);
}

Test(pool, a_short_task_behind_a_long_one_runs_before_it_ends) {
  attn_pool *p;
  cr_assert_eq(attn_pool_open(1, 0, &p), 0);
  atomic_int seq = 0;
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
  bool open = false, started = false;
  rec lng, shrt;
  rec_init(&lng, 100, &seq);
  rec_init(&shrt, 1, &seq);
  lng.mu = &mu, lng.cv = &cv, lng.open = &open, lng.started = &started;
  attn_pool_submit(p, &lng.t);
  pthread_mutex_lock(&mu);
  while (!started) /* the long task holds the only worker */
    pthread_cond_wait(&cv, &mu);
  pthread_mutex_unlock(&mu);
  attn_pool_submit(p, &shrt.t);
  pthread_mutex_lock(&mu);
  open = true;
  pthread_cond_broadcast(&cv);
  pthread_mutex_unlock(&mu);
  attn_pool_close(p); /* drains both */
  cr_expect_eq(atomic_load(&lng.ran), 100);
  cr_expect_eq(atomic_load(&shrt.ran), 1);
  cr_expect_lt(shrt.order[0], 3, "the short task ran as item %d of 101, after the long one",
               shrt.order[0]);
  cr_expect_eq(atomic_load(&lng.finished), 1);
  cr_expect_eq(atomic_load(&shrt.finished), 1);
  free(lng.order);
  free(shrt.order);
}

Test(pool, every_item_runs_once_and_every_task_finishes_once) {
  attn_pool *p;
  cr_assert_eq(attn_pool_open(3, 64, &p), 0);
  enum { T = 40 };
  atomic_int seq = 0;
  rec r[T];
  for (int i = 0; i < T; i++)
    rec_init(&r[i], 1 + (i * 7) % 23, &seq);
  for (int i = 0; i < T; i++)
    attn_pool_submit(p, &r[i].t);
  attn_pool_close(p);
  int total = 0;
  for (int i = 0; i < T; i++) {
    cr_expect_eq(atomic_load(&r[i].ran), r[i].t.nitems, "task %d", i);
    cr_expect_eq(atomic_load(&r[i].finished), 1, "task %d", i);
    total += (int)r[i].t.nitems;
    free(r[i].order);
  }
  cr_expect_eq(atomic_load(&seq), total);
}

static pthread_t here_thread;
static atomic_int here_items_elsewhere;
static void run_here_item(attn_pool_task *t, int64_t item, void *ws) {
  cr_assert_not_null(ws, "a caller gets a workspace too");
  if (!pthread_equal(pthread_self(), here_thread))
    atomic_fetch_add(&here_items_elsewhere, 1);
  run_item(t, item, ws);
}

Test(pool, run_here_computes_on_the_caller_while_the_workers_are_busy) {
  attn_pool *p;
  cr_assert_eq(attn_pool_open(1, 256, &p), 0);
  atomic_int seq = 0;
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
  bool open = false, started = false;
  rec lng, here;
  rec_init(&lng, 10, &seq);
  lng.mu = &mu, lng.cv = &cv, lng.open = &open, lng.started = &started;
  attn_pool_submit(p, &lng.t);
  pthread_mutex_lock(&mu);
  while (!started) /* the only worker is held */
    pthread_cond_wait(&cv, &mu);
  pthread_mutex_unlock(&mu);
  here_thread = pthread_self();
  for (int round = 0; round < 2; round++) { /* the second borrows the first's workspace */
    rec_init(&here, 7, &seq);
    here.t.run = run_here_item;
    attn_pool_run_here(p, &here.t);
    cr_expect_eq(atomic_load(&here.ran), 7, "every item ran before run_here returned");
    cr_expect_eq(atomic_load(&here.finished), 1, "finish() ran once, before it returned");
    free(here.order);
  }
  cr_expect_eq(atomic_load(&here_items_elsewhere), 0, "an item ran on a worker");
  pthread_mutex_lock(&mu);
  open = true;
  pthread_cond_broadcast(&cv);
  pthread_mutex_unlock(&mu);
  attn_pool_close(p);
  cr_expect_eq(atomic_load(&lng.ran), 10);
  free(lng.order);
}
