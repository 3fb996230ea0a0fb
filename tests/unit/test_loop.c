/*
 * test_loop.c — the scheduler (server/loop.c, deadline.c, request.c) on a
 * fake transport and the real CPU engine, without libmicrohttpd or a
 * socket: admission and queue_full, dispatch in FIFO order behind
 * max_running, fair shares of the slots among client addresses
 * (--max-running-per-client, round-robin), --max-pairs, the deadline and
 * client-reset cancels, and completion.
 *
 * The fake transport records each resume (the loop's "reply is ready");
 * a request whose fd is FAKE_RESET_FD is a client that reset. A test that
 * needs a job still in the engine when it acts plugs the engine's one
 * worker (rig_hold) and moves the job's deadline once the job is there: the
 * order of events, not the machine's speed, decides what the loop sees.
 */
#define _GNU_SOURCE /* memmem */
#include "handle.h"
#include "loop.h"
#include "routes.h"

#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_JOBS = 8, FAKE_RESET_FD = 4242 };

static const char body_ok[] = "{\"q\": [[1, 0], [0, 1]], \"k\": [[1, 0], [0, 1], [1, 1]], "
                              "\"v\": [[1, 2], [3, 4], [5, 6]]}";

/* A one-item pool task that keeps the engine's only worker until opened
 * (test_pool.c's gate): jobs queued behind it are in the engine and cannot
 * end, however fast the machine computes. */
typedef struct plug {
  attn_pool_task t;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool held, open;
} plug;

typedef struct rig {
  attnd_config cfg;
  attnd_server s;
  attnd_req *resumed[MAX_JOBS];
  int nresumed;
  plug hold;
  bool holding; /* rig_hold was called: the plug is the engine's to give back */
} rig;

/* The transport's callbacks get only r or s: the rig is found from s. */
static rig *rig_of(attnd_server *s) { return (rig *)(void *)((char *)s - offsetof(rig, s)); }

static void fake_resume(attnd_req *r) {
  rig *g = rig_of(r->srv);
  cr_assert_lt(g->nresumed, MAX_JOBS, "more resumes than jobs");
  g->resumed[g->nresumed++] = r;
}
static bool fake_client_gone(attnd_req *r) { return r->fd == FAKE_RESET_FD; }
static void fake_quiesce(attnd_server *s) { (void)s; }

static const attnd_transport fake = {
    .resume = fake_resume, .client_gone = fake_client_gone, .quiesce = fake_quiesce};

/* per_client is --max-running-per-client (-1 auto, 0 no own limit),
 * max_pairs --max-pairs (0 no cap). */
static rig *rig_open_with(int max_queue, double timeout, int per_client, uint64_t max_pairs) {
  rig *g = calloc(1, sizeof *g);
  cr_assert_not_null(g);
  g->cfg.max_queue = max_queue;
  g->cfg.max_running_per_client = per_client;
  g->cfg.max_pairs = max_pairs;
  g->cfg.max_body = 1 << 20;
  g->cfg.timeout = timeout;
  g->cfg.streams = 1;
  snprintf(g->cfg.backend, sizeof g->cfg.backend, "cpu");
  g->s.cfg = &g->cfg;
  g->s.transport = &fake;
  g->s.backend = "cpu";
  g->s.backend_note = "";
  pthread_mutex_init(&g->s.log_mu, NULL);
  const char *labels[ATTND_METRICS_MAX_ROUTES];
  g->s.metrics = attnd_metrics_new(labels, attnd_route_labels(labels, ATTND_METRICS_MAX_ROUTES));
  cr_assert_not_null(g->s.metrics);
  attn_config ec;
  attn_config_init(&ec);
  ec.threads = 1;
  attn_status st;
  cr_assert_eq(attn_engine_open(&ec, &g->s.engine, &st), 0, "%s", st.message);
  cr_assert_eq(attnd_loop_init(&g->s), 0);
  return g;
}

