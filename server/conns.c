/*
 * conns.c — the connection registry: states, deadlines, and eviction of the
 * oldest idle connections when the server or one client is full.
 *
 * The list is kept in order of state changes (a change moves a record to the
 * tail), so the oldest evictable connection is the first one from the head
 * that is neither busy nor already closing. Connections number in the
 * thousands at most: linear walks under one mutex are cheaper than the
 * accept() they accompany. Only when every connection is busy does
 * admission count connections per client (evict_upload_for), which is
 * quadratic in the connections; that is the rare case of a full server.
 */
#include "conns.h"

#include <errno.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

static const char *const reason_names[ATTND_CLOSE_REASONS] = {
    [ATTND_CLOSE_EVICTED] = "evicted",           [ATTND_CLOSE_HEADER_TIMEOUT] = "header_timeout",
    [ATTND_CLOSE_IDLE_TIMEOUT] = "idle_timeout", [ATTND_CLOSE_REFUSED] = "refused",
    [ATTND_CLOSE_BODY_TIMEOUT] = "body_timeout", [ATTND_CLOSE_BODY_TOO_SLOW] = "body_too_slow",
    [ATTND_CLOSE_CLIENT_GONE] = "client_gone",   [ATTND_CLOSE_UPLOAD_EVICTED] = "upload_evicted",
    [ATTND_CLOSE_BODY_REFUSED] = "body_refused",
};

const char *attnd_conns_reason_name(attnd_conn_reason why) {
  return why < ATTND_CLOSE_REASONS && reason_names[why] ? reason_names[why] : "other";
}

void attnd_conns_init(attnd_conns *c, int max, int per_client, double header_timeout,
                      double idle_timeout) {
  memset(c, 0, sizeof *c);
  pthread_mutex_init(&c->mu, NULL);
  c->max = max;
  c->per_client = per_client;
  c->header_timeout = header_timeout;
  c->idle_timeout = idle_timeout;
}

void attnd_conns_uploads(attnd_conns *c, double min_rate, attnd_conn_cut_fn cut, void *ctx) {
  pthread_mutex_lock(&c->mu);
  c->min_rate = min_rate;
  c->cut = cut;
  c->cut_ctx = ctx;
  pthread_mutex_unlock(&c->mu);
}

void attnd_conns_destroy(attnd_conns *c) {
  attnd_conn *k = c->head;
  while (k) {
    attnd_conn *next = k->next;
    free(k);
    k = next;
  }
  c->head = c->tail = NULL;
  pthread_mutex_destroy(&c->mu);
}

static void unlink_conn(attnd_conns *c, attnd_conn *k) {
  if (k->prev)
    k->prev->next = k->next;
  else
    c->head = k->next;
  if (k->next)
    k->next->prev = k->prev;
  else
    c->tail = k->prev;
  k->prev = k->next = NULL;
}

static void append(attnd_conns *c, attnd_conn *k) {
  k->prev = c->tail;
  k->next = NULL;
  if (c->tail)
    c->tail->next = k;
  else
    c->head = k;
  c->tail = k;
}

/* Shuts k's socket down; the HTTP library sees the peer leave and closes it,
 * which unregisters it. Under the lock. */
static void shut(attnd_conns *c, attnd_conn *k, attnd_conn_reason why) {
  if (k->closing)
    return;
  shutdown(k->fd, SHUT_RDWR);
  k->closing = true;
  c->closing++;
  c->closed[why]++;
}

/* Cuts k's upload short: the hook answers, then the socket is shut down.
 * Under the lock. */
static void cut(attnd_conns *c, attnd_conn *k, attnd_conn_reason why, const void *arg) {
  if (k->closing)
    return;
  k->cut = true;
  if (c->cut)
    c->cut(c->cut_ctx, k, why, arg);
  shut(c, k, why);
}

static bool evictable(const attnd_conn *k, const char *client) {
  return (k->state == ATTND_CONN_AWAITING || k->state == ATTND_CONN_IDLE) && !k->closing &&
         (!client || !strcmp(k->client, client));
}

/* Closes the oldest evictable connection (of client, or of anyone when
 * client is NULL); false when there is none. */
static bool evict_oldest(attnd_conns *c, const char *client) {
  for (attnd_conn *k = c->head; k; k = k->next)
    if (evictable(k, client)) {
      shut(c, k, ATTND_CLOSE_EVICTED);
      return true;
    }
  return false;
}

