/*
 * test_v2.c — the Open Inference Protocol front end (/v2) over HTTP: every
 * endpoint, infer in JSON (flat and nested data) and with binary tensors
 * both ways, every dtype and rank, options through "parameters", a subset
 * of outputs, the id, and each refusal with its status and the protocol's
 * error shape {"error": message}. Results are checked against the float64
 * reference (tcheck).
 *
 * Bodies and replies are written and read here with cJSON and by hand, not
 * by proto/: an oracle that shared the codec's code would share its bugs.
 */
#include "harness.h"

#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static srv S;
static void setup(void) { srv_start(&S, "--threads", "2", NULL); }
static void teardown(void) { srv_cleanup(&S); }
TestSuite(v2, .init = setup, .fini = teardown, .timeout = 120);

#define INFER "/v2/models/attention/infer"

static const char *dt_name(attn_dtype dt) {
  return dt == ATTN_F16 ? "FP16" : dt == ATTN_BF16 ? "BF16" : "FP32";
}

/* ---- requests ------------------------------------------------------------- */

typedef struct body {
  char *p;
  size_t len, cap;
} body;

static void put(body *b, const void *s, size_t n) {
  if (b->len + n + 1 > b->cap) {
    b->cap = (b->len + n + 1) * 2;
    b->p = realloc(b->p, b->cap);
    cr_assert(b->p);
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = 0;
}

static void putf(body *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void putf(body *b, const char *fmt, ...) {
  char t[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(t, sizeof t, fmt, ap);
  va_end(ap);
  put(b, t, (size_t)n);
}

/* Which inputs go as binary data (bit i: q, k, v), nested JSON data. */
typedef struct how {
  unsigned binary_in;
  bool nested;
  const char *extra;    /* appended inside the request object, e.g. ", \"id\": \"x\"" */
  const char *more_in;  /* appended inside "inputs" after q, k, v (", {...}") */
  const void *more_bin; /* their binary data, after q, k, v's */
  size_t more_bin_len;
} how;

/* JSON data of one tensor: flat, or nested to its shape. */
static void put_data(body *b, const void *p, attn_dtype dt, const int64_t *shape, int rank,
                     bool nested) {
  size_t n = 1;
  for (int i = 0; i < rank; i++)
    n *= (size_t)shape[i];
  put(b, "[", 1);
  for (size_t i = 0; i < n; i++) {
    size_t opened = 0, stride = 1;
    for (int d = rank - 1; nested && d > 0; d--) {
      stride *= (size_t)shape[d];
      if (i % stride == 0)
        opened++;
    }
    if (i && i % (size_t)shape[rank - 1] == 0 && nested) {
      /* close the levels that end here, reopen as many */
      for (size_t k = 0; k < opened; k++)
        put(b, "]", 1);
      put(b, ",", 1);
      for (size_t k = 0; k < opened; k++)
        put(b, "[", 1);
    } else if (i) {
      put(b, ",", 1);
    } else {
      for (size_t k = 0; k < opened; k++)
        put(b, "[", 1);
    }
    putf(b, "%.9g", attn_load_elem(p, dt, i));
  }
  for (int d = 1; nested && d < rank; d++)
    put(b, "]", 1);
  put(b, "]", 1);
}

/* The request for c: inputs JSON or binary as h says; parameters and
 * outputs as the text params / outputs (NULL: none). *pjson gets the JSON's
 * length (the Inference-Header-Content-Length). */
static char *v2_body(const tcase *c, int rank, const how *h, const char *params,
                     const char *outputs, size_t *plen, size_t *pjson) {
  body b = {0};
  const void *data[3] = {c->q, c->k, c->v};
  size_t bytes[3];
  put(&b, "{\"inputs\": [", 12);
  for (int i = 0; i < 3; i++) {
    int64_t sh[4];
    shape_of(&c->p, i > 0, rank, sh);
    size_t n = 1;
    for (int d = 0; d < rank; d++)
      n *= (size_t)sh[d];
    bytes[i] = n * attn_dtype_size(c->p.dt);
    putf(&b, "%s{\"name\": \"%c\", \"datatype\": \"%s\", \"shape\": [", i ? ", " : "", "qkv"[i],
         dt_name(c->p.dt));
    for (int d = 0; d < rank; d++)
      putf(&b, d ? ", %lld" : "%lld", (long long)sh[d]);
    put(&b, "]", 1);
    if (h->binary_in & 1u << i) {
      putf(&b, ", \"parameters\": {\"binary_data_size\": %zu}}", bytes[i]);
    } else {
      put(&b, ", \"data\": ", 10);
      put_data(&b, data[i], c->p.dt, sh, rank, h->nested);
      put(&b, "}", 1);
    }
  }
  if (h->more_in)
    put(&b, h->more_in, strlen(h->more_in));
  put(&b, "]", 1);
  if (params)
    putf(&b, ", \"parameters\": %s", params);
  if (outputs)
    putf(&b, ", \"outputs\": %s", outputs);
  if (h->extra)
    put(&b, h->extra, strlen(h->extra));
  put(&b, "}", 1);
  *pjson = b.len;
  for (int i = 0; i < 3; i++)
    if (h->binary_in & 1u << i)
      put(&b, data[i], bytes[i]);
  if (h->more_bin)
    put(&b, h->more_bin, h->more_bin_len);
  *plen = b.len;
  return b.p;
}

static int post_v2(const char *path, const char *ctype, const void *body_, size_t len, size_t json,
                   http_res *rs) {
  char hl[64], ct[96];
  const char *hdrs[3] = {NULL, NULL, NULL};
  int n = 0;
  snprintf(ct, sizeof ct, "Content-Type:%s%s", ctype ? " " : "", ctype ? ctype : "");
  hdrs[n++] = ct; /* "Content-Type:" alone: none at all, as tritonclient sends */
  if (json != len) {
    snprintf(hl, sizeof hl, "Inference-Header-Content-Length: %zu", json);
    hdrs[n++] = hl;
  }
  http_req rq = {.method = "POST", .path = path, .headers = hdrs, .body = body_, .len = len};
  return http_do(&S, &rq, rs);
}

/* ---- replies -------------------------------------------------------------- */

/* The reply's output named name into c (o in the dtype, statistics F32):
 * checks datatype and shape, reads data from JSON or from the binary part
 * at *off. false with a message in err. */
static bool read_output(cJSON *o, const http_res *rs, size_t json_len, size_t *off, tcase *c,
                        int rank, char *err, size_t cap) {
  const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(o, "name"));
  int t = !strcmp(name, "o") ? 0 : !strcmp(name, "m") ? 1 : !strcmp(name, "l") ? 2 : 3;
  attn_dtype dt = t ? ATTN_F32 : c->p.dt;
  int r = t ? rank - 1 : rank;
  int64_t sq[4];
  shape_of(&c->p, false, rank, sq);
  cJSON *shape = cJSON_GetObjectItem(o, "shape");
  const char *dtn = cJSON_GetStringValue(cJSON_GetObjectItem(o, "datatype"));
  if (!dtn || strcmp(dtn, dt_name(dt)) || cJSON_GetArraySize(shape) != r) {
    snprintf(err, cap, "output %s: datatype %s or rank %d wrong", name, dtn ? dtn : "?",
             cJSON_GetArraySize(shape));
    return false;
  }
  size_t n = 1;
  for (int i = 0; i < r; i++) {
    n *= (size_t)sq[i];
    if (cJSON_GetArrayItem(shape, i)->valuedouble != (double)sq[i]) {
      snprintf(err, cap, "output %s: shape[%d] wrong", name, i);
      return false;
    }
  }
  float *stat = t == 1 ? c->m : t == 2 ? c->l : c->lse;
  cJSON *data = cJSON_GetObjectItem(o, "data");
  cJSON *bsz = cJSON_GetObjectItem(cJSON_GetObjectItem(o, "parameters"), "binary_data_size");
  size_t esz = attn_dtype_size(dt);
  if (bsz) {
    if ((size_t)bsz->valuedouble != n * esz || json_len + *off + n * esz > rs->len) {
      snprintf(err, cap, "output %s: binary_data_size %g wrong or past the body", name,
               bsz->valuedouble);
      return false;
    }
    memcpy(t ? (void *)stat : c->o, rs->body + json_len + *off, n * esz);
    *off += n * esz;
    return true;
  }
  if (cJSON_GetArraySize(data) != (int)n) {
    snprintf(err, cap, "output %s: %d values, want %zu", name, cJSON_GetArraySize(data), n);
    return false;
  }
  size_t i = 0;
  for (cJSON *e = data->child; e; e = e->next, i++) {
    double v = cJSON_IsNull(e) ? -INFINITY : e->valuedouble;
    if (t == 0)
      attn_store_elem(c->o, dt, i, (float)v);
    else
      stat[i] = (float)v;
  }
  return true;
}

/* Checks a 200 reply: outputs exactly `want` (bits o, m, l, lse), those in
 * `binary` as binary data, read into c's outputs; with check, their values
 * against the float64 reference of c. Returns the parsed JSON part (the
 * caller frees it). */
static cJSON *read_infer(const http_res *rs, tcase *c, int rank, const char *model, unsigned want,
                         unsigned binary, bool check, const char *what) {
  char err[400] = "", hl[32] = "", ct[64] = "", d[200];
  tdesc(&c->p, d, sizeof d);
  cr_assert_eq(rs->status, 200, "%s %s: status %ld: %.300s", what, d, rs->status,
               rs->body ? rs->body : rs->error);
  bool has_hl = http_header(rs, "Inference-Header-Content-Length", hl, sizeof hl);
  http_header(rs, "Content-Type", ct, sizeof ct);
  cr_expect_eq(has_hl, binary != 0, "%s: Inference-Header-Content-Length %s", what,
               has_hl ? "present without binary outputs" : "missing");
  cr_expect(!strncmp(ct, binary ? "application/octet-stream" : "application/json", 16),
            "%s: Content-Type %s", what, ct);
  size_t json_len = has_hl ? strtoull(hl, NULL, 10) : rs->len, off = 0;
  cr_assert_leq(json_len, rs->len);
  cJSON *j = cJSON_ParseWithLength(rs->body, json_len);
  cr_assert(cJSON_IsObject(j), "%s: the reply's JSON does not parse", what);
  cr_expect_str_eq(cJSON_GetStringValue(cJSON_GetObjectItem(j, "model_name")), model);
  cr_expect_str_eq(cJSON_GetStringValue(cJSON_GetObjectItem(j, "model_version")), "1");
  tcase_poison(c);
  unsigned got = 0, got_bin = 0;
  cJSON *o;
  cJSON_ArrayForEach(o, cJSON_GetObjectItem(j, "outputs")) {
    const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(o, "name"));
    int t = !name                  ? -1
            : !strcmp(name, "o")   ? 0
            : !strcmp(name, "m")   ? 1
            : !strcmp(name, "l")   ? 2
            : !strcmp(name, "lse") ? 3
                                   : -1;
    cr_assert(t >= 0, "%s: output without a known name", what);
    got |= 1u << t;
    got_bin |= cJSON_GetObjectItem(o, "parameters") ? 1u << t : 0;
    cr_assert(read_output(o, rs, json_len, &off, c, rank, err, sizeof err), "%s %s: %s", what, d,
              err);
  }
  cr_expect_eq(got, want, "%s: outputs %#x, want %#x", what, got, want);
  cr_expect_eq(got_bin, binary, "%s: binary outputs %#x, want %#x", what, got_bin, binary);
  cr_expect_eq(json_len + off, rs->len, "%s: bytes past the outputs", what);
  if (!check)
    return j;
  terr e = tcheck(c);
  if (want & 1)
    cr_expect(e.o <= ttol(c->p.dt), "%s %s: O error %.3g (tol %.0e)", what, d, e.o, ttol(c->p.dt));
  if (want == 0xf)
    cr_expect(e.stats <= 1e-5 && e.masked_ok, "%s %s: stats error %.3g, masked %d", what, d,
              e.stats, e.masked_ok);
  return j;
}

static cJSON *expect_infer(const http_res *rs, tcase *c, int rank, const char *model, unsigned want,
                           unsigned binary, const char *what) {
  return read_infer(rs, c, rank, model, want, binary, true, what);
}

/* An error reply of the protocol: status, JSON {"error": "<message>"} and
 * the message holding `part`. */
static void expect_v2_error(const http_res *rs, long status, const char *part, const char *what) {
  char ct[64] = "";
  cr_expect_eq(rs->status, status, "%s: status %ld, want %ld: %.300s", what, rs->status, status,
               rs->body ? rs->body : rs->error);
  http_header(rs, "Content-Type", ct, sizeof ct);
  cr_expect(!strncasecmp(ct, "application/json", 16), "%s: Content-Type %s", what, ct);
  cJSON *j = cJSON_ParseWithLength(rs->body ? rs->body : "", rs->len);
  const char *m = cJSON_GetStringValue(cJSON_GetObjectItem(j, "error"));
  cr_expect(m && cJSON_GetArraySize(j) == 1, "%s: not {\"error\": message}: %.300s", what,
            rs->body ? rs->body : "");
  if (m && part)
    cr_expect(strstr(m, part), "%s: message \"%s\" lacks \"%s\"", what, m, part);
  cJSON_Delete(j);
}

/* ---- endpoints ------------------------------------------------------------- */

static cJSON *get_json(const char *path, long status) {
  http_res rs;
  cr_assert_eq(http_get(&S, path, &rs), 0);
  cr_expect_eq(rs.status, status, "GET %s: %ld %.200s", path, rs.status, rs.body);
  cJSON *j = cJSON_ParseWithLength(rs.body, rs.len);
  http_res_free(&rs);
  cr_assert(j, "GET %s: not JSON", path);
  return j;
}

Test(v2, server_metadata_and_health) {
  cJSON *j = get_json("/v2", 200);
  cr_expect_str_eq(cJSON_GetStringValue(cJSON_GetObjectItem(j, "name")), "attnd");
  cr_expect(cJSON_IsString(cJSON_GetObjectItem(j, "version")));
  int found = 0;
  cJSON *e;
  cJSON_ArrayForEach(e, cJSON_GetObjectItem(j, "extensions")) {
    found += !strcmp(e->valuestring, "binary_tensor_data") || !strcmp(e->valuestring, "parameters");
  }
  cr_expect_eq(found, 2, "extensions lack binary_tensor_data or parameters");
  cJSON_Delete(j);
  j = get_json("/v2/health/live", 200);
  cr_expect(cJSON_IsTrue(cJSON_GetObjectItem(j, "live")));
  cJSON_Delete(j);
  j = get_json("/v2/health/ready", 200);
  cr_expect(cJSON_IsTrue(cJSON_GetObjectItem(j, "ready")));
  cJSON_Delete(j);
}

Test(v2, model_metadata_config_and_ready) {
  static const char *const models[3] = {"attention", "attention_fp16", "attention_bf16"};
  static const char *const dts[3] = {"FP32", "FP16", "BF16"};
  for (int m = 0; m < 3; m++) {
    char path[128];
    for (int v = 0; v < 2; v++) {
      snprintf(path, sizeof path, "/v2/models/%s%s", models[m], v ? "/versions/1" : "");
      cJSON *j = get_json(path, 200);
      cr_expect_str_eq(cJSON_GetStringValue(cJSON_GetObjectItem(j, "name")), models[m]);
      cJSON *ins = cJSON_GetObjectItem(j, "inputs"), *outs = cJSON_GetObjectItem(j, "outputs");
      /* q, k, v: the optional inputs are not listed (perf_analyzer would
       * generate data for them; see put_tensors() in proto/v2_reply.c) */
      cr_expect_eq(cJSON_GetArraySize(ins), 3);
      cr_expect_eq(cJSON_GetArraySize(outs), 4);
      for (int i = 0; i < 3; i++) {
        cJSON *in = cJSON_GetArrayItem(ins, i);
        char name[2] = {"qkv"[i], 0};
        cr_expect_str_eq(cJSON_GetStringValue(cJSON_GetObjectItem(in, "name")), name);
        cr_expect_str_eq(cJSON_GetStringValue(cJSON_GetObjectItem(in, "datatype")), dts[m]);
        cr_expect_eq(cJSON_GetArraySize(cJSON_GetObjectItem(in, "shape")), 4);
        cr_expect_eq(cJSON_GetArrayItem(cJSON_GetObjectItem(in, "shape"), 0)->valuedouble, -1);
      }
      static const char *const on[4] = {"o", "m", "l", "lse"};
      for (int i = 0; i < 4; i++) {
        cJSON *o = cJSON_GetArrayItem(outs, i);
        cr_expect_str_eq(cJSON_GetStringValue(cJSON_GetObjectItem(o, "name")), on[i]);
        cr_expect_str_eq(cJSON_GetStringValue(cJSON_GetObjectItem(o, "datatype")),
                         i ? "FP32" : dts[m]);
      }
      cJSON_Delete(j);
      snprintf(path, sizeof path, "/v2/models/%s%s/ready", models[m], v ? "/versions/1" : "");
      j = get_json(path, 200);
      cr_expect(cJSON_IsTrue(cJSON_GetObjectItem(j, "ready")));
      cJSON_Delete(j);
    }
    snprintf(path, sizeof path, "/v2/models/%s/config", models[m]);
    cJSON *j = get_json(path, 200);
    cr_expect_eq(cJSON_GetObjectItem(j, "max_batch_size")->valuedouble, 0);
    char want[32];
    snprintf(want, sizeof want, "TYPE_%s", dts[m]);
    cr_expect_str_eq(cJSON_GetStringValue(cJSON_GetObjectItem(
                         cJSON_GetArrayItem(cJSON_GetObjectItem(j, "input"), 0), "data_type")),
                     want);
    cJSON_Delete(j);
  }
}

Test(v2, unknown_paths_models_versions_and_methods) {
  static const struct {
    const char *path, *part;
  } cases[] = {
      {"/v2/models/gpt", "unknown model \"gpt\""},
      {"/v2/models/attention/versions/2", "only version 1"},
      {"/v2/models/attention/versions/2/infer", "only version 1"},
      {"/v2/models/attention/stats", "no such path"},
      {"/v2/repository/index", "no such path"},
      {"/v2/", "no such path"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    http_res rs;
    cr_assert_eq(http_get(&S, cases[i].path, &rs), 0);
    expect_v2_error(&rs, 404, cases[i].part, cases[i].path);
    http_res_free(&rs);
  }
  http_res rs;
  cr_assert_eq(http_get(&S, INFER, &rs), 0);
  expect_v2_error(&rs, 405, "GET is not allowed", "GET infer");
  http_res_free(&rs);
  cr_assert_eq(http_post(&S, "/v2/models/attention", "application/json", "{}", 2, &rs), 0);
  expect_v2_error(&rs, 405, "POST is not allowed", "POST metadata");
  http_res_free(&rs);
}

/* ---- infer ------------------------------------------------------------------- */

/* One infer round trip of p at rank, as h says, all outputs. */
static void infer_case(tprob p, int rank, const how *h, const char *params, bool bin_out) {
  p.stats = true;
  tcase c;
  tcase_init(&c, &p, 7 + (uint64_t)rank);
  size_t len, json;
  char prm[300];
  snprintf(prm, sizeof prm, "{%s%s%s}", params ? params : "", params && bin_out ? ", " : "",
           bin_out ? "\"binary_data_output\": true" : "");
  char *b = v2_body(&c, rank, h, prm, NULL, &len, &json);
  http_res rs;
  cr_assert_eq(post_v2(INFER, NULL, b, len, json, &rs), 0);
  cJSON *j =
      expect_infer(&rs, &c, rank, "attention", 0xf, bin_out ? 0xf : 0, params ? params : "infer");
  cJSON_Delete(j);
  http_res_free(&rs);
  free(b);
  tcase_free(&c);
}

Test(v2, json_every_dtype_and_rank) {
  attn_dtype dts[3] = {ATTN_F32, ATTN_F16, ATTN_BF16};
  for (int d = 0; d < 3; d++)
    for (int rank = 2; rank <= 4; rank++) {
      tprob p =
          tprob_make(rank == 4 ? 2 : 1, rank >= 3 ? 4 : 1, rank >= 3 ? 2 : 1, 13, 17, 24, dts[d]);
      infer_case(p, rank, &(how){0}, NULL, false);
    }
}

Test(v2, nested_json_data) {
  tprob p = tprob_make(2, 2, 1, 5, 7, 8, ATTN_F32);
  infer_case(p, 4, &(how){.nested = true}, NULL, false);
  infer_case(tprob_make(1, 1, 1, 3, 4, 5, ATTN_BF16), 2, &(how){.nested = true}, NULL, false);
}

Test(v2, binary_both_ways_every_dtype) {
  attn_dtype dts[3] = {ATTN_F32, ATTN_F16, ATTN_BF16};
  for (int d = 0; d < 3; d++) {
    tprob p = tprob_make(1, 4, 2, 33, 40, 64, dts[d]);
    infer_case(p, 4, &(how){.binary_in = 7}, NULL, true);
    /* k alone binary: its bytes are at an arbitrary (often odd) offset */
    infer_case(p, 3, &(how){.binary_in = 2, .extra = ", \"id\": \"x\""}, NULL, d == 1);
  }
}

Test(v2, options_through_parameters) {
  tprob p = tprob_make(1, 2, 1, 20, 29, 16, ATTN_F32);
  p.causal = true;
  infer_case(p, 3, &(how){0}, "\"causal\": true", false);
  p.causal = false;
  p.wl = 3;
  p.wr = 0; /* with Nkv > Nq some rows see keys; the reference checks them all */
  infer_case(p, 3, &(how){.binary_in = 7}, "\"window_left\": 3, \"window_right\": 0", true);
  p.wl = p.wr = -1;
  p.scale = 0.3;
  infer_case(p, 3, &(how){0}, "\"scale\": 0.3, \"backend\": \"reference\"", false);
  /* rows with no visible key: m and lse -inf (JSON null), O zero */
  p.scale = NAN;
  p.nq = 12;
  p.nkv = 12;
  p.wl = 0;
  p.wr = -1;
  p.causal = true; /* each row sees only its own key */
  infer_case(p, 3, &(how){0}, "\"window_left\": 0, \"causal\": true", false);
}

Test(v2, subset_of_outputs_and_id) {
  tprob p = tprob_make(1, 2, 2, 9, 9, 8, ATTN_F16);
  p.stats = true;
  tcase c;
  tcase_init(&c, &p, 3);
  size_t len, json;
  char *b = v2_body(&c, 4, &(how){.extra = ", \"id\": \"req-\\u00e9 7\""}, NULL,
                    "[{\"name\": \"lse\", \"parameters\": {\"binary_data\": true}}, "
                    "{\"name\": \"o\"}]",
                    &len, &json);
  http_res rs;
  cr_assert_eq(post_v2(INFER, "application/json", b, len, json, &rs), 0);
  cJSON *j = expect_infer(&rs, &c, 4, "attention", 1u | 8u, 8u, "o and lse");
  cr_expect_str_eq(cJSON_GetStringValue(cJSON_GetObjectItem(j, "id")), "req-\xc3\xa9 7");
  cJSON_Delete(j);
  http_res_free(&rs);
  free(b);
  /* o alone, binary through binary_data_output; the body has no id, so
   * the reply's is the request's (X-Request-Id, here one the server made) */
  b = v2_body(&c, 4, &(how){0}, "{\"binary_data_output\": true}", "[{\"name\": \"o\"}]", &len,
              &json);
  cr_assert_eq(post_v2("/v2/models/attention_bf16/versions/1/infer", NULL, b, len, json, &rs), 0);
  j = expect_infer(&rs, &c, 4, "attention_bf16", 1u, 1u, "o alone");
  char rid[160] = "";
  cr_expect(http_header(&rs, "X-Request-Id", rid, sizeof rid), "no X-Request-Id in the reply");
  cr_expect(rid[0] && cJSON_GetStringValue(cJSON_GetObjectItem(j, "id")) &&
                !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(j, "id")), rid),
            "the reply's id is not the request's %s", rid);
  cJSON_Delete(j);
  http_res_free(&rs);
  free(b);
  tcase_free(&c);
}

