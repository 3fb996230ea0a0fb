/*
 * test_dv.c — a value head dim of its own (v's last dimension Dv, not q's
 * and k's D) over HTTP: forward replies from JSON, safetensors and /v2 whose
 * o ends in Dv and equals the float64 reference (D 192 / Dv 128, DeepSeek's
 * MLA prefill, and D 32 / Dv 64); a backward reply's dq, dk (D) and dv (Dv)
 * equal to attn_reference_backward; and the refusals: v's last dim over the
 * limit and a backward o of D instead of Dv, each 422 with a message that
 * says what is allowed; outputs past the memory budget refused (413). D 576
 * / Dv 512 (the limits, DeepSeek's absorbed MLA decode) answers like the
 * others. Sessions with a value head dim of their own: test_session_dv.c.
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
TestSuite(dv, .fini = teardown, .timeout = 120);

#define JSON_CT "application/json"
#define ST_CT "application/octet-stream"

/* One problem with its own buffers: q, k [.., D], v [.., Dv]; for a
 * backward one also o (the reference's, rounded to the dtype) and dO. */
typedef struct dvcase {
  attn_request req;
  void *q, *k, *v, *o, *dout, *grads; /* grads: dq, dk, dv the reference's checks want */
  size_t nq, nk, nv, no;              /* element counts of q, k, v, o */
} dvcase;

static uint64_t rng_next(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return *s >> 33;
}

static void *random_tensor(attn_dtype dt, size_t n, uint64_t *seed) {
  void *p = malloc(n * attn_dtype_size(dt));
  for (size_t i = 0; i < n; i++)
    attn_store_elem(p, dt, i, (float)((double)rng_next(seed) / 2147483648.0 * 2.0 - 1.0));
  return p;
}

/* c of [B, Hq, Nq, D] q and so on: bhn holds B, Hq, Hkv, Nq, Nkv. */
static void dv_init_dims(dvcase *c, const int64_t bhn[5], int64_t d, int64_t dv, attn_dtype dt,
                         bool causal, uint64_t seed) {
  memset(c, 0, sizeof *c);
  attn_request *r = &c->req;
  attn_request_init(r);
  r->batch = bhn[0], r->heads_q = bhn[1], r->heads_kv = bhn[2], r->seq_q = bhn[3];
  r->seq_kv = bhn[4];
  r->head_dim = d;
  r->head_dim_v = dv;
  r->dtype = dt;
  r->causal = causal;
  c->nq = (size_t)(r->batch * r->heads_q * r->seq_q * d);
  c->nk = (size_t)(r->batch * r->heads_kv * r->seq_kv * d);
  c->nv = (size_t)(r->batch * r->heads_kv * r->seq_kv * dv);
  c->no = (size_t)(r->batch * r->heads_q * r->seq_q * dv);
  r->q = c->q = random_tensor(dt, c->nq, &seed);
  r->k = c->k = random_tensor(dt, c->nk, &seed);
  r->v = c->v = random_tensor(dt, c->nv, &seed);
  r->o = c->o = malloc(c->no * attn_dtype_size(dt)); /* the reference checks it is there */
}

static void dv_init(dvcase *c, int64_t d, int64_t dv, attn_dtype dt, bool causal, uint64_t seed) {
  static const int64_t bhn[5] = {2, 4, 2, 5, 9};
  dv_init_dims(c, bhn, d, dv, dt, causal, seed);
}

/* Makes c a backward request: o from the reference, dO random. */
static void dv_backward(dvcase *c, uint64_t seed) {
  double *o = malloc(c->no * sizeof *o);
  attn_status st;
  cr_assert_eq(attn_reference(&c->req, o, NULL, NULL, NULL, &st), 0, "%s", st.message);
  for (size_t i = 0; i < c->no; i++)
    attn_store_elem(c->o, c->req.dtype, i, (float)o[i]);
  free(o);
  c->dout = random_tensor(c->req.dtype, c->no, &seed);
  c->req.pass = ATTN_BACKWARD;
  c->req.dout = c->dout;
  size_t es = attn_dtype_size(c->req.dtype);
  char *g = c->grads = malloc((c->nq + c->nk + c->nv) * es);
  c->req.dq = g, c->req.dk = g + c->nq * es, c->req.dv = g + (c->nq + c->nk) * es;
}

