/*
 * test_session_dv.c — sessions whose values have a head dim of their own
 * (create's head_dim_v) and latent sessions (create's v_from_k: k stored
 * alone, v the first Dv columns of each k row, as MLA's absorbed decode
 * reads its cache) through the real attnd: a prefill and token by token
 * decode in both codecs, an attend-only call and the batch route, each
 * reply's o (Dv wide) checked against the float64 reference over exactly
 * the keys the session should hold; GET's fields and a latent session's
 * reservation; and the refusals: v sent to a latent session, v_from_k past
 * head_dim, v of another width than the session's, head_dim_v past 512, a
 * batch mixing a latent session with one that stores v.
 */
#include "harness.h"
#include "proto.h"

#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static srv S;
static void teardown(void) { srv_cleanup(&S); }
TestSuite(session_dv, .fini = teardown, .timeout = 180);

#define JSON_CT "Content-Type: application/json"
#define ST_CT "Content-Type: application/octet-stream"

/* A stream of n tokens: q [hq, n, d], k [hkv, n, d], v [hkv, n, dv] (a
 * latent one's v: the first dv columns of each k row), F32. */
typedef struct stream {
  int64_t hq, hkv, n, d, dv;
  bool latent;
  float *q, *k, *v;
} stream;

static void stream_init(stream *s, int64_t hq, int64_t hkv, int64_t n, int64_t d, int64_t dv,
                        bool latent, uint64_t seed) {
  *s = (stream){hq, hkv, n, d, dv, latent, NULL, NULL, NULL};
  s->q = malloc((size_t)(hq * n * d) * sizeof(float));
  s->k = malloc((size_t)(hkv * n * d) * sizeof(float));
  s->v = malloc((size_t)(hkv * n * dv) * sizeof(float));
  for (int64_t i = 0; i < hq * n * d; i++)
    s->q[i] = (float)tuniform(&seed);
  for (int64_t i = 0; i < hkv * n * d; i++)
    s->k[i] = (float)tuniform(&seed);
  for (int64_t r = 0; r < hkv * n; r++)
    for (int64_t c = 0; c < dv; c++)
      s->v[r * dv + c] = latent ? s->k[r * d + c] : (float)tuniform(&seed);
}

static void stream_free(stream *s) { free(s->q), free(s->k), free(s->v); }

/* Rows [r0, r0 + n) of every head of [h, total, w] at src, contiguous. */
static float *rows_of(const float *src, int64_t h, int64_t total, int64_t w, int64_t r0,
                      int64_t n) {
  float *out = malloc((size_t)(h * n * w) * sizeof(float) + 1);
  for (int64_t i = 0; i < h; i++)
    memcpy(out + i * n * w, src + (i * total + r0) * w, (size_t)(n * w) * sizeof(float));
  return out;
}

/* One tensor of a body: name, [h, n, w], its rows. */
typedef struct tens {
  const char *name;
  int64_t h, n, w;
  float *data;
} tens;

/* q of rows [q0, q0 + nq), and k (and v unless latent) of [k0, k0 + nk)
 * (nk 0: none) of s, into t; how many. */
static int tensors_of(const stream *s, int64_t q0, int64_t nq, int64_t k0, int64_t nk, bool with_v,
                      tens t[3]) {
  int n = 0;
  t[n++] = (tens){"q", s->hq, nq, s->d, rows_of(s->q, s->hq, s->n, s->d, q0, nq)};
  if (nk)
    t[n++] = (tens){"k", s->hkv, nk, s->d, rows_of(s->k, s->hkv, s->n, s->d, k0, nk)};
  if (nk && with_v)
    t[n++] = (tens){"v", s->hkv, nk, s->dv, rows_of(s->v, s->hkv, s->n, s->dv, k0, nk)};
  return n;
}

static void tensors_free(tens *t, int n) {
  for (int i = 0; i < n; i++)
    free(t[i].data);
}

