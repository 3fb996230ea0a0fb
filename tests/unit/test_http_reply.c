/*
 * test_http_reply.c — the HTTP/1.1 reply parser (proto/http_reply.h): the status line,
 * headers, Content-Length, chunked and read-until-close bodies, where one
 * reply ends and the next begins on a keep-alive connection, the same
 * answers for any split of the bytes into reads, and malformed input.
 */
#include "http_reply.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

/* Feeds s in reads of `step` bytes (0: whole) and returns what the last
 * call returned; *used is the bytes taken up to and including the reply's
 * end (or all of them). */
static int feed(attn_http_reply *p, const char *s, size_t step, size_t *used) {
  size_t n = strlen(s), off = 0;
  int rc = ATTN_HTTP_MORE;
  while (off < n && rc == ATTN_HTTP_MORE) {
    size_t piece = step && n - off > step ? step : n - off, u;
    rc = attn_http_reply_feed(p, s + off, piece, &u);
    off += u;
  }
  *used = off;
  return rc;
}

static attn_http_reply parser(void) {
  attn_http_reply p;
  cr_assert_eq(attn_http_reply_init(&p), 0);
  attn_http_reply_start(&p);
  return p;
}

#define R200 "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 5\r\n\r\nhello"

Test(http_reply, content_length_in_any_split) {
  for (size_t step = 0; step < 9; step++) {
    attn_http_reply p = parser();
    size_t used;
    cr_expect_eq(feed(&p, R200 "NEXT", step, &used), ATTN_HTTP_DONE, "step %zu", step);
    cr_expect_eq(used, strlen(R200), "step %zu: the reply ends before NEXT", step);
    cr_expect_eq(p.status, 200);
    cr_expect(!p.close_after);
    cr_expect(attn_http_reply_idle(&p));
    attn_http_reply_free(&p);
  }
}

Test(http_reply, keep_alive_boundaries) {
  const char *two = R200 "HTTP/1.1 503 Service Unavailable\r\ncontent-length: 2\r\n\r\n{}";
  attn_http_reply p = parser();
  size_t used, n = strlen(two);
  cr_assert_eq(attn_http_reply_feed(&p, two, n, &used), ATTN_HTTP_DONE);
  cr_expect_eq(p.status, 200);
  attn_http_reply_start(&p);
  size_t used2;
  cr_expect_eq(attn_http_reply_feed(&p, two + used, n - used, &used2), ATTN_HTTP_DONE);
  cr_expect_eq(used + used2, n);
  cr_expect_eq(p.status, 503, "header names are case-insensitive");
  attn_http_reply_free(&p);
}

/* An error reply's message is what the caller keeps: the body's first
 * keep_cap bytes, chunked or counted, in any split; the rest is counted. */
Test(http_reply, keeps_the_first_bytes_of_a_body) {
  const char *chunked = "HTTP/1.1 507 Insufficient Storage\r\nTransfer-Encoding: chunked\r\n\r\n"
                        "3\r\n{\"e\r\n5\r\nrror\"\r\n0\r\n\r\n";
  const char *replies[] = {R200, chunked};
  const char *want[] = {"hel", "{\"e"};
  for (int i = 0; i < 2; i++)
    for (size_t step = 0; step < 5; step++) {
      attn_http_reply p = parser();
      char keep[3];
      p.keep = keep;
      p.keep_cap = sizeof keep;
      size_t used;
      cr_expect_eq(feed(&p, replies[i], step, &used), ATTN_HTTP_DONE, "reply %d step %zu", i, step);
      cr_expect_eq(p.kept, 3);
      cr_expect(!memcmp(keep, want[i], 3), "reply %d step %zu", i, step);
      attn_http_reply_start(&p);
      cr_expect_eq(p.kept, 0, "a new reply keeps from its own start");
      attn_http_reply_free(&p);
    }
}

Test(http_reply, bytes_nobody_asked_for_are_an_error) {
  attn_http_reply p = parser();
  attn_http_reply_reset(&p);
  size_t used;
  cr_expect_eq(attn_http_reply_feed(&p, "X", 1, &used), ATTN_HTTP_ERROR);
  attn_http_reply_free(&p);
}

Test(http_reply, chunked_with_extensions_and_trailers) {
  const char *r = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                  "5;name=value\r\nhello\r\n1a\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\n"
                  "X-Trailer: 1\r\n\r\n";
  for (size_t step = 0; step < 7; step++) {
    attn_http_reply p = parser();
    size_t used;
    char buf[512];
    snprintf(buf, sizeof buf, "%sHTTP", r);
    cr_expect_eq(feed(&p, buf, step, &used), ATTN_HTTP_DONE, "step %zu", step);
    cr_expect_eq(used, strlen(r), "step %zu", step);
    attn_http_reply_free(&p);
  }
}

Test(http_reply, interim_and_bodiless_replies) {
  attn_http_reply p = parser();
  size_t used;
  const char *r = "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n";
  cr_expect_eq(feed(&p, r, 0, &used), ATTN_HTTP_DONE);
  cr_expect_eq(used, strlen(r));
  cr_expect_eq(p.status, 204);
  attn_http_reply_start(&p);
  cr_expect_eq(feed(&p, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", 0, &used), ATTN_HTTP_DONE);
  attn_http_reply_free(&p);
}

Test(http_reply, connection_close_and_http10) {
  attn_http_reply p = parser();
  size_t used;
  cr_expect_eq(
      feed(&p, "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", 0, &used),
      ATTN_HTTP_DONE);
  cr_expect(p.close_after);
  attn_http_reply_start(&p);
  cr_expect_eq(feed(&p, "HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", 0, &used), ATTN_HTTP_DONE);
  cr_expect(p.close_after, "HTTP/1.0 without keep-alive closes");
  attn_http_reply_start(&p);
  cr_expect_eq(
      feed(&p, "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n", 0, &used),
      ATTN_HTTP_DONE);
  cr_expect(!p.close_after);
  attn_http_reply_free(&p);
}

Test(http_reply, body_until_close) {
  attn_http_reply p = parser();
  size_t used;
  const char *r = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nsome bytes";
  cr_expect_eq(feed(&p, r, 3, &used), ATTN_HTTP_MORE);
  cr_expect_eq(used, strlen(r));
  cr_expect(attn_http_reply_until_close(&p));
  cr_expect(p.close_after);
  attn_http_reply_free(&p);
}

Test(http_reply, malformed_input_is_refused) {
  static const char *const bad[] = {
      "HTTP/2 200 OK\r\n\r\n",
      "HTTP/1.1 2x0 OK\r\n\r\n",
      "HTTP/1.1 20\r\n\r\n",
      "FTP/1.1 200 OK\r\n\r\n",
      "HTTP/1.1 200 OK\r\nContent-Length: 12a\r\n\r\n",
      "HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999999\r\n\r\n",
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\naXX",
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
      "0000000000000000000000000000000000000000000000000000000000000000000001\r\n",
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    attn_http_reply p = parser();
    size_t used;
    cr_expect_eq(feed(&p, bad[i], 0, &used), ATTN_HTTP_ERROR, "[%zu] %s", i, bad[i]);
    attn_http_reply_free(&p);
  }
}

Test(http_reply, head_over_the_limit_is_refused) {
  attn_http_reply p = parser();
  static char big[ATTN_HTTP_MAX_HEAD + 64];
  memset(big, 'a', sizeof big - 1);
  memcpy(big, "HTTP/1.1 200 OK\r\nX: ", 20);
  size_t used;
  cr_expect_eq(feed(&p, big, 4096, &used), ATTN_HTTP_ERROR);
  attn_http_reply_free(&p);
}