Test(v2, metrics_label_the_route) {
  tprob p = tprob_make(1, 1, 1, 4, 4, 4, ATTN_F32);
  infer_case(p, 2, &(how){0}, NULL, false);
  http_res rs;
  cr_assert_eq(http_get(&S, "/v2/models/whatever-1", &rs), 0);
  http_res_free(&rs);
  const char *infer[] = {"path=/v2/models/*/infer", "model=attention", "code=200", NULL};
  const char *rest[] = {"path=/v2/*", "code=404", NULL};
  /* a request is counted once its connection finishes with it: wait */
  cr_expect(srv_wait_metric_ge(&S, "attnd_requests_total", infer, 1, 10));
  cr_expect(srv_wait_metric_ge(&S, "attnd_requests_total", rest, 1, 10));
}

/* ---- refusals ------------------------------------------------------------------ */

/* A small valid problem's body with one piece swapped: from -> to in the
 * JSON text. */
static char *swap_body(const char *json, const char *from, const char *to) {
  const char *at = strstr(json, from);
  cr_assert(at, "no \"%s\" in the body", from);
  size_t n = strlen(json) - strlen(from) + strlen(to);
  char *s = malloc(n + 1);
  snprintf(s, n + 1, "%.*s%s%s", (int)(at - json), json, to, at + strlen(from));
  return s;
}

