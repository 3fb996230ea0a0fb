/*
 * test_variants_codecs.c — softcap and alibi_slopes through every codec:
 * JSON, safetensors and /v2 decode them into the engine request (and
 * refuse bad ones with the table's code and a message), and the client
 * encoders write bodies the decoders read back to the same request.
 */
#include "helpers.h"
#include "proto.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
  cr_expect(strstr(st.message, needle), "message \"%s\" lacks \"%s\"", st.message, needle);
  if (rc == 0)
    attn_proto_req_free(&pr);
}

Test(variants_codecs, json_decodes_both) {
  attn_proto_req pr;
  attn_status st;
  cr_assert_eq(json("{" QKV ", \"alibi_slopes\": {\"shape\": [2], \"dtype\": \"F32\", \"data\": "
                    "[0.5, 0.25]}, \"softcap\": 30}",
                    &pr, &st),
               0, "%s", st.message);
  cr_expect_eq(pr.req.softcap, 30.0);
  cr_assert(pr.req.alibi_slopes);
  cr_expect_eq(pr.req.alibi_slopes[1], 0.25f);
  cr_expect_eq(pr.req.alibi_stride_b, 0);
  attn_proto_req_free(&pr);
  /* nested arrays: [B, Hq] */
  cr_assert_eq(json("{" QKV ", \"alibi_slopes\": [[0.5, 0.25], [1, 2]]}", &pr, &st), 0, "%s",
               st.message);
  cr_expect_eq(pr.req.alibi_stride_b, 2);
  cr_expect_eq(pr.req.alibi_slopes[2], 1.0f);
  cr_expect_eq(pr.req.softcap, 0.0);
  attn_proto_req_free(&pr);
}

Test(variants_codecs, json_refusals) {
  expect_json_err("{" QKV ", \"softcap\": -1}", ATTN_PROTO_EOPTVALUE,
                  "option \"softcap\" in the JSON field must be a finite number >= 0 (0: off)");
  expect_json_err("{" QKV ", \"softcap\": \"x\"}", ATTN_PROTO_EOPTVALUE, "softcap");
  expect_json_err("{" QKV ", \"softcap\": 1e300}", ATTN_EINVAL, "softcap must be 0 (off)");
  expect_json_err("{" QKV ", \"alibi_slopes\": [0.5, 0.25, 1]}", ATTN_PROTO_ESHAPE,
                  "tensor \"alibi_slopes\" has shape [3]; it must be [2] (one slope a query head) "
                  "or [2, 2]");
  expect_json_err("{" QKV ", \"alibi_slopes\": {\"shape\": [2], \"dtype\": \"F16\", \"data\": "
                  "[1, 2]}}",
                  ATTN_PROTO_EDTYPE, "tensor \"alibi_slopes\" is F16; it must be F32");
  expect_json_err("{" QKV ", \"alibi_slopes\": [[[1, 2]]]}", ATTN_PROTO_ETENSOR,
                  "tensor \"alibi_slopes\" has 3 dimensions; use [Hq] or [B, Hq]");
  expect_json_err("{" QKV ", \"alibi_slopes\": [1e38, 1]}", ATTN_ERANGE,
                  "alibi_slopes: slope 1e+38");
  expect_json_err("{" QKV ", \"alibi\": [1, 1]}", ATTN_PROTO_EUNKNOWNTENSOR,
                  "send exactly q, k and v (and optionally alibi_slopes,");
}

Test(variants_codecs, query_and_metadata_softcap) {
  attn_options o;
  attn_options_init(&o);
  attn_status st;
  cr_expect_eq(attn_options_parse_query(&o, "softcap=50", &st), 0, "%s", st.message);
  cr_expect_eq(o.softcap, 50.0);
  cr_expect(o.set & ATTN_OPT_SOFTCAP);
  cr_expect_eq(attn_options_parse_query(&o, "softcap=nan", &st), ATTN_PROTO_EOPTVALUE);
  cr_expect_eq(attn_options_parse_query(&o, "softcap=-0.5", &st), ATTN_PROTO_EOPTVALUE);
  cr_expect_eq(attn_options_parse_query(&o, "softcap=0", &st), 0);
  cr_expect_eq(o.softcap, 0.0);
}

