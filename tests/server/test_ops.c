/*
 * test_ops.c — the operations features through the real attnd: request ids
 * (echoed, made, in replies and log lines), JSON log lines, the API key
 * (401, open probes, sources, never shown, an empty one refused), HTTPS
 * with a throwaway certificate (TLS 1.2 and 1.3 with AEAD suites only,
 * --tls-priorities, checked with openssl s_client), CORS, gzip and deflate
 * request bodies (and the bomb that must stop at --max-body), and the
 * metrics these add.
 */
#define _GNU_SOURCE
#include "harness.h"

#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#include <zlib.h>

static srv S;
static void teardown(void) {
  srv_cleanup(&S);
  remove_tmpdir();
}

TestSuite(ops, .fini = teardown, .timeout = 120);

#define JSON_CT "Content-Type: application/json"
#define ST_CT "Content-Type: application/octet-stream"

/* ---- request ids --------------------------------------------------------------- */

Test(ops, request_id_echoed_or_made) {
  srv_start(&S, "--max-body", "1M", NULL);
  http_res r;
  const char *mine[] = {"X-Request-Id: trace-42.a_b", NULL};
  cr_expect_eq(http_call(&S, "GET", "/healthz", mine, NULL, 0, &r), 200);
  expect_header(&r, "X-Request-Id", "trace-42.a_b");
  http_res_free(&r);

  /* none, or one not fit for a log line: a made one, new each time */
  char first[64] = "", v[512] = "";
  const char *bad_ids[][2] = {
      {NULL, NULL},
      {"X-Request-Id: has space", NULL},
      {"X-Request-Id: a\"quote", NULL},
      {"X-Request-Id: "
       "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
       "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
       NULL}};
  for (int i = 0; i < 4; i++) {
    http_call(&S, "GET", "/healthz", bad_ids[i][0] ? bad_ids[i] : NULL, NULL, 0, &r);
    cr_expect(http_header(&r, "X-Request-Id", v, sizeof v) && made_id(v), "case %d: id \"%s\"", i,
              v);
    cr_expect(strcmp(v, first), "case %d: the same id twice: %s", i, v);
    snprintf(first, sizeof first, "%s", v);
    http_res_free(&r);
  }

  /* on errors too: 404, 405, 415 and 413 refused before the body */
  const char *h404[] = {"X-Request-Id: e-404", NULL};
  cr_expect_eq(http_call(&S, "GET", "/nope", h404, NULL, 0, &r), 404);
  expect_header(&r, "X-Request-Id", "e-404");
  http_res_free(&r);
  const char *h405[] = {"X-Request-Id: e-405", NULL};
  cr_expect_eq(http_call(&S, "GET", "/attention", h405, NULL, 0, &r), 405);
  expect_header(&r, "X-Request-Id", "e-405");
  http_res_free(&r);
  const char *h415[] = {"X-Request-Id: e-415", "Content-Type: text/plain", NULL};
  cr_expect_eq(http_call(&S, "POST", "/attention", h415, "x", 1, &r), 415);
  expect_header(&r, "X-Request-Id", "e-415");
  http_res_free(&r);
  size_t big = (size_t)2 << 20;
  char *body = calloc(1, big);
  /* with Expect: 100-continue, so the refusal is read before any body */
  const char *h413[] = {"X-Request-Id: e-413", JSON_CT, "Expect: 100-continue", NULL};
  cr_expect_eq(http_call(&S, "POST", "/attention", h413, body, big, &r), 413);
  expect_header(&r, "X-Request-Id", "e-413");
  http_res_free(&r);
  free(body);

  /* and on a computed reply */
  tprob p = tprob_make(1, 1, 1, 5, 7, 16, ATTN_F32);
  tcase c;
  tcase_init(&c, &p, 7);
  size_t len;
  char *jb = json_body(&c, 2, NULL, &len);
  const char *hp[] = {"X-Request-Id: job-7", JSON_CT, NULL};
  http_call(&S, "POST", "/attention", hp, jb, len, &r);
  expect_correct(&r, &c, 2, false, "POST with an id");
  expect_header(&r, "X-Request-Id", "job-7");
  http_res_free(&r);
  free(jb);
  tcase_free(&c);

  cr_expect(srv_wait_log(&S, " id=job-7\n", 10), "no log line with the POST's id");
  char *log = srv_log(&S);
  cr_expect(strstr(log, "GET /healthz 200") && strstr(log, " id=trace-42.a_b\n"),
            "the id in the log line:\n%s", log);
  cr_expect(strstr(log, "POST /attention 200"), "POST's line:\n%s", log);
  cr_expect(strstr(log, " id=e-413\n"), "the 413's id:\n%s", log);
  cr_expect(!strstr(log, "has space"), "a refused id must not reach the log:\n%s", log);
  free(log);
}

