/*
 * test_json.c — the JSON codec: requests decode to the exact values sent
 * (rounded once to their dtype), replies read back to the engine's exact
 * bits, options follow "the body wins", and every malformed body gets its
 * own error code and a message naming what is wrong.
 */
#include "helpers.h"
#include "proto.h"

#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers -------------------------------------------------------------- */

static void expect_err(const char *body, int code, const char *needle) {
  attn_proto_req pr;
  attn_status st = {0};
  int rc = attn_proto_decode_json(body, strlen(body), NULL, &pr, &st);
  cr_expect_eq(rc, code, "body %.80s: want %s, got %d (%s)", body, attn_proto_code_name(code), rc,
               st.message);
  cr_expect_eq(st.code, code, "status code of %.80s", body);
  cr_expect(strstr(st.message, needle) != NULL, "body %.80s: message \"%s\" lacks \"%s\"", body,
            st.message, needle);
  cr_expect_null(pr.out, "a failed decode leaves nothing allocated");
}

/* A random tensor as JSON text, either {shape, dtype, data} or nested
 * arrays; vals receives the doubles written (at full precision). */
static void put_tensor(FILE *f, const char *name, const int64_t *shape, int rank, attn_dtype dt,
                       bool nested, double *vals, uint64_t *seed) {
  size_t n = 1;
  for (int i = 0; i < rank; i++)
    n *= (size_t)shape[i];
  for (size_t i = 0; i < n; i++)
    vals[i] = 2.0 * tuniform(seed);
  fprintf(f, "\"%s\": ", name);
  if (!nested) {
    fprintf(f, "{\"shape\": [");
    for (int i = 0; i < rank; i++)
      fprintf(f, i ? ", %lld" : "%lld", (long long)shape[i]);
    fprintf(f, "], \"dtype\": \"%s\", \"data\": [", attn_dtype_name(dt));
    for (size_t i = 0; i < n; i++)
      fprintf(f, i ? ", %.17g" : "%.17g", vals[i]);
    fprintf(f, "]}");
    return;
  }
  /* Nested: open brackets where an index rolls over. */
  for (size_t i = 0; i < n; i++) {
    size_t stride = 1;
    int opens = 0;
    for (int d = rank - 1; d >= 0; d--) {
      if (i % (stride * (size_t)shape[d]) == 0)
        opens++;
      stride *= (size_t)shape[d];
    }
    if (i)
      fputs(", ", f);
    for (int k = 0; k < opens; k++)
      fputc('[', f);
    fprintf(f, "%.17g", vals[i]);
    stride = 1;
    int closes = 0;
    for (int d = rank - 1; d >= 0; d--) {
      if ((i + 1) % (stride * (size_t)shape[d]) == 0)
        closes++;
      stride *= (size_t)shape[d];
    }
    for (int k = 0; k < closes; k++)
      fputc(']', f);
  }
}

static uint16_t round_to(attn_dtype dt, double x) {
  return dt == ATTN_F16 ? attn_f64_to_f16(x) : attn_f64_to_bf16(x);
}

/* The number texts of "key"'s data in an encoded reply, read as the exact
 * bits of dtype dt (F32 through strtof, F16/BF16 through strtod and one
 * rounding); null reads as -inf. Returns how many were read. */
static size_t read_data(const char *json, const char *key, attn_dtype dt, void *out, size_t cap) {
  char pat[32];
  snprintf(pat, sizeof pat, "\"%s\": {", key);
  const char *p = strstr(json, pat);
  cr_assert(p, "reply lacks %s", key);
  p = strstr(p, "\"data\": [");
  cr_assert(p);
  p += 9;
  size_t n = 0;
  while (*p != ']') {
    if (*p == ',')
      p++;
    cr_assert(n < cap, "more than %zu numbers", cap);
    char *end = NULL;
    if (!strncmp(p, "null", 4)) {
      if (dt == ATTN_F32)
        ((float *)out)[n] = -INFINITY;
      else
        ((uint16_t *)out)[n] = 0xfc00;
      p += 4;
      n++;
      continue;
    }
    if (dt == ATTN_F32)
      ((float *)out)[n] = strtof(p, &end);
    else
      ((uint16_t *)out)[n] = round_to(dt, strtod(p, &end));
    cr_assert(end != p, "bad number at %.20s", p);
    p = end;
    n++;
  }
  return n;
}

static cJSON *parse_reply(const char *buf, size_t len) {
  cJSON *j = cJSON_ParseWithLength(buf, len);
  cr_assert(j, "the reply is not JSON: %.200s", buf);
  cr_assert_eq(buf[len], 0, "NUL-terminated");
  cr_assert_eq(strlen(buf), len);
  return j;
}

static void expect_shape(const cJSON *t, const int64_t *shape, int rank, const char *dtype) {
  const cJSON *s = cJSON_GetObjectItemCaseSensitive(t, "shape");
  cr_assert(cJSON_IsArray(s));
  cr_assert_eq(cJSON_GetArraySize(s), rank);
  for (int i = 0; i < rank; i++)
    cr_expect_eq((int64_t)cJSON_GetArrayItem(s, i)->valuedouble, shape[i], "dim %d", i);
  cr_expect_str_eq(cJSON_GetObjectItemCaseSensitive(t, "dtype")->valuestring, dtype);
}

