/*
 * test_lockout.c — what a client holding no compute can still try to lock
 * everyone out with: uploads that declare a huge body and then close, stay
 * silent or trickle, and slow uploads that fill every connection. Each
 * test then checks that a normal client is served.
 *
 * No test measures time: each waits for the event it names (a reply, a
 * close, a counter) within a bound the broken behaviour would outlast.
 */
#include "harness.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static srv S;
static void teardown(void) { srv_cleanup(&S); }
TestSuite(lockout, .fini = teardown, .timeout = 120);

static const char tiny_json[] = "{\"q\": [[1, 0]], \"k\": [[1, 0]], \"v\": [[1, 2]]}";

/* Headers of a POST /attention that declare a 1 GiB body. */
static const char huge_head[] = "POST /attention HTTP/1.1\r\nHost: localhost\r\n"
                                "Content-Type: application/json\r\n"
                                "Content-Length: 1073741824\r\n\r\n";

static void tiny_post_works(const char *after) {
  http_res r;
  http_post(&S, "/attention", "application/json", tiny_json, strlen(tiny_json), &r);
  cr_expect_eq(r.status, 200, "%s: status %ld: %s", after, r.status, r.body ? r.body : r.error);
  http_res_free(&r);
}

static void tiny_v2_works(const char *after) {
  static const char v2[] =
      "{\"inputs\": [{\"name\": \"q\", \"shape\": [1, 2], \"datatype\": \"FP32\", \"data\": [1, "
      "0]},"
      " {\"name\": \"k\", \"shape\": [1, 2], \"datatype\": \"FP32\", \"data\": [1, 0]},"
      " {\"name\": \"v\", \"shape\": [1, 2], \"datatype\": \"FP32\", \"data\": [1, 2]}]}";
  http_res r;
  http_post(&S, "/v2/models/attention/infer", "application/json", v2, strlen(v2), &r);
  cr_expect_eq(r.status, 200, "%s: /v2 status %ld: %s", after, r.status, r.body ? r.body : r.error);
  http_res_free(&r);
}

/* Everything fd gets until the server closes it (or timeout_ms); *closed
 * (optional) tells which. */