/* libmicrohttpd's own refusals (answered by server/mhd_shim.c) carry an id. */
Test(ops, request_id_on_the_http_layers_refusals) {
  srv_start(&S, NULL);
  int fd = raw_connect(S.port);
  cr_assert_geq(fd, 0);
  raw_sends(fd, "POST /attention HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                "Transfer-Encoding: chunked\r\n\r\nzz\r\n");
  http_res r;
  cr_expect_eq(raw_response(fd, 10000, &r), 400);
  char v[256] = "";
  cr_expect(http_header(&r, "X-Request-Id", v, sizeof v) && made_id(v), "id \"%s\" in\n%s", v,
            r.hdrs);
  http_res_free(&r);
  close(fd);
}

/* ---- JSON logs --------------------------------------------------------------------- */

/* "2025-01-31T12:00:00.123456Z" */
static bool rfc3339(const char *t) {
  int y, mo, d, h, mi, s, us;
  char z = 0;
  return t && strlen(t) == 27 &&
         sscanf(t, "%4d-%2d-%2dT%2d:%2d:%2d.%6d%c", &y, &mo, &d, &h, &mi, &s, &us, &z) == 8 &&
         z == 'Z' && mo >= 1 && mo <= 12 && d >= 1 && d <= 31 && h < 24 && mi < 60 && s <= 60;
}

/* Every line of the log is one JSON object with ts and level; returns how
 * many are request lines for path (method, path, status, bytes, total_us and
 * request_id all there), and the request id of the last one. */
static int check_json_log(const char *log, const char *path, char *id, size_t cap) {
  int found = 0;
  for (const char *p = log; p && *p;) {
    const char *e = strchr(p, '\n');
    size_t n = e ? (size_t)(e - p) : strlen(p);
    cJSON *j = cJSON_ParseWithLength(p, n);
    cr_expect(cJSON_IsObject(j), "not one JSON object: %.*s", (int)n, p);
    cr_expect(rfc3339(jstr(j, "ts")), "ts \"%s\" in %.*s", jstr(j, "ts"), (int)n, p);
    const char *lv = jstr(j, "level");
    cr_expect(lv && (!strcmp(lv, "info") || !strcmp(lv, "warn") || !strcmp(lv, "error")),
              "level in %.*s", (int)n, p);
    const char *jp = jstr(j, "path");
    if (jp && !strcmp(jp, path)) {
      found++;
      cr_expect(jstr(j, "method") && jstr(j, "request_id"), "%.*s", (int)n, p);
      static const char *const nums[] = {"status", "bytes_in", "bytes_out", "total_us"};
      for (int i = 0; i < 4; i++)
        cr_expect(cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(j, nums[i])), "%s in %.*s",
                  nums[i], (int)n, p);
      snprintf(id, cap, "%s", jstr(j, "request_id") ? jstr(j, "request_id") : "");
    }
    cJSON_Delete(j);
    p = e ? e + 1 : NULL;
  }
  return found;
}

Test(ops, json_log_lines) {
  const char *env[] = {"ATTND_LOG_FORMAT=json", NULL};
  srv_startv(&S, NULL, env, true);
  http_res r;
  const char *h[] = {"X-Request-Id: json-1", NULL};
  http_call(&S, "GET", "/v1/info", h, NULL, 0, &r);
  http_res_free(&r);
  /* a path with a quote, a backslash and a byte past ASCII must still make
   * one valid JSON line */
  http_call(&S, "GET", "/a\"b\\c\xc3", NULL, NULL, 0, &r);
  cr_expect_eq(r.status, 404);
  http_res_free(&r);
  http_call(&S, "POST", "/attention", (const char *[]){JSON_CT, NULL}, "{", 1, &r);
  http_res_free(&r);
  srv_stop(&S, 10);
  char *log = srv_log(&S), id[160];
  cr_expect_eq(check_json_log(log, "/v1/info", id, sizeof id), 1, "%s", log);
  cr_expect_str_eq(id, "json-1");
  cr_expect_eq(check_json_log(log, "/attention", id, sizeof id), 1, "%s", log);
  cr_expect(made_id(id), "a made id: %s", id);
  cr_expect(strstr(log, "listening on"), "the startup line as JSON too:\n%s", log);
  free(log);
}

/* ---- the API key -------------------------------------------------------------------- */

static void expect_401(const char *method, const char *path, const char *const *h, const void *body,
                       size_t len, const char *what) {
  http_res r;
  http_call(&S, method, path, h, body, len, &r);
  expect_error(&r, 401, "unauthorized", what);
  char v[128] = "";
  cr_expect(http_header(&r, "WWW-Authenticate", v, sizeof v) && !strncmp(v, "Bearer", 6),
            "%s: WWW-Authenticate \"%s\"", what, v);
  http_res_free(&r);
}

static long status_of(const char *method, const char *path, const char *const *h) {
  http_res r;
  long st = http_call(&S, method, path, h, NULL, 0, &r);
  http_res_free(&r);
  return st;
}

#define KEY "k3y-Sup3r.s3cret~42"

