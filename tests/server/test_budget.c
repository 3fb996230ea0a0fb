/*
 * test_budget.c — memory stays bounded: the bytes of request bodies the
 * server holds, uploads in progress included, never pass --max-queue x
 * --max-body; a request that would pass it gets 503 queue_full at once.
 */
#include "harness.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static srv S;

static void teardown(void) { srv_cleanup(&S); }

/* A connection that has sent all but the last byte of a body of len
 * bytes, once the server holds them; -1 when it never did. */
static int held_upload(size_t len, double held_before) {
  int fd = raw_connect(S.port);
  cr_assert_geq(fd, 0);
  char h[200];
  snprintf(h, sizeof h,
           "POST /attention HTTP/1.1\r\nHost: localhost\r\nContent-Type: "
           "application/octet-stream\r\nContent-Length: %zu\r\n\r\n",
           len);
  raw_sends(fd, h);
  char *body = calloc(1, len);
  raw_send(fd, body, len - 1);
  free(body);
  cr_assert(srv_wait_metric_ge(&S, "attnd_body_bytes", NULL, held_before + (double)len - 1, 60),
            "the server never held the upload's bytes");
  return fd;
}

Test(budget, declared_lengths_hold_nothing, .fini = teardown, .timeout = 60) {
  srv_start(&S, "--max-queue", "1", "--max-body", "1M", NULL);
  /* Uploads that declare 1 MiB each and send nothing hold at most a first
   * buffer each, whatever they declare: a small request still fits. */
  int fds[8];
  for (int i = 0; i < 8; i++) {
    fds[i] = raw_connect(S.port);
    cr_assert_geq(fds[i], 0);
    raw_sends(fds[i], "POST /attention HTTP/1.1\r\nHost: localhost\r\nContent-Type: "
                      "application/octet-stream\r\nContent-Length: 1048576\r\n\r\n");
  }
  cr_assert(srv_wait_metric_ge(&S, "attnd_uploads", NULL, 8, 60), "the uploads never began");
  cr_expect_leq(srv_metric(&S, "attnd_body_bytes", NULL), 8 * 65536.0,
                "declared lengths were reserved");
  http_res ok;
  const char *body = "{\"q\": [[1, 0]], \"k\": [[1, 0]], \"v\": [[1, 2]]}";
  cr_assert_eq(http_post(&S, "/attention", "application/json", body, strlen(body), &ok), 0);
  cr_expect_eq(ok.status, 200, "%s", ok.body);
  http_res_free(&ok);
  for (int i = 0; i < 8; i++)
    close(fds[i]);
  cr_expect_eq(srv_stop(&S, 10), 0);
}

Test(budget, uploads_count_against_the_budget, .fini = teardown, .timeout = 60) {
  srv_start(&S, "--max-queue", "1", "--max-body", "1M", NULL);
  /* One upload has sent 700 KiB: the server holds them. */
  int a = held_upload(716800, 0);
  /* A second that needs another 700 KiB is over 1 x 1 MiB: 503 once its
   * bytes pass what is left, answered at once in mid-body. */
  int b = raw_connect(S.port);
  cr_assert_geq(b, 0);
  raw_sends(
      b, "POST /attention HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\n"
         "Content-Length: 716800\r\n\r\n");
  char *part = calloc(1, 400000);
  raw_send(b, part, 400000); /* may fail once the server has cut it */
  free(part);
  http_res rs;
  cr_assert_eq(raw_response(b, 20000, &rs), 503);
  cr_expect(expect_error(&rs, 503, "queue_full", "second upload over the budget"));
  cr_expect(strstr(rs.body, "memory budget"), "%s", rs.body);
  char ra[16];
  cr_expect(http_header(&rs, "Retry-After", ra, sizeof ra), "no Retry-After");
  http_res_free(&rs);
  close(b);
  /* the first upload gone, its bytes are free again */
  close(a);
  /* its buffer is released in the callback that drops the gauge, on the one
   * HTTP thread that also answers /metrics: a gauge of 0 means it is free */
  cr_assert(srv_wait_metric_le(&S, "attnd_uploads", NULL, 0, 60),
            "the abandoned upload never left attnd_uploads");
  cr_expect(expect_healthy(&S, "the budget test"));
  http_res ok;
  const char *body = "{\"q\": [[1, 0]], \"k\": [[1, 0]], \"v\": [[1, 2]]}";
  cr_assert_eq(http_post(&S, "/attention", "application/json", body, strlen(body), &ok), 0);
  cr_expect_eq(ok.status, 200, "%s", ok.body);
  http_res_free(&ok);
  cr_expect_eq(srv_stop(&S, 10), 0);
}
