/*
 * test_session_sched.c — session calls under concurrent and hostile use,
 * through the real attnd: a batch over sessions of other shapes is refused,
 * a call never waits for another session's work, a job of several calls
 * ends at its callers' deadline, calls waiting for a layer's readers hold no
 * shared thread, a GET is not held behind another session's append, an
 * empty layer is the same refusal alone and batched, and a small step is
 * computed on the HTTP thread unless another call holds its layer.
 *
 * The server is build/tests/attnd-hold: its cpu jobs whose first query
 * element is HELD_Q0 wait for the test (tests/lib/hold_backend.c), and so do
 * page copies of HELD_ROWS rows, so every "still running" here is an event
 * the test controls, whatever the machine's speed. Every answer is checked
 * against a float64 reference computed here.
 */
#include "harness.h"

#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static srv S;
static hold_gate G;
static void teardown(void) {
  if (G.path[0])
    hold_release(&G);
  srv_cleanup(&S);
  if (G.path[0])
    hold_gate_free(&G);
}
TestSuite(session_sched, .fini = teardown, .timeout = 240);

#define D 4
#define MAXT 1024
#define HELD_Q0 "1234.5"
#define HELD_ROWS 1000
#define WAIT_MS 30000 /* a bound on a wait for an event, never a measure */

/* A session's keys and values as the test sent them, [hkv][n][D]. */
typedef struct sess {
  const char *id;
  int hkv, n;
  float k[2][MAXT][D], v[2][MAXT][D];
} sess;

static uint64_t seed = 88172645463325252ull;
static float rnd(void) {
  seed ^= seed << 13;
  seed ^= seed >> 7;
  seed ^= seed << 17;
  return (float)((double)(seed >> 11) / 9007199254740992.0 * 2 - 1);
}

/* Starts attnd-hold with the gate (gated: held jobs wait for its file) and
 * env entries, plus args; --tiny-flops 0 unless they give it: a held call
 * stands for a long job, which never runs on the HTTP thread. */
static void start(bool gated, const char *const *args, const char *const *env) {
  const char *a[16] = {"--tiny-flops", "0"};
  int na = 2;
  for (int i = 0; args && args[i]; i++)
    if (!strcmp(args[i], "--tiny-flops"))
      na = 0; /* theirs, written over the first two places */
  for (int i = 0; args && args[i] && na < 15; i++)
    a[na++] = args[i];
  args = a;
  hold_gate_init(&G);
  const char *e[8] = {0};
  int n = 0;
  if (gated)
    e[n++] = G.env;
  e[n++] = "ATTN_HOLD_CPU_Q0=" HELD_Q0;
  e[n++] = "ATTN_HOLD_MAX_S=600";
  for (int i = 0; env && env[i] && n < 7; i++)
    e[n++] = env[i];
  S.bin = srv_hold_bin();
  srv_startv(&S, args, e, true);
}

static bool exists(const char *path) { return access(path, F_OK) == 0; }

/* Whether a held job or copy began waiting (its mark, tests/lib/hold_backend.c)
 * within WAIT_MS. */
static bool held_started(void) {
  char mark[sizeof G.path + 8];
  snprintf(mark, sizeof mark, "%s.held", G.path);
  double t0 = now_s();
  while (!exists(mark) && now_s() - t0 < WAIT_MS / 1000)
    sleep_s(0.01);
  return exists(mark);
}

static const char *JSON_H[] = {"Content-Type: application/json", NULL};

static void make(sess *s, const char *id, int hkv) {
  memset(s, 0, sizeof *s);
  s->id = id;
  s->hkv = hkv;
  char path[100], body[200];
  snprintf(path, sizeof path, "/v1/sessions/%s", id);
  snprintf(body, sizeof body,
           "{\"heads_kv\": %d, \"head_dim\": %d, \"dtype\": \"F32\", \"max_tokens\": %d}", hkv, D,
           MAXT);
  http_res r = {0};
  cr_assert_eq(http_call(&S, "PUT", path, JSON_H, body, strlen(body), &r), 201, "create %s: %s", id,
               r.body);
  http_res_free(&r);
}

