/*
 * test_dv_codecs.c — a value head dim of its own (v's last dimension Dv
 * differs from q's and k's D) through the codecs: the client's request
 * encoders write v, o and do of Dv that both decoders read back into a
 * request with head_dim_v; O (and a backward's dv) is allocated and written
 * with Dv by both reply encoders and read back by both reply decoders, bit
 * for bit, Dv above D and below it; and the refusals say what is allowed:
 * q and k of different D, v of another N, a backward o of D instead of Dv.
 * (Sessions with a value head dim of their own: test_session_codecs.c.)
 */
#include "helpers.h"
#include "proto.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* q [1, 2, 3, D], k [1, 1, 4, D], v [1, 1, 4, Dv] of F32 with distinct
 * values, in r; the buffers in bufs[0..4]. */
static void make_request(attn_request *r, int64_t d, int64_t dv, bool bwd, float *bufs[5]) {
  attn_request_init(r);
  r->batch = 1, r->heads_q = 2, r->heads_kv = 1, r->seq_q = 3, r->seq_kv = 4;
  r->head_dim = d, r->head_dim_v = dv, r->dtype = ATTN_F32;
  const size_t n[5] = {(size_t)(6 * d), (size_t)(4 * d), (size_t)(4 * dv), (size_t)(6 * dv),
                       (size_t)(6 * dv)};
  for (int i = 0; i < 5; i++) {
    bufs[i] = malloc(n[i] * sizeof(float));
    for (size_t k = 0; k < n[i]; k++)
      bufs[i][k] = (float)(i + 1) + (float)k / 64.0f;
  }
  r->q = bufs[0], r->k = bufs[1], r->v = bufs[2];
  if (bwd) {
    r->pass = ATTN_BACKWARD;
    r->o = bufs[3], r->dout = bufs[4];
  }
}

static void free_bufs(float *bufs[5]) {
  for (int i = 0; i < 5; i++)
    free(bufs[i]);
}

/* r through a request codec and back: the decoded request keeps every
 * tensor's shape and data and has head_dim_v. */
static void decode_request(const attn_request *r, bool st_codec, attn_proto_req *pr, void **buf) {
  size_t len;
  attn_status st;
  int rc = st_codec ? attn_proto_encode_request_safetensors(r, NULL, buf, &len, &st)
                    : attn_proto_encode_request_json(r, NULL, (char **)buf, &len, &st);
  cr_assert_eq(rc, 0, "%s", st.message);
  rc = st_codec ? attn_proto_decode_safetensors_pass(*buf, len, r->pass, NULL, pr, &st)
                : attn_proto_decode_json_pass(*buf, len, r->pass, NULL, pr, &st);
  cr_assert_eq(rc, 0, "%s", st.message);
  const attn_request *g = &pr->req;
  cr_expect_eq(g->head_dim, r->head_dim);
  cr_expect_eq(attn_request_dv(g), attn_request_dv(r));
  cr_expect_eq(pr->shape_o[3], attn_request_dv(r));
  cr_expect_eq(pr->shape_v[3], attn_request_dv(r));
  cr_expect(!memcmp(g->v, r->v, (size_t)(4 * attn_request_dv(r)) * sizeof(float)), "v");
  cr_expect(!memcmp(g->k, r->k, (size_t)(4 * r->head_dim) * sizeof(float)), "k");
  if (r->pass == ATTN_BACKWARD)
    cr_expect(!memcmp(g->dout, r->dout, (size_t)(6 * attn_request_dv(r)) * sizeof(float)), "do");
}

/* pr's outputs filled with distinct values, written by a reply encoder and
 * read back into a second decode of the same request. */
static void reply_round_trip(attn_proto_req *pr, bool st_codec, const void *req_buf,
                             size_t req_len) {
  float *out = pr->out;
  for (size_t k = 0; k < pr->out_bytes / sizeof(float); k++)
    out[k] = 0.5f + (float)k;
  attn_status st;
  void *rep;
  size_t rlen;
  int rc = st_codec ? attn_proto_encode_safetensors(pr, &rep, &rlen, &st)
                    : attn_proto_encode_json(pr, NULL, (char **)&rep, &rlen, &st);
  cr_assert_eq(rc, 0, "%s", st.message);
  attn_proto_req back;
  rc = st_codec
           ? attn_proto_decode_safetensors_pass(req_buf, req_len, pr->req.pass, NULL, &back, &st)
           : attn_proto_decode_json_pass(req_buf, req_len, pr->req.pass, NULL, &back, &st);
  cr_assert_eq(rc, 0, "%s", st.message);
  cr_assert_eq(back.out_bytes, pr->out_bytes);
  rc = st_codec ? attn_proto_decode_reply_safetensors(rep, rlen, &back, &st)
                : attn_proto_decode_reply_json(rep, rlen, &back, NULL, 0, &st);
  cr_assert_eq(rc, 0, "%s", st.message);
  cr_expect(!memcmp(back.out, pr->out, pr->out_bytes), "the outputs read back as written");
  attn_proto_req_free(&back);
  free(rep);
}

