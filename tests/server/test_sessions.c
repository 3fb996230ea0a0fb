/*
 * test_sessions.c — sessions through the real attnd: a prefill and token
 * by token decode in both codecs, each reply checked against the float64
 * reference over exactly the keys the session should hold; replays,
 * conflicts and the other refusals with their statuses; the batch route
 * against single calls; tenants under several API keys; and a restart
 * with --session-dir, a damaged file set aside.
 */
#include "harness.h"

#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static srv S;
static void teardown(void) {
  srv_cleanup(&S);
  remove_tmpdir();
}
TestSuite(sessions, .fini = teardown, .timeout = 180);

#define JSON_CT "Content-Type: application/json"
#define ST_CT "Content-Type: application/octet-stream"

/* Rows [r0, r0 + n) of every head of [H, total, D] at src, into dst. */
static void rows(void *dst, const void *src, int64_t h, int64_t total, int64_t r0, int64_t n,
                 size_t w) {
  for (int64_t i = 0; i < h; i++)
    memcpy((char *)dst + (size_t)(i * n) * w, (const char *)src + (size_t)(i * total + r0) * w,
           (size_t)n * w);
}

/* A problem of queries [q0, q0 + nq) and keys [k0, k0 + nk) of the stream
 * full, causal (bottom-right), as a case of its own. */
static void slice(const tcase *full, int64_t q0, int64_t nq, int64_t k0, int64_t nk, tcase *out) {
  tprob p = full->p;
  p.nq = nq;
  p.nkv = nk;
  p.causal = true;
  tcase_init(out, &p, 1);
  size_t w = (size_t)p.d * attn_dtype_size(p.dt);
  rows(out->q, full->q, p.hq, full->p.nq, q0, nq, w);
  rows(out->k, full->k, p.hkv, full->p.nkv, k0, nk, w);
  rows(out->v, full->v, p.hkv, full->p.nkv, k0, nk, w);
}

static long put(const char *path, const char *body, http_res *r) {
  const char *h[] = {JSON_CT, NULL};
  return http_call(&S, "PUT", path, h, body, strlen(body), r);
}

static void create(const char *id, const tcase *full, int64_t max_tokens) {
  char path[200], body[300];
  snprintf(path, sizeof path, "/v1/sessions/%s", id);
  snprintf(body, sizeof body,
           "{\"heads_kv\": %lld, \"head_dim\": %lld, \"dtype\": \"%s\", \"max_tokens\": %lld}",
           (long long)full->p.hkv, (long long)full->p.d, attn_dtype_name(full->p.dt),
           (long long)max_tokens);
  http_res r;
  cr_assert_eq(put(path, body, &r), 201, "create %s: %ld %s", id, r.status, r.body);
  http_res_free(&r);
}

/* One step on session id: queries and new tokens [pos, pos + n) of full,
 * as JSON or safetensors; checked against the reference over [0, pos + n). */
static void step(const char *id, const tcase *full, int64_t pos, int64_t n, bool st, http_res *r) {
  tcase body;
  slice(full, pos, n, pos, n, &body);
  char path[200], meta[64];
  snprintf(path, sizeof path, "/v1/sessions/%s/attention", id);
  size_t len;
  char *b;
  if (st) {
    snprintf(meta, sizeof meta, "{\"pos\": \"%lld\"}", (long long)pos);
    b = st_body(&body, 3, meta, &len);
  } else {
    snprintf(meta, sizeof meta, ", \"pos\": %lld", (long long)pos);
    b = json_body(&body, 3, meta, &len);
  }
  const char *h[] = {st ? ST_CT : JSON_CT, st ? "Accept: application/octet-stream" : NULL, NULL};
  http_call(&S, "POST", path, h, b, len, r);
  free(b);
  tcase_free(&body);
}

static void step_checked(const char *id, const tcase *full, int64_t pos, int64_t n, bool st,
                         const char *what) {
  http_res r;
  step(id, full, pos, n, st, &r);
  tcase want;
  slice(full, pos, n, 0, pos + n, &want);
  expect_correct(&r, &want, 3, st, what);
  char len[32] = "", exp[32];
  snprintf(exp, sizeof exp, "%lld", (long long)(pos + n));
  cr_expect(http_header(&r, "X-Session-Length", len, sizeof len) && !strcmp(len, exp),
            "%s: X-Session-Length %s, not %s", what, len, exp);
  tcase_free(&want);
  http_res_free(&r);
}