/* {"q": {...}, ... extra} with extra verbatim (", \"pos\": 3"). */
static char *json_of(const tens *t, int n, const char *extra, size_t *len) {
  attn_sbuf b = {0};
  attn_sbuf_puts(&b, "{");
  for (int i = 0; i < n; i++) {
    attn_sbuf_printf(
        &b, "%s\"%s\": {\"shape\": [%lld, %lld, %lld], \"dtype\": \"F32\", \"data\": [",
        i ? ", " : "", t[i].name, (long long)t[i].h, (long long)t[i].n, (long long)t[i].w);
    for (int64_t j = 0; j < t[i].h * t[i].n * t[i].w; j++)
      attn_sbuf_printf(&b, "%s%.9g", j ? "," : "", (double)t[i].data[j]);
    attn_sbuf_puts(&b, "]}");
  }
  attn_sbuf_printf(&b, "%s}", extra);
  *len = b.len;
  return b.p;
}

/* A safetensors file of the tensors with __metadata__ meta. */
static char *st_of(const tens *t, int n, const char *meta, size_t *len) {
  attn_sbuf h = {0};
  attn_sbuf_printf(&h, "{\"__metadata__\": %s", meta);
  size_t off = 0;
  for (int i = 0; i < n; i++) {
    size_t bytes = (size_t)(t[i].h * t[i].n * t[i].w) * sizeof(float);
    attn_sbuf_printf(&h,
                     ", \"%s\": {\"dtype\": \"F32\", \"shape\": [%lld, %lld, %lld], "
                     "\"data_offsets\": [%zu, %zu]}",
                     t[i].name, (long long)t[i].h, (long long)t[i].n, (long long)t[i].w, off,
                     off + bytes);
    off += bytes;
  }
  attn_sbuf_puts(&h, "}");
  char *b = malloc(8 + h.len + off);
  for (int i = 0; i < 8; i++)
    b[i] = (char)((uint64_t)h.len >> (8 * i));
  memcpy(b + 8, h.p, h.len);
  off = 8 + h.len;
  for (int i = 0; i < n; i++) {
    size_t bytes = (size_t)(t[i].h * t[i].n * t[i].w) * sizeof(float);
    memcpy(b + off, t[i].data, bytes);
    off += bytes;
  }
  *len = off;
  free(h.p);
  return b;
}

/* The reply's o as floats (malloc'd), its shape's last two dims checked. */
static float *reply_o(const http_res *r, bool st, int64_t n, int64_t dv, const char *what) {
  float *o = NULL;
  cJSON *j = NULL, *t;
  if (st) {
    cr_assert(r->len > 8, "%s: %zu bytes", what, r->len);
    uint64_t hn = 0;
    for (int i = 0; i < 8; i++)
      hn |= (uint64_t)(unsigned char)r->body[i] << (8 * i);
    j = cJSON_ParseWithLength(r->body + 8, (size_t)hn);
    t = cJSON_GetObjectItem(j, "o");
    cJSON *offs = cJSON_GetObjectItem(t, "data_offsets");
    cr_assert(offs, "%s: no o in the reply", what);
    size_t a = (size_t)cJSON_GetArrayItem(offs, 0)->valuedouble,
           e = (size_t)cJSON_GetArrayItem(offs, 1)->valuedouble;
    o = malloc(e - a + 1);
    memcpy(o, r->body + 8 + hn + a, e - a);
  } else {
    j = cJSON_Parse(r->body);
    t = cJSON_GetObjectItem(j, "o");
    cJSON *data = cJSON_GetObjectItem(t, "data");
    cr_assert(data, "%s: no o in %.200s", what, r->body);
    o = malloc((size_t)cJSON_GetArraySize(data) * sizeof(float) + 1);
    int i = 0;
    for (cJSON *x = data->child; x; x = x->next)
      o[i++] = (float)x->valuedouble;
  }
  cJSON *shape = cJSON_GetObjectItem(t, "shape");
  int rank = cJSON_GetArraySize(shape);
  cr_assert(rank >= 2, "%s: o's shape", what);
  cr_expect(cJSON_GetArrayItem(shape, rank - 1)->valuedouble == (double)dv &&
                cJSON_GetArrayItem(shape, rank - 2)->valuedouble == (double)n,
            "%s: o is not [.., %lld, %lld]", what, (long long)n, (long long)dv);
  cJSON_Delete(j);
  return o;
}