static const char small[] =
    "{\"inputs\": [{\"name\": \"q\", \"shape\": [2, 2], \"datatype\": \"FP32\", \"data\": [1, 2, "
    "3, 4]}, {\"name\": \"k\", \"shape\": [2, 2], \"datatype\": \"FP32\", \"data\": [1, 0, 0, "
    "1]}, {\"name\": \"v\", \"shape\": [2, 2], \"datatype\": \"FP32\", \"data\": [5, 6, 7, 8]}], "
    "\"parameters\": {\"causal\": false}, \"outputs\": [{\"name\": \"o\"}]}";

Test(v2, json_refusals) {
  static const struct {
    const char *from, *to;
    long status;
    const char *part;
  } cases[] = {
      {"{\"inputs\"", "[{\"inputs\"", 400, "invalid JSON"},
      {"\"causal\": false", "\"casual\": false", 422, "unknown parameter \"casual\""},
      {"\"causal\": false", "\"stats\": true", 422, "unknown parameter \"stats\""},
      {"\"causal\": false", "\"sequence_id\": 3", 422, "reserved"},
      {"\"causal\": false", "\"priority\": 1", 422, "reserved"},
      {"\"causal\": false", "\"causal\": \"yes\"", 422, "true or false"},
      {"\"causal\": false", "\"window_left\": -2", 422, "window_left"},
      {"\"causal\": false", "\"backend\": \"tpu\"", 422, "backend"},
      {"\"datatype\": \"FP32\", \"data\": [1, 2", "\"datatype\": \"FP64\", \"data\": [1, 2", 422,
       "datatype \"FP64\" is not supported"},
      {"\"datatype\": \"FP32\", \"data\": [1, 2", "\"datatype\": \"INT8\", \"data\": [1, 2", 422,
       "INT8"},
      {"\"datatype\": \"FP32\", \"data\": [1, 2", "\"datatype\": \"BYTES\", \"data\": [1, 2", 422,
       "BYTES"},
      {"\"shape\": [2, 2], \"datatype\": \"FP32\", \"data\": [1, 2",
       "\"shape\": [4], \"datatype\": \"FP32\", \"data\": [1, 2", 422, "1 dimensions"},
      {"\"shape\": [2, 2], \"datatype\": \"FP32\", \"data\": [1, 2",
       "\"shape\": [1, 2, 2], \"datatype\": \"FP32\", \"data\": [1, 2", 422, "dimensions"},
      {"[1, 2, 3, 4]", "[1, 2, 3]", 422, "needs 4 values, data has 3"},
      {"[1, 2, 3, 4]", "[[1, 2], [3]]", 422, "row"},
      {"[1, 2, 3, 4]", "[1, 2, 3, 1e999]", 422, "not finite"},
      {"[1, 2, 3, 4]", "[1, 2, 3, \"4\"]", 422, "a string"},
      {"{\"name\": \"q\"", "{\"name\": \"x\"", 422, "the name must be"},
      {"{\"name\": \"k\"", "{\"name\": \"q\"", 422, "given twice"},
      {"{\"name\": \"o\"}", "{\"name\": \"attn\"}", 422, "the name must be"},
      {"{\"name\": \"o\"}", "{\"name\": \"o\", \"parameters\": {\"classification\": 2}}", 422,
       "classification"},
      {"{\"name\": \"o\"}", "{\"name\": \"o\"}, {\"name\": \"o\"}", 400, "twice"},
      {"\"outputs\": [{\"name\": \"o\"}]", "\"outputs\": []", 400, "non-empty"},
      {"\"outputs\"", "\"output\"", 400, "unknown key \"output\""},
      {"[5, 6, 7, 8]", "[5, 6, 7, 8], \"parameters\": {\"binary_data_size\": 16}", 422, "both"},
      {"[5, 6, 7, 8]", "[5, 6, 7, 8], \"parameters\": {\"shared_memory_region\": \"r\"}", 422,
       "not supported"},
      {"\"shape\": [2, 2], \"datatype\": \"FP32\", \"data\": [1, 0",
       "\"shape\": [2, 3], \"datatype\": \"FP32\", \"data\": [1, 0, 0, 1, 1, 1]}, {\"name\": "
       "\"zz\", \"shape\": [1], \"datatype\": \"FP32\", \"data\": [0",
       422, "the name must be"},
      {"\"shape\": [2, 2], \"datatype\": \"FP32\", \"data\": [1, 0, 0, 1]",
       "\"shape\": [2, 1], \"datatype\": \"FP32\", \"data\": [1, 0]", 422, "\"k\""},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char *b = swap_body(small, cases[i].from, cases[i].to);
    http_res rs;
    cr_assert_eq(post_v2(INFER, NULL, b, strlen(b), strlen(b), &rs), 0);
    char what[160];
    snprintf(what, sizeof what, "%s -> %.60s", cases[i].from, cases[i].to);
    expect_v2_error(&rs, cases[i].status, cases[i].part, what);
    http_res_free(&rs);
    free(b);
  }
  /* q missing; then no inputs; then an empty body */
  const char *missing =
      "{\"inputs\": [{\"name\": \"k\", \"shape\": [1, 1], \"datatype\": \"FP32\", \"data\": [1]}, "
      "{\"name\": \"v\", \"shape\": [1, 1], \"datatype\": \"FP32\", \"data\": [1]}]}";
  const struct {
    const char *body, *part;
    long status;
  } more[] = {{missing, "input \"q\" is missing", 422},
              {"{\"id\": \"x\"}", "no \"inputs\"", 422},
              {"", "no body", 400},
              {"{\"inputs\": [], \"id\": 5}", "\"id\" must be a string", 400}};
  for (size_t i = 0; i < sizeof more / sizeof *more; i++) {
    http_res rs;
    size_t n = strlen(more[i].body);
    cr_assert_eq(post_v2(INFER, NULL, more[i].body, n, n, &rs), 0);
    expect_v2_error(&rs, more[i].status, more[i].part, more[i].body);
    http_res_free(&rs);
  }
}