static rig *rig_open(int max_queue, double timeout) {
  return rig_open_with(max_queue, timeout, 0, 0);
}

static void plug_run(attn_pool_task *t, int64_t item, void *ws) {
  (void)item, (void)ws;
  plug *p = (plug *)t;
  pthread_mutex_lock(&p->mu);
  p->held = true;
  pthread_cond_broadcast(&p->cv);
  while (!p->open)
    pthread_cond_wait(&p->cv, &p->mu);
  pthread_mutex_unlock(&p->mu);
}

static void plug_finish(attn_pool_task *t) { (void)t; }

/* Takes the engine's worker: returns once it waits in the plug, so every
 * job submitted from now on waits behind it until rig_release. */
static void rig_hold(rig *g) {
  attn_pool *pool = attn__engine_pool(g->s.engine);
  cr_assert_eq(attn_pool_threads(pool), 1, "a second worker would run the held jobs");
  plug *p = &g->hold;
  g->holding = true;
  p->t = (attn_pool_task){.nitems = 1, .run = plug_run, .finish = plug_finish};
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cv, NULL);
  attn_pool_submit(pool, &p->t);
  pthread_mutex_lock(&p->mu);
  while (!p->held)
    pthread_cond_wait(&p->cv, &p->mu);
  pthread_mutex_unlock(&p->mu);
}

static void rig_release(rig *g) {
  plug *p = &g->hold;
  pthread_mutex_lock(&p->mu);
  p->open = true;
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
}

static void rig_close(rig *g) {
  if (g->holding)
    rig_release(g); /* the engine's close waits for its jobs, and they for the plug */
  attnd_loop_close(&g->s);
  attn_engine_close(g->s.engine);
  if (g->holding) {
    pthread_mutex_destroy(&g->hold.mu);
    pthread_cond_destroy(&g->hold.cv);
  }
  attnd_metrics_free(g->s.metrics);
  pthread_mutex_destroy(&g->s.log_mu);
  free(g);
}

/* A complete POST /attention, as the HTTP front hands it over. */
static attnd_req *job(rig *g, const char *body) {
  attnd_req *r = attnd_req_new(&g->s);
  cr_assert_not_null(r);
  snprintf(r->method, sizeof r->method, "POST");
  snprintf(r->path, sizeof r->path, "/attention");
  r->route = attnd_route_find("/attention", NULL, NULL);
  r->json_in = true;
  r->query = strdup("");
  r->len = r->cap = strlen(body);
  r->body = malloc(r->cap);
  memcpy(r->body, body, r->len);
  cr_assert(attnd_body_reserve(r, r->cap));
  return r;
}

/* The same from the client address addr. */
static attnd_req *job_of(rig *g, const char *body, const char *addr) {
  attnd_req *r = job(g, body);
  snprintf(r->client, sizeof r->client, "%s", addr);
  return r;
}

/* Runs the loop until n requests were resumed and no job is left. */
static void run_until(rig *g, int n) {
  double end = attn_now() + 20;
  while ((g->nresumed < n || g->s.admitted > 0) && attn_now() < end)
    uv_run(&g->s.loop, UV_RUN_ONCE);
  cr_assert_eq(g->nresumed, n, "%d of %d requests resumed", g->nresumed, n);
  cr_assert_eq(g->s.admitted, 0);
  cr_assert_eq(g->s.running, 0);
}

/* Runs the loop until n requests were resumed, whatever is still running. */
static void run_until_answered(rig *g, int n) {
  double end = attn_now() + 20;
  while (g->nresumed < n && attn_now() < end)
    uv_run(&g->s.loop, UV_RUN_ONCE);
  cr_assert_eq(g->nresumed, n, "%d of %d requests resumed", g->nresumed, n);
}

/* Runs the loop until r's job is in the engine as the loop sees it: its
 * submit's callback has run (stages_left is the loop's own, so no other
 * thread's write is read early). The tick (ATTND_POLL_MS) wakes the loop. */
