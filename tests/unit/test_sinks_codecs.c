/*
 * test_sinks_codecs.c — sinks (F32 [Hq]) through every codec: JSON,
 * safetensors, /v2 and a session call decode them into the engine request
 * and refuse a wrong shape, rank, dtype or value with the table's code and
 * a message naming sinks; a backward request gets dsinks [Hq] among its
 * outputs, which both reply encoders write and both reply decoders read
 * back; the client encoders write sinks the decoders read back bit for bit.
 */
#include "helpers.h"
#include "proto.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Hq 2, Hkv 1: sinks are [2]. */
#define QKV                                                                                    \
  "\"q\": {\"shape\": [2, 2, 1, 2], \"dtype\": \"F32\", \"data\": [1, 2, 3, 4, 5, 6, 7, 8]}, " \
  "\"k\": {\"shape\": [2, 1, 1, 2], \"dtype\": \"F32\", \"data\": [1, 2, 3, 4]}, "             \
  "\"v\": {\"shape\": [2, 1, 1, 2], \"dtype\": \"F32\", \"data\": [1, 2, 3, 4]}"

static int json(const char *body, attn_proto_req *pr, attn_status *st) {
  return attn_proto_decode_json(body, strlen(body), NULL, pr, st);
}

static void expect_json_err(const char *body, int code, const char *needle) {
  attn_proto_req pr;
  attn_status st = {0};
  int rc = json(body, &pr, &st);
  cr_expect_eq(rc, code, "want %s, got %d: %s", attn_proto_code_name(code), rc, st.message);
  cr_expect_eq(attn_proto_http_status(rc), 422, "%s", st.message);
  cr_expect(strstr(st.message, needle), "message \"%s\" lacks \"%s\"", st.message, needle);
  if (rc == 0)
    attn_proto_req_free(&pr);
}

Test(sinks_codecs, json_decodes_both_forms) {
  attn_proto_req pr;
  attn_status st;
  cr_assert_eq(json("{" QKV ", \"sinks\": {\"shape\": [2], \"dtype\": \"F32\", \"data\": "
                    "[0.5, -1.25]}}",
                    &pr, &st),
               0, "%s", st.message);
  cr_assert(pr.req.sinks);
  cr_expect(pr.req.sinks[0] == 0.5f && pr.req.sinks[1] == -1.25f);
  cr_expect(!pr.req.dsinks, "a forward pass has no dsinks");
  attn_proto_req_free(&pr);
  cr_assert_eq(json("{" QKV ", \"sinks\": [3, 4]}", &pr, &st), 0, "%s", st.message);
  cr_expect(pr.req.sinks[0] == 3.0f && pr.req.sinks[1] == 4.0f);
  attn_proto_req_free(&pr);
  cr_assert_eq(json("{" QKV "}", &pr, &st), 0, "%s", st.message);
  cr_expect(!pr.req.sinks);
  attn_proto_req_free(&pr);
}

Test(sinks_codecs, json_refusals) {
  expect_json_err("{" QKV ", \"sinks\": [1, 2, 3]}", ATTN_PROTO_ESHAPE,
                  "tensor \"sinks\" has shape [3]; it must be [2] (one logit a query head");
  expect_json_err("{" QKV ", \"sinks\": [[1, 2]]}", ATTN_PROTO_ETENSOR,
                  "tensor \"sinks\" has 2 dimensions; use [Hq]");
  expect_json_err("{" QKV ", \"sinks\": {\"shape\": [2], \"dtype\": \"I32\", \"data\": [1, 2]}}",
                  ATTN_PROTO_ETENSOR, "tensor \"sinks\": unknown dtype \"I32\"");
  expect_json_err("{" QKV ", \"sinks\": {\"shape\": [2], \"dtype\": \"F16\", \"data\": [1, 2]}}",
                  ATTN_PROTO_EDTYPE, "tensor \"sinks\" is F16; it must be F32");
  expect_json_err("{" QKV ", \"sinks\": [1e999, 2]}", ATTN_PROTO_ENONFINITE,
                  "tensor \"sinks\": element [0] is not finite");
  expect_json_err("{" QKV ", \"sink\": [1, 1]}", ATTN_PROTO_EUNKNOWNTENSOR, "sinks");
}

/* A safetensors body of q, k, v (F32 [1, Hq 2 or Hkv 1, 1, 2]) and a
 * sinks entry of the given dtype, shape and bytes. */
