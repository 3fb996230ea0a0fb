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

/* A gate that holds item 0 of a task, and so the worker running it. */
typedef struct gate {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool open, started;
} gate;

/* Submits lng (n items) with its item 0 held at g, and waits until the
 * worker holds it. */
static void hold_worker(attn_pool *p, rec *lng, int64_t n, atomic_int *seq, gate *g) {
  *g = (gate){.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
  rec_init(lng, n, seq);
  lng->mu = &g->mu, lng->cv = &g->cv, lng->open = &g->open, lng->started = &g->started;
  attn_pool_submit(p, &lng->t);
  pthread_mutex_lock(&g->mu);
  while (!g->started)
    pthread_cond_wait(&g->cv, &g->mu);
  pthread_mutex_unlock(&g->mu);
}

static void release(gate *g) {
  pthread_mutex_lock(&g->mu);
  g->open = true;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
}

Test(pool, a_short_task_behind_a_long_one_runs_before_it_ends) {
  attn_pool *p;
  cr_assert_eq(attn_pool_open(1, 0, &p), 0);
  atomic_int seq = 0;
  gate g;
  rec lng, shrt;
  hold_worker(p, &lng, 100, &seq, &g); /* the long task holds the only worker */
  rec_init(&shrt, 1, &seq);
  attn_pool_submit(p, &shrt.t);
  release(&g);
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
  gate g;
  rec lng, here;
  hold_worker(p, &lng, 10, &seq, &g); /* the only worker is held */
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
  release(&g);
  attn_pool_close(p);
  cr_expect_eq(atomic_load(&lng.ran), 10);
  free(lng.order);
}
