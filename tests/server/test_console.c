/*
 * test_console.c — the web console's files through the real attnd: GET /
 * and its script and style with their types, the Content-Security-Policy
 * and nosniff, ETag and 304, HEAD, 405 on other methods, 404 JSON next to
 * them, and no API key needed for the page (but still for the API it calls).
 * The page itself runs in a browser in tests/python/test_console.py.
 */
#define _GNU_SOURCE
#include "harness.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static srv S;

static void teardown(void) { srv_cleanup(&S); }

TestSuite(console, .fini = teardown, .timeout = 60);

static void expect_asset(const char *path, const char *type, const char *needle) {
  http_res rs;
  cr_assert_eq(http_get(&S, path, &rs), 0, "GET %s: %s", path, rs.error);
  char ct[128], csp[512], nosniff[32], etag[64];
  cr_expect_eq(rs.status, 200, "GET %s: %ld", path, rs.status);
  cr_expect(http_header(&rs, "Content-Type", ct, sizeof ct) && !strcmp(ct, type),
            "GET %s: Content-Type \"%s\", want \"%s\"", path, ct, type);
  cr_expect(http_header(&rs, "Content-Security-Policy", csp, sizeof csp) &&
                strstr(csp, "default-src 'self'") && strstr(csp, "script-src 'self'") &&
                strstr(csp, "connect-src 'self'") && strstr(csp, "frame-ancestors 'none'"),
            "GET %s: CSP \"%s\"", path, csp);
  cr_expect(http_header(&rs, "X-Content-Type-Options", nosniff, sizeof nosniff) &&
                !strcmp(nosniff, "nosniff"),
            "GET %s: no nosniff", path);
  cr_expect(http_header(&rs, "ETag", etag, sizeof etag) && etag[0] == '"', "GET %s: no ETag", path);
  cr_expect(rs.body && strstr(rs.body, needle), "GET %s: no \"%s\" in the body", path, needle);
  http_res_free(&rs);
}

Test(console, page_script_and_style_with_their_types) {
  srv_start(&S, "--threads", "1", NULL);
  expect_asset("/", "text/html; charset=utf-8", "<script src=\"/console/console.js\"");
  expect_asset("/", "text/html; charset=utf-8", "<script src=\"/console/console_live.js\"");
  expect_asset("/console/console.js", "text/javascript; charset=utf-8", "window.attnConsole");
  expect_asset("/console/console_plan.js", "text/javascript; charset=utf-8", "/attention/plan?");
  /* the sessions panel: the caller's sessions, and a delete for each */
  expect_asset("/console/console_live.js", "text/javascript; charset=utf-8",
               "api(\"/v1/sessions\")");
  expect_asset("/", "text/html; charset=utf-8", "id=\"sess-table\"");
  expect_asset("/console/console.css", "text/css; charset=utf-8", ".heatwrap");
  /* the playground's sinks: a field, sent as the request's tensor sinks */
  expect_asset("/", "text/html; charset=utf-8", "id=\"pg-sinks\"");
  expect_asset("/console/console.js", "text/javascript; charset=utf-8", "body.sinks = s;");
}

Test(console, etag_revalidates_with_304) {
  srv_start(&S, "--threads", "1", NULL);
  http_res rs;
  cr_assert_eq(http_get(&S, "/", &rs), 0);
  char etag[64], inm[128];
  cr_assert(http_header(&rs, "ETag", etag, sizeof etag));
  http_res_free(&rs);
  snprintf(inm, sizeof inm, "If-None-Match: W/\"nope\", %s", etag);
  const char *h[] = {inm, NULL};
  http_req rq = {.path = "/", .headers = h};
  cr_assert_eq(http_do(&S, &rq, &rs), 0);
  cr_expect_eq(rs.status, 304);
  cr_expect_eq(rs.len, 0);
  http_res_free(&rs);
  const char *other[] = {"If-None-Match: \"0000000000000000\"", NULL};
  rq.headers = other;
  cr_assert_eq(http_do(&S, &rq, &rs), 0);
  cr_expect_eq(rs.status, 200, "a stale ETag gets the page: %ld", rs.status);
  http_res_free(&rs);
}

Test(console, head_405_and_404) {
  srv_start(&S, "--threads", "1", NULL);
  http_res rs;
  http_req head = {.method = "HEAD", .path = "/"};
  cr_assert_eq(http_do(&S, &head, &rs), 0);
  char cl[32], ct[64];
  cr_expect_eq(rs.status, 200);
  cr_expect_eq(rs.len, 0, "HEAD sends no body");
  cr_expect(http_header(&rs, "Content-Length", cl, sizeof cl) && atol(cl) > 1000);
  cr_expect(http_header(&rs, "Content-Type", ct, sizeof ct) && !strncmp(ct, "text/html", 9));
  http_res_free(&rs);
  cr_assert_eq(http_post(&S, "/", "application/json", "{}", 2, &rs), 0);
  expect_error(&rs, 405, "method_not_allowed", "POST /");
  char allow[32];
  cr_expect(http_header(&rs, "Allow", allow, sizeof allow) && !strcmp(allow, "GET, HEAD"));
  cr_expect(!http_header(&rs, "ETag", allow, sizeof allow), "an error carries no ETag");
  http_res_free(&rs);
  http_req del = {.method = "DELETE", .path = "/console/console.js"};
  cr_assert_eq(http_do(&S, &del, &rs), 0);
  expect_error(&rs, 405, "method_not_allowed", "DELETE /console/console.js");
  http_res_free(&rs);
  const char *unknown[] = {"/console/", "/console/nope.js", "/index.html", "//"};
  for (size_t i = 0; i < sizeof unknown / sizeof *unknown; i++) {
    cr_assert_eq(http_get(&S, unknown[i], &rs), 0);
    expect_error(&rs, 404, "not_found", unknown[i]);
    http_res_free(&rs);
  }
}

/* The page holds no data and is served without the key; the API it calls
 * still wants it. */
Test(console, served_without_the_api_key) {
  srv_start(&S, "--threads", "1", "--api-key", "console-key", NULL);
  http_res rs;
  const char *open[] = {"/", "/console/console.js", "/console/console_plan.js",
                        "/console/console_live.js", "/console/console.css"};
  for (size_t i = 0; i < sizeof open / sizeof *open; i++) {
    cr_assert_eq(http_get(&S, open[i], &rs), 0);
    cr_expect_eq(rs.status, 200, "GET %s with --api-key: %ld", open[i], rs.status);
    http_res_free(&rs);
  }
  cr_assert_eq(http_get(&S, "/v1/info", &rs), 0);
  expect_error(&rs, 401, "unauthorized", "GET /v1/info without the key");
  http_res_free(&rs);
}

/* A computed request's reply says how long it spent in the server, which
 * the console shows. */
Test(console, server_timing_on_computed_replies) {
  srv_start(&S, "--threads", "1", NULL);
  static const char body[] = "{\"q\": [[1, 0]], \"k\": [[1, 0]], \"v\": [[1, 2]]}";
  http_res rs;
  cr_assert_eq(http_post(&S, "/attention", "application/json", body, strlen(body), &rs), 0);
  cr_expect_eq(rs.status, 200);
  char st[200];
  cr_expect(http_header(&rs, "Server-Timing", st, sizeof st) && strstr(st, "queue;dur=") &&
                strstr(st, "compute;dur=") && strstr(st, "total;dur="),
            "Server-Timing \"%s\"", st);
  http_res_free(&rs);
}
