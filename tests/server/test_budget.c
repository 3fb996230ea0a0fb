/*
 * test_budget.c — memory stays bounded: the bytes of request bodies the
 * server holds, uploads in progress included, never pass --max-queue x
 * --max-body; a request that would pass it gets 503 queue_full at once.
 */
#include "harness.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static srv S;

static void teardown(void) { srv_cleanup(&S); }

Test(budget, uploads_count_against_the_budget, .fini = teardown, .timeout = 60) {
  srv_start(&S, "--max-queue", "1", "--max-body", "1M", NULL);
  /* One upload announces 700 KiB and sends a little: the server holds a
   * 700 KiB buffer for it. */
  int a = raw_connect(S.port);
  cr_assert_geq(a, 0);
  raw_sends(a, "POST /attention HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
               "Content-Length: 716800\r\n\r\n");
  raw_send(a, "\x10\0\0\0\0\0\0\0", 8);
  /* the server holds the upload's buffer once the gauge shows it */
  cr_assert(srv_wait_metric_ge(&S, "attnd_uploads", NULL, 1, 60),
            "the first upload never showed in attnd_uploads");
  /* A second that would need another 700 KiB is over 1 x 1 MiB: 503 now. */
  int b = raw_connect(S.port);
  cr_assert_geq(b, 0);
  raw_sends(b, "POST /attention HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
               "Content-Length: 716800\r\n\r\n");
  http_res rs;
  cr_assert_eq(raw_response(b, 5000, &rs), 503);
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
