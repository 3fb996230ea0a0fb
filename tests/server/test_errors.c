/*
 * test_errors.c — every malformed request of bad_cases.c, each answered with
 * its status and JSON error code while /healthz keeps answering; random
 * mutations of valid bodies never get a 5xx; body size limits (413) from
 * Content-Length before the body, for chunked bodies, and at the boundary.
 */
#include "bad_cases.h"
#include "harness.h"

#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

static srv S;
static void teardown(void) { srv_cleanup(&S); }
TestSuite(errors, .fini = teardown, .timeout = 90);

static bool allow_lists(const http_res *r, const char *m) {
  char allow[256] = "";
  if (!http_header(r, "Allow", allow, sizeof allow))
    return false;
  for (char *t = strtok(allow, ", "); t; t = strtok(NULL, ", "))
    if (!strcasecmp(t, m))
      return true;
  return false;
}

Test(errors, malformed_requests) {
  cr_assert_geq(n_bad_cases, 30, "only %zu malformed cases", n_bad_cases);
  srv_start(&S, NULL);
  int failed = 0;
  for (size_t i = 0; i < n_bad_cases; i++) {
    const bad_case *c = &bad_cases[i];
    size_t len;
    char *body = bad_body(c, &len);
    char ct[160];
    if (c->ctype)
      snprintf(ct, sizeof ct, "Content-Type: %s", c->ctype);
    else
      snprintf(ct, sizeof ct, "Content-Type:");
    const char *hdrs[] = {ct, NULL};
    http_req rq = {.method = c->method ? c->method : "POST",
                   .path = c->path ? c->path : "/attention",
                   .headers = hdrs,
                   .body = body ? body : (c->method ? NULL : ""),
                   .len = len};
    http_res r;
    http_do(&S, &rq, &r);
    char what[256];
    snprintf(what, sizeof what, "[%zu] %s", i, c->name);
    bool ok = expect_error(&r, c->status, c->code, what);
    cr_expect(r.status < 500 || r.status == 503, "%s: a bad request got %ld", what, r.status);
    if (c->allow) {
      bool al = allow_lists(&r, c->allow);
      cr_expect(al, "%s: the Allow header does not list %s", what, c->allow);
      ok = ok && al;
    }
    http_res_free(&r);
    free(body);
    if (!expect_healthy(&S, what)) {
      ok = false;
      cr_assert(srv_running(&S), "%s: the server died (status %d)", what, S.status);
    }
    failed += !ok;
  }
  cr_log_info("%zu malformed requests, %d answered other than expected", n_bad_cases, failed);
  cr_expect_eq(srv_stop(&S, 10), 0, "exit status");
}

/* ---- random mutations ------------------------------------------------- */

static uint64_t rng = 0x5eed;

static char *mutate(const char *src, size_t len, size_t *plen) {
  size_t n = len;
  char *b = malloc(len + 64);
  memcpy(b, src, len);
  int kind = (int)(trand(&rng) % 6);
  size_t at = (size_t)(trand(&rng) % (len ? len : 1));
  switch (kind) {
  case 0: /* flip a bit */ b[at] ^= (char)(1u << (trand(&rng) % 8)); break;
  case 1: /* truncate */ n = at; break;
  case 2: /* overwrite a byte */ b[at] = (char)trand(&rng); break;
  case 3: /* insert a byte from JSON's alphabet */
    memmove(b + at + 1, b + at, len - at);
    b[at] = "{}[],:\"-0e9.x\\ "[trand(&rng) % 15];
    n = len + 1;
    break;
  case 4: /* delete a run */ {
    size_t k = 1 + (size_t)(trand(&rng) % 16);
    if (at + k > len)
      k = len - at;
    memmove(b + at, b + at + k, len - at - k);
    n = len - k;
    break;
  }
  default: /* several flips */
    for (int i = 0; i < 4; i++)
      b[trand(&rng) % (len ? len : 1)] ^= (char)(1u << (trand(&rng) % 8));
  }
  *plen = n;
  return b;
}

static bool status_ok(long s) { return s == 200 || s == 400 || s == 413 || s == 415 || s == 422; }

static void fuzz(const char *ctype, const char *body, size_t len, int rounds, bool header_only,
                 size_t hdr_end) {
  char ct[96];
  snprintf(ct, sizeof ct, "Content-Type: %s", ctype);
  const char *hdrs[] = {ct, NULL};
  for (int i = 0; i < rounds; i++) {
    size_t ml;
    /* mutate mostly the part that is parsed (JSON, or the safetensors header) */
    char *m;
    if (header_only) {
      size_t hl;
      char *h = mutate(body, hdr_end, &hl);
      m = malloc(hl + len - hdr_end);
      memcpy(m, h, hl);
      memcpy(m + hl, body + hdr_end, len - hdr_end);
      ml = hl + len - hdr_end;
      free(h);
    } else {
      m = mutate(body, len, &ml);
    }
    http_req rq = {.method = "POST", .path = "/attention", .headers = hdrs, .body = m, .len = ml};
    http_res r;
    http_do(&S, &rq, &r);
    char what[96];
    snprintf(what, sizeof what, "%s mutation %d", ctype, i);
    cr_expect(status_ok(r.status), "%s: status %ld (%s), body %.200s", what, r.status, r.error,
              r.body);
    if (r.status != 200 && r.status != 0)
      expect_error(&r, r.status, NULL, what);
    http_res_free(&r);
    free(m);
    if (!srv_running(&S)) {
      cr_assert(false, "%s: the server died (status %d)", what, S.status);
    }
  }
}