Test(v2, binary_framing_refusals) {
  tprob p = tprob_make(1, 1, 1, 4, 4, 4, ATTN_F32);
  tcase c;
  tcase_init(&c, &p, 1);
  size_t len, json;
  char *b = v2_body(&c, 2, &(how){.binary_in = 7}, NULL, NULL, &len, &json);
  http_res rs;
  /* one byte short, one byte extra, the header past the body, not a number */
  cr_assert_eq(post_v2(INFER, NULL, b, len - 1, json, &rs), 0);
  expect_v2_error(&rs, 400, "only 63 follow", "short");
  http_res_free(&rs);
  char *longer = malloc(len + 1);
  memcpy(longer, b, len);
  longer[len] = 0;
  cr_assert_eq(post_v2(INFER, NULL, longer, len + 1, json, &rs), 0);
  expect_v2_error(&rs, 400, "add up to 192", "extra byte");
  http_res_free(&rs);
  cr_assert_eq(post_v2(INFER, NULL, b, len, len + 5, &rs), 0);
  expect_v2_error(&rs, 400, "past the end", "header past the body");
  http_res_free(&rs);
  const char *hdrs[] = {"Content-Type:", "Inference-Header-Content-Length: 12abc", NULL};
  http_req rq = {.method = "POST", .path = INFER, .headers = hdrs, .body = b, .len = len};
  cr_assert_eq(http_do(&S, &rq, &rs), 0);
  expect_v2_error(&rs, 400, "not a byte count", "junk header");
  http_res_free(&rs);
  /* binary data without the header: the JSON is the whole body, which then
   * is not JSON */
  cr_assert_eq(post_v2(INFER, NULL, b, len, len, &rs), 0);
  expect_v2_error(&rs, 400, "invalid JSON", "no header");
  http_res_free(&rs);
  /* binary_data_size that does not match the shape */
  char *j = malloc(json + 1);
  memcpy(j, b, json);
  j[json] = 0;
  char *bad = swap_body(j, "\"binary_data_size\": 64", "\"binary_data_size\": 60");
  size_t bl = strlen(bad);
  bad = realloc(bad, bl + (len - json));
  memcpy(bad + bl, b + json, len - json);
  cr_assert_eq(post_v2(INFER, NULL, bad, bl + len - json - 4, bl, &rs), 0);
  expect_v2_error(&rs, 400, "does not match its shape", "binary_data_size");
  http_res_free(&rs);
  /* a NaN in binary data */
  float nan = NAN;
  memcpy(b + json + 4, &nan, 4);
  cr_assert_eq(post_v2(INFER, NULL, b, len, json, &rs), 0);
  expect_v2_error(&rs, 422, "non-finite", "NaN");
  http_res_free(&rs);
  /* another content type */
  cr_assert_eq(post_v2(INFER, "text/plain", b, len, json, &rs), 0);
  expect_v2_error(&rs, 415, "text/plain", "text/plain");
  http_res_free(&rs);
  free(j);
  free(bad);
  free(longer);
  free(b);
  tcase_free(&c);
}

