/*
 * test_http_threads.c — attnd with several HTTP threads (--http-threads 4,
 * libmicrohttpd's thread pool): many keep-alive clients at once doing
 * GET /readyz (/healthz in the drain), 404s, small POST /attention checked
 * against the float64 reference and chunked uploads, with the metrics
 * counting exactly the requests sent; and a drain (SIGTERM) while they are
 * busy.
 *
 * Run under make test TSAN=1, these are the races' test: the connection
 * registry, the metrics, the request ids, the uploads' list and the
 * replying count are shared by the polling threads. Nothing here asserts a
 * duration: each test waits for the event it needs within a generous bound.
 */
#include "harness.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static srv S;
static void teardown(void) { srv_cleanup(&S); }
TestSuite(http_threads, .fini = teardown, .timeout = 240);

#define CLIENTS 8
#define ROUNDS 6

/* A request counted by route and code in attnd_requests_total. */
static double requests(const char *path, const char *code) {
  char lp[160], lc[32];
  snprintf(lp, sizeof lp, "path=%s", path);
  snprintf(lc, sizeof lc, "code=%s", code);
  const char *l[] = {lp, lc, NULL};
  return srv_metric(&S, "attnd_requests_total", l);
}

/* One client: its own keep-alive connection (a curl handle), what it saw. */
typedef struct client {
  int id;
  pthread_barrier_t *bar;
  atomic_bool *stop;     /* the drain test's: run until set (NULL: ROUNDS rounds) */
  atomic_int *done;      /* rounds finished by every client */
  atomic_bool *signaled; /* SIGTERM sent */
  int healthz, not_found, posts, uploads; /* 2xx/4xx replies as expected */
  int refused;                            /* 503 shutting_down (drain only) */
  int failed_before;                      /* no reply before SIGTERM: a failure */
  char why[256];                          /* the first unexpected reply */
} client;

__attribute__((format(printf, 2, 3))) static void note(client *c, const char *fmt, ...) {
  if (c->why[0])
    return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->why, sizeof c->why, fmt, ap);
  va_end(ap);
}

/* A small problem, JSON or safetensors by round, checked against the
 * float64 reference; true when the client goes on. */
static bool post_small(client *c, void *h, int round, bool upload) {
  /* an upload: a body of a few hundred KiB sent chunked in 64 KiB pieces,
   * read over many callbacks */
  tprob p = upload ? tprob_make(1, 4, 4, 128, 256, 32, ATTN_F32)
                   : tprob_make(1, 2, 2, 8, 16, 16, ATTN_F32);
  tcase tc;
  tcase_init(&tc, &p, 7000 + (uint64_t)c->id * 100 + (uint64_t)round * 2 + upload);
  bool st = upload || round % 2;
  size_t len;
  char *b = st ? st_body(&tc, 4, NULL, &len) : json_body(&tc, 4, NULL, &len);
  const char *hdrs[] = {
      st ? "Content-Type: application/octet-stream" : "Content-Type: application/json", NULL};
  http_req rq = {.method = "POST",
                 .path = "/attention",
                 .headers = hdrs,
                 .body = b,
                 .len = len,
                 .chunked = upload,
                 .timeout_ms = 120000};
  http_res r;
  http_do_h(h, &S, &rq, &r);
  bool go_on = true;
  char err[200] = "";
  if (r.status == 200) {
    if (check_correct(&r, &tc, 4, st, err, sizeof err))
      note(c, "%s: 200 with wrong numbers: %s", upload ? "upload" : "POST", err);
    else if (upload)
      c->uploads++;
    else
      c->posts++;
  } else if (c->stop && r.status == 503 && atomic_load(c->signaled)) {
    c->refused++;
  } else if (c->stop && r.status == 0 && atomic_load(c->signaled)) {
    go_on = false; /* the drain closed the connection */
  } else {
    note(c, "%s: status %ld %s", upload ? "upload" : "POST", r.status, r.body ? r.body : "");
    go_on = false;
  }
  http_res_free(&r);
  free(b);
  tcase_free(&tc);
  return go_on;
}

/* A GET answered by the HTTP thread: want the status; true to go on. */
static bool get(client *c, void *h, const char *path, long want, int *count) {
  http_req rq = {.path = path, .timeout_ms = 120000};
  http_res r;
  http_do_h(h, &S, &rq, &r);
  bool go_on = true;
  if (r.status == want)
    (*count)++;
  else if (c->stop && r.status == 0 && atomic_load(c->signaled))
    go_on = false;
  else {
    note(c, "GET %s: status %ld %s", path, r.status, r.body ? r.body : "");
    go_on = false;
  }
  http_res_free(&r);
  return go_on;
}

static void *client_run(void *arg) {
  client *c = arg;
  void *h = http_handle();
  pthread_barrier_wait(c->bar);
  for (int i = 0; c->stop ? !atomic_load(c->stop) : i < ROUNDS; i++) {
    bool before = !c->signaled || !atomic_load(c->signaled);
    /* /readyz is the counted test's (the harness's start-up polls /healthz,
     * which may be counted after a baseline is read); a drain turns it 503 */
    bool ok = get(c, h, c->stop ? "/healthz" : "/readyz", 200, &c->healthz) &&
              get(c, h, "/no/such/path", 404, &c->not_found) && post_small(c, h, i, false) &&
              (i % 2 || post_small(c, h, i, true));
    if (!ok) {
      c->failed_before += before && c->why[0];
      break;
    }
    atomic_fetch_add(c->done, 1);
  }
  http_handle_free(h);
  return NULL;
}