static char *st_body(const char *dtype, const char *shape, const void *sinks, size_t sbytes,
                     size_t *plen) {
  char h[512];
  int n = snprintf(h, sizeof h,
                   "{\"q\":{\"dtype\":\"F32\",\"shape\":[1,2,1,2],\"data_offsets\":[0,16]},"
                   "\"k\":{\"dtype\":\"F32\",\"shape\":[1,1,1,2],\"data_offsets\":[16,24]},"
                   "\"v\":{\"dtype\":\"F32\",\"shape\":[1,1,1,2],\"data_offsets\":[24,32]},"
                   "\"sinks\":{\"dtype\":\"%s\",\"shape\":%s,\"data_offsets\":[32,%zu]}}",
                   dtype, shape, 32 + sbytes);
  while (n % 8)
    h[n++] = ' ';
  char *b = malloc(8 + (size_t)n + 32 + sbytes);
  for (int i = 0; i < 8; i++)
    b[i] = (char)((uint64_t)n >> (8 * i));
  memcpy(b + 8, h, (size_t)n);
  const float qkv[8] = {1, 2, 3, 4, 0.5f, 0.25f, 1, -1};
  memcpy(b + 8 + n, qkv, 32);
  memcpy(b + 8 + n + 32, sinks, sbytes);
  *plen = 8 + (size_t)n + 32 + sbytes;
  return b;
}

static int st_decode(const char *dtype, const char *shape, const void *sinks, size_t sbytes,
                     attn_proto_req *pr, attn_status *st) {
  size_t len;
  char *b = st_body(dtype, shape, sinks, sbytes, &len);
  /* the request points into the body: copy the sinks out before freeing it */
  int rc = attn_proto_decode_safetensors(b, len, NULL, pr, st);
  static float got[4];
  if (rc == 0 && pr->req.sinks) {
    memcpy(got, pr->req.sinks, 2 * sizeof *got);
    pr->req.sinks = got;
  }
  free(b);
  return rc;
}

Test(sinks_codecs, safetensors) {
  attn_proto_req pr;
  attn_status st;
  const float s2[3] = {0.75f, -2, 9};
  cr_assert_eq(st_decode("F32", "[2]", s2, 8, &pr, &st), 0, "%s", st.message);
  cr_expect(pr.req.sinks && pr.req.sinks[0] == 0.75f && pr.req.sinks[1] == -2.0f);
  attn_proto_req_free(&pr);
  cr_expect_eq(st_decode("F32", "[3]", s2, 12, &pr, &st), ATTN_PROTO_ESHAPE);
  cr_expect(strstr(st.message, "tensor \"sinks\" has shape [3]; it must be [2]"), "%s", st.message);
  cr_expect_eq(st_decode("F32", "[1,2]", s2, 8, &pr, &st), ATTN_PROTO_ESHAPE);
  cr_expect(strstr(st.message, "tensor \"sinks\" has shape [1, 2]; it must be [2]"), "%s",
            st.message);
  const int32_t i2[2] = {1, 2};
  cr_expect_eq(st_decode("I32", "[2]", i2, 8, &pr, &st), ATTN_PROTO_ETENSOR);
  cr_expect(strstr(st.message, "tensor \"sinks\": dtype \"I32\" is not supported"), "%s",
            st.message);
  const float nan2[2] = {1, NAN};
  int rc = st_decode("F32", "[2]", nan2, 8, &pr, &st);
  cr_expect_eq(rc, ATTN_ENONFINITE, "%s", st.message);
  cr_expect_eq(attn_proto_http_status(rc), 422);
  cr_expect_str_eq(attn_proto_code_name(rc), attn_proto_code_name(ATTN_PROTO_ENONFINITE));
  cr_expect(strstr(st.message, "sinks"), "%s", st.message);
}

/* A request with sinks, written by each client encoder, read back by the
 * matching decoder: the same sinks, and for a backward request a dsinks
 * output of Hq floats inside the output buffer. */
static void roundtrip(attn_pass pass) {
  tprob p = tprob_make(2, 4, 2, 3, 5, 8, ATTN_BF16);
  tcase c;
  tcase_init(&c, &p, 3);
  const float sinks[4] = {0.5f, -1, 2.25f, 0};
  c.req.sinks = sinks;
  attn_status st;
  if (pass == ATTN_BACKWARD)
    cr_assert_eq(tcase_backward(&c, true, 5, &st), 0, "%s", st.message);
  for (int codec = 0; codec < 2; codec++) {
    void *buf;
    size_t len;
    attn_proto_req pr;
    int rc = codec ? attn_proto_encode_request_json(&c.req, NULL, (char **)&buf, &len, &st)
                   : attn_proto_encode_request_safetensors(&c.req, NULL, &buf, &len, &st);
    cr_assert_eq(rc, 0, "%s", st.message);
    rc = codec ? attn_proto_decode_json_pass(buf, len, pass, NULL, &pr, &st)
               : attn_proto_decode_safetensors_pass(buf, len, pass, NULL, &pr, &st);
    cr_assert_eq(rc, 0, "%s: %s", codec ? "json" : "safetensors", st.message);
    cr_assert(pr.req.sinks);
    cr_expect_eq(memcmp(pr.req.sinks, sinks, sizeof sinks), 0);
    if (pass == ATTN_BACKWARD) {
      const char *d = (const char *)pr.req.dsinks, *o = pr.out;
      cr_assert(d, "a backward request with sinks has dsinks");
      cr_expect(d >= o && d + sizeof sinks <= o + pr.out_bytes);
      cr_expect_eq((uintptr_t)d % 4, 0);
    }
    attn_proto_req_free(&pr);
    free(buf);
  }
  tcase_free(&c);
}