static void put_rows(char **p, const float (*rows)[D], int n) {
  *p += sprintf(*p, "[");
  for (int i = 0; i < n; i++) {
    *p += sprintf(*p, "%s[", i ? "," : "");
    for (int c = 0; c < D; c++)
      *p += sprintf(*p, "%s%.9g", c ? "," : "", rows[i][c]);
    *p += sprintf(*p, "]");
  }
  *p += sprintf(*p, "]");
}

/* q [hq, 1, D] as JSON; q[0][0] HELD_Q0 when held. */
static void put_q(char **p, float q[][D], int hq, bool held) {
  for (int h = 0; h < hq; h++)
    for (int c = 0; c < D; c++)
      q[h][c] = rnd();
  if (held)
    q[0][0] = (float)atof(HELD_Q0);
  *p += sprintf(*p, "\"q\": [");
  for (int h = 0; h < hq; h++) {
    *p += sprintf(*p, "%s", h ? "," : "");
    put_rows(p, (const float(*)[D]) & q[h], 1);
  }
  *p += sprintf(*p, "]");
}

/* A call's body: q [hq, 1, D], and n new tokens of s (random, recorded in
 * s at s->n onwards, s->n unchanged) when n > 0. */
static char *call_body(sess *s, float q[][D], int hq, int n, bool held) {
  char *b = malloc(64 + (size_t)(hq + 2 * s->hkv * n + 2) * D * 20), *p = b;
  p += sprintf(p, "{");
  put_q(&p, q, hq, held);
  for (int t = 0; t < 2 && n > 0; t++) {
    p += sprintf(p, ", \"%c\": [", t ? 'v' : 'k');
    for (int h = 0; h < s->hkv; h++) {
      float(*rows)[D] = t ? s->v[h] + s->n : s->k[h] + s->n;
      for (int i = 0; i < n; i++)
        for (int c = 0; c < D; c++)
          rows[i][c] = rnd();
      p += sprintf(p, "%s", h ? "," : "");
      put_rows(&p, (const float(*)[D])rows, n);
    }
    p += sprintf(p, "]");
  }
  if (n > 0)
    p += sprintf(p, ", \"pos\": %d", s->n);
  sprintf(p, "}");
  return b;
}

/* The float64 answer of one query a head over keys [0, n) of s. */
static void reference(const sess *s, float q[][D], int hq, int n, double *o) {
  for (int h = 0; h < hq; h++) {
    int g = h / (hq / s->hkv);
    double sc[MAXT], mx = -INFINITY, sum = 0;
    for (int j = 0; j < n; j++) {
      sc[j] = 0;
      for (int c = 0; c < D; c++)
        sc[j] += (double)q[h][c] * s->k[g][j][c];
      sc[j] /= sqrt((double)D);
      mx = fmax(mx, sc[j]);
    }
    for (int c = 0; c < D; c++)
      o[h * D + c] = 0;
    for (int j = 0; j < n; j++) {
      double w = exp(sc[j] - mx);
      sum += w;
      for (int c = 0; c < D; c++)
        o[h * D + c] += w * s->v[g][j][c];
    }
    for (int c = 0; c < D; c++)
      o[h * D + c] /= sum;
  }
}

/* Whether reply body's o (first rows values) matches want within 1e-5. */
static bool o_matches(const char *body, const double *want, int rows, const char *what) {
  cJSON *j = cJSON_Parse(body);
  const cJSON *d = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "o"), "data");
  bool ok = cJSON_GetArraySize(d) == rows * D;
  for (int i = 0; ok && i < rows * D; i++)
    ok = fabs(cJSON_GetArrayItem(d, i)->valuedouble - want[i]) <= 1e-5 * (1 + fabs(want[i]));
  cr_expect(ok, "%s: o is not the float64 reference: %s", what, body);
  cJSON_Delete(j);
  return ok;
}

static char *attend_path(const sess *s) {
  static char path[2][120];
  static int k;
  k ^= 1;
  snprintf(path[k], sizeof path[k], "/v1/sessions/%s/attention", s->id);
  return path[k];
}