static char *read_until_close_ex(int fd, int timeout_ms, bool *closed) {
  struct timeval tv = {0, 100000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  size_t cap = 4096, n = 0;
  char *b = malloc(cap + 1);
  double deadline = now_s() + timeout_ms / 1000.0;
  bool end = false;
  while (now_s() < deadline && n < cap && !end) {
    ssize_t k = recv(fd, b + n, cap - n, 0);
    end = k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
    if (k > 0)
      n += (size_t)k;
  }
  b[n] = 0;
  if (closed)
    *closed = end;
  return b;
}

static char *read_until_close(int fd, int timeout_ms) {
  return read_until_close_ex(fd, timeout_ms, NULL);
}

/* A body sent a byte at a time every gap_s until the server answers and
 * closes, or timeout_s; returns what it answered (malloc'd). */
static char *trickle(int fd, double gap_s, double timeout_s) {
  double deadline = now_s() + timeout_s;
  char *got = NULL;
  while (now_s() < deadline) {
    if (send(fd, "0", 1, MSG_NOSIGNAL) < 0)
      break;
    free(got);
    got = read_until_close(fd, (int)(gap_s * 1000));
    if (*got)
      return got;
  }
  free(got);
  return read_until_close(fd, 5000);
}

/* Uploads that declare 1 GiB, send 100 bytes and close: libmicrohttpd
 * does not see such a close until its idle timeout, and their declared
 * bytes held the whole budget; they must hold nothing once gone. */
Test(lockout, closed_uploads_hold_nothing) {
  srv_start(&S, "--max-queue", "4", NULL);
  char body[100];
  memset(body, '[', sizeof body);
  for (int i = 0; i < 64; i++) {
    int fd = raw_connect(S.port);
    cr_assert_geq(fd, 0);
    raw_sends(fd, huge_head);
    raw_send(fd, body, sizeof body);
    close(fd);
  }
  tiny_post_works("64 uploads declared 1 GiB and closed");
  cr_expect(srv_wait_metric_le(&S, "attnd_uploads", NULL, 0, 60),
            "the closed uploads stayed registered");
  cr_expect(srv_wait_metric_le(&S, "attnd_body_bytes", NULL, 0, 60),
            "the closed uploads still hold body bytes");
  tiny_post_works("after the closed uploads were released");
}

/* Uploads that send headers declaring 1 GiB and then nothing hold at most
 * a first buffer each: with the default budget (64 x 1 GiB) 64 of them
 * locked every POST out with 503. */
Test(lockout, silent_uploads_lock_nobody_out) {
  srv_start(&S, NULL);
  int fds[64];
  for (int i = 0; i < 64; i++) {
    fds[i] = raw_connect(S.port);
    cr_assert_geq(fds[i], 0);
    raw_sends(fds[i], huge_head);
  }
  cr_assert(srv_wait_metric_ge(&S, "attnd_uploads", NULL, 64, 60), "the uploads never began");
  tiny_post_works("64 silent uploads declaring 1 GiB");
  tiny_v2_works("64 silent uploads declaring 1 GiB");
  for (int i = 0; i < 64; i++)
    close(fds[i]);
}

/* --timeout covers the upload: a body trickled a byte at a time is
 * answered 408 at the deadline (with no minimum rate), then closed. */
Test(lockout, a_trickled_body_meets_the_deadline) {
  srv_start(&S, "--timeout", "2", "--min-upload-rate", "0", NULL);
  int fd = raw_connect(S.port);
  cr_assert_geq(fd, 0);
  raw_sends(fd, huge_head);
  char *got = trickle(fd, 0.3, 60);
  close(fd);
  cr_expect(strstr(got, "HTTP/1.1 408 "), "no 408 for a body past --timeout: %.300s", got);
  cr_expect(strstr(got, "\"request_timeout\"") && strstr(got, "--timeout"), "%.400s", got);
  free(got);
  const char *why[] = {"reason=body_timeout", NULL};
  cr_expect_eq(srv_metric(&S, "attnd_connections_closed_total", why), 1);
  tiny_post_works("after a trickled body");
}

/* Below --min-upload-rate over a window, a body is answered 408 long before
 * --timeout. */
Test(lockout, a_body_below_the_minimum_rate_is_cut) {
  srv_start(&S, "--min-upload-rate", "1K", NULL); /* --timeout 60 */
  int fd = raw_connect(S.port);
  cr_assert_geq(fd, 0);
  raw_sends(fd, huge_head);
  char *got = trickle(fd, 0.3, 50);
  close(fd);
  cr_expect(strstr(got, "HTTP/1.1 408 "), "no 408 for a trickling body: %.300s", got);
  cr_expect(strstr(got, "--min-upload-rate"), "%.400s", got);
  free(got);
  const char *why[] = {"reason=body_too_slow", NULL};
  cr_expect_eq(srv_metric(&S, "attnd_connections_closed_total", why), 1);
}

/* A chunked upload that sends one chunk and then waits. */
static int slow_chunked(const char *source) {
  int fd = raw_connect_from(S.port, source);
  cr_assert_geq(fd, 0, "connect from %s: %s", source, strerror(errno));
  raw_sends(fd, "POST /attention HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                "Transfer-Encoding: chunked\r\n\r\n1\r\n{\r\n");
  return fd;
}

/* Slow uploads from two addresses fill every connection: a client from a
 * third still reaches /healthz, by cutting the slowest upload of a client
 * holding the most, which is answered 503 connections_full. Seven uploads
 * are seen in /metrics first (the harness's own connection takes the
 * eighth place meanwhile); the eighth gets a moment to send its headers,
 * and should it still be waiting for them when the newcomer comes, it is
 * the one closed (as any connection that is not busy would be). */
Test(lockout, busy_uploads_leave_room_for_another_client) {
  srv_start(&S, "--max-connections", "8", "--max-connections-per-client", "4", "--min-upload-rate",
            "0", NULL);
  int fds[8];
  for (int i = 0; i < 7; i++)
    fds[i] = slow_chunked(i < 4 ? "127.0.0.2" : "127.0.0.3");
  cr_assert(srv_wait_metric_ge(&S, "attnd_uploads", NULL, 7, 60), "the uploads never began");
  fds[7] = slow_chunked("127.0.0.3");
  sleep_s(0.5);
  int fd = raw_connect_from(S.port, "127.0.0.4");
  cr_assert_geq(fd, 0);
  raw_sends(fd, "GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n");
  http_res r;
  cr_expect_eq(raw_response(fd, 30000, &r), 200, "a new client was locked out: %s", r.error);
  http_res_free(&r);
  close(fd);
  int cut = 0, closed = 0;
  for (int i = 0; i < 8; i++) {
    bool end;
    char *got = read_until_close_ex(fds[i], 200, &end);
    closed += end;
    if (strstr(got, "HTTP/1.1 503 ") && strstr(got, "connections_full"))
      cut++;
    free(got);
    close(fds[i]);
  }
  cr_expect_eq(closed, 1, "%d uploads were closed for one client", closed);
  const char *up[] = {"reason=upload_evicted", NULL};
  cr_expect_eq(cut, (int)srv_metric(&S, "attnd_connections_closed_total", up),
               "an upload cut was not answered 503 connections_full");
}
