/*
 * test_session_fork.c — POST /v1/sessions/{id}/fork through the real
 * attnd: 201 with the new session as GET describes it, sharing its
 * source's pages (shared_bytes in GET, the list, /v1/info and /metrics);
 * the two then decode their own tokens, each reply equal to the float64
 * reference over exactly that session's history; deleting either leaves
 * the other intact; 409 session_exists, 404 for an unknown source and for
 * another API key's, 422 for a bad body, id, length or ttl_s, 507 when the
 * reservation does not fit.
 *
 * Sessions here have one layer, one KV head, head_dim 2, F32: a page of K
 * and one of V (128 KiB) hold the first 8192 tokens, so every fork here
 * shares one partial page pair and reserves its whole max_tokens.
 */
#include "harness.h"
#include "proto.h"

#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static srv S;
static void teardown(void) {
  srv_cleanup(&S);
  remove_tmpdir();
}
TestSuite(session_fork, .fini = teardown, .timeout = 120);

#define JSON_CT "Content-Type: application/json"
#define KEY_A "alice-key-0123456789"
#define KEY_B "bob-key-9876543210"

static const char *const HNONE[] = {JSON_CT, NULL};
static const char *const HA[] = {"Authorization: Bearer " KEY_A, JSON_CT, NULL};
static const char *const HB[] = {"Authorization: Bearer " KEY_B, JSON_CT, NULL};
static const char *const *H = HNONE;
#define PAIR_BYTES (128 << 10)
#define SHAPE "\"heads_kv\": 1, \"head_dim\": 2, \"dtype\": \"F32\", \"max_tokens\": 100"

/* A session's history: the source's tokens below `at`, then branch b's. */
typedef struct history {
  int b;
  int64_t at;
} history;

/* Token t's q, k or v (which), column c, in history h. */
static float tok(history h, int64_t t, int which, int c) {
  const double phase = t < h.at ? 0 : 0.9 * h.b;
  return (float)sin(0.7 * (double)t + 1.3 * which + 0.4 * c + phase);
}

static void tensor_json(attn_sbuf *b, const char *name, history h, int which, int64_t t0,
                        int64_t n) {
  attn_sbuf_printf(b, "\"%s\": {\"shape\": [1, %lld, 2], \"dtype\": \"F32\", \"data\": [", name,
                   (long long)n);
  for (int64_t i = 0; i < n; i++)
    attn_sbuf_printf(b, "%s%.9g,%.9g", i ? "," : "", (double)tok(h, t0 + i, which, 0),
                     (double)tok(h, t0 + i, which, 1));
  attn_sbuf_puts(b, "]}");
}

static long post(const char *id, const char *what, const char *body, http_res *r) {
  char path[96];
  snprintf(path, sizeof path, "/v1/sessions/%s/%s", id, what);
  return http_call(&S, "POST", path, H, body, strlen(body), r);
}

/* The reply's o against the float64 reference of queries [pos, pos + n)
 * over keys [0, pos + n) of history h, causal. */
static void expect_reference(const http_res *r, history h, int64_t pos, int64_t n) {
  const int64_t nk = pos + n;
  float *q = malloc((size_t)n * 2 * sizeof *q), *k = malloc((size_t)nk * 2 * sizeof *k);
  float *v = malloc((size_t)nk * 2 * sizeof *v), *o = malloc((size_t)n * 2 * sizeof *o);
  double *want = malloc((size_t)n * 2 * sizeof *want);
  for (int64_t t = 0; t < nk; t++)
    for (int c = 0; c < 2; c++) {
      k[t * 2 + c] = tok(h, t, 1, c);
      v[t * 2 + c] = tok(h, t, 2, c);
      if (t >= pos)
        q[(t - pos) * 2 + c] = tok(h, t, 0, c);
    }
  attn_request rq;
  attn_request_init(&rq);
  rq.batch = rq.heads_q = rq.heads_kv = 1, rq.seq_q = n, rq.seq_kv = nk, rq.head_dim = 2;
  rq.dtype = ATTN_F32, rq.causal = true, rq.q = q, rq.k = k, rq.v = v, rq.o = o;
  attn_status st;
  cr_assert_eq(attn_reference(&rq, want, NULL, NULL, NULL, &st), 0, "%s", st.message);
  cJSON *j = cJSON_Parse(r->body);
  cJSON *data = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "o"), "data");
  cr_assert_eq(cJSON_GetArraySize(data), n * 2, "%.200s", r->body);
  double num = 0, den = 0;
  int i = 0;
  for (cJSON *x = data->child; x; x = x->next, i++) {
    num += (x->valuedouble - want[i]) * (x->valuedouble - want[i]);
    den += want[i] * want[i];
  }
  cr_expect(sqrt(num / den) < ttol(ATTN_F32), "relative error %g", sqrt(num / den));
  cJSON_Delete(j);
  free(q), free(k), free(v), free(o), free(want);
}

