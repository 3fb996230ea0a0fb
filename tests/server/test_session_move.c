/*
 * test_session_move.c — a session moved between two attnd (GET
 * /v1/sessions/{id}/export, PUT /v1/sessions/{id}/import): a session of
 * two layers of different lengths (Dv != D, and a latent one) exported
 * from one server and imported into another; the import's next call
 * equals the original's bit for bit and the float64 reference, and its
 * export equals the first byte for byte. Then the imports refused: a
 * truncated body, the wrong dtype, a tensor of the wrong shape, a length
 * past max_tokens, a missing v.0, an extra tensor, v for a latent session,
 * a NaN, a taken id (409), a session too big for the memory (507), and
 * another tenant's session (404). And an export a client hangs up on lets
 * go of the session's rows.
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
#include <sys/socket.h>
#include <unistd.h>

static srv A, B;
static void teardown(void) {
  srv_cleanup(&A);
  srv_cleanup(&B);
  remove_tmpdir();
}
TestSuite(session_move, .fini = teardown, .timeout = 180);

#define JSON_CT "Content-Type: application/json"
#define ST_CT "Content-Type: application/octet-stream"
#define HQ 4
#define HKV 2
#define N 24

/* A session's tokens: q [HQ, N, d], k [HKV, N, d], v [HKV, N, dv] (a
 * latent one's v: k's first dv columns), F32. */
typedef struct stream {
  int64_t d, dv;
  bool latent;
  float q[HQ * N * 64], k[HKV * N * 64], v[HKV * N * 64];
} stream;

static void stream_init(stream *s, int64_t d, int64_t dv, bool latent, uint64_t seed) {
  s->d = d, s->dv = dv, s->latent = latent;
  for (int64_t i = 0; i < HQ * N * d; i++)
    s->q[i] = (float)tuniform(&seed);
  for (int64_t i = 0; i < HKV * N * d; i++)
    s->k[i] = (float)tuniform(&seed);
  for (int64_t r = 0; r < HKV * N; r++)
    for (int64_t c = 0; c < dv; c++)
      s->v[r * dv + c] = latent ? s->k[r * d + c] : (float)tuniform(&seed);
}

/* "name": {"shape": [h, n, w], "dtype": "F32", "data": rows [r0, r0 + n)}. */
static void put_rows(attn_sbuf *b, const char *name, const float *t, int64_t h, int64_t w,
                     int64_t r0, int64_t n) {
  attn_sbuf_printf(b, "\"%s\": {\"shape\": [%lld, %lld, %lld], \"dtype\": \"F32\", \"data\": [",
                   name, (long long)h, (long long)n, (long long)w);
  for (int64_t i = 0; i < h; i++)
    for (int64_t j = 0; j < n * w; j++)
      attn_sbuf_printf(b, "%s%.9g", i || j ? "," : "", (double)t[(i * N + r0) * w + j]);
  attn_sbuf_puts(b, "]");
  attn_sbuf_puts(b, "}, ");
}

/* Tokens [pos, pos + n) of s appended to layer l of id on server v, its
 * queries those tokens'; the reply's o (malloc'd, [HQ, n, dv]). */
static float *step(srv *sv, const char *id, const stream *s, int64_t l, int64_t pos, int64_t n) {
  attn_sbuf b = {0};
  attn_sbuf_puts(&b, "{");
  put_rows(&b, "q", s->q, HQ, s->d, pos, n);
  put_rows(&b, "k", s->k, HKV, s->d, pos, n);
  if (!s->latent)
    put_rows(&b, "v", s->v, HKV, s->dv, pos, n);
  attn_sbuf_printf(&b, "\"layer\": %lld, \"pos\": %lld}", (long long)l, (long long)pos);
  char path[128];
  snprintf(path, sizeof path, "/v1/sessions/%s/attention", id);
  const char *h[] = {JSON_CT, NULL};
  http_res r;
  http_call(sv, "POST", path, h, b.p, b.len, &r);
  free(b.p);
  cr_assert_eq(r.status, 200, "%s layer %lld at %lld: %ld %.300s", id, (long long)l, (long long)pos,
               r.status, r.body);
  cJSON *j = cJSON_Parse(r.body), *data = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "o"), "data");
  cr_assert_eq(cJSON_GetArraySize(data), HQ * n * s->dv);
  float *o = malloc((size_t)(HQ * n * s->dv) * sizeof *o);
  int i = 0;
  for (cJSON *x = data->child; x; x = x->next)
    o[i++] = (float)x->valuedouble;
  cJSON_Delete(j);
  http_res_free(&r);
  return o;
}