/* A call on its own connection, sent and not awaited: the socket. */
static int send_call(const char *path, const char *body) {
  int fd = raw_connect(S.port);
  cr_assert_geq(fd, 0);
  char head[300];
  snprintf(head, sizeof head,
           "POST %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"
           "Content-Length: %zu\r\nConnection: close\r\n\r\n",
           path, S.port, strlen(body));
  cr_assert_eq(raw_sends(fd, head), 0);
  cr_assert_eq(raw_sends(fd, body), 0);
  return fd;
}

/* n new tokens appended to s at s->n and attended by one query a KV head,
 * checked; s->n grows. */
static void append(sess *s, int n) {
  float q[8][D];
  char *b = call_body(s, q, s->hkv, n, false);
  http_res r = {0};
  http_req rq = {.method = "POST",
                 .path = attend_path(s),
                 .headers = JSON_H,
                 .body = b,
                 .len = strlen(b),
                 .timeout_ms = WAIT_MS};
  http_do(&S, &rq, &r);
  cr_assert_eq(r.status, 200, "append to %s: %ld %s", s->id, r.status, r.body);
  s->n += n;
  double want[8 * D];
  reference(s, q, s->hkv, s->n, want);
  o_matches(r.body, want, s->hkv, s->id);
  http_res_free(&r);
  free(b);
}

/* ---- 1. one batch, sessions of other heads_kv ----------------------------- */

static long batch_query(const sess *a, const sess *b, http_res *r) {
  char body[2000], *p = body;
  float q[4][D];
  p += sprintf(p, "{\"sessions\": [\"%s\", \"%s\"], \"cu_seqlens_q\": [0, 1, 2], \"q\": [", a->id,
               b->id);
  for (int h = 0; h < 2; h++) {
    for (int i = 0; i < 2; i++)
      for (int c = 0; c < D; c++)
        q[h * 2 + i][c] = rnd();
    p += sprintf(p, "%s", h ? "," : "");
    put_rows(&p, (const float(*)[D]) & q[h * 2], 2);
  }
  sprintf(p, "]}");
  return http_call(&S, "POST", "/v1/sessions/_batch", JSON_H, body, strlen(body), r);
}

Test(session_sched, a_batch_over_sessions_of_other_heads_kv_is_refused) {
  start(false, NULL, NULL);
  static sess a, b;
  make(&a, "two-heads", 2);
  make(&b, "one-head", 1);
  append(&a, 3);
  append(&b, 3);
  for (int order = 0; order < 2; order++) {
    http_res r = {0};
    batch_query(order ? &b : &a, order ? &a : &b, &r);
    if (expect_error(&r, 422, "invalid_shape", "a batch of heads_kv 2 and 1"))
      cr_expect(strstr(r.body, "heads_kv"), "the message names heads_kv: %s", r.body);
    http_res_free(&r);
  }
  cr_expect(expect_healthy(&S, "mixed batches"));
}

/* ---- 2. other sessions' calls never wait --------------------------------- */

Test(session_sched, a_call_never_waits_for_another_sessions_job) {
  const char *args[] = {"--session-batch", "on", NULL};
  start(true, args, NULL);
  static sess h, a, b;
  make(&h, "held", 1);
  make(&a, "mine-a", 2);
  make(&b, "mine-b", 1);
  append(&h, 4);
  append(&a, 3);
  append(&b, 5);
  float hq[2][D], qa[2][D], qb[2][D];
  char *hb = call_body(&h, hq, 1, 0, true);
  int held = send_call(attend_path(&h), hb);
  cr_assert(srv_wait_jobs(&S, 1, true, WAIT_MS / 1000), "the held call never started");
  /* query-only calls of two other sessions (heads_kv 2 and 1, the same
   * options): answered while the held job runs, each right */
  char *ab = call_body(&a, qa, 2, 0, false), *bb = call_body(&b, qb, 2, 0, false);
  int fa = send_call(attend_path(&a), ab), fb = send_call(attend_path(&b), bb);
  http_res ra = {0}, rb = {0};
  cr_expect_eq(raw_response(fa, WAIT_MS, &ra), 200, "a query of another session waited: %s",
               ra.body ? ra.body : "no reply");
  cr_expect_eq(raw_response(fb, WAIT_MS, &rb), 200, "a query of another session waited: %s",
               rb.body ? rb.body : "no reply");
  double want[2 * D];
  if (ra.status == 200) {
    reference(&a, qa, 2, a.n, want);
    o_matches(ra.body, want, 2, "heads_kv 2");
  }
  if (rb.status == 200) {
    reference(&b, qb, 2, b.n, want);
    o_matches(rb.body, want, 2, "heads_kv 1");
  }
  append(&a, 1); /* a decode step, too */
  cr_expect_geq(srv_jobs(&S), 1, "the held call ended early");
  hold_release(&G);
  http_res rh = {0};
  cr_expect_eq(raw_response(held, WAIT_MS, &rh), 200);
  double wh[D];
  if (rh.status == 200) {
    reference(&h, hq, 1, h.n, wh);
    o_matches(rh.body, wh, 1, "the held call");
  }
  http_res_free(&ra), http_res_free(&rb), http_res_free(&rh);
  close(fa), close(fb), close(held);
  free(hb), free(ab), free(bb);
}