/* Tokens [pos, pos + n) of history h appended to id, checked. */
static void step(const char *id, history h, int64_t pos, int64_t n) {
  attn_sbuf b = {0};
  attn_sbuf_puts(&b, "{");
  tensor_json(&b, "q", h, 0, pos, n);
  attn_sbuf_puts(&b, ", ");
  tensor_json(&b, "k", h, 1, pos, n);
  attn_sbuf_puts(&b, ", ");
  tensor_json(&b, "v", h, 2, pos, n);
  attn_sbuf_printf(&b, ", \"pos\": %lld}", (long long)pos);
  http_res r;
  cr_assert_eq(post(id, "attention", b.p, &r), 200, "%s at %lld: %s", id, (long long)pos, r.body);
  free(b.p);
  expect_reference(&r, h, pos, n);
  http_res_free(&r);
}

static void create_ok(const char *id, const char *body) {
  char path[96];
  snprintf(path, sizeof path, "/v1/sessions/%s", id);
  http_res r;
  cr_assert_eq(http_call(&S, "PUT", path, H, body, strlen(body), &r), 201, "%s: %s", id, r.body);
  http_res_free(&r);
}

static cJSON *get_json(const char *path) {
  http_res r;
  http_call(&S, "GET", path, H, NULL, 0, &r);
  cr_assert_eq(r.status, 200, "%s: %s", path, r.body);
  cJSON *j = cJSON_Parse(r.body);
  http_res_free(&r);
  return j;
}

static double num(const cJSON *o, const char *k) {
  const cJSON *x = cJSON_GetObjectItem(o, k);
  cr_assert(cJSON_IsNumber(x), "no number %s", k);
  return x->valuedouble;
}

/* GET id: its reserved and shared bytes and tokens; its used bytes, the
 * one pair of pages its tokens fill (shared or not). */
static void expect_session(const char *id, double reserved, double shared, double tokens) {
  char path[96];
  snprintf(path, sizeof path, "/v1/sessions/%s", id);
  cJSON *j = get_json(path);
  cr_expect_eq(num(j, "reserved_bytes"), reserved, "%s reserved", id);
  cr_expect_eq(num(j, "shared_bytes"), shared, "%s shared", id);
  cr_expect_eq(num(j, "tokens"), tokens, "%s tokens", id);
  cr_expect_eq(num(j, "used_bytes"), tokens > 0 ? PAIR_BYTES : 0, "%s used", id);
  cJSON_Delete(j);
}

/* /v1/info's sessions.memory, the list's memory and /metrics agree on the
 * shared and saved bytes. */
static void expect_store(double reserved, double shared, double saved) {
  cJSON *j = get_json("/v1/info");
  cJSON *m = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "sessions"), "memory");
  cr_expect_eq(num(m, "reserved_bytes"), reserved, "/v1/info reserved");
  cr_expect_eq(num(m, "shared_bytes"), shared, "/v1/info shared");
  cr_expect_eq(num(m, "saved_bytes"), saved, "/v1/info saved");
  cJSON_Delete(j);
  j = get_json("/v1/sessions");
  m = cJSON_GetObjectItem(j, "memory");
  cr_expect_eq(num(m, "shared_bytes"), shared, "the list's shared");
  cJSON_Delete(j);
  cr_expect_eq(srv_metric(&S, "attnd_session_shared_bytes", NULL), shared, "/metrics shared");
}

/* A prompt, forked three ways (a beam), each branch decoding its own
 * tokens against its own history; the source and the branches share the
 * prompt's page until each first appends. */