static void run_until_in_engine(rig *g, attnd_req *r) {
  double end = attn_now() + 20;
  while (r->stages_left != 1 && !r->answered && attn_now() < end)
    uv_run(&g->s.loop, UV_RUN_ONCE);
  cr_assert_eq(r->stages_left, 1, "the job never reached the engine (status %d)", r->status);
  cr_assert(r->in_engine);
}

/* Puts r's deadline behind it; the loop's next tick finds it due. */
static void expire(rig *g, attnd_req *r) { r->t_received = attn_now() - g->cfg.timeout - 1; }

static bool body_has(const attnd_req *r, const char *s) {
  return r->resp && memmem(r->resp, r->resp_len, s, strlen(s)) != NULL;
}

static bool metrics_has(rig *g, const char *line) {
  char *out = attnd_metrics_render(g->s.metrics, NULL);
  bool has = out && strstr(out, line);
  free(out);
  return has;
}

Test(loop, jobs_complete_in_fifo_order_behind_max_running) {
  rig *g = rig_open(8, 30);
  cr_assert_eq(g->s.max_running, 2);
  attnd_req *r[3];
  for (int i = 0; i < 3; i++) {
    r[i] = job(g, body_ok);
    attnd_loop_submit(&g->s, r[i]);
  }
  run_until(g, 3);
  for (int i = 0; i < 3; i++) {
    cr_expect_eq(r[i]->status, 200, "job %d: %d", i, r[i]->status);
    cr_expect_str_eq(r[i]->ctype, "application/json");
    cr_expect(body_has(r[i], "\"shape\""), "job %d's reply has no tensor", i);
    cr_expect(r[i]->answered && r[i]->dispatched);
  }
  /* FIFO: started in order, and the third only once a slot freed. */
  cr_expect_leq(r[0]->t_started, r[1]->t_started);
  cr_expect_leq(r[1]->t_started, r[2]->t_started);
  cr_expect_geq(r[2]->t_started, fmin(r[0]->t_done, r[1]->t_done));
  for (int i = 0; i < 3; i++)
    attnd_req_unref(r[i]);
  cr_expect_eq(atomic_load(&g->s.body_bytes), 0, "the body budget was given back");
  rig_close(g);
}

Test(loop, past_max_queue_is_queue_full_with_retry_after) {
  rig *g = rig_open(2, 30);
  attnd_req *r[3];
  for (int i = 0; i < 3; i++) {
    r[i] = job(g, body_ok);
    attnd_loop_submit(&g->s, r[i]);
  }
  run_until(g, 3);
  cr_expect_eq(g->resumed[0], r[2], "the refused job is answered first");
  cr_expect_eq(r[2]->status, 503);
  cr_expect(r[2]->retry_after);
  cr_expect(body_has(r[2], "\"queue_full\""));
  cr_expect_eq(r[0]->status, 200);
  cr_expect_eq(r[1]->status, 200);
  cr_expect(metrics_has(g, "attnd_errors_total{code=\"queue_full\"} 1\n"));
  for (int i = 0; i < 3; i++)
    attnd_req_unref(r[i]);
  rig_close(g);
}

Test(loop, a_job_past_its_deadline_is_504_and_never_runs) {
  rig *g = rig_open(8, 0.5);
  attnd_req *r = job(g, body_ok);
  r->t_received = attn_now() - 1; /* its headers came a second ago */
  attnd_loop_submit(&g->s, r);
  run_until(g, 1);
  cr_expect_eq(r->status, 504);
  cr_expect(body_has(r, "\"timeout\""));
  cr_expect_not(r->dispatched);
  cr_expect(r->canceled);
  cr_expect(metrics_has(g, "attnd_jobs_canceled_total{reason=\"timeout\",stage=\"queued\"} 1\n"));
  cr_expect(metrics_has(g, "attnd_errors_total{code=\"timeout\"} 1\n"));
  attnd_req_unref(r);
  rig_close(g);
}

