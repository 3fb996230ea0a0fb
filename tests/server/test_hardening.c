/*
 * test_hardening.c — what a hostile client tries against the HTTP front:
 * smuggling with conflicting framing headers, idle connections that would
 * lock everyone out, headers dribbled forever, libmicrohttpd's own refusals
 * (which must be the documented JSON error, sent once), targets that exhaust
 * its memory pool, and log lines forged through the path.
 *
 * No test measures time: each waits for the event it names (a reply, a
 * close), bounded only by a generous timeout that the broken behaviour
 * would outlast (libmicrohttpd's 30 s idle timeout, a 1 s header deadline
 * against a client that keeps dribbling).
 */
#include "harness.h"
#include "strict_json.h"

#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

static srv S;

static void teardown(void) { srv_cleanup(&S); }

/* ---- helpers -------------------------------------------------------------- */

/* Everything the server sends until it closes (or timeout_ms), NUL-ended. */
static char *read_all(int fd, int timeout_ms, size_t *plen) {
  size_t cap = 1 << 16, n = 0;
  char *b = malloc(cap + 1);
  double deadline = now_s() + timeout_ms / 1000.0;
  struct timeval tv = {0, 100000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  while (now_s() < deadline) {
    if (n == cap)
      b = realloc(b, (cap *= 2) + 1);
    ssize_t k = recv(fd, b + n, cap - n, 0);
    if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR))
      break;
    if (k > 0)
      n += (size_t)k;
  }
  b[n] = 0;
  if (plen)
    *plen = n;
  return b;
}

static int count_of(const char *hay, const char *needle) {
  int n = 0;
  for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle))
    n++;
  return n;
}

/* Whether s[0..n) is what a strict JSON or log reader accepts: valid UTF-8
 * (tests/lib/strict_json.h's own decoder) and no control byte but newline. */
static bool clean_utf8(const unsigned char *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    if ((s[i] < 0x20 && s[i] != '\n') || s[i] == 0x7F)
      return false;
  return strict_utf8((const char *)s, n);
}

/* Sends req on a fresh connection and checks the single reply is the JSON
 * error (status, code) and that the connection then closes. */
static void expect_refusal(const char *req, size_t len, int status, const char *code) {
  int fd = raw_connect(S.port);
  cr_assert_geq(fd, 0);
  raw_send(fd, req, len);
  size_t n;
  char *all = read_all(fd, 20000, &n);
  close(fd);
  char line[32];
  snprintf(line, sizeof line, "HTTP/1.1 %d ", status);
  cr_expect_eq(strncmp(all, line, strlen(line)), 0, "want %d for %.60s, got: %.300s", status, req,
               all);
  cr_expect_eq(count_of(all, "\r\nContent-Length:"), 1, "one header block, got: %.400s", all);
  http_res rs = {0};
  char *body = strstr(all, "\r\n\r\n");
  rs.status = status;
  rs.hdrs = all;
  rs.hlen = body ? (size_t)(body - all) : n;
  rs.body = body ? body + 4 : (char *)"";
  rs.len = strlen(rs.body);
  if (code) /* NULL: /v2's error shape, {"error": message} */
    cr_expect(expect_error(&rs, status, code, req));
  else
    cr_expect(!strncmp(rs.body, "{\"error\": \"", 11), "not /v2's error: %s", rs.body);
  cr_expect(clean_utf8((const unsigned char *)rs.body, rs.len), "body not clean UTF-8");
  free(all);
}

#define REFUSE(lit, status, code) expect_refusal(lit, sizeof lit - 1, status, code)

/* The server's log once it has at least n lines containing needle (the
 * reply can reach the client before its log line is written), or after 20 s
 * without. */
static char *log_with(const char *needle, int n) {
  char *log = srv_log(&S);
  for (int i = 0; i < 200 && count_of(log, needle) < n; i++) {
    free(log);
    sleep_s(0.1);
    log = srv_log(&S);
  }
  return log;
}

/* ---- smuggling ---------------------------------------------------------------- */

