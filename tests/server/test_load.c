/*
 * test_load.c — attnd under concurrency: 64 parallel clients, a full queue
 * (503 + Retry-After), queue deadlines (504), graceful SIGTERM with jobs in
 * flight, the drain deadline, idle keep-alive connections, and 200 slow
 * clients that must not starve normal ones.
 */
#include "harness.h"

#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static srv S;
static void teardown(void) { srv_cleanup(&S); }
TestSuite(load, .fini = teardown, .timeout = 90);

#define ST_CT "application/octet-stream"

/* ---- concurrent slow jobs ------------------------------------------------ */

typedef struct job {
  const srv *s;
  const char *body;
  size_t len;
  pthread_barrier_t *bar;
  long timeout_ms;
  http_res r;
  double t0, t1;
} job;

static void *job_run(void *arg) {
  job *j = arg;
  if (j->bar)
    pthread_barrier_wait(j->bar);
  const char *hdrs[] = {"Content-Type: " ST_CT, NULL};
  http_req rq = {.method = "POST", .path = "/attention", .headers = hdrs, .body = j->body,
                 .len = j->len, .timeout_ms = j->timeout_ms ? j->timeout_ms : 60000};
  j->t0 = now_s();
  http_do(j->s, &rq, &j->r);
  j->t1 = now_s();
  return NULL;
}

/* Starts n identical jobs at once (a barrier); returns the array. */
static job *start_jobs(pthread_t *th, int n, const char *body, size_t len, long timeout_ms) {
  job *js = calloc((size_t)n, sizeof *js);
  pthread_barrier_t *bar = malloc(sizeof *bar);
  pthread_barrier_init(bar, NULL, (unsigned)n);
  for (int i = 0; i < n; i++) {
    js[i] = (job){.s = &S, .body = body, .len = len, .bar = bar, .timeout_ms = timeout_ms};
    pthread_create(&th[i], NULL, job_run, &js[i]);
  }
  return js;
}

static void join_jobs(pthread_t *th, job *js, int n) {
  for (int i = 0; i < n; i++)
    pthread_join(th[i], NULL);
  pthread_barrier_destroy(js[0].bar);
  free(js[0].bar);
}

/* Checks every 200 among the jobs: the first against the reference, the
 * others byte for byte against it (the reference backend is deterministic).
 * Returns the number of 200s. */
static int check_ok_replies(job *js, int n, tcase *c, const char *what) {
  int ok = 0;
  const http_res *first = NULL;
  for (int i = 0; i < n; i++) {
    if (js[i].r.status != 200)
      continue;
    ok++;
    if (!first) {
      first = &js[i].r;
      expect_correct(&js[i].r, c, 4, true, what);
    } else {
      cr_expect(js[i].r.len == first->len && !memcmp(js[i].r.body, first->body, first->len),
                "%s: job %d's reply differs from job 0's", what, i);
    }
  }
  return ok;
}

/* Sums queue depth and in-flight jobs from /metrics. */
static int jobs_in_server(void) {
  http_res r;
  http_req rq = {.path = "/metrics", .timeout_ms = 5000};
  if (http_do(&S, &rq, &r) < 0 || r.status != 200) {
    http_res_free(&r);
    return -1;
  }
  int n = (int)(prom_sum(r.body, "attnd_queue_depth", NULL, NULL) +
                prom_sum(r.body, "attnd_inflight", NULL, NULL));
  http_res_free(&r);
  return n;
}

static bool wait_jobs(int want, double timeout_s) {
  double t0 = now_s();
  while (now_s() - t0 < timeout_s) {
    if (jobs_in_server() >= want)
      return true;
    sleep_s(0.02);
  }
  return false;
}