Test(sessions, prefill_then_decode_in_both_codecs) {
  srv_start(&S, "--session-memory", "64M", NULL);
  const attn_dtype dts[3] = {ATTN_F32, ATTN_F16, ATTN_BF16};
  for (int t = 0; t < 3; t++) {
    tprob p = tprob_make(1, 8, 2, 70, 70, 64, dts[t]);
    tcase full;
    tcase_init(&full, &p, 5 + (uint64_t)t);
    char id[16], what[64];
    snprintf(id, sizeof id, "dec-%d", t);
    create(id, &full, 128);
    snprintf(what, sizeof what, "%s prefill", attn_dtype_name(dts[t]));
    step_checked(id, &full, 0, 60, t % 2, what);
    for (int64_t pos = 60; pos < 70; pos++) {
      snprintf(what, sizeof what, "%s step %lld", attn_dtype_name(dts[t]), (long long)pos);
      step_checked(id, &full, pos, 1, pos % 2, what);
    }
    tcase_free(&full);
  }
}

Test(sessions, a_replay_gets_the_first_reply) {
  srv_start(&S, "--session-memory", "64M", NULL);
  tprob p = tprob_make(1, 4, 2, 20, 20, 32, ATTN_F16);
  tcase full;
  tcase_init(&full, &p, 9);
  create("rp", &full, 64);
  http_res a, b, c;
  step("rp", &full, 0, 10, true, &a);
  cr_assert_eq(a.status, 200, "%s", a.body);
  step("rp", &full, 10, 1, true, &b);
  step("rp", &full, 11, 1, true, &c);
  http_res_free(&c);
  step("rp", &full, 10, 1, true, &c); /* the reply to b was lost: send it again */
  cr_assert_eq(c.status, 200, "%s", c.body);
  /* the same tensors, bit for bit, after the same header up to the length */
  cr_expect_eq(b.len, c.len);
  cr_expect_eq(memcmp(b.body + b.len - 4 * 32 * 2, c.body + c.len - 4 * 32 * 2, 4 * 32 * 2), 0,
               "a replay's O differs from the first reply's");
  char len[32] = "";
  cr_expect(http_header(&c, "X-Session-Length", len, sizeof len) && !strcmp(len, "12"), "%s", len);
  http_res_free(&a);
  http_res_free(&b);
  http_res_free(&c);
  /* a step past the length appends nothing */
  step("rp", &full, 14, 1, false, &c);
  expect_error(&c, 409, "session_conflict", "pos past the length");
  cr_expect(strstr(c.body, "length 12"), "%s", c.body);
  http_res_free(&c);
  http_get(&S, "/v1/sessions/rp", &c);
  cJSON *j = cJSON_Parse(c.body);
  cJSON *l = cJSON_GetObjectItem(j, "lengths");
  cr_expect(cJSON_GetArraySize(l) == 1 && cJSON_GetArrayItem(l, 0)->valueint == 12, "%s", c.body);
  cJSON_Delete(j);
  http_res_free(&c);
  tcase_free(&full);
}

static void expect_call(const char *method, const char *path, const char *body, long status,
                        const char *code, const char *what) {
  const char *h[] = {JSON_CT, NULL};
  http_res r;
  http_call(&S, method, path, body ? h : NULL, body, body ? strlen(body) : 0, &r);
  if (code)
    expect_error(&r, status, code, what);
  else
    cr_expect_eq(r.status, status, "%s: %ld %s", what, r.status, r.body);
  http_res_free(&r);
}

#define SHAPE "{\"heads_kv\": 1, \"head_dim\": 4, \"dtype\": \"F32\", \"max_tokens\": 4}"
#define Q1 "\"q\": {\"shape\": [1, 1, 4], \"dtype\": \"F32\", \"data\": [1, 2, 3, 4]}"
#define KV1                                                                     \
  "\"k\": {\"shape\": [1, 1, 4], \"dtype\": \"F32\", \"data\": [1, 0, 0, 0]}, " \
  "\"v\": {\"shape\": [1, 1, 4], \"dtype\": \"F32\", \"data\": [0, 1, 0, 0]}"

