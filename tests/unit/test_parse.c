/*
 * test_parse.c — the rules a request's head must meet (server/parse.c):
 * field names, one-value fields, framing, the unescaper, which Host and
 * Origin a keyless server answers, request targets, media types, Accept
 * and the framing numbers.
 */
#include "errors.h"
#include "parse.h"

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The verdict on a head given as name, value pairs (NULL-terminated). */
static int verdict(const char *version, char *msg, size_t cap, const char *const *hv) {
  attnd_head h = {0};
  for (int i = 0; hv[i]; i += 2)
    attnd_head_add(&h, hv[i], hv[i + 1]);
  return attnd_head_check(&h, version, msg, cap);
}

#define HEAD(...) ((const char *const[]){__VA_ARGS__, NULL})

Test(parse, a_plain_head_passes) {
  char msg[300];
  cr_expect_eq(verdict("HTTP/1.1", msg, sizeof msg,
                       HEAD("Host", "localhost", "Content-Type", "application/json",
                            "Content-Length", "12", "X-Request-Id", "a", "X-Request-Id", "b")),
               0, "refused: %s", msg);
  cr_expect_eq(verdict("HTTP/1.0", msg, sizeof msg, HEAD("Accept", "*/*")), 0,
               "HTTP/1.0 needs no Host");
}

Test(parse, whitespace_before_the_colon_is_refused) {
  const char *names[] = {"Content-Length ", "Content-Length\t", "Content-Length  ", "X A"};
  for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
    char msg[300] = "";
    int code = verdict("HTTP/1.1", msg, sizeof msg, HEAD("Host", "x", names[i], "5"));
    cr_expect_eq(code, ATTND_EBAD_REQUEST, "\"%s\" accepted", names[i]);
    cr_expect(strstr(msg, "whitespace before its colon"), "message: %s", msg);
  }
  char msg[300] = "";
  cr_expect_eq(verdict("HTTP/1.1", msg, sizeof msg, HEAD("Host", "x", "X(y)", "1")),
               ATTND_EBAD_REQUEST, "a name that is not a token accepted");
  cr_expect(strstr(msg, "not a valid header name"), "message: %s", msg);
}

Test(parse, one_value_fields_given_twice_are_refused) {
  const char *names[] = {"Host", "authorization", "Content-Type", "Content-Encoding",
                         "Inference-Header-Content-Length"};
  for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
    char msg[300] = "";
    int code =
        verdict("HTTP/1.1", msg, sizeof msg, HEAD("Host", "h", names[i], "a", names[i], "a"));
    cr_expect_eq(code, ATTND_EBAD_REQUEST, "two %s accepted", names[i]);
    cr_expect(strstr(msg, "more than one"), "message: %s", msg);
  }
}

Test(parse, framing_is_read_one_way) {
  char msg[300];
  cr_expect_eq(verdict("HTTP/1.1", msg, sizeof msg,
                       HEAD("Host", "x", "Content-Length", "5", "Content-Length", "6")),
               ATTND_EBAD_REQUEST);
  cr_expect_eq(verdict("HTTP/1.1", msg, sizeof msg,
                       HEAD("Host", "x", "Content-Length", "5", "Transfer-Encoding", "chunked")),
               ATTND_EBAD_REQUEST);
  cr_expect_eq(verdict("HTTP/1.1", msg, sizeof msg, HEAD("Host", "x", "Transfer-Encoding", "gzip")),
               ATTND_ENOT_IMPLEMENTED);
  cr_expect_eq(verdict("HTTP/1.1", msg, sizeof msg, HEAD("Accept", "*/*")), ATTND_EBAD_REQUEST,
               "HTTP/1.1 without Host accepted");
  attnd_head h = {0};
  attnd_head_add(&h, "Content-Length", "0");
  cr_expect(!attnd_head_has_body(&h));
  attnd_head_add(&h, "Content-Length", "0");
  cr_expect(!attnd_head_has_body(&h));
  attnd_head t = {0};
  attnd_head_add(&t, "Transfer-Encoding", "chunked");
  cr_expect(attnd_head_has_body(&t));
}

static const char *unescape(const char *in, bool path, bool *nul) {
  static char buf[128];
  snprintf(buf, sizeof buf, "%s", in);
  *nul = false;
  size_t n = attnd_parse_unescape(buf, path, nul);
  cr_expect_eq(n, strlen(buf), "the length returned");
  return buf;
}

Test(parse, the_unescaper_keeps_slashes_and_flags_nul) {
  bool nul;
  cr_expect_str_eq(unescape("/a%20b%41", true, &nul), "/a bA");
  cr_expect(!nul);
  cr_expect_str_eq(unescape("/v2/models/attention%2finfer", true, &nul),
                   "/v2/models/attention%2finfer", "%%2f became a separator in a path");
  cr_expect_str_eq(unescape("a%2Fb", false, &nul), "a/b", "a query value keeps its slash");
  cr_expect_str_eq(unescape("/healthz%00x", true, &nul), "/healthzx");
  cr_expect(nul, "%%00 not flagged");
  cr_expect_str_eq(unescape("100%", true, &nul), "100%", "a bare %% stays");
  cr_expect_str_eq(unescape("%zz%4", true, &nul), "%zz%4", "a bad escape stays");
  cr_expect(!nul);
}

