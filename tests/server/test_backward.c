/*
 * test_backward.c — POST /attention/backward over HTTP against the float64
 * reference backward (attn_reference_backward): both codecs, every dtype,
 * ranks 2 to 4, GQA, causal and window masks (with rows that see no key),
 * lse given or not, Accept negotiation, and every refusal the wire format
 * names (missing, misshapen or mistyped tensors, non-finite values, stats,
 * unknown tensors, 405, 413), the deadline, and the metrics' path label.
 *
 * Requests use the default backend (auto: cpu here, cuda on a machine with
 * a device); the timeout test names the reference backend on
 * build/tests/attnd-hold, which holds the job until it is canceled, so a
 * one-second deadline falls mid-job however fast the machine.
 *
 * The bodies and replies are written and read here, not by proto/: an
 * oracle that shared the codecs' code would share their bugs.
 */
#include "harness.h"
#include "proto.h" /* attn_sbuf only, a text buffer: no codec */

#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static srv S;
static void teardown(void) { srv_cleanup(&S); }
TestSuite(backward, .fini = teardown, .timeout = 120);

#define JSON_CT "application/json"
#define ST_CT "application/octet-stream"
/* The backend every request names; see the top of the file. */
#define BACKEND "backend=auto"
#define PATH "/attention/backward?" BACKEND

/* ---- a problem and its float64 gradients ------------------------------------ */

typedef struct bcase {
  tcase c;      /* a backward case (tcase_backward): o the forward's output in the
                   dtype, dout, lse_in the forward's lse (F32 [B, Hq, Nq]) */
  tref_bwd ref; /* the float64 reference backward */
} bcase;

static size_t n_q(const tprob *p) { return (size_t)(p->b * p->hq * p->nq * p->d); }
static size_t n_kv(const tprob *p) { return (size_t)(p->b * p->hkv * p->nkv * p->d); }

static void bcase_init(bcase *bc, const tprob *p, uint64_t seed) {
  attn_status st;
  tcase_init(&bc->c, p, seed);
  cr_assert_eq(tcase_backward(&bc->c, true, ~seed, &st), 0, "%s", st.message);
  bc->c.req.lse_in = NULL; /* the reference's own float64 lse, whether a request sends one or not */
  cr_assert_eq(tref_bwd_compute(&bc->c, &bc->ref, &st), 0, "%s", st.message);
}

static void bcase_free(bcase *bc) {
  tref_bwd_free(&bc->ref);
  tcase_free(&bc->c);
}

/* ---- bodies, written here ---------------------------------------------------- */

/* One tensor of a request body. */
typedef struct part {
  const char *name;
  attn_dtype dt;
  int64_t shape[4];
  int rank;
  const void *data;
} part;

static size_t part_elems(const part *t) {
  size_t n = 1;
  for (int i = 0; i < t->rank; i++)
    n *= (size_t)t->shape[i];
  return n;
}

/* q, k, v, o, do (and lse when with_lse) of bc at rank; returns how many. */
static int bparts(const bcase *bc, int rank, bool with_lse, part t[6]) {
  const tprob *p = &bc->c.p;
  const void *data[6] = {bc->c.q, bc->c.k, bc->c.v, bc->c.o, bc->c.dout, bc->c.lse_in};
  static const char *const names[6] = {"q", "k", "v", "o", "do", "lse"};
  int n = with_lse ? 6 : 5;
  for (int i = 0; i < n; i++) {
    t[i] = (part){names[i], i == 5 ? ATTN_F32 : p->dt, {0}, i == 5 ? rank - 1 : rank, data[i]};
    shape_of(p, i == 1 || i == 2, rank, t[i].shape);
  }
  return n;
}

static void put_shape(attn_sbuf *b, const part *t) {
  attn_sbuf_puts(b, "[");
  for (int i = 0; i < t->rank; i++)
    attn_sbuf_printf(b, i ? ",%lld" : "%lld", (long long)t->shape[i]);
  attn_sbuf_puts(b, "]");
}

/* {"q": {shape, dtype, data}, ... extra}; -inf as null, other non-finite
 * values as 1e999 (which JSON readers take for infinity). */