Test(sessions, refusals_and_their_statuses) {
  srv_start(&S, "--session-memory", "1M", NULL);
  expect_call("PUT", "/v1/sessions/a", SHAPE, 201, NULL, "create");
  expect_call("PUT", "/v1/sessions/a", SHAPE, 200, NULL, "a retried create");
  expect_call("PUT", "/v1/sessions/brief",
              "{\"heads_kv\": 1, \"head_dim\": 4, \"dtype\": \"F32\", \"max_tokens\": 4, "
              "\"ttl_s\": 1e-9}",
              422, "invalid_option", "a ttl_s under a second");
  expect_call("PUT", "/v1/sessions/a",
              "{\"heads_kv\": 2, \"head_dim\": 4, \"dtype\": \"F32\", \"max_tokens\": 4}", 409,
              "session_exists", "other parameters");
  expect_call("PUT", "/v1/sessions/_a", SHAPE, 422, "invalid_request", "an id of the server's");
  expect_call("PUT", "/v1/sessions/b", "{\"heads_kv\": 1}", 422, "invalid_option",
              "a missing field");
  expect_call("PUT", "/v1/sessions/b",
              "{\"heads_kv\": 1, \"head_dim\": 4, \"dtype\": \"F32\", "
              "\"max_tokens\": 4, \"colour\": 1}",
              422, "unknown_option", "an unknown field");
  expect_call("PUT", "/v1/sessions/b", "not json", 400, "malformed_json", "not JSON");
  /* 1 MiB is 16 pages: a session of 8 KV heads reserves 16 */
  expect_call("PUT", "/v1/sessions/big",
              "{\"heads_kv\": 8, \"head_dim\": 4, \"dtype\": \"F32\", \"max_tokens\": 4}", 507,
              "session_memory_full", "past --session-memory");
  expect_call("POST", "/v1/sessions/nobody/attention", "{" Q1 "}", 404, "session_not_found",
              "an unknown session");
  expect_call("POST", "/v1/sessions/a/attention", "{" Q1 ", " KV1 "}", 422, "invalid_option",
              "k and v without pos");
  expect_call("POST", "/v1/sessions/a/attention", "{" Q1 ", " KV1 ", \"pos\": 3}", 409,
              "session_conflict", "pos past the length");
  expect_call("POST", "/v1/sessions/a/attention", "{" Q1 ", " KV1 ", \"pos\": 0}", 200, NULL,
              "the first token");
  expect_call("POST", "/v1/sessions/a/attention",
              "{" Q1 ", " KV1 ", \"pos\": 1, \"diag_offset\": 0}", 422, "invalid_option",
              "diag_offset");
  expect_call("POST", "/v1/sessions/a/attention", "{" Q1 ", " KV1 ", \"pos\": 1, \"layer\": 1}",
              422, "invalid_request", "a layer the session lacks");
  const char *four = "{\"q\": {\"shape\": [1, 1, 4], \"dtype\": \"F32\", \"data\": [1, 2, 3, 4]}, "
                     "\"k\": {\"shape\": [1, 4, 4], \"dtype\": \"F32\", \"data\": ["
                     "1,0,0,0,1,0,0,0,1,0,0,0,1,0,0,0]}, \"v\": {\"shape\": [1, 4, 4], \"dtype\": "
                     "\"F32\", \"data\": [1,0,0,0,1,0,0,0,1,0,0,0,1,0,0,0]}, \"pos\": 1}";
  expect_call("POST", "/v1/sessions/a/attention", four, 422, "session_full", "past max_tokens");
  expect_call("POST", "/v1/sessions/a/attention",
              "{\"q\": {\"shape\": [1, 1, 4], \"dtype\": \"F16\", \"data\": [1, 2, 3, 4]}}", 422,
              "invalid_dtype", "another dtype");
  expect_call("POST", "/v1/sessions/a/attention", "{" Q1 "}", 200, NULL, "attend only");
  expect_call("POST", "/v1/sessions/a/truncate", "{\"length\": -1}", 422, "invalid_option",
              "a negative length");
  expect_call("POST", "/v1/sessions/a/truncate", "{\"length\": 0}", 200, NULL, "truncate");
  expect_call("GET", "/v1/sessions/_batch", NULL, 405, "method_not_allowed", "GET on _batch");
  expect_call("PATCH", "/v1/sessions/a", NULL, 405, "method_not_allowed", "PATCH");
  expect_call("DELETE", "/v1/sessions/a", NULL, 204, NULL, "delete");
  expect_call("DELETE", "/v1/sessions/a", NULL, 404, "session_not_found", "delete again");
  expect_call("PUT", "/v1/sessions/big",
              "{\"heads_kv\": 8, \"head_dim\": 4, \"dtype\": \"F32\", \"max_tokens\": 4}", 201,
              NULL, "the freed memory serves another");
}

