/*
 * test_sinks.c — sinks (F32 [Hq]) over HTTP: forward replies from JSON,
 * safetensors and /v2 equal to the float64 reference with the same sinks;
 * a backward reply's dq, dk, dv and dsinks equal to attn_reference_backward
 * and attn_reference_dsinks; a session call and a _batch entry with sinks
 * equal to the stateless request with them; and each bad sinks tensor
 * refused with 422, the error table's code and a message naming sinks.
 * Each computation runs on the default backend (the cpu's kernels) and on
 * the reference backend.
 */
#include "harness.h"
#include "proto.h"

#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static srv S;
static void teardown(void) { srv_cleanup(&S); }
TestSuite(sinks, .fini = teardown, .timeout = 120);

#define JSON_CT "application/json"
#define ST_CT "application/octet-stream"

/* Per head: above, below and near the rows' own logits, so that the sink
 * takes a visible share of every softmax. */
static const float SINKS[8] = {0.5f, -1.0f, 2.0f, 0.25f, 3.0f, -0.5f, 1.5f, 0.0f};
static const char *const BACKENDS[2] = {"auto", "reference"};

/* ",\"sinks\":[...]" of the first hq sinks at s. */
static void sinks_json(const float *s, int64_t hq, char *buf, size_t cap) {
  size_t o = (size_t)snprintf(buf, cap, ",\"sinks\":[");
  for (int64_t h = 0; h < hq && o < cap; h++)
    o += (size_t)snprintf(buf + o, cap - o, "%s%.9g", h ? "," : "", (double)s[h]);
  if (o < cap)
    snprintf(buf + o, cap - o, "]");
}

/* A case with sinks: nq <= nkv, so every row sees a key (bottom-right). */
static void sink_case(tcase *c, attn_dtype dt, uint64_t seed) {
  tprob p = tprob_make(2, 4, 2, 19, 41, 32, dt);
  p.causal = true;
  p.stats = true;
  tcase_init(c, &p, seed);
  c->req.sinks = SINKS;
}

static void backend_opt(attn_options *o, const char *backend) {
  attn_options_init(o);
  snprintf(o->backend, sizeof o->backend, "%s", backend);
  o->set |= ATTN_OPT_BACKEND;
  o->causal = true;
  o->set |= ATTN_OPT_CAUSAL;
}

Test(sinks, json_forward_matches_the_reference) {
  srv_start(&S, NULL);
  const attn_dtype dts[2] = {ATTN_F32, ATTN_BF16};
  for (int b = 0; b < 2; b++)
    for (int t = 0; t < 2; t++) {
      tcase c;
      sink_case(&c, dts[t], 7 + (uint64_t)t);
      char extra[512], what[96];
      sinks_json(SINKS, c.p.hq, extra, sizeof extra);
      size_t n = strlen(extra);
      snprintf(extra + n, sizeof extra - n, ",\"causal\":true,\"stats\":true,\"backend\":\"%s\"",
               BACKENDS[b]);
      size_t len;
      char *body = json_body(&c, 4, extra, &len);
      http_res r;
      http_post(&S, "/attention", JSON_CT, body, len, &r);
      snprintf(what, sizeof what, "JSON, %s, backend %s", attn_dtype_name(dts[t]), BACKENDS[b]);
      expect_correct(&r, &c, 4, false, what);
      http_res_free(&r);
      free(body);
      tcase_free(&c);
    }
}

Test(sinks, safetensors_forward_matches_the_reference) {
  srv_start(&S, NULL);
  for (int b = 0; b < 2; b++) {
    tcase c;
    sink_case(&c, ATTN_F16, 21);
    attn_options o;
    backend_opt(&o, BACKENDS[b]);
    o.stats = true;
    o.set |= ATTN_OPT_STATS;
    void *buf;
    size_t len;
    attn_status st;
    cr_assert_eq(attn_proto_encode_request_safetensors(&c.req, &o, &buf, &len, &st), 0, "%s",
                 st.message);
    http_res r;
    http_post(&S, "/attention", ST_CT, buf, len, &r);
    char what[64];
    snprintf(what, sizeof what, "safetensors, backend %s", BACKENDS[b]);
    expect_correct(&r, &c, 4, true, what);
    http_res_free(&r);
    free(buf);
    tcase_free(&c);
  }
}