Test(errors, mutated_bodies_never_5xx) {
  srv_start(&S, NULL);
  tprob p = tprob_make(1, 2, 1, 3, 5, 4, ATTN_F16);
  tcase c;
  tcase_init(&c, &p, 77);
  size_t jl, sl;
  char *jb = json_body(&c, 4, ",\"causal\":true,\"stats\":true", &jl);
  char *sb = st_body(&c, 4, "{\"window_left\":\"2\"}", &sl);
  uint64_t hl = 0;
  for (int i = 0; i < 8; i++)
    hl |= (uint64_t)(unsigned char)sb[i] << (8 * i);
  fuzz("application/json", jb, jl, 150, false, 0);
  fuzz("application/octet-stream", sb, sl, 100, true, 8 + (size_t)hl);
  fuzz("application/octet-stream", sb, sl, 50, false, 0);
  expect_healthy(&S, "mutations");
  free(jb);
  free(sb);
  tcase_free(&c);
  cr_expect_eq(srv_stop(&S, 10), 0, "exit status");
}

/* ---- body size limits ----------------------------------------------------- */

Test(errors, ten_gigabyte_content_length_refused_before_the_body) {
  srv_start(&S, NULL);
  const char *ctypes[] = {"application/octet-stream", "application/json"};
  for (int k = 0; k < 2; k++) {
    int fd = raw_connect(S.port);
    cr_assert(fd >= 0, "connect");
    char req[512];
    snprintf(req, sizeof req,
             "POST /attention HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: %s\r\n"
             "Content-Length: 10000000000\r\n\r\n",
             ctypes[k]);
    raw_sends(fd, req);
    /* No byte of the body is sent: a 413 can only come from the headers. */
    http_res r;
    int st = raw_response(fd, 60000, &r);
    char what[128];
    snprintf(what, sizeof what, "10 GB Content-Length (%s), no body", ctypes[k]);
    cr_expect_eq(st, 413, "%s: status %d (%s)", what, st, r.error);
    if (st > 0)
      expect_error(&r, 413, "too_large", what);
    http_res_free(&r);
    close(fd);
  }
  expect_healthy(&S, "10 GB Content-Length");
}

Test(errors, content_length_over_max_body) {
  srv_start(&S, "--max-body", "4K", NULL);
  /* A valid JSON request padded with spaces to exactly 4096 bytes is
   * accepted; one more byte is refused. */
  tprob p = tprob_make(1, 1, 1, 4, 4, 4, ATTN_F32);
  tcase c;
  tcase_init(&c, &p, 31);
  size_t len;
  char *b = json_body(&c, 2, NULL, &len);
  cr_assert_lt(len, 4000);
  char *pad = malloc(4097);
  memcpy(pad, b, len - 1); /* without the closing brace */
  memset(pad + len - 1, ' ', 4097 - len);
  pad[4095] = '}';
  http_res r;
  http_post(&S, "/attention", "application/json", pad, 4096, &r);
  expect_correct(&r, &c, 2, false, "a 4096-byte body under --max-body 4K");
  http_res_free(&r);
  pad[4095] = ' ';
  pad[4096] = '}';
  http_post(&S, "/attention", "application/json", pad, 4097, &r);
  expect_error(&r, 413, "too_large", "a 4097-byte body under --max-body 4K");
  http_res_free(&r);
  /* With Expect: 100-continue the body is never sent. */
  char *big = malloc(1 << 20);
  memset(big, ' ', 1 << 20);
  const char *hdrs[] = {"Content-Type: application/octet-stream", "Expect: 100-continue", NULL};
  http_req rq = {
      .method = "POST", .path = "/attention", .headers = hdrs, .body = big, .len = 1 << 20};
  http_do(&S, &rq, &r);
  expect_error(&r, 413, "too_large", "1 MiB body with Expect: 100-continue");
  http_res_free(&r);
  expect_healthy(&S, "413s");
  free(big);
  free(pad);
  free(b);
  tcase_free(&c);
}