/* Calls queued behind a held job of their layer run together once it ends,
 * each answered as alone. */
Test(session_sched, calls_behind_one_layers_job_are_batched_and_right) {
  const char *args[] = {"--session-batch", "on", NULL};
  start(true, args, NULL);
  static sess h;
  make(&h, "busy", 2);
  append(&h, 6);
  float q0[2][D], q[3][4][D];
  char *b0 = call_body(&h, q0, 2, 0, true), *b[3];
  int f0 = send_call(attend_path(&h), b0), f[3];
  cr_assert(srv_wait_jobs(&S, 1, true, WAIT_MS / 1000));
  for (int i = 0; i < 3; i++) {
    b[i] = call_body(&h, q[i], i == 1 ? 2 : 4, 0, false); /* two sets of options */
    f[i] = send_call(attend_path(&h), b[i]);
  }
  cr_assert(srv_wait_metric_ge(&S, "attnd_session_calls_waiting", NULL, 3, WAIT_MS / 1000),
            "the three calls never waited for the held one");
  hold_release(&G);
  http_res r0 = {0};
  cr_expect_eq(raw_response(f0, WAIT_MS, &r0), 200);
  for (int i = 0; i < 3; i++) {
    http_res r = {0};
    cr_expect_eq(raw_response(f[i], WAIT_MS, &r), 200, "call %d: %s", i, r.body);
    double want[4 * D];
    reference(&h, q[i], i == 1 ? 2 : 4, h.n, want);
    if (r.status == 200)
      o_matches(r.body, want, i == 1 ? 2 : 4, "a batched call");
    http_res_free(&r);
    close(f[i]);
    free(b[i]);
  }
  const char *two[] = {"le=2", NULL}, *one[] = {"le=1", NULL};
  cr_expect_geq(srv_metric(&S, "attnd_session_batch_size_bucket", two) -
                    srv_metric(&S, "attnd_session_batch_size_bucket", one),
                1, "the two calls of the same options ran as one job");
  http_res_free(&r0);
  close(f0);
  free(b0);
}

/* ---- 3. a batch of calls ends at its callers' deadline --------------------- */

Test(session_sched, a_job_of_several_calls_ends_at_its_callers_deadline) {
  const char *args[] = {"--session-batch", "on", "--timeout", "3", NULL};
  start(false, args, NULL); /* held jobs end when canceled */
  static sess h;
  make(&h, "slow", 1);
  append(&h, 4);
  float q[3][1][D];
  char *b[3];
  int f[3];
  b[0] = call_body(&h, q[0], 1, 0, true);
  f[0] = send_call(attend_path(&h), b[0]);
  cr_assert(srv_wait_jobs(&S, 1, true, WAIT_MS / 1000));
  sleep_s(1.5); /* their deadlines after the first's: they start as one job */
  for (int i = 1; i < 3; i++) {
    b[i] = call_body(&h, q[i], 1, 0, true);
    f[i] = send_call(attend_path(&h), b[i]);
  }
  for (int i = 0; i < 3; i++) {
    http_res r = {0};
    raw_response(f[i], WAIT_MS, &r);
    expect_error(&r, 504, "timeout", "a held session call");
    http_res_free(&r);
    close(f[i]);
    free(b[i]);
  }
  cr_expect(srv_wait_jobs(&S, 0, false, WAIT_MS / 1000),
            "a job whose callers all gave up still runs: %d jobs", srv_jobs(&S));
  append(&h, 1); /* the layer is free */
}