Test(v2, too_large, .init = NULL) {
  srv_start(&S, "--max-body", "1000", NULL);
  char big[2000];
  memset(big, ' ', sizeof big);
  http_res rs;
  cr_assert_eq(post_v2(INFER, NULL, big, sizeof big, sizeof big, &rs), 0);
  expect_v2_error(&rs, 413, "--max-body", "over --max-body");
  http_res_free(&rs);
}

/* ---- variable-length batches ------------------------------------------------ */

enum { VSEQ = 4 };
/* A sequence with no query and one with no key among them. */
static const int64_t vlq[VSEQ] = {5, 0, 17, 9}, vlk[VSEQ] = {5, 9, 30, 0};

/* The packed reply in all, sequence by sequence against the float64
 * reference of that sequence alone (its inputs copied out of the packed
 * ones, so the check does not share the engine's splitting). */
static void check_varlen(const tcase *all, const int64_t *cuq, const int64_t *cuk,
                         const char *what) {
  const tprob *ap = &all->p;
  const size_t row = (size_t)ap->d * attn_dtype_size(ap->dt);
  for (int b = 0; b < VSEQ; b++) {
    if (!vlq[b])
      continue;
    if (!vlk[b]) { /* no key: O = 0 and lse = -inf */
      bool ok = true;
      for (int64_t h = 0; h < ap->hq; h++)
        for (int64_t i = 0; i < vlq[b]; i++) {
          int64_t at = h * ap->nq + cuq[b] + i;
          ok &=
              all->lse[at] == -INFINITY && attn_load_elem(all->o, ap->dt, (size_t)at * ap->d) == 0;
        }
      cr_expect(ok, "%s: sequence %d with no key is not O = 0, lse = -inf", what, b);
      continue;
    }
    tprob p = *ap;
    p.nq = vlq[b];
    p.nkv = vlk[b];
    tcase c;
    tcase_init(&c, &p, 90 + (uint64_t)b);
    trows_copy(all->q, c.q, p.hq, ap->nq, cuq[b], p.nq, row, true);
    trows_copy(all->k, c.k, p.hkv, ap->nkv, cuk[b], p.nkv, row, true);
    trows_copy(all->v, c.v, p.hkv, ap->nkv, cuk[b], p.nkv, row, true);
    trows_copy(all->o, c.o, p.hq, ap->nq, cuq[b], p.nq, row, true);
    trows_copy(all->m, c.m, p.hq, ap->nq, cuq[b], p.nq, 4, true);
    trows_copy(all->l, c.l, p.hq, ap->nq, cuq[b], p.nq, 4, true);
    trows_copy(all->lse, c.lse, p.hq, ap->nq, cuq[b], p.nq, 4, true);
    terr e = tcheck(&c);
    cr_expect(e.o <= ttol(p.dt) && e.stats <= 1e-5 && e.masked_ok,
              "%s: sequence %d: O error %.3g (tol %.0e), stats %.3g, masked rows %s", what, b, e.o,
              ttol(p.dt), e.stats, e.masked_ok ? "ok" : "WRONG");
    tcase_free(&c);
  }
}