Test(load, queue_full_503_with_retry_after) {
  srv_start(&S, "--max-queue", "1", "--threads", "1", NULL);
  tcase c;
  size_t len;
  char *body = slow_body(&c, 4, 700, &len);
  enum { N = 6 };
  pthread_t th[N];
  job *js = start_jobs(th, N, body, len, 0);
  join_jobs(th, js, N);
  int n200 = 0, n503 = 0;
  for (int i = 0; i < N; i++) {
    if (js[i].r.status == 503) {
      n503++;
      char what[64], ra[64] = "";
      snprintf(what, sizeof what, "job %d of %d under --max-queue 1", i, N);
      expect_error(&js[i].r, 503, "queue_full", what);
      bool has = http_header(&js[i].r, "Retry-After", ra, sizeof ra);
      char *end = NULL;
      long v = has ? strtol(ra, &end, 10) : -1;
      cr_expect(has && *ra && end && !*end && v >= 0, "%s: Retry-After \"%s\"", what,
                has ? ra : "(missing)");
      cr_expect_lt(js[i].t1 - js[i].t0, 2.0, "%s: the 503 took %.2f s", what,
                   js[i].t1 - js[i].t0);
    }
  }
  n200 = check_ok_replies(js, N, &c, "--max-queue 1");
  cr_log_info("--max-queue 1: %d x 200, %d x 503 of %d", n200, n503, N);
  /* No "some job succeeded": since --timeout also cancels running jobs, on
   * a slow machine (or under sanitizers) every job may pass its deadline. */
  cr_expect_geq(n503, 1, "no job was refused with 503 (6 concurrent slow jobs, --max-queue 1)");
  cr_expect_eq(n200 + n503, N, "statuses other than 200 and 503: %d + %d of %d", n200, n503, N);
  for (int i = 0; i < N; i++)
    http_res_free(&js[i].r);
  free(js);
  /* The metrics count what the clients saw. */
  http_res m;
  http_get(&S, "/metrics", &m);
  const char *l503[] = {"path=/attention", "code=503", NULL};
  const char *l200[] = {"path=/attention", "code=200", NULL};
  cr_expect_eq(prom_sum(m.body, "attnd_requests_total", l503, NULL), n503,
               "attnd_requests_total 503s: %g, clients saw %d",
               prom_sum(m.body, "attnd_requests_total", l503, NULL), n503);
  cr_expect_eq(prom_sum(m.body, "attnd_requests_total", l200, NULL), n200,
               "attnd_requests_total 200s: %g, clients saw %d",
               prom_sum(m.body, "attnd_requests_total", l200, NULL), n200);
  http_res_free(&m);
  /* The queue frees up: the next job runs. */
  http_res r;
  http_post(&S, "/attention", ST_CT, body, len, &r);
  expect_correct(&r, &c, 4, true, "a job after the burst");
  http_res_free(&r);
  free(body);
  tcase_free(&c);
}

Test(load, queue_timeout_504) {
  srv_start(&S, "--timeout", "1", "--max-queue", "10", "--threads", "1", NULL);
  tcase c;
  size_t len;
  char *body = slow_body(&c, 4, 1000, &len);
  enum { N = 8 };
  pthread_t th[N];
  job *js = start_jobs(th, N, body, len, 0);
  join_jobs(th, js, N);
  int n504 = 0;
  for (int i = 0; i < N; i++)
    if (js[i].r.status == 504) {
      n504++;
      char what[64];
      snprintf(what, sizeof what, "job %d of %d under --timeout 1", i, N);
      expect_error(&js[i].r, 504, "timeout", what);
      cr_expect_lt(js[i].t1 - js[i].t0, 3.0, "%s: the 504 came after %.2f s", what,
                   js[i].t1 - js[i].t0);
    }
  int n200 = check_ok_replies(js, N, &c, "--timeout 1");
  for (int i = 0; i < N; i++)
    cr_log_info("--timeout 1: job %d status %ld after %.2f s", i, js[i].r.status,
                js[i].t1 - js[i].t0);
  /* No "some job succeeded": since --timeout also cancels running jobs, on
   * a slow machine (or under sanitizers) every job may pass its deadline. */
  cr_expect_geq(n504, 1, "no 504 among %d jobs of ~0.4 s each on one thread with --timeout 1", N);
  cr_expect_eq(n200 + n504, N, "statuses other than 200 and 504: %d + %d of %d", n200, n504, N);
  for (int i = 0; i < N; i++)
    http_res_free(&js[i].r);
  free(js);
  expect_healthy(&S, "504s");
  free(body);
  tcase_free(&c);
}