/* ||x - ref|| / ||ref|| (absolute when ref is 0); a NaN counts as infinite. */
static double norm_err(const double *x, const double *ref, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    if (isnan(x[i]))
      return INFINITY;
    num += (x[i] - ref[i]) * (x[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* n elements of dtype dt at p as doubles, into a new array. */
static double *widen(const void *p, attn_dtype dt, size_t n) {
  double *x = malloc(n * sizeof *x);
  for (size_t i = 0; i < n; i++)
    x[i] = attn_load_elem(p, dt, i);
  return x;
}

/* The "outputs" o of a /v2 JSON reply as doubles. */
static double *v2_reply_o(const http_res *r, size_t n) {
  cJSON *j = cJSON_Parse(r->body);
  const cJSON *outs = cJSON_GetObjectItem(j, "outputs"), *o = NULL;
  for (const cJSON *x = outs ? outs->child : NULL; x; x = x->next)
    if (!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(x, "name")) ?: "", "o"))
      o = x;
  const cJSON *data = o ? cJSON_GetObjectItem(o, "data") : NULL;
  double *v = calloc(n, sizeof *v);
  size_t k = 0;
  for (const cJSON *x = data ? data->child : NULL; x && k < n; x = x->next)
    v[k++] = x->valuedouble;
  cJSON_Delete(j);
  return k == n ? v : (free(v), NULL);
}

/* A /v2 input of F32 data. */
static void v2_input(attn_sbuf *b, const char *name, const int64_t *shape, int rank,
                     const float *data, size_t n) {
  attn_sbuf_printf(b, "{\"name\":\"%s\",\"datatype\":\"FP32\",\"shape\":[", name);
  for (int i = 0; i < rank; i++)
    attn_sbuf_printf(b, i ? ",%lld" : "%lld", (long long)shape[i]);
  attn_sbuf_puts(b, "],\"data\":[");
  for (size_t i = 0; i < n; i++)
    attn_sbuf_printf(b, i ? ",%.9g" : "%.9g", (double)data[i]);
  attn_sbuf_puts(b, "]}");
}

Test(sinks, v2_input_matches_the_reference) {
  srv_start(&S, NULL);
  for (int b = 0; b < 2; b++) {
    tcase c;
    sink_case(&c, ATTN_F32, 33);
    const tprob *p = &c.p;
    int64_t sq[4] = {p->b, p->hq, p->nq, p->d}, skv[4] = {p->b, p->hkv, p->nkv, p->d};
    size_t nq = (size_t)(p->b * p->hq * p->nq * p->d),
           nkv = (size_t)(p->b * p->hkv * p->nkv * p->d);
    attn_sbuf body = {0};
    attn_sbuf_puts(&body, "{\"inputs\":[");
    v2_input(&body, "q", sq, 4, c.q, nq);
    attn_sbuf_puts(&body, ",");
    v2_input(&body, "k", skv, 4, c.k, nkv);
    attn_sbuf_puts(&body, ",");
    v2_input(&body, "v", skv, 4, c.v, nkv);
    attn_sbuf_puts(&body, ",");
    v2_input(&body, "sinks", &p->hq, 1, SINKS, (size_t)p->hq);
    attn_sbuf_printf(&body, "],\"parameters\":{\"causal\":true,\"backend\":\"%s\"}}", BACKENDS[b]);
    http_res r;
    http_post(&S, "/v2/models/attention/infer", JSON_CT, body.p, body.len, &r);
    cr_expect_eq(r.status, 200, "backend %s: %ld %.300s", BACKENDS[b], r.status, r.body);
    double *ref = malloc(nq * sizeof *ref), *got = v2_reply_o(&r, nq);
    attn_status st;
    cr_assert_eq(attn_reference(&c.req, ref, NULL, NULL, NULL, &st), 0, "%s", st.message);
    cr_expect(got, "backend %s: no o of %zu numbers in %.300s", BACKENDS[b], nq, r.body);
    if (got)
      cr_expect_leq(norm_err(got, ref, nq), ttol(ATTN_F32), "/v2, backend %s", BACKENDS[b]);
    free(got);
    free(ref);
    free(body.p);
    http_res_free(&r);
    tcase_free(&c);
  }
}

/* The backward of c (with sinks) posted in a codec; the reply's dq, dk,
 * dv and dsinks against the float64 reference. */
static void backward_case(tcase *c, bool st_codec, const char *backend) {
  attn_options o;
  backend_opt(&o, backend);
  attn_status st;
  void *buf;
  size_t len;
  int rc = st_codec ? attn_proto_encode_request_safetensors(&c->req, &o, &buf, &len, &st)
                    : attn_proto_encode_request_json(&c->req, &o, (char **)&buf, &len, &st);
  cr_assert_eq(rc, 0, "%s", st.message);
  attn_proto_req pr; /* the request as sent, for the reply's shapes and buffers */
  rc = st_codec ? attn_proto_decode_safetensors_pass(buf, len, ATTN_BACKWARD, NULL, &pr, &st)
                : attn_proto_decode_json_pass(buf, len, ATTN_BACKWARD, NULL, &pr, &st);
  cr_assert_eq(rc, 0, "%s", st.message);
  http_res r;
  http_post(&S, "/attention/backward", st_codec ? ST_CT : JSON_CT, buf, len, &r);
  char what[96];
  snprintf(what, sizeof what, "backward, %s, %s, backend %s", st_codec ? "safetensors" : "JSON",
           attn_dtype_name(c->p.dt), backend);
  cr_assert_eq(r.status, 200, "%s: %ld %.300s", what, r.status, r.body);
  rc = st_codec ? attn_proto_decode_reply_safetensors(r.body, r.len, &pr, &st)
                : attn_proto_decode_reply_json(r.body, r.len, &pr, NULL, 0, &st);
  cr_assert_eq(rc, 0, "%s: %s", what, st.message);
  const tprob *p = &c->p;
  size_t n[4] = {(size_t)(p->b * p->hq * p->nq * p->d), (size_t)(p->b * p->hkv * p->nkv * p->d),
                 (size_t)(p->b * p->hkv * p->nkv * p->d), (size_t)p->hq};
  double *ref[4], *got[4];
  for (int i = 0; i < 4; i++)
    ref[i] = malloc(n[i] * sizeof(double));
  cr_assert_eq(attn_reference_backward(&c->req, ref[0], ref[1], ref[2], &st), 0, "%s", st.message);
  cr_assert_eq(attn_reference_dsinks(&c->req, ref[3], &st), 0, "%s", st.message);
  got[0] = widen(pr.req.dq, p->dt, n[0]);
  got[1] = widen(pr.req.dk, p->dt, n[1]);
  got[2] = widen(pr.req.dv, p->dt, n[2]);
  got[3] = widen(pr.req.dsinks, ATTN_F32, n[3]);
  static const char *const names[4] = {"dq", "dk", "dv", "dsinks"};
  for (int i = 0; i < 4; i++) {
    double e = norm_err(got[i], ref[i], n[i]);
    cr_expect_leq(e, ttol(p->dt), "%s: %s normalized error %.3g", what, names[i], e);
    free(ref[i]);
    free(got[i]);
  }
  http_res_free(&r);
  attn_proto_req_free(&pr);
  free(buf);
}

Test(sinks, backward_dsinks_match_the_reference) {
  srv_start(&S, NULL);
  const attn_dtype dts[2] = {ATTN_F32, ATTN_BF16};
  for (int b = 0; b < 2; b++)
    for (int t = 0; t < 2; t++) {
      tcase c;
      sink_case(&c, dts[t], 50 + (uint64_t)t);
      attn_status st;
      cr_assert_eq(tcase_backward(&c, t == 0, 60, &st), 0, "%s", st.message);
      backward_case(&c, t == 1, BACKENDS[b]);
      tcase_free(&c);
    }
}

/* POST path with body as JSON; the reply. */
static void post_json(const char *path, const char *body, http_res *r) {
  http_post(&S, path, JSON_CT, body, strlen(body), r);
}

/* The o data of a JSON reply as doubles (n of them, else NULL). */
static double *reply_o(const http_res *r, size_t n) {
  cJSON *j = cJSON_Parse(r->body);
  const cJSON *data = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "o"), "data");
  double *v = calloc(n, sizeof *v);
  size_t k = 0;
  for (const cJSON *x = data ? data->child : NULL; x && k < n; x = x->next)
    v[k++] = x->valuedouble;
  cJSON_Delete(j);
  return k == n ? v : (free(v), NULL);
}

