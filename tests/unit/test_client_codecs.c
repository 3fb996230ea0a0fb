/*
 * test_client_codecs.c — proto's client side against its server side:
 * requests encoded by attn_proto_encode_request_* decode to the same
 * tensors and options, replies encoded by attn_proto_encode_* decode back
 * to the same values, and malformed replies are refused with a code and a
 * message naming what is wrong.
 */
#include "benchlib.h"
#include "proto.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void opts_example(attn_options *o) {
  attn_status st;
  attn_options_init(o);
  cr_assert_eq(attn_options_parse_query(
                   o, "causal=true&scale=0.1&window_left=7&stats=true&backend=reference", &st),
               0, "%s", st.message);
}

static void expect_same_request(const attn_request *want, const attn_proto_req *pr,
                                const attn_options *opts) {
  const attn_request *r = &pr->req;
  cr_expect_eq(r->batch, want->batch);
  cr_expect_eq(r->heads_q, want->heads_q);
  cr_expect_eq(r->heads_kv, want->heads_kv);
  cr_expect_eq(r->seq_q, want->seq_q);
  cr_expect_eq(r->seq_kv, want->seq_kv);
  cr_expect_eq(r->head_dim, want->head_dim);
  cr_expect_eq(r->dtype, want->dtype);
  size_t es = attn_dtype_size(want->dtype);
  size_t nq = (size_t)(want->batch * want->heads_q * want->seq_q * want->head_dim) * es;
  size_t nk = (size_t)(want->batch * want->heads_kv * want->seq_kv * want->head_dim) * es;
  cr_expect(!memcmp(r->q, want->q, nq), "q differs");
  cr_expect(!memcmp(r->k, want->k, nk), "k differs");
  cr_expect(!memcmp(r->v, want->v, nk), "v differs");
  if (opts) {
    cr_expect_eq(pr->opts.set, opts->set);
    cr_expect_eq(pr->opts.causal, opts->causal);
    cr_expect_eq(pr->opts.stats, opts->stats);
    cr_expect_eq(pr->opts.scale, opts->scale);
    cr_expect_eq(pr->opts.window_left, opts->window_left);
    cr_expect_str_eq(pr->opts.backend, opts->backend);
  }
}

static void request_round_trip(attn_dtype dt, bool json, bool with_opts) {
  tool_bench_case bc;
  cr_assert_eq(tool_bench_case_init(&bc, 2, 4, 2, 5, 7, 8, dt, false, 11), 0);
  attn_options o, *po = NULL;
  if (with_opts) {
    opts_example(&o);
    po = &o;
  }
  attn_status st;
  attn_proto_req pr;
  void *body;
  size_t len;
  if (json) {
    char *jb;
    cr_assert_eq(attn_proto_encode_request_json(&bc.req, po, &jb, &len, &st), 0, "%s", st.message);
    cr_assert_eq(strlen(jb), len);
    body = jb;
    cr_assert_eq(attn_proto_decode_json(body, len, NULL, &pr, &st), 0, "%s", st.message);
  } else {
    cr_assert_eq(attn_proto_encode_request_safetensors(&bc.req, po, &body, &len, &st), 0, "%s",
                 st.message);
    cr_assert_eq(attn_proto_decode_safetensors(body, len, NULL, &pr, &st), 0, "%s", st.message);
  }
  expect_same_request(&bc.req, &pr, po);
  attn_proto_req_free(&pr);
  free(body);
  tool_bench_case_free(&bc);
}

Test(client_codecs, request_safetensors_round_trips) {
  for (int dt = ATTN_F32; dt <= ATTN_BF16; dt++) {
    request_round_trip((attn_dtype)dt, false, false);
    request_round_trip((attn_dtype)dt, false, true);
  }
}

Test(client_codecs, request_json_round_trips_bit_exact) {
  for (int dt = ATTN_F32; dt <= ATTN_BF16; dt++) {
    request_round_trip((attn_dtype)dt, true, false);
    request_round_trip((attn_dtype)dt, true, true);
  }
}

