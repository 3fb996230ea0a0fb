/*
 * test_conns.c — the connection registry on socket pairs: which connection
 * a full server closes, per-client shares, deadlines, and the counters. A
 * connection the registry closes shows as end-of-file on the pair's far end.
 */
#include "conns.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <sys/socket.h>
#include <unistd.h>

typedef struct pair {
  int near, far; /* near: the server's socket; far: the client's */
} pair;

static pair mkpair(void) {
  int sv[2];
  cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  return (pair){sv[0], sv[1]};
}

/* Whether the registry shut the server's end down. */
static bool was_closed(pair p) {
  char c;
  return recv(p.far, &c, 1, MSG_DONTWAIT) == 0;
}

static void unpair(pair p) {
  close(p.near);
  close(p.far);
}

Test(conns, full_server_closes_the_oldest_idle_first) {
  attnd_conns c;
  attnd_conns_init(&c, 3, 0, 10, 30);
  pair p[4];
  attnd_conn *k[4];
  for (int i = 0; i < 3; i++) {
    cr_assert(attnd_conns_admit(&c, "10.0.0.1", i));
    p[i] = mkpair();
    k[i] = attnd_conns_open(&c, p[i].near, "10.0.0.1", i);
  }
  attnd_conns_set(&c, k[0], ATTND_CONN_BUSY, 3); /* oldest, but busy */
  attnd_conns_set(&c, k[1], ATTND_CONN_IDLE, 4); /* idle since 4 */
  /* k[2] waits for headers since 2: the oldest that is not busy */
  cr_assert(attnd_conns_admit(&c, "10.0.0.2", 5));
  cr_expect(was_closed(p[2]), "the oldest non-busy connection was kept");
  cr_expect(!was_closed(p[0]) && !was_closed(p[1]));
  p[3] = mkpair();
  k[3] = attnd_conns_open(&c, p[3].near, "10.0.0.2", 5);
  attnd_conns_close(&c, k[2]); /* the HTTP library closes it */
  cr_assert(attnd_conns_admit(&c, "10.0.0.3", 6));
  cr_expect(was_closed(p[1]), "the idle keep-alive connection was kept");
  attnd_conns_close(&c, k[1]);
  uint64_t n[ATTND_CLOSE_REASONS];
  attnd_conns_counts(&c, n);
  cr_expect_eq(n[ATTND_CLOSE_EVICTED], 2);
  for (int i = 0; i < 4; i++)
    unpair(p[i]);
  attnd_conns_destroy(&c);
}

Test(conns, all_busy_means_refused) {
  attnd_conns c;
  attnd_conns_init(&c, 2, 0, 10, 30);
  pair p[2];
  for (int i = 0; i < 2; i++) {
    p[i] = mkpair();
    attnd_conn *k = attnd_conns_open(&c, p[i].near, "a", 0);
    attnd_conns_set(&c, k, ATTND_CONN_BUSY, 1);
  }
  cr_expect(!attnd_conns_admit(&c, "b", 2), "admitted past the limit with all busy");
  cr_expect(!was_closed(p[0]) && !was_closed(p[1]), "a busy connection was closed");
  uint64_t n[ATTND_CLOSE_REASONS];
  attnd_conns_counts(&c, n);
  cr_expect_eq(n[ATTND_CLOSE_REFUSED], 1);
  for (int i = 0; i < 2; i++)
    unpair(p[i]);
  attnd_conns_destroy(&c);
}

Test(conns, one_client_pays_for_its_own_share) {
  attnd_conns c;
  attnd_conns_init(&c, 100, 2, 10, 30);
  pair other = mkpair(), p[2];
  attnd_conns_open(&c, other.near, "victim", 0);
  for (int i = 0; i < 2; i++) {
    p[i] = mkpair();
    attnd_conns_open(&c, p[i].near, "flood", 1 + i);
  }
  cr_assert(attnd_conns_admit(&c, "flood", 5));
  cr_expect(was_closed(p[0]), "the client's own oldest idle connection stayed");
  cr_expect(!was_closed(other), "another client's older connection was closed");
  cr_expect(!was_closed(p[1]));
  unpair(other);
  for (int i = 0; i < 2; i++)
    unpair(p[i]);
  attnd_conns_destroy(&c);
}

Test(conns, deadlines_are_absolute) {
  attnd_conns c;
  attnd_conns_init(&c, 10, 0, 2, 5);
  pair w = mkpair(), idle = mkpair(), busy = mkpair();
  attnd_conns_open(&c, w.near, "a", 0); /* headers due by 2 */
  attnd_conn *i = attnd_conns_open(&c, idle.near, "a", 0);
  attnd_conns_set(&c, i, ATTND_CONN_IDLE, 1); /* idle: due by 1 + 5 + 2 */
  attnd_conn *b = attnd_conns_open(&c, busy.near, "a", 0);
  attnd_conns_set(&c, b, ATTND_CONN_BUSY, 0); /* never due */
  cr_expect_eq(attnd_conns_sweep(&c, 1.9), 0);
  cr_expect_eq(attnd_conns_sweep(&c, 2.0), 1);
  cr_expect(was_closed(w), "headers past the deadline");
  cr_expect_eq(attnd_conns_sweep(&c, 7.9), 0, "an idle one closed early");
  cr_expect_eq(attnd_conns_sweep(&c, 8.0), 1);
  cr_expect(was_closed(idle));
  cr_expect_eq(attnd_conns_sweep(&c, 1000), 0, "a busy connection has no deadline here");
  cr_expect(!was_closed(busy));
  uint64_t n[ATTND_CLOSE_REASONS];
  attnd_conns_counts(&c, n);
  cr_expect_eq(n[ATTND_CLOSE_HEADER_TIMEOUT], 1);
  cr_expect_eq(n[ATTND_CLOSE_IDLE_TIMEOUT], 1);
  unpair(w);
  unpair(idle);
  unpair(busy);
  attnd_conns_destroy(&c);
}