/* Decode -> check -> run -> encode -> parse, for one problem. */
static void roundtrip(attn_dtype dt, int rank, const int64_t *sq, const int64_t *skv, bool nested,
                      const char *extra) {
  uint64_t seed = 42 + (uint64_t)dt * 7 + (uint64_t)rank;
  size_t nq = 1, nk = 1;
  for (int i = 0; i < rank; i++) {
    nq *= (size_t)sq[i];
    nk *= (size_t)skv[i];
  }
  double *vq = malloc(nq * 8), *vk = malloc(nk * 8), *vv = malloc(nk * 8);
  char *body;
  size_t blen;
  FILE *f = open_memstream(&body, &blen);
  fputc('{', f);
  put_tensor(f, "q", sq, rank, dt, nested, vq, &seed);
  fputs(", ", f);
  put_tensor(f, "k", skv, rank, dt, nested, vk, &seed);
  fputs(", ", f);
  put_tensor(f, "v", skv, rank, dt, nested, vv, &seed);
  if (extra)
    fprintf(f, ", %s", extra);
  fputc('}', f);
  fclose(f);

  attn_proto_req pr;
  attn_status st;
  int rc = attn_proto_decode_json(body, blen, NULL, &pr, &st);
  cr_assert_eq(rc, 0, "decode: %s", st.message);
  cr_expect_eq(pr.rank, rank);
  cr_expect_eq(pr.req.dtype, dt);
  int64_t b = rank == 4 ? sq[0] : 1, hq = rank >= 3 ? sq[rank - 3] : 1;
  int64_t hkv = rank >= 3 ? skv[rank - 3] : 1;
  cr_expect_eq(pr.req.batch, b);
  cr_expect_eq(pr.req.heads_q, hq);
  cr_expect_eq(pr.req.heads_kv, hkv);
  cr_expect_eq(pr.req.seq_q, sq[rank - 2]);
  cr_expect_eq(pr.req.seq_kv, skv[rank - 2]);
  cr_expect_eq(pr.req.head_dim, sq[rank - 1]);
  for (int i = 0; i < rank; i++)
    cr_expect_eq(pr.shape_q[i], sq[i]);
  const void *in[3] = {pr.req.q, pr.req.k, pr.req.v};
  const double *want[3] = {vq, vk, vv};
  size_t cnt[3] = {nq, nk, nk};
  for (int t = 0; t < 3; t++)
    for (size_t i = 0; i < cnt[t]; i++) {
      if (dt == ATTN_F32)
        cr_assert_eq(((const float *)in[t])[i], (float)want[t][i], "tensor %d [%zu]", t, i);
      else
        cr_assert_eq(((const uint16_t *)in[t])[i], round_to(dt, want[t][i]), "tensor %d [%zu]", t,
                     i);
    }

  attn_engine *e = topen(2, NULL);
  rc = attn_engine_run(e, &pr.req, NULL, &st);
  cr_assert_eq(rc, 0, "run: %s", st.message);
  char *out;
  size_t olen;
  rc = attn_proto_encode_json(&pr, "cpu", &out, &olen, &st);
  cr_assert_eq(rc, 0, "encode: %s", st.message);
  cJSON *j = parse_reply(out, olen);
  expect_shape(cJSON_GetObjectItemCaseSensitive(j, "o"), sq, rank, attn_dtype_name(dt));
  cr_expect_eq(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(
                   cJSON_GetObjectItemCaseSensitive(j, "o"), "data")),
               (int)nq);
  cr_expect_str_eq(cJSON_GetObjectItemCaseSensitive(j, "backend")->valuestring, "cpu");
  cr_expect_eq(cJSON_GetObjectItemCaseSensitive(j, "m") != NULL, pr.opts.stats);
  void *got = malloc(nq * 4);
  cr_assert_eq(read_data(out, "o", dt, got, nq), nq);
  cr_expect_eq(memcmp(got, pr.req.o, nq * attn_dtype_size(dt)), 0,
               "every number reads back to the engine's bits");
  free(got);
  cJSON_Delete(j);
  free(out);
  attn_engine_close(e);
  attn_proto_req_free(&pr);
  free(body);
  free(vq);
  free(vk);
  free(vv);
}

/* ---- round trips ---------------------------------------------------------- */

Test(json, roundtrip_f32_ranks) {
  int64_t q2[] = {5, 8}, k2[] = {7, 8};
  roundtrip(ATTN_F32, 2, q2, k2, false, NULL);
  int64_t q3[] = {2, 5, 16}, k3[] = {2, 3, 16};
  roundtrip(ATTN_F32, 3, q3, k3, false, NULL);
  int64_t q4[] = {1, 4, 5, 8}, k4[] = {1, 2, 7, 8}; /* GQA */
  roundtrip(ATTN_F32, 4, q4, k4, false, "\"causal\": true");
}

Test(json, roundtrip_f16_bf16) {
  int64_t q4[] = {1, 4, 5, 8}, k4[] = {1, 2, 7, 8};
  roundtrip(ATTN_F16, 4, q4, k4, false, NULL);
  roundtrip(ATTN_BF16, 4, q4, k4, false, NULL);
  int64_t q2[] = {3, 4}, k2[] = {6, 4};
  roundtrip(ATTN_F16, 2, q2, k2, false, "\"scale\": 0.3");
  int64_t q3[] = {2, 3, 4}, k3[] = {1, 6, 4};
  roundtrip(ATTN_BF16, 3, q3, k3, false, NULL);
}

Test(json, roundtrip_nested_arrays) {
  int64_t q2[] = {3, 4}, k2[] = {6, 4};
  roundtrip(ATTN_F32, 2, q2, k2, true, NULL);
  int64_t q3[] = {4, 3, 8}, k3[] = {2, 5, 8};
  roundtrip(ATTN_F32, 3, q3, k3, true, NULL);
  int64_t q4[] = {1, 4, 5, 8}, k4[] = {1, 2, 7, 8};
  roundtrip(ATTN_F32, 4, q4, k4, true, "\"stats\": true");
}

Test(json, nested_shape_inferred) {
  const char *body = "{\"q\": [[1, 2], [3, 4], [5, 6]], \"k\": [[1, 0]], \"v\": [[0.5, -0.5]]}";
  attn_proto_req pr;
  attn_status st;
  cr_assert_eq(attn_proto_decode_json(body, strlen(body), NULL, &pr, &st), 0, "%s", st.message);
  cr_expect_eq(pr.rank, 2);
  cr_expect_eq(pr.shape_q[0], 3);
  cr_expect_eq(pr.shape_q[1], 2);
  cr_expect_eq(pr.req.seq_kv, 1);
  cr_expect_eq(((const float *)pr.req.q)[5], 6.0f);
  cr_expect_eq(((const float *)pr.req.v)[1], -0.5f);
  attn_proto_req_free(&pr);
}

