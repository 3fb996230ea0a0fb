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

/* ---- uploads ---------------------------------------------------------------- */

/* What the cut hook saw, and a mark it writes on the socket (the reply). */
typedef struct cuts {
  int n;
  attnd_conn_reason why[8];
  const void *arg[8];
} cuts;

static void record_cut(void *ctx, attnd_conn *k, attnd_conn_reason why, const void *arg) {
  cuts *c = ctx;
  if (c->n < 8) {
    c->why[c->n] = why;
    c->arg[c->n] = arg;
  }
  c->n++;
  if (why != ATTND_CLOSE_CLIENT_GONE) {
    k->cut_status = 408;
    k->cut_bytes = (size_t)send(k->fd, "R", 1, MSG_NOSIGNAL);
  }
}

/* A registry of 10 connections whose cut uploads the hook records. */
static void uploads_init(attnd_conns *c, double min_rate, cuts *seen) {
  attnd_conns_init(c, 10, 0, 10, 30);
  attnd_conns_uploads(c, min_rate, record_cut, seen);
}

/* A connection of client "a" whose body, due by deadline, began at 0. */
static attnd_conn *upload_on(attnd_conns *c, pair p, const char *id, double deadline) {
  attnd_conn *k = attnd_conns_open(c, p.near, "a", 0);
  attnd_conns_upload(c, k, id, deadline, 0);
  return k;
}

/* Whether the far end got the hook's reply and then end-of-file. */
static bool got_reply_then_closed(pair p) {
  char c = 0;
  return recv(p.far, &c, 1, MSG_DONTWAIT) == 1 && c == 'R' && was_closed(p);
}

Test(conns, a_late_upload_is_answered_and_cut) {
  attnd_conns c;
  cuts seen = {0};
  uploads_init(&c, 0, &seen);
  pair p = mkpair();
  attnd_conn *k = upload_on(&c, p, "id1", 60);
  attnd_conns_upload_add(&c, k, 100);
  cr_expect_eq(attnd_conns_sweep(&c, 59.9), 0, "cut before its deadline");
  cr_expect_eq(attnd_conns_sweep(&c, 60), 1);
  cr_expect(seen.n == 1 && seen.why[0] == ATTND_CLOSE_BODY_TIMEOUT && !seen.arg[0]);
  cr_expect_str_eq(k->id, "id1");
  cr_expect(got_reply_then_closed(p), "no reply, or the socket stayed open");
  int status;
  size_t bytes;
  cr_expect(attnd_conns_was_cut(&c, k, &status, &bytes));
  cr_expect(status == 408 && bytes == 1);
  cr_expect_eq(attnd_conns_sweep(&c, 1000), 0, "cut twice");
  attnd_conns_close(&c, k);
  unpair(p);
  attnd_conns_destroy(&c);
}

Test(conns, a_trickling_upload_is_cut_after_a_slow_window) {
  attnd_conns c;
  cuts seen = {0};
  uploads_init(&c, 100, &seen);
  pair fast = mkpair(), slow = mkpair();
  attnd_conn *f = upload_on(&c, fast, "f", 1000);
  attnd_conn *s = upload_on(&c, slow, "s", 1000);
  attnd_conns_upload_add(&c, f, 600);
  attnd_conns_upload_add(&c, s, 499); /* 100 B/s over 5 s is 500 */
  cr_expect_eq(attnd_conns_sweep(&c, ATTND_RATE_WINDOW - 0.1), 0, "judged before a window");
  cr_expect_eq(attnd_conns_sweep(&c, ATTND_RATE_WINDOW), 1);
  cr_expect(seen.n == 1 && seen.why[0] == ATTND_CLOSE_BODY_TOO_SLOW);
  cr_expect(got_reply_then_closed(slow));
  cr_expect(!was_closed(fast), "the upload at the rate was cut");
  /* the next window starts where the last ended: the fast one must keep up */
  attnd_conns_upload_add(&c, f, 100);
  cr_expect_eq(attnd_conns_sweep(&c, 2 * ATTND_RATE_WINDOW), 1, "a stalled upload kept");
  uint64_t n[ATTND_CLOSE_REASONS];
  attnd_conns_counts(&c, n);
  cr_expect_eq(n[ATTND_CLOSE_BODY_TOO_SLOW], 2);
  unpair(fast);
  unpair(slow);
  attnd_conns_destroy(&c);
}

Test(conns, an_upload_whose_client_left_is_cut_unanswered) {
  attnd_conns c;
  cuts seen = {0};
  uploads_init(&c, 0, &seen);
  pair p = mkpair(), other = mkpair();
  attnd_conn *k = upload_on(&c, p, "k", 60);
  attnd_conn *o = upload_on(&c, other, "o", 60);
  shutdown(p.far, SHUT_WR); /* the client's FIN, right behind its bytes */
  cr_expect_eq(attnd_conns_sweep(&c, 1), 1);
  cr_expect(seen.n == 1 && seen.why[0] == ATTND_CLOSE_CLIENT_GONE);
  char b;
  cr_expect_eq(recv(p.far, &b, 1, MSG_DONTWAIT), 0, "a reply was written to a client gone");
  cr_expect(!was_closed(other));
  int status;
  size_t bytes;
  cr_expect(attnd_conns_was_cut(&c, k, &status, &bytes) && status == 0);
  cr_expect(!attnd_conns_was_cut(&c, o, &status, &bytes));
  unpair(p);
  unpair(other);
  attnd_conns_destroy(&c);
}

