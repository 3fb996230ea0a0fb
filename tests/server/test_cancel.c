/*
 * test_cancel.c — deadlines and hang-ups (a reset, or a FIN before the
 * reply) cancel jobs; uploads under way at SIGTERM are answered.
 *
 * Nothing here asserts a duration: the machine may be loaded. Each test
 * waits for an event (a reply, a counter, an exit) within a generous bound
 * and checks what the server reports: the status and error code on the
 * wire, its log lines, and /metrics (attnd_jobs_canceled_total{reason,
 * stage}, where stage "running" means the engine stopped the job before its
 * end).
 *
 * The server is build/tests/attnd-hold: its backend=reference jobs stay
 * running until canceled (tests/lib/hold_backend.c), so a job is still
 * running when a test hangs up or a deadline passes, however fast the
 * machine, and the problems can be small.
 */
#include "harness.h"

#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static srv S;
static void setup(void) { S.bin = srv_hold_bin(); }
static void teardown(void) { srv_cleanup(&S); }
TestSuite(cancel, .init = setup, .fini = teardown, .timeout = 120);

#define ST_CT "application/octet-stream"

/* Uniform attention: both keys are equal, so O is the mean of V's rows. */
static const char tiny_json[] =
    "{\"q\": [[1, 0]], \"k\": [[1, 0], [1, 0]], \"v\": [[1, 2], [3, 4]]}";

/* Checks that a reply body is {"o": {"shape": [1, 2], "data": [2, 3]}}. */
static void expect_tiny_reply(const http_res *r, const char *what) {
  cr_assert_eq(r->status, 200, "%s: status %ld (%s) %s", what, r->status, r->error,
               r->body ? r->body : "");
  cJSON *j = cJSON_ParseWithLength(r->body, r->len);
  cr_assert_not_null(j, "%s: the reply is not JSON: %s", what, r->body);
  const cJSON *o = cJSON_GetObjectItemCaseSensitive(j, "o");
  const cJSON *data = cJSON_GetObjectItemCaseSensitive(o, "data");
  cr_expect(cJSON_GetArraySize(data) == 2, "%s: o.data is not 2 numbers: %s", what, r->body);
  double want[2] = {2, 3};
  for (int i = 0; i < 2 && i < cJSON_GetArraySize(data); i++) {
    const cJSON *x = cJSON_GetArrayItem(data, i);
    cr_expect(cJSON_IsNumber(x) && x->valuedouble > want[i] - 1e-6 &&
                  x->valuedouble < want[i] + 1e-6,
              "%s: o[%d] is not %g: %s", what, i, want[i], r->body);
  }
  cJSON_Delete(j);
}

static char *metrics_text(void) {
  http_res r;
  http_req rq = {.path = "/metrics", .timeout_ms = 5000};
  if (http_do(&S, &rq, &r) < 0 || r.status != 200) {
    http_res_free(&r);
    return NULL;
  }
  char *t = r.body;
  r.body = NULL;
  http_res_free(&r);
  return t;
}

/* A metric's value (summed over series matching labels); -1 on failure. */
static double metric(const char *name, const char *const *labels) {
  char *t = metrics_text();
  if (!t)
    return -1;
  double v = prom_sum(t, name, labels, NULL);
  free(t);
  return v;
}

static double canceled(const char *reason, const char *stage) {
  char r[64], s[64];
  snprintf(r, sizeof r, "reason=%s", reason);
  snprintf(s, sizeof s, "stage=%s", stage);
  const char *labels[] = {r, s, NULL};
  return metric("attnd_jobs_canceled_total", labels);
}

/* Waits (up to timeout_s) until a metric reaches want. */
static bool wait_metric(const char *name, const char *const *labels, double want,
                        double timeout_s) {
  double t0 = now_s();
  while (now_s() - t0 < timeout_s) {
    if (metric(name, labels) >= want)
      return true;
    sleep_s(0.05);
  }
  return false;
}

static bool wait_canceled(const char *reason, const char *stage, double want, double timeout_s) {
  double t0 = now_s();
  while (now_s() - t0 < timeout_s) {
    if (canceled(reason, stage) >= want)
      return true;
    sleep_s(0.05);
  }
  return false;
}

/* Waits until the server's log holds needle. */
static bool wait_log(const char *needle, double timeout_s) {
  double t0 = now_s();
  do {
    char *log = srv_log(&S);
    bool found = log && strstr(log, needle);
    free(log);
    if (found)
      return true;
    sleep_s(0.05);
  } while (now_s() - t0 < timeout_s);
  return false;
}