Test(client_codecs, request_without_tensors_is_refused) {
  attn_request r;
  attn_request_init(&r);
  attn_status st;
  void *b;
  size_t len;
  cr_expect_lt(attn_proto_encode_request_safetensors(&r, NULL, &b, &len, &st), 0);
  cr_expect(strstr(st.message, "missing") != NULL, "%s", st.message);
  cr_expect_null(b);
}

/* A variable-length batch (three sequences, the second with no query, the
 * third with no key) with per-sequence ALiBi slopes, forward and backward:
 * the server's decoders read back the 3-D tensors, the I64 offsets and the
 * slopes. F16 [2, 5, 3] makes q's bytes no multiple of 8, so the offsets
 * after it sit unaligned in a safetensors body. */
static void varlen_round_trip(bool json, attn_pass pass) {
  static const int64_t cq[4] = {0, 3, 3, 5}, ck[4] = {0, 2, 6, 6};
  static const float slopes[6] = {0.5f, 0.25f, 0.125f, 1, 2, 4};
  tool_bench_case bc;
  cr_assert_eq(tool_bench_case_init(&bc, 1, 2, 1, 5, 6, 3, ATTN_F16, false, 5), 0);
  float lse[10];
  for (int i = 0; i < 10; i++)
    lse[i] = (float)i / 4;
  attn_request r = bc.req;
  r.batch = 3;
  r.cu_seqlens_q = cq;
  r.cu_seqlens_kv = ck;
  r.alibi_slopes = slopes;
  r.alibi_stride_b = 2;
  if (pass == ATTN_BACKWARD) { /* o as do too: only the bytes matter here */
    r.pass = ATTN_BACKWARD;
    r.dout = r.o;
    r.lse_in = lse;
  }
  attn_status st;
  attn_proto_req pr;
  void *body;
  size_t len;
  if (json) {
    char *jb;
    cr_assert_eq(attn_proto_encode_request_json(&r, NULL, &jb, &len, &st), 0, "%s", st.message);
    body = jb;
    cr_assert(strstr(jb, "\"cu_seqlens_kv\": {\"shape\": [4], \"dtype\": \"I64\", \"data\": "
                         "[0,2,6,6]}"),
              "%s", jb);
    cr_assert_eq(attn_proto_decode_json_pass(jb, len, pass, NULL, &pr, &st), 0, "%s", st.message);
  } else {
    cr_assert_eq(attn_proto_encode_request_safetensors(&r, NULL, &body, &len, &st), 0, "%s",
                 st.message);
    cr_assert_eq(attn_proto_decode_safetensors_pass(body, len, pass, NULL, &pr, &st), 0, "%s",
                 st.message);
  }
  cr_expect_eq(pr.rank, 3);
  cr_expect_eq(pr.shape_q[0], 2);
  cr_expect_eq(pr.shape_q[1], 5);
  cr_expect_eq(pr.shape_kv[1], 6);
  attn_request got = pr.req;
  cr_expect_eq(got.batch, 3);
  pr.req.batch = 1;
  expect_same_request(&bc.req, &pr, NULL);
  cr_assert_not_null(got.cu_seqlens_q);
  cr_assert_not_null(got.cu_seqlens_kv);
  cr_expect(!memcmp(got.cu_seqlens_q, cq, sizeof cq), "cu_seqlens_q differs");
  cr_expect(!memcmp(got.cu_seqlens_kv, ck, sizeof ck), "cu_seqlens_kv differs");
  cr_assert_not_null(got.alibi_slopes);
  cr_expect_eq(got.alibi_stride_b, 2);
  cr_expect(!memcmp(got.alibi_slopes, slopes, sizeof slopes), "alibi_slopes differ");
  if (pass == ATTN_BACKWARD) {
    cr_assert_not_null(got.lse_in);
    cr_expect(!memcmp(got.lse_in, lse, sizeof lse), "lse differs");
  }
  pr.req.batch = got.batch;
  attn_proto_req_free(&pr);
  free(body);
  tool_bench_case_free(&bc);
}

Test(client_codecs, varlen_requests_round_trip) {
  for (int json = 0; json < 2; json++) {
    varlen_round_trip(json, ATTN_FORWARD);
    varlen_round_trip(json, ATTN_BACKWARD);
  }
}

