/*
 * test_attention.c — POST /attention over HTTP against the float64
 * reference: both codecs, every dtype, ranks 2 to 4, GQA/MQA, cross
 * attention, options from each source and their precedence, statistics
 * (including rows with no visible key), Accept negotiation, chunked bodies.
 */
#include "harness.h"

#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static srv S;
static void teardown(void) { srv_cleanup(&S); }
TestSuite(attention, .fini = teardown, .timeout = 60);

#define JSON_CT "application/json"
#define ST_CT "application/octet-stream"

/* Posts c as JSON (extra fields appended) or safetensors (metadata) to path,
 * and checks the reply of the expected codec. */
static bool post_json(tcase *c, int rank, const char *path, const char *extra, const char *what) {
  size_t len;
  char *b = json_body(c, rank, extra, &len);
  http_res r;
  http_post(&S, path, JSON_CT, b, len, &r);
  char w[512];
  snprintf(w, sizeof w, "%s (JSON, rank %d, %s%s)", what, rank, path, extra ? extra : "");
  bool ok = expect_correct(&r, c, rank, false, w);
  http_res_free(&r);
  free(b);
  return ok;
}

static bool post_st(tcase *c, int rank, const char *path, const char *meta, const char *what) {
  size_t len;
  char *b = st_body(c, rank, meta, &len);
  http_res r;
  http_post(&S, path, ST_CT, b, len, &r);
  char w[512];
  snprintf(w, sizeof w, "%s (safetensors, rank %d, %s, metadata %s)", what, rank, path,
           meta ? meta : "none");
  bool ok = expect_correct(&r, c, rank, true, w);
  http_res_free(&r);
  free(b);
  return ok;
}

static tprob shape_for_rank(int rank, attn_dtype dt) {
  switch (rank) {
  case 2: return tprob_make(1, 1, 1, 33, 47, 64, dt);
  case 3: return tprob_make(1, 4, 2, 17, 29, 32, dt);
  default: return tprob_make(2, 4, 2, 19, 23, 48, dt);
  }
}

Test(attention, json_every_dtype_and_rank) {
  srv_start(&S, NULL);
  attn_dtype dts[] = {ATTN_F32, ATTN_F16, ATTN_BF16};
  for (int d = 0; d < 3; d++)
    for (int rank = 2; rank <= 4; rank++) {
      tprob p = shape_for_rank(rank, dts[d]);
      p.stats = true;
      tcase c;
      tcase_init(&c, &p, (uint64_t)(100 + d * 10 + rank));
      post_json(&c, rank, "/attention", ",\"stats\":true", "dtypes/ranks");
      tcase_free(&c);
    }
}

Test(attention, safetensors_every_dtype_and_rank) {
  srv_start(&S, NULL);
  attn_dtype dts[] = {ATTN_F32, ATTN_F16, ATTN_BF16};
  for (int d = 0; d < 3; d++)
    for (int rank = 2; rank <= 4; rank++) {
      tprob p = shape_for_rank(rank, dts[d]);
      p.stats = rank != 3; /* with and without statistics */
      tcase c;
      tcase_init(&c, &p, (uint64_t)(200 + d * 10 + rank));
      post_st(&c, rank, p.stats ? "/attention?stats=true" : "/attention", NULL, "dtypes/ranks");
      tcase_free(&c);
    }
}

Test(attention, gqa_mqa_cross_and_head_dims) {
  srv_start(&S, NULL);
  tprob ps[] = {
      tprob_make(1, 8, 2, 40, 40, 64, ATTN_F32),   /* GQA */
      tprob_make(2, 6, 1, 16, 100, 128, ATTN_F16), /* MQA, cross */
      tprob_make(1, 4, 4, 100, 7, 37, ATTN_BF16),  /* Nq > Nkv */
      tprob_make(1, 2, 1, 1, 1, 1, ATTN_F32),      /* N = 1, D = 1 */
      tprob_make(1, 2, 2, 5, 9, 256, ATTN_F32),    /* D = 256 */
      tprob_make(1, 3, 3, 1, 300, 80, ATTN_F16),   /* one query (decoding) */
  };
  for (size_t i = 0; i < sizeof ps / sizeof *ps; i++) {
    ps[i].stats = true;
    tcase c;
    tcase_init(&c, &ps[i], 300 + i);
    post_st(&c, 4, "/attention?stats=1", NULL, "gqa/cross");
    if (i % 2 == 0)
      post_json(&c, 4, "/attention?stats", NULL, "gqa/cross");
    tcase_free(&c);
  }
}

