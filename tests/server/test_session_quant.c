/*
 * test_session_quant.c — quantized sessions ("kv_dtype": "F8_E4M3" or
 * "I8") through a real attnd: each call's output against the float64
 * reference over the rows the session stores (each appended row
 * quantized per KV head, code x scale), GET's kv_dtype and the smaller
 * reservation, a replay and a conflict, an export imported into another
 * server (byte-identical export, the same bits computed), and the
 * refusals: an unknown kv_dtype, a file whose scale or code no quantizer
 * writes, a create that differs only in kv_dtype. The CLI's create
 * --kv-dtype and get.
 */
#include "harness.h"
#include "kv/kv.h"
#include "proto.h"

#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static srv A, B;
static void teardown(void) {
  srv_cleanup(&A);
  srv_cleanup(&B);
}
TestSuite(session_quant, .fini = teardown, .timeout = 180);

#define JSON_CT "Content-Type: application/json"
#define ST_CT "Content-Type: application/octet-stream"
#define HQ 4
#define HKV 2
#define D 32
#define N 40

/* A session's tokens, F32: q [HQ, N, D], k and v [HKV, N, D]; one row of
 * k all zeros (scale 0). */
typedef struct stream {
  float q[HQ * N * D], k[HKV * N * D], v[HKV * N * D];
} stream;

static void stream_init(stream *s, uint64_t seed) {
  for (int64_t i = 0; i < HQ * N * D; i++)
    s->q[i] = (float)tuniform(&seed);
  for (int64_t i = 0; i < HKV * N * D; i++) {
    s->k[i] = (float)tuniform(&seed) * 3;
    s->v[i] = (float)tuniform(&seed);
  }
  memset(s->k + 5 * D, 0, D * sizeof(float)); /* head 0, token 5 */
}

static void put_rows(attn_sbuf *b, const char *name, const float *t, int64_t h, int64_t r0,
                     int64_t n) {
  attn_sbuf_printf(b, "\"%s\": {\"shape\": [%lld, %lld, %d], \"dtype\": \"F32\", \"data\": [", name,
                   (long long)h, (long long)n, D);
  for (int64_t i = 0; i < h; i++)
    for (int64_t j = 0; j < n * D; j++)
      attn_sbuf_printf(b, "%s%.9g", i || j ? "," : "", (double)t[(i * N + r0) * D + j]);
  attn_sbuf_puts(b, "]}, ");
}

/* Tokens [pos, pos + n) appended with their queries: the status, and the
 * reply's o into o ([HQ, n, D]) when 200. */
static long step(srv *sv, const char *id, const stream *s, int64_t pos, int64_t n, float *o,
                 char *why, size_t cap) {
  attn_sbuf b = {0};
  attn_sbuf_puts(&b, "{");
  put_rows(&b, "q", s->q, HQ, pos, n);
  put_rows(&b, "k", s->k, HKV, pos, n);
  put_rows(&b, "v", s->v, HKV, pos, n);
  attn_sbuf_printf(&b, "\"pos\": %lld}", (long long)pos);
  char path[128];
  snprintf(path, sizeof path, "/v1/sessions/%s/attention", id);
  const char *h[] = {JSON_CT, NULL};
  http_res r;
  http_call(sv, "POST", path, h, b.p, b.len, &r);
  free(b.p);
  long status = r.status;
  snprintf(why, cap, "%.300s", r.body ? r.body : "");
  if (status == 200) {
    cJSON *j = cJSON_Parse(r.body),
          *data = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "o"), "data");
    cr_assert_eq(cJSON_GetArraySize(data), HQ * n * D);
    int i = 0;
    for (cJSON *x = data->child; x; x = x->next)
      o[i++] = (float)x->valuedouble;
    cJSON_Delete(j);
  }
  http_res_free(&r);
  return status;
}

/* The rows a session of kind q stores for t's first nk tokens, as values:
 * each row quantized and dequantized (code x scale, in F32 as the kernel
 * computes it). */
static void stored_rows(attn_kv_quant q, const float *t, int64_t nk, float *out) {
  uint8_t codes[D];
  for (int64_t h = 0; h < HKV; h++)
    for (int64_t j = 0; j < nk; j++) {
      const float *x = t + (h * N + j) * D;
      float sc = attn_kv_quantize_row(q, x, ATTN_F32, D, codes);
      for (int d = 0; d < D; d++)
        out[(h * nk + j) * D + d] = attn_kv_code_value(q, codes[d]) * sc;
    }
}

/* The float64 reference of queries [q0, q0 + nq) over keys [0, q0 + nq)
 * (causal), K and V as given ([HKV, nk, D]); its relative error of o. */
