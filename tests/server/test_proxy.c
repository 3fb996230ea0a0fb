/*
 * test_proxy.c — attnd behind a load balancer: whose X-Forwarded-For names
 * the client (--trusted-proxy), a trusted proxy's connections left out of
 * the per-client cap, and --drain-delay's window between SIGTERM and the
 * drain. Connections from 127.0.0.2 play the proxy, from 127.0.0.1 anyone.
 *
 * No test measures time: each waits for the event it names (a log line, a
 * reply, an exit) within a bound the broken behaviour would outlast.
 */
#include "harness.h"

#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static srv S;
static void teardown(void) { srv_cleanup(&S); }
TestSuite(proxy, .fini = teardown, .timeout = 120);

/* GET /healthz from source with extra header lines, id naming its log line. */
static void get_from(const char *source, const char *headers, const char *id) {
  int fd = raw_connect_from(S.port, source);
  cr_assert_geq(fd, 0);
  char req[512];
  snprintf(req, sizeof req,
           "GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Request-Id: %s\r\n%s\r\n", id, headers);
  raw_sends(fd, req);
  http_res r;
  cr_expect_eq(raw_response(fd, 30000, &r), 200, "%s: %s", id, r.error);
  http_res_free(&r);
  close(fd);
}

/* Whether the log line of request id names client. */
static bool logged_client(const char *id, const char *client) {
  char needle[160];
  snprintf(needle, sizeof needle, " client=%s id=%s\n", client, id);
  return srv_wait_log(&S, needle, 10);
}

Test(proxy, a_trusted_proxys_forwarded_for_names_the_client) {
  static const struct {
    const char *headers, *id, *client;
  } cases[] = {
      {"X-Forwarded-For: 198.51.100.7\r\n", "one-hop", "198.51.100.7"},
      /* read from the right, past every trusted hop */
      {"X-Forwarded-For: 203.0.113.1, 198.51.100.8, 10.1.2.3\r\n", "chain", "198.51.100.8"},
      /* two header lines are one list, in their order */
      {"X-Forwarded-For: 198.51.100.9\r\nX-Forwarded-For: 10.0.0.5\r\n", "two", "198.51.100.9"},
      {"X-Forwarded-For: [2001:db8::1]:4711\r\n", "v6", "2001:db8::1"},
      /* an entry that is no address ends the walk at the hop that wrote it */
      {"X-Forwarded-For: 198.51.100.1, bogus<script>\r\n", "garbage", "127.0.0.2"},
      {"", "none", "127.0.0.2"},
  };
  srv_start(&S, "--trusted-proxy", "127.0.0.2, 10.0.0.0/8", NULL);
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    get_from("127.0.0.2", cases[i].headers, cases[i].id);
    cr_expect(logged_client(cases[i].id, cases[i].client), "%s: %s", cases[i].id, srv_log(&S));
  }
}

Test(proxy, anyone_elses_forwarded_for_is_ignored) {
  srv_start(&S, "--trusted-proxy", "127.0.0.2", NULL);
  get_from("127.0.0.1", "X-Forwarded-For: 198.51.100.7\r\n", "forged");
  cr_expect(logged_client("forged", "127.0.0.1"), "%s", srv_log(&S));
  srv_stop(&S, 30);
  srv_start(&S, NULL); /* no --trusted-proxy: nobody's */
  get_from("127.0.0.2", "X-Forwarded-For: 198.51.100.7\r\n", "untrusted");
  cr_expect(logged_client("untrusted", "127.0.0.2"), "%s", srv_log(&S));
}

/* An idle keep-alive connection from source: one request answered. */
static int idle_from(const char *source) {
  int fd = raw_connect_from(S.port, source);
  cr_assert_geq(fd, 0);
  raw_sends(fd, "GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n");
  http_res r;
  cr_assert_eq(raw_response(fd, 30000, &r), 200, "%s", r.error);
  http_res_free(&r);
  return fd;
}

/* A client over --max-connections-per-client loses its oldest idle
 * connection; the trusted proxy, carrying many clients, does not. */
Test(proxy, a_trusted_proxy_is_not_capped_per_client) {
  srv_start(&S, "--trusted-proxy", "127.0.0.2", "--max-connections-per-client", "2", NULL);
  int proxy[4], other[3];
  for (int i = 0; i < 4; i++)
    proxy[i] = idle_from("127.0.0.2");
  for (int i = 0; i < 3; i++)
    other[i] = idle_from("127.0.0.3");
  cr_expect_geq(raw_wait_close(other[0], 10000), 0, "the capped client's oldest stayed open");
  for (int i = 0; i < 4; i++) { /* every one of the proxy's still answers */
    raw_sends(proxy[i], "GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n");
    http_res r;
    cr_expect_eq(raw_response(proxy[i], 30000, &r), 200, "proxy connection %d: %s", i, r.error);
    http_res_free(&r);
    close(proxy[i]);
  }
  for (int i = 0; i < 3; i++)
    close(other[i]);
}

static const char tiny_json[] = "{\"q\": [[1, 0]], \"k\": [[1, 0]], \"v\": [[1, 2]]}";

/* Within --drain-delay: /readyz says 503 while work is still taken, each
 * reply closing its connection; a second SIGTERM drains at once. */
Test(proxy, drain_delay_serves_while_readyz_says_stopping) {
  srv_start(&S, "--drain-delay", "600", NULL);
  kill(S.pid, SIGTERM);
  cr_assert(srv_wait_log(&S, "/readyz answers 503", 10), "%s", srv_log(&S));
  http_res r;
  cr_assert_eq(http_get(&S, "/readyz", &r), 0);
  cr_expect(expect_error(&r, 503, "shutting_down", "/readyz in the delay"));
  cr_expect(strstr(r.body, "--drain-delay"), "%s", r.body);
  http_res_free(&r);
  cr_assert_eq(http_post(&S, "/attention", "application/json", tiny_json, strlen(tiny_json), &r),
               0);
  cr_expect_eq(r.status, 200, "work refused in the delay: %s", r.body);
  cr_expect(expect_header(&r, "Connection", "close"));
  http_res_free(&r);
  kill(S.pid, SIGTERM);
  cr_expect_eq(srv_wait(&S, 60), 0, "%s", srv_log(&S));
  char *log = srv_log(&S);
  cr_expect(strstr(log, "SIGTERM: draining"), "%s", log);
  free(log);
}

Test(proxy, bad_flag_values_are_refused) {
  static const char *const bad[][2] = {{"--trusted-proxy", "10.0.0.0/33"},
                                       {"--trusted-proxy", "example.com"},
                                       {"--trusted-proxy", "::1/129"},
                                       {"--trusted-proxy", "10.0.0.1/"},
                                       {"--drain-delay", "-1"}};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    const char *args[] = {bad[i][0], bad[i][1], NULL};
    char *err = NULL;
    cr_expect_eq(run_attnd(args, NULL, 10, NULL, &err), 2, "%s %s", bad[i][0], bad[i][1]);
    cr_expect(err && strstr(err, bad[i][0] + 2), "%s %s: %s", bad[i][0], bad[i][1], err);
    free(err);
  }
}