Test(attention, options_from_every_source) {
  srv_start(&S, NULL);
  tprob p = tprob_make(1, 2, 1, 24, 40, 32, ATTN_F32);
  p.stats = true;
  tcase c;
  /* causal from the query, the JSON body and __metadata__ */
  p.causal = true;
  tcase_init(&c, &p, 401);
  post_json(&c, 4, "/attention?causal=true&stats=true", NULL, "causal in the query");
  post_json(&c, 4, "/attention", ",\"causal\":true,\"stats\":true", "causal in the JSON body");
  post_json(&c, 4, "/attention?%63ausal=%74rue&stats", NULL, "percent-encoded query");
  post_st(&c, 4, "/attention?causal=1&stats=1", NULL, "causal in the query");
  post_st(&c, 4, "/attention", "{\"causal\":\"true\",\"stats\":\"true\"}",
          "causal in __metadata__");
  post_st(&c, 4, "/attention?stats=true", "{\"format\":\"pt\",\"causal\":\"1\"}",
          "causal in __metadata__ next to format");
  tcase_free(&c);
  /* a sliding window */
  p.causal = false;
  p.wl = 5;
  p.wr = 2;
  tcase_init(&c, &p, 402);
  post_json(&c, 4, "/attention?window_left=5&window_right=2&stats=true", NULL,
            "window in the query");
  post_json(&c, 4, "/attention", ",\"window_left\":5,\"window_right\":2,\"stats\":true",
            "window in the JSON body");
  post_st(&c, 4, "/attention?stats=true", "{\"window_left\":\"5\",\"window_right\":\"2\"}",
          "window in __metadata__");
  tcase_free(&c);
  /* causal with a left window */
  p.causal = true;
  p.wl = 3;
  p.wr = -1;
  tcase_init(&c, &p, 403);
  post_json(&c, 4, "/attention", ",\"causal\":true,\"window_left\":3,\"stats\":true",
            "causal + window_left");
  tcase_free(&c);
  /* scale */
  p = tprob_make(1, 2, 2, 16, 16, 64, ATTN_F32);
  p.scale = 0.05;
  p.stats = true;
  tcase_init(&c, &p, 404);
  post_json(&c, 4, "/attention?scale=0.05&stats=true", NULL, "scale in the query");
  post_json(&c, 4, "/attention?stats=true", ",\"scale\":0.05", "scale in the JSON body");
  post_st(&c, 4, "/attention?stats=true", "{\"scale\":\"0.05\"}", "scale in __metadata__");
  post_st(&c, 4, "/attention?stats=true&scale=5e-2", NULL, "scale 5e-2 in the query");
  tcase_free(&c);
  p.scale = 0;
  tcase_init(&c, &p, 405);
  post_json(&c, 4, "/attention?stats=true", ",\"scale\":0", "scale 0 (uniform softmax)");
  tcase_free(&c);
}

/* The reply to c's request with options that differ from c's must NOT match
 * c's reference: the option did take effect. */
static void expect_differs(tcase *c, const char *path, const char *extra, const char *what) {
  size_t len;
  char *b = json_body(c, 4, extra, &len);
  http_res r;
  http_post(&S, path, JSON_CT, b, len, &r);
  char err[1024];
  const char *m = check_correct(&r, c, 4, false, err, sizeof err);
  cr_expect(r.status == 200 && m && strstr(m, "O error"),
            "%s: the reply matches the reference of other options (status %ld)", what, r.status);
  http_res_free(&r);
  free(b);
}

