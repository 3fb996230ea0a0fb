/*
 * test_api_key.c — the API key through the real attnd: 401 without it but
 * open probes, its sources (flag, variable, file) and their mistakes, never
 * shown in replies, logs or messages, and an empty key or variable refused;
 * several keys from one file, each request logged and counted under its
 * key's name.
 */
#include "harness.h"

#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static srv S;
static void teardown(void) {
  srv_cleanup(&S);
  remove_tmpdir();
}
TestSuite(api_key, .fini = teardown, .timeout = 120);

#define JSON_CT "Content-Type: application/json"
#define KEY "k3y-Sup3r.s3cret~42"

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

Test(api_key, api_key_required_except_probes) {
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
  /* each request is logged as it ends, in any order across HTTP threads */
  srv_wait_log(&S, "GET /v1/info 401", 10);
  char *log = srv_log(&S);
  cr_expect(!strstr(log, KEY), "the key in the log:\n%s", log);
  cr_expect(strstr(log, "GET /v1/info 401"), "401s logged:\n%s", log);
  free(log);
}

/* The key from the variable, from a file (flag or variable), and the
 * mistakes: both sources, an empty file, a key a header cannot carry —
 * whose message must not show it. */
Test(api_key, api_key_sources) {
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
  /* a key file's mistake names its line, never a key */
  char dup[128];
  snprintf(dup, sizeof dup, "%s/dup", dir);
  write_file(dup, "alice:sk-first-1\n# the same name again\nalice:sk-second-2\n");
  const char *dups[] = {"--api-key-file", dup, NULL};
  cr_expect_eq(run_attnd(dups, NULL, 10, NULL, &err), 2);
  cr_expect(err && strstr(err, "line 3") && strstr(err, "\"alice\"") && !strstr(err, "sk-") &&
                strchr(err, '\n') == err + strlen(err) - 1,
            "one line naming the line and the name, not the key: %s", err);
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
Test(api_key, empty_api_key_is_refused) {
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
Test(api_key, empty_variables_are_refused) {
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

/* The sample of name with labels (exactly one match) from /metrics, asked
 * with header h, once it reaches want or after 30 s: a request is counted
 * as it ends, which can be after its client read the reply. */
static double metric_reach(const char *const *h, const char *name, const char *const *labels,
                           double want) {
  double v = -1, deadline = now_s() + 30;
  do {
    http_res r;
    int n = 0;
    if (http_call(&S, "GET", "/metrics", h, NULL, 0, &r) == 200)
      v = prom_sum(r.body, name, labels, &n);
    http_res_free(&r);
    cr_assert(n <= 1, "%d series of %s", n, name);
  } while (v < want && now_s() < deadline && (sleep_s(0.02), true));
  return v;
}

#define KEY_A "sk-alice-0123456789abcdef"
#define KEY_B "sk-unnamed-fedcba9876543210"

/* Keys from a file (named, and one not): each works, a third string is
 * 401; /v1/info counts the keys; each log line names the key (never shows
 * it); the per-name counter counts each key's requests, and a key's
 * /metrics shows its own series only. */
Test(api_key, several_keys_from_a_file) {
  char *dir = make_tmpdir(), file[128];
  snprintf(file, sizeof file, "%s/keys", dir);
  write_file(file, "# the tenants\n\n  alice:" KEY_A "\n" KEY_B "\nops:sk-ops-42\n");
  srv_start(&S, "--api-key-file", file, NULL);
  const char *a[] = {"Authorization: Bearer " KEY_A, NULL};
  const char *b[] = {"Authorization: Bearer " KEY_B, NULL};
  const char *third[] = {"Authorization: Bearer sk-mallory-0000000000", NULL};
  cr_expect_eq(status_of("GET", "/attention/plan?seq_q=8&head_dim=8", a), 200, "alice's key");
  cr_expect_eq(status_of("GET", "/attention/plan?seq_q=8&head_dim=8", b), 200, "the unnamed key");
  cr_expect_eq(status_of("GET", "/attention/plan?seq_q=8&head_dim=8", b), 200);
  expect_401("GET", "/v1/info", third, NULL, 0, "a third string");
  expect_401("GET", "/v1/info", NULL, NULL, 0, "no key");

  http_res r;
  http_call(&S, "GET", "/v1/info", a, NULL, 0, &r);
  cr_expect_eq(r.status, 200);
  cr_expect(!strstr(r.body, KEY_A) && !strstr(r.body, KEY_B), "a key in /v1/info: %s", r.body);
  cJSON *j = cJSON_Parse(r.body), *sec = cJSON_GetObjectItemCaseSensitive(j, "security");
  cr_expect(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(sec, "api_key")), "%s", r.body);
  cr_expect_eq(cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(sec, "api_keys")), 3, "%s",
               r.body);
  cJSON_Delete(j);
  http_res_free(&r);

  const char *by_a[] = {"key=alice", NULL}, *by_b[] = {"key=key1", NULL};
  const char *fam = "attnd_requests_by_key_total";
  const char *ops[] = {"Authorization: Bearer sk-ops-42", NULL};
  /* at least: a key's own scrapes of /metrics count too */
  cr_expect_geq(metric_reach(a, fam, by_a, 2), 2, "alice's plan and /v1/info");
  cr_expect_geq(metric_reach(b, fam, by_b, 2), 2, "key1's plans");
  http_call(&S, "GET", "/metrics", ops, NULL, 0, &r);
  int n = 0;
  prom_sum(r.body, fam, NULL, &n);
  cr_expect_eq(n, 1, "ops sees its own series only:\n%s", r.body);
  cr_expect(!strstr(r.body, "alice") && !strstr(r.body, "key1"), "another key's name:\n%s", r.body);
  http_res_free(&r);
  srv_wait_log(&S, "GET /metrics 200", 10);
  srv_wait_log(&S, "GET /v1/info 401", 10);
  char *log = srv_log(&S);
  cr_expect(!strstr(log, KEY_A) && !strstr(log, KEY_B), "a key in the log:\n%s", log);
  cr_expect(strstr(log, " key=alice id="), "alice's lines name her key:\n%s", log);
  cr_expect(strstr(log, "GET /attention/plan 200") && strstr(log, " key=key1 id="),
            "the unnamed key's lines say key1:\n%s", log);
  cr_expect(strstr(log, " key=- id="), "a 401 names no key:\n%s", log);
  free(log);
}

/* The JSON log names the key too ("key", null for none); a keyless server's
 * lines have no key at all, and its /metrics no per-key family. */
Test(api_key, key_in_the_json_log_and_none_without_keys) {
  srv_start(&S, "--api-key", KEY, "--log-format", "json", NULL);
  const char *good[] = {"Authorization: Bearer " KEY, NULL};
  cr_expect_eq(status_of("GET", "/v1/info", good), 200);
  cr_expect_eq(status_of("GET", "/v1/info", NULL), 401);
  cr_expect(srv_wait_log(&S, "\"key\": \"default\"", 10), "--api-key is named default");
  cr_expect(srv_wait_log(&S, "\"key\": null", 10), "the 401 has no key");
  cr_expect_eq(
      metric_reach(good, "attnd_requests_by_key_total", (const char *[]){"key=default", NULL}, 1),
      1);
  srv_cleanup(&S);
  srv_start(&S, NULL);
  http_res r;
  cr_expect_eq(http_call(&S, "GET", "/metrics", NULL, NULL, 0, &r), 200);
  cr_expect(!strstr(r.body, "attnd_requests_by_key_total"), "a keyless server's metrics");
  http_res_free(&r);
  cr_expect(srv_wait_log(&S, "GET /metrics 200", 10));
  char *log = srv_log(&S);
  cr_expect(!strstr(log, " key="), "a keyless server's lines name no key:\n%s", log);
  free(log);
}