static double ref_error(const stream *s, const float *k, const float *v, int64_t q0, int64_t nq,
                        const float *o) {
  attn_request r;
  attn_request_init(&r);
  const int64_t nk = q0 + nq;
  r.batch = 1, r.heads_q = HQ, r.heads_kv = HKV, r.seq_q = nq, r.seq_kv = nk;
  r.head_dim = D, r.dtype = ATTN_F32, r.causal = true;
  static float q[HQ * N * D], scratch[HQ * N * D];
  static double want[HQ * N * D];
  for (int64_t h = 0; h < HQ; h++)
    memcpy(q + h * nq * D, s->q + (h * N + q0) * D, (size_t)(nq * D) * sizeof *q);
  r.q = q, r.k = k, r.v = v, r.o = scratch;
  attn_status st;
  cr_assert_eq(attn_reference(&r, want, NULL, NULL, NULL, &st), 0, "%s", st.message);
  double num = 0, den = 0;
  for (int64_t i = 0; i < HQ * nq * D; i++) {
    double e = (double)o[i] - want[i];
    num += isnan(e) ? INFINITY : e * e;
    den += want[i] * want[i];
  }
  return sqrt(num / den);
}

static long create(srv *sv, const char *id, const char *kv_dtype, int64_t max_tokens, char *why,
                   size_t cap) {
  char path[128], body[300];
  snprintf(path, sizeof path, "/v1/sessions/%s", id);
  snprintf(body, sizeof body,
           "{\"heads_kv\": %d, \"head_dim\": %d, \"dtype\": \"F32\", \"max_tokens\": %lld%s%s%s}",
           HKV, D, (long long)max_tokens, kv_dtype ? ", \"kv_dtype\": \"" : "",
           kv_dtype ? kv_dtype : "", kv_dtype ? "\"" : "");
  const char *h[] = {JSON_CT, NULL};
  http_res r;
  long status = http_call(sv, "PUT", path, h, body, strlen(body), &r);
  snprintf(why, cap, "%.300s", r.body ? r.body : "");
  http_res_free(&r);
  return status;
}

/* A session of kind q: two calls (the second decoding one token), each
 * within F32's tolerance of the float64 reference over the stored rows;
 * their error against the unquantized rows printed. */
static void calls_match_the_stored_rows(const char *kind, attn_kv_quant q) {
  static stream s;
  static float o[HQ * N * D], k[HKV * N * D], v[HKV * N * D];
  char why[400], id[32];
  stream_init(&s, 11 + (uint64_t)q);
  snprintf(id, sizeof id, "q-%s", kind);
  cr_assert_eq(create(&A, id, kind, 4096, why, sizeof why), 201, "%s", why);
  const int64_t spans[2][2] = {{0, 30}, {30, 1}};
  for (int i = 0; i < 2; i++) {
    const int64_t pos = spans[i][0], n = spans[i][1];
    cr_assert_eq(step(&A, id, &s, pos, n, o, why, sizeof why), 200, "%s", why);
    stored_rows(q, s.k, pos + n, k);
    stored_rows(q, s.v, pos + n, v);
    double e = ref_error(&s, k, v, pos, n, o);
    cr_expect(e < ttol(ATTN_F32), "%s call %d: error %g against the stored rows", kind, i, e);
    for (int64_t h = 0; h < HKV; h++) { /* the rows as sent */
      memcpy(k + h * (pos + n) * D, s.k + h * N * D, (size_t)((pos + n) * D) * sizeof *k);
      memcpy(v + h * (pos + n) * D, s.v + h * N * D, (size_t)((pos + n) * D) * sizeof *v);
    }
    printf("%s: call %d's error against unquantized attention %.3g\n", kind, i,
           ref_error(&s, k, v, pos, n, o));
  }
  /* a replay of the first call is the same bits; other tokens at 0 conflict */
  static float o2[HQ * N * D];
  cr_expect_eq(step(&A, id, &s, 0, 30, o2, why, sizeof why), 200, "replay: %s", why);
  static stream other;
  stream_init(&other, 99);
  cr_expect_eq(step(&A, id, &other, 0, 2, o2, why, sizeof why), 409, "%s", why);
  cr_expect(strstr(why, "session_conflict"), "%s", why);
}