Test(parse, a_keyless_server_answers_its_addresses_and_names) {
  const char *yes[] = {"127.0.0.1", "127.0.0.1:8080", "10.1.2.3:80",   "[::1]:8080", "[::1]",
                       "localhost", "LOCALHOST:8080", "app.localhost", NULL};
  for (int i = 0; yes[i]; i++)
    cr_expect(attnd_parse_host_allowed(yes[i], ""), "%s refused", yes[i]);
  cr_expect(attnd_parse_host_allowed(NULL, ""), "no Host (HTTP/1.0) refused");
  const char *no[] = {"evil.example",
                      "evil.example:8080",
                      "localhost.evil.example",
                      "127.0.0.1.nip.io",
                      "attnd",
                      "[::1",
                      NULL};
  for (int i = 0; no[i]; i++)
    cr_expect(!attnd_parse_host_allowed(no[i], ""), "%s allowed", no[i]);
  cr_expect(attnd_parse_host_allowed("attnd:8080", "db,attnd"));
  cr_expect(attnd_parse_host_allowed("a.svc.cluster.local", "x,.svc.cluster.local"));
  cr_expect(!attnd_parse_host_allowed("svc.cluster.local.evil", ".svc.cluster.local"));
  cr_expect(attnd_parse_host_allowed("anything.example", "*"));
}

Test(parse, origins_are_the_page_own_or_the_cors_one) {
  cr_expect(attnd_parse_origin_allowed(NULL, "127.0.0.1:8080", ""), "no Origin refused");
  cr_expect(attnd_parse_origin_allowed("http://127.0.0.1:8080", "127.0.0.1:8080", ""));
  cr_expect(attnd_parse_origin_allowed("http://localhost", "localhost:80", ""));
  cr_expect(attnd_parse_origin_allowed("https://h.example:443", "h.example", ""));
  cr_expect(!attnd_parse_origin_allowed("http://evil.example", "127.0.0.1:8080", ""));
  cr_expect(!attnd_parse_origin_allowed("null", "127.0.0.1:8080", ""));
  cr_expect(!attnd_parse_origin_allowed("http://127.0.0.1:9999", "127.0.0.1:8080", ""));
  cr_expect(
      attnd_parse_origin_allowed("https://app.example", "127.0.0.1:8080", "https://app.example"));
  cr_expect(attnd_parse_origin_allowed("http://evil.example", "127.0.0.1:8080", "*"));
}

Test(parse, request_targets_past_the_limits_or_with_blanks_are_refused) {
  int code = 0;
  cr_expect_null(attnd_parse_target("/attention?batch=1&heads=2", &code));
  char *long_one = malloc(ATTND_MAX_TARGET + 2);
  memset(long_one, 'a', ATTND_MAX_TARGET + 1);
  long_one[0] = '/';
  long_one[ATTND_MAX_TARGET + 1] = 0;
  cr_expect_str_eq(attnd_parse_target(long_one, &code),
                   "the request target is longer than 8192 bytes");
  cr_expect_eq(code, ATTND_EURI_TOO_LONG);
  long_one[ATTND_MAX_TARGET] = 0; /* exactly the limit */
  cr_expect_null(attnd_parse_target(long_one, &code));
  free(long_one);
  char q[512] = "/attention/plan?";
  for (int i = 0; i < ATTND_MAX_QUERY_PARAMS; i++)
    strcat(q, i ? "&a" : "a");
  cr_expect_null(attnd_parse_target(q, &code), "100 parameters are allowed");
  strcat(q, "&a");
  cr_expect_str_eq(attnd_parse_target(q, &code), "the query string has more than 100 parameters");
  cr_expect_eq(code, ATTND_EURI_TOO_LONG);
  cr_expect_not_null(attnd_parse_target("/a b", &code));
  cr_expect_eq(code, ATTND_EBAD_REQUEST);
  cr_expect_not_null(attnd_parse_target("/a\tb", &code));
  cr_expect_eq(code, ATTND_EBAD_REQUEST);
}

Test(parse, absolute_targets_are_read_as_their_path) {
  cr_expect_str_eq(attnd_parse_origin_path("/healthz"), "/healthz");
  cr_expect_str_eq(attnd_parse_origin_path("http://h:8080/healthz"), "/healthz");
  cr_expect_str_eq(attnd_parse_origin_path("HTTPS://h/v2/models/x"), "/v2/models/x");
  cr_expect_str_eq(attnd_parse_origin_path("http://h:8080"), "/");
  cr_expect_str_eq(attnd_parse_origin_path("ftp://h/x"), "ftp://h/x");
}