static void dv_free(dvcase *c) {
  free(c->q), free(c->k), free(c->v), free(c->o), free(c->dout), free(c->grads);
}

/* ||x - ref|| / ||ref||; a NaN counts as infinite. */
static double norm_err(const void *x, attn_dtype dt, const double *ref, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    double g = attn_load_elem(x, dt, i);
    if (isnan(g))
      return INFINITY;
    num += (g - ref[i]) * (g - ref[i]);
    den += ref[i] * ref[i];
  }
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* c encoded in a codec and decoded back (the request as the server reads
 * it, for the reply's shapes and buffers). */
static void encode(const dvcase *c, bool st_codec, void **buf, size_t *len, attn_proto_req *pr) {
  attn_options o;
  attn_options_init(&o);
  if (c->req.causal)
    o.causal = true, o.set |= ATTN_OPT_CAUSAL;
  attn_status st;
  int rc = st_codec ? attn_proto_encode_request_safetensors(&c->req, &o, buf, len, &st)
                    : attn_proto_encode_request_json(&c->req, &o, (char **)buf, len, &st);
  cr_assert_eq(rc, 0, "%s", st.message);
  rc = st_codec ? attn_proto_decode_safetensors_pass(*buf, *len, c->req.pass, NULL, pr, &st)
                : attn_proto_decode_json_pass(*buf, *len, c->req.pass, NULL, pr, &st);
  cr_assert_eq(rc, 0, "%s", st.message);
  cr_assert_eq(attn_request_dv(&pr->req), attn_request_dv(&c->req));
}

/* c posted to path in a codec; the reply decoded into pr's outputs. */
static void post_decode(const dvcase *c, bool st_codec, const char *path, attn_proto_req *pr,
                        const char *what) {
  void *buf;
  size_t len;
  encode(c, st_codec, &buf, &len, pr);
  http_res r;
  http_post(&S, path, st_codec ? ST_CT : JSON_CT, buf, len, &r);
  cr_assert_eq(r.status, 200, "%s: %ld %.300s", what, r.status, r.body);
  attn_status st;
  int rc = st_codec ? attn_proto_decode_reply_safetensors(r.body, r.len, pr, &st)
                    : attn_proto_decode_reply_json(r.body, r.len, pr, NULL, 0, &st);
  cr_assert_eq(rc, 0, "%s: %s", what, st.message);
  http_res_free(&r);
  free(buf);
}

/* DeepSeek's MLA prefill, Dv above D, and the limits (MLA's absorbed decode). */
static const int64_t DIMS[3][2] = {{192, 128}, {32, 64}, {ATTN_MAX_HEAD_DIM, ATTN_MAX_HEAD_DIM_V}};

Test(dv, forward_json_and_safetensors_match_the_reference) {
  srv_start(&S, NULL);
  const attn_dtype dts[2] = {ATTN_F32, ATTN_BF16};
  for (int i = 0; i < 3; i++)
    for (int codec = 0; codec < 2; codec++)
      for (int t = 0; t < 2; t++) {
        dvcase c;
        dv_init(&c, DIMS[i][0], DIMS[i][1], dts[t], codec == 1, 11 + (uint64_t)(i * 4 + t));
        char what[96];
        snprintf(what, sizeof what, "D %lld Dv %lld, %s, %s", (long long)DIMS[i][0],
                 (long long)DIMS[i][1], codec ? "safetensors" : "JSON", attn_dtype_name(dts[t]));
        attn_proto_req pr;
        post_decode(&c, codec == 1, "/attention", &pr, what);
        cr_expect_eq(pr.shape_o[pr.rank - 1], DIMS[i][1], "%s: o's last dim", what);
        double *ref = malloc(c.no * sizeof *ref);
        attn_status st;
        cr_assert_eq(attn_reference(&c.req, ref, NULL, NULL, NULL, &st), 0, "%s", st.message);
        double e = norm_err(pr.req.o, dts[t], ref, c.no);
        cr_expect_leq(e, ttol(dts[t]), "%s: o normalized error %.3g", what, e);
        free(ref);
        attn_proto_req_free(&pr);
        dv_free(&c);
      }
}

/* A /v2 input of c's dtype (F32) data. */
static void v2_input(attn_sbuf *b, const char *name, const int64_t *shape, const float *data,
                     size_t n) {
  attn_sbuf_printf(b, "{\"name\":\"%s\",\"datatype\":\"FP32\",\"shape\":[", name);
  for (int i = 0; i < 4; i++)
    attn_sbuf_printf(b, i ? ",%lld" : "%lld", (long long)shape[i]);
  attn_sbuf_puts(b, "],\"data\":[");
  for (size_t i = 0; i < n; i++)
    attn_sbuf_printf(b, i ? ",%.9g" : "%.9g", (double)data[i]);
  attn_sbuf_puts(b, "]}");
}

/* The output o of a /v2 reply: its shape into shape[4], its data as
 * doubles (NULL unless n of them). */
static double *v2_reply_o(const http_res *r, int64_t shape[4], size_t n) {
  cJSON *j = cJSON_Parse(r->body);
  const cJSON *outs = cJSON_GetObjectItem(j, "outputs"), *o = NULL;
  for (const cJSON *x = outs ? outs->child : NULL; x; x = x->next)
    if (!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(x, "name")) ?: "", "o"))
      o = x;
  const cJSON *sh = o ? cJSON_GetObjectItem(o, "shape") : NULL;
  for (int i = 0; i < 4; i++)
    shape[i] =
        sh && cJSON_GetArraySize(sh) == 4 ? (int64_t)cJSON_GetArrayItem(sh, i)->valuedouble : -1;
  const cJSON *data = o ? cJSON_GetObjectItem(o, "data") : NULL;
  double *v = calloc(n, sizeof *v);
  size_t k = 0;
  for (const cJSON *x = data ? data->child : NULL; x && k < n; x = x->next)
    v[k++] = x->valuedouble;
  cJSON_Delete(j);
  return k == n ? v : (free(v), NULL);
}