static char *bjson(const part *t, int n, const char *extra, size_t *plen) {
  attn_sbuf b = {0};
  attn_sbuf_puts(&b, "{");
  for (int i = 0; i < n; i++) {
    attn_sbuf_printf(&b, "%s\"%s\": {\"shape\": ", i ? ", " : "", t[i].name);
    put_shape(&b, &t[i]);
    attn_sbuf_printf(&b, ", \"dtype\": \"%s\", \"data\": [", attn_dtype_name(t[i].dt));
    for (size_t k = 0, m = part_elems(&t[i]); k < m; k++) {
      double x = attn_load_elem(t[i].data, t[i].dt, k);
      attn_sbuf_puts(&b, k ? "," : "");
      if (x == -INFINITY)
        attn_sbuf_puts(&b, "null");
      else if (!isfinite(x))
        attn_sbuf_puts(&b, "1e999");
      else
        attn_sbuf_printf(&b, "%.9g", x);
    }
    attn_sbuf_puts(&b, "]}");
  }
  attn_sbuf_printf(&b, "%s}", extra ? extra : "");
  cr_assert(!b.oom);
  *plen = b.len;
  return b.p;
}

/* A safetensors file of the parts in order, with an optional __metadata__
 * object text. */
static char *bst(const part *t, int n, const char *meta, size_t *plen) {
  attn_sbuf h = {0};
  size_t off = 0, sizes[7]; /* six tensors, and one unknown in the refusal tests */
  attn_sbuf_puts(&h, "{");
  if (meta)
    attn_sbuf_printf(&h, "\"__metadata__\":%s,", meta);
  for (int i = 0; i < n; i++) {
    sizes[i] = part_elems(&t[i]) * attn_dtype_size(t[i].dt);
    attn_sbuf_printf(&h, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":", i ? "," : "", t[i].name,
                     attn_dtype_name(t[i].dt));
    put_shape(&h, &t[i]);
    attn_sbuf_printf(&h, ",\"data_offsets\":[%zu,%zu]}", off, off + sizes[i]);
    off += sizes[i];
  }
  attn_sbuf_puts(&h, "}");
  cr_assert(!h.oom);
  char *b = malloc(8 + h.len + off);
  for (int i = 0; i < 8; i++)
    b[i] = (char)((uint64_t)h.len >> (8 * i));
  memcpy(b + 8, h.p, h.len);
  char *d = b + 8 + h.len;
  for (int i = 0; i < n; i++) {
    memcpy(d, t[i].data, sizes[i]);
    d += sizes[i];
  }
  *plen = 8 + h.len + off;
  free(h.p);
  return b;
}

/* ---- replies, read here ------------------------------------------------------- */

static const char *const grad_names[3] = {"dq", "dk", "dv"};

/* Shape and element count of gradient g (dq has q's shape, dk and dv k's). */
static size_t grad_shape(const bcase *bc, int g, int rank, int64_t s[4]) {
  shape_of(&bc->c.p, g > 0, rank, s);
  return g ? n_kv(&bc->c.p) : n_q(&bc->c.p);
}

static bool shape_eq(const cJSON *sh, const int64_t *s, int rank) {
  bool ok = cJSON_IsArray(sh) && cJSON_GetArraySize(sh) == rank;
  for (int i = 0; ok && i < rank; i++)
    ok = cJSON_GetArrayItem(sh, i)->valuedouble == (double)s[i];
  return ok;
}

/* Gradient g of a JSON reply into out (doubles); NULL, or what is wrong. */
static const char *json_grad(const cJSON *j, const bcase *bc, int g, int rank, double *out) {
  const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, grad_names[g]);
  int64_t s[4];
  size_t n = grad_shape(bc, g, rank, s);
  const cJSON *dt = cJSON_GetObjectItemCaseSensitive(t, "dtype");
  const cJSON *data = cJSON_GetObjectItemCaseSensitive(t, "data");
  if (!shape_eq(cJSON_GetObjectItemCaseSensitive(t, "shape"), s, rank))
    return "a gradient is missing or misshapen";
  if (!cJSON_IsString(dt) || strcmp(dt->valuestring, attn_dtype_name(bc->c.p.dt)))
    return "a gradient has the wrong dtype";
  if (!cJSON_IsArray(data) || (size_t)cJSON_GetArraySize(data) != n)
    return "a gradient has the wrong number of values";
  size_t k = 0;
  for (const cJSON *x = data->child; x; x = x->next)
    out[k++] = cJSON_IsNumber(x) ? x->valuedouble : NAN;
  return NULL;
}