Test(parse, media_types_ignore_case_parameters_and_blanks) {
  cr_expect(attnd_parse_media_is("application/json", "application/json"));
  cr_expect(attnd_parse_media_is("Application/JSON; charset=utf-8", "application/json"));
  cr_expect(attnd_parse_media_is("  application/json \t;x=1", "application/json"));
  cr_expect(!attnd_parse_media_is("application/jsonx", "application/json"));
  cr_expect(!attnd_parse_media_is("application/json5", "application/json"));
  cr_expect(!attnd_parse_media_is("text/plain", "application/json"));
  cr_expect(!attnd_parse_media_is(NULL, "application/json"));
}

Test(parse, accept_asks_for_binary_when_octet_stream_comes_first) {
  cr_expect(attnd_parse_accepts_binary("application/octet-stream"));
  cr_expect(attnd_parse_accepts_binary("APPLICATION/OCTET-STREAM, application/json"));
  cr_expect(!attnd_parse_accepts_binary("application/json, application/octet-stream"));
  cr_expect(!attnd_parse_accepts_binary("application/json"));
  cr_expect(!attnd_parse_accepts_binary("*/*"));
  cr_expect(!attnd_parse_accepts_binary(NULL));
}

Test(parse, framing_numbers_are_read_strictly) {
  cr_expect_eq(attnd_parse_content_length("0"), 0);
  cr_expect_eq(attnd_parse_content_length("1048576"), 1048576);
  cr_expect_eq(attnd_parse_content_length(""), UINT64_MAX);
  cr_expect_eq(attnd_parse_content_length("12x"), UINT64_MAX);
  cr_expect_eq(attnd_parse_content_length("99999999999999999999999"), UINT64_MAX);
  size_t n = 7;
  cr_expect(attnd_parse_json_length("0", &n) && n == 0);
  cr_expect(attnd_parse_json_length("123", &n) && n == 123);
  cr_expect(!attnd_parse_json_length("", &n));
  cr_expect(!attnd_parse_json_length("-1", &n));
  cr_expect(!attnd_parse_json_length("+1", &n));
  cr_expect(!attnd_parse_json_length(" 1", &n));
  cr_expect(!attnd_parse_json_length("1 ", &n));
  cr_expect(!attnd_parse_json_length("18446744073709551615", &n), "SIZE_MAX is the whole body");
  cr_expect_eq(n, 123);
}

/* The head's size is its request line and header lines as they are sent
 * ("Name: value" and CRLF each, the blank line): 16 KiB passes, a byte more
 * is 431, and so is a 101st field. */
Test(parse, heads_past_16_KiB_or_100_fields_get_431) {
  char msg[300] = "", *value = malloc(ATTND_MAX_HEAD);
  attnd_head h = {0};
  /* "GET /healthz HTTP/1.1\r\n" + "Host: x\r\n" + "X-Pad: ...\r\n" + "\r\n" */
  attnd_head_line(&h, "GET", strlen("/healthz"), "HTTP/1.1");
  cr_expect_eq(h.bytes, strlen("GET /healthz HTTP/1.1\r\n"));
  attnd_head_add(&h, "Host", "x");
  size_t pad = ATTND_MAX_HEAD - h.bytes - strlen("X-Pad: \r\n") - 2;
  memset(value, 'a', pad);
  value[pad] = 0;
  attnd_head at = h;
  attnd_head_add(&at, "X-Pad", value);
  cr_expect_eq(at.bytes + 2, (size_t)ATTND_MAX_HEAD);
  cr_expect_eq(attnd_head_check(&at, "HTTP/1.1", msg, sizeof msg), 0, "at the limit: %s", msg);
  value[pad] = 'a';
  value[pad + 1] = 0;
  attnd_head over = h;
  attnd_head_add(&over, "X-Pad", value);
  cr_expect_eq(attnd_head_check(&over, "HTTP/1.1", msg, sizeof msg), ATTND_EHEADERS_TOO_LARGE);
  cr_expect(strstr(msg, "16385 bytes in 2 header fields") && strstr(msg, "at most 16384 bytes"),
            "%s", msg);
  free(value);
  attnd_head many = {0};
  for (int i = 0; i < ATTND_MAX_HEADERS; i++)
    attnd_head_add(&many, i ? "X-A" : "Host", "1");
  cr_expect_eq(attnd_head_check(&many, "HTTP/1.1", msg, sizeof msg), 0, "100 fields: %s", msg);
  attnd_head_add(&many, "X-A", "1");
  cr_expect_eq(attnd_head_check(&many, "HTTP/1.1", msg, sizeof msg), ATTND_EHEADERS_TOO_LARGE);
  cr_expect(strstr(msg, "101 header fields") && strstr(msg, "at most 100 fields"), "%s", msg);
}