Test(hardening, conflicting_content_lengths_are_refused, .fini = teardown, .timeout = 60) {
  srv_start(&S, NULL);
  /* With the first length, 34 bytes would be a second request. */
  REFUSE("POST /attention HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
         "Content-Length: 5\r\nContent-Length: 39\r\n\r\n"
         "{\"q\":GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n",
         400, "bad_request");
  REFUSE("POST /attention HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
         "Content-Length: 10\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
         400, "bad_request");
  REFUSE(
      "GET /healthz HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\nContent-Length: 45\r\n\r\n"
      "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n",
      400, "bad_request");
  char *log = srv_log(&S);
  cr_expect(!strstr(log, "GET /metrics"), "a smuggled request was served:\n%s", log);
  free(log);
  expect_healthy(&S, "smuggling attempts");
}

Test(hardening, unknown_transfer_codings_get_501_at_once, .fini = teardown, .timeout = 60) {
  srv_start(&S, NULL);
  REFUSE("POST /attention HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
         "Transfer-Encoding: gzip\r\n\r\nabc",
         501, "not_implemented");
  REFUSE("POST /attention HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
         "Transfer-Encoding: xchunked\r\n\r\nabc",
         501, "not_implemented");
  REFUSE("POST /attention HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
         "Transfer-Encoding: chunked\r\nTransfer-Encoding: gzip\r\n\r\n",
         501, "not_implemented");
}

/* Whitespace between a field name and its colon (RFC 9112 §5.1): stored as
 * another field, it framed the POST with no body, and the body was served
 * as a second request (two replies: 400, then 200 /v1/info). */
Test(hardening, whitespace_before_a_colon_smuggles_nothing, .fini = teardown, .timeout = 90) {
  srv_start(&S, NULL);
  const char *names[] = {
      "Content-Length :", "Content-Length\t:", "Content-Length  :", "Transfer-Encoding :"};
  for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
    char req[300];
    bool te = strstr(names[i], "Transfer");
    int n =
        snprintf(req, sizeof req,
                 "POST /v1/info HTTP/1.1\r\nHost: localhost\r\n%s %s\r\n\r\n%s"
                 "GET /v1/info HTTP/1.1\r\nHost: localhost\r\n\r\n%s",
                 names[i], te ? "chunked" : "39", te ? "27\r\n" : "", te ? "\r\n0\r\n\r\n" : "");
    expect_refusal(req, (size_t)n, 400, "bad_request");
  }
  char *log = log_with("GET /v1/info", 1);
  cr_expect_eq(count_of(log, "GET /v1/info 200"), 0, "a smuggled request was served:\n%s", log);
  free(log);
}

/* libmicrohttpd's only 500 of its own comes from a chunk-size line too long
 * for its buffer: the client's doing, a 400, and nothing to page anyone. */
Test(hardening, an_overlong_chunk_line_is_the_client_fault, .fini = teardown, .timeout = 90) {
  srv_start(&S, NULL);
  size_t cap = 120000;
  char *req = malloc(cap);
  const char *head =
      "POST /attention HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
      "Transfer-Encoding: chunked\r\n\r\n";
  for (int kind = 0; kind < 2; kind++) {
    size_t n = (size_t)snprintf(req, cap, "%s%s", head, kind ? "" : "5;");
    memset(req + n, kind ? '0' : 'e', 100000); /* leading zeros, or an extension */
    n += 100000;
    n += (size_t)snprintf(req + n, cap - n, "%s\r\nhello\r\n0\r\n\r\n", kind ? "5" : "");
    expect_refusal(req, n, 400, "bad_request");
  }
  free(req);
  const char *internal[] = {"code=internal", NULL};
  cr_expect_eq(srv_metric(&S, "attnd_errors_total", internal), 0, "counted as internal errors");
  expect_healthy(&S, "overlong chunk lines");
}

/* What C strings hide, and what two readers count differently: a NUL in
 * the target or a header value, %00, fields that take one value given
 * twice, a space in the target. Each is one 400, and the connection
 * closes. */