static void create(const char *id, const tcase *c) {
  char path[96], body[256];
  snprintf(path, sizeof path, "/v1/sessions/%s", id);
  snprintf(body, sizeof body,
           "{\"heads_kv\": %lld, \"head_dim\": %lld, \"dtype\": \"%s\", \"max_tokens\": 64}",
           (long long)c->p.hkv, (long long)c->p.d, attn_dtype_name(c->p.dt));
  const char *h[] = {"Content-Type: application/json", NULL};
  http_res r;
  cr_assert_eq(http_call(&S, "PUT", path, h, body, strlen(body), &r), 201, "create %s: %.300s", id,
               r.body);
  http_res_free(&r);
}

Test(sinks, a_session_call_equals_the_stateless_request) {
  srv_start(&S, "--session-memory", "16M", NULL);
  tprob p = tprob_make(1, 4, 2, 24, 24, 16, ATTN_F32);
  p.causal = true;
  tcase c;
  tcase_init(&c, &p, 71);
  c.req.sinks = SINKS;
  char extra[512];
  sinks_json(SINKS, p.hq, extra, sizeof extra);
  size_t n = strlen(extra);
  /* the session's q, k, v are [H, N, D]: rank 3 */
  snprintf(extra + n, sizeof extra - n, ",\"pos\":0");
  size_t len;
  char *body = json_body(&c, 3, extra, &len);
  create("sk", &c);
  http_res rs, ra;
  http_post(&S, "/v1/sessions/sk/attention", JSON_CT, body, len, &rs);
  expect_correct(&rs, &c, 3, false, "session call with sinks");
  free(body);
  snprintf(extra + n, sizeof extra - n, ",\"causal\":true");
  body = json_body(&c, 3, extra, &len);
  http_post(&S, "/attention", JSON_CT, body, len, &ra);
  expect_correct(&ra, &c, 3, false, "stateless request with sinks");
  size_t no = (size_t)(p.hq * p.nq * p.d);
  double *os = reply_o(&rs, no), *oa = reply_o(&ra, no);
  cr_assert(os && oa);
  cr_expect_leq(norm_err(os, oa, no), ttol(ATTN_F32), "session and stateless replies differ");
  free(os);
  free(oa);
  free(body);
  http_res_free(&rs);
  http_res_free(&ra);
  tcase_free(&c);
}