Test(ops, api_key_required_except_probes) {
  srv_start(&S, "--api-key", KEY, NULL);
  const char *good[] = {"Authorization: Bearer " KEY, NULL};
  const char *wrong[] = {"Authorization: Bearer " KEY "x", NULL};
  const char *basic[] = {"Authorization: Basic " KEY, NULL};
  expect_401("GET", "/v1/info", NULL, NULL, 0, "no key");
  expect_401("GET", "/v1/info", wrong, NULL, 0, "a wrong key");
  /* as long as the key, one byte off */
  const char *same_len[] = {"Authorization: Bearer k3y-Sup3r.s3cret~43", NULL};
  expect_401("GET", "/v1/info", same_len, NULL, 0, "a key of the same length");
  expect_401("GET", "/v1/info", basic, NULL, 0, "another scheme");
  expect_401("GET", "/metrics", NULL, NULL, 0, "metrics without a key");
  expect_401("GET", "/nope", NULL, NULL, 0, "an unknown path without a key");
  const char *post[] = {JSON_CT, NULL};
  expect_401("POST", "/attention", post, "{}", 2, "POST without a key");
  expect_401("POST", "/attention/backward", post, "{}", 2, "backward without a key");
  cr_expect_eq(status_of("GET", "/healthz", NULL), 200, "healthz stays open");
  cr_expect_eq(status_of("GET", "/readyz", NULL), 200, "readyz stays open");
  cr_expect_eq(status_of("GET", "/attention/plan?seq_q=8&head_dim=8", good), 200);

  tprob p = tprob_make(1, 2, 1, 9, 11, 32, ATTN_F16);
  tcase c;
  tcase_init(&c, &p, 11);
  size_t len;
  char *jb = json_body(&c, 3, NULL, &len);
  const char *hp[] = {"Authorization: bearer  " KEY, JSON_CT, NULL};
  http_res r;
  http_call(&S, "POST", "/attention", hp, jb, len, &r);
  expect_correct(&r, &c, 3, false, "POST with the key");
  http_res_free(&r);
  free(jb);
  tcase_free(&c);

  http_call(&S, "GET", "/v1/info", good, NULL, 0, &r);
  cr_expect_eq(r.status, 200);
  cr_expect(!strstr(r.body, KEY), "the key in /v1/info: %s", r.body);
  cJSON *j = cJSON_Parse(r.body);
  cJSON *sec = cJSON_GetObjectItemCaseSensitive(j, "security");
  cr_expect(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(sec, "api_key")), "%s", r.body);
  cr_expect(cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(sec, "tls")), "%s", r.body);
  cJSON_Delete(j);
  http_res_free(&r);

  const char *ul[] = {"code=unauthorized", NULL};
  http_call(&S, "GET", "/metrics", good, NULL, 0, &r);
  cr_expect_eq(prom_sum(r.body, "attnd_errors_total", ul, NULL), 8, "401s counted by code");
  http_res_free(&r);
  cr_expect(srv_wait_log(&S, "GET /metrics 200", 10), "no log line for /metrics");
  char *log = srv_log(&S);
  cr_expect(!strstr(log, KEY), "the key in the log:\n%s", log);
  cr_expect(strstr(log, "GET /v1/info 401"), "401s logged:\n%s", log);
  free(log);
}

/* The key from the variable, from a file (flag or variable), and the
 * mistakes: both sources, an empty file, a key a header cannot carry —
 * whose message must not show it. */
Test(ops, api_key_sources) {
  char *dir = make_tmpdir(), file[128], empty[128];
  snprintf(file, sizeof file, "%s/key", dir);
  snprintf(empty, sizeof empty, "%s/empty", dir);
  write_file(file, KEY "\n");
  write_file(empty, "\n");
  char file_env[160];
  snprintf(file_env, sizeof file_env, "ATTND_API_KEY_FILE=%s", file);
  const char *good[] = {"Authorization: Bearer " KEY, NULL};

  const char *from_env[] = {"ATTND_API_KEY=" KEY, NULL};
  const char *const *envs[] = {from_env, (const char *[]){file_env, NULL}};
  for (int i = 0; i < 2; i++) {
    srv_startv(&S, NULL, envs[i], true);
    cr_expect_eq(status_of("GET", "/v1/info", NULL), 401, "source %d: no key", i);
    cr_expect_eq(status_of("GET", "/v1/info", good), 200, "source %d: the key", i);
    srv_cleanup(&S);
  }
  srv_start(&S, "--api-key-file", file, NULL);
  cr_expect_eq(status_of("GET", "/v1/info", good), 200, "--api-key-file");
  srv_cleanup(&S);

  char *err = NULL;
  const char *both[] = {"--api-key", "a", "--api-key-file", file, NULL};
  cr_expect_eq(run_attnd(both, NULL, 10, NULL, &err), 2);
  cr_expect(err && strstr(err, "not both"), "%s", err);
  free(err);
  const char *both_env[] = {"ATTND_API_KEY=a", file_env, NULL};
  cr_expect_eq(run_attnd(NULL, both_env, 10, NULL, &err), 2);
  cr_expect(err && strstr(err, "both set"), "%s", err);
  free(err);
  const char *emp[] = {"--api-key-file", empty, NULL};
  cr_expect_eq(run_attnd(emp, NULL, 10, NULL, &err), 2);
  cr_expect(err && strstr(err, "--api-key-file"), "%s", err);
  free(err);
  const char *missing[] = {"--api-key-file", "/nonexistent/key", NULL};
  cr_expect_eq(run_attnd(missing, NULL, 10, NULL, &err), 2);
  cr_expect(err && strstr(err, "cannot read"), "%s", err);
  free(err);
  const char *spacey[] = {"--api-key", "hunter2 secret", NULL};
  cr_expect_eq(run_attnd(spacey, NULL, 10, NULL, &err), 2);
  cr_expect(err && strstr(err, "--api-key") && !strstr(err, "hunter2"),
            "refused without showing the key: %s", err);
  free(err);
  /* a flag beats both variables */
  const char *flag[] = {"--api-key", "flagkey", NULL};
  srv_startv(&S, flag, from_env, true);
  cr_expect_eq(
      status_of("GET", "/v1/info", (const char *[]){"Authorization: Bearer flagkey", NULL}), 200);
  cr_expect_eq(status_of("GET", "/v1/info", good), 401);
}

/* Runs attnd with args and env on a port of its own choosing (so a server
 * that wrongly starts cannot fail on a port in use instead) and checks that
 * it exits 2 with one line naming `names` and saying the value is empty. */
static void expect_empty_refused(const char *const *args, const char *const *env, const char *names,
                                 const char *what) {
  const char *argv[8] = {"--listen", "127.0.0.1:0"};
  for (int i = 0; args && args[i] && i < 5; i++)
    argv[2 + i] = args[i];
  char *err = NULL;
  int st = run_attnd(argv, env, 10, NULL, &err);
  const char *nl = err ? strchr(err, '\n') : NULL;
  cr_expect_eq(st, 2, "%s: exit status %d (-1: it served), stderr: %s", what, st, err);
  cr_expect(err && strstr(err, names) && strstr(err, "empty") && nl && !nl[1],
            "%s: want one line naming %s and saying it is empty, got: %s", what, names, err);
  free(err);
}