/* o against the float64 reference of queries [q0, q0 + nq) over keys [0,
 * q0 + nq), causal: the session's mask. */
static void expect_reference(const stream *s, int64_t q0, int64_t nq, const float *o) {
  attn_request r;
  attn_request_init(&r);
  const int64_t nk = q0 + nq;
  r.batch = 1, r.heads_q = HQ, r.heads_kv = HKV, r.seq_q = nq, r.seq_kv = nk;
  r.head_dim = s->d, r.head_dim_v = s->dv, r.dtype = ATTN_F32, r.causal = true;
  float *q = malloc(sizeof s->q), *k = malloc(sizeof s->k), *v = malloc(sizeof s->v);
  for (int64_t h = 0; h < HQ; h++)
    memcpy(q + h * nq * s->d, s->q + (h * N + q0) * s->d, (size_t)(nq * s->d) * sizeof *q);
  for (int64_t h = 0; h < HKV; h++) {
    memcpy(k + h * nk * s->d, s->k + h * N * s->d, (size_t)(nk * s->d) * sizeof *k);
    memcpy(v + h * nk * s->dv, s->v + h * N * s->dv, (size_t)(nk * s->dv) * sizeof *v);
  }
  size_t no = (size_t)(HQ * nq * s->dv);
  double *want = malloc(no * sizeof *want);
  float *scratch = malloc(no * sizeof *scratch);
  r.q = q, r.k = k, r.v = v, r.o = scratch;
  attn_status st;
  cr_assert_eq(attn_reference(&r, want, NULL, NULL, NULL, &st), 0, "%s", st.message);
  double num = 0, den = 0;
  for (size_t i = 0; i < no; i++) {
    double e = (double)o[i] - want[i];
    num += isnan(e) ? INFINITY : e * e;
    den += want[i] * want[i];
  }
  cr_expect(sqrt(num / den) < ttol(ATTN_F32), "relative error %g", sqrt(num / den));
  free(q), free(k), free(v), free(want), free(scratch);
}

static void create(srv *sv, const char *id, const stream *s, int64_t max_tokens) {
  char path[128], body[300];
  snprintf(path, sizeof path, "/v1/sessions/%s", id);
  snprintf(body, sizeof body,
           "{\"heads_kv\": %d, \"head_dim\": %lld, \"%s\": %lld, \"dtype\": \"F32\", "
           "\"max_tokens\": %lld, \"layers\": 2}",
           HKV, (long long)s->d, s->latent ? "v_from_k" : "head_dim_v", (long long)s->dv,
           (long long)max_tokens);
  const char *h[] = {JSON_CT, NULL};
  http_res r;
  cr_assert_eq(http_call(sv, "PUT", path, h, body, strlen(body), &r), 201, "%s: %.200s", id,
               r.body);
  http_res_free(&r);
}

