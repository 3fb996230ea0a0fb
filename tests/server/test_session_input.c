/*
 * test_session_input.c — the session routes under hostile input, through
 * the real attnd: a batch's offsets that overflow (safetensors I64, which
 * no JSON cap bounds) or decrease, refused 422 invalid_shape as
 * POST /attention refuses them, and the server answering afterwards; a
 * ttl_s too short to outlive its create, 257 ids in a batch, and strings
 * with an embedded NUL, each refused 422 with nothing made; and a create's
 * or truncate's bytes after its object refused as malformed JSON.
 */
#include "harness.h"

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static srv S;
static void teardown(void) { srv_cleanup(&S); }
TestSuite(session_input, .fini = teardown, .timeout = 120);

#define JSON_CT "Content-Type: application/json"
#define ST_CT "Content-Type: application/octet-stream"
#define SHAPE1 "{\"heads_kv\": 1, \"head_dim\": 1, \"dtype\": \"F32\", \"max_tokens\": 16"

/* A call's status, the reply checked as an error of code when one is
 * given; the body's length is strlen's unless len is set (NULL: none). */
static long call(const char *method, const char *path, const char *ct, const void *body, size_t len,
                 long status, const char *code, const char *what) {
  const char *h[] = {ct, NULL};
  http_res r;
  long got = http_call(&S, method, path, h, body, len || !body ? len : strlen(body), &r);
  if (code)
    expect_error(&r, status, code, what);
  else
    cr_expect_eq(got, status, "%s: %ld %s", what, got, r.body);
  http_res_free(&r);
  return got;
}

static void create(const char *id) {
  char path[64];
  snprintf(path, sizeof path, "/v1/sessions/%s", id);
  call("PUT", path, JSON_CT, SHAPE1 "}", 0, 201, NULL, id);
}

/* Little-endian bytes of v, n of them, at p. */
static void put_le(unsigned char *p, uint64_t v, int n) {
  for (int i = 0; i < n; i++)
    p[i] = (unsigned char)(v >> (8 * i));
}

/* A safetensors batch of three sessions a, b, c at pos 0: q, k and v
 * F32 [1, 3, 1] (ones), cu_seqlens_q I64 [0, 1, 2, 3] and cu_seqlens_kv
 * I64 kv. Its length into *plen; malloc'd. */
static unsigned char *batch_st(const int64_t kv[4], size_t *plen) {
  char hdr[640];
  int n = snprintf(hdr, sizeof hdr,
                   "{\"__metadata__\": {\"sessions\": \"a,b,c\", \"pos\": \"0,0,0\"}, "
                   "\"q\": {\"dtype\": \"F32\", \"shape\": [1, 3, 1], \"data_offsets\": [0, 12]}, "
                   "\"k\": {\"dtype\": \"F32\", \"shape\": [1, 3, 1], \"data_offsets\": [12, 24]}, "
                   "\"v\": {\"dtype\": \"F32\", \"shape\": [1, 3, 1], \"data_offsets\": [24, 36]}, "
                   "\"cu_seqlens_q\": {\"dtype\": \"I64\", \"shape\": [4], \"data_offsets\": "
                   "[36, 68]}, \"cu_seqlens_kv\": {\"dtype\": \"I64\", \"shape\": [4], "
                   "\"data_offsets\": [68, 100]}}");
  *plen = 8 + (size_t)n + 100;
  unsigned char *b = malloc(*plen), *d = b + 8 + n;
  cr_assert(b);
  put_le(b, (uint64_t)n, 8);
  memcpy(b + 8, hdr, (size_t)n);
  const float one = 1;
  uint32_t bits;
  memcpy(&bits, &one, 4);
  for (int i = 0; i < 9; i++)
    put_le(d + 4 * i, bits, 4);
  for (int i = 0; i < 4; i++) {
    put_le(d + 36 + 8 * i, (uint64_t)i, 8);
    put_le(d + 68 + 8 * i, (uint64_t)kv[i], 8);
  }
  return b;
}