Test(sinks_codecs, client_roundtrip) {
  roundtrip(ATTN_FORWARD);
  roundtrip(ATTN_BACKWARD);
}

/* A backward request of {QKV, o, do, sinks} as decoded, for the replies. */
#define OD                                                                                     \
  "\"o\": {\"shape\": [2, 2, 1, 2], \"dtype\": \"F32\", \"data\": [1, 2, 3, 4, 5, 6, 7, 8]}, " \
  "\"do\": {\"shape\": [2, 2, 1, 2], \"dtype\": \"F32\", \"data\": [1, 0, 0, 1, 1, 1, 2, 2]}"

static void bwd_req(bool sinks, attn_proto_req *pr) {
  const char *b = sinks ? "{" QKV ", " OD ", \"sinks\": [0.5, -0.5]}" : "{" QKV ", " OD "}";
  attn_status st;
  cr_assert_eq(attn_proto_decode_json_pass(b, strlen(b), ATTN_BACKWARD, NULL, pr, &st), 0, "%s",
               st.message);
  float *f = pr->out;
  for (size_t i = 0; i < pr->out_bytes / sizeof *f; i++)
    f[i] = (float)i * 0.5f - 3;
}

Test(sinks_codecs, backward_reply_carries_dsinks) {
  attn_proto_req pr, back;
  attn_status st;
  bwd_req(true, &pr);
  cr_assert(pr.req.dsinks);
  const float want[2] = {pr.req.dsinks[0], pr.req.dsinks[1]};
  for (int codec = 0; codec < 2; codec++) {
    void *buf;
    size_t len;
    int rc = codec ? attn_proto_encode_json(&pr, "cpu", (char **)&buf, &len, &st)
                   : attn_proto_encode_safetensors(&pr, &buf, &len, &st);
    cr_assert_eq(rc, 0, "%s", st.message);
    if (codec)
      cr_expect(strstr(buf, "\"dsinks\": {\"shape\": [2], \"dtype\": \"F32\""), "%s", (char *)buf);
    bwd_req(true, &back);
    memset(back.out, 0, back.out_bytes);
    rc = codec ? attn_proto_decode_reply_json(buf, len, &back, NULL, 0, &st)
               : attn_proto_decode_reply_safetensors(buf, len, &back, &st);
    cr_assert_eq(rc, 0, "%s", st.message);
    cr_expect(back.req.dsinks[0] == want[0] && back.req.dsinks[1] == want[1]);
    attn_proto_req_free(&back);
    /* the same reply for a request without sinks: dsinks came unasked */
    bwd_req(false, &back);
    cr_expect(!back.req.dsinks);
    rc = codec ? attn_proto_decode_reply_json(buf, len, &back, NULL, 0, &st)
               : attn_proto_decode_reply_safetensors(buf, len, &back, &st);
    cr_expect_eq(rc, ATTN_PROTO_EUNKNOWNTENSOR, "%s", st.message);
    cr_expect(strstr(st.message, "dsinks"), "%s", st.message);
    attn_proto_req_free(&back);
    free(buf);
  }
  attn_proto_req_free(&pr);
}

static int v2(const char *body, attn_proto_req *pr, attn_status *st) {
  attn_v2_info info;
  return attn_proto_decode_v2(body, strlen(body), strlen(body), pr, &info, st);
}

#define V2QKV                                                                                    \
  "{\"name\": \"q\", \"shape\": [1, 2, 1, 2], \"datatype\": \"FP32\", \"data\": [1, 2, 3, 4]}, " \
  "{\"name\": \"k\", \"shape\": [1, 1, 1, 2], \"datatype\": \"FP32\", \"data\": [1, 2]}, "       \
  "{\"name\": \"v\", \"shape\": [1, 1, 1, 2], \"datatype\": \"FP32\", \"data\": [1, 2]}"