/* o [hq, nq, dv] against the float64 reference of queries [q0, q0 + nq)
 * over keys [0, nkv) of s, causal bottom-right: the session's mask. */
static void expect_reference(const stream *s, int64_t q0, int64_t nq, int64_t nkv, const float *o,
                             const char *what) {
  attn_request r;
  attn_request_init(&r);
  r.batch = 1, r.heads_q = s->hq, r.heads_kv = s->hkv, r.seq_q = nq, r.seq_kv = nkv;
  r.head_dim = s->d, r.head_dim_v = s->dv, r.dtype = ATTN_F32, r.causal = true;
  float *q = rows_of(s->q, s->hq, s->n, s->d, q0, nq);
  float *k = rows_of(s->k, s->hkv, s->n, s->d, 0, nkv);
  float *v = rows_of(s->v, s->hkv, s->n, s->dv, 0, nkv);
  size_t no = (size_t)(s->hq * nq * s->dv);
  double *want = malloc(no * sizeof *want);
  float *scratch = malloc(no * sizeof *scratch);
  r.q = q, r.k = k, r.v = v, r.o = scratch;
  attn_status st;
  cr_assert_eq(attn_reference(&r, want, NULL, NULL, NULL, &st), 0, "%s: %s", what, st.message);
  double num = 0, den = 0;
  for (size_t i = 0; i < no; i++) {
    double e = (double)o[i] - want[i];
    num += isnan(e) ? INFINITY : e * e;
    den += want[i] * want[i];
  }
  cr_expect(sqrt(num / den) < ttol(ATTN_F32), "%s: relative error %g", what, sqrt(num / den));
  free(q), free(k), free(v), free(want), free(scratch);
}

static long put_json(const char *path, const char *body, http_res *r) {
  const char *h[] = {JSON_CT, NULL};
  return http_call(&S, "PUT", path, h, body, strlen(body), r);
}

/* Session id for s: head_dim_v, or v_from_k when s is latent. */
static void create(const char *id, const stream *s, int64_t max_tokens) {
  char path[200], body[300];
  snprintf(path, sizeof path, "/v1/sessions/%s", id);
  snprintf(body, sizeof body,
           "{\"heads_kv\": %lld, \"head_dim\": %lld, \"%s\": %lld, \"dtype\": \"F32\", "
           "\"max_tokens\": %lld}",
           (long long)s->hkv, (long long)s->d, s->latent ? "v_from_k" : "head_dim_v",
           (long long)s->dv, (long long)max_tokens);
  http_res r;
  cr_assert_eq(put_json(path, body, &r), 201, "create %s: %ld %s", id, r.status, r.body);
  http_res_free(&r);
}

/* Tokens [pos, pos + n) of s appended to id (n 0: attend q row pos - 1
 * over the whole length), in a codec; the reply checked. */
static void step(const char *id, const stream *s, int64_t pos, int64_t n, bool st,
                 const char *what) {
  tens t[3];
  int64_t q0 = n ? pos : pos - 1, nq = n ? n : 1;
  int nt = tensors_of(s, q0, nq, pos, n, !s->latent, t);
  char path[200], extra[64];
  snprintf(path, sizeof path, "/v1/sessions/%s/attention", id);
  size_t len;
  char *b;
  if (st) {
    snprintf(extra, sizeof extra, n ? "{\"pos\": \"%lld\"}" : "{}", (long long)pos);
    b = st_of(t, nt, extra, &len);
  } else {
    snprintf(extra, sizeof extra, n ? ", \"pos\": %lld" : "", (long long)pos);
    b = json_of(t, nt, extra, &len);
  }
  const char *h[] = {st ? ST_CT : JSON_CT, st ? "Accept: application/octet-stream" : NULL, NULL};
  http_res r;
  http_call(&S, "POST", path, h, b, len, &r);
  cr_assert_eq(r.status, 200, "%s: %ld %.300s", what, r.status, r.body);
  float *o = reply_o(&r, st, nq, s->dv, what);
  expect_reference(s, q0, nq, pos + n, o, what);
  free(o), free(b);
  http_res_free(&r);
  tensors_free(t, nt);
}