Test(session_fork, beam_decodes_against_each_history) {
  srv_start(&S, "--session-memory", "4M", NULL);
  create_ok("p", "{" SHAPE "}");
  const history base = {0, 0};
  step("p", base, 0, 7);
  http_res r;
  cr_assert_eq(post("p", "fork", "{\"id\": \"b1\"}", &r), 201, "%s", r.body);
  cJSON *j = cJSON_Parse(r.body);
  cr_expect_eq(num(j, "tokens"), 7);
  cr_expect_eq(num(j, "shared_bytes"), PAIR_BYTES);
  cr_expect_eq(num(j, "max_tokens"), 100);
  cJSON_Delete(j);
  http_res_free(&r);
  cr_assert_eq(post("p", "fork", "{\"id\": \"b2\", \"ttl_s\": 30}", &r), 201, "%s", r.body);
  http_res_free(&r);
  cr_assert_eq(post("p", "fork", "{\"id\": \"b3\", \"length\": 4}", &r), 201, "%s", r.body);
  http_res_free(&r);
  expect_session("p", PAIR_BYTES, PAIR_BYTES, 7);
  expect_session("b3", PAIR_BYTES, PAIR_BYTES, 4);
  expect_store(4 * PAIR_BYTES, PAIR_BYTES, 3 * PAIR_BYTES);
  const history h1 = {1, 7}, h2 = {2, 7}, h3 = {3, 4};
  for (int64_t t = 0; t < 3; t++) {
    step("b1", h1, 7 + t, 1);
    step("b2", h2, 7 + t, 1);
    step("b3", h3, 4 + t, 1);
    step("p", base, 7 + t, 1);
  }
  expect_session("b1", PAIR_BYTES, 0, 10);
  expect_store(4 * PAIR_BYTES, 0, 0);
  cr_assert_eq(http_call(&S, "DELETE", "/v1/sessions/p", H, NULL, 0, &r), 204, "%s", r.body);
  http_res_free(&r);
  step("b1", h1, 10, 5); /* the source gone, its fork intact */
  j = get_json("/v1/sessions/b2");
  cr_expect_eq(num(j, "ttl_s"), 30);
  cJSON_Delete(j);
}

/* A fork of a fork, then the middle one deleted: the other two intact. */
Test(session_fork, delete_either_side) {
  srv_start(&S, "--session-memory", "4M", NULL);
  create_ok("s", "{" SHAPE "}");
  const history base = {0, 0}, hf = {1, 5};
  step("s", base, 0, 5);
  http_res r;
  cr_assert_eq(post("s", "fork", "{\"id\": \"f\"}", &r), 201, "%s", r.body);
  http_res_free(&r);
  step("f", hf, 5, 3);
  cr_assert_eq(post("f", "fork", "{\"id\": \"g\"}", &r), 201, "%s", r.body);
  http_res_free(&r);
  cr_assert_eq(http_call(&S, "DELETE", "/v1/sessions/f", H, NULL, 0, &r), 204, "%s", r.body);
  http_res_free(&r);
  step("s", base, 5, 4);
  step("g", hf, 8, 2); /* its history: f's, f gone */
  expect_store(2 * PAIR_BYTES, 0, 0);
}