/* q seq 4, k seq 2, causal, bottom-right aligned: rows 0 and 1 see no key. */
Test(json, stats_masked_rows_are_null) {
  const char *body = "{\"q\": {\"shape\": [1, 1, 4, 2], \"data\": [1, 2, 3, 4, 5, 6, 7, 8]},"
                     " \"k\": {\"shape\": [1, 1, 2, 2], \"data\": [1, 0, 0, 1]},"
                     " \"v\": {\"shape\": [1, 1, 2, 2], \"data\": [1, 2, 3, 4]},"
                     " \"causal\": true, \"stats\": true}";
  attn_proto_req pr;
  attn_status st;
  cr_assert_eq(attn_proto_decode_json(body, strlen(body), NULL, &pr, &st), 0, "%s", st.message);
  attn_engine *e = topen(2, NULL);
  cr_assert_eq(attn_engine_run(e, &pr.req, NULL, &st), 0, "%s", st.message);
  char *out;
  size_t len;
  cr_assert_eq(attn_proto_encode_json(&pr, NULL, &out, &len, &st), 0, "%s", st.message);
  cJSON *j = parse_reply(out, len);
  cr_expect_null(cJSON_GetObjectItemCaseSensitive(j, "backend"), "no backend given");
  int64_t sshape[] = {1, 1, 4};
  const char *names[] = {"m", "l", "lse"};
  for (int s = 0; s < 3; s++) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, names[s]);
    cr_assert(t, "reply has %s", names[s]);
    expect_shape(t, sshape, 3, "F32");
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(t, "data");
    cr_assert_eq(cJSON_GetArraySize(d), 4);
    for (int r = 0; r < 2; r++) {
      const cJSON *x = cJSON_GetArrayItem(d, r);
      if (s == 1)
        cr_expect(cJSON_IsNumber(x) && x->valuedouble == 0.0, "l of masked row %d is 0", r);
      else
        cr_expect(cJSON_IsNull(x), "%s of masked row %d is null", names[s], r);
    }
    for (int r = 2; r < 4; r++)
      cr_expect(cJSON_IsNumber(cJSON_GetArrayItem(d, r)), "%s row %d", names[s], r);
    float got[4];
    cr_assert_eq(read_data(out, names[s], ATTN_F32, got, 4), 4);
    const float *want = s == 0 ? pr.req.m : s == 1 ? pr.req.l : pr.req.lse;
    for (int r = 0; r < 4; r++)
      cr_expect(got[r] == want[r], "%s[%d]: %g vs %g", names[s], r, got[r], want[r]);
  }
  float o[8];
  cr_assert_eq(read_data(out, "o", ATTN_F32, o, 8), 8);
  for (int i = 0; i < 4; i++)
    cr_expect_eq(o[i], 0.0f, "masked rows of O are 0");
  cJSON_Delete(j);
  free(out);
  attn_engine_close(e);
  attn_proto_req_free(&pr);
}

/* ---- number text ----------------------------------------------------------- */

/* Encodes a [256, n/256] output of dtype dt holding buf. */
static char *encode_values(attn_dtype dt, void *buf, size_t n) {
  attn_proto_req pr;
  memset(&pr, 0, sizeof pr);
  pr.rank = 2;
  pr.shape_q[0] = 256;
  pr.shape_q[1] = (int64_t)(n / 256);
  memcpy(pr.shape_o, pr.shape_q, sizeof pr.shape_o); /* O's shape: Dv is D here */
  pr.req.dtype = dt;
  pr.req.o = buf;
  char *out;
  size_t len;
  attn_status st;
  cr_assert_eq(attn_proto_encode_json(&pr, NULL, &out, &len, &st), 0, "%s", st.message);
  return out;
}

Test(json, every_f16_and_bf16_reads_back) {
  static uint16_t in[65536], got[65536];
  for (attn_dtype dt = ATTN_F16; dt <= ATTN_BF16; dt++) {
    uint16_t expmask = dt == ATTN_F16 ? 0x7c00 : 0x7f80;
    for (uint32_t i = 0; i < 65536; i++)
      in[i] = (i & expmask) == expmask ? 0 : (uint16_t)i; /* finite values only */
    char *out = encode_values(dt, in, 65536);
    cr_assert_eq(read_data(out, "o", dt, got, 65536), 65536);
    for (uint32_t i = 0; i < 65536; i++)
      if (got[i] != in[i])
        cr_assert_fail("%s 0x%04x reads back as 0x%04x", attn_dtype_name(dt), in[i], got[i]);
    free(out);
  }
}

Test(json, f32_text_is_shortest_and_exact) {
  static uint32_t in[256 * 256];
  static float got[256 * 256];
  uint64_t seed = 7;
  for (size_t i = 0; i < 256 * 256; i++) {
    uint32_t u;
    do
      u = (uint32_t)trand(&seed);
    while ((u & 0x7f800000u) == 0x7f800000u);
    in[i] = u;
  }
  in[0] = 0x80000000u; /* -0 */
  in[1] = 0x7f7fffffu; /* FLT_MAX */
  in[2] = 0x00000001u; /* smallest subnormal */
  in[3] = 0x3f800000u; /* 1 */
  char *out = encode_values(ATTN_F32, in, 256 * 256);
  cr_assert_eq(read_data(out, "o", ATTN_F32, got, 256 * 256), 256 * 256);
  cr_expect(memcmp(got, in, sizeof in) == 0, "every F32 value reads back exactly");
  cr_expect(strstr(out, "\"data\": [-0,3.4028235e+38,1.4013e-45,1,") != NULL,
            "shortest text: %.80s", strstr(out, "\"data\""));
  free(out);
}

/* ---- rounding of JSON numbers ---------------------------------------------- */

static uint16_t decode_one16(const char *dtype, const char *num) {
  char body[512];
  snprintf(body, sizeof body,
           "{\"q\": {\"shape\": [1, 1], \"dtype\": \"%s\", \"data\": [%s]}, "
           "\"k\": {\"shape\": [1, 1], \"dtype\": \"%s\", \"data\": [0]}, "
           "\"v\": {\"shape\": [1, 1], \"dtype\": \"%s\", \"data\": [0]}}",
           dtype, num, dtype, dtype);
  attn_proto_req pr;
  attn_status st;
  cr_assert_eq(attn_proto_decode_json(body, strlen(body), NULL, &pr, &st), 0, "%s: %s", num,
               st.message);
  uint16_t h = ((const uint16_t *)pr.req.q)[0];
  attn_proto_req_free(&pr);
  return h;
}

Test(json, narrow_dtypes_round_once) {
  /* 1 + 2^-11 is an exact F16 tie: to even, 1.0. */
  cr_expect_eq(decode_one16("F16", "1.00048828125"), 0x3c00);
  /* Parsed to the same double (the tail is below a double ulp), then
   * rounded once: still the tie. */
  cr_expect_eq(decode_one16("F16", "1.00048828125000001"), 0x3c00);
  /* 1 + 2^-11 + 2^-40: through float it would become the tie and go down;
   * rounded once from the double it goes up. */
  cr_expect_eq(decode_one16("F16", "1.0004882812509095"), 0x3c01);
  cr_expect_eq(decode_one16("F16", "1.0014648437500"), 0x3c02); /* tie 1+3*2^-11 -> even */
  cr_expect_eq(decode_one16("F16", "-65504"), 0xfbff);
  cr_expect_eq(decode_one16("F16", "65519.99"), 0x7bff); /* below the overflow tie */
  cr_expect_eq(decode_one16("F16", "5.960464477539063e-08"), 0x0001);
  cr_expect_eq(decode_one16("BF16", "1.00390625"), 0x3f80); /* 1 + 2^-8 tie */
  cr_expect_eq(decode_one16("BF16", "1.0039062500000009"), 0x3f81);
  cr_expect_eq(decode_one16("BF16", "-2"), 0xc000);
}