/* The cu_seqlens inputs' text (JSON data, or binary of 4 or 8 bytes an
 * offset into bin) for offsets cuq, cuk. */
static void cu_inputs(char *txt, size_t cap, unsigned char *bin, size_t *blen, const int64_t *cuq,
                      const int64_t *cuk, int bytes, bool binary) {
  size_t o = 0;
  *blen = 0;
  for (int t = 0; t < 2; t++) {
    const int64_t *cu = t ? cuk : cuq;
    o +=
        (size_t)snprintf(txt + o, cap - o,
                         ", {\"name\": \"cu_seqlens_%s\", \"datatype\": \"INT%d\", \"shape\": [%d]",
                         t ? "kv" : "q", bytes * 8, VSEQ + 1);
    if (binary) {
      o += (size_t)snprintf(txt + o, cap - o, ", \"parameters\": {\"binary_data_size\": %d}}",
                            bytes * (VSEQ + 1));
      for (int i = 0; i <= VSEQ; i++) {
        int32_t x32 = (int32_t)cu[i];
        memcpy(bin + *blen, bytes == 4 ? (const void *)&x32 : (const void *)&cu[i], (size_t)bytes);
        *blen += (size_t)bytes;
      }
      continue;
    }
    o += (size_t)snprintf(txt + o, cap - o, ", \"data\": [");
    for (int i = 0; i <= VSEQ; i++)
      o += (size_t)snprintf(txt + o, cap - o, i ? ", %lld" : "%lld", (long long)cu[i]);
    o += (size_t)snprintf(txt + o, cap - o, "]}");
  }
}

