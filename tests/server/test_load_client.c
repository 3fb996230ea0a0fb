/*
 * test_load_client.c — `attn load` (clients/load_cmd.c) against a real attnd:
 * the closed loop's counts, the open loop's schedule, HTTP errors counted by
 * status (503 from a full queue), exit 1 when nothing listens, and request
 * rates that agree with wrk's on the same closed-loop load.
 *
 * The CLI is $ATTN_BIN (default build/attn), run as `$ATTN_BIN load ...
 * --json`; its one JSON object is parsed with cJSON.
 */
#include "harness.h"

#include "benchlib.h"
#include "proto.h"

#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static srv S;
static char body_path[64];
static void teardown(void) {
  srv_cleanup(&S);
  if (body_path[0])
    unlink(body_path);
  body_path[0] = 0;
}
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
  if (pj && !*pj)
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
  cr_expect_eq(sent, ans + te + fl, "sent %g = answered %g + transport %g + in flight %g",
               sent, ans, te, fl);
  const cJSON *inv = cJSON_GetObjectItemCaseSensitive(j, "invariant");
  cr_expect(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(inv, "holds")));
  double tsum = 0;
  const cJSON *t = cJSON_GetObjectItemCaseSensitive(
      cJSON_GetObjectItemCaseSensitive(j, "errors"), "transport");
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

Test(load_client, open_loop_rate) {
  srv_start(&S, NULL);
  cJSON *j;
  int rc = run_load(S.url, "--rate 100 --duration 2 --shape 1,1,16,64", &j);
  cr_assert_eq(rc, 0);
  cr_assert(j);
  double sent = num(j, "sent");
  cr_expect(sent >= 170 && sent <= 230, "sent %g, about 200 expected", sent);
  cr_expect_geq(num(j, "answered"), sent - 2);
  cr_expect_eq(num(j, "successful"), num(j, "answered"));
  cr_expect_eq(num(j, "transport_errors"), 0);
  double r = num(j, "rate");
  cr_expect_eq(r, 100);
  expect_invariant(j);
  cJSON_Delete(j);
}

Test(load_client, open_loop_requests_and_json_body) {
  srv_start(&S, NULL);
  cJSON *j;
  int rc = run_load(S.url,
                    "--rate 200 --requests 50 --shape 1,2,8,16 --json-body --query causal=true",
                    &j);
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

Test(load_client, errors_by_status) {
  srv_start(&S, "--max-queue", "1", NULL);
  cJSON *j;
  int rc = run_load(S.url,
                    "--concurrency 8 --requests 40 --shape 1,4,512,64 "
                    "--query backend=reference",
                    &j);
  cr_assert_eq(rc, 0);
  cr_assert(j);
  double sent = num(j, "sent"), ans = num(j, "answered"), ok = num(j, "successful"),
         te = num(j, "transport_errors");
  const cJSON *st = cJSON_GetObjectItemCaseSensitive(
      cJSON_GetObjectItemCaseSensitive(j, "errors"), "status");
  const cJSON *e503 = cJSON_GetObjectItemCaseSensitive(st, "503");
  cr_expect(cJSON_IsNumber(e503) && e503->valuedouble > 0, "some 503s");
  double http_err = 0;
  const cJSON *e;
  cJSON_ArrayForEach(e, st) http_err += e->valuedouble;
  cr_expect_eq(sent, 40);
  cr_expect_eq(num(j, "in_flight"), 0);
  cr_expect_eq(sent, ans + te, "sent = answered + transport errors");
  cr_expect_eq(ans, ok + http_err, "answered = successful + HTTP errors");
  cr_expect_geq(ok, 1, "the admitted ones succeed");
  expect_invariant(j);
  cJSON_Delete(j);
}

Test(load_client, server_down) {
  char url[64], cmd[256], *out;
  snprintf(url, sizeof url, "http://127.0.0.1:%d", free_port());
  snprintf(cmd, sizeof cmd, "%s load %s --duration 2 --shape 1,1,16,64 --json 2>/dev/null",
           attn_bin(), url);
  double t0 = now_s();
  int rc = run_cmd(cmd, &out);
  cr_expect_eq(rc, 1, "exit status %d", rc);
  cr_expect_lt(now_s() - t0, 1.5, "gives up at once");
  cJSON *j = cJSON_Parse(out);
  if (j) {
    cr_expect_eq(num(j, "answered"), 0);
    cr_expect_gt(num(j, "errors.transport.connect"), 0);
    expect_invariant(j);
    cJSON_Delete(j);
  }
  free(out);
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

/* wrk's request rate from its RESULT line (clients/wrk/post.lua) or its
 * "Requests/sec:" line; -1 when neither is there. */
static double wrk_rate(const char *out) {
  long req, dur;
  const char *r = strstr(out, "RESULT ");
  if (r && sscanf(r, "RESULT requests=%ld duration_us=%ld", &req, &dur) == 2 && dur > 0)
    return (double)req / ((double)dur * 1e-6);
  const char *q = strstr(out, "Requests/sec:");
  double v;
  if (q && sscanf(q, "Requests/sec: %lf", &v) == 1)
    return v;
  return -1;
}

Test(load_client, agrees_with_wrk, .timeout = 60) {
  if (system("command -v wrk >/dev/null 2>&1") != 0)
    cr_skip_test("wrk is not installed");
  if (access("clients/wrk/post.lua", R_OK) != 0)
    cr_skip_test("clients/wrk/post.lua not found (run from the repository root)");
  attn_bench_case bc;
  cr_assert_eq(attn_bench_case_init(&bc, 1, 2, 2, 64, 64, 64, ATTN_F32, false, 7), 0);
  size_t len;
  void *body;
  attn_status st;
  cr_assert_eq(attn_proto_encode_request_safetensors(&bc.req, NULL, &body, &len, &st), 0);
  attn_bench_case_free(&bc);
  snprintf(body_path, sizeof body_path, "/tmp/attn-load-test-%d.safetensors", (int)getpid());
  FILE *f = fopen(body_path, "wb");
  cr_assert(f && fwrite(body, 1, len, f) == len);
  fclose(f);
  free(body);

  srv_start(&S, NULL);
  char cmd[1024], *out;
  snprintf(cmd, sizeof cmd,
           "ATTND_BODY=%s wrk -t1 -c4 -d3s -s clients/wrk/post.lua %s/attention 2>&1", body_path,
           S.url);
  int rc = run_cmd(cmd, &out);
  double wrk = wrk_rate(out);
  cr_assert(rc == 0 && wrk > 0, "wrk: exit %d, output %s", rc, out);
  free(out);

  cJSON *j;
  char args[256];
  snprintf(args, sizeof args, "--concurrency 4 --duration 3 --body %s", body_path);
  rc = run_load(S.url, args, &j);
  cr_assert_eq(rc, 0);
  cr_assert(j);
  double ours = num(j, "requests_per_s");
  cr_expect_eq(num(j, "successful"), num(j, "answered"));
  cr_expect_eq(num(j, "transport_errors"), 0);
  cr_expect_gt(num(j, "gflops"), 0, "the shape was read from the safetensors file");
  expect_invariant(j);
  cJSON_Delete(j);
  cr_log_info("closed loop, 4 connections, 3 s: wrk %.1f requests/s, attn load %.1f", wrk,
              ours);
  fprintf(stderr, "wrk %.1f requests/s, attn load %.1f requests/s (ratio %.3f)\n", wrk, ours,
          ours / wrk);
  cr_expect(ours >= 0.8 * wrk && ours <= 1.2 * wrk,
            "attn load %.1f requests/s vs wrk %.1f: more than 20%% apart", ours, wrk);
}