static const char *read_json(const http_res *rs, const bcase *bc, int rank, double *g[3]) {
  cJSON *j = cJSON_ParseWithLength(rs->body, rs->len);
  const char *why = cJSON_IsObject(j) ? NULL : "the reply is not a JSON object";
  for (const cJSON *c = j ? j->child : NULL; c && !why; c = c->next)
    if (strcmp(c->string, "dq") && strcmp(c->string, "dk") && strcmp(c->string, "dv") &&
        strcmp(c->string, "backend"))
      why = "the reply holds a key other than dq, dk, dv and backend";
  for (int i = 0; i < 3 && !why; i++)
    why = json_grad(j, bc, i, rank, g[i]);
  cJSON_Delete(j);
  return why;
}

static const char *read_st(const http_res *rs, const bcase *bc, int rank, double *g[3]) {
  uint64_t hn = 0;
  for (int i = 0; i < 8 && rs->len >= 8; i++)
    hn |= (uint64_t)(unsigned char)rs->body[i] << (8 * i);
  if (rs->len < 8 || hn > rs->len - 8)
    return "the reply is not safetensors";
  cJSON *h = cJSON_ParseWithLength(rs->body + 8, (size_t)hn);
  const char *why = cJSON_GetArraySize(h) == 3 ? NULL : "the reply does not hold 3 tensors";
  attn_dtype dt = bc->c.p.dt;
  size_t es = attn_dtype_size(dt), dlen = rs->len - 8 - (size_t)hn;
  for (int i = 0; i < 3 && !why; i++) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(h, grad_names[i]);
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(t, "dtype");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(t, "data_offsets");
    int64_t s[4];
    size_t n = grad_shape(bc, i, rank, s);
    double b0 = cJSON_GetArrayItem(off, 0) ? cJSON_GetArrayItem(off, 0)->valuedouble : -1;
    double b1 = cJSON_GetArrayItem(off, 1) ? cJSON_GetArrayItem(off, 1)->valuedouble : -1;
    if (!shape_eq(cJSON_GetObjectItemCaseSensitive(t, "shape"), s, rank) || !cJSON_IsString(d) ||
        strcmp(d->valuestring, attn_dtype_name(dt)))
      why = "a gradient is missing, misshapen or of the wrong dtype";
    else if (b0 < 0 || b1 > (double)dlen || b1 - b0 != (double)(n * es))
      why = "a gradient's data_offsets are wrong";
    for (size_t k = 0; !why && k < n; k++) {
      char e[4];
      memcpy(e, rs->body + 8 + hn + (size_t)b0 + k * es, es);
      g[i][k] = attn_load_elem(e, dt, 0);
    }
  }
  cJSON_Delete(h);
  return why;
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

/* rs is a 200 of the expected codec whose dq, dk, dv match the float64
 * reference within ttol; the gradients read go to got (when not NULL,
 * three arrays the caller frees). */
static bool expect_grads(const http_res *rs, const bcase *bc, int rank, bool st_reply,
                         const char *what, double *got[3]) {
  char ct[128] = "";
  http_header(rs, "Content-Type", ct, sizeof ct);
  cr_expect_eq(rs->status, 200, "%s: HTTP %ld: %.300s", what, rs->status, rs->body ? rs->body : "");
  if (rs->status != 200)
    return false;
  cr_expect(!strncmp(ct, st_reply ? ST_CT : JSON_CT, strlen(st_reply ? ST_CT : JSON_CT)),
            "%s: Content-Type %s", what, ct);
  double *g[3];
  const double *ref[3] = {bc->ref.dq, bc->ref.dk, bc->ref.dv};
  for (int i = 0; i < 3; i++)
    g[i] = calloc(i ? n_kv(&bc->c.p) : n_q(&bc->c.p), sizeof(double));
  const char *why = st_reply ? read_st(rs, bc, rank, g) : read_json(rs, bc, rank, g);
  cr_expect_null(why, "%s: %s", what, why);
  bool ok = !why;
  for (int i = 0; i < 3 && ok; i++) {
    double e = norm_err(g[i], ref[i], i ? n_kv(&bc->c.p) : n_q(&bc->c.p));
    ok = e <= ttol(bc->c.p.dt);
    cr_expect(ok, "%s: %s normalized error %.3g over %g", what, grad_names[i], e, ttol(bc->c.p.dt));
  }
  for (int i = 0; i < 3; i++) {
    if (got)
      got[i] = g[i];
    else
      free(g[i]);
  }
  return ok;
}