/* A key that is given but empty is a mistake (a template whose variable
 * was unset), never a server without a key: flag and variable alike. */
Test(ops, empty_api_key_is_refused) {
  const char *eq[] = {"--api-key=", NULL}, *apart[] = {"--api-key", "", NULL};
  expect_empty_refused(eq, NULL, "--api-key", "--api-key=");
  expect_empty_refused(apart, NULL, "--api-key", "--api-key \"\"");
  const char *file_eq[] = {"--api-key-file=", NULL};
  expect_empty_refused(file_eq, NULL, "--api-key-file", "--api-key-file=");
  const char *key_env[] = {"ATTND_API_KEY=", NULL}, *file_env[] = {"ATTND_API_KEY_FILE=", NULL};
  expect_empty_refused(NULL, key_env, "ATTND_API_KEY", "ATTND_API_KEY=");
  expect_empty_refused(NULL, file_env, "ATTND_API_KEY_FILE", "ATTND_API_KEY_FILE=");
}

/* Other variables set but empty are refused rather than silently taking
 * the default (an empty ATTND_TLS_CERT would serve plain HTTP); only
 * ATTND_CORS_ORIGIN keeps "empty means off", which is the closed state. */
Test(ops, empty_variables_are_refused) {
  const char *cert[] = {"ATTND_TLS_CERT=", "ATTND_TLS_KEY=", NULL};
  expect_empty_refused(NULL, cert, "ATTND_TLS_CERT", "ATTND_TLS_CERT= ATTND_TLS_KEY=");
  const char *threads[] = {"ATTND_THREADS=", NULL};
  expect_empty_refused(NULL, threads, "ATTND_THREADS", "ATTND_THREADS=");
  const char *tls_flag[] = {"--tls-cert=", "--tls-key=", NULL};
  expect_empty_refused(tls_flag, NULL, "--tls-cert", "--tls-cert= --tls-key=");
  const char *cors[] = {"ATTND_CORS_ORIGIN=", NULL};
  srv_startv(&S, NULL, cors, true);
  http_res r;
  const char *pre[] = {"Origin: https://app.example", "Access-Control-Request-Method: POST", NULL};
  cr_expect_eq(http_call(&S, "OPTIONS", "/attention", pre, NULL, 0, &r), 405,
               "empty CORS origin: off");
  http_res_free(&r);
}

/* ---- TLS ------------------------------------------------------------------------------ */

typedef struct grow {
  char *p;
  size_t n;
} grow;

static size_t on_data(char *d, size_t sz, size_t nm, void *ud) {
  grow *g = ud;
  char *p = realloc(g->p, g->n + sz * nm + 1);
  if (!p)
    return 0;
  memcpy(p + g->n, d, sz * nm);
  g->n += sz * nm;
  p[g->n] = 0;
  g->p = p;
  return sz * nm;
}

/* One request over HTTPS to 127.0.0.1:port, trusting ca; r as http_do
 * fills it (status 0 when no reply). */
static void tls_do(int port, const char *ca, const char *path, const char *ctype, const void *body,
                   size_t len, http_res *r) {
  memset(r, 0, sizeof *r);
  char url[128];
  snprintf(url, sizeof url, "https://127.0.0.1:%d%s", port, path);
  CURL *h = curl_easy_init();
  grow b = {0}, hd = {0};
  struct curl_slist *hl = NULL;
  if (ctype)
    hl = curl_slist_append(hl, ctype);
  hl = curl_slist_append(hl, "Expect:");
  curl_easy_setopt(h, CURLOPT_URL, url);
  curl_easy_setopt(h, CURLOPT_CAINFO, ca);
  curl_easy_setopt(h, CURLOPT_PROXY, "");
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 30000L);
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, hl);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_data);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, &hd);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, r->error);
  if (body) {
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
  }
  r->curl_rc = curl_easy_perform(h);
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r->status);
  r->body = b.p ? b.p : strdup("");
  r->len = b.n;
  r->hdrs = hd.p ? hd.p : strdup("");
  r->hlen = hd.n;
  curl_slist_free_all(hl);
  curl_easy_cleanup(h);
}

/* A self-signed certificate for 127.0.0.1 and its key, made with openssl
 * (Debian's openssl package, in DEPS). */
static void make_cert(const char *dir, const char *name) {
  char cmd[512];
  snprintf(cmd, sizeof cmd,
           "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 "
           "-subj /CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1 -keyout %s/%s.key "
           "-out %s/%s.pem >/dev/null 2>&1",
           dir, name, dir, name);
  cr_assert_eq(system(cmd), 0, "openssl could not make a certificate: %s", cmd);
}

/* Starts S over HTTPS with cert and key (and --tls-priorities prio unless
 * NULL) and waits until GET /healthz answers over TLS. */
static void tls_start(const char *cert, const char *key, const char *prio) {
  const char *args[] = {"--tls-cert", cert, "--tls-key", key, prio ? "--tls-priorities" : NULL,
                        prio,         NULL};
  srv_spawn(&S, args, NULL, true);
  http_res r = {0};
  for (int i = 0; i < 200 && r.status != 200; i++) { /* up to ~20 s for the start */
    http_res_free(&r);
    sleep_s(0.1);
    tls_do(S.port, cert, "/healthz", NULL, NULL, 0, &r);
  }
  cr_assert_eq(r.status, 200, "GET /healthz over HTTPS: %s", r.error);
  http_res_free(&r);
}

