/*
 * test_loop.c — the scheduler (server/loop.c, deadline.c, request.c) on a
 * fake transport and the real CPU engine, without libmicrohttpd or a
 * socket: admission and queue_full, dispatch in FIFO order behind
 * max_running, the deadline and client-reset cancels, and completion.
 *
 * The fake transport records each resume (the loop's "reply is ready");
 * a request whose fd is FAKE_RESET_FD is a client that reset.
 */
#define _GNU_SOURCE /* memmem */
#include "server.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_JOBS = 8, FAKE_RESET_FD = 4242 };

static const char body_ok[] = "{\"q\": [[1, 0], [0, 1]], \"k\": [[1, 0], [0, 1], [1, 1]], "
                              "\"v\": [[1, 2], [3, 4], [5, 6]]}";

typedef struct rig {
  attnd_config cfg;
  attnd_server s;
  attnd_req *resumed[MAX_JOBS];
  int nresumed;
} rig;

/* The transport's callbacks get only r or s: the rig is found from s. */
static rig *rig_of(attnd_server *s) { return (rig *)(void *)((char *)s - offsetof(rig, s)); }

static void fake_resume(attnd_req *r) {
  rig *g = rig_of(r->srv);
  cr_assert_lt(g->nresumed, MAX_JOBS, "more resumes than jobs");
  g->resumed[g->nresumed++] = r;
}
static bool fake_client_reset(attnd_req *r) { return r->fd == FAKE_RESET_FD; }
static void fake_quiesce(attnd_server *s) { (void)s; }

static const attnd_transport fake = {
    .resume = fake_resume, .client_reset = fake_client_reset, .quiesce = fake_quiesce};

static rig *rig_open(int max_queue, double timeout) {
  rig *g = calloc(1, sizeof *g);
  cr_assert_not_null(g);
  g->cfg.max_queue = max_queue;
  g->cfg.max_body = 1 << 20;
  g->cfg.timeout = timeout;
  g->cfg.streams = 1;
  snprintf(g->cfg.backend, sizeof g->cfg.backend, "cpu");
  g->s.cfg = &g->cfg;
  g->s.transport = &fake;
  g->s.backend = "cpu";
  g->s.backend_note = "";
  pthread_mutex_init(&g->s.log_mu, NULL);
  g->s.metrics = attnd_metrics_new();
  cr_assert_not_null(g->s.metrics);
  attn_config ec;
  attn_config_init(&ec);
  ec.threads = 1;
  attn_status st;
  cr_assert_eq(attn_engine_open(&ec, &g->s.engine, &st), 0, "%s", st.message);
  cr_assert_eq(attnd_loop_init(&g->s), 0);
  return g;
}

static void rig_close(rig *g) {
  attnd_loop_close(&g->s);
  attn_engine_close(g->s.engine);
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
  r->route = ATTND_R_ATTENTION;
  r->json_in = true;
  r->query = strdup("");
  r->len = r->cap = strlen(body);
  r->body = malloc(r->cap);
  memcpy(r->body, body, r->len);
  cr_assert(attnd_body_reserve(r, r->cap));
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

Test(loop, a_running_job_past_its_deadline_is_answered_and_its_end_awaited) {
  rig *g = rig_open(8, 0.05);
  /* A job long enough to be running when the deadline passes: 2048 x 2048
   * scores at D = 64 on one thread, after decoding a 1.6 MB body. */
  int n = 2048, d = 64;
  size_t cap = (size_t)3 * n * (d * 4 + 8) + 256;
  char *b = malloc(cap);
  size_t len = (size_t)snprintf(b, cap, "{");
  for (int t = 0; t < 3; t++) {
    len += (size_t)snprintf(b + len, cap - len, "%s\"%c\": [", t ? ", " : "", "qkv"[t]);
    for (int i = 0; i < n; i++) {
      len += (size_t)snprintf(b + len, cap - len, "%s[", i ? ", " : "");
      for (int j = 0; j < d; j++)
        len += (size_t)snprintf(b + len, cap - len, "%s0.5", j ? "," : "");
      len += (size_t)snprintf(b + len, cap - len, "]");
    }
    len += (size_t)snprintf(b + len, cap - len, "]");
  }
  snprintf(b + len, cap - len, "}");
  attnd_req *r = job(g, b);
  free(b);
  attnd_loop_submit(&g->s, r);
  run_until(g, 1);
  cr_expect_eq(r->status, 504);
  cr_expect(r->canceled);
  cr_expect(r->dispatched, "it had started");
  attnd_req_unref(r);
  rig_close(g);
}
