/*
 * test_load_sched.c — `attn load`'s scheduler and connections
 * (clients/load_sched.h, load_conn.h) against a small HTTP/1.1 server on
 * 127.0.0.1 in this process (a thread a connection, every request answered
 * with the status it is told): the counts add up (sent = answered +
 * transport errors + in flight), statuses and bytes are counted per reply,
 * `Connection: close` reconnects, and a port nobody listens on stops the
 * run as unreachable.
 */
#include "load_sched.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

typedef struct srv {
  int fd, port, status;
  bool close_each; /* answer with Connection: close */
  pthread_t accept_thread;
} srv;

typedef struct peer {
  srv *s;
  int fd;
} peer;

static const char HEAD[] = "POST /attention HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                           "Content-Length: 5\r\n\r\n";
static const char BODY[] = "hello";
static const char REPLY_BODY[] = "{\"ok\": 1}";

/* Reads one request (head, then its 5-byte body); false at EOF. */
static bool read_request(int fd) {
  char buf[4096];
  size_t n = 0;
  while (n < sizeof buf) {
    ssize_t r = read(fd, buf + n, 1);
    if (r <= 0)
      return false;
    n++;
    if (n >= 4 && !memcmp(buf + n - 4, "\r\n\r\n", 4))
      break;
  }
  for (size_t got = 0; got < 5;) {
    ssize_t r = read(fd, buf, 5 - got);
    if (r <= 0)
      return false;
    got += (size_t)r;
  }
  return true;
}

static void *serve(void *arg) {
  peer *p = arg;
  char reply[256];
  int len = snprintf(
      reply, sizeof reply, "HTTP/1.1 %d X\r\nContent-Length: %zu\r\nConnection: %s\r\n\r\n%s",
      p->s->status, strlen(REPLY_BODY), p->s->close_each ? "close" : "keep-alive", REPLY_BODY);
  while (read_request(p->fd)) {
    if (write(p->fd, reply, (size_t)len) != len || p->s->close_each)
      break;
  }
  close(p->fd);
  free(p);
  return NULL;
}

static void *accept_loop(void *arg) {
  srv *s = arg;
  for (;;) {
    int fd = accept(s->fd, NULL, NULL);
    if (fd < 0)
      return NULL;
    peer *p = malloc(sizeof *p);
    p->s = s;
    p->fd = fd;
    pthread_t t;
    pthread_create(&t, NULL, serve, p);
    pthread_detach(t);
  }
}

static void srv_start(srv *s, int status, bool close_each) {
  s->status = status;
  s->close_each = close_each;
  s->fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof a;
  cr_assert(bind(s->fd, (struct sockaddr *)&a, sizeof a) == 0);
  cr_assert(listen(s->fd, 64) == 0);
  getsockname(s->fd, (struct sockaddr *)&a, &al);
  s->port = ntohs(a.sin_port);
  pthread_create(&s->accept_thread, NULL, accept_loop, s);
}

static void srv_stop(srv *s) {
  shutdown(s->fd, SHUT_RDWR);
  close(s->fd);
  pthread_join(s->accept_thread, NULL);
}

static srv S = {.fd = -1};
static tool_load *L;

static uint64_t ended(void) {
  return L->n.answered + tool_load_transport_errors(&L->n) + L->n.in_flight_end;
}

/* The server, answering status (and closing each connection when
 * close_each), and a plan of n requests to it, closed loop over c
 * connections. */
static void setup(int status, bool close_each, int64_t n, int c) {
  signal(SIGPIPE, SIG_IGN);
  srv_start(&S, status, close_each);
  L = calloc(1, sizeof *L);
  cr_assert(L && tool_hist_init(&L->hist) == 0);
  uv_ip4_addr("127.0.0.1", S.port, &L->wire.addr);
  L->wire.head = HEAD;
  L->wire.head_len = strlen(HEAD);
  L->wire.body = BODY;
  L->wire.body_len = strlen(BODY);
  L->concurrency = L->max_pool = c;
  L->duration = 10;
  L->max_requests = n;
  L->timeout = 10;
}

/* Runs the plan: every request it sent has ended exactly once. */
static void run(void) {
  cr_expect_eq(tool_load_run(L), 0);
  cr_expect_eq(ended(), L->n.sent);
}

static void finish(void) {
  tool_load_free(L);
  free(L);
  if (S.fd >= 0)
    srv_stop(&S);
}

Test(load_sched, closed_loop_counts_every_reply, .fini = finish) {
  setup(200, false, 40, 3);
  run();
  cr_expect_eq(L->n.sent, 40);
  cr_expect_eq(L->n.answered, 40);
  cr_expect_eq(L->n.ok, 40);
  cr_expect_eq(L->n.status[200], 40);
  cr_expect_eq(L->npool, 3, "one connection each, kept alive");
  cr_expect_eq(L->n.bytes_sent, 40 * (strlen(HEAD) + strlen(BODY)));
  cr_expect_geq(L->n.bytes_recv, 40 * strlen(REPLY_BODY));
  cr_expect_eq(tool_hist_count(&L->hist), 40);
  cr_expect(!L->no_connect);
}

Test(load_sched, open_loop_sends_on_schedule, .fini = finish) {
  setup(503, false, 30, 0);
  L->open_loop = true;
  L->rate = 1000;
  L->max_pool = TOOL_LOAD_MAX_POOL;
  run();
  cr_expect_eq(L->n.sent, 30);
  cr_expect_eq(L->n.answered, 30, "an HTTP error is an answer");
  cr_expect_eq(L->n.ok, 0);
  cr_expect_eq(L->n.status[503], 30);
  cr_expect_geq((double)(L->t_end - L->t0) * 1e-9, 29 / 1000.0, "request 29 is due at 29 ms");
}

Test(load_sched, connection_close_reconnects, .fini = finish) {
  setup(200, true, 12, 2);
  run();
  cr_expect_eq(L->n.answered, 12);
  cr_expect_eq(tool_load_transport_errors(&L->n), 0);
  cr_expect_eq(L->npool, 2, "the same two connections, reconnected");
}

/* An hour's run: only stopping at the refusal ends it within the test's
 * timeout (no duration is measured: the machine may be loaded). */
Test(load_sched, nobody_listening_stops_the_run, .fini = finish, .timeout = 120) {
  setup(200, false, 0, 2);
  srv_stop(&S); /* the port is free again, and refuses */
  S.fd = -1;
  L->duration = 3600;
  run();
  cr_expect(L->no_connect);
  cr_expect_neq(L->connect_err, 0);
  cr_expect_eq(L->n.answered, 0);
  cr_expect_eq(L->n.terr[TOOL_TERR_CONNECT], 2, "both connections' requests");
}