/* A prefill of p tokens then one token a step to s->n, the codecs taking
 * turns, and an attend-only call at the end. */
static void decode(const char *id, const stream *s, int64_t p) {
  char what[96];
  snprintf(what, sizeof what, "%s prefill", id);
  step(id, s, 0, p, false, what);
  for (int64_t pos = p; pos < s->n; pos++) {
    snprintf(what, sizeof what, "%s step %lld", id, (long long)pos);
    step(id, s, pos, 1, pos % 2, what);
  }
  snprintf(what, sizeof what, "%s attend only", id);
  step(id, s, s->n, 0, false, what);
}

/* GET id's body (malloc'd). */
static char *info(const char *id) {
  char path[200];
  snprintf(path, sizeof path, "/v1/sessions/%s", id);
  http_res r;
  http_get(&S, path, &r);
  cr_assert_eq(r.status, 200, "GET %s: %ld %.200s", path, r.status, r.body);
  char *b = strdup(r.body);
  http_res_free(&r);
  return b;
}

Test(session_dv, its_own_value_head_dim_prefill_and_decode) {
  srv_start(&S, "--session-memory", "64M", NULL);
  /* DeepSeek's prefill shape (D 192, Dv 128), and Dv above D */
  static const int64_t dims[2][2] = {{192, 128}, {32, 64}};
  for (int i = 0; i < 2; i++) {
    stream s;
    stream_init(&s, 4, 2, 24, dims[i][0], dims[i][1], false, 11 + (uint64_t)i);
    char id[16];
    snprintf(id, sizeof id, "dv-%d", i);
    create(id, &s, 64);
    char *b = info(id);
    char want[64];
    snprintf(want, sizeof want, "\"head_dim_v\": %lld", (long long)dims[i][1]);
    cr_expect(strstr(b, want) && !strstr(b, "v_from_k"), "%s", b);
    free(b);
    decode(id, &s, 16);
    stream_free(&s);
  }
}

Test(session_dv, a_latent_session_stores_k_and_reads_v_from_it) {
  srv_start(&S, "--session-memory", "64M", NULL);
  /* MLA's absorbed decode: many query heads over one latent head */
  stream s;
  stream_init(&s, 8, 1, 24, 80, 64, true, 21);
  create("mla", &s, 64);
  char *b = info("mla");
  cr_expect(strstr(b, "\"head_dim_v\": 64, \"v_from_k\": 64"), "%s", b);
  free(b);
  decode("mla", &s, 16);
  /* the same but not latent: K and V both of D, twice the reservation */
  stream_free(&s);
  const char *full = "{\"heads_kv\": 1, \"head_dim\": 80, \"dtype\": \"F32\", \"max_tokens\": 64}";
  http_res r;
  cr_assert_eq(put_json("/v1/sessions/full", full, &r), 201, "%s", r.body);
  http_res_free(&r);
  char *lat = info("mla"), *two = info("full");
  cJSON *a = cJSON_Parse(lat), *c = cJSON_Parse(two);
  double ra = cJSON_GetObjectItem(a, "reserved_bytes")->valuedouble;
  double rc = cJSON_GetObjectItem(c, "reserved_bytes")->valuedouble;
  cr_expect(ra > 0 && 2 * ra == rc, "a latent session reserves K alone: %g, not half of %g", ra,
            rc);
  cJSON_Delete(a), cJSON_Delete(c), free(lat), free(two);
}

