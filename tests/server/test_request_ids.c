/*
 * test_request_ids.c — request ids and JSON log lines through the real
 * attnd: an id echoed when fit for a log line and made when not, on replies,
 * on errors and on the HTTP layer's own refusals, in log lines, and
 * ATTND_LOG_FORMAT=json making every line one JSON object.
 */
#include "harness.h"

#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static srv S;
static void teardown(void) { srv_cleanup(&S); }
TestSuite(request_ids, .fini = teardown, .timeout = 120);

#define JSON_CT "Content-Type: application/json"

/* ---- request ids --------------------------------------------------------------- */

Test(request_ids, request_id_echoed_or_made) {
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
  /* each request is logged as it ends, in any order across HTTP threads */
  srv_wait_log(&S, " id=trace-42.a_b\n", 10);
  char *log = srv_log(&S);
  cr_expect(strstr(log, "GET /healthz 200") && strstr(log, " id=trace-42.a_b\n"),
            "the id in the log line:\n%s", log);
  cr_expect(strstr(log, "POST /attention 200"), "POST's line:\n%s", log);
  cr_expect(strstr(log, " id=e-413\n"), "the 413's id:\n%s", log);
  cr_expect(!strstr(log, "has space"), "a refused id must not reach the log:\n%s", log);
  free(log);
}

/* libmicrohttpd's own refusals (answered by server/mhd_shim.c) carry an id. */
Test(request_ids, request_id_on_the_http_layers_refusals) {
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

Test(request_ids, json_log_lines) {
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
