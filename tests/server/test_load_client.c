/*
 * test_load_client.c — `attn load` (clients/load_cmd.c) against a real attnd:
 * the closed loop's counts, the open loop's bookkeeping, HTTP errors counted
 * by status (503 from a queue of 0), exit 1 when nothing listens.
 *
 * No rates or durations are asserted (make test must pass on a loaded
 * machine); how attn load's request rate compares with wrk's is printed by
 * make bench-server (tests/bench/server_bench.c).
 *
 * The CLI is $ATTN_BIN (default build/attn), run as `$ATTN_BIN load ...
 * --json`; its one JSON object is parsed with cJSON.
 */
#include "harness.h"

#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static srv S;
static void teardown(void) { srv_cleanup(&S); }
TestSuite(load_client, .fini = teardown, .timeout = 60);

static const char *attn_bin(void) {
  const char *b = getenv("ATTN_BIN");
  return b && *b ? b : "build/attn";
}

/* Runs `$ATTN_BIN load <args>` with stdout captured; returns the exit
 * status (-1 when it did not exit normally) and, in *out, stdout. */
static int run_cmd(const char *cmd, char **out) {
  FILE *f = popen(cmd, "r");
  cr_assert(f, "popen %s", cmd);
  size_t cap = 1 << 14, len = 0;
  char *b = malloc(cap);
  size_t n;
  while ((n = fread(b + len, 1, cap - len - 1, f)) > 0) {
    len += n;
    if (len + 1 >= cap)
      b = realloc(b, cap *= 2);
  }
  b[len] = 0;
  int ws = pclose(f);
  *out = b;
  return WIFEXITED(ws) ? WEXITSTATUS(ws) : -1;
}

static int run_load(const char *url, const char *args, cJSON **pj) {
  char cmd[1024], *out;
  snprintf(cmd, sizeof cmd, "%s load %s %s --json", attn_bin(), url, args);
  int rc = run_cmd(cmd, &out);
  *pj = cJSON_Parse(out);
  if (!*pj)
    cr_log_error("%s: not JSON: %s", cmd, out);
  free(out);
  return rc;
}

static double num(const cJSON *j, const char *path) {
  /* "a.b" */
  char key[64];
  const cJSON *cur = j;
  const char *p = path;
  while (cur && *p) {
    size_t k = strcspn(p, ".");
    snprintf(key, sizeof key, "%.*s", (int)k, p);
    cur = cJSON_GetObjectItemCaseSensitive(cur, key);
    p += k + (p[k] == '.');
  }
  cr_assert(cur && cJSON_IsNumber(cur), "no number at %s", path);
  return cur->valuedouble;
}

static void expect_invariant(const cJSON *j) {
  double sent = num(j, "sent"), ans = num(j, "answered"), te = num(j, "transport_errors"),
         fl = num(j, "in_flight");
  cr_expect_eq(sent, ans + te + fl, "sent %g = answered %g + transport %g + in flight %g", sent,
               ans, te, fl);
  const cJSON *inv = cJSON_GetObjectItemCaseSensitive(j, "invariant");
  cr_expect(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(inv, "holds")));
  double tsum = 0;
  const cJSON *t =
      cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "errors"), "transport");
  const cJSON *e;
  cJSON_ArrayForEach(e, t) tsum += e->valuedouble;
  cr_expect_eq(tsum, te, "transport errors by kind add up");
}

Test(load_client, closed_loop_requests) {
  srv_start(&S, NULL);
  cJSON *j;
  int rc = run_load(S.url, "--requests 200 --concurrency 4 --shape 1,1,16,64", &j);
  cr_assert_eq(rc, 0);
  cr_assert(j);
  cr_expect_eq(num(j, "sent"), 200);
  cr_expect_eq(num(j, "answered"), 200);
  cr_expect_eq(num(j, "successful"), 200);
  cr_expect_eq(num(j, "in_flight"), 0);
  cr_expect_eq(num(j, "transport_errors"), 0);
  cr_expect_eq(num(j, "status.200"), 200);
  cr_expect_eq(num(j, "latency_ms.count"), 200);
  double p50 = num(j, "latency_ms.p50"), p99 = num(j, "latency_ms.p99"),
         mx = num(j, "latency_ms.max");
  cr_expect(p50 > 0 && p50 <= p99 && p99 <= mx, "p50 %g p99 %g max %g", p50, p99, mx);
  /* 4*D*N*N flops: 4*64*16*16 */
  cr_expect_eq(num(j, "flops_per_request"), 65536);
  cr_expect_gt(num(j, "gflops"), 0);
  cr_expect_gt(num(j, "requests_per_s"), 0);
  /* every request: the header and the 12 KiB body went out, the reply came back */
  cr_expect_gt(num(j, "bytes_sent"), 200.0 * num(j, "body_bytes"));
  cr_expect_gt(num(j, "bytes_received"), 200.0 * 16 * 64 * 4);
  expect_invariant(j);
  cJSON_Delete(j);
}

/* An open loop for a duration: how many it sends depends on the machine,
 * so only the bookkeeping is checked (every answer a success, counts adding
 * up, the rate asked for echoed). */