Test(session_input, batch_offsets_that_overflow_are_refused) {
  srv_start(&S, "--session-memory", "4M", NULL);
  create("a");
  create("b");
  create("c");
  /* 2^63 - 1 then -2: their difference overflows int64 */
  const int64_t bad[][4] = {{0, INT64_MAX, -2, 3},
                            {0, INT64_MIN, 1, 3},
                            {0, 2, 1, 3},
                            {0, 1, 2, INT64_MAX},
                            {5, 1, 2, 3}};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    size_t len;
    unsigned char *b = batch_st(bad[i], &len);
    char what[64];
    snprintf(what, sizeof what, "cu_seqlens_kv case %zu", i);
    call("POST", "/v1/sessions/_batch", ST_CT, b, len, 422, "invalid_shape", what);
    free(b);
    expect_healthy(&S, what);
  }
  /* nothing was appended: the good batch still finds every layer empty */
  const int64_t good[4] = {0, 1, 2, 3};
  size_t len;
  unsigned char *b = batch_st(good, &len);
  call("POST", "/v1/sessions/_batch", ST_CT, b, len, 200, NULL, "the good batch after them");
  free(b);
}

Test(session_input, batch_offsets_as_attention_checks_them) {
  srv_start(&S, "--session-memory", "4M", NULL);
  create("a");
  create("b");
  const char *bodies[] = {
      /* decreasing kv offsets */
      "{\"sessions\": [\"a\", \"b\"], \"pos\": [0, 0], \"q\": [[1], [1]], \"k\": [[1], [1]], "
      "\"v\": [[1], [1]], \"cu_seqlens_q\": [0, 1, 2], \"cu_seqlens_kv\": [0, 2, 1]}",
      /* kv offsets past the rows sent */
      "{\"sessions\": [\"a\", \"b\"], \"pos\": [0, 0], \"q\": [[1], [1]], \"k\": [[1], [1]], "
      "\"v\": [[1], [1]], \"cu_seqlens_q\": [0, 1, 2], \"cu_seqlens_kv\": [0, 1, 3]}",
      /* q offsets not starting at 0, without new tokens */
      "{\"sessions\": [\"a\", \"b\"], \"q\": [[1], [1]], \"cu_seqlens_q\": [1, 1, 2]}",
  };
  for (size_t i = 0; i < sizeof bodies / sizeof *bodies; i++) {
    char what[48];
    snprintf(what, sizeof what, "JSON offsets case %zu", i);
    call("POST", "/v1/sessions/_batch", JSON_CT, bodies[i], 0, 422, "invalid_shape", what);
  }
  expect_healthy(&S, "the JSON offsets");
}

Test(session_input, a_ttl_under_a_second_is_refused) {
  srv_start(&S, "--session-memory", "4M", NULL);
  const char *ttls[] = {"1e-300", "1e-9", "0.5", "0", "-1"};
  for (size_t i = 0; i < sizeof ttls / sizeof *ttls; i++) {
    char body[160];
    snprintf(body, sizeof body, SHAPE1 ", \"ttl_s\": %s}", ttls[i]);
    call("PUT", "/v1/sessions/brief", JSON_CT, body, 0, 422, "invalid_option", ttls[i]);
    call("GET", "/v1/sessions/brief", JSON_CT, NULL, 0, 404, "session_not_found",
         "no session made");
  }
  call("PUT", "/v1/sessions/brief", JSON_CT, SHAPE1 ", \"ttl_s\": 1}", 0, 201, NULL,
       "ttl_s 1, the least");
  call("GET", "/v1/sessions/brief", JSON_CT, NULL, 0, 200, NULL, "ttl_s 1 answers at once");
}

/* "s0", "s1", ... n ids, each quoted (JSON) or bare (a query string),
 * joined by commas; malloc'd. */