Test(sessions, off_with_no_session_memory) {
  srv_start(&S, "--session-memory", "0", NULL);
  expect_call("PUT", "/v1/sessions/a", SHAPE, 404, "not_found", "sessions off");
  expect_call("POST", "/v1/sessions/a/attention", "{" Q1 "}", 404, "not_found",
              "a call with sessions off");
  http_res r;
  http_get(&S, "/v1/info", &r);
  cr_expect(strstr(r.body, "\"sessions\": {\"enabled\": false"), "%s", r.body);
  http_res_free(&r);
}

/* JSON text of n rows [r0, r0 + n) of every head of a [H, total, D] tensor. */
static void put_rows(cJSON *arr, const void *t, attn_dtype dt, int64_t h, int64_t total, int64_t d,
                     int64_t r0, int64_t n) {
  for (int64_t i = 0; i < h; i++)
    for (int64_t j = 0; j < n * d; j++)
      cJSON_AddItemToArray(
          arr, cJSON_CreateNumber(attn_load_elem(t, dt, (size_t)((i * total + r0) * d + j))));
}

static cJSON *int_array(const int64_t *v, int n) {
  cJSON *a = cJSON_CreateArray();
  for (int i = 0; i < n; i++)
    cJSON_AddItemToArray(a, cJSON_CreateNumber((double)v[i]));
  return a;
}

/* A step of one token for each of two sessions in one _batch call: F32. */
static char *batch_body(const tcase *f0, const tcase *f1, int64_t p0, int64_t p1, const char *ids) {
  const tcase *f[2] = {f0, f1};
  const int64_t pos[2] = {p0, p1}, hq = f0->p.hq, hkv = f0->p.hkv, d = f0->p.d;
  cJSON *root = cJSON_CreateObject();
  const char *names[3] = {"q", "k", "v"};
  for (int t = 0; t < 3; t++) {
    cJSON *o = cJSON_AddObjectToObject(root, names[t]);
    int64_t heads = t ? hkv : hq, shape[3] = {heads, 2, d};
    cJSON_AddItemToObject(o, "shape", int_array(shape, 3));
    cJSON_AddStringToObject(o, "dtype", "F32");
    cJSON *data = cJSON_AddArrayToObject(o, "data");
    for (int64_t i = 0; i < heads; i++)
      for (int s = 0; s < 2; s++) {
        const void *src = t == 0 ? f[s]->q : t == 1 ? f[s]->k : f[s]->v;
        int64_t total = t ? f[s]->p.nkv : f[s]->p.nq;
        put_rows(data, (const char *)src + (size_t)(i * total * d) * 4, ATTN_F32, 1, total, d,
                 pos[s], 1);
      }
  }
  int64_t cu[3] = {0, 1, 2};
  const char *cn[2] = {"cu_seqlens_q", "cu_seqlens_kv"};
  for (int c = 0; c < 2; c++) {
    cJSON *o = cJSON_AddObjectToObject(root, cn[c]);
    int64_t shape[1] = {3};
    cJSON_AddItemToObject(o, "shape", int_array(shape, 1));
    cJSON_AddStringToObject(o, "dtype", "I64");
    cJSON_AddItemToObject(o, "data", int_array(cu, 3));
  }
  char pj[64];
  snprintf(pj, sizeof pj, "[%lld, %lld]", (long long)p0, (long long)p1);
  cJSON_AddItemToObject(root, "pos", cJSON_Parse(pj));
  cJSON_AddItemToObject(root, "sessions", cJSON_Parse(ids));
  char *text = cJSON_PrintUnformatted(root);
  cJSON_Delete(root);
  return text;
}