Test(session_quant, calls_get_and_reservation) {
  srv_start(&A, "--session-memory", "16M", NULL);
  calls_match_the_stored_rows("F8_E4M3", ATTN_KVQ_F8_E4M3);
  calls_match_the_stored_rows("I8", ATTN_KVQ_I8);
  char why[400];
  cr_assert_eq(create(&A, "plain", NULL, 4096, why, sizeof why), 201, "%s", why);
  cr_assert_eq(create(&A, "named", "F32", 4096, why, sizeof why), 201, "%s", why);
  /* rows of 32 codes and a scale: 1792 a page (3 for 4096 tokens), where
   * F32's 128 bytes take 512 (8 pages) */
  http_res r;
  http_get(&A, "/v1/sessions/q-I8", &r);
  cr_assert_eq(r.status, 200);
  cr_expect(strstr(r.body, "\"kv_dtype\": \"I8\""), "%s", r.body);
  char want[64];
  snprintf(want, sizeof want, "\"reserved_bytes\": %d", 2 * HKV * 3 * 65536);
  cr_expect(strstr(r.body, want), "%s in %s", want, r.body);
  http_res_free(&r);
  http_get(&A, "/v1/sessions/plain", &r);
  cr_expect(strstr(r.body, "\"kv_dtype\": \"F32\""), "%s", r.body);
  snprintf(want, sizeof want, "\"reserved_bytes\": %d", 2 * HKV * 8 * 65536);
  cr_expect(strstr(r.body, want), "%s in %s", want, r.body);
  http_res_free(&r);
  /* the store's quantized bytes: the two quantized sessions' */
  http_get(&A, "/v1/sessions", &r);
  snprintf(want, sizeof want, "\"quantized_bytes\": %d", 2 * 2 * HKV * 3 * 65536);
  cr_expect(strstr(r.body, want), "%s in %s", want, r.body);
  http_res_free(&r);
  http_get(&A, "/v1/info", &r);
  cr_expect(strstr(r.body, want), "%s in %s", want, r.body);
  http_res_free(&r);
  http_get(&A, "/metrics", &r);
  snprintf(want, sizeof want, "attnd_session_quantized_bytes %d", 2 * 2 * HKV * 3 * 65536);
  cr_expect(strstr(r.body, want), "no %s", want);
  http_res_free(&r);
}

Test(session_quant, refusals) {
  srv_start(&A, "--session-memory", "16M", NULL);
  char why[400];
  cr_expect_eq(create(&A, "a", "F8_E5M2", 64, why, sizeof why), 422);
  cr_expect(strstr(why, "invalid_option") && strstr(why, "kv_dtype"), "%s", why);
  cr_expect_eq(create(&A, "a", "BF16", 64, why, sizeof why), 422, "another dtype: %s", why);
  const char *h[] = {JSON_CT, NULL};
  http_res r;
  const char *num = "{\"heads_kv\": 1, \"head_dim\": 8, \"dtype\": \"F32\", \"max_tokens\": 64, "
                    "\"kv_dtype\": 8}";
  http_call(&A, "PUT", "/v1/sessions/a", h, num, strlen(num), &r);
  expect_error(&r, 422, "invalid_option", "a kv_dtype that is no string");
  http_res_free(&r);
  cr_assert_eq(create(&A, "a", "I8", 64, why, sizeof why), 201, "%s", why);
  cr_expect_eq(create(&A, "a", "I8", 64, why, sizeof why), 200, "a retried create: %s", why);
  cr_expect_eq(create(&A, "a", "F8_E4M3", 64, why, sizeof why), 409, "%s", why);
  cr_expect(strstr(why, "kv_dtype I8"), "%s", why);
}

static char *export_of(srv *sv, const char *id, size_t *len) {
  char path[128];
  snprintf(path, sizeof path, "/v1/sessions/%s/export", id);
  http_res r;
  http_get(sv, path, &r);
  cr_assert_eq(r.status, 200, "export %s: %ld %.300s", id, r.status, r.body);
  char *b = malloc(r.len + 1);
  memcpy(b, r.body, r.len);
  *len = r.len;
  http_res_free(&r);
  return b;
}

static long import_to(srv *sv, const char *id, const void *file, size_t len, http_res *r) {
  char path[128];
  snprintf(path, sizeof path, "/v1/sessions/%s/import", id);
  const char *h[] = {ST_CT, NULL};
  return http_call(sv, "PUT", path, h, file, len, r);
}

/* Where tensor name's data begins in a safetensors file. */
static size_t data_of(const char *file, const char *name) {
  uint64_t hn = 0;
  for (int i = 0; i < 8; i++)
    hn |= (uint64_t)(unsigned char)file[i] << (8 * i);
  char *h = strndup(file + 8, hn);
  cJSON *j = cJSON_Parse(h);
  cJSON *off = cJSON_GetObjectItem(cJSON_GetObjectItem(j, name), "data_offsets");
  cr_assert(off, "no %s in %s", name, h);
  size_t at = 8 + hn + (size_t)cJSON_GetArrayItem(off, 0)->valuedouble;
  cJSON_Delete(j);
  free(h);
  return at;
}