/* Rows [r0, r0 + n) of every head of the [H, total, D] F32 tensor t, as
 * text numbers after ',' (first: none before the first). */
static void put_rows(attn_sbuf *b, const float *t, int64_t h, int64_t total, int64_t d, int64_t r0,
                     int64_t n, bool *first) {
  for (int64_t j = 0; j < n * d; j++) {
    attn_sbuf_printf(b, *first ? "%.9g" : ",%.9g", (double)t[(h * total + r0) * d + j]);
    *first = false;
  }
}

Test(sinks, a_batch_entry_equals_its_single_call) {
  srv_start(&S, "--session-memory", "16M", NULL);
  tprob p = tprob_make(1, 4, 2, 9, 9, 16, ATTN_F32);
  p.causal = true;
  tcase f[2];
  tcase_init(&f[0], &p, 81);
  tcase_init(&f[1], &p, 82);
  char sj[512];
  sinks_json(SINKS, p.hq, sj, sizeof sj);
  const char *ids[4] = {"a", "b", "a2", "b2"};
  for (int i = 0; i < 4; i++) { /* 8 tokens each, without sinks: the cache only */
    create(ids[i], &f[i % 2]);
    tcase pre;
    tprob pp = p;
    pp.nq = pp.nkv = 8;
    tcase_init(&pre, &pp, 1);
    /* k and v: f's first 8 rows (q does not matter here) */
    for (int64_t h = 0; h < p.hkv; h++) {
      memcpy((float *)pre.k + h * 8 * p.d, (float *)f[i % 2].k + h * 9 * p.d, 8 * 16 * 4);
      memcpy((float *)pre.v + h * 8 * p.d, (float *)f[i % 2].v + h * 9 * p.d, 8 * 16 * 4);
    }
    size_t len;
    char *b = json_body(&pre, 3, ",\"pos\":0", &len), path[64];
    snprintf(path, sizeof path, "/v1/sessions/%s/attention", ids[i]);
    http_res r;
    http_post(&S, path, JSON_CT, b, len, &r);
    cr_assert_eq(r.status, 200, "%s", r.body);
    http_res_free(&r);
    free(b);
    tcase_free(&pre);
  }
  /* token 8 of each: a batch of a2 and b2, and single calls on a and b */
  attn_sbuf b = {0};
  const char *names[3] = {"q", "k", "v"};
  attn_sbuf_puts(&b, "{");
  for (int t = 0; t < 3; t++) {
    int64_t heads = t ? p.hkv : p.hq;
    attn_sbuf_printf(&b, "\"%s\":{\"shape\":[%lld,2,%lld],\"dtype\":\"F32\",\"data\":[", names[t],
                     (long long)heads, (long long)p.d);
    bool first = true;
    for (int64_t h = 0; h < heads; h++)
      for (int s = 0; s < 2; s++)
        put_rows(&b, t == 0 ? f[s].q : t == 1 ? f[s].k : f[s].v, h, 9, p.d, 8, 1, &first);
    attn_sbuf_puts(&b, "]},");
  }
  attn_sbuf_printf(&b,
                   "\"cu_seqlens_q\":[0,1,2],\"cu_seqlens_kv\":[0,1,2],\"pos\":[8,8],"
                   "\"sessions\":[\"a2\",\"b2\"]%s}",
                   sj);
  http_res rb;
  post_json("/v1/sessions/_batch", b.p, &rb);
  cr_assert_eq(rb.status, 200, "%.300s", rb.body);
  size_t no = (size_t)(p.hq * p.d);
  double *ob = reply_o(&rb, 2 * no);
  cr_assert(ob, "%.300s", rb.body);
  for (int s = 0; s < 2; s++) {
    attn_sbuf one = {0};
    attn_sbuf_puts(&one, "{");
    for (int t = 0; t < 3; t++) {
      int64_t heads = t ? p.hkv : p.hq;
      attn_sbuf_printf(&one, "\"%s\":{\"shape\":[%lld,1,%lld],\"dtype\":\"F32\",\"data\":[",
                       names[t], (long long)heads, (long long)p.d);
      bool first = true;
      for (int64_t h = 0; h < heads; h++)
        put_rows(&one, t == 0 ? f[s].q : t == 1 ? f[s].k : f[s].v, h, 9, p.d, 8, 1, &first);
      attn_sbuf_puts(&one, "]},");
    }
    attn_sbuf_printf(&one, "\"pos\":8%s}", sj);
    char path[64];
    snprintf(path, sizeof path, "/v1/sessions/%s/attention", ids[s]);
    http_res r1;
    post_json(path, one.p, &r1);
    cr_assert_eq(r1.status, 200, "%.300s", r1.body);
    double *o1 = reply_o(&r1, no);
    cr_assert(o1);
    /* the single call against the reference over all 9 keys, last query */
    tcase last;
    tprob lp = p;
    lp.nq = 1;
    tcase_init(&last, &lp, 1);
    for (int64_t h = 0; h < p.hq; h++)
      memcpy((float *)last.q + h * p.d, (float *)f[s].q + (h * 9 + 8) * p.d, 16 * 4);
    memcpy(last.k, f[s].k, (size_t)(p.hkv * 9 * p.d) * 4);
    memcpy(last.v, f[s].v, (size_t)(p.hkv * 9 * p.d) * 4);
    last.req.sinks = SINKS;
    double *ref = malloc(no * sizeof *ref);
    attn_status st;
    cr_assert_eq(attn_reference(&last.req, ref, NULL, NULL, NULL, &st), 0, "%s", st.message);
    cr_expect_leq(norm_err(o1, ref, no), ttol(ATTN_F32), "session %s against the reference",
                  ids[s]);
    for (int64_t h = 0; h < p.hq; h++)
      for (int64_t d = 0; d < p.d; d++)
        cr_expect_eq(ob[(h * 2 + s) * p.d + d], o1[h * p.d + d], "batch entry %d, head %lld", s,
                     (long long)h);
    free(ref);
    tcase_free(&last);
    free(o1);
    free(one.p);
    http_res_free(&r1);
  }
  free(ob);
  free(b.p);
  http_res_free(&rb);
  tcase_free(&f[0]);
  tcase_free(&f[1]);
}