Test(ops, tls_round_trip) {
  char *dir = make_tmpdir(), cert[128], key[128];
  make_cert(dir, "srv");
  snprintf(cert, sizeof cert, "%s/srv.pem", dir);
  snprintf(key, sizeof key, "%s/srv.key", dir);
  tls_start(cert, key, NULL);
  http_res r = {0};

  tprob p = tprob_make(1, 2, 2, 13, 17, 64, ATTN_BF16);
  tcase c;
  tcase_init(&c, &p, 21);
  size_t len;
  char *sb = st_body(&c, 3, NULL, &len);
  tls_do(S.port, cert, "/attention", ST_CT, sb, len, &r);
  expect_correct(&r, &c, 3, true, "POST over HTTPS");
  char v[128] = "";
  cr_expect(http_header(&r, "X-Request-Id", v, sizeof v) && made_id(v), "id over HTTPS: %s", v);
  http_res_free(&r);
  free(sb);
  tcase_free(&c);

  tls_do(S.port, cert, "/v1/info", NULL, NULL, 0, &r);
  cJSON *j = cJSON_Parse(r.body);
  cJSON *sec = cJSON_GetObjectItemCaseSensitive(j, "security");
  cr_expect(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(sec, "tls")), "%s", r.body);
  cJSON_Delete(j);
  http_res_free(&r);

  /* plain HTTP to the HTTPS port gets no HTTP reply */
  http_get(&S, "/healthz", &r);
  cr_expect_neq(r.status, 200, "plain HTTP answered on the HTTPS port");
  http_res_free(&r);
  char *log = srv_log(&S);
  cr_expect(strstr(log, "listening on https://"), "%s", log);
  free(log);
  cr_expect_eq(srv_stop(&S, 10), 0);
}

/* One handshake with openssl s_client (opts: its protocol and cipher
 * flags) against S; whether it was established. out gets s_client's
 * output, for messages. */
static bool handshake(const char *opts, char *out, size_t cap) {
  char cmd[512];
  snprintf(cmd, sizeof cmd,
           "timeout 30 openssl s_client -connect 127.0.0.1:%d -brief %s </dev/null 2>&1", S.port,
           opts);
  FILE *p = popen(cmd, "r");
  cr_assert(p, "cannot run %s", cmd);
  size_t n = fread(out, 1, cap - 1, p);
  out[n] = 0;
  int st = pclose(p);
  return st == 0 && strstr(out, "CONNECTION ESTABLISHED");
}

/* A handshake that must succeed with protocol version want (TLSv1.2...). */
static void expect_handshake(const char *opts, const char *want) {
  char out[8192], line[64];
  bool ok = handshake(opts, out, sizeof out);
  snprintf(line, sizeof line, "Protocol version: %s\n", want);
  cr_expect(ok && strstr(out, line), "s_client %s: want %s, got:\n%s", opts, want, out);
}

static void expect_refused(const char *opts) {
  char out[8192];
  cr_expect(!handshake(opts, out, sizeof out), "s_client %s was accepted:\n%s", opts, out);
}

/* OpenSSL's own refusals, before it sends a hello: no verdict on the
 * server. */
static bool client_refused(const char *out) {
  return strstr(out, "no protocols available") || strstr(out, "unsupported protocol") ||
         strstr(out, "legacy sigalg disallowed");
}

/* The default is TLS 1.2 and 1.3 with AEAD suites only; SECLEVEL=0 lets
 * this OpenSSL offer the old versions, so the refusal is the server's. */
Test(ops, tls_modern_protocols_only) {
  char *dir = make_tmpdir(), cert[128], key[128];
  make_cert(dir, "srv");
  snprintf(cert, sizeof cert, "%s/srv.pem", dir);
  snprintf(key, sizeof key, "%s/srv.key", dir);
  tls_start(cert, key, NULL);
  expect_refused("-tls1 -cipher DEFAULT@SECLEVEL=0");
  expect_refused("-tls1_1 -cipher DEFAULT@SECLEVEL=0");
  expect_refused("-tls1_2 -cipher ECDHE-ECDSA-AES256-SHA");
  expect_refused("-tls1_2 -cipher ECDHE-ECDSA-AES128-SHA256");
  expect_handshake("-tls1_2 -cipher ECDHE-ECDSA-AES128-GCM-SHA256", "TLSv1.2");
  expect_handshake("-tls1_2 -cipher ECDHE-ECDSA-CHACHA20-POLY1305", "TLSv1.2");
  expect_handshake("-tls1_3", "TLSv1.3");
  cr_expect_eq(srv_stop(&S, 10), 0);

  /* --tls-priorities replaces the default: NORMAL takes TLS 1.1 again. */
  tls_start(cert, key, "NORMAL");
  char out[8192];
  if (handshake("-tls1_1 -cipher DEFAULT@SECLEVEL=0", out, sizeof out))
    cr_expect(strstr(out, "Protocol version: TLSv1.1\n"), "%s", out);
  else if (client_refused(out))
    printf("skipped: this OpenSSL refuses TLS 1.1 itself, even at SECLEVEL=0:\n%s", out);
  else
    cr_expect(false, "--tls-priorities NORMAL: TLS 1.1 refused:\n%s", out);
  expect_handshake("-tls1_3", "TLSv1.3");
  cr_expect_eq(srv_stop(&S, 10), 0);
}

/* A priority string GnuTLS does not parse is one line quoting where it
 * stops; one given without --tls-cert is a mistake too (plain HTTP is not
 * what it asks for). */