/* A _batch body of one new token of each stream at its pos, JSON. */
static char *batch_of(const stream *s, int n, const int64_t *pos, const char *ids, size_t *len) {
  const stream *s0 = &s[0];
  tens t[3] = {{"q", s0->hq, n, s0->d, NULL},
               {"k", s0->hkv, n, s0->d, NULL},
               {"v", s0->hkv, n, s0->dv, NULL}};
  int nt = s0->latent ? 2 : 3;
  for (int i = 0; i < nt; i++)
    t[i].data = malloc((size_t)(t[i].h * n * t[i].w) * sizeof(float));
  for (int e = 0; e < n; e++) {
    const float *src[3] = {s[e].q, s[e].k, s[e].v};
    for (int i = 0; i < nt; i++)
      for (int64_t h = 0; h < t[i].h; h++)
        memcpy(t[i].data + (h * n + e) * t[i].w, src[i] + (h * s[e].n + pos[e]) * t[i].w,
               (size_t)t[i].w * sizeof(float));
  }
  char extra[256];
  int at = snprintf(extra, sizeof extra, ", \"sessions\": %s, \"pos\": [", ids);
  for (int e = 0; e < n; e++)
    at +=
        snprintf(extra + at, sizeof extra - (size_t)at, "%s%lld", e ? ", " : "", (long long)pos[e]);
  at += snprintf(extra + at, sizeof extra - (size_t)at, "], \"cu_seqlens_q\": [");
  for (int e = 0; e <= n; e++)
    at += snprintf(extra + at, sizeof extra - (size_t)at, "%s%d", e ? ", " : "", e);
  snprintf(extra + at, sizeof extra - (size_t)at, "], \"cu_seqlens_kv\": [0, 1, 2]");
  char *b = json_of(t, nt, extra, len);
  tensors_free(t, nt);
  return b;
}

/* Two sessions of a kind (latent or not) prefilled, then one token of
 * each through _batch, each entry's o checked. */
static void batch_case(bool latent, int64_t d, int64_t dv, uint64_t seed) {
  stream s[2];
  const char *names[2][2] = {{"b-0", "b-1"}, {"l-0", "l-1"}};
  const int64_t pos[2] = {12, 9};
  for (int e = 0; e < 2; e++) {
    stream_init(&s[e], 4, latent ? 1 : 2, 16, d, dv, latent, seed + (uint64_t)e);
    create(names[latent][e], &s[e], 32);
    step(names[latent][e], &s[e], 0, pos[e], e, "a batch's prefill");
  }
  char ids[64];
  snprintf(ids, sizeof ids, "[\"%s\", \"%s\"]", names[latent][0], names[latent][1]);
  size_t len;
  char *b = batch_of(s, 2, pos, ids, &len);
  const char *h[] = {JSON_CT, NULL};
  http_res r;
  http_call(&S, "POST", "/v1/sessions/_batch", h, b, len, &r);
  cr_assert_eq(r.status, 200, "%.300s", r.body);
  cr_expect(strstr(r.body, "\"lengths\": [13, 10]"), "%.300s", r.body);
  float *o = reply_o(&r, false, 2, dv, "batch");
  for (int e = 0; e < 2; e++) {
    float *oe = malloc((size_t)(4 * dv) * sizeof(float));
    for (int64_t hh = 0; hh < 4; hh++)
      memcpy(oe + hh * dv, o + (hh * 2 + e) * dv, (size_t)dv * sizeof(float));
    expect_reference(&s[e], pos[e], 1, pos[e] + 1, oe, names[latent][e]);
    free(oe);
  }
  free(o), free(b);
  http_res_free(&r);
  stream_free(&s[0]), stream_free(&s[1]);
}

Test(session_dv, batch_calls_of_both_kinds) {
  srv_start(&S, "--session-memory", "64M", NULL);
  batch_case(false, 48, 24, 31);
  batch_case(true, 40, 32, 41);
}

/* body to path: a 422 of code whose message holds each of the words. */
static void expect_refused(const char *method, const char *path, const char *ctype,
                           const char *body, size_t len, const char *code,
                           const char *const *words) {
  const char *h[] = {ctype, NULL};
  http_res r;
  http_call(&S, method, path, h, body, len, &r);
  expect_error(&r, 422, code, path);
  for (int i = 0; words[i]; i++)
    cr_expect(r.body && strstr(r.body, words[i]), "%s: no \"%s\" in %.300s", path, words[i],
              r.body);
  http_res_free(&r);
}