static void expect_v2_err(const char *sinks, int code, const char *needle) {
  char body[1024];
  snprintf(body, sizeof body, "{\"inputs\": [" V2QKV ", {\"name\": \"sinks\", %s}]}", sinks);
  attn_proto_req pr;
  attn_status st = {0};
  int rc = v2(body, &pr, &st);
  cr_expect_eq(rc, code, "want %s, got %d: %s", attn_proto_code_name(code), rc, st.message);
  cr_expect_eq(attn_proto_http_status(rc), 422);
  cr_expect(strstr(st.message, needle), "message \"%s\" lacks \"%s\"", st.message, needle);
  if (rc == 0)
    attn_proto_req_free(&pr);
}

Test(sinks_codecs, v2_input) {
  attn_proto_req pr;
  attn_status st;
  cr_assert_eq(v2("{\"inputs\": [{\"name\": \"sinks\", \"shape\": [2], \"datatype\": \"FP32\", "
                  "\"data\": [0.5, 0.125]}, " V2QKV "]}",
                  &pr, &st),
               0, "%s", st.message);
  cr_assert(pr.req.sinks);
  cr_expect(pr.req.sinks[0] == 0.5f && pr.req.sinks[1] == 0.125f);
  attn_proto_req_free(&pr);
  /* binary data, after q's */
  const char json[] = "{\"inputs\": [" V2QKV ", {\"name\": \"sinks\", \"shape\": [2], "
                      "\"datatype\": \"FP32\", \"parameters\": {\"binary_data_size\": 8}}]}";
  char body[sizeof json + 8];
  const float s[2] = {-3, 4.5f};
  memcpy(body, json, sizeof json - 1);
  memcpy(body + sizeof json - 1, s, 8);
  attn_v2_info info;
  cr_assert_eq(attn_proto_decode_v2(body, sizeof json - 1 + 8, sizeof json - 1, &pr, &info, &st), 0,
               "%s", st.message);
  cr_expect(pr.req.sinks && pr.req.sinks[0] == -3.0f && pr.req.sinks[1] == 4.5f);
  attn_proto_req_free(&pr);
  expect_v2_err("\"shape\": [3], \"datatype\": \"FP32\", \"data\": [1, 2, 3]", ATTN_PROTO_ESHAPE,
                "tensor \"sinks\" has shape [3]; it must be [2]");
  expect_v2_err("\"shape\": [1, 2], \"datatype\": \"FP32\", \"data\": [1, 2]", ATTN_PROTO_ETENSOR,
                "input \"sinks\" has 2 dimensions; use [Hq]");
  expect_v2_err("\"shape\": [2], \"datatype\": \"INT32\", \"data\": [1, 2]", ATTN_PROTO_ETENSOR,
                "input \"sinks\": datatype \"INT32\" is not supported");
  expect_v2_err("\"shape\": [2], \"datatype\": \"FP16\", \"data\": [1, 2]", ATTN_PROTO_EDTYPE,
                "tensor \"sinks\" is F16; it must be F32");
  expect_v2_err("\"shape\": [2], \"datatype\": \"FP32\", \"data\": [1, 1e999]",
                ATTN_PROTO_ENONFINITE, "sinks");
}

#define SQ "\"q\": {\"shape\": [2, 1, 2], \"dtype\": \"F32\", \"data\": [1, 2, 3, 4]}"
#define SKV                                                               \
  "\"k\": {\"shape\": [1, 1, 2], \"dtype\": \"F32\", \"data\": [1, 0]}, " \
  "\"v\": {\"shape\": [1, 1, 2], \"dtype\": \"F32\", \"data\": [0, 1]}"

Test(sinks_codecs, session_call) {
  attn_proto_session ps;
  attn_proto_req pr;
  attn_status st;
  const char *b = "{" SQ ", " SKV ", \"pos\": 0, \"sinks\": [1.5, -2]}";
  attn_proto_session_init(&ps, false);
  cr_assert_eq(attn_proto_decode_session(b, strlen(b), true, NULL, &ps, &pr, &st), 0, "%s",
               st.message);
  cr_assert(pr.req.sinks);
  cr_expect(pr.req.sinks[0] == 1.5f && pr.req.sinks[1] == -2.0f);
  attn_proto_req_free(&pr);
  b = "{" SQ ", \"sinks\": [1, 2, 3]}";
  attn_proto_session_init(&ps, false);
  cr_expect_eq(attn_proto_decode_session(b, strlen(b), true, NULL, &ps, &pr, &st),
               ATTN_PROTO_ESHAPE);
  cr_expect(strstr(st.message, "tensor \"sinks\" has shape [3]; it must be [2]"), "%s", st.message);
}