Test(attention, body_options_win_over_the_query) {
  srv_start(&S, NULL);
  tprob p = tprob_make(1, 2, 2, 32, 32, 32, ATTN_F32);
  tcase c;
  /* query causal=true, body causal=false: not causal */
  tcase_init(&c, &p, 501);
  post_json(&c, 4, "/attention?causal=true", ",\"causal\":false", "JSON body wins");
  post_st(&c, 4, "/attention?causal=true", "{\"causal\":\"false\"}", "__metadata__ wins");
  expect_differs(&c, "/attention?causal=true", NULL, "query causal alone");
  tcase_free(&c);
  /* query causal=false, body causal=true: causal */
  p.causal = true;
  tcase_init(&c, &p, 502);
  post_json(&c, 4, "/attention?causal=false", ",\"causal\":true", "JSON body wins");
  post_st(&c, 4, "/attention?causal=0", "{\"causal\":\"true\"}", "__metadata__ wins");
  tcase_free(&c);
  /* scale: body 0.5 over query 0.01; an option the body does not set stays */
  p.causal = true;
  p.scale = 0.5;
  p.stats = true;
  tcase_init(&c, &p, 503);
  post_json(&c, 4, "/attention?scale=0.01&causal=true&stats=true", ",\"scale\":0.5",
            "JSON scale wins, query causal and stats stay");
  post_st(&c, 4, "/attention?scale=0.01&causal=true", "{\"scale\":\"0.5\",\"stats\":\"true\"}",
          "__metadata__ scale wins, query causal stays");
  tcase_free(&c);
}

static int count_nulls(const cJSON *j, const char *name) {
  const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, name);
  const cJSON *d = cJSON_GetObjectItemCaseSensitive(t, "data");
  int n = 0;
  const cJSON *e;
  cJSON_ArrayForEach(e, d) n += cJSON_IsNull(e);
  return n;
}

Test(attention, rows_without_visible_keys) {
  srv_start(&S, NULL);
  /* Nq = 10 > Nkv = 4 with causal: off = -6, query rows 0..5 see nothing. */
  tprob p = tprob_make(1, 2, 1, 10, 4, 16, ATTN_F32);
  p.causal = true;
  p.stats = true;
  tcase c;
  tcase_init(&c, &p, 601);
  size_t len;
  char *b = json_body(&c, 4, ",\"causal\":true,\"stats\":true", &len);
  http_res r;
  http_post(&S, "/attention", JSON_CT, b, len, &r);
  expect_correct(&r, &c, 4, false, "masked rows, JSON");
  cJSON *j = cJSON_ParseWithLength(r.body, r.len);
  cr_expect_eq(count_nulls(j, "m"), 12, "m: %d nulls, want 12 (2 heads x 6 rows)",
               count_nulls(j, "m"));
  cr_expect_eq(count_nulls(j, "lse"), 12, "lse: %d nulls, want 12", count_nulls(j, "lse"));
  cr_expect_eq(count_nulls(j, "l"), 0, "l of a masked row is 0, not null");
  cr_expect_eq(count_nulls(j, "o"), 0, "o of a masked row is 0, not null");
  cJSON_Delete(j);
  http_res_free(&r);
  free(b);
  post_st(&c, 4, "/attention?causal=true&stats=true", NULL, "masked rows, safetensors");
  for (int i = 0; i < 6; i++)
    cr_expect(isinf(c.m[i]) && c.m[i] < 0 && c.l[i] == 0 && isinf(c.lse[i]),
              "row %d: m %g l %g lse %g, want -inf 0 -inf", i, c.m[i], c.l[i], c.lse[i]);
  tcase_free(&c);
  /* A zero-width window: window_left = window_right = 0 sees exactly one key. */
  p = tprob_make(1, 1, 1, 8, 8, 16, ATTN_BF16);
  p.wl = 0;
  p.wr = 0;
  p.stats = true;
  tcase_init(&c, &p, 602);
  post_json(&c, 3, "/attention?window_left=0&window_right=0&stats=true", NULL, "window 0,0");
  tcase_free(&c);
}

