/*
 * test_session_grow.c — sessions of "reserve": "grow" through the real
 * attnd: GET and the list show the mode and what the session holds now;
 * an append the memory cannot hold is 507 session_memory_full with
 * nothing appended, and goes through once a whole session is deleted, its
 * output then equal to the float64 reference over exactly the session's
 * keys; a retried create with the other reserve is 409; a bad reserve 422;
 * and under API keys a grow session's pages count against its key's share
 * as it takes them.
 *
 * Sessions here have one layer, one KV head, head_dim 2, F32: a page of K
 * and one of V (128 KiB) hold the first 8192 tokens. Under
 * --session-memory 2M the pool holds 16 such pairs.
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
TestSuite(session_grow, .fini = teardown, .timeout = 120);

#define JSON_CT "Content-Type: application/json"
#define KEY_A "alice-key-0123456789"
#define KEY_B "bob-key-9876543210"

static const char *const HNONE[] = {JSON_CT, NULL};
static const char *const HA[] = {"Authorization: Bearer " KEY_A, JSON_CT, NULL};
static const char *const HB[] = {"Authorization: Bearer " KEY_B, JSON_CT, NULL};
/* The headers of the calls that follow (an API key's, or none). */
static const char *const *H = HNONE;
#define PAIR_BYTES (128 << 10)
#define SHAPE "\"heads_kv\": 1, \"head_dim\": 2, \"dtype\": \"F32\", \"max_tokens\": 100"

static long put(const char *id, const char *body, http_res *r) {
  char path[96];
  snprintf(path, sizeof path, "/v1/sessions/%s", id);
  return http_call(&S, "PUT", path, H, body, strlen(body), r);
}

static void create_ok(const char *id, const char *body) {
  http_res r;
  cr_assert_eq(put(id, body, &r), 201, "create %s: %ld %s", id, r.status, r.body);
  http_res_free(&r);
}

/* Token t's q, k and v: two elements each, none alike. */
static float tok(int64_t t, int which, int c) {
  return (float)sin(0.7 * (double)t + 1.3 * which + 0.4 * c);
}

/* [1, n, 2] of rows [t0, t0 + n) of which, as JSON. */
static void tensor_json(attn_sbuf *b, const char *name, int which, int64_t t0, int64_t n) {
  attn_sbuf_printf(b, "\"%s\": {\"shape\": [1, %lld, 2], \"dtype\": \"F32\", \"data\": [", name,
                   (long long)n);
  for (int64_t i = 0; i < n; i++)
    attn_sbuf_printf(b, "%s%.9g,%.9g", i ? "," : "", (double)tok(t0 + i, which, 0),
                     (double)tok(t0 + i, which, 1));
  attn_sbuf_puts(b, "]}");
}

/* Tokens [pos, pos + n) appended to id, their queries attending. */
static long append(const char *id, int64_t pos, int64_t n, http_res *r) {
  attn_sbuf b = {0};
  attn_sbuf_puts(&b, "{");
  tensor_json(&b, "q", 0, pos, n);
  attn_sbuf_puts(&b, ", ");
  tensor_json(&b, "k", 1, pos, n);
  attn_sbuf_puts(&b, ", ");
  tensor_json(&b, "v", 2, pos, n);
  attn_sbuf_printf(&b, ", \"pos\": %lld}", (long long)pos);
  char path[96];
  snprintf(path, sizeof path, "/v1/sessions/%s/attention", id);
  long st = http_call(&S, "POST", path, H, b.p, b.len, r);
  free(b.p);
  return st;
}

/* The reply's o against the float64 reference of queries [pos, pos + n)
 * over keys [0, pos + n), causal. */