Test(dv, v2_output_has_dv_and_matches_the_reference) {
  srv_start(&S, NULL);
  for (int i = 0; i < 2; i++) {
    dvcase c;
    dv_init(&c, DIMS[i][0], DIMS[i][1], ATTN_F32, false, 31 + (uint64_t)i);
    const attn_request *q = &c.req;
    int64_t sq[4] = {q->batch, q->heads_q, q->seq_q, q->head_dim},
            sk[4] = {q->batch, q->heads_kv, q->seq_kv, q->head_dim},
            sv[4] = {q->batch, q->heads_kv, q->seq_kv, q->head_dim_v}, so[4];
    attn_sbuf body = {0};
    attn_sbuf_puts(&body, "{\"inputs\":[");
    v2_input(&body, "q", sq, c.q, c.nq);
    attn_sbuf_puts(&body, ",");
    v2_input(&body, "k", sk, c.k, c.nk);
    attn_sbuf_puts(&body, ",");
    v2_input(&body, "v", sv, c.v, c.nv);
    attn_sbuf_puts(&body, "]}");
    http_res r;
    http_post(&S, "/v2/models/attention/infer", JSON_CT, body.p, body.len, &r);
    cr_assert_eq(r.status, 200, "D %lld: %ld %.300s", (long long)sq[3], r.status, r.body);
    double *ref = malloc(c.no * sizeof *ref), *got = v2_reply_o(&r, so, c.no);
    attn_status st;
    cr_assert_eq(attn_reference(&c.req, ref, NULL, NULL, NULL, &st), 0, "%s", st.message);
    cr_expect_eq(so[3], sv[3], "/v2 o's last dim %lld, expected Dv %lld", (long long)so[3],
                 (long long)sv[3]);
    cr_expect(got, "no o of %zu numbers in %.300s", c.no, r.body);
    if (got) {
      double num = 0, den = 0;
      for (size_t k = 0; k < c.no; k++)
        num += (got[k] - ref[k]) * (got[k] - ref[k]), den += ref[k] * ref[k];
      cr_expect_leq(sqrt(num / den), ttol(ATTN_F32), "/v2, D %lld", (long long)sq[3]);
    }
    free(got);
    free(ref);
    free(body.p);
    http_res_free(&r);
    dv_free(&c);
  }
}