Test(loop, a_client_that_reset_is_closed_unanswered) {
  rig *g = rig_open(8, 30);
  attnd_req *r = job(g, body_ok);
  r->fd = FAKE_RESET_FD;
  attnd_loop_submit(&g->s, r);
  run_until(g, 1);
  cr_expect(r->gone, "the connection is to be closed");
  cr_expect_null(r->resp, "no reply for a client that is gone");
  cr_expect(metrics_has(g, "attnd_errors_total{code=\"client_closed\"} 1\n"));
  cr_expect(
      metrics_has(g, "attnd_jobs_canceled_total{reason=\"client_closed\",stage=\"queued\"} 1\n"));
  attnd_req_unref(r);
  rig_close(g);
}

Test(loop, a_job_that_fails_to_decode_gets_its_codec_error) {
  rig *g = rig_open(8, 30);
  attnd_req *r = job(g, "{\"q\": [[1, 0]");
  attnd_loop_submit(&g->s, r);
  run_until(g, 1);
  cr_expect_eq(r->status, 400);
  cr_expect(body_has(r, "\"malformed_json\""));
  cr_expect(metrics_has(g, "attnd_errors_total{code=\"malformed_json\"} 1\n"));
  attnd_req_unref(r);
  rig_close(g);
}

/* A job in the engine when its deadline passes is answered 504 at once;
 * its slot is given back only when the engine ends the job (canceled, so
 * it computes nothing). The plug keeps it in the engine until then. */
Test(loop, a_running_job_past_its_deadline_is_answered_and_its_end_awaited) {
  rig *g = rig_open(8, 30);
  rig_hold(g);
  attnd_req *r = job(g, body_ok);
  attnd_loop_submit(&g->s, r);
  run_until_in_engine(g, r);
  expire(g, r);
  run_until_answered(g, 1);
  cr_expect_eq(r->status, 504);
  cr_expect(body_has(r, "running"), "the 504 says where it was: %.*s", (int)r->resp_len, r->resp);
  cr_expect(r->canceled);
  cr_expect(r->dispatched, "it had started");
  cr_expect_eq(g->s.running, 1, "the slot was given back before the job ended");
  cr_expect_eq(g->s.admitted, 1);
  rig_release(g);
  run_until(g, 1);
  cr_expect(metrics_has(g, "attnd_jobs_canceled_total{reason=\"timeout\",stage=\"running\"} 1\n"),
            "the engine did not stop the job");
  attnd_req_unref(r);
  rig_close(g);
}

/* ---- fair shares of the running slots ----------------------------------- */

/* Client A submits three jobs, then client B one; all are run to their
 * end and answered 200. */
static void three_jobs_of_a_then_one_of_b(rig *g, attnd_req *a[3], attnd_req **b) {
  for (int i = 0; i < 3; i++) {
    a[i] = job_of(g, body_ok, "10.0.0.1");
    attnd_loop_submit(&g->s, a[i]);
  }
  *b = job_of(g, body_ok, "10.0.0.2");
  attnd_loop_submit(&g->s, *b);
  run_until(g, 4);
  for (int i = 0; i < 3; i++)
    cr_expect_eq(a[i]->status, 200, "A's job %d: %d", i, a[i]->status);
  cr_expect_eq((*b)->status, 200);
}

/* Round-robin across client addresses: a freed slot goes to the client
 * running the fewest jobs, even with no per-client cap, so B's one job does
 * not wait behind A's queue. */
Test(loop, a_free_slot_goes_to_the_client_running_fewest) {
  rig *g = rig_open_with(8, 30, 0, 0);
  attnd_req *a[3], *b;
  three_jobs_of_a_then_one_of_b(g, a, &b);
  /* A's first job took one slot, B's the other; A's second waited for one. */
  cr_expect_lt(b->t_started, a[1]->t_started, "B's job started after A's second");
  cr_expect_geq(a[1]->t_started, fmin(a[0]->t_done, b->t_done));
  for (int i = 0; i < 3; i++)
    attnd_req_unref(a[i]);
  attnd_req_unref(b);
  rig_close(g);
}