Test(session_quant, export_import_round_trip_and_refusals) {
  srv_start(&A, "--session-memory", "16M", NULL);
  srv_start(&B, "--session-memory", "16M", NULL);
  static stream s;
  static float oa[HQ * N * D], ob[HQ * N * D];
  char why[400];
  stream_init(&s, 21);
  cr_assert_eq(create(&A, "m", "F8_E4M3", 64, why, sizeof why), 201, "%s", why);
  cr_assert_eq(step(&A, "m", &s, 0, 20, oa, why, sizeof why), 200, "%s", why);
  size_t n1, n2;
  char *f1 = export_of(&A, "m", &n1);
  cr_expect(strstr(f1 + 8, "\"kv_dtype\":\"F8_E4M3\""), "metadata: %.400s", f1 + 8);
  cr_expect(strstr(f1 + 8, "\"k.0\":{\"dtype\":\"F8_E4M3\",\"shape\":[2,20,32]"), "%.600s", f1 + 8);
  cr_expect(strstr(f1 + 8, "\"k_scale.0\":{\"dtype\":\"F32\",\"shape\":[2,20]"), "%.600s", f1 + 8);
  http_res r;
  cr_assert_eq(import_to(&B, "m", f1, n1, &r), 201, "%.300s", r.body);
  cr_expect(strstr(r.body, "\"kv_dtype\": \"F8_E4M3\""), "%s", r.body);
  http_res_free(&r);
  char *f2 = export_of(&B, "m", &n2);
  cr_expect(n1 == n2 && !memcmp(f1, f2, n1), "the export after the import differs");
  cr_assert_eq(step(&A, "m", &s, 20, 1, oa, why, sizeof why), 200, "%s", why);
  cr_assert_eq(step(&B, "m", &s, 20, 1, ob, why, sizeof why), 200, "%s", why);
  cr_expect(!memcmp(oa, ob, HQ * D * sizeof *oa), "the imported session computes other bits");
  /* token 5 of head 0 is all zeros: its scale is 0 */
  float sc;
  memcpy(&sc, f1 + data_of(f1, "k_scale.0") + 5 * 4, 4);
  cr_expect_eq(sc, 0.0f);
  /* a NaN scale, a negative one, a NaN code, a nonzero code under scale 0 */
  const float bad[2] = {NAN, -1.0f};
  for (int i = 0; i < 2; i++) {
    char *e = malloc(n1);
    memcpy(e, f1, n1);
    memcpy(e + data_of(f1, "v_scale.0") + 4, &bad[i], 4);
    import_to(&B, "x", e, n1, &r);
    expect_error(&r, 422, "invalid_request", "a scale no quantizer writes");
    cr_expect(strstr(r.body, "v, head 0, row 1"), "%s", r.body);
    http_res_free(&r);
    free(e);
  }
  char *e = malloc(n1);
  memcpy(e, f1, n1);
  e[data_of(f1, "k.0") + 3] = 0x7F;
  import_to(&B, "x", e, n1, &r);
  expect_error(&r, 422, "invalid_request", "an E4M3 NaN code");
  http_res_free(&r);
  memcpy(e, f1, n1);
  e[data_of(f1, "k.0") + 5 * D] = 0x01;
  import_to(&B, "x", e, n1, &r);
  expect_error(&r, 422, "invalid_request", "a code under scale 0");
  http_res_free(&r);
  free(e);
  free(f1), free(f2);
}

Test(session_quant, the_cli_creates_and_shows_it) {
  srv_start(&A, "--session-memory", "16M", NULL);
  char args[256], out[4096];
  snprintf(args, sizeof args,
           "create http://127.0.0.1:%d c --heads-kv 2 --head-dim 64 --max-tokens 64 --dtype BF16 "
           "--kv-dtype F8_E4M3",
           A.port);
  cr_assert_eq(tattn("session", args, out, sizeof out), 0, "%s", out);
  snprintf(args, sizeof args, "get http://127.0.0.1:%d c", A.port);
  cr_assert_eq(tattn("session", args, out, sizeof out), 0, "%s", out);
  cr_expect(strstr(out, "BF16, stored F8_E4M3"), "%s", out);
  snprintf(args, sizeof args,
           "create http://127.0.0.1:%d d --heads-kv 2 --head-dim 64 --max-tokens 64 "
           "--kv-dtype F8_E5M2",
           A.port);
  cr_expect_eq(tattn("session", args, out, sizeof out), 2, "%s", out);
}