Test(sinks, bad_sinks_are_422) {
  srv_start(&S, NULL);
  tprob p = tprob_make(2, 4, 2, 5, 6, 8, ATTN_F32);
  tcase c;
  tcase_init(&c, &p, 5);
  static const struct {
    const char *extra, *code, *needle;
  } bad[] = {
      {",\"sinks\":[1,2,3,4,5]", "shape_mismatch",
       "tensor \\\"sinks\\\" has shape [5]; it must be [4]"},
      {",\"sinks\":[[1,2],[3,4]]", "invalid_tensor",
       "tensor \\\"sinks\\\" has 2 dimensions; use [Hq]"},
      {",\"sinks\":{\"shape\":[4],\"dtype\":\"I32\",\"data\":[1,2,3,4]}", "invalid_tensor",
       "tensor \\\"sinks\\\": unknown dtype \\\"I32\\\""},
      {",\"sinks\":{\"shape\":[4],\"dtype\":\"BF16\",\"data\":[1,2,3,4]}", "dtype_mismatch",
       "tensor \\\"sinks\\\" is BF16; it must be F32"},
      {",\"sinks\":[1,2,1e999,4]", "non_finite", "tensor \\\"sinks\\\""},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    size_t len;
    char *b = json_body(&c, 4, bad[i].extra, &len);
    http_res r;
    http_post(&S, "/attention", JSON_CT, b, len, &r);
    expect_error(&r, 422, bad[i].code, bad[i].extra);
    cr_expect(r.body && strstr(r.body, bad[i].needle), "%s: %s", bad[i].extra, r.body);
    http_res_free(&r);
    free(b);
  }
  /* A NaN sink (JSON cannot carry one; safetensors can), named by its place. */
  float nan_sinks[4] = {0, 1, NAN, 2};
  c.req.sinks = nan_sinks;
  void *buf;
  size_t len;
  attn_status st;
  cr_assert_eq(attn_proto_encode_request_safetensors(&c.req, NULL, &buf, &len, &st), 0, "%s",
               st.message);
  http_res r;
  http_post(&S, "/attention", ST_CT, buf, len, &r);
  expect_error(&r, 422, "non_finite", "a NaN sink");
  cr_expect(strstr(r.body, "tensor sinks holds a non-finite value (nan) at [2]"), "%s", r.body);
  http_res_free(&r);
  free(buf);
  /* a backward request's sinks are checked the same way */
  c.req.sinks = NULL;
  cr_assert_eq(tcase_backward(&c, false, 3, &st), 0, "%s", st.message);
  c.req.sinks = nan_sinks;
  nan_sinks[2] = 1;
  cr_assert_eq(attn_proto_encode_request_json(&c.req, NULL, (char **)&buf, &len, &st), 0, "%s",
               st.message);
  /* Hq + 1 sinks: the encoder writes Hq, so the body is edited */
  char *s = strstr(buf, "\"sinks\": {\"shape\": [4]");
  cr_assert(s, "%s", (char *)buf);
  strchr(s, '[')[1] = '5';
  char *d = strstr(s, "\"data\": [");
  cr_assert(d);
  size_t at = (size_t)(d - (char *)buf) + 9;
  char *edited = malloc(len + 8);
  memcpy(edited, buf, at);
  memcpy(edited + at, "0, ", 3);
  memcpy(edited + at + 3, (char *)buf + at, len - at + 1);
  http_post(&S, "/attention/backward", JSON_CT, edited, len + 3, &r);
  expect_error(&r, 422, "shape_mismatch", "5 sinks in a backward request");
  cr_expect(strstr(r.body, "tensor \\\"sinks\\\" has shape [5]; it must be [4]"), "%s", r.body);
  http_res_free(&r);
  free(edited);
  free(buf);
  tcase_free(&c);
}