Test(load_client, open_loop_duration) {
  srv_start(&S, NULL);
  cJSON *j;
  int rc = run_load(S.url, "--rate 100 --duration 2 --shape 1,1,16,64", &j);
  cr_assert_eq(rc, 0);
  cr_assert(j);
  double sent = num(j, "sent");
  cr_expect_geq(sent, 1, "nothing sent in 2 s at 100 requests/s");
  cr_expect_eq(num(j, "successful"), num(j, "answered"));
  cr_expect_eq(num(j, "status.200"), num(j, "answered"));
  cr_expect_eq(num(j, "transport_errors"), 0);
  double r = num(j, "rate");
  cr_expect_eq(r, 100);
  expect_invariant(j);
  cJSON_Delete(j);
}

Test(load_client, open_loop_requests_and_json_body) {
  srv_start(&S, NULL);
  cJSON *j;
  int rc = run_load(
      S.url, "--rate 200 --requests 50 --shape 1,2,8,16 --json-body --query causal=true", &j);
  cr_assert_eq(rc, 0);
  cr_assert(j);
  cr_expect_eq(num(j, "sent"), 50);
  cr_expect_eq(num(j, "successful"), 50);
  cr_expect_eq(num(j, "in_flight"), 0);
  /* causal, N = 8: 36 visible pairs per head, 2 heads, 4*D flops each */
  cr_expect_eq(num(j, "flops_per_request"), 4.0 * 16 * 36 * 2);
  expect_invariant(j);
  cJSON_Delete(j);
}

/* --max-queue 0 refuses every job: all 40 are answered 503, counted by
 * status and not as successes. */
Test(load_client, errors_by_status) {
  srv_start(&S, "--max-queue", "0", NULL);
  cJSON *j;
  int rc = run_load(S.url, "--concurrency 8 --requests 40 --shape 1,4,64,64", &j);
  cr_assert_eq(rc, 0);
  cr_assert(j);
  double sent = num(j, "sent"), ans = num(j, "answered"), ok = num(j, "successful"),
         te = num(j, "transport_errors");
  const cJSON *st =
      cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "errors"), "status");
  const cJSON *e503 = cJSON_GetObjectItemCaseSensitive(st, "503");
  cr_expect(cJSON_IsNumber(e503) && e503->valuedouble == 40, "40 x 503");
  double http_err = 0;
  const cJSON *e;
  cJSON_ArrayForEach(e, st) http_err += e->valuedouble;
  cr_expect_eq(sent, 40);
  cr_expect_eq(num(j, "in_flight"), 0);
  cr_expect_eq(sent, ans + te, "sent = answered + transport errors");
  cr_expect_eq(ans, ok + http_err, "answered = successful + HTTP errors");
  cr_expect_eq(ok, 0, "nothing was admitted, yet %g successes", ok);
  cr_expect_eq(te, 0, "transport errors");
  expect_invariant(j);
  cJSON_Delete(j);
}

Test(load_client, server_down) {
  char url[64], cmd[256], *out;
  snprintf(url, sizeof url, "http://127.0.0.1:%d", free_port());
  /* An hour's run: only giving up at once ends it within the test's
   * timeout. */
  snprintf(cmd, sizeof cmd, "%s load %s --duration 3600 --shape 1,1,16,64 --json 2>/dev/null",
           attn_bin(), url);
  int rc = run_cmd(cmd, &out);
  cr_expect_eq(rc, 1, "exit status %d", rc);
  cJSON *j = cJSON_Parse(out);
  cr_assert(j, "server down: the output is not JSON: %s", out);
  free(out);
  cr_expect_eq(num(j, "answered"), 0);
  cr_expect_gt(num(j, "errors.transport.connect"), 0);
  expect_invariant(j);
  cJSON_Delete(j);
}

Test(load_client, bad_usage) {
  char cmd[256], *out;
  static const char *const bad[] = {
      "",
      "ftp://127.0.0.1:1",
      "http://127.0.0.1:1 --rate 10 --concurrency 2",
      "http://127.0.0.1:1 --requests 10 --duration 2",
      "http://127.0.0.1:1 --shape 1,2,3",
      "http://127.0.0.1:1 --concurrency 0",
      "http://127.0.0.1:1 --body /nonexistent/file",
      "http://127.0.0.1:1 --bogus",
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    snprintf(cmd, sizeof cmd, "%s load %s 2>/dev/null", attn_bin(), bad[i]);
    int rc = run_cmd(cmd, &out);
    cr_expect_eq(rc, 2, "\"%s\": exit %d", bad[i], rc);
    free(out);
  }
}

/* A server started with --api-key: attn load sends ATTND_API_KEY as a
 * Bearer token on every request; without it every answer is a 401. */
Test(load_client, api_key_from_the_environment) {
  srv_start(&S, "--api-key", "load-key-456", NULL);
  cJSON *j;
  setenv("ATTND_API_KEY", "load-key-456", 1);
  int rc = run_load(S.url, "--requests 20 --concurrency 2 --shape 1,1,16,64", &j);
  cr_assert_eq(rc, 0);
  cr_assert(j);
  cr_expect_eq(num(j, "status.200"), 20);
  cJSON_Delete(j);
  unsetenv("ATTND_API_KEY");
  rc = run_load(S.url, "--requests 20 --concurrency 2 --shape 1,1,16,64", &j);
  cr_assert(j);
  cr_expect_eq(num(j, "status.401"), 20);
  cJSON_Delete(j);
}
