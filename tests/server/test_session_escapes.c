/*
 * test_session_escapes.c — a session path written with percent-escapes.
 * A proxy routes sessions by the path as it came ("dup%2D1" and "dup-1"
 * are two keys of its hash) and refuses "_batch" by its letters; were
 * attnd to decode them, one session would live on two replicas and
 * "%5Fbatch" would reach the batch route. Every session route refuses
 * a '%' in its path with 422 invalid_request, before the session is
 * looked at; the ids themselves are plain characters.
 */
#include "harness.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static srv S;
static void teardown(void) { srv_cleanup(&S); }
TestSuite(session_escapes, .fini = teardown, .timeout = 120);

#define JSON_CT "Content-Type: application/json"
#define SHAPE "{\"heads_kv\": 1, \"head_dim\": 4, \"dtype\": \"F32\", \"max_tokens\": 4}"
#define STEP                                                                                 \
  "{\"pos\": 0, \"q\": {\"shape\": [1, 1, 4], \"dtype\": \"F32\", \"data\": [1, 2, 3, 4]}, " \
  "\"k\": {\"shape\": [1, 1, 4], \"dtype\": \"F32\", \"data\": [1, 0, 0, 0]}, "              \
  "\"v\": {\"shape\": [1, 1, 4], \"dtype\": \"F32\", \"data\": [0, 1, 0, 0]}}"

static long call(const char *method, const char *path, const char *body, http_res *r) {
  const char *h[] = {JSON_CT, NULL};
  return http_call(&S, method, path, body ? h : NULL, body, body ? strlen(body) : 0, r);
}

/* method on path is refused 422 invalid_request, saying why. */
static void expect_refused(const char *method, const char *path, const char *body) {
  http_res r;
  call(method, path, body, &r);
  char what[200];
  snprintf(what, sizeof what, "%s %s", method, path);
  if (expect_error(&r, 422, "invalid_request", what))
    cr_expect(strstr(r.body, "percent-encoded"), "%s: %s", what, r.body);
  http_res_free(&r);
}

Test(session_escapes, an_escaped_id_is_refused_and_never_makes_a_second_session) {
  srv_start(&S, "--session-memory", "1M", NULL);
  http_res r;
  expect_refused("PUT", "/v1/sessions/dup%2D1", SHAPE);
  cr_assert_eq(call("PUT", "/v1/sessions/dup-1", SHAPE, &r), 201, "%s", r.body);
  http_res_free(&r);
  /* the same id, escaped: neither a second session nor this one */
  expect_refused("PUT", "/v1/sessions/dup%2D1", SHAPE);
  expect_refused("PUT", "/v1/sessions/%64up-1", SHAPE);
  expect_refused("GET", "/v1/sessions/dup%2d1", NULL);
  expect_refused("DELETE", "/v1/sessions/dup%2D1", NULL);
  expect_refused("POST", "/v1/sessions/dup%2D1/attention", STEP);
  expect_refused("POST", "/v1/sessions/dup-1/%61ttention", STEP);
  expect_refused("POST", "/v1/sessions/dup%2D1/truncate", "{\"length\": 0}");
  /* an escape that decodes to no character of an id, and one of a '/' */
  expect_refused("GET", "/v1/sessions/a%20b", NULL);
  expect_refused("GET", "/v1/sessions/a%2Fb", NULL);
  cr_assert_eq(call("GET", "/v1/sessions", NULL, &r), 200, "%s", r.body);
  cr_expect(strstr(r.body, "\"count\": 1") && strstr(r.body, "\"dup-1\""), "%s", r.body);
  http_res_free(&r);
  cr_expect_eq(call("GET", "/v1/sessions/dup-1", NULL, &r), 200, "%s", r.body);
  http_res_free(&r);
}

Test(session_escapes, the_batch_and_the_list_are_refused_when_escaped) {
  srv_start(&S, "--session-memory", "1M", NULL);
  const char *batch = "{\"sessions\": [\"a\"], \"layer\": 0}";
  expect_refused("POST", "/v1/sessions/%5Fbatch", batch);
  expect_refused("POST", "/v1/sessions/%5fbatch", batch);
  expect_refused("POST", "/v1/%73essions/_batch", batch);
  expect_refused("GET", "/v1/session%73", NULL);
  expect_refused("GET", "/v1/sessions/%2E%2E", NULL);
  /* the plain routes still answer: the refusal is the escape's */
  http_res r;
  cr_expect_eq(call("GET", "/v1/sessions", NULL, &r), 200, "%s", r.body);
  http_res_free(&r);
  cr_expect_eq(call("GET", "/v1/sessions/none", NULL, &r), 404, "%s", r.body);
  http_res_free(&r);
  /* a route that is no session's keeps its decoding */
  cr_expect_eq(call("GET", "/health%7A", NULL, &r), 200, "%s", r.body);
  http_res_free(&r);
}

Test(session_escapes, the_key_check_comes_first) {
  srv_start(&S, "--session-memory", "1M", "--api-key", "k1", NULL);
  http_res r;
  call("PUT", "/v1/sessions/dup%2D1", SHAPE, &r);
  expect_error(&r, 401, "unauthorized", "an escaped path without the key");
  http_res_free(&r);
}