Test(session_fork, refusals) {
  char keys[160];
  snprintf(keys, sizeof keys, "%s/keys", make_tmpdir());
  write_file(keys, "alice:" KEY_A "\n"
                   "bob:" KEY_B "\n");
  srv_start(&S, "--api-key-file", keys, "--session-memory", "1M", NULL);
  H = HA;
  create_ok("s", "{" SHAPE "}");
  step("s", (history){0, 0}, 0, 3);
  http_res r;
  cr_expect_eq(post("s", "fork", "{\"id\": \"s\"}", &r), 409, "%s", r.body);
  expect_error(&r, 409, "session_exists", "a fork into an id taken");
  http_res_free(&r);
  cr_expect_eq(post("nope", "fork", "{\"id\": \"f\"}", &r), 404, "%s", r.body);
  expect_error(&r, 404, "session_not_found", "a fork of no session");
  http_res_free(&r);
  H = HB;
  cr_expect_eq(post("s", "fork", "{\"id\": \"f\"}", &r), 404, "%s", r.body);
  expect_error(&r, 404, "session_not_found", "a fork of another key's session");
  http_res_free(&r);
  H = HA;
  static const char *const bad[] = {"{}",
                                    "{\"id\": \"_x\"}",
                                    "{\"id\": 5}",
                                    "{\"id\": \"f\", \"length\": 4}",
                                    "{\"id\": \"f\", \"length\": -1}",
                                    "{\"id\": \"f\", \"ttl_s\": 0.5}",
                                    "{\"id\": \"f\", \"layers\": 2}"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    cr_expect_eq(post("s", "fork", bad[i], &r), 422, "%s: %s", bad[i], r.body);
    http_res_free(&r);
  }
  cr_expect_eq(post("s", "fork", "{\"id\": \"f\", \"length\": 4}", &r), 422);
  cr_expect(strstr(r.body, "layer 0"), "%s", r.body);
  http_res_free(&r);
  cr_expect_eq(post("s", "fork", "", &r), 400, "%s", r.body);
  http_res_free(&r);
  /* 1M: 8 pairs, 4 for each key; s and three forks fill alice's share */
  for (int i = 0; i < 3; i++) {
    char body[32];
    snprintf(body, sizeof body, "{\"id\": \"f%d\"}", i);
    cr_assert_eq(post("s", "fork", body, &r), 201, "%s", r.body);
    http_res_free(&r);
  }
  cr_expect_eq(post("s", "fork", "{\"id\": \"f3\"}", &r), 507, "%s", r.body);
  expect_error(&r, 507, "session_memory_full", "a fork past the key's share");
  http_res_free(&r);
  H = HNONE;
}

/* attnd --session-page-bytes 16K: pages of 16 KiB (2048 tokens of this
 * shape), so a session and its fork reserve and share in that unit, GET
 * and /v1/info say so, and their decodes are right; a shape whose rows are
 * too wide for 16 to such a page is 422, naming the flag's value that
 * takes it; a page size the store cannot have stops attnd at start. */
Test(session_fork, small_pages) {
  const double pair = 2 * (16 << 10);
  srv_start(&S, "--session-memory", "4M", "--session-page-bytes", "16K", NULL);
  cJSON *j = get_json("/v1/info");
  cr_expect_eq(num(cJSON_GetObjectItem(j, "sessions"), "page_bytes"), 16 << 10);
  cJSON_Delete(j);
  create_ok("p", "{" SHAPE "}");
  const history base = {0, 0}, hf = {1, 9};
  step("p", base, 0, 9);
  http_res r;
  cr_assert_eq(post("p", "fork", "{\"id\": \"f\"}", &r), 201, "%s", r.body);
  http_res_free(&r);
  j = get_json("/v1/sessions/f");
  cr_expect_eq(num(j, "reserved_bytes"), pair);
  cr_expect_eq(num(j, "shared_bytes"), pair);
  cr_expect_eq(num(j, "used_bytes"), pair);
  cJSON_Delete(j);
  for (int64_t t = 9; t < 12; t++) {
    step("f", hf, t, 1);
    step("p", base, t, 1);
  }
  expect_store(2 * pair, 0, 0);
  const char *wide = "{\"heads_kv\": 1, \"head_dim\": 576, \"v_from_k\": 512, \"dtype\": "
                     "\"BF16\", \"max_tokens\": 64}";
  cr_expect_eq(http_call(&S, "PUT", "/v1/sessions/mla", H, wide, strlen(wide), &r), 422, "%s",
               r.body);
  expect_error(&r, 422, "unsupported", "rows too wide for the page");
  cr_expect(strstr(r.body, "1152 bytes") && strstr(r.body, "16384 bytes") &&
                strstr(r.body, "--session-page-bytes 32K"),
            "%s", r.body);
  http_res_free(&r);
  srv_cleanup(&S);
  static const char *const bad[] = {"20K", "0", "1M", "8K", "lots"};
  for (int i = 0; i < 5; i++) {
    const char *argv[] = {"--session-page-bytes", bad[i], NULL};
    char *err = NULL;
    cr_expect_eq(run_attnd(argv, NULL, 30, NULL, &err), 2, "%s", bad[i]);
    cr_expect(err && strstr(err, "--session-page-bytes expects 16K, 32K or 64K"), "%s: %s", bad[i],
              err ? err : "");
    free(err);
  }
}