Test(client_codecs, varlen_request_needs_both_offsets) {
  static const int64_t cq[2] = {0, 5};
  tool_bench_case bc;
  cr_assert_eq(tool_bench_case_init(&bc, 1, 1, 1, 5, 5, 4, ATTN_F32, false, 5), 0);
  bc.req.cu_seqlens_q = cq;
  attn_status st;
  char *jb = NULL;
  size_t len;
  cr_expect_lt(attn_proto_encode_request_json(&bc.req, NULL, &jb, &len, &st), 0);
  cr_expect(strstr(st.message, "cu_seqlens_kv") != NULL, "%s", st.message);
  cr_expect_null(jb);
  bc.req.cu_seqlens_q = NULL;
  tool_bench_case_free(&bc);
}

/* ---- replies ----------------------------------------------------------------- */

/* A request [1, 2, 3, 5] decoded from its body (so pr has shapes and output
 * buffers) with o and the statistics filled with awkward values. */
typedef struct reply_fixture {
  tool_bench_case bc;
  void *body;
  attn_proto_req pr;
} reply_fixture;

static void fixture(reply_fixture *f, attn_dtype dt, bool stats) {
  cr_assert_eq(tool_bench_case_init(&f->bc, 1, 2, 1, 3, 4, 5, dt, false, 3), 0);
  attn_options o;
  attn_options_init(&o);
  attn_status st;
  if (stats)
    cr_assert_eq(attn_options_parse_query(&o, "stats=true", &st), 0);
  size_t len;
  cr_assert_eq(attn_proto_encode_request_safetensors(&f->bc.req, &o, &f->body, &len, &st), 0);
  cr_assert_eq(attn_proto_decode_safetensors(f->body, len, NULL, &f->pr, &st), 0, "%s", st.message);
  attn_request *r = &f->pr.req;
  size_t rows = 6;
  for (size_t i = 0; i < rows * 5; i++)
    attn_store_elem(r->o, dt, i, (float)((double)i * 0.37 - 3.1));
  for (size_t i = 0; stats && i < rows; i++) {
    r->m[i] = i == 2 ? -INFINITY : (float)i / 3.0f;
    r->l[i] = (float)i + 0.1f;
    r->lse[i] = i == 2 ? -INFINITY : 1e-30f * (float)i;
  }
}

static void fixture_free(reply_fixture *f) {
  attn_proto_req_free(&f->pr);
  free(f->body);
  tool_bench_case_free(&f->bc);
}

/* Decodes reply into a copy of f's request (zeroed outputs) and compares. */
static void expect_decodes_back(reply_fixture *f, const void *reply, size_t len, bool json) {
  reply_fixture g;
  fixture(&g, f->pr.req.dtype, f->pr.opts.stats);
  attn_request *r = &g.pr.req;
  size_t ob = 30 * attn_dtype_size(r->dtype);
  memset(r->o, 0, ob);
  attn_status st;
  char backend[16] = "";
  int rc = json ? attn_proto_decode_reply_json(reply, len, &g.pr, backend, sizeof backend, &st)
                : attn_proto_decode_reply_safetensors(reply, len, &g.pr, &st);
  cr_assert_eq(rc, 0, "%s", st.message);
  cr_expect(!memcmp(r->o, f->pr.req.o, ob), "o differs");
  if (f->pr.opts.stats) {
    cr_expect(!memcmp(r->m, f->pr.req.m, 6 * 4), "m differs");
    cr_expect(!memcmp(r->l, f->pr.req.l, 6 * 4), "l differs");
    cr_expect(!memcmp(r->lse, f->pr.req.lse, 6 * 4), "lse differs");
  }
  if (json)
    cr_expect_str_eq(backend, "cpu");
  fixture_free(&g);
}