Test(v2, varlen_json_and_binary_int32_and_int64) {
  int64_t cuq[VSEQ + 1] = {0}, cuk[VSEQ + 1] = {0};
  for (int b = 0; b < VSEQ; b++) {
    cuq[b + 1] = cuq[b] + vlq[b];
    cuk[b + 1] = cuk[b] + vlk[b];
  }
  for (int k = 0; k < 8; k++) {
    bool binary = k & 1, causal = k & 4;
    int bytes = k & 2 ? 8 : 4;
    tprob p = tprob_make(1, 4, 2, cuq[VSEQ], cuk[VSEQ], 16, k == 5 ? ATTN_BF16 : ATTN_F32);
    p.causal = causal;
    p.stats = true;
    tcase all;
    tcase_init(&all, &p, 80 + (uint64_t)k);
    char txt[1024], what[96];
    unsigned char bin[2 * 8 * (VSEQ + 1)];
    size_t blen, len, json;
    cu_inputs(txt, sizeof txt, bin, &blen, cuq, cuk, bytes, binary);
    how h = {.binary_in = binary ? 7 : 0, .more_in = txt, .more_bin = bin, .more_bin_len = blen};
    char *b = v2_body(&all, 3, &h, causal ? "{\"causal\": true}" : NULL, NULL, &len, &json);
    snprintf(what, sizeof what, "varlen %s INT%d%s %s", binary ? "binary" : "JSON", bytes * 8,
             causal ? " causal" : "", attn_dtype_name(p.dt));
    http_res rs;
    cr_assert_eq(post_v2(INFER, binary ? NULL : "application/json", b, len, json, &rs), 0);
    cJSON *j = read_infer(&rs, &all, 3, "attention", 0xf, 0, false, what);
    check_varlen(&all, cuq, cuk, what);
    cJSON_Delete(j);
    http_res_free(&rs);
    free(b);
    tcase_free(&all);
  }
}