/* Posts bc as JSON or safetensors (lse included or not; extra JSON fields
 * or __metadata__), checks the gradients; got as for expect_grads. */
static bool post_case(const bcase *bc, int rank, bool st, bool with_lse, const char *path,
                      const char *extra, const char *what, double *got[3]) {
  part t[6];
  int n = bparts(bc, rank, with_lse, t);
  size_t len;
  char *body = st ? bst(t, n, extra, &len) : bjson(t, n, extra, &len);
  http_res r;
  http_post(&S, path, st ? ST_CT : JSON_CT, body, len, &r);
  char w[400], d[200];
  snprintf(w, sizeof w, "%s (%s, rank %d, %s, lse %s, %s%s)", what, st ? "safetensors" : "JSON",
           rank, tdesc(&bc->c.p, d, sizeof d), with_lse ? "given" : "absent", path,
           extra ? extra : "");
  bool ok = expect_grads(&r, bc, rank, st, w, got);
  http_res_free(&r);
  free(body);
  return ok;
}

static tprob shape_for_rank(int rank, attn_dtype dt) {
  switch (rank) {
  case 2: return tprob_make(1, 1, 1, 13, 17, 16, dt);
  case 3: return tprob_make(1, 4, 2, 9, 11, 32, dt);  /* GQA, 2 query heads a KV head */
  default: return tprob_make(2, 3, 1, 7, 10, 24, dt); /* MQA */
  }
}

/* ---- round trips --------------------------------------------------------------- */

static void every_dtype_and_rank(bool st) {
  srv_start(&S, NULL);
  for (int dt = ATTN_F32; dt <= ATTN_BF16; dt++)
    for (int rank = 2; rank <= 4; rank++) {
      tprob p = shape_for_rank(rank, (attn_dtype)dt);
      bcase bc;
      bcase_init(&bc, &p, (uint64_t)(200 + dt * 10 + rank));
      post_case(&bc, rank, st, (rank + dt) % 2 == 0, PATH, NULL, "dtypes/ranks", NULL);
      bcase_free(&bc);
    }
}

Test(backward, json_every_dtype_and_rank) { every_dtype_and_rank(false); }
Test(backward, safetensors_every_dtype_and_rank) { every_dtype_and_rank(true); }

/* A JSON request that asks for octet-stream gets a safetensors reply. */
Test(backward, json_request_accepting_octet_stream_gets_safetensors) {
  srv_start(&S, NULL);
  tprob p = shape_for_rank(3, ATTN_F32);
  bcase bc;
  bcase_init(&bc, &p, 7);
  part t[6];
  size_t len;
  char *body = bjson(t, bparts(&bc, 3, true, t), NULL, &len);
  const char *hdrs[] = {"Content-Type: " JSON_CT, "Accept: " ST_CT, NULL};
  http_req rq = {.method = "POST", .path = PATH, .headers = hdrs, .body = body, .len = len};
  http_res r;
  http_do(&S, &rq, &r);
  expect_grads(&r, &bc, 3, true, "Accept: octet-stream", NULL);
  http_res_free(&r);
  free(body);
  bcase_free(&bc);
}

/* Masks from each source of options: the query, the JSON body, the
 * safetensors __metadata__; with Nq > Nkv and causal, the first rows see no
 * key (lse -inf, null in JSON) and their gradients are zero. */