static void expect_reference(const http_res *r, int64_t pos, int64_t n) {
  const int64_t nk = pos + n;
  float *q = malloc((size_t)n * 2 * sizeof *q), *k = malloc((size_t)nk * 2 * sizeof *k);
  float *v = malloc((size_t)nk * 2 * sizeof *v), *o = malloc((size_t)n * 2 * sizeof *o);
  double *want = malloc((size_t)n * 2 * sizeof *want);
  for (int64_t t = 0; t < nk; t++)
    for (int c = 0; c < 2; c++) {
      k[t * 2 + c] = tok(t, 1, c);
      v[t * 2 + c] = tok(t, 2, c);
      if (t >= pos)
        q[(t - pos) * 2 + c] = tok(t, 0, c);
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

/* GET id's body, parsed. */
static cJSON *get_json(const char *id) {
  char path[96];
  snprintf(path, sizeof path, "/v1/sessions/%s", id);
  http_res r;
  http_call(&S, "GET", path, H, NULL, 0, &r);
  cr_assert_eq(r.status, 200, "%s", r.body);
  cJSON *j = cJSON_Parse(r.body);
  http_res_free(&r);
  return j;
}

static void expect_info(const char *id, const char *reserve, double reserved, double tokens) {
  cJSON *j = get_json(id);
  cJSON *rs = cJSON_GetObjectItem(j, "reserve");
  cr_expect(cJSON_IsString(rs) && !strcmp(rs->valuestring, reserve), "%s: reserve", id);
  cr_expect_eq(cJSON_GetObjectItem(j, "reserved_bytes")->valuedouble, reserved, "%s", id);
  cr_expect_eq(cJSON_GetObjectItem(j, "tokens")->valuedouble, tokens, "%s", id);
  cJSON_Delete(j);
}

Test(session_grow, pages_as_tokens_arrive_and_507_when_full) {
  srv_start(&S, "--session-memory", "2M", NULL);
  create_ok("g", "{" SHAPE ", \"reserve\": \"grow\"}");
  expect_info("g", "grow", 0, 0);
  char id[32];
  for (int i = 0; i < 16; i++) { /* the whole pool, reserved by whole sessions */
    snprintf(id, sizeof id, "w%d", i);
    create_ok(id, "{" SHAPE "}");
  }
  expect_info("w0", "whole", PAIR_BYTES, 0);
  http_res r;
  cr_expect_eq(append("g", 0, 3, &r), 507, "%s", r.body);
  expect_error(&r, 507, "session_memory_full", "a grow session's append past the pool");
  cr_expect(strstr(r.body, "nothing was appended"), "%s", r.body);
  http_res_free(&r);
  expect_info("g", "grow", 0, 0);
  cr_expect_eq(append("w15", 0, 100, &r), 200, "a whole session is never refused: %s", r.body);
  expect_reference(&r, 0, 100);
  http_res_free(&r);
  cr_assert_eq(http_call(&S, "DELETE", "/v1/sessions/w3", NULL, NULL, 0, &r), 204, "%s", r.body);
  http_res_free(&r);
  cr_assert_eq(append("g", 0, 3, &r), 200, "%s", r.body);
  expect_reference(&r, 0, 3);
  http_res_free(&r);
  cr_assert_eq(append("g", 3, 4, &r), 200, "%s", r.body);
  expect_reference(&r, 3, 4);
  http_res_free(&r);
  expect_info("g", "grow", PAIR_BYTES, 7);
  /* the list shows the mode too */
  http_call(&S, "GET", "/v1/sessions", H, NULL, 0, &r);
  cr_assert_eq(r.status, 200);
  cr_expect(strstr(r.body, "\"reserve\": \"grow\"") && strstr(r.body, "\"reserve\": \"whole\""),
            "%.300s", r.body);
  http_res_free(&r);
}

Test(session_grow, retried_create_and_bad_reserve) {
  srv_start(&S, "--session-memory", "2M", NULL);
  create_ok("g", "{" SHAPE ", \"reserve\": \"grow\"}");
  http_res r;
  cr_expect_eq(put("g", "{" SHAPE ", \"reserve\": \"grow\"}", &r), 200, "%s", r.body);
  http_res_free(&r);
  cr_expect_eq(put("g", "{" SHAPE "}", &r), 409, "%s", r.body);
  expect_error(&r, 409, "session_exists", "a retried create with another reserve");
  cr_expect(strstr(r.body, "reserve grow"), "%s", r.body);
  http_res_free(&r);
  cr_expect_eq(put("h", "{" SHAPE ", \"reserve\": \"some\"}", &r), 422, "%s", r.body);
  cr_expect(strstr(r.body, "\\\"grow\\\""), "%s", r.body);
  http_res_free(&r);
}

/* Under two keys (each may reserve half the pool: 8 pairs), a grow
 * session's pages count against its key as they are taken: an append past
 * the key's share is 507 saying so, with nothing appended, while the other
 * key's appends go on. */
Test(session_grow, the_key_share_counts_pages_as_taken) {
  char keys[160];
  snprintf(keys, sizeof keys, "%s/keys", make_tmpdir());
  write_file(keys, "alice:" KEY_A "\n"
                   "bob:" KEY_B "\n");
  srv_start(&S, "--api-key-file", keys, "--session-memory", "2M", NULL);
  H = HA;
  char id[32];
  for (int i = 0; i < 7; i++) { /* 7 of alice's 8 pairs... */
    snprintf(id, sizeof id, "w%d", i);
    create_ok(id, "{" SHAPE "}");
  }
  create_ok("g", "{" SHAPE ", \"reserve\": \"grow\"}");
  create_ok("g2", "{" SHAPE ", \"reserve\": \"grow\"}");
  http_res r;
  cr_assert_eq(append("g", 0, 2, &r), 200, "%s", r.body); /* ...and g the last */
  expect_reference(&r, 0, 2);
  http_res_free(&r);
  cr_expect_eq(append("g2", 0, 1, &r), 507, "%s", r.body);
  expect_error(&r, 507, "session_memory_full", "an append past the key's share");
  cr_expect(strstr(r.body, "--session-memory-per-key") && strstr(r.body, "nothing was appended"),
            "%s", r.body);
  http_res_free(&r);
  expect_info("g2", "grow", 0, 0);
  H = HB;
  create_ok("g", "{" SHAPE ", \"reserve\": \"grow\"}");
  cr_expect_eq(append("g", 0, 5, &r), 200, "the other key goes on: %s", r.body);
  expect_reference(&r, 0, 5);
  http_res_free(&r);
  H = HA;
  cr_assert_eq(http_call(&S, "DELETE", "/v1/sessions/w0", H, NULL, 0, &r), 204, "%s", r.body);
  http_res_free(&r);
  cr_expect_eq(append("g2", 0, 1, &r), 200, "%s", r.body);
  expect_reference(&r, 0, 1);
  http_res_free(&r);
  H = HNONE;
}
