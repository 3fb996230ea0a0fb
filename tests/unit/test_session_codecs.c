/*
 * test_session_codecs.c — a session call's body (proto.h, "sessions"):
 * layer, pos and sessions from the query string, __metadata__ and JSON
 * fields, k and v optional, causal by default, the refusals; and the
 * small documents of the session routes (create, truncate, describe).
 */
#include "proto.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define Q "\"q\": {\"shape\": [2, 1, 2], \"dtype\": \"F32\", \"data\": [1, 2, 3, 4]}"
#define KV                                                                \
  "\"k\": {\"shape\": [1, 1, 2], \"dtype\": \"F32\", \"data\": [1, 0]}, " \
  "\"v\": {\"shape\": [1, 1, 2], \"dtype\": \"F32\", \"data\": [0, 1]}"

static int decode_json(const char *body, const char *query, bool batch, attn_proto_session *ps,
                       attn_proto_req *pr, attn_status *st) {
  attn_proto_session_init(ps, batch);
  return attn_proto_decode_session(body, strlen(body), true, query, ps, pr, st);
}

Test(session_codecs, json_fields_and_defaults) {
  attn_proto_session ps;
  attn_proto_req pr;
  attn_status st;
  cr_assert_eq(decode_json("{" Q ", " KV ", \"pos\": 7, \"layer\": 3}", NULL, false, &ps, &pr, &st),
               0, "%s", st.message);
  cr_expect_eq(ps.layer, 3);
  cr_expect(ps.npos == 1 && ps.pos[0] == 7);
  cr_expect(pr.req.causal, "a session call is causal by default");
  cr_expect(pr.req.heads_q == 2 && pr.req.heads_kv == 1 && pr.req.seq_kv == 1 && pr.req.k);
  cr_expect_str_eq(pr.req.backend, "cpu");
  attn_proto_req_free(&pr);
  /* no new tokens: k and v absent; the query's layer, the body's causal */
  cr_assert_eq(decode_json("{" Q ", \"causal\": false}", "layer=1", false, &ps, &pr, &st), 0, "%s",
               st.message);
  cr_expect(!pr.req.k && !pr.req.v && pr.req.seq_kv == 0 && !pr.req.causal);
  cr_expect_eq(ps.layer, 1);
  attn_proto_req_free(&pr);
}