Test(hardening, nul_bytes_and_doubled_fields_are_refused, .fini = teardown, .timeout = 90) {
  srv_start(&S, "--api-key", "k3y", NULL);
  static const char nul_target[] = "GET /healthz\0x HTTP/1.1\r\nHost: localhost\r\n\r\n";
  expect_refusal(nul_target, sizeof nul_target - 1, 400, "bad_request");
  static const char nul_key[] =
      "GET /v1/info HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer k3y\0junk\r\n\r\n";
  expect_refusal(nul_key, sizeof nul_key - 1, 400, "bad_request");
  static const char nul_mid[] = "GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-A: a\0b\r\n"
                                "User-Agent: t\r\n\r\n";
  expect_refusal(nul_mid, sizeof nul_mid - 1, 400, "bad_request");
  REFUSE("GET /healthz%00x HTTP/1.1\r\nHost: localhost\r\n\r\n", 400, "bad_request");
  REFUSE("GET /attention/plan?seq_q=8%00&head_dim=4 HTTP/1.1\r\nHost: localhost\r\n"
         "Authorization: Bearer k3y\r\n\r\n",
         400, "bad_request");
  REFUSE("GET /heal thz HTTP/1.1\r\nHost: localhost\r\n\r\n", 400, "bad_request");
  REFUSE("GET /healthz HTTP/1.1\r\nHost: localhost\r\nHost: evil\r\n\r\n", 400, "bad_request");
  REFUSE("GET /v1/info HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer k3y\r\n"
         "Authorization: Bearer other\r\n\r\n",
         400, "bad_request");
  REFUSE("POST /attention HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer k3y\r\n"
         "Content-Type: application/json\r\nContent-Encoding: gzip\r\nContent-Encoding: "
         "identity\r\nContent-Length: 2\r\n\r\n{}",
         400, "bad_request");
  REFUSE("POST /v2/models/attention/infer HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer "
         "k3y\r\nInference-Header-Content-Length: 2\r\nInference-Header-Content-Length: 1\r\n"
         "Content-Length: 2\r\n\r\n{}",
         400, NULL);
  REFUSE("GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Folded: a\r\n b\r\n\r\n", 400,
         "bad_request");
  /* what is legal still passes: bare LF line ends, empty values, repeats of
   * a field that may repeat */
  int fd = raw_connect(S.port);
  cr_assert_geq(fd, 0);
  raw_sends(fd, "GET /healthz HTTP/1.1\nHost: localhost\nX-A:\nX-B: \nAccept: a\nAccept: b\n\n");
  http_res rs;
  cr_expect_eq(raw_response(fd, 20000, &rs), 200, "%s", rs.body ? rs.body : rs.error);
  http_res_free(&rs);
  close(fd);
}

/* "%2F" in a path must not become a separator: a proxy that routes by
 * path never saw /v2/models/attention/ready. */
Test(hardening, an_escaped_slash_is_no_separator, .fini = teardown, .timeout = 60) {
  srv_start(&S, NULL);
  http_res rs;
  cr_assert_eq(http_get(&S, "/v2/models/attention%2fready", &rs), 0);
  cr_expect_eq(rs.status, 404, "served as a path of three segments: %s", rs.body);
  http_res_free(&rs);
  cr_assert_eq(http_get(&S, "/attention/plan?seq_q=8&head_dim=4&dtype=F%33%32", &rs), 0);
  cr_expect_eq(rs.status, 200, "a query's escapes are no longer decoded: %s", rs.body);
  http_res_free(&rs);
}

/* libmicrohttpd closes a connection whose request line has no space
 * without a word to attnd: it is still logged as the 400 it is. */
Test(hardening, a_request_line_without_spaces_is_logged, .fini = teardown, .timeout = 60) {
  srv_start(&S, NULL);
  int fd = raw_connect(S.port);
  cr_assert_geq(fd, 0);
  raw_sends(fd, "GARBAGE\r\n\r\n");
  cr_expect_geq(raw_wait_close(fd, 20000), 0, "the connection stayed open");
  close(fd);
  char *log = log_with(" 400 ", 1);
  cr_expect(strstr(log, "could not parse) 400"), "no log line for the request line:\n%s", log);
  free(log);
  const char *bad[] = {"code=bad_request", NULL};
  cr_expect_eq(srv_metric(&S, "attnd_errors_total", bad), 1);
}

/* GET /healthz with each of these Host headers is served. */
static void expect_hosts_served(const char *const *hosts) {
  for (int i = 0; hosts[i]; i++) {
    const char *hdrs[] = {hosts[i], NULL};
    http_req rq = {.path = "/healthz", .headers = hdrs};
    http_res rs;
    cr_assert_eq(http_do(&S, &rq, &rs), 0);
    cr_expect_eq(rs.status, 200, "%s refused: %s", hosts[i], rs.body);
    http_res_free(&rs);
  }
}

/* A keyless server answers only the hosts it is reached by: a page that
 * rebinds its own name to 127.0.0.1 sends that name as Host. And a page of
 * another origin computes nothing, though /v2 needs no Content-Type (a
 * browser sends such a POST without asking first). */