/* --max-running-per-client auto on two slots: one each. A's jobs run one at
 * a time in their order (FIFO within a client), and B's job takes the
 * other slot at once instead of queueing behind them. */
Test(loop, a_client_at_its_cap_waits_while_another_runs) {
  rig *g = rig_open_with(8, 30, -1, 0);
  cr_assert_eq(g->s.max_running, 2);
  cr_assert_eq(g->s.client_cap, 1, "auto leaves one of the two slots to others");
  attnd_req *a[3], *b;
  three_jobs_of_a_then_one_of_b(g, a, &b);
  for (int i = 1; i < 3; i++)
    cr_expect_geq(a[i]->t_started, a[i - 1]->t_done,
                  "A's job %d started before job %d ended: A held two slots", i, i - 1);
  cr_expect_lt(b->t_started, a[1]->t_started, "B's job waited behind A's queue");
  cr_expect_null(g->s.clients, "a client record outlived its jobs");
  for (int i = 0; i < 3; i++)
    attnd_req_unref(a[i]);
  attnd_req_unref(b);
  rig_close(g);
}

/* A job held in the queue by its client's cap still meets its deadline:
 * with A's first job held in the engine (rig_hold) past --timeout, A's
 * second is answered 504 from the queue though a slot is free, and never
 * runs. */
Test(loop, a_capped_clients_queued_job_still_times_out) {
  rig *g = rig_open_with(32, 30, 1, 0);
  rig_hold(g);
  attnd_req *a0 = job_of(g, body_ok, "10.0.0.1"), *a1 = job_of(g, body_ok, "10.0.0.1");
  attnd_loop_submit(&g->s, a0);
  attnd_loop_submit(&g->s, a1);
  run_until_in_engine(g, a0);
  expire(g, a0);
  a1->t_received = a0->t_received; /* one deadline: one tick cancels both */
  run_until_answered(g, 2);
  rig_release(g);
  run_until(g, 2);
  cr_expect_eq(a0->status, 504);
  cr_expect_eq(a1->status, 504);
  cr_expect(body_has(a1, "\"timeout\""));
  cr_expect(body_has(a1, "queued"), "the 504 says where it was: %.*s", (int)a1->resp_len, a1->resp);
  cr_expect_not(a1->dispatched, "the capped job ran beside its client's other job");
  cr_expect(metrics_has(g, "attnd_jobs_canceled_total{reason=\"timeout\",stage=\"queued\"} 1\n"));
  attnd_req_unref(a0);
  attnd_req_unref(a1);
  rig_close(g);
}

/* ---- --max-pairs --------------------------------------------------------- */

/* body_ok asks for 1 x 1 x 2 x 3 = 6 score pairs: refused (422, with the
 * numbers) before it reaches the engine over --max-pairs 5, computed at 6. */
Test(loop, a_request_over_max_pairs_is_422_before_it_computes) {
  rig *g = rig_open_with(8, 30, 0, 5);
  attnd_req *r = job(g, body_ok);
  attnd_loop_submit(&g->s, r);
  run_until(g, 1);
  cr_expect_eq(r->status, 422);
  cr_expect(body_has(r, "\"too_much_work\""), "%.*s", (int)r->resp_len, r->resp);
  cr_expect(body_has(r, "this request has 6 score pairs, over --max-pairs 5"), "%.*s",
            (int)r->resp_len, r->resp);
  cr_expect_not(r->in_engine, "it was submitted to the engine");
  cr_expect(metrics_has(g, "attnd_errors_total{code=\"too_much_work\"} 1\n"));
  attnd_req_unref(r);
  rig_close(g);
  g = rig_open_with(8, 30, 0, 6);
  r = job(g, body_ok);
  attnd_loop_submit(&g->s, r);
  run_until(g, 1);
  cr_expect_eq(r->status, 200, "at the cap: %d", r->status);
  attnd_req_unref(r);
  rig_close(g);
}