static void round_trip(int64_t d, int64_t dv, bool bwd, bool st_codec) {
  attn_request r;
  float *bufs[5];
  make_request(&r, d, dv, bwd, bufs);
  attn_proto_req pr;
  void *buf;
  decode_request(&r, st_codec, &pr, &buf);
  const size_t es = sizeof(float), rows_q = 6, rows_kv = 4;
  size_t want =
      bwd ? (rows_q * (size_t)d + rows_kv * (size_t)(d + dv)) * es : rows_q * (size_t)dv * es;
  cr_expect_eq(pr.out_bytes, want, "D %lld Dv %lld: %zu output bytes, want %zu", (long long)d,
               (long long)dv, pr.out_bytes, want);
  size_t len;
  /* again, for the body's length (decode_request keeps only the bytes) */
  attn_status st;
  void *again;
  int rc = st_codec ? attn_proto_encode_request_safetensors(&r, NULL, &again, &len, &st)
                    : attn_proto_encode_request_json(&r, NULL, (char **)&again, &len, &st);
  cr_assert_eq(rc, 0, "%s", st.message);
  reply_round_trip(&pr, st_codec, again, len);
  free(again);
  free(buf);
  attn_proto_req_free(&pr);
  free_bufs(bufs);
}

Test(dv_codecs, forward_round_trips_both_ways) {
  for (int c = 0; c < 2; c++) {
    round_trip(4, 2, false, c == 1);
    round_trip(32, 64, false, c == 1);
    round_trip(192, 128, false, c == 1);
  }
}

Test(dv_codecs, backward_round_trips_both_ways) {
  for (int c = 0; c < 2; c++) {
    round_trip(4, 2, true, c == 1);
    round_trip(8, 24, true, c == 1);
  }
}

Test(dv_codecs, reply_shapes_give_o_and_dv_their_own) {
  attn_request r;
  float *bufs[5];
  make_request(&r, 6, 3, true, bufs);
  attn_proto_req pr;
  void *buf;
  decode_request(&r, false, &pr, &buf);
  char *rep;
  size_t len;
  attn_status st;
  cr_assert_eq(attn_proto_encode_json(&pr, NULL, &rep, &len, &st), 0, "%s", st.message);
  cr_expect(strstr(rep, "\"dq\": {\"shape\": [1, 2, 3, 6]"), "%.200s", rep);
  cr_expect(strstr(rep, "\"dk\": {\"shape\": [1, 1, 4, 6]"), "%.200s", rep);
  cr_expect(strstr(rep, "\"dv\": {\"shape\": [1, 1, 4, 3]"), "%.200s", rep);
  free(rep);
  free(buf);
  attn_proto_req_free(&pr);
  free_bufs(bufs);
}

static void expect_json_err(const char *body, attn_pass pass, int code, const char *needle) {
  attn_proto_req pr;
  attn_status st = {0};
  int rc = attn_proto_decode_json_pass(body, strlen(body), pass, NULL, &pr, &st);
  cr_expect_eq(rc, code, "want %s, got %d: %s", attn_proto_code_name(code), rc, st.message);
  cr_expect_eq(attn_proto_http_status(rc), 422, "%s", st.message);
  cr_expect(strstr(st.message, needle), "message \"%s\" lacks \"%s\"", st.message, needle);
  if (rc == 0)
    attn_proto_req_free(&pr);
}

#define T(name, shape, data) \
  "\"" name "\": {\"shape\": " shape ", \"dtype\": \"F32\", \"data\": " data "}"

Test(dv_codecs, refusals_say_what_is_allowed) {
  expect_json_err("{" T("q", "[1, 4]", "[1, 2, 3, 4]") ", " T("k", "[1, 3]", "[1, 2, 3]") ", " T(
                      "v", "[1, 2]", "[1, 2]") "}",
                  ATTN_FORWARD, ATTN_PROTO_ESHAPE, "q and k must share D (only v may have");
  expect_json_err("{" T("q", "[1, 4]", "[1, 2, 3, 4]") ", " T("k", "[1, 4]", "[1, 2, 3, 4]") ", " T(
                      "v", "[2, 2]", "[1, 2, 3, 4]") "}",
                  ATTN_FORWARD, ATTN_PROTO_ESHAPE, "they must match but for the last dimension");
  expect_json_err(
      "{" T("q", "[1, 4]", "[1, 2, 3, 4]") ", " T("k", "[1, 4]", "[1, 2, 3, 4]") ", " T(
          "v", "[1, 2]", "[1, 2]") ", " T("o", "[1, 4]", "[1, 2, 3, 4]") ", " T("do", "[1, 2]",
                                                                                "[1, 2]") "}",
      ATTN_BACKWARD, ATTN_PROTO_ESHAPE,
      "tensor \"o\" has shape [1, 4]; it must be [1, 2] (o's shape: q's with v's last dimension "
      "Dv)");
  expect_json_err(
      "{" T("q", "[1, 4]", "[1, 2, 3, 4]") ", " T("k", "[1, 4]", "[1, 2, 3, 4]") ", " T(
          "v", "[1, 2]", "[1, 2]") ", " T("o", "[1, 2]", "[1, 2]") ", " T("do", "[1, 4]",
                                                                          "[1, 2, 3, 4]") "}",
      ATTN_BACKWARD, ATTN_PROTO_ESHAPE, "tensor \"do\" has shape [1, 4]; it must be [1, 2]");
  /* v wider than the limit: the engine's bound, named by the request's field */
  char body[8192];
  size_t o = (size_t)snprintf(
      body, sizeof body,
      "{" T("q", "[1, 4]", "[1, 2, 3, 4]") ", " T("k", "[1, 4]", "[1, 2, 3, 4]") ", \"v\": [[");
  for (int i = 0; i < ATTN_MAX_HEAD_DIM_V + 1; i++)
    o += (size_t)snprintf(body + o, sizeof body - o, i ? ",1" : "1");
  snprintf(body + o, sizeof body - o, "]]}");
  expect_json_err(body, ATTN_FORWARD, ATTN_ESHAPE,
                  "head_dim_v (v's last dimension) must be between 1 and 512");
}