/* ---- 4. calls that wait for readers hold no shared thread ----------------- */

Test(session_sched, appends_waiting_for_readers_hold_no_shared_thread) {
  start(true, NULL, NULL);
  static sess h;
  make(&h, "rewound", 1);
  append(&h, 10);
  float hq[1][D];
  char *hb = call_body(&h, hq, 1, 0, true);
  int held = send_call(attend_path(&h), hb); /* reads tokens [0, 10) */
  cr_assert(srv_wait_jobs(&S, 1, true, WAIT_MS / 1000));
  http_res r = {0};
  cr_assert_eq(
      http_call(&S, "POST", "/v1/sessions/rewound/truncate", JSON_H, "{\"length\": 5}", 13, &r),
      200, "%s", r.body);
  http_res_free(&r);
  h.n = 5;
  /* six calls appending the same token at 5: they must wait for the
   * reader, and none may hold a thread the server shares */
  enum { N = 6 };
  float q[N][1][D];
  char *b[N];
  int f[N];
  char *first = call_body(&h, q[0], 1, 1, false);
  for (int i = 0; i < N; i++) {
    b[i] = strdup(first);
    f[i] = send_call(attend_path(&h), b[i]);
  }
  cr_assert(srv_wait_jobs(&S, 1 + N, true, WAIT_MS / 1000));
  /* varlen: never the HTTP thread's tiny path, so it needs the shared pool */
  char *sb = "{\"q\": [[[1, 0, 0, 0]]], \"k\": [[[1, 0, 0, 0], [0, 1, 0, 0]]], "
             "\"v\": [[[1, 2, 3, 4], [5, 6, 7, 8]]], \"cu_seqlens_q\": [0, 1], "
             "\"cu_seqlens_kv\": [0, 2]}";
  http_req rq = {.method = "POST",
                 .path = "/attention",
                 .headers = JSON_H,
                 .body = sb,
                 .len = strlen(sb),
                 .timeout_ms = WAIT_MS};
  http_do(&S, &rq, &r);
  cr_expect_eq(r.status, 200, "a stateless call waited behind the session's: %s",
               r.body ? r.body : r.error);
  http_res_free(&r);
  hold_release(&G);
  int fresh = 0;
  for (int i = 0; i < N; i++) {
    http_res y = {0};
    cr_expect_eq(raw_response(f[i], WAIT_MS, &y), 200, "append %d: %s", i, y.body);
    fresh += y.body && strstr(y.body, "\"replay\": false") != NULL;
    http_res_free(&y);
    close(f[i]);
    free(b[i]);
  }
  cr_expect_eq(fresh, 1, "one append, the others its replays");
  http_res y = {0};
  cr_expect_eq(raw_response(held, WAIT_MS, &y), 200);
  http_res_free(&y);
  close(held);
  free(hb);
  free(first);
}

/* ---- 5. a GET is not held behind another session's append ---------------- */

Test(session_sched, a_get_is_not_held_behind_another_sessions_append) {
  char rows[40];
  snprintf(rows, sizeof rows, "ATTN_HOLD_COPY_ROWS=%d", HELD_ROWS);
  const char *env[] = {rows, NULL};
  start(true, NULL, env);
  static sess big, other;
  make(&big, "big", 1);
  make(&other, "other", 1);
  append(&other, 2);
  float q[1][D];
  char *b = call_body(&big, q, 1, HELD_ROWS, false);
  int f = send_call(attend_path(&big), b);
  cr_assert(held_started(), "the append's copy never started");
  http_res r = {0};
  http_req rq = {.path = "/v1/sessions/other", .timeout_ms = WAIT_MS};
  http_do(&S, &rq, &r);
  cr_expect_eq(r.status, 200, "GET of another session waited for the append: %s",
               r.body ? r.body : r.error);
  http_res_free(&r);
  rq.path = "/v1/sessions";
  http_do(&S, &rq, &r);
  cr_expect_eq(r.status, 200, "the list waited for the append");
  http_res_free(&r);
  hold_release(&G);
  cr_expect_eq(raw_response(f, WAIT_MS, &r), 200, "%s", r.body);
  big.n = HELD_ROWS;
  double want[D];
  reference(&big, q, 1, big.n, want);
  if (r.status == 200)
    o_matches(r.body, want, 1, "the held append");
  http_res_free(&r);
  close(f);
  free(b);
}