static int live_of(const attnd_conns *c, const char *client) {
  int n = 0;
  for (const attnd_conn *k = c->head; k; k = k->next)
    n += !k->closing && !strcmp(k->client, client);
  return n;
}

/* An upload's rate so far, bytes per second. */
static double upload_rate(const attnd_conn *k, double now) {
  double t = now - k->up_started;
  return t > 0 ? (double)k->up_bytes / t : (double)k->up_bytes;
}

/*
 * Every connection busy: a client holding fewer connections than the client
 * with the most (by more than one) is under its share, and gets in by
 * cutting that client's slowest upload. false when there is none to cut
 * (the connections are computing or replying, which --max-queue bounds).
 */
static bool evict_upload_for(attnd_conns *c, const char *client, double now) {
  int mine = live_of(c, client), most = 0;
  attnd_conn *pick = NULL;
  for (attnd_conn *k = c->head; k; k = k->next) {
    if (k->closing || k->state != ATTND_CONN_UPLOADING || !strcmp(k->client, client))
      continue;
    int n = live_of(c, k->client);
    if (n > most || (n == most && upload_rate(k, now) < upload_rate(pick, now))) {
      most = n;
      pick = k;
    }
  }
  if (!pick || most <= mine + 1)
    return false;
  cut(c, pick, ATTND_CLOSE_UPLOAD_EVICTED, NULL);
  return true;
}

bool attnd_conns_admit(attnd_conns *c, const char *client, double now) {
  pthread_mutex_lock(&c->mu);
  bool ok = c->open - c->closing + c->pending < c->max || evict_oldest(c, NULL) ||
            evict_upload_for(c, client, now);
  bool capped = c->per_client > 0 && !(c->uncapped && attnd_proxies_trusts(c->uncapped, client));
  if (ok && capped && live_of(c, client) >= c->per_client)
    ok = evict_oldest(c, client);
  if (ok) {
    c->pending++;
    c->pending_at = now;
  } else {
    c->closed[ATTND_CLOSE_REFUSED]++;
  }
  pthread_mutex_unlock(&c->mu);
  return ok;
}

attnd_conn *attnd_conns_open(attnd_conns *c, int fd, const char *client, double now) {
  attnd_conn *k = calloc(1, sizeof *k);
  if (!k)
    return NULL;
  k->fd = fd;
  strncpy(k->client, client, sizeof k->client - 1);
  k->state = ATTND_CONN_AWAITING;
  k->since = now;
  pthread_mutex_lock(&c->mu);
  append(c, k);
  c->open++;
  if (c->pending > 0) /* the place its admission held */
    c->pending--;
  pthread_mutex_unlock(&c->mu);
  return k;
}

void attnd_conns_set(attnd_conns *c, attnd_conn *k, attnd_conn_state st, double now) {
  pthread_mutex_lock(&c->mu);
  k->state = st;
  k->since = now;
  unlink_conn(c, k);
  append(c, k);
  pthread_mutex_unlock(&c->mu);
}

void attnd_conns_upload(attnd_conns *c, attnd_conn *k, const char *id, double deadline,
                        double now) {
  pthread_mutex_lock(&c->mu);
  snprintf(k->id, sizeof k->id, "%s", id);
  k->state = ATTND_CONN_UPLOADING;
  k->since = k->up_started = k->up_mark = now;
  k->up_deadline = deadline;
  k->up_bytes = k->up_mark_bytes = 0;
  unlink_conn(c, k);
  append(c, k);
  pthread_mutex_unlock(&c->mu);
}

void attnd_conns_upload_add(attnd_conns *c, attnd_conn *k, size_t n) {
  pthread_mutex_lock(&c->mu);
  k->up_bytes += n;
  pthread_mutex_unlock(&c->mu);
}

void attnd_conns_cut(attnd_conns *c, attnd_conn *k, attnd_conn_reason why, const void *arg) {
  pthread_mutex_lock(&c->mu);
  cut(c, k, why, arg);
  pthread_mutex_unlock(&c->mu);
}

bool attnd_conns_was_cut(attnd_conns *c, attnd_conn *k, int *status, size_t *bytes) {
  pthread_mutex_lock(&c->mu);
  bool was = k->cut;
  *status = k->cut_status;
  *bytes = k->cut_bytes;
  pthread_mutex_unlock(&c->mu);
  return was;
}

/* Whether the peer sent k any byte (TCP_INFO's count): a connection
 * opened and closed without a word is no refusal. */