Test(load, sigterm_answers_jobs_in_flight) {
  srv_start(&S, "--threads", "1", NULL);
  tcase c;
  size_t len;
  char *body = slow_body(&c, 4, 700, &len);
  enum { N = 4 };
  pthread_t th[N];
  job *js = start_jobs(th, N, body, len, 0);
  cr_expect(wait_jobs(N, 5), "the %d jobs never showed in queue_depth + inflight", N);
  double ts = now_s();
  kill(S.pid, SIGTERM);
  sleep_s(0.1);
  /* New connections are refused while draining. */
  int fd = raw_connect(S.port);
  if (fd >= 0) {
    raw_sends(fd, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
    http_res r;
    int st = raw_response(fd, 3000, &r);
    cr_expect(st == -1 || st == 503, "a new connection during the drain got %d", st);
    http_res_free(&r);
    close(fd);
  }
  join_jobs(th, js, N);
  for (int i = 0; i < N; i++)
    cr_expect_eq(js[i].r.status, 200, "job %d in flight at SIGTERM: status %ld (%s) %s", i,
                 js[i].r.status, js[i].r.error, js[i].r.body);
  check_ok_replies(js, N, &c, "jobs in flight at SIGTERM");
  for (int i = 0; i < N; i++)
    cr_log_info("SIGTERM: job %d answered %.2f s after the signal", i, js[i].t1 - ts);
  int st = srv_wait(&S, 30);
  cr_expect_eq(st, 0, "exit status %d after SIGTERM with jobs in flight", st);
  cr_expect_lt(now_s() - ts, 15, "exit %.1f s after SIGTERM", now_s() - ts);
  for (int i = 0; i < N; i++)
    http_res_free(&js[i].r);
  free(js);
  free(body);
  tcase_free(&c);
}

Test(load, draining_readyz_503) {
  srv_start(&S, "--threads", "1", NULL);
  int fd = raw_connect(S.port);
  cr_assert(fd >= 0);
  raw_sends(fd, "GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n");
  http_res r;
  cr_expect_eq(raw_response(fd, 5000, &r), 200, "readyz before SIGTERM");
  http_res_free(&r);
  tcase c;
  size_t len;
  char *body = slow_body(&c, 4, 1000, &len);
  enum { N = 3 };
  pthread_t th[N];
  job *js = start_jobs(th, N, body, len, 0);
  cr_expect(wait_jobs(N, 5), "the jobs never showed in the metrics");
  kill(S.pid, SIGTERM);
  sleep_s(0.1);
  /* The kept-alive connection still asks: not ready. */
  raw_sends(fd, "GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n");
  int st = raw_response(fd, 5000, &r);
  cr_expect_eq(st, 503, "readyz while draining: %d (%s)", st, r.error);
  if (st > 0) {
    expect_error(&r, 503, "shutting_down", "readyz while draining");
    char ra[32];
    cr_expect(http_header(&r, "Retry-After", ra, sizeof ra), "draining 503 without Retry-After");
  }
  http_res_free(&r);
  close(fd);
  join_jobs(th, js, N);
  for (int i = 0; i < N; i++)
    cr_expect_eq(js[i].r.status, 200, "job %d: %ld", i, js[i].r.status);
  check_ok_replies(js, N, &c, "jobs while draining");
  cr_expect_eq(srv_wait(&S, 30), 0, "exit status");
  for (int i = 0; i < N; i++)
    http_res_free(&js[i].r);
  free(js);
  free(body);
  tcase_free(&c);
}

Test(load, drain_timeout_bounds_the_exit) {
  srv_start(&S, "--threads", "1", "--drain-timeout", "1", NULL);
  tcase c;
  size_t len;
  char *body = slow_body(&c, 4, 1500, &len); /* ~0.9 s each at -O2, 3 of them */
  enum { N = 3 };
  pthread_t th[N];
  job *js = start_jobs(th, N, body, len, 20000);
  cr_expect(wait_jobs(N, 5), "the jobs never showed in the metrics");
  double ts = now_s();
  kill(S.pid, SIGTERM);
  int st = srv_wait(&S, 10);
  double dt = now_s() - ts;
  cr_expect_neq(st, -1, "still running 10 s after SIGTERM with --drain-timeout 1");
  cr_expect_lt(dt, 2.5, "exit %.2f s after SIGTERM with --drain-timeout 1", dt);
  join_jobs(th, js, N);
  cr_log_info("--drain-timeout 1: exit %.2f s after SIGTERM, status %d", dt, st);
  for (int i = 0; i < N; i++) {
    cr_log_info("--drain-timeout 1: job %d status %ld (%s) %.2f s after SIGTERM", i,
                js[i].r.status, js[i].r.error, js[i].t1 - ts);
    /* Answered (200 or 503), or cut off at exit; never left hanging. */
    cr_expect_lt(js[i].t1 - ts, 5, "job %d ended %.1f s after SIGTERM", i, js[i].t1 - ts);
    http_res_free(&js[i].r);
  }
  free(js);
  free(body);
  tcase_free(&c);
}

Test(load, clients_gone_mid_job) {
  srv_start(&S, "--threads", "1", NULL);
  tcase c;
  size_t len;
  char *body = slow_body(&c, 4, 700, &len);
  /* Three clients send a slow job and close before the reply. Their FIN
   * cannot be told from a half-close (shutdown(SHUT_WR)), whose client
   * still reads: the jobs run, and the replies fail (499 in the log). Resets
   * are what cancel a job (test_cancel.c). */
  int fds[3];
  for (int i = 0; i < 3; i++) {
    fds[i] = raw_connect(S.port);
    cr_assert(fds[i] >= 0);
    char h[256];
    snprintf(h, sizeof h,
             "POST /attention HTTP/1.1\r\nHost: x\r\nContent-Type: " ST_CT
             "\r\nContent-Length: %zu\r\n\r\n",
             len);
    raw_sends(fds[i], h);
    raw_send(fds[i], body, len);
  }
  cr_expect(wait_jobs(1, 5), "the jobs never showed in the metrics");
  for (int i = 0; i < 3; i++)
    close(fds[i]);
  /* A client that hangs up in the middle of its body. */
  int fd = raw_connect(S.port);
  char h[256];
  snprintf(h, sizeof h,
           "POST /attention HTTP/1.1\r\nHost: x\r\nContent-Type: " ST_CT
           "\r\nContent-Length: %zu\r\n\r\n",
           len);
  raw_sends(fd, h);
  raw_send(fd, body, len / 2);
  close(fd);
  /* The server serves on, and its gauges come back to zero. */
  http_res r;
  http_post(&S, "/attention", ST_CT, body, len, &r);
  expect_correct(&r, &c, 4, true, "a job after clients hung up");
  http_res_free(&r);
  double t0 = now_s();
  int n = -1;
  while (now_s() - t0 < 5 && (n = jobs_in_server()) != 0)
    sleep_s(0.05);
  cr_expect_eq(n, 0, "queue_depth + inflight stuck at %d after the clients left", n);
  double ts = now_s();
  int st = srv_stop(&S, 15);
  cr_expect_eq(st, 0,
               "SIGTERM with no job left: exit status %d after %.1f s (-1: still running, "
               "killed); clients that hung up mid-job must not hold the drain",
               st, now_s() - ts);
  free(body);
  tcase_free(&c);
}

/* ---- 64 parallel clients ---------------------------------------------------- */

typedef struct client {
  int id;
  pthread_barrier_t *bar;
  int ok, done;
  char err[1024];
} client;

static void *client_run(void *arg) {
  client *cl = arg;
  void *h = http_handle();
  pthread_barrier_wait(cl->bar);
  static const attn_dtype dts[] = {ATTN_F32, ATTN_F16, ATTN_BF16};
  for (int k = 0; k < 3; k++) {
    int v = cl->id * 3 + k;
    tprob p;
    switch (v % 3) {
    case 0: p = tprob_make(1, 2, 2, 16, 16, 32, dts[v % 3]); break;
    case 1: p = tprob_make(1, 4, 2, 96, 128, 64, dts[(v / 3) % 3]); break;
    default: p = tprob_make(2, 4, 1, 160, 160, 64, dts[(v / 7) % 3]); break;
    }
    p.causal = v % 4 == 1;
    p.stats = v % 5 == 0;
    tcase c;
    tcase_init(&c, &p, 5000 + (uint64_t)v);
    bool st = v % 2;
    char extra[64];
    snprintf(extra, sizeof extra, ",\"causal\":%s,\"stats\":%s", p.causal ? "true" : "false",
             p.stats ? "true" : "false");
    char meta[64];
    snprintf(meta, sizeof meta, "{\"causal\":\"%d\",\"stats\":\"%d\"}", p.causal, p.stats);
    size_t len;
    char *b = st ? st_body(&c, 4, meta, &len) : json_body(&c, 4, extra, &len);
    const char *hdrs[] = {st ? "Content-Type: " ST_CT : "Content-Type: application/json", NULL};
    http_req rq = {.method = "POST", .path = "/attention", .headers = hdrs, .body = b,
                   .len = len, .timeout_ms = 60000};
    http_res r;
    http_do_h(h, &S, &rq, &r);
    char e[900];
    const char *m = check_correct(&r, &c, 4, st, e, sizeof e);
    if (m && !cl->err[0])
      snprintf(cl->err, sizeof cl->err, "client %d request %d: %s", cl->id, k, m);
    cl->ok += !m;
    cl->done++;
    http_res_free(&r);
    free(b);
    tcase_free(&c);
  }
  http_handle_free(h);
  return NULL;
}

Test(load, sixty_four_parallel_clients) {
  srv_start(&S, NULL);
  enum { N = 64 };
  pthread_t th[N];
  client cl[N];
  pthread_barrier_t bar;
  pthread_barrier_init(&bar, NULL, N);
  for (int i = 0; i < N; i++) {
    cl[i] = (client){.id = i, .bar = &bar};
    cr_assert_eq(pthread_create(&th[i], NULL, client_run, &cl[i]), 0);
  }
  int ok = 0;
  for (int i = 0; i < N; i++) {
    pthread_join(th[i], NULL);
    ok += cl[i].ok;
    cr_expect(!cl[i].err[0], "%s", cl[i].err);
  }
  pthread_barrier_destroy(&bar);
  cr_expect_eq(ok, N * 3, "%d of %d answers correct", ok, N * 3);
  expect_healthy(&S, "64 clients");
  cr_expect_eq(srv_stop(&S, 15), 0, "exit status");
}

/* ---- idle and slow connections -------------------------------------------- */

Test(load, idle_keep_alive_closed) {
  srv_start(&S, "--idle-timeout", "1", NULL);
  int fd = raw_connect(S.port);
  cr_assert(fd >= 0);
  raw_sends(fd, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
  http_res r;
  cr_expect_eq(raw_response(fd, 5000, &r), 200);
  http_res_free(&r);
  double t = raw_wait_close(fd, 5000);
  cr_log_info("idle keep-alive connection closed after %.2f s", t);
  cr_expect(t >= 0 && t <= 3.0, "the idle keep-alive connection was closed after %.2f s "
                                "(-1: still open after 5 s), want within 3 s",
            t);
  cr_expect(t < 0 || t >= 0.5, "the keep-alive connection was closed at once (%.2f s)", t);
  close(fd);
  /* A connection that never sends anything. */
  fd = raw_connect(S.port);
  cr_assert(fd >= 0);
  t = raw_wait_close(fd, 5000);
  cr_expect(t >= 0 && t <= 3.0, "a silent connection was closed after %.2f s, want within 3 s",
            t);
  close(fd);
  expect_healthy(&S, "idle connections");
}

typedef struct slow_ctx {
  int port, n;
  int *fds;
  volatile int stop;
  int sent_ok;
} slow_ctx;

static const char slow_hdr[] = "POST /attention HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                               "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n";

static void *slow_run(void *arg) {
  slow_ctx *x = arg;
  size_t pos = 0;
  while (!x->stop) {
    double t0 = now_s();
    for (int i = 0; i < x->n; i++) {
      if (x->fds[i] < 0)
        continue;
      /* half dribble the headers, half the body after whole headers */
      char ch = i % 2 ? slow_hdr[pos % (sizeof slow_hdr - 1)] : ' ';
      if (raw_send(x->fds[i], &ch, 1) == 0)
        x->sent_ok++;
    }
    pos++;
    while (!x->stop && now_s() - t0 < 1.0)
      sleep_s(0.05);
  }
  return NULL;
}

Test(load, slow_clients_do_not_starve_others) {
  srv_start(&S, NULL);
  enum { N = 200 };
  int fds[N];
  for (int i = 0; i < N; i++) {
    fds[i] = raw_connect(S.port);
    cr_assert(fds[i] >= 0, "connect %d: %s", i, strerror(errno));
    if (i % 2 == 0) /* body senders: whole headers first */
      raw_sends(fds[i], slow_hdr);
  }
  slow_ctx x = {.port = S.port, .n = N, .fds = fds};
  pthread_t th;
  pthread_create(&th, NULL, slow_run, &x);
  tprob p = tprob_make(1, 2, 2, 32, 32, 32, ATTN_F32);
  tcase c;
  tcase_init(&c, &p, 9001);
  size_t len;
  char *b = st_body(&c, 4, NULL, &len);
  double t0 = now_s(), worst = 0;
  int n = 0;
  while (now_s() - t0 < 6) {
    http_res r;
    http_req rq = {.path = "/healthz", .timeout_ms = 10000};
    double a = now_s();
    http_do(&S, &rq, &r);
    double d1 = now_s() - a;
    cr_expect_eq(r.status, 200, "healthz among slow clients: %ld (%s)", r.status, r.error);
    http_res_free(&r);
    a = now_s();
    http_post(&S, "/attention", ST_CT, b, len, &r);
    double d2 = now_s() - a;
    expect_correct(&r, &c, 4, true, "attention among slow clients");
    http_res_free(&r);
    cr_expect_lt(d1, 2.0, "healthz took %.2f s among 200 slow clients", d1);
    cr_expect_lt(d2, 2.0, "attention took %.2f s among 200 slow clients", d2);
    worst = d1 > worst ? d1 : worst;
    worst = d2 > worst ? d2 : worst;
    n++;
    sleep_s(0.2);
  }
  x.stop = 1;
  pthread_join(th, NULL);
  cr_log_info("slow clients: %d rounds, worst %.3f s, %d slow bytes sent", n, worst, x.sent_ok);
  for (int i = 0; i < N; i++)
    close(fds[i]);
  expect_healthy(&S, "slow clients");
  free(b);
  tcase_free(&c);
}

Test(load, more_connections_than_max) {
  srv_start(&S, "--max-connections", "8", NULL);
  enum { N = 20 };
  int fds[N];
  for (int i = 0; i < N; i++)
    fds[i] = raw_connect(S.port);
  sleep_s(0.3);
  cr_expect(srv_running(&S), "the server died with %d connections open", N);
  for (int i = 0; i < N; i++)
    if (fds[i] >= 0)
      close(fds[i]);
  sleep_s(0.3);
  double t0 = now_s();
  bool ok = false;
  while (!ok && now_s() - t0 < 3) {
    http_res r;
    http_req rq = {.path = "/healthz", .timeout_ms = 2000};
    ok = http_do(&S, &rq, &r) == 0 && r.status == 200;
    http_res_free(&r);
    if (!ok)
      sleep_s(0.1);
  }
  cr_expect(ok, "/healthz does not answer after the extra connections closed");
}