Test(json, f32_limits) {
#define F32_FMT                                   \
  "{\"q\": {\"shape\": [1, 1], \"data\": [%s]}, " \
  "\"k\": {\"shape\": [1, 1], \"data\": [0]}, \"v\": {\"shape\": [1, 1], \"data\": [0]}}"
  char body[256];
  attn_proto_req pr;
  attn_status st;
  /* The shortest text of FLT_MAX is just above it: it must decode. */
  snprintf(body, sizeof body, F32_FMT, "3.4028235e38");
  cr_assert_eq(attn_proto_decode_json(body, strlen(body), NULL, &pr, &st), 0, "%s", st.message);
  cr_expect_eq(((const float *)pr.req.q)[0], 0x1.fffffep127f);
  attn_proto_req_free(&pr);
  snprintf(body, sizeof body, F32_FMT, "-3.4028235e38");
  cr_assert_eq(attn_proto_decode_json(body, strlen(body), NULL, &pr, &st), 0, "%s", st.message);
  cr_expect_eq(((const float *)pr.req.q)[0], -0x1.fffffep127f);
  attn_proto_req_free(&pr);
  snprintf(body, sizeof body, F32_FMT, "1e-50"); /* underflows to 0: fine */
  cr_assert_eq(attn_proto_decode_json(body, strlen(body), NULL, &pr, &st), 0, "%s", st.message);
  cr_expect_eq(((const float *)pr.req.q)[0], 0.0f);
  attn_proto_req_free(&pr);
  snprintf(body, sizeof body, F32_FMT, "3.4028236e38");
  expect_err(body, ATTN_PROTO_ENONFINITE, "overflows F32");
}

/* ---- options -------------------------------------------------------------- */

#define T22 "{\"shape\": [2, 2], \"data\": [1, 2, 3, 4]}"
#define QKV "\"q\": " T22 ", \"k\": " T22 ", \"v\": " T22

Test(json, options_body_wins_over_query) {
  attn_options q;
  attn_options_init(&q);
  attn_status st;
  cr_assert_eq(attn_options_parse_query(&q, "causal=true&scale=0.125&window_left=5", &st), 0);
  const char *body = "{" QKV ", \"causal\": false, \"window_left\": 3, \"stats\": true, "
                     "\"backend\": \"reference\"}";
  attn_proto_req pr;
  cr_assert_eq(attn_proto_decode_json(body, strlen(body), &q, &pr, &st), 0, "%s", st.message);
  cr_expect_eq(pr.opts.causal, false, "the body's false beats the query's true");
  cr_expect_eq(pr.req.causal, false);
  cr_expect_eq(pr.req.scale, 0.125, "the query's scale stays when the body has none");
  cr_expect_eq(pr.req.window_left, 3);
  cr_expect_eq(pr.req.window_right, -1);
  cr_expect(pr.opts.stats && pr.req.m && pr.req.l && pr.req.lse);
  cr_expect_str_eq(pr.req.backend, "reference");
  cr_expect_eq(pr.opts.set & (ATTN_OPT_CAUSAL | ATTN_OPT_SCALE), ATTN_OPT_CAUSAL | ATTN_OPT_SCALE);
  attn_proto_req_free(&pr);

  const char *b2 = "{" QKV ", \"scale\": 0.5, \"window_right\": -1, \"causal\": true}";
  cr_assert_eq(attn_proto_decode_json(b2, strlen(b2), NULL, &pr, &st), 0, "%s", st.message);
  cr_expect_eq(pr.req.scale, 0.5);
  cr_expect(pr.req.causal);
  cr_expect_str_eq(pr.req.backend, "auto");
  attn_proto_req_free(&pr);
}

/* ---- malformed bodies ----------------------------------------------------- */

Test(json, empty_and_not_json) {
  attn_proto_req pr;
  attn_status st;
  cr_expect_eq(attn_proto_decode_json("", 0, NULL, &pr, &st), ATTN_PROTO_EEMPTY);
  cr_expect(strstr(st.message, "no body"));
  expect_err(" \n\t ", ATTN_PROTO_EJSON, "invalid JSON at byte");
  expect_err("[]", ATTN_PROTO_EJSON, "must be an object");
  expect_err("5", ATTN_PROTO_EJSON, "not a number");
  expect_err("{\"q\": [1, 2,, 3]}", ATTN_PROTO_EJSON, "invalid JSON at byte 12");
  expect_err("{" QKV "} x", ATTN_PROTO_EJSON, "trailing characters");
  expect_err("{" QKV "}{}", ATTN_PROTO_EJSON, "trailing characters");
}

Test(json, every_truncation_is_malformed) {
  const char *body = "{" QKV ", \"causal\": true}";
  size_t len = strlen(body);
  for (size_t cut = 1; cut < len; cut++) {
    attn_proto_req pr;
    attn_status st;
    int rc = attn_proto_decode_json(body, cut, NULL, &pr, &st);
    cr_assert_eq(rc, ATTN_PROTO_EJSON, "cut at %zu: %d (%s)", cut, rc, st.message);
    cr_assert(strstr(st.message, "invalid JSON at byte"), "cut %zu: %s", cut, st.message);
  }
}