static bool got_bytes(const attnd_conn *k) {
  struct tcp_info ti;
  socklen_t len = sizeof ti;
  memset(&ti, 0, sizeof ti);
  return getsockopt(k->fd, IPPROTO_TCP, TCP_INFO, &ti, &len) == 0 &&
         len > offsetof(struct tcp_info, tcpi_bytes_received) && ti.tcpi_bytes_received > 0;
}

bool attnd_conns_unparsed(attnd_conns *c, attnd_conn *k, double now) {
  pthread_mutex_lock(&c->mu);
  bool un = k->state == ATTND_CONN_AWAITING && !k->closing && now - k->since < c->idle_timeout;
  pthread_mutex_unlock(&c->mu);
  return un && got_bytes(k);
}

void attnd_conns_close(attnd_conns *c, attnd_conn *k) {
  pthread_mutex_lock(&c->mu);
  unlink_conn(c, k);
  c->open--;
  if (k->closing)
    c->closing--;
  pthread_mutex_unlock(&c->mu);
  free(k);
}

int attnd_peek(int fd) {
  char c;
  ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n > 0)
    return 1;
  if (n == 0)
    return 0;
  return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 1 : -1;
}

/* Whether k's body fell below the minimum rate over the window that just
 * ended; starts the next window. */
static bool too_slow(const attnd_conns *c, attnd_conn *k, double now) {
  double t = now - k->up_mark;
  if (c->min_rate <= 0 || t < ATTND_RATE_WINDOW)
    return false;
  k->up_window_rate = (double)(k->up_bytes - k->up_mark_bytes) / t;
  bool slow = k->up_window_rate < c->min_rate;
  k->up_mark = now;
  k->up_mark_bytes = k->up_bytes;
  return slow;
}

/* Why an upload must be cut now; ATTND_CLOSE_REASONS when it may go on. */
/* A client that closed or reset cannot complete its body (the HTTP library
 * may miss a close that comes right behind the last bytes it read until the
 * idle timeout). */
static attnd_conn_reason upload_verdict(const attnd_conns *c, attnd_conn *k, double now) {
  if (attnd_peek(k->fd) <= 0)
    return ATTND_CLOSE_CLIENT_GONE;
  if (now >= k->up_deadline)
    return ATTND_CLOSE_BODY_TIMEOUT;
  return too_slow(c, k, now) ? ATTND_CLOSE_BODY_TOO_SLOW : ATTND_CLOSE_REASONS;
}

/*
 * An idle keep-alive connection may wait the idle timeout for its next
 * request and then has the header deadline to send it whole: the registry
 * cannot see when a request's first byte arrives, so the two add up.
 */
static attnd_conn_reason verdict(const attnd_conns *c, attnd_conn *k, double now) {
  if (k->state == ATTND_CONN_UPLOADING)
    return upload_verdict(c, k, now);
  if (k->state == ATTND_CONN_BUSY)
    return ATTND_CLOSE_REASONS;
  double limit = c->header_timeout + (k->state == ATTND_CONN_IDLE ? c->idle_timeout : 0);
  if (now - k->since < limit)
    return ATTND_CLOSE_REASONS;
  return k->state == ATTND_CONN_IDLE ? ATTND_CLOSE_IDLE_TIMEOUT : ATTND_CLOSE_HEADER_TIMEOUT;
}

/* Places held longer than this were never taken: libmicrohttpd registers
 * an admitted connection at once, on the thread that admitted it. */
#define PENDING_LAPSE 1.0

int attnd_conns_sweep(attnd_conns *c, double now) {
  int n = 0;
  pthread_mutex_lock(&c->mu);
  if (c->pending > 0 && now - c->pending_at > PENDING_LAPSE)
    c->pending = 0;
  for (attnd_conn *k = c->head; k; k = k->next) {
    attnd_conn_reason why = k->closing ? ATTND_CLOSE_REASONS : verdict(c, k, now);
    if (why == ATTND_CLOSE_REASONS)
      continue;
    if (k->state == ATTND_CONN_UPLOADING)
      cut(c, k, why, NULL);
    else
      shut(c, k, why);
    n++;
  }
  pthread_mutex_unlock(&c->mu);
  return n;
}

void attnd_conns_counts(attnd_conns *c, uint64_t out[ATTND_CLOSE_REASONS]) {
  pthread_mutex_lock(&c->mu);
  memcpy(out, c->closed, sizeof c->closed);
  pthread_mutex_unlock(&c->mu);
}