Test(attention, accept_negotiation) {
  srv_start(&S, NULL);
  tprob p = tprob_make(1, 2, 2, 12, 12, 16, ATTN_F16);
  p.stats = true;
  tcase c;
  tcase_init(&c, &p, 701);
  size_t jl, sl;
  char *jb = json_body(&c, 4, ",\"stats\":true", &jl);
  char *sb = st_body(&c, 4, "{\"stats\":\"true\"}", &sl);
  struct {
    const char *ctype, *accept;
    bool st_body, st_reply;
  } k[] = {
      {JSON_CT, NULL, false, false},
      {JSON_CT, "Accept: application/json", false, false},
      {JSON_CT, "Accept: */*", false, false},
      {JSON_CT, "Accept: application/octet-stream", false, true},
      {ST_CT, NULL, true, true},
      {ST_CT, "Accept: application/octet-stream", true, true},
      {ST_CT, "Accept: */*", true, true},
      {ST_CT, "Accept: application/json", true, true},
  };
  for (size_t i = 0; i < sizeof k / sizeof *k; i++) {
    char ct[128];
    snprintf(ct, sizeof ct, "Content-Type: %s", k[i].ctype);
    const char *hdrs[] = {ct, k[i].accept ? k[i].accept : "Accept:", NULL};
    http_req rq = {.method = "POST",
                   .path = "/attention",
                   .headers = hdrs,
                   .body = k[i].st_body ? sb : jb,
                   .len = k[i].st_body ? sl : jl};
    http_res r;
    http_do(&S, &rq, &r);
    char what[256];
    snprintf(what, sizeof what, "%s request, %s", k[i].ctype,
             k[i].accept ? k[i].accept : "no Accept");
    expect_correct(&r, &c, 4, k[i].st_reply, what);
    http_res_free(&r);
  }
  free(jb);
  free(sb);
  tcase_free(&c);
}

Test(attention, content_type_parameters_and_case) {
  srv_start(&S, NULL);
  tprob p = tprob_make(1, 1, 1, 8, 8, 8, ATTN_F32);
  tcase c;
  tcase_init(&c, &p, 801);
  size_t jl, sl;
  char *jb = json_body(&c, 2, NULL, &jl);
  char *sb = st_body(&c, 2, NULL, &sl);
  const char *jcts[] = {"application/json; charset=utf-8", "application/json;charset=UTF-8",
                        "Application/JSON"};
  for (size_t i = 0; i < 3; i++) {
    http_res r;
    http_post(&S, "/attention", jcts[i], jb, jl, &r);
    char what[128];
    snprintf(what, sizeof what, "Content-Type: %s", jcts[i]);
    expect_correct(&r, &c, 2, false, what);
    http_res_free(&r);
  }
  const char *scts[] = {"application/octet-stream; foo=bar", "APPLICATION/OCTET-STREAM"};
  for (size_t i = 0; i < 2; i++) {
    http_res r;
    http_post(&S, "/attention", scts[i], sb, sl, &r);
    char what[128];
    snprintf(what, sizeof what, "Content-Type: %s", scts[i]);
    expect_correct(&r, &c, 2, true, what);
    http_res_free(&r);
  }
  free(jb);
  free(sb);
  tcase_free(&c);
}

