/*
 * test_fairness.c — one client cannot hold every compute slot, and one
 * request cannot ask for unbounded work.
 *
 * Two clients are two source addresses: on Linux every address of 127/8 is
 * a loopback address, so a socket bound to 127.0.0.2 reaches the server on
 * 127.0.0.1 as another client. Client A holds jobs that stay running until
 * canceled (build/tests/attnd-hold, tests/lib/hold_backend.c); client B's
 * small job must be answered while A's still run. Nothing here asserts a duration: what is checked
 * is the order of events (B's reply before any of A's) and the server's replies.
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
TestSuite(fairness, .fini = teardown, .timeout = 120);

#define ST_CT "application/octet-stream"

/* A whole POST /attention sent on a connection from source address src. */
static int post_from(const char *src, const void *body, size_t len) {
  int fd = raw_connect_from(S.port, src);
  cr_assert_geq(fd, 0, "connect from %s: %s", src, strerror(errno));
  char h[256];
  snprintf(h, sizeof h,
           "POST /attention HTTP/1.1\r\nHost: localhost\r\nContent-Type: " ST_CT
           "\r\nContent-Length: %zu\r\n\r\n",
           len);
  cr_assert(raw_sends(fd, h) == 0 && raw_send(fd, body, len) == 0, "sending from %s", src);
  return fd;
}

/* Whether the server has written anything (a reply) on fd yet. */
static bool answered(int fd) {
  char c;
  ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n > 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}

/* The CPU backend's two slots and the default --max-running-per-client
 * (auto: one of the two): A's three held jobs take one slot between them,
 * so B's job takes the other at once and is answered while A's first still
 * runs. Before, A's jobs held both slots and B waited for two of them
 * to end. */
Test(fairness, another_client_is_served_while_one_holds_slow_jobs) {
  S.bin = srv_hold_bin();
  srv_start(&S, "--threads", "2", NULL);
  tcase slow, small;
  size_t slen, blen;
  char *sbody = held_body(&slow, &slen);
  tprob p = tprob_make(1, 2, 2, 32, 32, 32, ATTN_F32);
  tcase_init(&small, &p, 9001);
  char *bbody = st_body(&small, 4, NULL, &blen);
  enum { NA = 3 };
  int a[NA];
  for (int i = 0; i < NA; i++)
    a[i] = post_from("127.0.0.1", sbody, slen);
  cr_assert(srv_wait_jobs(&S, NA, true, 60), "A's jobs never showed in /metrics");
  int b = post_from("127.0.0.2", bbody, blen);
  http_res r;
  raw_response(b, 60000, &r);
  expect_correct(&r, &small, 4, true, "B's job beside A's held ones");
  http_res_free(&r);
  for (int i = 0; i < NA; i++)
    cr_expect_not(answered(a[i]), "A's job %d was answered before B's: A held every slot", i);
  cr_expect_geq(srv_metric(&S, "attnd_inflight", NULL), 1, "A's first job is still running");
  for (int i = 0; i < NA; i++)
    raw_reset(a[i]);
  close(b);
  free(sbody);
  free(bbody);
  tcase_free(&slow);
  tcase_free(&small);
}

/* --max-pairs (here from its variable): a request asking for more score
 * pairs is refused with 422 too_much_work and the numbers, on /attention
 * and /v2 alike; one within it is computed. */
Test(fairness, max_pairs_refuses_a_request_before_it_computes) {
  const char *env[] = {"ATTND_MAX_PAIRS=1000", NULL};
  srv_startv(&S, NULL, env, true);
  tcase big, ok;
  size_t len;
  tprob p = tprob_make(1, 2, 2, 32, 32, 32, ATTN_F32); /* 2 x 32 x 32 = 2048 pairs */
  tcase_init(&big, &p, 1);
  char *body = st_body(&big, 4, NULL, &len);
  http_res r;
  http_post(&S, "/attention", ST_CT, body, len, &r);
  expect_error(&r, 422, "too_much_work", "2048 pairs over --max-pairs 1000");
  cr_expect(r.body && strstr(r.body, "this request has 2048 score pairs, over --max-pairs 1000"),
            "the message gives the numbers: %s", r.body);
  http_res_free(&r);
  free(body);
  /* /v2: q [40, 2] and k, v [40, 2] are 1600 pairs */
  char v2[2048];
  size_t o = (size_t)snprintf(v2, sizeof v2, "{\"inputs\": [");
  for (int t = 0; t < 3; t++) {
    o += (size_t)snprintf(v2 + o, sizeof v2 - o,
                          "%s{\"name\": \"%c\", \"shape\": [40, 2], \"datatype\": \"FP32\", "
                          "\"data\": [",
                          t ? ", " : "", "qkv"[t]);
    for (int i = 0; i < 80; i++)
      o += (size_t)snprintf(v2 + o, sizeof v2 - o, i ? ",1" : "1");
    o += (size_t)snprintf(v2 + o, sizeof v2 - o, "]}");
  }
  o += (size_t)snprintf(v2 + o, sizeof v2 - o, "]}");
  http_post(&S, "/v2/models/attention/infer", "application/json", v2, o, &r);
  cr_expect_eq(r.status, 422, "/v2 over --max-pairs: %ld %s", r.status, r.body);
  cr_expect(r.body && strstr(r.body, "this request has 1600 score pairs, over --max-pairs 1000"),
            "/v2's message gives the numbers: %s", r.body);
  http_res_free(&r);
  tprob q = tprob_make(1, 1, 1, 16, 16, 32, ATTN_F32); /* 256 pairs */
  tcase_init(&ok, &q, 2);
  body = st_body(&ok, 4, NULL, &len);
  http_post(&S, "/attention", ST_CT, body, len, &r);
  expect_correct(&r, &ok, 4, true, "256 pairs under --max-pairs 1000");
  http_res_free(&r);
  const char *code[] = {"code=too_much_work", NULL};
  cr_expect_eq(srv_metric(&S, "attnd_errors_total", code), 2);
  free(body);
  tcase_free(&big);
  tcase_free(&ok);
}

/* Both flags are in --help with their variables; bad values exit 2 with one
 * line naming the flag. */
Test(fairness, flags) {
  const char *help[] = {"--help", NULL};
  char *out = NULL;
  cr_assert_eq(run_attnd(help, NULL, 10, &out, NULL), 0);
  cr_expect(out && strstr(out, "--max-running-per-client N|auto") &&
                strstr(out, "[ATTND_MAX_RUNNING_PER_CLIENT]") && strstr(out, "--max-pairs N") &&
                strstr(out, "[ATTND_MAX_PAIRS]"),
            "--help:\n%s", out ? out : "");
  free(out);
  const char *bad[][3] = {{"--max-running-per-client", "-1", NULL},
                          {"--max-running-per-client", "most", NULL},
                          {"--max-pairs", "-5", NULL},
                          {"--max-pairs", "1e9", NULL}};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    char *err = NULL;
    cr_expect_eq(run_attnd(bad[i], NULL, 10, NULL, &err), 2, "%s %s", bad[i][0], bad[i][1]);
    cr_expect(err && strstr(err, bad[i][0]) && strchr(err, '\n') == strrchr(err, '\n'), "%s %s: %s",
              bad[i][0], bad[i][1], err ? err : "");
    free(err);
  }
}