Test(v2, varlen_refusals) {
  static const struct {
    const char *cu;
    long status;
    const char *part;
  } cases[] = {
      {", {\"name\": \"cu_seqlens_q\", \"datatype\": \"FP32\", \"shape\": [2], \"data\": [0, 4]}",
       422, "use INT32 or INT64"},
      {", {\"name\": \"cu_seqlens_q\", \"datatype\": \"INT32\", \"shape\": [2], \"data\": [0, 4]}",
       422, "needs both cu_seqlens_q and cu_seqlens_kv"},
      {", {\"name\": \"cu_seqlens_q\", \"datatype\": \"INT32\", \"shape\": [1, 2], \"data\": [0, "
       "4]}",
       422, "use [B+1]"},
      {", {\"name\": \"cu_seqlens_q\", \"datatype\": \"INT32\", \"shape\": [2], \"data\": [0, "
       "3e9]}",
       422, "within I32"},
      {", {\"name\": \"cu_seqlens_q\", \"datatype\": \"INT64\", \"shape\": [3], \"data\": [0, 2]}",
       422, "data must be an array of 3 integers"},
      {", {\"name\": \"cu_seqlens_q\", \"datatype\": \"INT32\", \"shape\": [2], \"data\": [0, 3]}, "
       "{\"name\": \"cu_seqlens_kv\", \"datatype\": \"INT32\", \"shape\": [2], \"data\": [0, 4]}",
       422, "the last offset must equal"},
      {", {\"name\": \"cu_seqlens_q\", \"datatype\": \"INT32\", \"shape\": [3], \"data\": [0, 3, "
       "4]}, {\"name\": \"cu_seqlens_kv\", \"datatype\": \"INT32\", \"shape\": [2], \"data\": [0, "
       "4]}",
       422, "cu_seqlens_q has 3 offsets but cu_seqlens_kv 2"},
      {", {\"name\": \"cu_seqlens_q\", \"datatype\": \"INT32\", \"shape\": [3], \"data\": [0, 3, "
       "1]}, {\"name\": \"cu_seqlens_kv\", \"datatype\": \"INT32\", \"shape\": [3], \"data\": [0, "
       "2, 4]}",
       422, "cu_seqlens_q"},
      {", {\"name\": \"cu_seqlens_q\", \"datatype\": \"INT32\", \"shape\": [2], \"parameters\": "
       "{\"binary_data_size\": 16}}",
       400, "binary_data_size 16 does not match"},
      {", {\"name\": \"cu_seqlens_kv\", \"datatype\": \"INT32\", \"shape\": [2], \"data\": [0, "
       "4]}, "
       "{\"name\": \"cu_seqlens_kv\", \"datatype\": \"INT32\", \"shape\": [2], \"data\": [0, 4]}",
       422, "given twice"},
  };
  tprob p = tprob_make(1, 2, 1, 4, 4, 8, ATTN_F32);
  tcase c;
  tcase_init(&c, &p, 3);
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    size_t len, json;
    char *b = v2_body(&c, 3, &(how){.more_in = cases[i].cu}, NULL, NULL, &len, &json);
    http_res rs;
    cr_assert_eq(post_v2(INFER, "application/json", b, len, json, &rs), 0);
    expect_v2_error(&rs, cases[i].status, cases[i].part, cases[i].cu);
    http_res_free(&rs);
    free(b);
  }
  /* q, k, v of rank 4 with offsets: the sequences must be concatenated */
  size_t len, json;
  char *b = v2_body(&c, 4,
                    &(how){.more_in = ", {\"name\": \"cu_seqlens_q\", \"datatype\": \"INT32\", "
                                      "\"shape\": [2], \"data\": [0, 4]}, {\"name\": "
                                      "\"cu_seqlens_kv\", \"datatype\": \"INT64\", \"shape\": [2], "
                                      "\"data\": [0, 4]}"},
                    NULL, NULL, &len, &json);
  http_res rs;
  cr_assert_eq(post_v2(INFER, "application/json", b, len, json, &rs), 0);
  expect_v2_error(&rs, 422, "not rank 4", "rank 4 with cu_seqlens");
  http_res_free(&rs);
  free(b);
  tcase_free(&c);
}
