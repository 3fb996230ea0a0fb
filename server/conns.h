/*
 * conns.h — attnd's registry of open client connections, and the rules that
 * keep idle ones from locking everyone else out.
 *
 * Every connection is in one of three states: waiting for a request's
 * headers, busy with a request, or idle between keep-alive requests. A
 * connection waiting for headers must complete them within the header
 * deadline from the moment it began waiting (an absolute deadline: a client
 * dribbling a byte a second does not extend it); an idle one is closed after
 * the idle timeout. When the server is full, or one client address holds its
 * share, a new connection closes the oldest connection that is not busy —
 * overall or of that address — instead of waiting in the backlog; only when
 * every connection is busy is the new one refused.
 *
 * The registry knows sockets, not HTTP: it closes a connection by shutting
 * its socket down, which the HTTP library then sees as the peer leaving.
 * All functions are thread-safe; a record stays valid until
 * attnd_conns_close(), and its socket is shut down only while registered, so
 * a socket number reused after the HTTP library closes it is never touched.
 */
#ifndef ATTND_CONNS_H
#define ATTND_CONNS_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

typedef enum attnd_conn_state {
  ATTND_CONN_AWAITING, /* waiting for a request's headers */
  ATTND_CONN_BUSY,     /* headers in: reading, computing or replying */
  ATTND_CONN_IDLE      /* between keep-alive requests */
} attnd_conn_state;

typedef struct attnd_conn {
  int fd;
  char client[48]; /* the peer's address: the per-client key */
  attnd_conn_state state;
  double since; /* when the state began (monotonic seconds) */
  bool closing; /* shut down by the registry, not yet closed */
  void *owner;  /* the HTTP layer's server */
  void *req;    /* the HTTP layer's request being read, if any */
  struct attnd_conn *prev, *next;
} attnd_conn;

/* Why the registry closed or refused connections (counters). */
typedef enum attnd_conn_reason {
  ATTND_CLOSE_EVICTED,        /* oldest idle, to make room */
  ATTND_CLOSE_HEADER_TIMEOUT, /* headers not complete within the deadline */
  ATTND_CLOSE_IDLE_TIMEOUT,   /* idle keep-alive past the idle timeout */
  ATTND_CLOSE_REFUSED,        /* full of busy connections: not accepted */
  ATTND_CLOSE_REASONS
} attnd_conn_reason;

typedef struct attnd_conns {
  pthread_mutex_t mu;
  attnd_conn *head, *tail; /* in order of `since`, oldest first */
  int open;                /* registered, closing ones included */
  int closing;
  int max;        /* open and not closing, at most */
  int per_client; /* of one address, at most */
  double header_timeout, idle_timeout;
  uint64_t closed[ATTND_CLOSE_REASONS];
} attnd_conns;

void attnd_conns_init(attnd_conns *c, int max, int per_client, double header_timeout,
                      double idle_timeout);
void attnd_conns_destroy(attnd_conns *c);

/* Before accepting a connection from client: makes room by closing the
 * oldest connections that are not busy; false when there is none to close
 * (the caller refuses the connection). */
bool attnd_conns_admit(attnd_conns *c, const char *client, double now);

/* Registers an accepted connection (waiting for headers); NULL when out of
 * memory. */
attnd_conn *attnd_conns_open(attnd_conns *c, int fd, const char *client, double now);
void attnd_conns_set(attnd_conns *c, attnd_conn *k, attnd_conn_state st, double now);
/* Unregisters and frees k; call before its socket is closed. */
void attnd_conns_close(attnd_conns *c, attnd_conn *k);

/* Closes the connections past their deadline; returns how many. */
int attnd_conns_sweep(attnd_conns *c, double now);

/* Counters for /metrics, copied under the lock. */
void attnd_conns_counts(attnd_conns *c, uint64_t out[ATTND_CLOSE_REASONS]);

#endif