/* A raw connection that has sent a whole POST /attention. */
static int post_raw(const char *ctype, const void *body, size_t len) {
  int fd = raw_connect(S.port);
  cr_assert(fd >= 0, "connect");
  char h[256];
  snprintf(h, sizeof h,
           "POST /attention HTTP/1.1\r\nHost: localhost\r\nContent-Type: %s\r\nContent-Length: "
           "%zu\r\n\r\n",
           ctype, len);
  cr_assert_eq(raw_sends(fd, h), 0);
  cr_assert_eq(raw_send(fd, body, len), 0);
  return fd;
}

/* One POST on its own thread, for requests whose reply is awaited later. */
typedef struct job {
  const char *body;
  size_t len;
  http_res r;
} job;

static void *job_run(void *arg) {
  job *j = arg;
  const char *hdrs[] = {"Content-Type: " ST_CT, NULL};
  http_req rq = {.method = "POST",
                 .path = "/attention",
                 .headers = hdrs,
                 .body = j->body,
                 .len = j->len,
                 .timeout_ms = 90000};
  http_do(&S, &rq, &j->r);
  return NULL;
}

static void small_request_works(const char *after) {
  http_res r;
  http_post(&S, "/attention", "application/json", tiny_json, strlen(tiny_json), &r);
  expect_tiny_reply(&r, after);
  http_res_free(&r);
}

/* Two held jobs fill both running slots (one client may: no per-client
 * cap) and keep them, canceled, until the gate opens; a third waits in the
 * queue and must get its 504 while it still waits, not once a slot frees. */
Test(cancel, queued_request_gets_504_at_its_deadline) {
  hold_gate gate;
  const char *args[] = {"--timeout", "1", "--threads", "1", "--max-running-per-client", "0", NULL};
  srv_start_gated(&S, &gate, args);
  tcase c;
  size_t len;
  char *body = held_body(&c, &len);
  job js[3] = {{.body = body, .len = len}, {.body = body, .len = len}, {.body = body, .len = len}};
  pthread_t th[3];
  for (int i = 0; i < 2; i++)
    pthread_create(&th[i], NULL, job_run, &js[i]);
  const char *none[] = {NULL};
  cr_expect(wait_metric("attnd_inflight", none, 2, 20), "the two held jobs never ran");
  pthread_create(&th[2], NULL, job_run, &js[2]);
  for (int i = 0; i < 3; i++)
    pthread_join(th[i], NULL);
  for (int i = 0; i < 3; i++) {
    char what[64];
    snprintf(what, sizeof what, "request %d under --timeout 1", i);
    expect_error(&js[i].r, 504, "timeout", what);
    http_res_free(&js[i].r);
  }
  cr_expect_geq(canceled("timeout", "queued"), 1,
                "the queued request was not counted as canceled in the queue");
  cr_expect(wait_log("canceled (timeout): dropped from the queue", 10),
            "no log line for the job dropped from the queue");
  hold_release(&gate);
  cr_expect(wait_canceled("timeout", "running", 1, 60),
            "the engine never stopped a running job past its deadline");
  small_request_works("a small request after the 504s");
  free(body);
  tcase_free(&c);
  hold_gate_free(&gate);
}

/* One held job: at its deadline the 504 goes out and the engine stops it. */
Test(cancel, running_job_canceled_at_its_deadline) {
  srv_start(&S, "--timeout", "1", "--threads", "1", NULL);
  tcase c;
  size_t len;
  char *body = held_body(&c, &len);
  job j = {.body = body, .len = len};
  job_run(&j);
  expect_error(&j.r, 504, "timeout", "a held job under --timeout 1");
  if (j.r.body)
    cr_expect(strstr(j.r.body, "running"), "the 504 does not say the job was running: %s",
              j.r.body);
  http_res_free(&j.r);
  cr_expect(wait_canceled("timeout", "running", 1, 60),
            "attnd_jobs_canceled_total{reason=timeout,stage=running} never counted the job");
  cr_expect(wait_log("canceled (timeout): the engine stopped the job", 10),
            "no log line saying the engine stopped the job");
  cr_expect(wait_log("POST /attention 504 ", 10), "the request is not logged as 504");
  small_request_works("a small request after the canceled job");
  free(body);
  tcase_free(&c);
}