Test(conns, the_http_layer_cut_is_answered_once) {
  attnd_conns c;
  cuts seen = {0};
  uploads_init(&c, 0, &seen);
  pair p = mkpair();
  attnd_conn *k = upload_on(&c, p, "k", 60);
  int reply = 413;
  attnd_conns_cut(&c, k, ATTND_CLOSE_BODY_REFUSED, &reply);
  attnd_conns_cut(&c, k, ATTND_CLOSE_BODY_REFUSED, &reply);
  cr_expect_eq(attnd_conns_sweep(&c, 100), 0);
  cr_expect_eq(seen.n, 1, "answered %d times", seen.n);
  cr_expect(seen.arg[0] == &reply, "the layer's reply was not passed on");
  unpair(p);
  attnd_conns_destroy(&c);
}

Test(conns, a_full_server_cuts_the_slowest_upload_of_the_client_holding_most) {
  attnd_conns c;
  cuts seen = {0};
  attnd_conns_init(&c, 4, 0, 10, 30);
  attnd_conns_uploads(&c, 0, record_cut, &seen);
  pair p[4];
  attnd_conn *k[4];
  const char *who[4] = {"flood", "flood", "flood", "other"};
  size_t sent[4] = {5000, 10, 900, 1};
  for (int i = 0; i < 4; i++) {
    p[i] = mkpair();
    k[i] = attnd_conns_open(&c, p[i].near, who[i], 0);
    attnd_conns_upload(&c, k[i], "u", 1000, 0);
    attnd_conns_upload_add(&c, k[i], sent[i]);
  }
  cr_expect(!attnd_conns_admit(&c, "flood", 10), "the client holding most cut its own upload");
  cr_expect(attnd_conns_admit(&c, "newcomer", 10), "a client with none was refused");
  cr_expect(seen.n == 1 && seen.why[0] == ATTND_CLOSE_UPLOAD_EVICTED);
  cr_expect(got_reply_then_closed(p[1]), "not the slowest upload of the top client was cut");
  for (int i = 0; i < 4; i++)
    if (i != 1)
      cr_expect(!was_closed(p[i]), "upload %d was cut too", i);
  uint64_t n[ATTND_CLOSE_REASONS];
  attnd_conns_counts(&c, n);
  cr_expect_eq(n[ATTND_CLOSE_UPLOAD_EVICTED], 1);
  cr_expect_eq(n[ATTND_CLOSE_REFUSED], 1);
  for (int i = 0; i < 4; i++)
    unpair(p[i]);
  attnd_conns_destroy(&c);
}

Test(conns, computing_connections_are_never_cut_for_a_newcomer) {
  attnd_conns c;
  cuts seen = {0};
  attnd_conns_init(&c, 2, 0, 10, 30);
  attnd_conns_uploads(&c, 0, record_cut, &seen);
  pair p[2];
  for (int i = 0; i < 2; i++) {
    p[i] = mkpair();
    attnd_conn *k = attnd_conns_open(&c, p[i].near, "flood", 0);
    attnd_conns_set(&c, k, ATTND_CONN_BUSY, 1);
  }
  cr_expect(!attnd_conns_admit(&c, "newcomer", 2));
  cr_expect_eq(seen.n, 0);
  cr_expect(!was_closed(p[0]) && !was_closed(p[1]));
  for (int i = 0; i < 2; i++)
    unpair(p[i]);
  attnd_conns_destroy(&c);
}

/* Several polling threads admit connections before any is registered:
 * each admission holds a place, so two admitted and not yet open fill a
 * limit of 2; registering takes the place it held, and a place never taken
 * lapses at a sweep a second on. */
Test(conns, admitted_connections_hold_their_places_until_open) {
  attnd_conns c;
  attnd_conns_init(&c, 2, 0, 10, 30);
  cr_expect(attnd_conns_admit(&c, "a", 0));
  cr_expect(attnd_conns_admit(&c, "b", 0));
  cr_expect(!attnd_conns_admit(&c, "c", 0), "a third admitted while two held the places");
  pair p[2];
  for (int i = 0; i < 2; i++) {
    p[i] = mkpair();
    attnd_conn *k = attnd_conns_open(&c, p[i].near, i ? "b" : "a", 0.1);
    attnd_conns_set(&c, k, ATTND_CONN_BUSY, 0.1);
  }
  cr_expect_eq(c.pending, 0, "registering took the places");
  cr_expect(!attnd_conns_admit(&c, "c", 0.2), "both busy: no room");
  attnd_conns_sweep(&c, 5);
  attnd_conns_destroy(&c);
  attnd_conns_init(&c, 1, 0, 10, 30);
  cr_expect(attnd_conns_admit(&c, "a", 0)); /* libmicrohttpd then refuses it */
  cr_expect(!attnd_conns_admit(&c, "b", 0.5), "the held place is still held");
  attnd_conns_sweep(&c, 0.5);
  cr_expect(!attnd_conns_admit(&c, "b", 0.6), "a place half a second old lapsed");
  attnd_conns_sweep(&c, 2.0);
  cr_expect(attnd_conns_admit(&c, "b", 2.0), "a place never taken lapses at the sweep");
  for (int i = 0; i < 2; i++)
    unpair(p[i]);
  attnd_conns_destroy(&c);
}