/* The o data of a JSON reply as doubles (at most cap). */
static int reply_o(const http_res *r, double *out, int cap) {
  cJSON *j = cJSON_Parse(r->body);
  cJSON *data = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "o"), "data");
  int n = 0;
  for (cJSON *x = data ? data->child : NULL; x && n < cap; x = x->next)
    out[n++] = x->valuedouble;
  cJSON_Delete(j);
  return n;
}

Test(sessions, batch_route_equals_single_calls) {
  srv_start(&S, "--session-memory", "64M", NULL);
  tprob p = tprob_make(1, 4, 2, 30, 30, 16, ATTN_F32);
  tcase f0, f1;
  tcase_init(&f0, &p, 31);
  tcase_init(&f1, &p, 32);
  const char *ids[4] = {"a", "b", "a2", "b2"};
  for (int i = 0; i < 4; i++) {
    create(ids[i], i % 2 ? &f1 : &f0, 64);
    http_res r;
    step(ids[i], i % 2 ? &f1 : &f0, 0, i % 2 ? 20 : 25, false, &r);
    cr_assert_eq(r.status, 200, "%s", r.body);
    http_res_free(&r);
  }
  char *body = batch_body(&f0, &f1, 25, 20, "[\"a2\", \"b2\"]");
  const char *h[] = {JSON_CT, NULL};
  http_res rb, ra, rs;
  http_call(&S, "POST", "/v1/sessions/_batch", h, body, strlen(body), &rb);
  cr_assert_eq(rb.status, 200, "%s", rb.body);
  cr_expect(strstr(rb.body, "\"lengths\": [26, 21]"), "%s", rb.body);
  step("a", &f0, 25, 1, false, &ra);
  step("b", &f1, 20, 1, false, &rs);
  double ob[4 * 2 * 16], o0[4 * 16], o1[4 * 16];
  cr_assert_eq(reply_o(&rb, ob, 128), 128);
  cr_assert_eq(reply_o(&ra, o0, 64), 64);
  cr_assert_eq(reply_o(&rs, o1, 64), 64);
  for (int hh = 0; hh < 4; hh++)
    for (int dd = 0; dd < 16; dd++) {
      cr_expect_eq(ob[(hh * 2 + 0) * 16 + dd], o0[hh * 16 + dd], "a, head %d", hh);
      cr_expect_eq(ob[(hh * 2 + 1) * 16 + dd], o1[hh * 16 + dd], "b, head %d", hh);
    }
  http_res_free(&rb);
  http_res_free(&ra);
  http_res_free(&rs);
  free(body);
  /* all or nothing: b2 at a stale pos refuses the call, and a2 gains no token */
  body = batch_body(&f0, &f1, 26, 22, "[\"a2\", \"b2\"]");
  http_call(&S, "POST", "/v1/sessions/_batch", h, body, strlen(body), &rb);
  expect_error(&rb, 409, "session_conflict", "a stale pos in a batch");
  cr_expect(strstr(rb.body, "sessions[1]"), "%s", rb.body);
  http_res_free(&rb);
  free(body);
  http_get(&S, "/v1/sessions/a2", &rb);
  cr_expect(strstr(rb.body, "\"lengths\": [26]"), "%s", rb.body);
  http_res_free(&rb);
  tcase_free(&f0);
  tcase_free(&f1);
}