Test(dv, backward_dq_dk_dv_match_the_reference) {
  srv_start(&S, NULL);
  const attn_dtype dts[2] = {ATTN_F32, ATTN_BF16};
  for (int i = 0; i < 2; i++)
    for (int t = 0; t < 2; t++) {
      dvcase c;
      dv_init(&c, DIMS[i][0], DIMS[i][1], dts[t], t == 0, 41 + (uint64_t)(i * 2 + t));
      dv_backward(&c, 51 + (uint64_t)i);
      char what[96];
      snprintf(what, sizeof what, "backward D %lld Dv %lld, %s", (long long)DIMS[i][0],
               (long long)DIMS[i][1], attn_dtype_name(dts[t]));
      attn_proto_req pr;
      post_decode(&c, t == 1, "/attention/backward", &pr, what);
      cr_expect_eq(pr.shape_v[pr.rank - 1], DIMS[i][1], "%s: dv's last dim", what);
      double *ref[3] = {malloc(c.nq * sizeof(double)), malloc(c.nk * sizeof(double)),
                        malloc(c.nv * sizeof(double))};
      attn_status st;
      cr_assert_eq(attn_reference_backward(&c.req, ref[0], ref[1], ref[2], &st), 0, "%s",
                   st.message);
      const void *got[3] = {pr.req.dq, pr.req.dk, pr.req.dv};
      const size_t n[3] = {c.nq, c.nk, c.nv};
      static const char *const names[3] = {"dq", "dk", "dv"};
      for (int g = 0; g < 3; g++) {
        double e = norm_err(got[g], dts[t], ref[g], n[g]);
        cr_expect_leq(e, ttol(dts[t]), "%s: %s normalized error %.3g", what, names[g], e);
        free(ref[g]);
      }
      attn_proto_req_free(&pr);
      dv_free(&c);
    }
}

/* body posted to path: a 422 whose message holds each of the words. */
static void expect_422(const char *path, const char *method, const char *ctype, const void *body,
                       size_t len, const char *const *words) {
  const char *h[] = {"Content-Type: application/json", NULL};
  http_res r;
  long status = !strcmp(method, "POST") ? (http_post(&S, path, ctype, body, len, &r), r.status)
                                        : http_call(&S, method, path, h, body, len, &r);
  cr_expect_eq(status, 422, "%s %s: %ld %.300s", method, path, status, r.body);
  for (int i = 0; words[i]; i++)
    cr_expect(r.body && strstr(r.body, words[i]), "%s: no \"%s\" in %.300s", path, words[i],
              r.body);
  http_res_free(&r);
}

/* Past the limits (D 576, Dv 512), each 422 naming the field and its limit;
 * v as wide as q counts its width as Dv. */
Test(dv, heads_wider_than_the_limits_are_refused) {
  srv_start(&S, NULL);
  static const struct {
    int64_t d, dv;
    const char *words[5]; /* NULL-terminated */
  } bad[] = {
      {8, ATTN_MAX_HEAD_DIM_V + 1, {"head_dim_v", "512", "513", "invalid_shape"}},
      {ATTN_MAX_HEAD_DIM + 1, 8, {"head_dim", "576", "577", "invalid_shape"}},
      {520, 520, {"head_dim_v", "512", "520", "invalid_shape"}},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    dvcase c;
    dv_init(&c, bad[i].d, bad[i].dv, ATTN_F32, false, 61);
    /* the encoder writes what the engine would refuse: the server's check */
    attn_options o;
    attn_options_init(&o);
    void *buf;
    size_t len;
    attn_status st;
    cr_assert_eq(attn_proto_encode_request_json(&c.req, &o, (char **)&buf, &len, &st), 0, "%s",
                 st.message);
    expect_422("/attention", "POST", JSON_CT, buf, len, bad[i].words);
    free(buf);
    dv_free(&c);
  }
}