static char *ids(int n, bool quoted) {
  char *s = malloc((size_t)n * 8 + 1), *p = s;
  cr_assert(s);
  for (int i = 0; i < n; i++)
    p += sprintf(p, quoted ? "%s\"s%d\"" : "%ss%d", i ? "," : "", i);
  *p = 0;
  return s;
}

Test(session_input, a_batch_of_257_sessions_is_refused_422) {
  srv_start(&S, "--session-memory", "4M", NULL);
  char *list = ids(257, true), *body = malloc(strlen(list) + 128);
  cr_assert(body);
  sprintf(body, "{\"sessions\": [%s], \"q\": [[1]], \"cu_seqlens_q\": [0, 1]}", list);
  call("POST", "/v1/sessions/_batch", JSON_CT, body, 0, 422, "invalid_option", "257 ids (JSON)");
  free(list);
  free(body);
  list = ids(257, false);
  char *path = malloc(strlen(list) + 64);
  cr_assert(path);
  sprintf(path, "/v1/sessions/_batch?sessions=%s", list);
  call("POST", path, JSON_CT, "{\"q\": [[1]], \"cu_seqlens_q\": [0, 1]}", 0, 422, "invalid_option",
       "257 ids (query)");
  free(list);
  free(path);
}

Test(session_input, strings_with_a_nul_are_refused) {
  srv_start(&S, "--session-memory", "4M", NULL);
  call("PUT", "/v1/sessions/n1", JSON_CT,
       "{\"heads_kv\": 1, \"head_dim\": 1, \"dtype\": \"F32\\u0000x\", \"max_tokens\": 16}", 0, 422,
       "invalid_dtype", "a dtype with a NUL");
  call("PUT", "/v1/sessions/n1", JSON_CT,
       "{\"heads_kv\": 1, \"head_dim\": 1, \"dtype\": \"F32\", \"max_tokens\": 16, "
       "\"ttl_s\\u0000\": 5}",
       0, 422, "unknown_option", "a field name with a NUL");
  call("PUT", "/v1/sessions/n1", JSON_CT,
       "{\"heads_kv\": 1, \"head_dim\": 1, \"dtype\": \"F64\", \"max_tokens\": 16}", 0, 422,
       "invalid_dtype", "a dtype attnd does not have");
  call("GET", "/v1/sessions/n1", JSON_CT, NULL, 0, 404, "session_not_found", "none was made");
  create("a");
  call("POST", "/v1/sessions/_batch", JSON_CT,
       "{\"sessions\": [\"a\\u0000b\"], \"q\": [[1]], \"cu_seqlens_q\": [0, 1]}", 0, 422,
       "invalid_option", "an id with a NUL");
  call("POST", "/v1/sessions/a/truncate", JSON_CT, "{\"length\\u0000\": 0}", 0, 422,
       "unknown_option", "a truncate's name with a NUL");
  call("POST", "/v1/sessions/_batch", JSON_CT,
       "{\"sessions\": [\"a\"], \"pos\": [1e300], \"q\": [[1]], \"k\": [[1]], \"v\": [[1]], "
       "\"cu_seqlens_q\": [0, 1], \"cu_seqlens_kv\": [0, 1]}",
       0, 422, "invalid_option", "a pos past any integer");
  expect_healthy(&S, "the NULs");
}

Test(session_input, bytes_after_the_object_are_refused) {
  srv_start(&S, "--session-memory", "4M", NULL);
  call("PUT", "/v1/sessions/t", JSON_CT, SHAPE1 "} {\"ttl_s\": 5}", 0, 400, "malformed_json",
       "a create with a second object after it");
  call("GET", "/v1/sessions/t", JSON_CT, NULL, 0, 404, "session_not_found", "none was made");
  call("PUT", "/v1/sessions/t", JSON_CT, SHAPE1 "}\r\n", 0, 201, NULL, "white space after it");
  call("POST", "/v1/sessions/t/truncate", JSON_CT, "{\"length\": 0} x", 0, 400, "malformed_json",
       "a truncate with bytes after it");
}