/* GET .../export: the file (malloc'd, *len bytes). */
static char *export_of(srv *sv, const char *id, size_t *len) {
  char path[128];
  snprintf(path, sizeof path, "/v1/sessions/%s/export", id);
  http_res r;
  http_get(sv, path, &r);
  cr_assert_eq(r.status, 200, "export %s: %ld %.300s", id, r.status, r.body);
  expect_header(&r, "Content-Type", "application/octet-stream");
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

/* Layer 0 holds 16 tokens, layer 1 holds 9; moved from A to B, then one
 * more token on layer 0 on both. */
static void moved_equal(const char *id, const stream *s) {
  create(&A, id, s, 64);
  free(step(&A, id, s, 0, 0, 16));
  free(step(&A, id, s, 1, 0, 9));
  size_t n1, n2;
  char *f1 = export_of(&A, id, &n1);
  http_res r;
  cr_assert_eq(import_to(&B, id, f1, n1, &r), 201, "%s: %.300s", id, r.body);
  cr_expect(strstr(r.body, "\"lengths\": [16, 9]"), "%s", r.body);
  http_res_free(&r);
  char *f2 = export_of(&B, id, &n2);
  cr_expect(n1 == n2 && !memcmp(f1, f2, n1), "%s: the export after the import differs", id);
  float *oa = step(&A, id, s, 0, 16, 1), *ob = step(&B, id, s, 0, 16, 1);
  cr_expect(!memcmp(oa, ob, (size_t)(HQ * s->dv) * sizeof *oa),
            "%s: the imported session computes other bits", id);
  expect_reference(s, 16, 1, ob);
  free(oa), free(ob), free(f1), free(f2);
}

Test(session_move, exported_then_imported_computes_the_same) {
  srv_start(&A, "--session-memory", "16M", NULL);
  srv_start(&B, "--session-memory", "16M", NULL);
  static stream s, sl;
  stream_init(&s, 32, 48, false, 3);
  stream_init(&sl, 64, 32, true, 4);
  moved_equal("dv", &s);
  moved_equal("latent", &sl);
}

/* The session file of A's session id, its metadata's text `from` made
 * `to` (the data kept), or the file as it is when from is NULL. */
static char *edited(const char *file, size_t len, const char *from, const char *to, size_t *out) {
  uint64_t hn = 0;
  for (int i = 0; i < 8; i++)
    hn |= (uint64_t)(unsigned char)file[i] << (8 * i);
  char *h = strndup(file + 8, hn), *at = from ? strstr(h, from) : NULL;
  cr_assert(!from || at, "no %s in %s", from, h);
  attn_sbuf b = {0};
  if (at) {
    attn_sbuf_put(&b, h, (size_t)(at - h));
    attn_sbuf_puts(&b, to);
    attn_sbuf_puts(&b, at + strlen(from));
  } else {
    attn_sbuf_puts(&b, h);
  }
  char *o = malloc(8 + b.len + (len - 8 - hn));
  for (int i = 0; i < 8; i++)
    o[i] = (char)((uint64_t)b.len >> (8 * i));
  memcpy(o + 8, b.p, b.len);
  memcpy(o + 8 + b.len, file + 8 + hn, len - 8 - hn);
  *out = 8 + b.len + (len - 8 - hn);
  free(h), free(b.p);
  return o;
}

static void refused(srv *sv, const void *file, size_t len, long status, const char *code,
                    const char *what) {
  http_res r;
  import_to(sv, "x", file, len, &r);
  expect_error(&r, status, code, what);
  http_res_free(&r);
}

Test(session_move, imports_refused) {
  srv_start(&A, "--session-memory", "16M", NULL);
  srv_start(&B, "--session-memory", "1M", NULL);
  static stream s, sl;
  stream_init(&s, 32, 48, false, 5);
  stream_init(&sl, 64, 32, true, 6);
  create(&A, "x", &s, 64);
  free(step(&A, "x", &s, 0, 0, 16));
  free(step(&A, "x", &s, 1, 0, 9));
  create(&A, "l", &sl, 64);
  free(step(&A, "l", &sl, 0, 0, 4));
  size_t n, nl, m;
  char *f = export_of(&A, "x", &n), *fl = export_of(&A, "l", &nl), *e;
  refused(&B, f, n - 5, 400, "malformed_safetensors", "a truncated body");
  e = edited(f, n, "\"dtype\":\"F32\",\"layers\"", "\"dtype\":\"F16\",\"layers\"", &m);
  refused(&B, e, m, 422, "dtype_mismatch", "the metadata's dtype not the tensors'");
  free(e);
  e = edited(f, n, "\"shape\":[2,16,32]", "\"shape\":[2,32,16]", &m);
  refused(&B, e, m, 422, "shape_mismatch", "k.0 of the wrong shape");
  free(e);
  e = edited(f, n, "\"lengths\":\"[16,9]\"", "\"lengths\":\"[65,9]\"", &m);
  refused(&B, e, m, 422, "invalid_option", "a length past max_tokens");
  free(e);
  e = edited(f, n, "\"v.0\"", "\"w.0\"", &m);
  refused(&B, e, m, 422, "unknown_tensor", "v.0 named otherwise");
  free(e);
  e = edited(f, n, "\"layers\":\"2\"", "\"layers\":\"1\"", &m);
  refused(&B, e, m, 422, "invalid_option", "fewer layers than lengths");
  free(e);
  e = edited(f, n, "\"k.1\"", "\"k.2\"", &m);
  refused(&B, e, m, 422, "unknown_tensor", "a tensor past the layers");
  free(e);
  e = edited(fl, nl, "\"v_from_k\":\"32\",", "", &m);
  refused(&B, e, m, 422, "missing_tensor", "a latent file without v_from_k lacks v");
  free(e);
  e = edited(fl, nl, "\"k.1\"", "\"v.0\"", &m);
  refused(&B, e, m, 422, "unknown_tensor", "v for a latent session");
  free(e);
  /* the file's last float made a NaN */
  e = malloc(n);
  memcpy(e, f, n);
  const float nan = NAN;
  memcpy(e + n - 4, &nan, 4);
  refused(&B, e, n, 422, "non_finite", "a NaN in v.1");
  free(e);
  /* too big for B's 1M */
  e = edited(f, n, "\"max_tokens\":\"64\"", "\"max_tokens\":\"60000\"", &m);
  refused(&B, e, m, 507, "session_memory_full", "a reservation past the memory");
  free(e);
  http_res r;
  cr_assert_eq(import_to(&B, "x", f, n, &r), 201, "%.300s", r.body);
  http_res_free(&r);
  refused(&B, f, n, 409, "session_exists", "an id taken");
  free(f), free(fl);
}

/* attn session export, import and move: the file the CLI writes is the
 * server's export, and a move leaves the session on the second server
 * only, its rows as they were. */
Test(session_move, the_cli_exports_imports_and_moves) {
  srv_start(&A, "--session-memory", "16M", NULL);
  srv_start(&B, "--session-memory", "16M", NULL);
  static stream s;
  stream_init(&s, 32, 48, false, 7);
  create(&A, "c", &s, 64);
  free(step(&A, "c", &s, 1, 0, 9));
  size_t n, m;
  char *f = export_of(&A, "c", &n), args[512], out[4096];
  char file[] = "/tmp/attn-move-XXXXXX";
  int fd = mkstemp(file);
  cr_assert(fd >= 0);
  close(fd);
  snprintf(args, sizeof args, "export http://127.0.0.1:%d c --out %s", A.port, file);
  cr_assert_eq(tattn("session", args, out, sizeof out), 0, "%s", out);
  char *g = malloc(n + 1);
  FILE *fp = fopen(file, "rb");
  cr_assert(fp);
  m = fread(g, 1, n + 1, fp);
  fclose(fp);
  cr_expect(m == n && !memcmp(f, g, n), "the CLI's file is not the export");
  free(g);
  snprintf(args, sizeof args, "import http://127.0.0.1:%d c --in %s", B.port, file);
  cr_assert_eq(tattn("session", args, out, sizeof out), 0, "%s", out);
  cr_expect_neq(tattn("session", args, out, sizeof out), 0, "an import over an id: %s", out);
  cr_expect(strstr(out, "session_exists"), "%s", out);
  http_res r;
  cr_assert_eq(http_call(&B, "DELETE", "/v1/sessions/c", NULL, NULL, 0, &r), 204);
  http_res_free(&r);
  snprintf(args, sizeof args, "move http://127.0.0.1:%d c --to http://127.0.0.1:%d", A.port,
           B.port);
  cr_assert_eq(tattn("session", args, out, sizeof out), 0, "%s", out);
  cr_expect_eq(http_get(&A, "/v1/sessions/c", &r), 0);
  cr_expect_eq(r.status, 404, "the move left the session on the first server");
  http_res_free(&r);
  char *moved = export_of(&B, "c", &m);
  cr_expect(m == n && !memcmp(f, moved, n), "the moved session's export differs");
  free(moved), free(f);
  unlink(file);
}

/* Keys: one key's session is another's 404 to export, and an import is
 * made under the importing key (the other key's GET is 404). The body
 * goes through --max-body as any call's: past it, 413. */
Test(session_move, only_the_callers_sessions_and_the_body_limit) {
  char keys[160];
  snprintf(keys, sizeof keys, "%s/keys", make_tmpdir());
  write_file(keys, "alice:alice-key-0123456789\nbob:bob-key-9876543210\n");
  srv_start(&A, "--session-memory", "16M", "--api-key-file", keys, "--max-body", "4K", NULL);
  const char *ha[] = {"Authorization: Bearer alice-key-0123456789", JSON_CT, NULL};
  const char *hb[] = {"Authorization: Bearer bob-key-9876543210", ST_CT, NULL};
  const char *body = "{\"heads_kv\": 1, \"head_dim\": 8, \"dtype\": \"F32\", \"max_tokens\": 256}";
  http_res r;
  cr_assert_eq(http_call(&A, "PUT", "/v1/sessions/t", ha, body, strlen(body), &r), 201);
  http_res_free(&r);
  http_call(&A, "GET", "/v1/sessions/t/export", hb, NULL, 0, &r);
  expect_error(&r, 404, "session_not_found", "another key's session");
  http_res_free(&r);
  http_call(&A, "GET", "/v1/sessions/t/export", ha, NULL, 0, &r);
  cr_assert_eq(r.status, 200, "%.200s", r.body);
  char *f = malloc(r.len);
  size_t n = r.len;
  memcpy(f, r.body, n);
  http_res_free(&r);
  cr_assert_eq(http_call(&A, "PUT", "/v1/sessions/t/import", hb, f, n, &r), 201, "%.300s", r.body);
  http_res_free(&r);
  cr_expect_eq(http_call(&A, "GET", "/v1/sessions/t", hb, NULL, 0, &r), 200);
  http_res_free(&r);
  char *big = calloc(1, 8192);
  memcpy(big, f, n);
  http_call(&A, "PUT", "/v1/sessions/u/import", hb, big, 8192, &r);
  expect_error(&r, 413, "too_large", "a body past --max-body");
  http_res_free(&r);
  free(big), free(f);
}

/* A session file of s's shape (layers 2, max_tokens n) whose layer 0
 * holds n tokens, the first N of them s's and the rest zeros (malloc'd,
 * *len bytes): a file larger than the sockets' buffers. */
static void *big_file(const stream *s, int64_t n, size_t *len) {
  const attn_kv_shape sh = {.heads_kv = HKV,
                            .head_dim = s->d,
                            .head_dim_v = s->dv,
                            .dtype = ATTN_F32,
                            .layers = 2,
                            .max_tokens = n};
  const int64_t lengths[2] = {n, 0};
  float *k = calloc((size_t)(HKV * n * s->d), sizeof *k),
        *v = calloc((size_t)(HKV * n * s->dv), sizeof *v);
  for (int64_t h = 0; h < HKV; h++) {
    memcpy(k + h * n * s->d, s->k + h * N * s->d, (size_t)(N * s->d) * sizeof *k);
    memcpy(v + h * n * s->dv, s->v + h * N * s->dv, (size_t)(N * s->dv) * sizeof *v);
  }
  void *kk[2] = {k, NULL}, *vv[2] = {v, NULL}, *file;
  attn_status st;
  cr_assert_eq(attn_proto_session_file_encode(&sh, 600, lengths, kk, vv, &file, len, &st), 0, "%s",
               st.message);
  free(k), free(v);
  return file;
}

/* A client that reads an export's head and hangs up: the export lets go
 * of the session's rows (they are read out as it is sent, and held until
 * then), so a truncate and an append over them then go through, right. */
Test(session_move, an_export_cut_short_lets_go_of_its_rows) {
  srv_start(&A, "--session-memory", "256M", "--max-body", "256M", NULL);
  stream *s = malloc(sizeof *s);
  stream_init(s, 64, 64, false, 41);
  size_t len;
  void *file = big_file(s, 16384, &len); /* 32 MiB */
  http_res r;
  cr_assert_eq(import_to(&A, "big", file, len, &r), 201, "%.300s", r.body);
  http_res_free(&r);
  free(file);
  int fd = raw_connect(A.port);
  cr_assert_geq(fd, 0);
  cr_assert_eq(raw_sends(fd, "GET /v1/sessions/big/export HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"), 0);
  char head[4096];
  cr_assert_gt(recv(fd, head, sizeof head, MSG_WAITALL), 0, "no reply to the export");
  cr_expect(!strncmp(head, "HTTP/1.1 200", 12), "%.40s", head);
  raw_reset(fd);
  const char *h[] = {JSON_CT, NULL};
  cr_assert_eq(http_call(&A, "POST", "/v1/sessions/big/truncate", h, "{\"length\": 4}", 13, &r),
               200, "%.300s", r.body);
  http_res_free(&r);
  float *o = step(&A, "big", s, 0, 4, 1);
  expect_reference(s, 4, 1, o);
  free(o);
  free(s);
}