Test(attention, nested_array_tensors) {
  srv_start(&S, NULL);
  for (int rank = 2; rank <= 4; rank++) {
    tprob p = shape_for_rank(rank, ATTN_F32);
    p.stats = true;
    tcase c;
    tcase_init(&c, &p, 900 + (uint64_t)rank);
    size_t len;
    char *b = json_nested_body(&c, rank, ",\"stats\":true", &len);
    http_res r;
    http_post(&S, "/attention", JSON_CT, b, len, &r);
    char what[64];
    snprintf(what, sizeof what, "nested arrays, rank %d", rank);
    expect_correct(&r, &c, rank, false, what);
    http_res_free(&r);
    free(b);
    tcase_free(&c);
  }
  /* The README's curl example. */
  const char *ex = "{\"q\": [[1, 0], [0, 1]], \"k\": [[1, 0], [0, 1], [1, 1]], "
                   "\"v\": [[1, 2], [3, 4], [5, 6]]}";
  http_res r;
  http_post(&S, "/attention?stats=true", JSON_CT, ex, strlen(ex), &r);
  cr_expect_eq(r.status, 200, "README example: %ld %s", r.status, r.body);
  cJSON *j = cJSON_ParseWithLength(r.body, r.len);
  cJSON *o = cJSON_GetObjectItemCaseSensitive(j, "o");
  cJSON *d = cJSON_GetObjectItemCaseSensitive(o, "data");
  cr_expect(cJSON_IsArray(d) && cJSON_GetArraySize(d) == 4, "README example: o.data");
  /* row 0: scores (1, 0, 1)/sqrt(2) */
  double e1 = exp(1 / sqrt(2.0)), w = 2 * e1 + 1;
  double want0 = (1 * e1 + 3 + 5 * e1) / w;
  if (cJSON_IsArray(d) && cJSON_GetArraySize(d) == 4)
    cr_expect(fabs(cJSON_GetArrayItem(d, 0)->valuedouble - want0) < 1e-5,
              "README example o[0][0] = %g, want %g", cJSON_GetArrayItem(d, 0)->valuedouble, want0);
  cJSON_Delete(j);
  http_res_free(&r);
}

static const char *reply_backend(const http_res *r, char *b, size_t cap) {
  cJSON *j = cJSON_ParseWithLength(r->body, r->len);
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "backend");
  snprintf(b, cap, "%s", cJSON_IsString(v) ? v->valuestring : "(none)");
  cJSON_Delete(j);
  return b;
}

Test(attention, backend_option) {
  srv_start(&S, NULL);
  tprob p = tprob_make(1, 2, 2, 20, 20, 16, ATTN_F32);
  p.stats = true;
  tcase c;
  tcase_init(&c, &p, 1001);
  const char *be[] = {"reference", "cpu", "auto"};
  for (int i = 0; i < 3; i++) {
    char extra[64], b[64];
    snprintf(extra, sizeof extra, ",\"backend\":\"%s\",\"stats\":true", be[i]);
    size_t len;
    char *body = json_body(&c, 4, extra, &len);
    http_res r;
    http_post(&S, "/attention", JSON_CT, body, len, &r);
    expect_correct(&r, &c, 4, false, be[i]);
    reply_backend(&r, b, sizeof b);
    if (i < 2)
      cr_expect_str_eq(b, be[i], "backend=%s: reply says backend \"%s\"", be[i], b);
    else
      cr_expect(!strcmp(b, "cpu") || !strcmp(b, "cuda"), "backend=auto ran on \"%s\"", b);
    http_res_free(&r);
    free(body);
  }
  tcase_free(&c);
}

Test(attention, cuda_backend_when_unavailable) {
  srv_start(&S, NULL);
  http_res r;
  http_get(&S, "/v1/info", &r);
  cJSON *j = cJSON_ParseWithLength(r.body, r.len);
  bool cuda = false;
  const cJSON *b;
  cJSON_ArrayForEach(b, cJSON_GetObjectItemCaseSensitive(j, "backends")) {
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(b, "name");
    if (cJSON_IsString(n) && !strcmp(n->valuestring, "cuda") &&
        cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(b, "available")))
      cuda = true;
  }
  cJSON_Delete(j);
  http_res_free(&r);
  tprob p = tprob_make(1, 2, 2, 20, 20, 64, ATTN_F16);
  tcase c;
  tcase_init(&c, &p, 1101);
  size_t len;
  char *body = st_body(&c, 4, "{\"backend\":\"cuda\"}", &len);
  http_post(&S, "/attention", ST_CT, body, len, &r);
  if (cuda)
    expect_correct(&r, &c, 4, true, "backend=cuda on a CUDA server");
  else
    expect_error(&r, 503, "backend_unavailable", "backend=cuda without CUDA");
  http_res_free(&r);
  free(body);
  tcase_free(&c);
}

