/*
 * conns.c — the connection registry: states, deadlines, and eviction of the
 * oldest idle connections when the server or one client is full.
 *
 * The list is kept in order of state changes (a change moves a record to the
 * tail), so the oldest evictable connection is the first one from the head
 * that is neither busy nor already closing. Connections number in the
 * thousands at most: linear walks under one mutex are cheaper than the
 * accept() they accompany.
 */
#include "conns.h"

#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

void attnd_conns_init(attnd_conns *c, int max, int per_client, double header_timeout,
                      double idle_timeout) {
  memset(c, 0, sizeof *c);
  pthread_mutex_init(&c->mu, NULL);
  c->max = max;
  c->per_client = per_client;
  c->header_timeout = header_timeout;
  c->idle_timeout = idle_timeout;
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

static bool evictable(const attnd_conn *k, const char *client) {
  return k->state != ATTND_CONN_BUSY && !k->closing && (!client || !strcmp(k->client, client));
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

bool attnd_conns_admit(attnd_conns *c, const char *client, double now) {
  (void)now;
  pthread_mutex_lock(&c->mu);
  bool ok = c->open - c->closing < c->max || evict_oldest(c, NULL);
  if (ok && c->per_client > 0 && live_of(c, client) >= c->per_client)
    ok = evict_oldest(c, client);
  if (!ok)
    c->closed[ATTND_CLOSE_REFUSED]++;
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

void attnd_conns_close(attnd_conns *c, attnd_conn *k) {
  pthread_mutex_lock(&c->mu);
  unlink_conn(c, k);
  c->open--;
  if (k->closing)
    c->closing--;
  pthread_mutex_unlock(&c->mu);
  free(k);
}

/*
 * An idle keep-alive connection may wait the idle timeout for its next
 * request and then has the header deadline to send it whole: the registry
 * cannot see when a request's first byte arrives, so the two add up.
 */
int attnd_conns_sweep(attnd_conns *c, double now) {
  int n = 0;
  pthread_mutex_lock(&c->mu);
  for (attnd_conn *k = c->head; k; k = k->next) {
    if (k->closing || k->state == ATTND_CONN_BUSY)
      continue;
    double limit = c->header_timeout + (k->state == ATTND_CONN_IDLE ? c->idle_timeout : 0);
    if (now - k->since >= limit) {
      shut(c, k,
           k->state == ATTND_CONN_IDLE ? ATTND_CLOSE_IDLE_TIMEOUT : ATTND_CLOSE_HEADER_TIMEOUT);
      n++;
    }
  }
  pthread_mutex_unlock(&c->mu);
  return n;
}

void attnd_conns_counts(attnd_conns *c, uint64_t out[ATTND_CLOSE_REASONS]) {
  pthread_mutex_lock(&c->mu);
  memcpy(out, c->closed, sizeof c->closed);
  pthread_mutex_unlock(&c->mu);
}