/* A JSON body of the named F32 tensors, each [B, H, N, last] of shapes. */
static void json_tensors(attn_sbuf *b, int n, const char *const *names, const int64_t (*shapes)[4],
                         const void *const *data) {
  attn_sbuf_puts(b, "{");
  for (int i = 0; i < n; i++) {
    const int64_t *s = shapes[i];
    attn_sbuf_printf(b, "%s\"%s\":{\"shape\":[%lld,%lld,%lld,%lld],\"dtype\":\"F32\",\"data\":[",
                     i ? "," : "", names[i], (long long)s[0], (long long)s[1], (long long)s[2],
                     (long long)s[3]);
    for (size_t k = 0; k < (size_t)(s[0] * s[1] * s[2] * s[3]); k++)
      attn_sbuf_printf(b, k ? ",%.9g" : "%.9g", attn_load_elem(data[i], ATTN_F32, k));
    attn_sbuf_puts(b, "]}");
  }
  attn_sbuf_puts(b, "}");
}

Test(dv, backward_o_of_d_instead_of_dv_is_refused) {
  srv_start(&S, NULL);
  dvcase c, w; /* c: D 16, Dv 8; w's o and do: [.., 16], q's width */
  dv_init(&c, 16, 8, ATTN_F32, false, 71);
  dv_init(&w, 16, 16, ATTN_F32, false, 73);
  dv_backward(&w, 74);
  const attn_request *r = &c.req;
  const int64_t sq[4] = {r->batch, r->heads_q, r->seq_q, 16},
                sv[4] = {r->batch, r->heads_kv, r->seq_kv, 8};
  const int64_t shapes[5][4] = {{sq[0], sq[1], sq[2], sq[3]},
                                {r->batch, r->heads_kv, r->seq_kv, 16},
                                {sv[0], sv[1], sv[2], sv[3]},
                                {sq[0], sq[1], sq[2], sq[3]},
                                {sq[0], sq[1], sq[2], sq[3]}};
  const char *const names[5] = {"q", "k", "v", "o", "do"};
  const void *const data[5] = {c.q, c.k, c.v, w.o, w.dout};
  attn_sbuf b = {0};
  json_tensors(&b, 5, names, shapes, data);
  expect_422("/attention/backward", "POST", JSON_CT, b.p, b.len,
             (const char *[]){"shape [2, 4, 5, 16]", "must be [2, 4, 5, 8]", "Dv", NULL});
  free(b.p);
  dv_free(&w);
  dv_free(&c);
}

/* O of Dv can outgrow the body many times over (D 1, Dv 512: 512 times
 * q); past the body's size the outputs draw on the memory budget, so one
 * small body cannot make the server hold gigabytes. */
Test(dv, outputs_past_the_memory_budget_are_refused) {
  srv_start(&S, "--max-body", "64K", "--max-queue", "2", NULL);
  dvcase c;
  const int64_t big[5] = {1, 1, 1, 1000, 1}, small[5] = {1, 1, 1, 50, 1};
  dv_init_dims(&c, big, 1, ATTN_MAX_HEAD_DIM_V, ATTN_F32, false, 81);
  attn_options o;
  attn_options_init(&o);
  void *buf;
  size_t len;
  attn_status st;
  cr_assert_eq(attn_proto_encode_request_safetensors(&c.req, &o, &buf, &len, &st), 0, "%s",
               st.message);
  cr_assert_lt(len, (size_t)64 << 10);
  http_res r;
  http_post(&S, "/attention", ST_CT, buf, len, &r);
  cr_expect_eq(r.status, 413, "%ld %.300s", r.status, r.body);
  cr_expect(r.body && strstr(r.body, "outputs of this request (2048000 bytes)"), "%.300s", r.body);
  http_res_free(&r);
  free(buf);
  /* within the budget the same widths answer */
  dv_free(&c);
  dv_init_dims(&c, small, 1, ATTN_MAX_HEAD_DIM_V, ATTN_F32, false, 82);
  cr_assert_eq(attn_proto_encode_request_safetensors(&c.req, &o, &buf, &len, &st), 0, "%s",
               st.message);
  http_post(&S, "/attention", ST_CT, buf, len, &r);
  cr_expect_eq(r.status, 200, "%ld %.300s", r.status, r.body);
  http_res_free(&r);
  free(buf);
  dv_free(&c);
}