Test(session_dv, refusals) {
  srv_start(&S, "--session-memory", "16M", NULL);
  stream lat, dv;
  stream_init(&lat, 2, 1, 4, 16, 8, true, 51);
  stream_init(&dv, 2, 1, 4, 16, 8, false, 52);
  create("lat", &lat, 8);
  create("dv", &dv, 8);
  /* v to a latent session: JSON field and safetensors tensor, and _batch */
  tens t[3];
  lat.latent = false; /* so that tensors_of writes a v */
  int nt = tensors_of(&lat, 0, 1, 0, 1, true, t);
  size_t len;
  char *b = json_of(t, nt, ", \"pos\": 0", &len);
  expect_refused("POST", "/v1/sessions/lat/attention", JSON_CT, b, len, "unknown_tensor",
                 (const char *[]){"latent session", "takes q and k only", NULL});
  free(b);
  b = st_of(t, nt, "{\"pos\": \"0\"}", &len);
  expect_refused("POST", "/v1/sessions/lat/attention", ST_CT, b, len, "unknown_tensor",
                 (const char *[]){"latent session", "takes q and k only", NULL});
  free(b);
  int64_t pos[2] = {0, 0};
  stream two[2] = {lat, lat};
  b = batch_of(two, 2, pos, "[\"lat\", \"lat\"]", &len);
  expect_refused("POST", "/v1/sessions/_batch", JSON_CT, b, len, "unknown_tensor",
                 (const char *[]){"takes q and k only", NULL});
  free(b);
  tensors_free(t, nt);
  /* v of D, not the session's Dv 8; and a missing v where it is stored */
  dv.dv = 16, dv.v = realloc(dv.v, 4 * 16 * sizeof(float));
  memcpy(dv.v, dv.k, 4 * 16 * sizeof(float));
  nt = tensors_of(&dv, 0, 1, 0, 1, true, t);
  b = json_of(t, nt, ", \"pos\": 0", &len);
  expect_refused("POST", "/v1/sessions/dv/attention", JSON_CT, b, len, "shape_mismatch",
                 (const char *[]){"\\\"v\\\" ends in 16", "8 wide", NULL});
  free(b);
  b = json_of(t, 2, ", \"pos\": 0", &len);
  expect_refused("POST", "/v1/sessions/dv/attention", JSON_CT, b, len, "missing_tensor",
                 (const char *[]){"\\\"v\\\" is missing", NULL});
  free(b);
  tensors_free(t, nt);
  /* a batch of a latent session and one that stores v: one shape a call */
  stream mixed[2] = {lat, lat};
  mixed[0].latent = true;
  b = batch_of(mixed, 2, pos, "[\"lat\", \"dv\"]", &len);
  const char *h[] = {JSON_CT, NULL};
  http_res r;
  http_call(&S, "POST", "/v1/sessions/_batch", h, b, len, &r);
  cr_expect_eq(r.status, 422, "%.300s", r.body);
  cr_expect(r.body && strstr(r.body, "sessions[1]"), "%.300s", r.body);
  http_res_free(&r);
  free(b);
  /* nothing was appended by any of them */
  char *i = info("lat");
  cr_expect(strstr(i, "\"lengths\": [0]"), "%s", i);
  free(i);
  i = info("dv");
  cr_expect(strstr(i, "\"lengths\": [0]"), "%s", i);
  free(i);
  /* creates */
  const char *past = "{\"heads_kv\": 1, \"head_dim\": 16, \"v_from_k\": 17, \"dtype\": \"F32\", "
                     "\"max_tokens\": 8}";
  expect_refused("PUT", "/v1/sessions/x", JSON_CT, past, strlen(past), "invalid_option",
                 (const char *[]){"v_from_k", "17", "head_dim", NULL});
  const char *wide = "{\"heads_kv\": 1, \"head_dim\": 16, \"head_dim_v\": 513, \"dtype\": \"F32\", "
                     "\"max_tokens\": 8}";
  expect_refused("PUT", "/v1/sessions/x", JSON_CT, wide, strlen(wide), "invalid_option",
                 (const char *[]){"head_dim_v", "512", NULL});
  const char *both = "{\"heads_kv\": 1, \"head_dim\": 16, \"head_dim_v\": 4, \"v_from_k\": 8, "
                     "\"dtype\": \"F32\", \"max_tokens\": 8}";
  expect_refused("PUT", "/v1/sessions/x", JSON_CT, both, strlen(both), "invalid_option",
                 (const char *[]){"head_dim_v", "v_from_k", NULL});
  lat.latent = true;
  stream_free(&lat), stream_free(&dv);
}