Test(session_codecs, refusals) {
  attn_proto_session ps;
  attn_proto_req pr;
  attn_status st;
  struct {
    const char *body, *query;
    int code;
    const char *needle;
  } cases[] = {
      {"{" Q ", " KV "}", NULL, ATTN_PROTO_EOPTVALUE, "\"pos\" is missing"},
      {"{" Q ", " KV ", \"pos\": [1, 2]}", NULL, ATTN_PROTO_EOPTVALUE, "an integer"},
      {"{" Q ", " KV ", \"pos\": -1}", NULL, ATTN_PROTO_EOPTVALUE, "pos"},
      {"{" Q ", " KV ", \"pos\": 1.5}", NULL, ATTN_PROTO_EOPTVALUE, "pos"},
      {"{" Q ", " KV "}", "pos=1,2", ATTN_PROTO_EOPTVALUE, "one integer"},
      {"{" Q ", " KV ", \"pos\": 0, \"layer\": 5000}", NULL, ATTN_PROTO_EOPTVALUE, "layer"},
      {"{" Q ", \"k\": {\"shape\": [1, 1, 2], \"dtype\": \"F32\", \"data\": [1, 0]}, \"pos\": 0}",
       NULL, ATTN_PROTO_EMISSING, "\"v\" is missing"},
      {"{" Q ", " KV ", \"pos\": 0, \"diag_offset\": 0}", NULL, ATTN_PROTO_EOPTVALUE,
       "diag_offset"},
      {"{" Q ", " KV ", \"pos\": 0, \"backend\": \"cuda\"}", NULL, ATTN_PROTO_EOPTVALUE, "cpu"},
      {"{" Q ", " KV ", \"pos\": 0, \"sessions\": [\"a\"]}", NULL, ATTN_PROTO_EUNKNOWNTENSOR, ""},
      {"{\"q\": {\"shape\": [1, 2, 1, 2], \"dtype\": \"F32\", \"data\": [1, 2, 3, 4]}}", NULL,
       ATTN_PROTO_ESHAPE, "rank 4"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    int rc = decode_json(cases[i].body, cases[i].query, false, &ps, &pr, &st);
    cr_expect_eq(rc, cases[i].code, "case %zu: %d (%s)", i, rc, rc ? st.message : "ok");
    if (rc)
      cr_expect(strstr(st.message, cases[i].needle), "case %zu: %s", i, st.message);
    attn_proto_req_free(&pr);
  }
  /* the fields are unknown options to a plain request */
  attn_options q;
  attn_options_init(&q);
  const char *plain = "{" Q ", " KV ", \"pos\": 0}";
  cr_expect_eq(attn_proto_decode_json(plain, strlen(plain), &q, &pr, &st), ATTN_PROTO_EOPTION);
  attn_proto_req_free(&pr);
}

#define CU(name) "\"" name "\": {\"shape\": [3], \"dtype\": \"I32\", \"data\": [0, 1, 2]}"
#define QB "\"q\": {\"shape\": [1, 2, 2], \"dtype\": \"F32\", \"data\": [1, 2, 3, 4]}"
#define KVB                                                                     \
  "\"k\": {\"shape\": [1, 2, 2], \"dtype\": \"F32\", \"data\": [1, 0, 0, 1]}, " \
  "\"v\": {\"shape\": [1, 2, 2], \"dtype\": \"F32\", \"data\": [0, 1, 1, 0]}"

Test(session_codecs, batch_fields) {
  attn_proto_session ps;
  attn_proto_req pr;
  attn_status st;
  const char *ok = "{" QB ", " KVB ", " CU("cu_seqlens_q") ", " CU(
      "cu_seqlens_kv") ", \"sessions\": [\"a\", \"b-2\"], \"pos\": [4, 9], \"layer\": 2}";
  cr_assert_eq(decode_json(ok, NULL, true, &ps, &pr, &st), 0, "%s", st.message);
  cr_expect(ps.nids == 2 && !strcmp(ps.ids[0], "a") && !strcmp(ps.ids[1], "b-2"));
  cr_expect(ps.npos == 2 && ps.pos[0] == 4 && ps.pos[1] == 9 && ps.layer == 2);
  cr_expect(pr.req.cu_seqlens_q && pr.req.cu_seqlens_kv && pr.req.batch == 2);
  attn_proto_req_free(&pr);
  /* the same from a query string */
  const char *noids = "{" QB ", " KVB ", " CU("cu_seqlens_q") ", " CU("cu_seqlens_kv") "}";
  cr_assert_eq(decode_json(noids, "sessions=a,b&pos=4,9", true, &ps, &pr, &st), 0, "%s",
               st.message);
  cr_expect(ps.nids == 2 && ps.npos == 2 && ps.pos[1] == 9);
  attn_proto_req_free(&pr);
  cr_expect_eq(decode_json(noids, "sessions=a,_b&pos=4,9", true, &ps, &pr, &st),
               ATTN_PROTO_EOPTVALUE);
  cr_expect(strstr(st.message, "sessions[1]"), "%s", st.message);
  attn_proto_req_free(&pr);
  cr_expect_eq(decode_json(noids, "sessions=a,b&pos=4", true, &ps, &pr, &st), ATTN_PROTO_ESHAPE);
  attn_proto_req_free(&pr);
  cr_expect_eq(decode_json(noids, "pos=4,9", true, &ps, &pr, &st), ATTN_PROTO_EOPTVALUE);
  attn_proto_req_free(&pr);
  const char *nocu = "{" QB ", " KVB ", \"sessions\": [\"a\", \"b\"], \"pos\": [4, 9]}";
  cr_expect_eq(decode_json(nocu, NULL, true, &ps, &pr, &st), ATTN_PROTO_EMISSING);
  attn_proto_req_free(&pr);
}

/* A safetensors file of q (F32 [1, 1, 2]) and __metadata__ meta. */
static char *st_file(const char *meta, size_t *plen) {
  char h[256];
  int n = snprintf(h, sizeof h,
                   "{\"__metadata__\": %s, \"q\": {\"dtype\": \"F32\", \"shape\": [1, 1, 2], "
                   "\"data_offsets\": [0, 8]}}",
                   meta);
  char *b = calloc(1, 8 + (size_t)n + 8);
  for (int i = 0; i < 8; i++)
    b[i] = (char)((uint64_t)n >> (8 * i));
  memcpy(b + 8, h, (size_t)n);
  float q[2] = {1, 2};
  memcpy(b + 8 + n, q, 8);
  *plen = 8 + (size_t)n + 8;
  return b;
}

Test(session_codecs, safetensors_metadata) {
  attn_proto_session ps;
  attn_proto_req pr;
  attn_status st;
  size_t len;
  char *b = st_file("{\"layer\": \"4\", \"causal\": \"false\"}", &len);
  attn_proto_session_init(&ps, false);
  cr_assert_eq(attn_proto_decode_session(b, len, false, NULL, &ps, &pr, &st), 0, "%s", st.message);
  cr_expect(ps.layer == 4 && !pr.req.causal && !pr.req.k);
  attn_proto_req_free(&pr);
  free(b);
  b = st_file("{\"layer\": \"x\"}", &len);
  attn_proto_session_init(&ps, false);
  cr_expect_eq(attn_proto_decode_session(b, len, false, NULL, &ps, &pr, &st), ATTN_PROTO_EOPTVALUE);
  attn_proto_req_free(&pr);
  free(b);
}

Test(session_codecs, create_truncate_and_info) {
  attn_kv_shape sh;
  double ttl;
  attn_status st;
  const char *ok =
      "{\"heads_kv\": 8, \"head_dim\": 128, \"dtype\": \"BF16\", \"max_tokens\": 4096}";
  cr_assert_eq(attn_proto_session_create_decode(ok, strlen(ok), 86400, &sh, &ttl, &st), 0, "%s",
               st.message);
  cr_expect(sh.heads_kv == 8 && sh.head_dim == 128 && sh.dtype == ATTN_BF16 && sh.layers == 1 &&
            sh.max_tokens == 4096 && ttl == 600 && !sh.grow);
  const char *grow = "{\"heads_kv\": 1, \"head_dim\": 8, \"dtype\": \"F32\", \"max_tokens\": 9, "
                     "\"reserve\": \"grow\"}";
  cr_expect_eq(attn_proto_session_create_decode(grow, strlen(grow), 600, &sh, &ttl, &st), 0);
  cr_expect(sh.grow);
  const char *whole = "{\"heads_kv\": 1, \"head_dim\": 8, \"dtype\": \"F32\", \"max_tokens\": 9, "
                      "\"reserve\": \"whole\"}";
  cr_expect_eq(attn_proto_session_create_decode(whole, strlen(whole), 600, &sh, &ttl, &st), 0);
  cr_expect(!sh.grow);
  /* kv_dtype: F8_E4M3 or I8 quantized, the dtype's own name not */
  const char *kvq[] = {"F8_E4M3", "I8", "F32"};
  const attn_kv_quant want[] = {ATTN_KVQ_F8_E4M3, ATTN_KVQ_I8, ATTN_KVQ_NONE};
  for (int i = 0; i < 3; i++) {
    char body[160];
    snprintf(body, sizeof body,
             "{\"heads_kv\": 1, \"head_dim\": 8, \"dtype\": \"F32\", \"max_tokens\": 9, "
             "\"kv_dtype\": \"%s\"}",
             kvq[i]);
    cr_expect_eq(attn_proto_session_create_decode(body, strlen(body), 600, &sh, &ttl, &st), 0,
                 "%s: %s", kvq[i], st.message);
    cr_expect_eq(sh.kv_quant, want[i], "%s", kvq[i]);
  }
  const char *bad[] = {
      "{\"heads_kv\": 8, \"head_dim\": 128, \"dtype\": \"BF16\", \"max_tokens\": 4096, \"ttl_s\": "
      "99}",
      "{\"heads_kv\": 8, \"head_dim\": 128, \"dtype\": \"I8\", \"max_tokens\": 4096}",
      "{\"heads_kv\": 8, \"head_dim\": 577, \"dtype\": \"F32\", \"max_tokens\": 4096}",
      "{\"heads_kv\": 8, \"head_dim\": 128, \"dtype\": \"F32\", \"max_tokens\": 4096, \"x\": 1}",
      "{\"heads_kv\": 8, \"heads_kv\": 8, \"head_dim\": 1, \"dtype\": \"F32\", \"max_tokens\": 1}",
      "{\"heads_kv\": 8}",
      "[1]",
      "",
      "{\"heads_kv\": 1, \"head_dim\": 8, \"dtype\": \"F32\", \"max_tokens\": 9, \"reserve\": "
      "\"part\"}",
      "{\"heads_kv\": 1, \"head_dim\": 8, \"dtype\": \"F32\", \"max_tokens\": 9, \"reserve\": 1}",
      "{\"heads_kv\": 1, \"head_dim\": 8, \"dtype\": \"F32\", \"max_tokens\": 9, \"kv_dtype\": "
      "\"BF16\"}",
      "{\"heads_kv\": 1, \"head_dim\": 8, \"dtype\": \"F32\", \"max_tokens\": 9, \"kv_dtype\": "
      "\"F8_E5M2\"}",
      "{\"heads_kv\": 1, \"head_dim\": 8, \"dtype\": \"F32\", \"max_tokens\": 9, \"kv_dtype\": 8}"};
  const int codes[] = {ATTN_PROTO_EOPTVALUE, ATTN_EDTYPE,          ATTN_PROTO_EOPTVALUE,
                       ATTN_PROTO_EOPTION,   ATTN_PROTO_EJSON,     ATTN_PROTO_EOPTVALUE,
                       ATTN_PROTO_EJSON,     ATTN_PROTO_EEMPTY,    ATTN_PROTO_EOPTVALUE,
                       ATTN_PROTO_EOPTVALUE, ATTN_PROTO_EOPTVALUE, ATTN_PROTO_EOPTVALUE,
                       ATTN_PROTO_EOPTVALUE};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
    cr_expect_eq(attn_proto_session_create_decode(bad[i], strlen(bad[i]), 60, &sh, &ttl, &st),
                 codes[i], "case %zu: %s", i, st.message);
  int64_t n;
  cr_expect_eq(attn_proto_session_truncate_decode("{\"length\": 5}", 13, &n, &st), 0);
  cr_expect_eq(n, 5);
  cr_expect_eq(attn_proto_session_truncate_decode("{\"length\": \"5\"}", 15, &n, &st),
               ATTN_PROTO_EOPTVALUE);
  /* a fork: its new id checked as a path's, length and ttl_s optional */
  char id[ATTN_KV_ID_MAX + 1];
  double fttl;
  const char *fork = "{\"id\": \"b-1\", \"length\": 7, \"ttl_s\": 30}";
  cr_expect_eq(attn_proto_session_fork_decode(fork, strlen(fork), 60, id, &n, &fttl, &st), 0, "%s",
               st.message);
  cr_expect(!strcmp(id, "b-1") && n == 7 && fttl == 30);
  cr_expect_eq(attn_proto_session_fork_decode("{\"id\": \"b\"}", 11, 60, id, &n, &fttl, &st), 0);
  cr_expect(n == -1 && fttl == 0, "left out: each layer's length, the source's ttl_s");
  static const char *const bad_fork[] = {"{}",
                                         "{\"id\": \"_b\"}",
                                         "{\"id\": 1}",
                                         "{\"id\": \"b\", \"ttl_s\": 61}",
                                         "{\"id\": \"b\", \"length\": -1}",
                                         "{\"id\": \"b\", \"max_tokens\": 1}",
                                         ""};
  const int fork_codes[] = {ATTN_PROTO_EOPTVALUE, ATTN_EINVAL,          ATTN_PROTO_EOPTVALUE,
                            ATTN_PROTO_EOPTVALUE, ATTN_PROTO_EOPTVALUE, ATTN_PROTO_EOPTION,
                            ATTN_PROTO_EEMPTY};
  for (size_t i = 0; i < sizeof bad_fork / sizeof *bad_fork; i++)
    cr_expect_eq(
        attn_proto_session_fork_decode(bad_fork[i], strlen(bad_fork[i]), 60, id, &n, &fttl, &st),
        fork_codes[i], "fork case %zu: %s", i, st.message);
  attn_kv_info info = {
      .id = "s1",
      .shape = {.heads_kv = 2, .head_dim = 64, .dtype = ATTN_F16, .layers = 2, .max_tokens = 100},
      .ttl_s = 60,
      .expires = 130,
      .reserved_bytes = 524288,
      .shared_bytes = 131072,
      .used_bytes = 262144,
      .tokens = 7};
  int64_t lengths[2] = {4, 3};
  attn_sbuf b = {0};
  attn_proto_session_info_json(&b, &info, lengths, 100);
  cr_expect_str_eq(b.p,
                   "{\"id\": \"s1\", \"heads_kv\": 2, \"head_dim\": 64, \"dtype\": \"F16\", "
                   "\"kv_dtype\": \"F16\", \"layers\": 2, \"max_tokens\": 100, \"ttl_s\": 60, "
                   "\"head_dim_v\": 64, "
                   "\"lengths\": [4, 3], \"tokens\": 7, \"reserve\": \"whole\", "
                   "\"reserved_bytes\": 524288, \"used_bytes\": 262144, \"shared_bytes\": 131072, "
                   "\"expires_in_s\": 30.000}");
  free(b.p);
  /* a latent session says so, with its Dv */
  info.shape.head_dim_v = 48;
  info.shape.v_from_k = true;
  b = (attn_sbuf){0};
  attn_proto_session_info_json(&b, &info, lengths, 100);
  cr_expect(strstr(b.p, "\"ttl_s\": 60, \"head_dim_v\": 48, \"v_from_k\": 48, \"lengths\""), "%s",
            b.p);
  free(b.p);
  /* a quantized session says how its rows are stored */
  info.shape.kv_quant = ATTN_KVQ_I8;
  b = (attn_sbuf){0};
  attn_proto_session_info_json(&b, &info, lengths, 100);
  cr_expect(strstr(b.p, "\"dtype\": \"F16\", \"kv_dtype\": \"I8\", \"layers\""), "%s", b.p);
  free(b.p);
}

/* A create's body with head_dim d and the extra members more ("" or ", ..."). */
static int create_with(int d, const char *more, attn_kv_shape *sh, attn_status *st) {
  char body[256];
  double ttl;
  snprintf(body, sizeof body,
           "{\"heads_kv\": 1, \"head_dim\": %d, \"dtype\": \"F32\", \"max_tokens\": 8%s}", d, more);
  return attn_proto_session_create_decode(body, strlen(body), 600, sh, &ttl, st);
}

Test(session_codecs, create_takes_a_value_head_dim_and_a_latent_session) {
  attn_kv_shape sh;
  attn_status st = {0};
  cr_assert_eq(create_with(192, ", \"head_dim_v\": 128", &sh, &st), 0, "%s", st.message);
  cr_expect(sh.head_dim == 192 && sh.head_dim_v == 128 && !sh.v_from_k);
  cr_assert_eq(create_with(64, ", \"head_dim_v\": 512", &sh, &st), 0, "%s", st.message);
  cr_expect(sh.head_dim_v == 512 && !sh.v_from_k, "Dv above D, up to ATTN_MAX_HEAD_DIM_V");
  /* head_dim_v equal to head_dim is the create that leaves it out */
  cr_assert_eq(create_with(64, ", \"head_dim_v\": 64", &sh, &st), 0, "%s", st.message);
  cr_expect(sh.head_dim_v == 0 && !sh.v_from_k);
  cr_assert_eq(create_with(192, ", \"v_from_k\": 128", &sh, &st), 0, "%s", st.message);
  cr_expect(sh.head_dim == 192 && sh.head_dim_v == 128 && sh.v_from_k);
  cr_assert_eq(create_with(192, ", \"v_from_k\": 128, \"head_dim_v\": 128", &sh, &st), 0, "%s",
               st.message);
  cr_expect(sh.head_dim_v == 128 && sh.v_from_k);
  cr_assert_eq(create_with(64, ", \"v_from_k\": 64", &sh, &st), 0, "%s", st.message);
  cr_expect(sh.head_dim_v == 64 && sh.v_from_k, "v the whole of k");
  cr_assert_eq(create_with(576, ", \"v_from_k\": 512", &sh, &st), 0, "%s", st.message);
  cr_expect(sh.head_dim == 576 && sh.head_dim_v == 512 && sh.v_from_k, "DeepSeek's latent cache");
  struct {
    int d;
    const char *more, *needle, *needle2;
  } bad[] = {
      {64, ", \"head_dim_v\": 513", "\"head_dim_v\" must be an integer from 1 to 512", ""},
      {64, ", \"head_dim_v\": 0", "\"head_dim_v\" must be an integer from 1", ""},
      {64, ", \"head_dim_v\": 1.5", "\"head_dim_v\"", ""},
      {64, ", \"v_from_k\": 65", "\"v_from_k\" 65 is more than \"head_dim\" 64", ""},
      {64, ", \"v_from_k\": true", "\"v_from_k\" must be an integer", ""},
      {192, ", \"v_from_k\": 128, \"head_dim_v\": 64", "\"head_dim_v\" 64", "\"v_from_k\" 128"},
      /* v as wide as k, past Dv's limit: head_dim_v or v_from_k is wanted */
      {576, "", "\"head_dim\" 576 makes v as wide", "\"head_dim_v\" (1 to 512)"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    int rc = create_with(bad[i].d, bad[i].more, &sh, &st);
    cr_expect_eq(rc, ATTN_PROTO_EOPTVALUE, "case %zu: %s", i, st.message);
    cr_expect_eq(attn_proto_http_status(rc), 422);
    cr_expect(strstr(st.message, bad[i].needle) && strstr(st.message, bad[i].needle2),
              "case %zu: %s", i, st.message);
  }
}

/* The session shape_of hands the decoder in these tests: D 4, Dv 2, latent
 * or not (arg), or an unknown session (arg NULL). */
static int test_shape(void *arg, const attn_proto_session *ps, attn_kv_shape *sh, attn_status *st) {
  (void)ps;
  if (!arg)
    return attn_status_set(st, ATTN_ESESSION_NOT_FOUND, "no session");
  *sh = (attn_kv_shape){.heads_kv = 1,
                        .head_dim = 4,
                        .head_dim_v = 2,
                        .v_from_k = *(const bool *)arg,
                        .dtype = ATTN_F32,
                        .layers = 1,
                        .max_tokens = 8};
  return 0;
}

#define Q4 "\"q\": {\"shape\": [2, 1, 4], \"dtype\": \"F32\", \"data\": [1, 2, 3, 4, 5, 6, 7, 8]}"
#define K4 "\"k\": {\"shape\": [1, 1, 4], \"dtype\": \"F32\", \"data\": [1, 0, 2, 0]}"
#define V2 "\"v\": {\"shape\": [1, 1, 2], \"dtype\": \"F32\", \"data\": [0, 1]}"
#define V4 "\"v\": {\"shape\": [1, 1, 4], \"dtype\": \"F32\", \"data\": [0, 1, 2, 3]}"
#define BATCH "\"sessions\": [\"a\"], \"cu_seqlens_q\": [0, 1], \"cu_seqlens_kv\": [0, 1]"

static int decode_as(bool *latent, const char *body, bool batch, attn_proto_session *ps,
                     attn_proto_req *pr, attn_status *st) {
  attn_proto_session_init(ps, batch);
  ps->shape_of = test_shape;
  ps->shape_arg = latent;
  return attn_proto_decode_session(body, strlen(body), true, NULL, ps, pr, st);
}

Test(session_codecs, v_and_o_have_the_sessions_value_head_dim) {
  attn_proto_session ps;
  attn_proto_req pr;
  attn_status st;
  bool latent = false;
  const char *calls[] = {"{" Q4 ", " K4 ", " V2 ", \"pos\": 0}", "{" Q4 "}",
                         "{" Q4 ", " K4 ", " V2 ", \"pos\": [0], " BATCH "}"};
  for (size_t i = 0; i < sizeof calls / sizeof *calls; i++) {
    cr_assert_eq(decode_as(&latent, calls[i], i == 2, &ps, &pr, &st), 0, "case %zu: %s", i,
                 st.message);
    cr_expect(pr.req.head_dim == 4 && pr.req.head_dim_v == 2, "case %zu", i);
    cr_expect(pr.shape_o[pr.rank - 1] == 2 && pr.shape_o[pr.rank - 2] == 1, "case %zu", i);
    cr_expect_eq(pr.req.v != NULL, i != 1, "case %zu", i);
    attn_proto_req_free(&pr);
  }
  int rc = decode_as(&latent, "{" Q4 ", " K4 ", " V4 ", \"pos\": 0}", false, &ps, &pr, &st);
  cr_expect_eq(rc, ATTN_PROTO_ESHAPE, "%s", st.message);
  cr_expect(strstr(st.message, "\"v\" ends in 4 but the session's values are 2 wide"), "%s",
            st.message);
  rc = decode_as(&latent, "{" Q4 ", " K4 ", \"pos\": 0}", false, &ps, &pr, &st);
  cr_expect_eq(rc, ATTN_PROTO_EMISSING, "a session that stores v needs it: %s", st.message);
  rc = decode_as(NULL, "{" Q4 "}", false, &ps, &pr, &st);
  cr_expect_eq(rc, ATTN_ESESSION_NOT_FOUND, "the lookup's refusal is the call's");
  /* without a lookup, a session of v's width */
  attn_proto_session_init(&ps, false);
  const char *plain = "{" Q4 ", " K4 ", " V2 ", \"pos\": 0}";
  cr_assert_eq(attn_proto_decode_session(plain, strlen(plain), true, NULL, &ps, &pr, &st), 0, "%s",
               st.message);
  cr_expect(pr.req.head_dim_v == 2 && pr.shape_o[pr.rank - 1] == 2);
  attn_proto_req_free(&pr);
}

Test(session_codecs, a_latent_session_takes_q_and_k_only) {
  attn_proto_session ps;
  attn_proto_req pr;
  attn_status st;
  bool latent = true;
  const char *calls[] = {"{" Q4 ", " K4 ", \"pos\": 0}", "{" Q4 "}",
                         "{" Q4 ", " K4 ", \"pos\": [0], " BATCH "}"};
  for (size_t i = 0; i < sizeof calls / sizeof *calls; i++) {
    cr_assert_eq(decode_as(&latent, calls[i], i == 2, &ps, &pr, &st), 0, "case %zu: %s", i,
                 st.message);
    cr_expect(!pr.req.v && (pr.req.k != NULL) == (i != 1), "case %zu", i);
    cr_expect(pr.req.head_dim_v == 2 && pr.shape_o[pr.rank - 1] == 2, "case %zu", i);
    attn_proto_req_free(&pr);
  }
  const char *with_v[] = {"{" Q4 ", " K4 ", " V2 ", \"pos\": 0}", "{" Q4 ", " V2 "}",
                          "{" Q4 ", " K4 ", " V2 ", \"pos\": [0], " BATCH "}"};
  for (size_t i = 0; i < sizeof with_v / sizeof *with_v; i++) {
    int rc = decode_as(&latent, with_v[i], i == 2, &ps, &pr, &st);
    cr_expect_eq(rc, ATTN_PROTO_EUNKNOWNTENSOR, "case %zu: %s", i, st.message);
    cr_expect_eq(attn_proto_http_status(rc), 422);
    cr_expect(strstr(st.message, "latent session (v_from_k 2), which takes q and k only"),
              "case %zu: %s", i, st.message);
  }
}