Test(backward, causal_and_window_from_each_source) {
  srv_start(&S, NULL);
  tprob p = tprob_make(1, 2, 1, 12, 8, 16, ATTN_F32);
  p.causal = true;
  bcase bc;
  bcase_init(&bc, &p, 11);
  cr_assert(isinf(bc.c.lse_in[0]) && bc.c.lse_in[0] < 0, "the test wants rows with no visible key");
  post_case(&bc, 3, false, true, PATH "&causal=true", NULL, "causal in the query", NULL);
  post_case(&bc, 3, false, true, PATH, ",\"causal\":true", "causal in the body", NULL);
  post_case(&bc, 3, true, true, "/attention/backward", "{\"causal\":\"true\"}",
            "causal in __metadata__", NULL);
  bcase_free(&bc);

  p = tprob_make(2, 2, 2, 10, 10, 8, ATTN_BF16);
  p.wl = 3;
  p.wr = 1;
  bcase_init(&bc, &p, 12);
  post_case(&bc, 4, false, false, PATH "&window_left=3", ",\"window_right\":1", "window", NULL);
  post_case(&bc, 4, true, true, PATH "&window_right=1", "{\"window_left\":\"3\"}", "window", NULL);
  bcase_free(&bc);
}

/* lse is optional: with and without it the gradients agree within tolerance. */
Test(backward, lse_given_or_absent_agree) {
  srv_start(&S, NULL);
  tprob p = tprob_make(1, 4, 2, 9, 14, 16, ATTN_F16);
  bcase bc;
  bcase_init(&bc, &p, 13);
  for (int st = 0; st < 2; st++) {
    double *a[3], *b[3];
    bool ok = post_case(&bc, 4, st, true, PATH, NULL, "lse given", a);
    ok = post_case(&bc, 4, st, false, PATH, NULL, "lse absent", b) && ok;
    /* Not the same bits: a given lse is the float64 reference's, rounded
     * to F32, and an absent one the engine's own F32 forward. Each run is
     * checked against float64 in post_case; here they must agree too. */
    for (int i = 0; i < 3; i++) {
      size_t n = i ? n_kv(&p) : n_q(&p);
      double diff = 0, norm = 0;
      for (size_t j = 0; ok && j < n; j++) {
        diff += (a[i][j] - b[i][j]) * (a[i][j] - b[i][j]);
        norm += a[i][j] * a[i][j];
      }
      cr_expect(!ok || sqrt(diff) <= ttol(p.dt) * sqrt(norm),
                "%s differs with and without lse (%s): %g of %g", grad_names[i],
                st ? "safetensors" : "JSON", sqrt(diff), sqrt(norm));
      free(a[i]);
      free(b[i]);
    }
  }
  bcase_free(&bc);
}

/* ---- refusals --------------------------------------------------------------------- */

typedef enum edit { DROP, RESHAPE, RETYPE, INF, ADD } edit;

/* bc's parts at rank 3 with lse, tensor `name` edited; returns how many. */
static int edited(const bcase *bc, const char *name, edit how, part t[7], void **scratch) {
  int n = bparts(bc, 3, true, t), i = 0;
  while (i < n && strcmp(t[i].name, name))
    i++;
  *scratch = NULL;
  switch (how) {
  case DROP: memmove(&t[i], &t[i + 1], (size_t)(n - i - 1) * sizeof *t); return n - 1;
  case RESHAPE: t[i].shape[t[i].rank - 1] -= 1; return n; /* fewer elements: still a valid file */
  case RETYPE:
  case INF: {
    /* the same values, as F16 or with one infinity */
    attn_dtype dt = how == RETYPE ? ATTN_F16 : t[i].dt;
    size_t m = part_elems(&t[i]);
    *scratch = malloc(m * attn_dtype_size(dt));
    for (size_t k = 0; k < m; k++)
      attn_store_elem(*scratch, dt, k, (float)attn_load_elem(t[i].data, t[i].dt, k));
    if (how == INF)
      attn_store_elem(*scratch, dt, 5, INFINITY);
    t[i].data = *scratch;
    t[i].dt = dt;
    return n;
  }
  default:
    t[n] = t[0];
    t[n].name = name;
    return n + 1;
  }
}