Test(json, keys) {
  expect_err("{\"q\": " T22 ", \"q\": " T22 ", \"k\": " T22 ", \"v\": " T22 "}", ATTN_PROTO_EJSON,
             "duplicate key \"q\"");
  expect_err("{" QKV ", \"causal\": true, \"causal\": false}", ATTN_PROTO_EJSON,
             "duplicate key \"causal\"");
  expect_err("{\"q\": {\"shape\": [2, 2], \"shape\": [2, 2], \"data\": [1, 2, 3, 4]}, "
             "\"k\": " T22 ", \"v\": " T22 "}",
             ATTN_PROTO_EJSON, "tensor \"q\": duplicate key \"shape\"");
  expect_err("{\"k\": " T22 ", \"v\": " T22 "}", ATTN_PROTO_EMISSING, "tensor \"q\" is missing");
  expect_err("{\"q\": " T22 ", \"v\": " T22 "}", ATTN_PROTO_EMISSING, "tensor \"k\" is missing");
  expect_err("{\"q\": " T22 ", \"k\": " T22 "}", ATTN_PROTO_EMISSING, "tensor \"v\" is missing");
  expect_err("{}", ATTN_PROTO_EMISSING, "tensor \"q\" is missing");
  expect_err("{" QKV ", \"foo\": 1}", ATTN_PROTO_EOPTION,
             "unknown option \"foo\" in the JSON field");
  expect_err("{\"casual\": true, " QKV "}", ATTN_PROTO_EOPTION, "unknown option \"casual\"");
  expect_err("{" QKV ", \"Q\": 1}", ATTN_PROTO_EOPTION, "unknown option \"Q\"");
}

/* Every key the body may hold is remembered for the duplicate check, the
 * fourteenth as the first (the check once kept twelve, so a repeat past
 * them won silently); a repeat spelled with an escape is a repeat. The
 * check runs over the keys before any tensor is read, so the values here
 * need not be tensors. */
#define FIRST12                                                                   \
  "{\"q\": 0, \"k\": 0, \"v\": 0, \"alibi_slopes\": 0, \"cu_seqlens_q\": 0, "     \
  "\"cu_seqlens_kv\": 0, \"causal\": true, \"scale\": 0.5, \"window_left\": -1, " \
  "\"window_right\": -1, \"stats\": false, \"backend\": \"cpu\", "
Test(json, duplicate_keys_past_the_twelfth) {
  expect_err(FIRST12 "\"softcap\": 0, \"softcap\": 1}", ATTN_PROTO_EJSON,
             "duplicate key \"softcap\"");
  expect_err(FIRST12 "\"softcap\": 0, \"diag_offset\": 0, \"soft\\u0063ap\": 1}", ATTN_PROTO_EJSON,
             "duplicate key \"softcap\"");
  expect_err(FIRST12 "\"softcap\": 0, \"diag_offset\": 0, \"diag_offset\": 1}", ATTN_PROTO_EJSON,
             "duplicate key \"diag_offset\"");
}
#undef FIRST12

/* A name that the decoder reads into a buffer compares by its length, not
 * up to a NUL: "I32\u0000" is no cu_seqlens dtype. */
Test(json, names_with_a_nul_name_nothing) {
  static const char varlen[] =
      "{\"q\": {\"shape\": [1, 2, 2], \"data\": [1, 2, 3, 4]}, "
      "\"k\": {\"shape\": [1, 2, 2], \"data\": [1, 2, 3, 4]}, "
      "\"v\": {\"shape\": [1, 2, 2], \"data\": [1, 2, 3, 4]}, \"cu_seqlens_kv\": [0, 2], "
      "\"cu_seqlens_q\": {\"shape\": [2], \"dtype\": \"%s\", \"data\": [0, 2]}}";
  char body[512];
  attn_proto_req pr;
  attn_status st;
  snprintf(body, sizeof body, varlen, "I32");
  cr_assert_eq(attn_proto_decode_json(body, strlen(body), NULL, &pr, &st), 0, "%s", st.message);
  attn_proto_req_free(&pr);
  snprintf(body, sizeof body, varlen, "I32\\u0000");
  expect_err(body, ATTN_PROTO_ETENSOR, "tensor \"cu_seqlens_q\": dtype must be I32 or I64");
  snprintf(body, sizeof body, varlen, "I64\\u0000x");
  expect_err(body, ATTN_PROTO_ETENSOR, "tensor \"cu_seqlens_q\": dtype must be I32 or I64");
}

Test(json, option_values) {
  expect_err("{" QKV ", \"causal\": \"true\"}", ATTN_PROTO_EOPTVALUE,
             "option \"causal\" in the JSON field must be true or false, not a string");
  expect_err("{" QKV ", \"stats\": 1}", ATTN_PROTO_EOPTVALUE,
             "\"stats\" in the JSON field must "
             "be true or false, not a number");
  expect_err("{" QKV ", \"window_left\": 2.5}", ATTN_PROTO_EOPTVALUE, "got \"2.5\"");
  expect_err("{" QKV ", \"window_left\": -2}", ATTN_PROTO_EOPTVALUE, "got \"-2\"");
  expect_err("{" QKV ", \"window_right\": 1e300}", ATTN_PROTO_EOPTVALUE, "window_right");
  expect_err("{" QKV ", \"window_right\": null}", ATTN_PROTO_EOPTVALUE,
             "must be an integer, not null");
  expect_err("{" QKV ", \"scale\": \"x\"}", ATTN_PROTO_EOPTVALUE,
             "option \"scale\" in the JSON field must be a number, not a string");
  expect_err("{" QKV ", \"scale\": 1e999}", ATTN_PROTO_EOPTVALUE, "must be a finite number");
  expect_err("{" QKV ", \"backend\": \"gpu\"}", ATTN_PROTO_EOPTVALUE,
             "auto, cpu, cuda or reference (got \"gpu\")");
  expect_err("{" QKV ", \"backend\": [\"cpu\"]}", ATTN_PROTO_EOPTVALUE, "not an array");
}

#define KV ", \"k\": " T22 ", \"v\": " T22 "}"