/* A request with both variants, written by each client encoder and read
 * back by the matching decoder: the same slopes, stride and softcap. */
static void roundtrip(bool per_batch) {
  tprob p = tprob_make(2, 4, 2, 3, 5, 8, ATTN_BF16);
  p.alibi = per_batch ? 2 : 1;
  tcase c;
  tcase_init(&c, &p, 3);
  attn_options o;
  attn_options_init(&o);
  o.softcap = 12.5;
  o.set |= ATTN_OPT_SOFTCAP;
  attn_status st;
  const int64_t ns = per_batch ? 8 : 4;
  for (int codec = 0; codec < 2; codec++) {
    void *buf;
    size_t len;
    attn_proto_req pr;
    int rc = codec ? attn_proto_encode_request_json(&c.req, &o, (char **)&buf, &len, &st)
                   : attn_proto_encode_request_safetensors(&c.req, &o, &buf, &len, &st);
    cr_assert_eq(rc, 0, "%s", st.message);
    rc = codec ? attn_proto_decode_json(buf, len, NULL, &pr, &st)
               : attn_proto_decode_safetensors(buf, len, NULL, &pr, &st);
    cr_assert_eq(rc, 0, "%s: %s", codec ? "json" : "safetensors", st.message);
    cr_expect_eq(pr.req.softcap, 12.5);
    cr_expect_eq(pr.req.alibi_stride_b, per_batch ? 4 : 0);
    cr_assert(pr.req.alibi_slopes);
    cr_expect_eq(memcmp(pr.req.alibi_slopes, c.alibi, (size_t)ns * sizeof(float)), 0);
    attn_proto_req_free(&pr);
    free(buf);
  }
  tcase_free(&c);
}

Test(variants_codecs, client_roundtrip) {
  roundtrip(false);
  roundtrip(true);
}

static int v2(const char *body, attn_proto_req *pr, attn_status *st) {
  attn_v2_info info;
  return attn_proto_decode_v2(body, strlen(body), strlen(body), pr, &info, st);
}

#define V2QKV                                                                                    \
  "{\"name\": \"q\", \"shape\": [1, 2, 1, 2], \"datatype\": \"FP32\", \"data\": [1, 2, 3, 4]}, " \
  "{\"name\": \"k\", \"shape\": [1, 1, 1, 2], \"datatype\": \"FP32\", \"data\": [1, 2]}, "       \
  "{\"name\": \"v\", \"shape\": [1, 1, 1, 2], \"datatype\": \"FP32\", \"data\": [1, 2]}"

Test(variants_codecs, v2) {
  attn_proto_req pr;
  attn_status st;
  cr_assert_eq(v2("{\"inputs\": [{\"name\": \"alibi_slopes\", \"shape\": [2], \"datatype\": "
                  "\"FP32\", \"data\": [0.5, 0.125]}, " V2QKV "], \"parameters\": {\"softcap\": "
                  "20}}",
                  &pr, &st),
               0, "%s", st.message);
  cr_expect_eq(pr.req.softcap, 20.0);
  cr_assert(pr.req.alibi_slopes);
  cr_expect_eq(pr.req.alibi_slopes[1], 0.125f);
  attn_proto_req_free(&pr);
  cr_expect_eq(v2("{\"inputs\": [" V2QKV "], \"parameters\": {\"softcap\": -2}}", &pr, &st),
               ATTN_PROTO_EOPTVALUE);
  cr_expect_eq(v2("{\"inputs\": [" V2QKV ", {\"name\": \"alibi_slopes\", \"shape\": [1, 2, 1], "
                  "\"datatype\": \"FP32\", \"data\": [1, 2]}]}",
                  &pr, &st),
               ATTN_PROTO_ETENSOR);
  cr_expect(strstr(st.message, "use [Hq] or [B, Hq]"), "%s", st.message);
  cr_expect_eq(v2("{\"inputs\": [" V2QKV ", {\"name\": \"alibi_slopes\", \"shape\": [2], "
                  "\"datatype\": \"FP16\", \"data\": [1, 2]}]}",
                  &pr, &st),
               ATTN_PROTO_EDTYPE);
}