static void expect_refused(const bcase *bc, const char *name, edit how, const char *path,
                           const char *extra_json, const char *meta, long status,
                           const char *code) {
  for (int st = 0; st < 2; st++) {
    part t[7];
    void *scratch;
    int n = edited(bc, name, how, t, &scratch);
    size_t len;
    char *body = st ? bst(t, n, meta, &len) : bjson(t, n, extra_json, &len);
    http_res r;
    http_post(&S, path, st ? ST_CT : JSON_CT, body, len, &r);
    char w[200];
    snprintf(w, sizeof w, "%s: tensor %s edited (%d), %s", path, name, (int)how,
             st ? "safetensors" : "JSON");
    expect_error(&r, status, code, w);
    http_res_free(&r);
    free(body);
    free(scratch);
  }
}

Test(backward, every_tensor_error) {
  srv_start(&S, NULL);
  tprob p = tprob_make(1, 2, 2, 6, 6, 8, ATTN_F32);
  bcase bc;
  bcase_init(&bc, &p, 17);
  expect_refused(&bc, "o", DROP, PATH, NULL, NULL, 422, "missing_tensor");
  expect_refused(&bc, "do", DROP, PATH, NULL, NULL, 422, "missing_tensor");
  expect_refused(&bc, "q", DROP, PATH, NULL, NULL, 422, "missing_tensor");
  expect_refused(&bc, "o", RESHAPE, PATH, NULL, NULL, 422, "shape_mismatch");
  expect_refused(&bc, "do", RESHAPE, PATH, NULL, NULL, 422, "shape_mismatch");
  expect_refused(&bc, "lse", RESHAPE, PATH, NULL, NULL, 422, "shape_mismatch");
  expect_refused(&bc, "o", RETYPE, PATH, NULL, NULL, 422, "dtype_mismatch");
  expect_refused(&bc, "lse", RETYPE, PATH, NULL, NULL, 422, "dtype_mismatch");
  expect_refused(&bc, "do", INF, PATH, NULL, NULL, 422, "non_finite");
  expect_refused(&bc, "o", INF, PATH, NULL, NULL, 422, "non_finite");
  expect_refused(&bc, "dq", ADD, PATH, NULL, NULL, 422, "unknown_tensor");
  expect_refused(&bc, "m", ADD, PATH, NULL, NULL, 422, "unknown_tensor");
  bcase_free(&bc);
}

/* A backward pass returns no statistics: stats is refused from every
 * source, whatever its value. */
Test(backward, stats_refused) {
  srv_start(&S, NULL);
  tprob p = tprob_make(1, 1, 1, 4, 4, 8, ATTN_F32);
  bcase bc;
  bcase_init(&bc, &p, 19);
  part t[6];
  int n = bparts(&bc, 3, false, t);
  size_t len;
  const char *json_extra[] = {",\"stats\":true", ",\"stats\":false", NULL};
  for (int i = 0; json_extra[i]; i++) {
    char *body = bjson(t, n, json_extra[i], &len);
    http_res r;
    http_post(&S, PATH, JSON_CT, body, len, &r);
    expect_error(&r, 422, "invalid_option", json_extra[i]);
    http_res_free(&r);
    free(body);
  }
  char *body = bjson(t, n, NULL, &len);
  http_res r;
  http_post(&S, PATH "&stats=true", JSON_CT, body, len, &r);
  expect_error(&r, 422, "invalid_option", "stats=true in the query");
  http_res_free(&r);
  free(body);
  body = bst(t, n, "{\"stats\":\"true\"}", &len);
  http_post(&S, "/attention/backward", ST_CT, body, len, &r);
  expect_error(&r, 422, "invalid_option", "stats in __metadata__");
  http_res_free(&r);
  free(body);
  bcase_free(&bc);
}