Test(ops, tls_priorities_errors) {
  char *dir = make_tmpdir(), cert[128], key[128];
  make_cert(dir, "srv");
  snprintf(cert, sizeof cert, "%s/srv.pem", dir);
  snprintf(key, sizeof key, "%s/srv.key", dir);
  struct {
    const char *args[9], *says[2];
  } cases[] = {
      {{"--tls-cert", cert, "--tls-key", key, "--tls-priorities", "NORMAL:+BOGUS:-VERS-ALL", NULL},
       {"--tls-priorities", "\"+BOGUS\""}},
      {{"--tls-cert", cert, "--tls-key", key, "--tls-priorities", "NORMAL:-VERS-ALL", NULL},
       {"--tls-priorities", "NORMAL:-VERS-ALL"}},
      {{"--tls-priorities", "NORMAL", NULL}, {"--tls-priorities", "--tls-cert"}},
      {{"--tls-cert", cert, "--tls-key", key, "--tls-priorities=", NULL},
       {"--tls-priorities", "empty"}},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    const char *argv[12] = {"--listen", "127.0.0.1:0"};
    for (int k = 0; cases[i].args[k]; k++)
      argv[2 + k] = cases[i].args[k];
    char *err = NULL;
    int st = run_attnd(argv, NULL, 20, NULL, &err);
    const char *nl = err ? strchr(err, '\n') : NULL;
    cr_expect_eq(st, 2, "case %zu: exit %d (-1: it served): %s", i, st, err);
    cr_expect(err && strstr(err, cases[i].says[0]) && strstr(err, cases[i].says[1]) && nl && !nl[1],
              "case %zu: want one line with %s and %s, got: %s", i, cases[i].says[0],
              cases[i].says[1], err);
    free(err);
  }
}