/* ---- session calls computed together ---------------------------------------- */

#define SD 4
#define HELD_Q0 "1234.5"

static hold_gate G;
static void sched_teardown(void) {
  if (G.path[0])
    hold_release(&G);
  srv_cleanup(&S);
  if (G.path[0])
    hold_gate_free(&G);
}
TestSuite(sinks_sched, .fini = sched_teardown, .timeout = 120);

/* "[[...], ...]": n rows of SD numbers. */
static void put_rows_sd(attn_sbuf *b, const float (*rows)[SD], int n) {
  attn_sbuf_puts(b, "[");
  for (int i = 0; i < n; i++)
    for (int c = 0; c < SD; c++)
      attn_sbuf_printf(b, "%s%.9g%s",
                       c   ? ","
                       : i ? ",["
                           : "[",
                       (double)rows[i][c], c == SD - 1 ? "]" : "");
  attn_sbuf_puts(b, "]");
}

/* A call on its own connection, sent and not awaited: the socket. */
static int send_call(const char *path, const char *body) {
  int fd = raw_connect(S.port);
  cr_assert_geq(fd, 0);
  char head[300];
  snprintf(head, sizeof head,
           "POST %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"
           "Content-Length: %zu\r\nConnection: close\r\n\r\n",
           path, S.port, strlen(body));
  cr_assert_eq(raw_sends(fd, head), 0);
  cr_assert_eq(raw_sends(fd, body), 0);
  return fd;
}

