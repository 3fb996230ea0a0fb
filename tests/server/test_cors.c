/*
 * test_cors.c — CORS through the real attnd: a preflight answered without
 * the key, the headers on replies and on errors, "*", off by default, and
 * an origin with a path refused.
 */
#define _GNU_SOURCE
#include "harness.h"

#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

static srv S;
static void teardown(void) { srv_cleanup(&S); }
TestSuite(cors, .fini = teardown, .timeout = 120);

#define KEY "k3y-Sup3r.s3cret~42"

Test(cors, cors_preflight_and_headers) {
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