Test(json, tensor_objects) {
  expect_err("{\"q\": {\"shape\": [-2, 2], \"data\": []}" KV, ATTN_PROTO_ETENSOR,
             "tensor \"q\": shape[0] = -2 must be an integer >= 0");
  expect_err("{\"q\": {\"shape\": [2, 2.5], \"data\": []}" KV, ATTN_PROTO_ETENSOR,
             "shape[1] = 2.5 must be an integer");
  expect_err("{\"q\": {\"shape\": [2, \"2\"], \"data\": []}" KV, ATTN_PROTO_ETENSOR,
             "shape[1] must be an integer, not a string");
  expect_err("{\"q\": {\"shape\": [2, 1e300], \"data\": []}" KV, ATTN_PROTO_ETENSOR,
             "shape[1] = 1.0000000000000001e+300 is too large");
  expect_err("{\"q\": {\"shape\": [1099511627776, 1099511627776, 1099511627776], "
             "\"data\": []}" KV,
             ATTN_PROTO_ETENSOR, "element count overflows");
  expect_err("{\"q\": {\"shape\": [2, 1, 1, 1, 1], \"data\": [1, 2]}" KV, ATTN_PROTO_ETENSOR,
             "tensor \"q\" has 5 dimensions");
  expect_err("{\"q\": {\"shape\": 4, \"data\": [1]}" KV, ATTN_PROTO_ETENSOR,
             "shape must be an array of integers, not a number");
  expect_err("{\"q\": {\"shape\": [2, 0], \"data\": []}" KV, ATTN_PROTO_ETENSOR,
             "has a dimension below 1");
  expect_err("{\"k\": {\"shape\": [2, 3], \"data\": [1, 2, 3, 4, 5]}, \"q\": " T22 ", \"v\": " T22
             "}",
             ATTN_PROTO_ETENSOR, "tensor \"k\": shape [2, 3] needs 6 values, data has 5");
  expect_err("{\"q\": {\"shape\": [2, 2], \"data\": [1, \"1\", 3, 4]}" KV, ATTN_PROTO_ETENSOR,
             "tensor \"q\": data[1] must be a number, not a string");
  expect_err("{\"q\": {\"shape\": [2, 2], \"data\": [null, 2, 3, 4]}" KV, ATTN_PROTO_ETENSOR,
             "data[0] must be a number, not null");
  expect_err("{\"q\": {\"shape\": [2, 2], \"data\": [1, 2, true, 4]}" KV, ATTN_PROTO_ETENSOR,
             "data[2] must be a number, not a boolean");
  expect_err("{\"q\": {\"shape\": [2, 2], \"data\": [[1, 2], [3, 4]]}" KV, ATTN_PROTO_ETENSOR,
             "needs 4 values, data has 2");
  expect_err("{\"q\": {\"shape\": [2, 2], \"data\": {}}" KV, ATTN_PROTO_ETENSOR,
             "data must be a flat array of numbers, not an object");
  expect_err("{\"q\": {\"shape\": [2, 2], \"data\": [1, 2, 1e999, 4]}" KV, ATTN_PROTO_ENONFINITE,
             "tensor \"q\": data[2] is not finite");
  expect_err("{\"q\": {\"shape\": [2, 2], \"data\": [1, 2, 3, -1e39]}" KV, ATTN_PROTO_ENONFINITE,
             "data[3] = -1e+39 overflows F32");
  expect_err("{\"q\": {\"shape\": [2, 2], \"dtype\": \"F16\", \"data\": [1, 70000, 3, 4]}, "
             "\"k\": {\"shape\": [2, 2], \"dtype\": \"F16\", \"data\": [1, 2, 3, 4]}, "
             "\"v\": {\"shape\": [2, 2], \"dtype\": \"F16\", \"data\": [1, 2, 3, 4]}}",
             ATTN_PROTO_ENONFINITE, "data[1] = 70000 overflows F16");
  expect_err("{\"q\": {\"shape\": [2, 2], \"dtype\": \"BF16\", \"data\": [3.4e38, 1, 1, 1]}" KV,
             ATTN_PROTO_ENONFINITE, "overflows BF16");
  expect_err("{\"q\": {\"shape\": [2, 2], \"dtype\": \"F64\", \"data\": [1, 2, 3, 4]}" KV,
             ATTN_PROTO_ETENSOR, "unknown dtype \"F64\"");
  expect_err("{\"q\": {\"shape\": [2, 2], \"dtype\": 32, \"data\": [1, 2, 3, 4]}" KV,
             ATTN_PROTO_ETENSOR, "dtype must be a string");
  expect_err("{\"q\": {\"shap\": [2, 2], \"data\": [1, 2, 3, 4]}" KV, ATTN_PROTO_ETENSOR,
             "tensor \"q\": unknown key \"shap\"");
  expect_err("{\"q\": {\"shape\": [2, 2]}" KV, ATTN_PROTO_ETENSOR,
             "tensor \"q\": missing key \"data\"");
  expect_err("{\"q\": {\"data\": [1]}" KV, ATTN_PROTO_ETENSOR, "missing key \"shape\"");
  expect_err("{\"q\": \"abc\"" KV, ATTN_PROTO_ETENSOR,
             "tensor \"q\" must be an object {\"shape\", \"dtype\", \"data\"} or nested "
             "arrays of numbers, not a string");
  expect_err("{\"q\": null" KV, ATTN_PROTO_ETENSOR, "not null");
}

Test(json, nested_arrays) {
  expect_err("{\"q\": [[1, 2, 3, 4], [1, 2, 3]]" KV, ATTN_PROTO_ETENSOR,
             "tensor \"q\": row [1] has 3 elements, row [0] has 4");
  expect_err("{\"q\": [[[1, 2], [3, 4]], [[1, 2], [3]]]" KV, ATTN_PROTO_ETENSOR,
             "row [1][1] has 1 elements, row [0][0] has 2");
  expect_err("{\"q\": [[1, 2], 3]" KV, ATTN_PROTO_ETENSOR,
             "element [1] is a number where an array belongs");
  expect_err("{\"q\": [[1, [2]], [3, 4]]" KV, ATTN_PROTO_ETENSOR,
             "element [0][1] must be a number, not an array");
  expect_err("{\"q\": [[1, \"2\"], [3, 4]]" KV, ATTN_PROTO_ETENSOR,
             "element [0][1] must be a number, not a string");
  expect_err("{\"q\": [[1, 2], [3, 1e999]]" KV, ATTN_PROTO_ENONFINITE,
             "element [1][1] is not finite");
  expect_err("{\"q\": [[[[[1]]]]]" KV, ATTN_PROTO_ETENSOR, "nested arrays deeper than 4");
  expect_err("{\"q\": [1, 2, 3]" KV, ATTN_PROTO_ETENSOR, "tensor \"q\" has 1 dimensions");
  expect_err("{\"q\": []" KV, ATTN_PROTO_ETENSOR, "has 1 dimensions");
  expect_err("{\"q\": [[], [1]]" KV, ATTN_PROTO_ETENSOR, "row [1] has 1 elements, row [0] has 0");
  /* A first row of 10^5 numbers and 10^5 empty rows claims 10^10 elements:
   * refused as ragged before anything that size is allocated. */
  FILE *f;
  char *body;
  size_t len;
  f = open_memstream(&body, &len);
  fputs("{\"q\": [[", f);
  for (int i = 0; i < 100000; i++)
    fputs(i ? ",1" : "1", f);
  fputs("]", f);
  for (int i = 0; i < 100000; i++)
    fputs(",[]", f);
  fputs("]" KV, f);
  fclose(f);
  expect_err(body, ATTN_PROTO_ETENSOR, "row [1] has 0 elements, row [0] has 100000");
  free(body);
}