Test(backward, other_methods_are_405) {
  srv_start(&S, NULL);
  const char *methods[] = {"GET", "PUT", "DELETE", NULL};
  for (int i = 0; methods[i]; i++) {
    http_req rq = {.method = methods[i], .path = "/attention/backward"};
    http_res r;
    http_do(&S, &rq, &r);
    expect_error(&r, 405, "method_not_allowed", methods[i]);
    char allow[64] = "";
    cr_expect(http_header(&r, "Allow", allow, sizeof allow) && !strcmp(allow, "POST"),
              "%s: Allow is \"%s\"", methods[i], allow);
    http_res_free(&r);
  }
}

/* Over --max-body: 413 from Content-Length, before the body is read. */
Test(backward, over_max_body_is_413) {
  srv_start(&S, "--max-body", "4096", NULL);
  tprob p = tprob_make(1, 2, 2, 16, 16, 16, ATTN_F32);
  bcase bc;
  bcase_init(&bc, &p, 23);
  part t[6];
  int n = bparts(&bc, 4, true, t);
  for (int st = 0; st < 2; st++) {
    size_t len;
    char *body = st ? bst(t, n, NULL, &len) : bjson(t, n, NULL, &len);
    cr_assert_gt(len, 4096);
    http_res r;
    http_post(&S, PATH, st ? ST_CT : JSON_CT, body, len, &r);
    expect_error(&r, 413, "too_large", st ? "safetensors over --max-body" : "JSON over --max-body");
    http_res_free(&r);
    free(body);
  }
  bcase_free(&bc);
}

/* The deadline cancels a backward job as it does a forward one; the job is
 * held by build/tests/attnd-hold until canceled (tests/lib/hold_backend.c),
 * so it is running at its deadline however fast the machine. */
Test(backward, deadline_answers_504) {
  S.bin = srv_hold_bin();
  srv_start(&S, "--timeout", "1", "--threads", "1", NULL);
  tcase c; /* only q, k, v are used: o and do need not be right to be held */
  tprob p = tprob_make(1, 16, 16, 64, 64, 64, ATTN_F32);
  tcase_init(&c, &p, 29);
  part t[5] = {{"q", ATTN_F32, {16, 64, 64}, 3, c.q},
               {"k", ATTN_F32, {16, 64, 64}, 3, c.k},
               {"v", ATTN_F32, {16, 64, 64}, 3, c.v},
               {"o", ATTN_F32, {16, 64, 64}, 3, c.q},
               {"do", ATTN_F32, {16, 64, 64}, 3, c.k}};
  size_t len;
  char *body = bst(t, 5, "{\"backend\":\"reference\"}", &len);
  http_req rq = {.path = "/attention/backward",
                 .headers = (const char *const[]){"Content-Type: " ST_CT, NULL},
                 .body = body,
                 .len = len,
                 .timeout_ms = 90000};
  http_res r;
  http_do(&S, &rq, &r);
  expect_error(&r, 504, "timeout", "a held backward job under --timeout 1");
  http_res_free(&r);
  const char *labels[] = {"reason=timeout", NULL};
  cr_expect(srv_wait_metric_ge(&S, "attnd_jobs_canceled_total", labels, 1, 60),
            "the backward job was never counted as canceled");
  free(body);
  tcase_free(&c);
}

/* Requests are counted under their own path. */
Test(backward, metrics_count_the_path) {
  srv_start(&S, NULL);
  tprob p = tprob_make(1, 1, 1, 3, 3, 4, ATTN_F32);
  bcase bc;
  bcase_init(&bc, &p, 31);
  post_case(&bc, 2, false, true, PATH, NULL, "metrics", NULL);
  http_req rq = {.path = "/attention/backward"};
  http_res r;
  http_do(&S, &rq, &r);
  http_res_free(&r);
  const char *ok[] = {"path=/attention/backward", "code=200", NULL};
  const char *bad[] = {"path=/attention/backward", "code=405", NULL};
  cr_expect(srv_wait_metric_ge(&S, "attnd_requests_total", ok, 1, 10), "no 200 counted");
  cr_expect(srv_wait_metric_ge(&S, "attnd_requests_total", bad, 1, 10), "no 405 counted");
  const char *fwd[] = {"path=/attention", NULL};
  cr_expect_eq(srv_metric(&S, "attnd_requests_total", fwd), 0,
               "a backward request was counted under /attention");
  bcase_free(&bc);
}