Test(ops, tls_errors) {
  char *dir = make_tmpdir(), cert[128], key[128], other_key[128], junk[128];
  make_cert(dir, "a");
  make_cert(dir, "b");
  snprintf(cert, sizeof cert, "%s/a.pem", dir);
  snprintf(key, sizeof key, "%s/a.key", dir);
  snprintf(other_key, sizeof other_key, "%s/b.key", dir);
  snprintf(junk, sizeof junk, "%s/junk.pem", dir);
  write_file(junk, "not a certificate\n");
  struct {
    const char *args[5], *says;
  } cases[] = {
      {{"--tls-cert", cert, NULL}, "without --tls-key"},
      {{"--tls-key", key, NULL}, "without --tls-cert"},
      {{"--tls-cert", "/nonexistent.pem", "--tls-key", key, NULL}, "cannot read"},
      {{"--tls-cert", junk, "--tls-key", key, NULL}, "not a PEM file"},
      {{"--tls-cert", cert, "--tls-key", junk, NULL}, "not a PEM file"},
      {{"--tls-cert", cert, "--tls-key", other_key, NULL}, "--tls-key"},
      {{"--tls-cert", key, "--tls-key", key, NULL}, "--tls-cert"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char *err = NULL;
    cr_expect_eq(run_attnd(cases[i].args, NULL, 20, NULL, &err), 2, "case %zu", i);
    cr_expect(err && strstr(err, cases[i].says), "case %zu: want \"%s\" in: %s", i, cases[i].says,
              err);
    free(err);
  }
}

/* ---- CORS ------------------------------------------------------------------------------- */

Test(ops, cors_preflight_and_headers) {
  srv_start(&S, "--cors-origin", "https://app.example", "--api-key", KEY, NULL);
  const char *pre[] = {"Origin: https://app.example", "Access-Control-Request-Method: POST",
                       "Access-Control-Request-Headers: authorization, content-type", NULL};
  http_res r;
  cr_expect_eq(http_call(&S, "OPTIONS", "/attention", pre, NULL, 0, &r), 204,
               "a preflight needs no key: %s", r.body);
  expect_header(&r, "Access-Control-Allow-Origin", "https://app.example");
  expect_header(&r, "Vary", "Origin");
  char v[512] = "";
  cr_expect(http_header(&r, "Access-Control-Allow-Methods", v, sizeof v) && strstr(v, "POST"), "%s",
            v);
  cr_expect(http_header(&r, "Access-Control-Allow-Headers", v, sizeof v) &&
                strcasestr(v, "authorization") && strcasestr(v, "content-type") &&
                strcasestr(v, "x-request-id") && strcasestr(v, "content-encoding"),
            "%s", v);
  cr_expect(http_header(&r, "Access-Control-Max-Age", v, sizeof v) && atoi(v) > 0, "%s", v);
  cr_expect_eq(r.len, 0, "204 with a body");
  http_res_free(&r);

  const char *get[] = {"Origin: https://app.example", "Authorization: Bearer " KEY, NULL};
  cr_expect_eq(http_call(&S, "GET", "/v1/info", get, NULL, 0, &r), 200);
  expect_header(&r, "Access-Control-Allow-Origin", "https://app.example");
  expect_header(&r, "Vary", "Origin");
  cr_expect(http_header(&r, "Access-Control-Expose-Headers", v, sizeof v) &&
                strcasestr(v, "x-request-id"),
            "%s", v);
  cJSON *j = cJSON_Parse(r.body);
  cJSON *sec = cJSON_GetObjectItemCaseSensitive(j, "security");
  cr_expect_str_eq(jstr(sec, "cors_origin") ? jstr(sec, "cors_origin") : "", "https://app.example");
  cJSON_Delete(j);
  http_res_free(&r);
  /* errors carry the headers too, so a browser can read them */
  http_call(&S, "GET", "/v1/info", (const char *[]){"Origin: https://app.example", NULL}, NULL, 0,
            &r);
  cr_expect_eq(r.status, 401);
  expect_header(&r, "Access-Control-Allow-Origin", "https://app.example");
  http_res_free(&r);
  srv_cleanup(&S);

  srv_start(&S, "--cors-origin", "*", NULL);
  http_call(&S, "GET", "/healthz", NULL, NULL, 0, &r);
  expect_header(&r, "Access-Control-Allow-Origin", "*");
  cr_expect(!http_header(&r, "Vary", v, sizeof v), "Vary with *: %s", v);
  http_res_free(&r);
  srv_cleanup(&S);

  /* off: no headers, and OPTIONS is not a method of the routes */
  srv_start(&S, NULL);
  cr_expect_eq(http_call(&S, "OPTIONS", "/attention", pre, NULL, 0, &r), 405);
  cr_expect(!http_header(&r, "Access-Control-Allow-Origin", v, sizeof v), "CORS off: %s", v);
  http_res_free(&r);
  srv_cleanup(&S);

  const char *bad[] = {"--cors-origin", "https://app.example/path", NULL};
  char *err = NULL;
  cr_expect_eq(run_attnd(bad, NULL, 10, NULL, &err), 2);
  cr_expect(err && strstr(err, "--cors-origin"), "%s", err);
  free(err);
}

/* ---- gzip and deflate bodies ------------------------------------------------------------ */

static unsigned char *pack(const void *data, size_t n, int wbits, size_t *out_len) {
  z_stream z;
  memset(&z, 0, sizeof z);
  cr_assert_eq(deflateInit2(&z, 9, Z_DEFLATED, wbits, 9, Z_DEFAULT_STRATEGY), Z_OK);
  size_t cap = deflateBound(&z, n) + 64;
  unsigned char *out = malloc(cap);
  z.next_out = out;
  z.avail_out = (uInt)cap;
  const unsigned char *in = data;
  size_t left = n;
  int rc;
  do { /* avail_in is 32 bits: step through large inputs */
    size_t step = left > (1u << 30) ? (1u << 30) : left;
    z.next_in = (Bytef *)(uintptr_t)in;
    z.avail_in = (uInt)step;
    in += step;
    left -= step;
    rc = deflate(&z, left ? Z_NO_FLUSH : Z_FINISH);
  } while (left);
  cr_assert_eq(rc, Z_STREAM_END);
  *out_len = cap - z.avail_out;
  deflateEnd(&z);
  return out;
}

Test(ops, gzip_and_deflate_bodies) {
  srv_start(&S, NULL);
  tprob p = tprob_make(1, 2, 1, 21, 19, 32, ATTN_F32);
  tcase c;
  tcase_init(&c, &p, 31);
  size_t jl, sl, zn;
  char *jb = json_body(&c, 3, NULL, &jl), *sb = st_body(&c, 3, NULL, &sl);
  const struct {
    int wbits;
    const char *enc;
    bool st;
  } cases[] = {{31, "gzip", false},
               {31, "x-gzip", true},
               {15, "deflate", false},
               {15, "Deflate", true},
               {-15, "deflate", false}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    unsigned char *z = pack(cases[i].st ? sb : jb, cases[i].st ? sl : jl, cases[i].wbits, &zn);
    char ce[64], what[96];
    snprintf(ce, sizeof ce, "Content-Encoding: %s", cases[i].enc);
    snprintf(what, sizeof what, "%s (wbits %d)", ce, cases[i].wbits);
    const char *h[] = {cases[i].st ? ST_CT : JSON_CT, ce, NULL};
    http_res r;
    http_call(&S, "POST", "/attention", h, z, zn, &r);
    expect_correct(&r, &c, 3, cases[i].st, what);
    http_res_free(&r);
    free(z);
  }
  free(sb);
  tcase_free(&c);

  /* /attention/backward decodes too: a body without o and do reaches the
   * backward codec, which names what is missing */
  unsigned char *z = pack(jb, jl, 31, &zn);
  const char *hg[] = {JSON_CT, "Content-Encoding: gzip", NULL};
  http_res r;
  http_call(&S, "POST", "/attention/backward", hg, z, zn, &r);
  expect_error(&r, 422, "missing_tensor", "gzip backward without o and do");
  http_res_free(&r);

  /* corrupt, truncated, not compressed, unknown coding */
  z[zn / 2] ^= 0x5a;
  http_call(&S, "POST", "/attention", hg, z, zn, &r);
  expect_error(&r, 400, "bad_request", "corrupt gzip");
  cr_expect(strstr(r.body, "gzip"), "%s", r.body);
  http_res_free(&r);
  z[zn / 2] ^= 0x5a;
  http_call(&S, "POST", "/attention", hg, z, zn - 9, &r);
  expect_error(&r, 400, "bad_request", "truncated gzip");
  http_res_free(&r);
  http_call(&S, "POST", "/attention", hg, jb, jl, &r);
  expect_error(&r, 400, "bad_request", "plain JSON sent as gzip");
  http_res_free(&r);
  /* /v2 infer too, with the protocol's error shape when the coding is bad */
  static const char v2[] =
      "{\"inputs\": [{\"name\": \"q\", \"shape\": [2, 2], \"datatype\": "
      "\"FP32\", \"data\": [1, 0, 0, 1]}, {\"name\": \"k\", \"shape\": [2, 2], "
      "\"datatype\": \"FP32\", \"data\": [1, 0, 0, 1]}, {\"name\": \"v\", "
      "\"shape\": [2, 2], \"datatype\": \"FP32\", \"data\": [1, 2, 3, 4]}]}";
  unsigned char *zv = pack(v2, sizeof v2 - 1, 31, &zn);
  http_call(&S, "POST", "/v2/models/attention/infer", hg, zv, zn, &r);
  cr_expect_eq(r.status, 200, "gzip /v2 infer: %ld %s", r.status, r.body);
  cr_expect(r.body && strstr(r.body, "\"model_name\""), "gzip /v2 infer: %s", r.body);
  http_res_free(&r);
  zv[zn / 2] ^= 0x5a;
  http_call(&S, "POST", "/v2/models/attention/infer", hg, zv, zn, &r);
  cr_expect_eq(r.status, 400, "corrupt gzip /v2 infer: %ld %s", r.status, r.body);
  cr_expect(r.body && !strncmp(r.body, "{\"error\": \"", 11), "not the protocol's shape: %s",
            r.body);
  http_res_free(&r);
  free(zv);
  const char *hb[] = {JSON_CT, "Content-Encoding: br", NULL};
  http_call(&S, "POST", "/attention", hb, jb, jl, &r);
  expect_error(&r, 415, "unsupported_media_type", "Content-Encoding: br");
  http_res_free(&r);
  free(z);
  free(jb);
  cr_expect(expect_healthy(&S, "bad encodings"));
}

/* The peak resident memory of pid in bytes (VmHWM), or -1. */
static long long peak_rss(pid_t pid) {
  char path[64], *s;
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  if (!(s = read_file_all(path, NULL)))
    return -1;
  const char *p = strstr(s, "VmHWM:");
  long long kb = p ? atoll(p + 6) : -1;
  free(s);
  return kb < 0 ? -1 : kb * 1024;
}

/* 512 MiB of zeros in about 0.5 MiB of gzip, against --max-body 4M: refused
 * with 413 once 4 MiB are decoded, and the server's peak memory stays far
 * below what decoding it whole would take. */
Test(ops, gzip_bomb_is_413_not_memory) {
  srv_start(&S, "--max-body", "4M", "--threads", "1", NULL);
  size_t big = (size_t)512 << 20, zn;
  char *zeros = calloc(1, big);
  cr_assert(zeros);
  unsigned char *z = pack(zeros, big, 31, &zn);
  free(zeros);
  cr_assert_lt(zn, (size_t)4 << 20, "the bomb must fit --max-body: %zu", zn);
  long long before = peak_rss(S.pid);
  cr_assert_gt(before, 0);
  const char *h[] = {JSON_CT, "Content-Encoding: gzip", NULL};
  for (int i = 0; i < 3; i++) {
    http_res r;
    http_call(&S, "POST", "/attention", h, z, zn, &r);
    expect_error(&r, 413, "too_large", "gzip bomb");
    cr_expect(strstr(r.body, "--max-body"), "%s", r.body);
    http_res_free(&r);
  }
  const char *hd[] = {ST_CT, "Content-Encoding: gzip", NULL};
  http_res r;
  http_call(&S, "POST", "/attention/backward", hd, z, zn, &r);
  expect_error(&r, 413, "too_large", "gzip bomb on backward");
  http_res_free(&r);
  long long after = peak_rss(S.pid);
  cr_expect_lt(after - before, 64ll << 20, "peak RSS grew by %lld bytes (from %lld)",
               after - before, before);
  free(z);
  cr_expect(expect_healthy(&S, "gzip bombs"));
}

/* ---- metrics and help -------------------------------------------------------------------- */

Test(ops, metrics_build_info_and_errors_by_code) {
  srv_start(&S, NULL);
  http_res r;
  http_call(&S, "POST", "/attention", (const char *[]){JSON_CT, "Content-Encoding: gzip", NULL},
            "xx", 2, &r);
  http_res_free(&r);
  http_call(&S, "GET", "/metrics", NULL, NULL, 0, &r);
#ifdef ATTN_HAVE_CUDA
  const char *bl[] = {"backends=cuda,cpu,reference", NULL}; /* compiled in, device or not */
#else
  const char *bl[] = {"backends=cpu,reference", NULL};
#endif
  int n = 0;
  cr_expect_eq(prom_sum(r.body, "attnd_build_info", bl, &n), 1, "%s", r.body);
  cr_expect_eq(n, 1);
  cr_expect(strstr(r.body, "attnd_build_info{version=\""), "version label");
  const char *el[] = {"code=bad_request", NULL};
  cr_expect_eq(prom_sum(r.body, "attnd_errors_total", el, NULL), 1, "bad gzip counted");
  const char *rl[] = {"path=/attention", "code=400", NULL};
  cr_expect_eq(prom_sum(r.body, "attnd_requests_total", rl, NULL), 1);
  cr_expect(!strstr(r.body, "model=\""), "no model label on /attention:\n%s", r.body);
  http_res_free(&r);
}

Test(ops, help_lists_the_new_flags) {
  const char *args[] = {"--help", NULL};
  char *out = NULL;
  cr_expect_eq(run_attnd(args, NULL, 10, &out, NULL), 0);
  static const char *const want[] = {
      "--api-key KEY",        "ATTND_API_KEY]",
      "--api-key-file FILE",  "ATTND_API_KEY_FILE",
      "--tls-cert FILE",      "ATTND_TLS_CERT",
      "--tls-key FILE",       "ATTND_TLS_KEY",
      "--cors-origin ORIGIN", "ATTND_CORS_ORIGIN",
      "ATTND_LOG_FORMAT",     "--tls-priorities STRING",
      "ATTND_TLS_PRIORITIES", "SIGHUP and\nSIGUSR1 are logged and ignored"};
  for (size_t i = 0; i < sizeof want / sizeof *want; i++)
    cr_expect(out && strstr(out, want[i]), "--help lacks %s:\n%s", want[i], out);
  free(out);
}