Test(errors, chunked_body_over_max_body) {
  srv_start(&S, "--max-body", "1K", NULL);
  int fd = raw_connect(S.port);
  cr_assert(fd >= 0);
  raw_sends(fd, "POST /attention HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n");
  char chunk[600];
  int n = snprintf(chunk, sizeof chunk, "200\r\n");
  memset(chunk + n, ' ', 512);
  memcpy(chunk + n + 512, "\r\n", 2);
  size_t cl = (size_t)n + 514;
  /* 16 chunks of 512 bytes: the server may answer and close before all. */
  for (int i = 0; i < 16; i++)
    if (raw_send(fd, chunk, cl) < 0)
      break;
  raw_sends(fd, "0\r\n\r\n");
  http_res r;
  int st = raw_response(fd, 30000, &r);
  cr_expect_eq(st, 413, "chunked 8 KiB under --max-body 1K: status %d (%s)", st, r.error);
  if (st > 0)
    expect_error(&r, 413, "too_large", "chunked body over --max-body");
  http_res_free(&r);
  close(fd);
  /* The refused body's budget (all of 64 x 1K) is given back as its request
   * ends, which with several HTTP threads may come after the reply. */
  cr_expect(srv_wait_metric_le(&S, "attnd_body_bytes", NULL, 0, 60), "the body budget came back");
  /* curl's chunked upload too */
  char *big = malloc(8192);
  memset(big, ' ', 8192);
  big[0] = '{';
  big[8191] = '}';
  const char *hdrs[] = {"Content-Type: application/json", NULL};
  http_req rq = {.method = "POST",
                 .path = "/attention",
                 .headers = hdrs,
                 .body = big,
                 .len = 8192,
                 .chunked = true};
  http_do(&S, &rq, &r);
  expect_error(&r, 413, "too_large", "curl chunked 8 KiB under --max-body 1K");
  http_res_free(&r);
  free(big);
  expect_healthy(&S, "chunked 413");
}

Test(errors, garbage_http_does_not_hurt) {
  srv_start(&S, NULL);
  const char *junk[] = {
      "GARBAGE\r\n\r\n",
      "GET / HTTP/9.9\r\n\r\n",
      "POST /attention HTTP/1.1\r\nHost: localhost\r\nContent-Length: abc\r\n\r\n",
      "POST /attention HTTP/1.1\r\nHost: localhost\r\nContent-Length: -5\r\n\r\n",
      "POST /attention HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
      "Transfer-Encoding: chunked\r\n\r\nzz\r\n\r\n",
  };
  int fd;
  for (size_t i = 0; i < sizeof junk / sizeof *junk; i++) {
    fd = raw_connect(S.port);
    cr_assert(fd >= 0);
    raw_sends(fd, junk[i]);
    http_res r;
    /* a bound only a hang reaches, however loaded the machine */
    int st = raw_response(fd, 30000, &r);
    /* A 4xx (505 for the version) or a closed connection; never a hang. */
    cr_expect(st == -1 ? strcmp(r.error, "timeout after 30000 ms") != 0
                       : (st >= 400 && st < 500) || st == 505,
              "junk %zu: status %d (%s)", i, st, r.error);
    http_res_free(&r);
    close(fd);
    expect_healthy(&S, "junk HTTP");
  }
  /* A body shorter than its Content-Length, then the client goes away. */
  fd = raw_connect(S.port);
  cr_assert(fd >= 0);
  raw_sends(fd, "POST /attention HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                "Content-Length: 1000\r\n\r\n{\"q\":");
  /* hang up only once the server is reading the body */
  cr_expect(srv_wait_metric_ge(&S, "attnd_uploads", NULL, 1, 60),
            "the truncated upload never showed in attnd_uploads");
  close(fd);
  expect_healthy(&S, "a truncated upload");
  /* Half a TLS ClientHello, then the client goes away. */
  fd = raw_connect(S.port);
  cr_assert(fd >= 0);
  raw_send(fd, "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 11);
  /* hang up once the server holds the connection (the /metrics request's
   * own connection is the other one) */
  cr_expect(srv_wait_metric_ge(&S, "attnd_connections", NULL, 2, 60),
            "the TLS hello's connection never showed in attnd_connections");
  close(fd);
  expect_healthy(&S, "a TLS hello");
}

/* Every error reply is counted by its code in /metrics, whichever path set
 * it; a success counts nothing. */
Test(errors, counted_by_code_in_metrics) {
  srv_start(&S, NULL);
  http_res r;
  for (int i = 0; i < 2; i++) {
    http_get(&S, "/nope", &r);
    expect_error(&r, 404, "not_found", "GET /nope");
    http_res_free(&r);
  }
  http_req rq = {.method = "DELETE", .path = "/healthz"};
  http_do(&S, &rq, &r);
  expect_error(&r, 405, "method_not_allowed", "DELETE /healthz");
  http_res_free(&r);
  http_post(&S, "/attention", "text/plain", "x", 1, &r);
  expect_error(&r, 415, "unsupported_media_type", "text/plain");
  http_res_free(&r);
  http_get(&S, "/metrics", &r);
  cr_assert_eq(r.status, 200);
  cr_expect_not_null(strstr(r.body, "\nattnd_errors_total{code=\"not_found\"} 2\n"), "%s", r.body);
  cr_expect_not_null(strstr(r.body, "\nattnd_errors_total{code=\"method_not_allowed\"} 1\n"));
  cr_expect_not_null(strstr(r.body, "\nattnd_errors_total{code=\"unsupported_media_type\"} 1\n"));
  cr_expect_not_null(strstr(r.body, "# TYPE attnd_errors_total counter\n"));
  http_res_free(&r);
}