static void run_clients(client *cs, pthread_t *th, atomic_bool *stop, atomic_int *done,
                        atomic_bool *signaled) {
  pthread_barrier_t *bar = malloc(sizeof *bar);
  pthread_barrier_init(bar, NULL, CLIENTS);
  for (int i = 0; i < CLIENTS; i++) {
    cs[i] = (client){.id = i, .bar = bar, .stop = stop, .done = done, .signaled = signaled};
    pthread_create(&th[i], NULL, client_run, &cs[i]);
  }
}

static void join_clients(client *cs, pthread_t *th) {
  for (int i = 0; i < CLIENTS; i++)
    pthread_join(th[i], NULL);
  pthread_barrier_destroy(cs[0].bar);
  free(cs[0].bar);
}

Test(http_threads, many_keep_alive_clients_counted_exactly) {
  srv_start(&S, "--http-threads", "4", NULL);
  http_res info;
  cr_assert_eq(http_get(&S, "/v1/info", &info), 0);
  cr_expect(strstr(info.body, "\"http_threads\": 4"), "/v1/info: %s", info.body);
  http_res_free(&info);
  double healthz0 = requests("/readyz", "200"), nf0 = requests("other", "404");
  double posts0 = requests("/attention", "200");
  const char *nfl[] = {"code=not_found", NULL};
  double nf_errors0 = srv_metric(&S, "attnd_errors_total", nfl);
  cr_assert(healthz0 >= 0 && nf0 >= 0 && posts0 >= 0 && nf_errors0 >= 0, "/metrics answers");

  client cs[CLIENTS];
  pthread_t th[CLIENTS];
  atomic_int done = 0;
  run_clients(cs, th, NULL, &done, NULL);
  join_clients(cs, th);
  for (int i = 0; i < CLIENTS; i++) {
    cr_expect(!cs[i].why[0], "client %d: %s", i, cs[i].why);
    cr_expect_eq(cs[i].healthz, ROUNDS, "client %d: readyz", i);
    cr_expect_eq(cs[i].not_found, ROUNDS, "client %d: 404s", i);
    cr_expect_eq(cs[i].posts, ROUNDS, "client %d: POSTs", i);
    cr_expect_eq(cs[i].uploads, ROUNDS / 2, "client %d: uploads", i);
  }

  /* A request is counted when it ends, which may come just after its reply
   * reached the client: wait for the counts, then hold them exact. */
  double n = CLIENTS * ROUNDS, ups = CLIENTS * (ROUNDS / 2);
  const char *hl[] = {"path=/readyz", "code=200", NULL};
  const char *pl[] = {"path=/attention", "code=200", NULL};
  cr_expect(srv_wait_metric_ge(&S, "attnd_requests_total", hl, healthz0 + n, 60));
  cr_expect(srv_wait_metric_ge(&S, "attnd_requests_total", pl, posts0 + n + ups, 60));
  cr_expect(srv_wait_metric_ge(&S, "attnd_errors_total", nfl, nf_errors0 + n, 60));
  cr_expect_eq(requests("/readyz", "200"), healthz0 + n, "GET /readyz counted once each");
  cr_expect_eq(requests("other", "404"), nf0 + n, "404s counted once each");
  cr_expect_eq(requests("/attention", "200"), posts0 + n + ups, "POSTs counted once each");
  cr_expect_eq(srv_metric(&S, "attnd_errors_total", nfl), nf_errors0 + n, "not_found by code");
  cr_expect(srv_wait_metric_le(&S, "attnd_uploads", NULL, 0, 60), "no upload left open");
  cr_expect(srv_wait_metric_le(&S, "attnd_inflight", NULL, 0, 60), "no job left running");
  cr_expect_eq(srv_stop(&S, 60), 0, "exit status after SIGTERM");
}

Test(http_threads, drain_while_busy) {
  srv_start(&S, "--http-threads", "4", NULL);
  client cs[CLIENTS];
  pthread_t th[CLIENTS];
  atomic_int done = 0;
  atomic_bool stop = false, signaled = false;
  run_clients(cs, th, &stop, &done, &signaled);
  /* busy: every client has finished a round and is on its next */
  for (double end = now_s() + 120; atomic_load(&done) < CLIENTS && now_s() < end;)
    sleep_s(0.01);
  cr_expect_geq(atomic_load(&done), CLIENTS, "the clients got going");
  atomic_store(&signaled, true);
  kill(S.pid, SIGTERM);
  int st = srv_wait(&S, 120);
  atomic_store(&stop, true);
  join_clients(cs, th);
  cr_expect_eq(st, 0, "exit status %d after SIGTERM with clients busy (-1: still running)", st);
  int posts = 0;
  for (int i = 0; i < CLIENTS; i++) {
    cr_expect_eq(cs[i].failed_before, 0, "client %d failed before SIGTERM: %s", i, cs[i].why);
    /* after SIGTERM: replies, 503 shutting_down, or the connection closed */
    cr_expect(!cs[i].why[0], "client %d: %s", i, cs[i].why);
    posts += cs[i].posts;
  }
  cr_expect_geq(posts, CLIENTS, "POSTs answered (and checked) before the drain");
}