Test(client_codecs, replies_round_trip) {
  for (int dt = ATTN_F32; dt <= ATTN_BF16; dt++)
    for (int stats = 0; stats < 2; stats++) {
      reply_fixture f;
      fixture(&f, (attn_dtype)dt, stats);
      attn_status st;
      char *j;
      void *s;
      size_t jl, sl;
      cr_assert_eq(attn_proto_encode_json(&f.pr, "cpu", &j, &jl, &st), 0);
      cr_assert_eq(attn_proto_encode_safetensors(&f.pr, &s, &sl, &st), 0);
      expect_decodes_back(&f, j, jl, true);
      expect_decodes_back(&f, s, sl, false);
      free(j);
      free(s);
      fixture_free(&f);
    }
}

static void expect_json_refused(const char *reply, bool stats, int code, const char *says) {
  reply_fixture f;
  fixture(&f, ATTN_F32, stats);
  attn_status st;
  cr_expect_eq(attn_proto_decode_reply_json(reply, strlen(reply), &f.pr, NULL, 0, &st), code,
               "%s: code %d (%s)", reply, st.code, st.message);
  cr_expect(strstr(st.message, says) != NULL, "%s: message \"%s\" lacks \"%s\"", reply, st.message,
            says);
  fixture_free(&f);
}

#define O_OK                                                         \
  "\"o\": {\"shape\": [1, 2, 3, 5], \"dtype\": \"F32\", \"data\": [" \
  "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30]}"

Test(client_codecs, malformed_json_replies_are_refused) {
  char ok[512];
  snprintf(ok, sizeof ok, "{" O_OK "}");
  reply_fixture f;
  fixture(&f, ATTN_F32, false);
  attn_status st;
  cr_expect_eq(attn_proto_decode_reply_json(ok, strlen(ok), &f.pr, NULL, 0, &st), 0, "%s",
               st.message);
  fixture_free(&f);
  expect_json_refused("[1]", false, ATTN_PROTO_EJSON, "not a JSON object");
  expect_json_refused("{\"o\": ", false, ATTN_PROTO_EJSON, "not a JSON object");
  expect_json_refused("{}", false, ATTN_PROTO_EMISSING, "\"o\" is missing");
  expect_json_refused("{" O_OK "}", true, ATTN_PROTO_EMISSING, "\"m\" is missing");
  expect_json_refused("{" O_OK ", \"m\": {}}", false, ATTN_PROTO_EUNKNOWNTENSOR, "\"m\"");
  expect_json_refused("{\"o\": {\"shape\": [1, 2, 3], \"dtype\": \"F32\", \"data\": []}}", false,
                      ATTN_PROTO_ESHAPE, "expected [1, 2, 3, 5]");
  expect_json_refused("{\"o\": {\"shape\": [1, 2, 3, 5], \"dtype\": \"F16\", \"data\": []}}", false,
                      ATTN_PROTO_EDTYPE, "not F32");
  expect_json_refused("{\"o\": {\"shape\": [1, 2, 3, 5], \"dtype\": \"F32\", \"data\": [1]}}",
                      false, ATTN_PROTO_ETENSOR, "has 1 numbers, expected 30");
  expect_json_refused("{\"o\": {\"shape\": [1, 2, 3, 5], \"dtype\": \"F32\", \"data\": [\"x\"]}}",
                      false, ATTN_PROTO_ETENSOR, "element 0");
  expect_json_refused("{\"o\": {\"shape\": [1, 2, 3, 5], \"dtype\": \"F32\"}}", false,
                      ATTN_PROTO_ETENSOR, "no data array");
}

static void expect_st_refused(const void *reply, size_t len, int code, const char *says) {
  reply_fixture f;
  fixture(&f, ATTN_F32, false);
  attn_status st;
  cr_expect_eq(attn_proto_decode_reply_safetensors(reply, len, &f.pr, &st), code, "code %d (%s)",
               st.code, st.message);
  cr_expect(strstr(st.message, says) != NULL, "message \"%s\" lacks \"%s\"", st.message, says);
  fixture_free(&f);
}

/* A safetensors reply of header text h followed by dlen zero bytes. */
static size_t st_reply(char *buf, const char *h, size_t dlen) {
  size_t n = strlen(h);
  for (int i = 0; i < 8; i++)
    buf[i] = (char)((uint64_t)n >> (8 * i));
  memcpy(buf + 8, h, n);
  memset(buf + 8 + n, 0, dlen);
  return 8 + n + dlen;
}