Test(sessions, each_key_its_own_namespace) {
  char *dir = make_tmpdir(), path[512];
  snprintf(path, sizeof path, "%s/keys", dir);
  FILE *f = fopen(path, "w");
  fputs("alice:alice-key-0123456789\nbob:bob-key-0123456789\n", f);
  fclose(f);
  srv_start(&S, "--api-key-file", path, "--session-memory", "16M", NULL);
  const char *ha[] = {"Authorization: Bearer alice-key-0123456789", JSON_CT, NULL};
  const char *hb[] = {"Authorization: Bearer bob-key-0123456789", JSON_CT, NULL};
  http_res r;
  http_call(&S, "PUT", "/v1/sessions/x", ha, SHAPE, strlen(SHAPE), &r);
  cr_expect_eq(r.status, 201);
  http_res_free(&r);
  http_call(&S, "GET", "/v1/sessions/x", hb, NULL, 0, &r);
  expect_error(&r, 404, "session_not_found", "bob reads alice's session");
  http_res_free(&r);
  http_call(&S, "DELETE", "/v1/sessions/x", hb, NULL, 0, &r);
  expect_error(&r, 404, "session_not_found", "bob deletes alice's session");
  http_res_free(&r);
  const char *body = "{" Q1 ", " KV1 ", \"pos\": 0}";
  http_call(&S, "POST", "/v1/sessions/x/attention", hb, body, strlen(body), &r);
  expect_error(&r, 404, "session_not_found", "bob appends to alice's session");
  http_res_free(&r);
  http_call(&S, "PUT", "/v1/sessions/x", hb, SHAPE, strlen(SHAPE), &r);
  cr_expect_eq(r.status, 201, "bob's own x: %s", r.body);
  http_res_free(&r);
  http_call(&S, "POST", "/v1/sessions/x/attention", ha, body, strlen(body), &r);
  cr_expect_eq(r.status, 200, "%s", r.body);
  http_res_free(&r);
  http_call(&S, "GET", "/v1/sessions", hb, NULL, 0, &r);
  cr_expect(strstr(r.body, "\"count\": 1") && strstr(r.body, "\"tokens\": 0"), "%s", r.body);
  http_res_free(&r);
  http_call(&S, "GET", "/v1/sessions", ha, NULL, 0, &r);
  cr_expect(strstr(r.body, "\"lengths\": [1]"), "the list gives each layer's length: %s", r.body);
  http_res_free(&r);
  cr_expect(srv_wait_log(&S, "POST /v1/sessions/x/attention 200", 10));
  char *log = srv_log(&S);
  cr_expect(strstr(log, "key=alice") && !strstr(log, "alice-key-0123456789"), "%s", log);
  free(log);
}

Test(sessions, a_restart_keeps_them_and_sets_a_damaged_file_aside) {
  char *dir = make_tmpdir(), sd[512], bad[600];
  snprintf(sd, sizeof sd, "%s/sessions", dir);
  cr_assert_eq(mkdir(sd, 0700), 0);
  tprob p = tprob_make(1, 4, 2, 40, 40, 32, ATTN_BF16);
  tcase full;
  tcase_init(&full, &p, 41);
  srv_start(&S, "--session-memory", "64M", "--session-dir", sd, NULL);
  http_res r;
  http_get(&S, "/v1/info", &r);
  cr_expect(strstr(r.body, "\"persist\": true"), "%s", r.body);
  http_res_free(&r);
  create("keep", &full, 64);
  step_checked("keep", &full, 0, 30, true, "before the restart");
  cr_assert_eq(srv_stop(&S, 30), 0, "a graceful stop");
  snprintf(bad, sizeof bad, "%s/_@junk.kv", sd);
  FILE *f = fopen(bad, "w");
  fputs("not a session file", f);
  fclose(f);
  srv_start(&S, "--session-memory", "64M", "--session-dir", sd, NULL);
  cr_expect(srv_wait_log(&S, "junk", 10), "no log line for the damaged file");
  http_get(&S, "/v1/sessions/keep", &r);
  cr_expect(strstr(r.body, "\"lengths\": [30]"), "%s", r.body);
  http_res_free(&r);
  step_checked("keep", &full, 30, 1, false, "the first step after the restart");
  step_checked("keep", &full, 31, 1, true, "the second");
  snprintf(bad, sizeof bad, "%s/_@junk.kv.bad", sd);
  cr_expect_eq(access(bad, F_OK), 0, "the damaged file was not set aside as %s", bad);
  tcase_free(&full);
}