Test(json, nesting_bound) {
  char body[128];
  memset(body, '[', 50);
  memset(body + 50, ']', 50);
  body[100] = 0;
  expect_err(body, ATTN_PROTO_EJSON, "nesting deeper than 6");
  expect_err("{\"q\": [[[[[[1]]]]]]" KV, ATTN_PROTO_EJSON, "invalid JSON at byte 11: nesting");
  /* A deep body past cJSON's own limit still gets our message. */
  size_t n = 100000;
  char *deep = malloc(n + 1);
  memset(deep, '{', n);
  deep[n] = 0;
  expect_err(deep, ATTN_PROTO_EJSON, "nesting deeper than 6");
  free(deep);
  /* Brackets inside strings do not count. */
  expect_err("{\"[[[[[[[[\": 1, " QKV "}", ATTN_PROTO_EOPTION, "unknown option \"[[[[[[[[\"");
}

Test(json, shapes_together) {
  expect_err("{\"q\": {\"shape\": [2, 2], \"data\": [1, 2, 3, 4]}, "
             "\"k\": {\"shape\": [2, 2], \"dtype\": \"F16\", \"data\": [1, 2, 3, 4]}, "
             "\"v\": " T22 "}",
             ATTN_PROTO_EDTYPE, "tensor \"k\" is F16 but \"q\" is F32");
  expect_err("{\"q\": {\"shape\": [3, 2, 2], \"data\": [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4]}, "
             "\"k\": {\"shape\": [2, 2, 2], \"data\": [1, 2, 3, 4, 1, 2, 3, 4]}, "
             "\"v\": {\"shape\": [2, 2, 2], \"data\": [1, 2, 3, 4, 1, 2, 3, 4]}}",
             ATTN_PROTO_ESHAPE, "query heads must be a multiple of key/value heads");
  expect_err("{\"q\": [[1, 2, 3]], \"k\": " T22 ", \"v\": " T22 "}", ATTN_PROTO_ESHAPE,
             "head dims differ");
}

Test(json, encode_refuses_empty_request) {
  attn_proto_req pr;
  memset(&pr, 0, sizeof pr);
  char *out = (char *)1;
  size_t len = 1;
  attn_status st;
  cr_expect_eq(attn_proto_encode_json(&pr, "cpu", &out, &len, &st), ATTN_EINVAL);
  cr_expect_null(out);
  cr_expect_eq(len, 0);
}

/* ---- the in-place reader ------------------------------------------------- */

Test(json, grammar_is_strict) {
  /* strings: UTF-8, control bytes, escapes, surrogate pairs */
  expect_err("{\"q\xc3\": 1}", ATTN_PROTO_EJSON, "invalid JSON at byte 3: invalid UTF-8");
  expect_err("{\"\xed\xa0\x80\": 1}", ATTN_PROTO_EJSON, "invalid UTF-8"); /* a surrogate */
  expect_err("{\"a\nb\": 1}", ATTN_PROTO_EJSON, "byte 3: a control byte in a string");
  expect_err("{\"\\q\": 1}", ATTN_PROTO_EJSON, "byte 3: unknown escape");
  expect_err("{\"\\u12g4\": 1}", ATTN_PROTO_EJSON, "byte 6: \\u needs four hex digits");
  expect_err("{\"\\udc00\": 1}", ATTN_PROTO_EJSON, "byte 2: a \\u escape of half a UTF-16");
  expect_err("{\"\\ud800x\": 1}", ATTN_PROTO_EJSON, "half a UTF-16 surrogate pair");
  expect_err("{\"\\ud800\\u0041\": 1}", ATTN_PROTO_EJSON, "half a UTF-16 surrogate pair");
  /* numbers are JSON's, not strtod's */
  const char *nums[] = {"01", "1.",   ".5",  "-",        "1e",        "1e+",
                        "+1", "0x10", "NaN", "Infinity", "-Infinity", "1.5.2"};
  for (size_t i = 0; i < sizeof nums / sizeof *nums; i++) {
    char body[128];
    snprintf(body, sizeof body, "{\"scale\": %s}", nums[i]);
    expect_err(body, ATTN_PROTO_EJSON, "invalid JSON at byte");
  }
  expect_err("{\"causal\": tru}", ATTN_PROTO_EJSON, "byte 14: expected a value");
  expect_err("{\"causal\": nul", ATTN_PROTO_EJSON, "byte 14 (the body ends early)");
  expect_err("{\"q\" 1}", ATTN_PROTO_EJSON, "byte 5: expected ':'");
  expect_err("{\"q\": 1 2}", ATTN_PROTO_EJSON, "byte 8: expected ',' or '}'");
  expect_err("{\"q\": [1 2]}", ATTN_PROTO_EJSON, "byte 9: expected ',' or ']'");
  expect_err("{1: 2}", ATTN_PROTO_EJSON, "byte 1: expected a key");
  expect_err("{\"q\": 1,}", ATTN_PROTO_EJSON, "byte 8: expected a key");
  /* only the four JSON whitespace bytes separate tokens */
  static const char nul_body[] = "{\"q\": 1,\0 \"k\": 2}";
  attn_proto_req pr;
  attn_status st;
  cr_expect_eq(attn_proto_decode_json(nul_body, sizeof nul_body - 1, NULL, &pr, &st),
               ATTN_PROTO_EJSON);
  cr_expect(strstr(st.message, "byte 8: expected a key"), "%s", st.message);
  /* A body that is not JSON is refused as such, whatever comes before the
   * fault: the whole body is checked before any key is looked at. */
  expect_err("{\"foo\": 1, \"q\": [1,, 2]}", ATTN_PROTO_EJSON, "invalid JSON at byte 19");
}