/* Whether fd gets nothing but end-of-file: no byte of a reply. */
static bool closes_unanswered(int fd) {
  char b[64];
  struct timeval tv = {30, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return recv(fd, b, sizeof b, 0) <= 0;
}

/* A reset: SO_LINGER 0, then close. */
static void hang_up_reset(int fd) { raw_reset(fd); }

/* A FIN: close() and shutdown(SHUT_WR) look the same on the wire. */
static void hang_up_fin(int fd) {
  shutdown(fd, SHUT_WR);
  cr_expect(closes_unanswered(fd), "a reply went to a client that closed");
  close(fd);
}

/* A client that hangs up while its job runs has abandoned it: the job is
 * canceled, and 499 appears in the log only. */
static void expect_hang_up_cancels_running_job(void (*hang_up)(int fd)) {
  srv_start(&S, "--threads", "1", NULL);
  tcase c;
  size_t len;
  char *body = held_body(&c, &len);
  int fd = post_raw(ST_CT, body, len);
  const char *none[] = {NULL};
  cr_expect(wait_metric("attnd_inflight", none, 1, 20), "the job never ran");
  hang_up(fd);
  cr_expect(wait_canceled("client_closed", "running", 1, 60),
            "the job of a client that hung up was never stopped by the engine");
  cr_expect(wait_log("POST /attention 499 ", 10), "the hang-up is not logged as 499");
  cr_expect(wait_log("canceled (client_closed)", 10), "no log line for the canceled job");
  small_request_works("a small request after the hang-up");
  free(body);
  tcase_free(&c);
}

Test(cancel, client_reset_cancels_the_running_job) {
  expect_hang_up_cancels_running_job(hang_up_reset);
}

/* TCP cannot tell a close from a half-close: as nginx takes it for proxied
 * requests, a FIN before the reply abandons the job. */
Test(cancel, a_fin_cancels_the_running_job) { expect_hang_up_cancels_running_job(hang_up_fin); }

/* Two held jobs fill the running slots; a third whose client closes while
 * it waits is dropped from the queue and never runs. */
Test(cancel, a_fin_drops_the_queued_job) {
  /* one client fills both slots: no share of its own */
  srv_start(&S, "--threads", "1", "--max-running-per-client", "0", NULL);
  tcase c;
  size_t len;
  char *body = held_body(&c, &len);
  int run[2];
  for (int i = 0; i < 2; i++)
    run[i] = post_raw(ST_CT, body, len);
  const char *none[] = {NULL};
  cr_expect(wait_metric("attnd_inflight", none, 2, 20), "the two held jobs never ran");
  int fd = post_raw(ST_CT, body, len);
  cr_expect(wait_metric("attnd_queue_depth", none, 1, 20), "the third job never queued");
  close(fd);
  cr_expect(wait_canceled("client_closed", "queued", 1, 60),
            "the queued job of a client that closed was not dropped");
  for (int i = 0; i < 2; i++)
    raw_reset(run[i]);
  cr_expect(wait_canceled("client_closed", "running", 2, 60), "the running jobs ran on");
  small_request_works("a small request after the closes");
  free(body);
  tcase_free(&c);
}

/* A tiny request, then shutdown(SHUT_WR): its reply may be complete before
 * the FIN is seen (then it is written whole) or not (then nothing is), but
 * never a 499 or part of a reply. */
Test(cancel, a_fin_after_a_tiny_request_gets_all_or_nothing) {
  srv_start(&S, NULL);
  for (int i = 0; i < 5; i++) {
    int fd = post_raw("application/json", tiny_json, strlen(tiny_json));
    shutdown(fd, SHUT_WR);
    http_res r;
    int st = raw_response(fd, 30000, &r);
    cr_expect(st == 200 || st < 0, "status %d for a closed request", st);
    if (st == 200)
      expect_tiny_reply(&r, "a reply complete before the FIN");
    http_res_free(&r);
    close(fd);
  }
  small_request_works("a small request after the closes");
}

/* SIGTERM while a body is half uploaded: the drain reads the rest, computes
 * and answers, then the server exits 0. */
Test(cancel, sigterm_mid_upload_is_answered) {
  /* the body waits in mid-way for the drain to begin: no minimum rate */
  srv_start(&S, "--min-upload-rate", "0", NULL);
  size_t len = strlen(tiny_json), half = len / 2;
  int fd = raw_connect(S.port);
  cr_assert(fd >= 0);
  char h[256];
  snprintf(h, sizeof h,
           "POST /attention HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
           "Content-Length: %zu\r\n\r\n",
           len);
  raw_sends(fd, h);
  raw_send(fd, tiny_json, half);
  const char *none[] = {NULL};
  cr_assert(wait_metric("attnd_uploads", none, 1, 20), "the upload never showed in /metrics");
  kill(S.pid, SIGTERM);
  /* The drain has begun once the listening socket is closed. */
  double t0 = now_s();
  int probe;
  while ((probe = raw_connect(S.port)) >= 0 && now_s() - t0 < 20) {
    close(probe);
    sleep_s(0.05);
  }
  cr_expect(probe < 0, "the listening socket stayed open after SIGTERM");
  cr_expect(srv_running(&S), "the server exited with an upload under way");
  raw_send(fd, tiny_json + half, len - half);
  http_res r;
  raw_response(fd, 30000, &r);
  expect_tiny_reply(&r, "the request uploading at SIGTERM");
  http_res_free(&r);
  close(fd);
  cr_expect_eq(srv_wait(&S, 60), 0, "exit status after the drain");
}