/* One query a head (q [2][SD]) over n keys of one KV head, with sinks (or
 * none), in float64: the formula of the contract, written again here. */
static void sink_reference(const float q[2][SD], const float (*k)[SD], const float (*v)[SD], int n,
                           const float *sinks, double o[2][SD]) {
  for (int h = 0; h < 2; h++) {
    double s[16], m = sinks ? sinks[h] : -INFINITY, l = 0;
    for (int j = 0; j < n; j++) {
      s[j] = 0;
      for (int c = 0; c < SD; c++)
        s[j] += (double)q[h][c] * k[j][c];
      s[j] /= sqrt((double)SD);
      m = fmax(m, s[j]);
    }
    l = sinks ? exp(sinks[h] - m) : 0;
    for (int c = 0; c < SD; c++)
      o[h][c] = 0;
    for (int j = 0; j < n; j++) {
      l += exp(s[j] - m);
      for (int c = 0; c < SD; c++)
        o[h][c] += exp(s[j] - m) * v[j][c];
    }
    for (int c = 0; c < SD; c++)
      o[h][c] /= l;
  }
}

/* Calls queued behind a held job of their layer may run as one job: each
 * with its own sinks (one with none) still gets its own answer. */
Test(sinks_sched, calls_computed_together_keep_their_own_sinks) {
  hold_gate_init(&G);
  const char *args[] = {"--tiny-flops", "0", "--session-batch", "on", NULL};
  const char *env[] = {G.env, "ATTN_HOLD_CPU_Q0=" HELD_Q0, "ATTN_HOLD_MAX_S=600", NULL};
  S.bin = srv_hold_bin();
  srv_startv(&S, args, env, true);
  const char *h[] = {"Content-Type: application/json", NULL};
  const char *create = "{\"heads_kv\": 1, \"head_dim\": 4, \"dtype\": \"F32\", \"max_tokens\": 16}";
  http_res r = {0};
  cr_assert_eq(http_call(&S, "PUT", "/v1/sessions/ss", h, create, strlen(create), &r), 201, "%s",
               r.body);
  http_res_free(&r);
  uint64_t seed = 99;
  float k[6][SD], v[6][SD], q[4][2][SD];
  for (int i = 0; i < 6; i++)
    for (int c = 0; c < SD; c++) {
      k[i][c] = (float)tuniform(&seed);
      v[i][c] = (float)tuniform(&seed);
    }
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 2; j++)
      for (int c = 0; c < SD; c++)
        q[i][j][c] = (float)tuniform(&seed);
  q[0][0][0] = (float)atof(HELD_Q0);
  /* six tokens, then a held call, then three that queue behind it */
  static const float sinks[3][2] = {{3, -1}, {-2, 0.5f}, {0, 0}};
  const float *use[4] = {NULL, sinks[0], NULL, sinks[1]};
  char *body[4];
  for (int i = 0; i < 4; i++) {
    attn_sbuf b = {0};
    attn_sbuf_puts(&b, "{\"q\": [");
    put_rows_sd(&b, (const float(*)[SD])q[i][0], 1);
    attn_sbuf_puts(&b, ",");
    put_rows_sd(&b, (const float(*)[SD])q[i][1], 1);
    attn_sbuf_puts(&b, "]");
    if (use[i])
      attn_sbuf_printf(&b, ", \"sinks\": [%.9g, %.9g]", (double)use[i][0], (double)use[i][1]);
    attn_sbuf_puts(&b, "}");
    body[i] = b.p;
  }
  attn_sbuf pre = {0};
  attn_sbuf_puts(&pre, "{\"q\": [[[1, 0, 0, 0]]], \"k\": [");
  put_rows_sd(&pre, (const float(*)[SD])k, 6);
  attn_sbuf_puts(&pre, "], \"v\": [");
  put_rows_sd(&pre, (const float(*)[SD])v, 6);
  attn_sbuf_puts(&pre, "], \"pos\": 0}");
  cr_assert_eq(http_call(&S, "POST", "/v1/sessions/ss/attention", h, pre.p, pre.len, &r), 200, "%s",
               r.body);
  http_res_free(&r);
  free(pre.p);
  int fd[4];
  fd[0] = send_call("/v1/sessions/ss/attention", body[0]);
  cr_assert(srv_wait_jobs(&S, 1, true, 30));
  for (int i = 1; i < 4; i++)
    fd[i] = send_call("/v1/sessions/ss/attention", body[i]);
  cr_assert(srv_wait_metric_ge(&S, "attnd_session_calls_waiting", NULL, 3, 30),
            "the three calls never waited for the held one");
  hold_release(&G);
  for (int i = 0; i < 4; i++) {
    http_res ri = {0};
    cr_expect_eq(raw_response(fd[i], 30000, &ri), 200, "call %d: %s", i, ri.body);
    double want[2][SD];
    sink_reference((const float(*)[SD])q[i], (const float(*)[SD])k, (const float(*)[SD])v, 6,
                   use[i], want);
    double *got = ri.status == 200 ? reply_o(&ri, 2 * SD) : NULL;
    cr_expect(got, "call %d: no o in %s", i, ri.body);
    for (int j = 0; got && j < 2 * SD; j++)
      cr_expect(fabs(got[j] - want[j / SD][j % SD]) <= 1e-5 * (1 + fabs(want[j / SD][j % SD])),
                "call %d (sinks %s): o[%d] = %.9g, the float64 answer %.9g", i,
                use[i] ? "given" : "none", j, got[j], want[j / SD][j % SD]);
    free(got);
    http_res_free(&ri);
    close(fd[i]);
    free(body[i]);
  }
}