Test(hardening, a_keyless_server_answers_its_own_hosts_and_origin, .fini = teardown,
     .timeout = 90) {
  srv_start(&S, NULL);
  REFUSE("GET /v1/info HTTP/1.1\r\nHost: rebind.example:8080\r\n\r\n", 403, "forbidden");
  REFUSE("POST /v2/models/attention/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
         "Origin: http://evil.example\r\nContent-Length: 2\r\n\r\n{}",
         403, NULL);
  const char *own[] = {"Host: localhost:8080", "Host: 127.0.0.1", "Host: [::1]:8080", NULL};
  expect_hosts_served(own);
  srv_cleanup(&S);
  /* --allowed-hosts names more; an API key makes the Host check moot */
  srv_start(&S, "--allowed-hosts", "attnd,.svc.example", NULL);
  const char *named[] = {"Host: attnd:8080", "Host: a.svc.example", NULL};
  expect_hosts_served(named);
  srv_cleanup(&S);
  srv_start(&S, "--api-key", "k3y", NULL);
  const char *keyed[] = {"Host: rebind.example", "Authorization: Bearer k3y", NULL};
  http_req rq = {.path = "/v1/info", .headers = keyed};
  http_res rs;
  cr_assert_eq(http_do(&S, &rq, &rs), 0);
  cr_expect_eq(rs.status, 200, "a keyed server checked the Host: %s", rs.body);
  http_res_free(&rs);
}