Test(client_codecs, malformed_safetensors_replies_are_refused) {
  char b[1024];
  const char *ok = "{\"o\":{\"dtype\":\"F32\",\"shape\":[1,2,3,5],\"data_offsets\":[0,120]}}";
  size_t n = st_reply(b, ok, 120);
  reply_fixture f;
  fixture(&f, ATTN_F32, false);
  attn_status st;
  cr_expect_eq(attn_proto_decode_reply_safetensors(b, n, &f.pr, &st), 0, "%s", st.message);
  fixture_free(&f);
  expect_st_refused(b, 7, ATTN_PROTO_ESAFETENSORS, "shorter than a safetensors header");
  expect_st_refused(b, 60, ATTN_PROTO_ESAFETENSORS, "runs past");
  expect_st_refused(b, st_reply(b, "[1]", 0), ATTN_PROTO_ESAFETENSORS, "not a JSON object");
  expect_st_refused(b, st_reply(b, "{}", 0), ATTN_PROTO_EMISSING, "holds 0 of the 1");
  expect_st_refused(b, st_reply(b, ok, 100), ATTN_PROTO_ESAFETENSORS, "data_offsets");
  expect_st_refused(
      b, st_reply(b, "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4),
      ATTN_PROTO_EUNKNOWNTENSOR, "unexpected tensor \"x\"");
  expect_st_refused(
      b, st_reply(b, "{\"o\":{\"dtype\":\"F32\",\"shape\":[1,2,3,4],\"data_offsets\":[0,96]}}", 96),
      ATTN_PROTO_ESHAPE, "expected [1, 2, 3, 5]");
}

/* ---- the backward pass ------------------------------------------------------- */

/* A backward request [2, 4, 5, 8] with KV [2, 2, 7, 8]: q, k, v from the
 * bench case, o and do made up, lse with a -inf (a row that sees no key). */
typedef struct bwd_fixture {
  tool_bench_case bc;
  void *o, *dout;
  float lse[40];
} bwd_fixture;

static void bwd_fixture_init(bwd_fixture *f, attn_dtype dt, bool with_lse) {
  cr_assert_eq(tool_bench_case_init(&f->bc, 2, 4, 2, 5, 7, 8, dt, false, 5), 0);
  size_t n = 2 * 4 * 5 * 8;
  f->o = malloc(n * attn_dtype_size(dt));
  f->dout = malloc(n * attn_dtype_size(dt));
  for (size_t i = 0; i < n; i++) {
    attn_store_elem(f->o, dt, i, (float)((double)i * 0.01 - 1));
    attn_store_elem(f->dout, dt, i, (float)((double)i * -0.02 + 3));
  }
  for (int i = 0; i < 40; i++)
    f->lse[i] = i == 3 ? -INFINITY : (float)i * 0.25f;
  attn_request *r = &f->bc.req;
  r->pass = ATTN_BACKWARD;
  r->o = f->o;
  r->dout = f->dout;
  r->lse_in = with_lse ? f->lse : NULL;
}

static void bwd_fixture_free(bwd_fixture *f) {
  free(f->o);
  free(f->dout);
  tool_bench_case_free(&f->bc);
}

/* Encodes f's request in a codec and decodes it as the server does. */
static int bwd_round_trip(const bwd_fixture *f, bool json, const attn_options *o, void **pbody,
                          attn_proto_req *pr, attn_status *st) {
  size_t len;
  if (json) {
    char *jb;
    cr_assert_eq(attn_proto_encode_request_json(&f->bc.req, o, &jb, &len, st), 0, "%s",
                 st->message);
    *pbody = jb;
    return attn_proto_decode_json_pass(jb, len, ATTN_BACKWARD, NULL, pr, st);
  }
  cr_assert_eq(attn_proto_encode_request_safetensors(&f->bc.req, o, pbody, &len, st), 0, "%s",
               st->message);
  return attn_proto_decode_safetensors_pass(*pbody, len, ATTN_BACKWARD, NULL, pr, st);
}

Test(client_codecs, backward_requests_round_trip) {
  for (int dt = ATTN_F32; dt <= ATTN_BF16; dt++)
    for (int json = 0; json < 2; json++)
      for (int lse = 0; lse < 2; lse++) {
        bwd_fixture f;
        bwd_fixture_init(&f, (attn_dtype)dt, lse);
        attn_proto_req pr;
        attn_status st;
        void *body;
        cr_assert_eq(bwd_round_trip(&f, json, NULL, &body, &pr, &st), 0, "%s", st.message);
        expect_same_request(&f.bc.req, &pr, NULL);
        size_t nb = 320 * attn_dtype_size((attn_dtype)dt);
        const attn_request *r = &pr.req;
        cr_expect_eq(r->pass, ATTN_BACKWARD);
        cr_expect(!memcmp(r->o, f.o, nb), "o differs");
        cr_expect(!memcmp(r->dout, f.dout, nb), "do differs");
        cr_expect(lse ? r->lse_in && !memcmp(r->lse_in, f.lse, sizeof f.lse) : !r->lse_in,
                  "lse differs (given: %d, json: %d)", lse, json);
        cr_expect(r->dq && r->dk && r->dv && !r->m && !r->lse, "outputs are not dq, dk, dv");
        cr_expect_eq(pr.shape_kv[1], 2);
        attn_proto_req_free(&pr);
        free(body);
        bwd_fixture_free(&f);
      }
}

/* The forward decoders refuse a backward body, and the backward ones a
 * body without o or do, or with stats. */
Test(client_codecs, backward_request_refusals) {
  bwd_fixture f;
  bwd_fixture_init(&f, ATTN_F32, true);
  attn_proto_req pr;
  attn_status st;
  size_t len;
  char *jb;
  cr_assert_eq(attn_proto_encode_request_json(&f.bc.req, NULL, &jb, &len, &st), 0);
  cr_expect_eq(attn_proto_decode_json(jb, len, NULL, &pr, &st), ATTN_PROTO_EUNKNOWNTENSOR, "%s",
               st.message);
  cr_expect(strstr(st.message, "\"o\"") != NULL, "%s", st.message);
  free(jb);
  attn_options o;
  attn_options_init(&o);
  cr_assert_eq(attn_options_parse_query(&o, "stats=false", &st), 0);
  for (int json = 0; json < 2; json++) {
    void *body;
    cr_expect_eq(bwd_round_trip(&f, json, &o, &body, &pr, &st), ATTN_PROTO_EOPTVALUE, "%s",
                 st.message);
    cr_expect(strstr(st.message, "stats") != NULL, "%s", st.message);
    free(body);
  }
  f.bc.req.pass = ATTN_FORWARD; /* q, k, v only: o and do are missing */
  for (int json = 0; json < 2; json++) {
    void *body;
    cr_expect_eq(bwd_round_trip(&f, json, NULL, &body, &pr, &st), ATTN_PROTO_EMISSING, "%s",
                 st.message);
    cr_expect(strstr(st.message, "\"o\" is missing") != NULL, "%s", st.message);
    free(body);
  }
  bwd_fixture_free(&f);
}

/* dq, dk, dv encoded by the server's encoders decode back bit for bit. */
Test(client_codecs, backward_replies_round_trip) {
  for (int dt = ATTN_F32; dt <= ATTN_BF16; dt++) {
    bwd_fixture f;
    bwd_fixture_init(&f, (attn_dtype)dt, false);
    attn_proto_req pr, back;
    attn_status st;
    void *body, *body2;
    cr_assert_eq(bwd_round_trip(&f, false, NULL, &body, &pr, &st), 0, "%s", st.message);
    cr_assert_eq(bwd_round_trip(&f, false, NULL, &body2, &back, &st), 0, "%s", st.message);
    size_t es = attn_dtype_size((attn_dtype)dt), nq = 320, nk = 2 * 2 * 7 * 8;
    for (size_t i = 0; i < nq; i++)
      attn_store_elem(pr.req.dq, (attn_dtype)dt, i, (float)i * 0.125f - 7);
    for (size_t i = 0; i < nk; i++) {
      attn_store_elem(pr.req.dk, (attn_dtype)dt, i, (float)i * -0.5f);
      attn_store_elem(pr.req.dv, (attn_dtype)dt, i, (float)i * 1e-3f);
    }
    char *j;
    void *s;
    size_t jl, sl;
    cr_assert_eq(attn_proto_encode_json(&pr, "reference", &j, &jl, &st), 0, "%s", st.message);
    cr_assert_eq(attn_proto_encode_safetensors(&pr, &s, &sl, &st), 0, "%s", st.message);
    cr_expect(strstr(j, "\"dq\": {\"shape\": [2, 4, 5, 8]") && strstr(j, "\"dk\": {\"shape\": [2, "
                                                                         "2, 7, 8]"),
              "%.200s", j);
    for (int json = 0; json < 2; json++) {
      memset(back.req.dq, 0, nq * es);
      memset(back.req.dk, 0, nk * es);
      memset(back.req.dv, 0, nk * es);
      char be[16] = "";
      int rc = json ? attn_proto_decode_reply_json(j, jl, &back, be, sizeof be, &st)
                    : attn_proto_decode_reply_safetensors(s, sl, &back, &st);
      cr_assert_eq(rc, 0, "%s", st.message);
      cr_expect(!memcmp(back.req.dq, pr.req.dq, nq * es), "dq differs (json %d)", json);
      cr_expect(!memcmp(back.req.dk, pr.req.dk, nk * es), "dk differs (json %d)", json);
      cr_expect(!memcmp(back.req.dv, pr.req.dv, nk * es), "dv differs (json %d)", json);
    }
    free(j);
    free(s);
    attn_proto_req_free(&pr);
    attn_proto_req_free(&back);
    free(body);
    free(body2);
    bwd_fixture_free(&f);
  }
}

/* A backward reply must hold exactly dq, dk, dv of the right shapes. */
Test(client_codecs, malformed_backward_replies_are_refused) {
  bwd_fixture f;
  bwd_fixture_init(&f, ATTN_F32, false);
  attn_proto_req pr;
  attn_status st;
  void *body;
  cr_assert_eq(bwd_round_trip(&f, false, NULL, &body, &pr, &st), 0, "%s", st.message);
  const char *o_only = "{\"o\": {\"shape\": [2, 4, 5, 8], \"dtype\": \"F32\", \"data\": []}}";
  cr_expect_eq(attn_proto_decode_reply_json(o_only, strlen(o_only), &pr, NULL, 0, &st),
               ATTN_PROTO_EMISSING);
  cr_expect(strstr(st.message, "\"dq\" is missing") != NULL, "%s", st.message);
  char b[512];
  const char *dk_wrong =
      "{\"dq\":{\"dtype\":\"F32\",\"shape\":[2,4,5,8],\"data_offsets\":[0,1280]},"
      "\"dk\":{\"dtype\":\"F32\",\"shape\":[2,4,5,8],\"data_offsets\":[1280,"
      "2560]}}";
  size_t n = strlen(dk_wrong);
  char *sb = calloc(1, 8 + n + 2560);
  for (int i = 0; i < 8; i++)
    sb[i] = (char)((uint64_t)n >> (8 * i));
  memcpy(sb + 8, dk_wrong, n);
  cr_expect_eq(attn_proto_decode_reply_safetensors(sb, 8 + n + 2560, &pr, &st), ATTN_PROTO_ESHAPE);
  cr_expect(strstr(st.message, "\"dk\" has shape [2,4,5,8], expected [2, 2, 7, 8]") != NULL, "%s",
            st.message);
  n = (size_t)snprintf(b, sizeof b,
                       "{\"o\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}");
  char *sb2 = calloc(1, 8 + n + 4);
  for (int i = 0; i < 8; i++)
    sb2[i] = (char)((uint64_t)n >> (8 * i));
  memcpy(sb2 + 8, b, n);
  cr_expect_eq(attn_proto_decode_reply_safetensors(sb2, 8 + n + 4, &pr, &st),
               ATTN_PROTO_EUNKNOWNTENSOR, "%s", st.message);
  free(sb);
  free(sb2);
  attn_proto_req_free(&pr);
  free(body);
  bwd_fixture_free(&f);
}