Test(json, strings_are_unescaped) {
  /* Escaped keys and values are the characters they spell; a NUL inside
   * one is part of it (cJSON cut strings there, so "q\u0000x" read as "q"). */
  const char *ok = "{\"\\u0071\": " T22 ", \"k\": " T22 ", \"\\u0076\": " T22
                   ", \"backend\": \"c\\u0070u\", \"\\u0063a\\u0075sal\": true}";
  attn_proto_req pr;
  attn_status st;
  cr_assert_eq(attn_proto_decode_json(ok, strlen(ok), NULL, &pr, &st), 0, "%s", st.message);
  cr_expect_str_eq(pr.req.backend, "cpu");
  cr_expect(pr.req.causal);
  attn_proto_req_free(&pr);
  expect_err("{\"c\\/ausal\": true, " QKV "}", ATTN_PROTO_EOPTION, "unknown option \"c/ausal\"");
  expect_err("{\"q\\u0000\": 1, " QKV "}", ATTN_PROTO_EOPTION, "unknown option \"q\\x00\"");
  expect_err("{\"\\ud83d\\ude00\": 1}", ATTN_PROTO_EOPTION,
             "unknown option \"\\xf0\\x9f\\x98\\x80\"");
  expect_err("{" QKV ", \"backend\": \"cpu\\u0000\"}", ATTN_PROTO_EOPTVALUE, "(got \"cpu\\x00\")");
  expect_err("{\"q\": {\"shape\": [2, 2], \"dtype\": \"F32\\u0000\", \"data\": [1, 2, 3, 4]}" KV,
             ATTN_PROTO_ETENSOR, "unknown dtype \"F32\\x00\"");
  expect_err("{\"q\": {\"shape\": [2, 2], \"dtype\": \"\\n\", \"data\": [1, 2, 3, 4]}" KV,
             ATTN_PROTO_ETENSOR, "unknown dtype \"\\x0a\"");
  /* Long strings are quoted cut, and never match a name. */
  char body[1024], val[401];
  memset(val, 'x', 400);
  val[400] = 0;
  snprintf(body, sizeof body, "{" QKV ", \"backend\": \"%s\"}", val);
  expect_err(body, ATTN_PROTO_EOPTVALUE, "(got \"xxxxxxxxxxxxxxxxxxxx");
  snprintf(body, sizeof body, "{" QKV ", \"%s\": 1}", val);
  expect_err(body, ATTN_PROTO_EOPTION, "xxxxxxxxxxxxxxxxxxxx...\"");
  snprintf(body, sizeof body, "{\"q\": {\"shape\": [2, 2], \"%s\": 1}" KV, val);
  expect_err(body, ATTN_PROTO_ETENSOR, "unknown key \"xxxxxxxxxx");
}

Test(json, layout_is_free) {
  /* Keys in any order, any JSON whitespace anywhere. */
  const char *body = "\r\n{ \"v\" :{\"data\":[ 1 ,2,\t3,4 ] ,\"dtype\":\"F16\",\"shape\":[2,2]},"
                     "\n\"k\":{\"dtype\":\"F16\",\"data\":[1,2,3,4],\"shape\":[2,2]} ,"
                     "\"q\":{\"shape\":[ 2 , 2 ],\"data\":[-0.5,2e0,3E+0,4.0e-0],\"dtype\":"
                     "\"F16\"} }\n\t ";
  attn_proto_req pr;
  attn_status st;
  cr_assert_eq(attn_proto_decode_json(body, strlen(body), NULL, &pr, &st), 0, "%s", st.message);
  cr_expect_eq(pr.req.dtype, ATTN_F16);
  const uint16_t *q = pr.req.q;
  cr_expect(q[0] == attn_f64_to_f16(-0.5) && q[1] == attn_f64_to_f16(2) &&
            q[2] == attn_f64_to_f16(3) && q[3] == attn_f64_to_f16(4));
  attn_proto_req_free(&pr);
  const char *nested = "{\"q\": [ [ 1 , 2 ] ,\n [3,4] ], \"k\": [[1,2]], \"v\": [[5 ,6]]}";
  cr_assert_eq(attn_proto_decode_json(nested, strlen(nested), NULL, &pr, &st), 0, "%s", st.message);
  cr_expect_eq(((const float *)pr.req.q)[3], 4.0f);
  cr_expect_eq(((const float *)pr.req.v)[1], 6.0f);
  attn_proto_req_free(&pr);
}

Test(json, decode_bound) {
  /* Two bytes of text at least per stored number, 4 bytes per F32, and no
   * more than ATTN_PROTO_MAX_JSON_ELEMS numbers whatever the length; 4 bytes
   * more for each number that could be a cu_seqlens offset (int64), at most
   * 2 x ATTN_PROTO_MAX_JSON_CU of them. */
  const size_t cu = 2 * ATTN_PROTO_MAX_JSON_CU * 4;
  cr_expect_eq(attn_proto_json_decode_bound(0), 0);
  cr_expect_eq(attn_proto_json_decode_bound(1001), 2000 + 2000);
  cr_expect_eq(attn_proto_json_decode_bound((size_t)1 << 40), ATTN_PROTO_MAX_JSON_ELEMS * 4 + cu);
  /* The tightest body: "[0,0,...,0]" data; its tensors fit the bound. */
  size_t len;
  char *body;
  FILE *f = open_memstream(&body, &len);
  fputs("{\"q\":{\"shape\":[1000,4],\"data\":[0", f);
  for (int i = 1; i < 4000; i++)
    fputs(",0", f);
  fputs("]},\"k\":[[0]],\"v\":[[0]]}", f);
  fclose(f);
  attn_proto_req pr;
  attn_status st;
  int rc = attn_proto_decode_json(body, len, NULL, &pr, &st);
  cr_expect_eq(rc, ATTN_PROTO_ESHAPE, "%s", st.message); /* D 4 against 1 */
  cr_expect_leq(4002 * sizeof(float), attn_proto_json_decode_bound(len));
  free(body);
  /* The tightest body of offsets: two cu_seqlens tensors of 4097 zeros
   * (int64 each), beside three one-number tensors. */
  f = open_memstream(&body, &len);
  fputs("{\"q\":[[0]],\"k\":[[0]],\"v\":[[0]]", f);
  for (int t = 0; t < 2; t++) {
    fputs(t ? ",\"cu_seqlens_kv\":[0" : ",\"cu_seqlens_q\":[0", f);
    for (size_t i = 1; i < ATTN_PROTO_MAX_JSON_CU; i++)
      fputs(",0", f);
    fputs("]", f);
  }
  fputs("}", f);
  fclose(f);
  rc = attn_proto_decode_json(body, len, NULL, &pr, &st);
  cr_expect_eq(rc, ATTN_ESHAPE, "%s", st.message); /* offsets that end at 0, not 1 */
  cr_expect_leq(3 * sizeof(float) + 2 * ATTN_PROTO_MAX_JSON_CU * sizeof(int64_t),
                attn_proto_json_decode_bound(len));
  free(body);
}