/* ---- 6. an empty layer ------------------------------------------------------ */

Test(session_sched, an_empty_layer_is_one_refusal_alone_and_batched) {
  start(false, NULL, NULL);
  static sess e, full;
  make(&e, "empty", 1);
  make(&full, "full", 1);
  append(&full, 2);
  float q[2][D];
  char *b = call_body(&e, q, 1, 0, false);
  http_res r = {0};
  http_call(&S, "POST", attend_path(&e), JSON_H, b, strlen(b), &r);
  if (expect_error(&r, 422, "invalid_request", "a query of an empty layer"))
    cr_expect(strstr(r.body, "no tokens") && !strstr(r.body, "seq_kv"), "%s", r.body);
  http_res_free(&r);
  batch_query(&full, &e, &r);
  if (expect_error(&r, 422, "invalid_request", "a batch with an empty layer"))
    cr_expect(strstr(r.body, "sessions[1]") && strstr(r.body, "no tokens"), "%s", r.body);
  http_res_free(&r);
  free(b);
}

/* ---- 7. small steps on the HTTP thread -------------------------------------- */

/* With --tiny-flops 25000 (a call counts its FLOPs plus 16384 an entry): a
 * decode step of another session is computed on
 * the HTTP thread while a held (larger) call reads its layer; a small step
 * on the held layer is not: it waits for that call, in order, and both are
 * right once it ends. */
Test(session_sched, a_small_step_runs_here_unless_its_layer_is_held) {
  const char *args[] = {"--session-batch", "on", "--tiny-flops", "25000", NULL};
  start(true, args, NULL);
  static sess h, o;
  make(&h, "held", 1);
  make(&o, "other", 1);
  append(&h, 100);
  append(&o, 3);
  const char *name = "attnd_jobs_on_http_thread_total";
  double here0 = srv_metric(&S, name, NULL);
  cr_expect_geq(here0, 2, "the small appends did not run on the HTTP thread");
  float hq[8][D], sq[1][D];
  char *hb = call_body(&h, hq, 8, 0, true); /* 4 x 8 x 100 x 4 + 16384: queued */
  int held = send_call(attend_path(&h), hb);
  cr_assert(held_started(), "the held call never started");
  char *sb = call_body(&h, sq, 1, 1, false); /* 1616 + 16384, on the held layer */
  int step = send_call(attend_path(&h), sb);
  cr_assert(srv_wait_metric_ge(&S, "attnd_session_calls_waiting", NULL, 1, WAIT_MS / 1000),
            "the step on the held layer never waited for it");
  append(&o, 1);
  append(&o, 1);
  cr_expect_eq(srv_metric(&S, name, NULL), here0 + 2, "the other session's steps ran elsewhere");
  cr_expect_geq(srv_jobs(&S), 1, "the held call ended early");
  hold_release(&G);
  http_res rh = {0}, rs = {0};
  double want[8 * D];
  cr_expect_eq(raw_response(held, WAIT_MS, &rh), 200, "%s", rh.body ? rh.body : "no reply");
  if (rh.status == 200 && (reference(&h, hq, 8, h.n, want), true))
    o_matches(rh.body, want, 8, "the held call");
  cr_expect_eq(raw_response(step, WAIT_MS, &rs), 200, "%s", rs.body ? rs.body : "no reply");
  if (rs.status == 200 && (reference(&h, sq, 1, h.n + 1, want), true))
    o_matches(rs.body, want, 1, "the step behind it");
  http_res_free(&rh), http_res_free(&rs);
  close(held), close(step);
  free(hb), free(sb);
}