Test(hardening, absolute_form_targets_are_served, .fini = teardown, .timeout = 60) {
  srv_start(&S, NULL);
  int fd = raw_connect(S.port);
  cr_assert_geq(fd, 0);
  raw_sends(fd, "GET http://127.0.0.1/healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
  http_res rs;
  cr_expect_eq(raw_response(fd, 20000, &rs), 200, "%s", rs.body ? rs.body : rs.error);
  http_res_free(&rs);
  raw_sends(fd, "GET HTTP://127.0.0.1:8080/attention/plan?seq_q=8&head_dim=4 HTTP/1.1\r\n"
                "Host: 127.0.0.1\r\n\r\n");
  cr_expect_eq(raw_response(fd, 20000, &rs), 200, "%s", rs.body ? rs.body : rs.error);
  http_res_free(&rs);
  close(fd);
}

/* ---- libmicrohttpd's own refusals --------------------------------------------- */

Test(hardening, bad_content_length_is_one_json_400, .fini = teardown, .timeout = 90) {
  srv_start(&S, NULL);
  const char *values[] = {"-1", "abc", "+5", "", "1 2"};
  for (size_t i = 0; i < sizeof values / sizeof *values; i++) {
    char req[200];
    int n =
        snprintf(req, sizeof req,
                 "POST /attention HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                 "Content-Length: %s\r\n\r\n{}",
                 values[i]);
    expect_refusal(req, (size_t)n, 400, "bad_request");
  }
  REFUSE("POST /attention HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
         "Content-Length: 99999999999999999999999\r\n\r\n{}",
         413, "too_large");
  char *log = log_with(" 400 in=", 5);
  cr_expect_geq(count_of(log, " 400 in="), 5, "each refusal logged with 400:\n%s", log);
  cr_expect_eq(count_of(log, "<html>"), 0, "HTML in the log:\n%s", log);
  free(log);
}

Test(hardening, versions_and_malformed_lines_get_json, .fini = teardown, .timeout = 90) {
  srv_start(&S, NULL);
  REFUSE("GET /healthz HTTP/2.0\r\nHost: localhost\r\n\r\n", 505, "http_version_not_supported");
  REFUSE("GET /healthz HTTP/0.9\r\nHost: localhost\r\n\r\n", 505, "http_version_not_supported");
  REFUSE("GET /healthz HTTP/1.1\r\nHost: localhost\r\nno colon here\r\n\r\n", 400, "bad_request");
  REFUSE("GET /healthz HTTP/1.1\r\n\r\n", 400, "bad_request"); /* no Host */
  REFUSE("POST /attention HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
         "Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
         400, "bad_request");
}

/* A target or headers bigger than the connection's memory: refused at once
 * (libmicrohttpd ran out of pool and answered nothing for 30 s). */
Test(hardening, oversized_targets_and_headers, .fini = teardown, .timeout = 90) {
  srv_start(&S, NULL);
  size_t cap = 200000;
  char *req = malloc(cap);
  /* 1,000 query parameters in a 6 KB URL */
  size_t n = (size_t)snprintf(req, cap, "GET /healthz?");
  for (int i = 0; i < 1000; i++)
    n += (size_t)snprintf(req + n, cap - n, "%sa%d=1", i ? "&" : "", i);
  n += (size_t)snprintf(req + n, cap - n, " HTTP/1.1\r\nHost: localhost\r\n\r\n");
  expect_refusal(req, n, 414, "uri_too_long");
  /* a 100 KB target */
  n = (size_t)snprintf(req, cap, "GET /");
  memset(req + n, 'a', 100000);
  n += 100000;
  n += (size_t)snprintf(req + n, cap - n, " HTTP/1.1\r\nHost: localhost\r\n\r\n");
  expect_refusal(req, n, 414, "uri_too_long");
  /* 100 KB of headers */
  n = (size_t)snprintf(req, cap, "GET /healthz HTTP/1.1\r\nHost: localhost\r\n");
  for (int i = 0; i < 2000; i++)
    n += (size_t)snprintf(req + n, cap - n, "X-Pad-%d: %040d\r\n", i, i);
  n += (size_t)snprintf(req + n, cap - n, "\r\n");
  expect_refusal(req, n, 431, "headers_too_large");
  free(req);
  free(log_with(" 414 in=", 2)); /* each logged as it ends, in any order */
  char *log = log_with(" 431 in=", 1);
  cr_expect_geq(count_of(log, " 414 in="), 2, "414s logged:\n%s", log);
  cr_expect_geq(count_of(log, " 431 in="), 1, "431 logged:\n%s", log);
  free(log);
  expect_healthy(&S, "oversized requests");
}

/* A head of exactly size bytes: the request line, Host, Connection:
 * close, extra (the framing of a body, or ""), X-Pad fields of up to
 * 1,000 bytes each, and the blank line. */
static size_t head_of(char *out, size_t size, const char *line, const char *extra) {
  size_t n = (size_t)sprintf(out, "%sHost: localhost\r\nConnection: close\r\n%s", line, extra);
  for (int i = 0; n + 2 < size; i++) {
    size_t left = size - 2 - n, take = left > 1000 ? 1000 : left;
    if (left - take > 0 && left - take < 16) /* no field too short for its name */
      take -= 16;
    int name = sprintf(out + n, "X-Pad-%d: ", i);
    memset(out + n + name, 'a', take - (size_t)name - 2);
    memcpy(out + n + take - 2, "\r\n", 2);
    n += take;
  }
  memcpy(out + n, "\r\n", 3);
  return n + 2;
}

/* The reply to one raw request on its own connection. */
static char *exchange(const char *req, size_t len) {
  int fd = raw_connect(S.port);
  cr_assert_geq(fd, 0);
  raw_send(fd, req, len);
  size_t n;
  char *all = read_all(fd, 20000, &n);
  close(fd);
  return all;
}

/* A head up to 16 KiB in 100 fields is served, body and all; a byte or a
 * field more is a JSON 431 that says the limit. */
Test(hardening, heads_up_to_16_KiB_are_served_and_larger_get_431, .fini = teardown, .timeout = 90) {
  srv_start(&S, NULL);
  static char req[20000];
  size_t n = head_of(req, 16384, "GET /healthz HTTP/1.1\r\n", "");
  cr_assert_eq(n, 16384);
  char *all = exchange(req, n);
  cr_expect(!strncmp(all, "HTTP/1.1 200 ", 13), "a 16 KiB head: %.300s", all);
  free(all);
  /* a POST whose head is at the limit still reads its body */
  const char *body = "{\"q\": [[1, 0], [0, 1]], \"k\": [[1, 0], [0, 1]], \"v\": [[1, 2], [3, 4]]}";
  char framing[120];
  snprintf(framing, sizeof framing, "Content-Type: application/json\r\nContent-Length: %zu\r\n",
           strlen(body));
  n = head_of(req, 16384, "POST /attention HTTP/1.1\r\n", framing);
  memcpy(req + n, body, strlen(body));
  all = exchange(req, n + strlen(body));
  cr_expect(!strncmp(all, "HTTP/1.1 200 ", 13), "a POST with a 16 KiB head: %.300s", all);
  cr_expect(strstr(all, "\"o\""), "no output: %.300s", all);
  free(all);
  /* one byte more */
  n = head_of(req, 16385, "GET /healthz HTTP/1.1\r\n", "");
  expect_refusal(req, n, 431, "headers_too_large");
  all = exchange(req, n);
  cr_expect(strstr(all, "16385 bytes") && strstr(all, "at most 16384 bytes"), "%.600s", all);
  free(all);
  /* 101 fields in a small head */
  n = (size_t)sprintf(req, "GET /healthz HTTP/1.1\r\nHost: localhost\r\n");
  for (int i = 0; i < 100; i++)
    n += (size_t)sprintf(req + n, "X-%d: 1\r\n", i);
  n += (size_t)sprintf(req + n, "\r\n");
  expect_refusal(req, n, 431, "headers_too_large");
  /* past what the connection's memory holds: libmicrohttpd's own 431,
   * with the same limit in its words */
  n = (size_t)sprintf(req, "GET /healthz HTTP/1.1\r\nHost: localhost\r\n");
  for (int i = 0; i < 600; i++)
    n += (size_t)sprintf(req + n, "X-%d: 1\r\n", i);
  n += (size_t)sprintf(req + n, "\r\n");
  all = exchange(req, n);
  cr_expect(!strncmp(all, "HTTP/1.1 431 ", 13) && strstr(all, "at most 16384 bytes"), "%.600s",
            all);
  free(all);
  expect_healthy(&S, "heads at and past the limit");
}

/* ---- error messages and logs stay clean -------------------------------------- */

Test(hardening, error_messages_are_clean_utf8, .fini = teardown, .timeout = 60) {
  srv_start(&S, NULL);
  /* a path whose 80th byte falls inside a two-byte character */
  char path[200] = "/";
  for (int i = 0; i < 40; i++)
    strcat(path, "\xC3\xA9");
  http_res rs;
  cr_assert_eq(http_get(&S, path, &rs), 0);
  cr_expect(expect_error(&rs, 404, "not_found", "long UTF-8 path"));
  cr_expect(clean_utf8((const unsigned char *)rs.body, rs.len), "404 body: %s", rs.body);
  http_res_free(&rs);
  const char *hdr[] = {"Content-Type: text/\xFF\x1B[31m", NULL};
  http_req rq = {.method = "POST", .path = "/attention", .headers = hdr, .body = "{}", .len = 2};
  cr_assert_eq(http_do(&S, &rq, &rs), 0);
  cr_expect(expect_error(&rs, 415, "unsupported_media_type", "bad content type"));
  cr_expect(clean_utf8((const unsigned char *)rs.body, rs.len), "415 body: %s", rs.body);
  cJSON *j = cJSON_Parse(rs.body);
  cr_expect(j, "415 body is not JSON: %s", rs.body);
  cJSON_Delete(j);
  http_res_free(&rs);
}

static void check_log_clean(const char *forged) {
  int fd = raw_connect(S.port);
  cr_assert_geq(fd, 0);
  raw_sends(fd, forged);
  http_res rs;
  cr_expect_eq(raw_response(fd, 20000, &rs), 404);
  http_res_free(&rs);
  close(fd);
  expect_healthy(&S, "forged path");
  size_t n;
  char *log = read_file_all(S.log, &n);
  cr_assert(log);
  cr_expect(clean_utf8((const unsigned char *)log, n), "the log has raw control bytes:\n%s", log);
  /* the only /healthz lines are the harness's own, each alone on its line */
  for (char *line = log; line && *line;) {
    char *end = strchr(line, '\n');
    if (end)
      *end = 0;
    cr_expect(!strstr(line, "forged") || strstr(line, "404"), "a line the client forged: %s", line);
    line = end ? end + 1 : NULL;
  }
  free(log);
}

Test(hardening, paths_cannot_forge_text_log_lines, .fini = teardown, .timeout = 60) {
  srv_start(&S, NULL);
  check_log_clean(
      "GET /x%0d%0aattnd:%20GET%20/forged%20200%1b[2J%ff HTTP/1.1\r\nHost: localhost\r\n\r\n");
}

Test(hardening, paths_cannot_forge_json_log_lines, .fini = teardown, .timeout = 60) {
  srv_start(&S, "--log-format", "json", NULL);
  check_log_clean("GET /x%0a{\"method\":%20\"GET\",%20\"path\":%20\"/forged\"}%ff%c3 HTTP/1.1\r\n"
                  "Host: localhost\r\n\r\n");
  size_t n;
  char *log = read_file_all(S.log, &n);
  int lines = 0;
  for (char *line = log; line && *line;) {
    char *end = strchr(line, '\n');
    if (end)
      *end = 0;
    if (*line == '{') {
      cJSON *j = cJSON_Parse(line);
      cr_expect(j, "not JSON: %s", line);
      cJSON_Delete(j);
      lines++;
    }
    line = end ? end + 1 : NULL;
  }
  cr_expect_geq(lines, 2, "JSON request lines");
  free(log);
}

/* ---- idle connections ------------------------------------------------------------ */

static int *open_idle(int n) {
  int *fds = malloc(sizeof *fds * (size_t)n);
  for (int i = 0; i < n; i++)
    fds[i] = raw_connect(S.port);
  return fds;
}

static void close_all(int *fds, int n) {
  for (int i = 0; i < n; i++)
    if (fds[i] >= 0)
      close(fds[i]);
  free(fds);
}

/* /healthz and a small POST on fresh connections get their replies (a
 * server whose slots idle clients hold leaves them in the backlog until its
 * 30 s idle timeout, past this wait). */
static void expect_served(const char *after) {
  int fd = raw_connect(S.port);
  cr_assert_geq(fd, 0, "connect after %s: %s", after, strerror(errno));
  raw_sends(fd, "GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n");
  http_res rs;
  cr_expect_eq(raw_response(fd, 15000, &rs), 200, "healthz after %s: %s", after, rs.error);
  http_res_free(&rs);
  close(fd);
  const char *body = "{\"q\": [[1, 0]], \"k\": [[1, 0]], \"v\": [[1, 2]]}";
  char req[300];
  snprintf(req, sizeof req,
           "POST /attention HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
           "Content-Length: %zu\r\n\r\n%s",
           strlen(body), body);
  fd = raw_connect(S.port);
  cr_assert_geq(fd, 0);
  raw_sends(fd, req);
  cr_expect_eq(raw_response(fd, 15000, &rs), 200, "POST after %s: %s", after, rs.error);
  cr_expect(rs.body && strstr(rs.body, "\"o\""), "%s", rs.body ? rs.body : "");
  http_res_free(&rs);
  close(fd);
}

Test(hardening, two_thousand_idle_connections_lock_nobody_out, .fini = teardown, .timeout = 120) {
  struct rlimit rl;
  getrlimit(RLIMIT_NOFILE, &rl);
  if (rl.rlim_cur < 2200) {
    rlim_t want = rl.rlim_max < 4096 ? rl.rlim_max : 4096;
    struct rlimit up = {want, rl.rlim_max};
    setrlimit(RLIMIT_NOFILE, &up);
    getrlimit(RLIMIT_NOFILE, &rl);
  }
  if (rl.rlim_cur < 2200) {
    cr_log_warn("skipped: the open-file limit (%llu) is below 2,200",
                (unsigned long long)rl.rlim_cur);
    printf("skipped: the open-file limit is below 2,200\n");
    return;
  }
  srv_start(&S, NULL);
  int *fds = open_idle(2000);
  expect_served("2,000 idle connections");
  http_res rs;
  cr_assert_eq(http_get(&S, "/metrics", &rs), 0);
  const char *ev[] = {"reason=evicted", NULL};
  cr_expect_geq(prom_sum(rs.body, "attnd_connections_closed_total", ev, NULL), 1,
                "evictions counted");
  http_res_free(&rs);
  close_all(fds, 2000);
}

/* A low soft open-file limit is raised to what the flags need. */
Test(hardening, open_file_limit_is_raised, .fini = teardown, .timeout = 60) {
  struct rlimit old;
  getrlimit(RLIMIT_NOFILE, &old);
  if (old.rlim_max < 1300) {
    printf("skipped: the hard open-file limit (%llu) is below what attnd needs\n",
           (unsigned long long)old.rlim_max);
    return;
  }
  struct rlimit low = {64, old.rlim_max};
  setrlimit(RLIMIT_NOFILE, &low); /* inherited by the server */
  srv_start(&S, NULL);
  setrlimit(RLIMIT_NOFILE, &old);
  char path[64], *limits;
  snprintf(path, sizeof path, "/proc/%d/limits", (int)S.pid);
  cr_assert(limits = read_file_all(path, NULL));
  unsigned long long soft = 0;
  char *l = strstr(limits, "Max open files");
  cr_assert(l && sscanf(l, "Max open files %llu", &soft) == 1, "%s", limits);
  cr_expect_geq(soft, 1024 + 128, "the server's open-file limit stayed at %llu", soft);
  free(limits);
}

/* Under a hard limit of 64 the server serves fewer connections and says so,
 * but idle ones still cannot keep others out. */
Test(hardening, idle_connections_under_a_low_file_limit, .fini = teardown, .timeout = 120) {
  char wrapper[] = "/tmp/attnd-ulimit-XXXXXX";
  int fd = mkstemp(wrapper);
  cr_assert_geq(fd, 0);
  char script[600];
  char *real = realpath(srv_bin(), NULL);
  cr_assert(real, "%s", srv_bin());
  int n =
      snprintf(script, sizeof script, "#!/bin/sh\nulimit -n 64 || exit 97\nexec %s \"$@\"\n", real);
  free(real);
  cr_assert_eq(write(fd, script, (size_t)n), n);
  close(fd);
  chmod(wrapper, 0700);
  const char *old = getenv("ATTND_BIN");
  char *keep = old ? strdup(old) : NULL;
  setenv("ATTND_BIN", wrapper, 1);
  srv_start(&S, NULL);
  keep ? setenv("ATTND_BIN", keep, 1) : unsetenv("ATTND_BIN");
  free(keep);
  int *fds = open_idle(200);
  expect_served("200 idle connections under ulimit -n 64");
  char *log = srv_log(&S);
  cr_expect(strstr(log, "open-file limit is 64"), "the lowered limit is not logged:\n%s", log);
  free(log);
  close_all(fds, 200);
  unlink(wrapper);
}

Test(hardening, oldest_idle_connection_is_closed_first, .fini = teardown, .timeout = 60) {
  srv_start(&S, "--max-connections", "4", "--max-connections-per-client", "0", NULL);
  int fds[4];
  char *log = srv_log(&S);
  int served = count_of(log ? log : "", "GET /healthz 200");
  free(log);
  for (int i = 0; i < 4; i++) {
    fds[i] = raw_connect(S.port);
    cr_assert_geq(fds[i], 0);
    /* one request each, so the server has registered them in this order */
    raw_sends(fds[i], "GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n");
    http_res rs;
    cr_expect_eq(raw_response(fds[i], 15000, &rs), 200);
    http_res_free(&rs);
    /* and has seen it idle (just before its log line), which with several
     * HTTP threads may come after the client read the reply */
    served++;
    for (double end = now_s() + 60; now_s() < end; sleep_s(0.01)) {
      log = srv_log(&S);
      bool logged = log && count_of(log, "GET /healthz 200") >= served;
      free(log);
      if (logged)
        break;
    }
  }
  expect_served("4 idle keep-alive connections with --max-connections 4");
  cr_expect_geq(raw_wait_close(fds[0], 15000), 0, "the oldest idle connection is still open");
  /* the newest keep-alive connection still works */
  raw_sends(fds[3], "GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n");
  http_res rs;
  cr_expect_eq(raw_response(fds[3], 15000, &rs), 200, "newest connection: %s", rs.error);
  http_res_free(&rs);
  for (int i = 0; i < 4; i++)
    close(fds[i]);
}

/* A client that keeps sending a header byte at a time is closed at the
 * header deadline, though it is never idle long enough for the idle
 * timeout. */
Test(hardening, dribbled_headers_meet_the_header_deadline, .fini = teardown, .timeout = 60) {
  srv_start(&S, "--header-timeout", "1", "--idle-timeout", "30", NULL);
  int fd = raw_connect(S.port);
  cr_assert_geq(fd, 0);
  const char *hdr =
      "GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
  bool closed = false;
  for (size_t i = 0; i < 300 && !closed; i++) { /* 300 x 0.1 s: far past the 1 s deadline */
    char ch = hdr[i % strlen(hdr)];
    closed = raw_send(fd, &ch, 1) < 0 || raw_wait_close(fd, 100) >= 0;
  }
  cr_expect(closed, "a connection dribbling its headers was never closed");
  close(fd);
  http_res rs;
  cr_assert_eq(http_get(&S, "/metrics", &rs), 0);
  const char *lb[] = {"reason=header_timeout", NULL};
  cr_expect_geq(prom_sum(rs.body, "attnd_connections_closed_total", lb, NULL), 1,
                "header timeouts counted");
  http_res_free(&rs);
}