Test(attention, chunked_request_body) {
  srv_start(&S, NULL);
  tprob p = tprob_make(1, 4, 2, 200, 300, 64, ATTN_BF16);
  p.stats = true;
  tcase c;
  tcase_init(&c, &p, 1201);
  size_t len;
  char *b = st_body(&c, 4, "{\"stats\":\"true\"}", &len);
  const char *hdrs[] = {"Content-Type: application/octet-stream", NULL};
  http_req rq = {.method = "POST",
                 .path = "/attention",
                 .headers = hdrs,
                 .body = b,
                 .len = len,
                 .chunked = true};
  http_res r;
  http_do(&S, &rq, &r);
  expect_correct(&r, &c, 4, true, "chunked safetensors");
  http_res_free(&r);
  free(b);
  b = json_body(&c, 4, ",\"stats\":true", &len);
  const char *jh[] = {"Content-Type: application/json", NULL};
  http_req rj = {.method = "POST",
                 .path = "/attention",
                 .headers = jh,
                 .body = b,
                 .len = len,
                 .chunked = true};
  http_do(&S, &rj, &r);
  expect_correct(&r, &c, 4, false, "chunked JSON");
  http_res_free(&r);
  free(b);
  tcase_free(&c);
}

Test(attention, large_body) {
  srv_start(&S, NULL);
  /* 48 MiB of K and V, little compute: Nq = 8, Nkv = 98304, D = 64. The
   * second body, of other values, is read into the first one's buffer,
   * kept warm (server/bodybuf.c): nothing of the first may show through. */
  tprob p = tprob_make(1, 1, 1, 8, 98304, 64, ATTN_F32);
  for (int i = 0; i < 2; i++) {
    tcase c;
    tcase_init(&c, &p, 1301 + (uint64_t)i);
    size_t len;
    char *b = st_body(&c, 2, NULL, &len);
    http_res r;
    http_post(&S, "/attention", ST_CT, b, len, &r);
    expect_correct(&r, &c, 2, true, i ? "48 MiB body into a reused buffer" : "48 MiB body");
    http_res_free(&r);
    free(b);
    tcase_free(&c);
  }
}

Test(attention, keep_alive_reuse) {
  srv_start(&S, NULL);
  void *h = http_handle();
  tprob p = tprob_make(1, 2, 2, 16, 16, 16, ATTN_F32);
  for (int i = 0; i < 20; i++) {
    tcase c;
    tcase_init(&c, &p, 1400 + (uint64_t)i);
    size_t len;
    char *b = (i % 2) ? st_body(&c, 4, NULL, &len) : json_body(&c, 4, NULL, &len);
    char ct[64];
    snprintf(ct, sizeof ct, "Content-Type: %s", (i % 2) ? ST_CT : JSON_CT);
    const char *hdrs[] = {ct, NULL};
    http_req rq = {.method = "POST", .path = "/attention", .headers = hdrs, .body = b, .len = len};
    http_res r;
    http_do_h(h, &S, &rq, &r);
    expect_correct(&r, &c, 4, i % 2, "keep-alive");
    http_res_free(&r);
    /* errors keep the connection usable too */
    http_req bad = {
        .method = "POST", .path = "/attention?causal=2", .headers = hdrs, .body = b, .len = len};
    http_do_h(h, &S, &bad, &r);
    expect_error(&r, 422, "invalid_option", "keep-alive causal=2");
    http_res_free(&r);
    free(b);
    tcase_free(&c);
  }
  http_handle_free(h);
}
