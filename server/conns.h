/*
 * conns.h — attnd's registry of open client connections, and the rules that
 * keep idle ones from locking everyone else out.
 *
 * Every connection is in one of four states: waiting for a request's
 * headers, receiving a request's body, busy with a request (computing or
 * replying), or idle between keep-alive requests. A
 * connection waiting for headers must complete them within the header
 * deadline from the moment it began waiting (an absolute deadline: a client
 * dribbling a byte a second does not extend it); an idle one is closed after
 * the idle timeout. A body must arrive whole by its deadline (--timeout
 * after its headers) and at no less than the minimum rate over each
 * ATTND_RATE_WINDOW; a body whose client closed or reset mid-way can never
 * complete. Such an upload is cut: the HTTP layer's hook answers it (or
 * not, for a client that is gone) and the registry shuts the socket, so
 * the body's memory is given back at once whatever the HTTP library would
 * notice. When the server is full, or one client address holds its share,
 * a new connection closes the oldest connection that is not busy — overall
 * or of that address — instead of waiting in the backlog; when every
 * connection is busy, a client holding fewer than the client with the most
 * still gets in by cutting that client's slowest upload; only then is the
 * new one refused.
 *
 * The registry knows sockets, not HTTP: it closes a connection by shutting
 * its socket down, which the HTTP library then sees as the peer leaving.
 * All functions are thread-safe; a record stays valid until
 * attnd_conns_close(), and its socket is shut down only while registered, so
 * a socket number reused after the HTTP library closes it is never touched.
 */
#ifndef ATTND_CONNS_H
#define ATTND_CONNS_H

#include "proxy.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

typedef enum attnd_conn_state {
  ATTND_CONN_AWAITING,  /* waiting for a request's headers */
  ATTND_CONN_UPLOADING, /* headers in, the body arriving */
  ATTND_CONN_BUSY,      /* computing or replying */
  ATTND_CONN_IDLE       /* between keep-alive requests */
} attnd_conn_state;

/* Seconds over which an upload's rate is measured: a body must grow by
 * --min-upload-rate x this within each such window. */
#define ATTND_RATE_WINDOW 5.0

/* What an upload's reply may name: the request id (reqid.h's maximum). */
#define ATTND_CONN_ID_MAX 128

typedef struct attnd_conn {
  int fd;
  char client[48]; /* the peer's address: the per-client key */
  attnd_conn_state state;
  double since; /* when the state began (monotonic seconds) */
  bool closing; /* shut down by the registry, not yet closed */
  void *owner;  /* the HTTP layer's server */
  void *req;    /* the HTTP layer's request being read, if any */
  /* ATTND_CONN_UPLOADING, under the registry's lock */
  char id[ATTND_CONN_ID_MAX + 1]; /* the request's id, for a cut's reply */
  double up_started, up_deadline; /* the headers' arrival; the body's due time */
  double up_mark;                 /* start of the current rate window */
  uint64_t up_bytes, up_mark_bytes;
  double up_window_rate; /* bytes per second over the last window ended */
  /* Once the registry cut an upload: the status its hook answered with (0
   * for none, a client that is gone) and the body bytes it wrote, for the
   * request's log line. */
  bool cut;
  int cut_status;
  size_t cut_bytes;
  struct attnd_conn *prev, *next;
} attnd_conn;

/* Why the registry closed or refused connections (counters). */
typedef enum attnd_conn_reason {
  ATTND_CLOSE_EVICTED,        /* oldest idle, to make room */
  ATTND_CLOSE_HEADER_TIMEOUT, /* headers not complete within the deadline */
  ATTND_CLOSE_IDLE_TIMEOUT,   /* idle keep-alive past the idle timeout */
  ATTND_CLOSE_REFUSED,        /* full of busy connections: not accepted */
  ATTND_CLOSE_BODY_TIMEOUT,   /* a body not whole by its deadline */
  ATTND_CLOSE_BODY_TOO_SLOW,  /* a body below the minimum rate */
  ATTND_CLOSE_CLIENT_GONE,    /* closed or reset in mid-body */
  ATTND_CLOSE_UPLOAD_EVICTED, /* cut to let a client under its share in */
  ATTND_CLOSE_BODY_REFUSED,   /* past --max-body or the memory budget (the HTTP layer's call) */
  ATTND_CLOSE_REASONS
} attnd_conn_reason;

/* The reason's name, a label of attnd_connections_closed_total. */
const char *attnd_conns_reason_name(attnd_conn_reason why);

/* The HTTP layer's answer to an upload cut short: write the reply for why
 * on k->fd (nothing for ATTND_CLOSE_CLIENT_GONE) and set k->cut_status and
 * k->cut_bytes. arg is attnd_conns_cut()'s, NULL for the registry's own
 * cuts. Called under the registry's lock, on the thread that cuts, while
 * the socket is still open: only one reply is ever written. */
typedef void (*attnd_conn_cut_fn)(void *ctx, attnd_conn *k, attnd_conn_reason why, const void *arg);

typedef struct attnd_conns {
  pthread_mutex_t mu;
  attnd_conn *head, *tail; /* in order of `since`, oldest first */
  int open;                /* registered, closing ones included */
  int closing;
  /* Admitted and not yet registered: several polling threads accept at
   * once, and each admission must count the ones before it. Reservations
   * libmicrohttpd never registers (it refused the connection after all)
   * lapse at the sweep once the last one is a second old. */
  int pending;
  double pending_at;
  int max;        /* open and not closing, at most */
  int per_client; /* of one address, at most */
  /* Addresses per_client does not cap (NULL: none): the trusted proxies,
   * whose connections carry many clients' requests. */
  const attnd_proxies *uncapped;
  double header_timeout, idle_timeout;
  double min_rate; /* body bytes per second at least; 0: no minimum */
  attnd_conn_cut_fn cut;
  void *cut_ctx;
  uint64_t closed[ATTND_CLOSE_REASONS];
} attnd_conns;

void attnd_conns_init(attnd_conns *c, int max, int per_client, double header_timeout,
                      double idle_timeout);
void attnd_conns_destroy(attnd_conns *c);
/* The uploads' rules: the minimum rate (bytes per second, 0: none) and the
 * hook that answers a cut upload (NULL: none is answered). */
void attnd_conns_uploads(attnd_conns *c, double min_rate, attnd_conn_cut_fn cut, void *ctx);

/* Before accepting a connection from client: makes room by closing the
 * oldest connections that are not busy, and holds a place for it until
 * attnd_conns_open(); false when there is none to close (the caller
 * refuses the connection). */
bool attnd_conns_admit(attnd_conns *c, const char *client, double now);

/* Registers an accepted connection (waiting for headers); NULL when out of
 * memory. */
attnd_conn *attnd_conns_open(attnd_conns *c, int fd, const char *client, double now);
void attnd_conns_set(attnd_conns *c, attnd_conn *k, attnd_conn_state st, double now);
/* k's headers are in and its body is arriving, due whole by deadline; id
 * names the request in a cut's reply. Its end is attnd_conns_set() to
 * ATTND_CONN_BUSY. */
void attnd_conns_upload(attnd_conns *c, attnd_conn *k, const char *id, double deadline, double now);
/* n more body bytes arrived on k. */
void attnd_conns_upload_add(attnd_conns *c, attnd_conn *k, size_t n);
/* Cuts k's upload now for why (the HTTP layer's own call, e.g. a body past
 * --max-body): the hook answers with arg and the socket is shut down;
 * nothing when the registry cut it already. */
void attnd_conns_cut(attnd_conns *c, attnd_conn *k, attnd_conn_reason why, const void *arg);
/* Whether the registry cut k, with the status answered and bytes written. */
bool attnd_conns_was_cut(attnd_conns *c, attnd_conn *k, int *status, size_t *bytes);
/* Whether k is closing before its first request ever started, not by the
 * registry's doing, within the idle timeout and after its client sent
 * bytes: the HTTP library gave up on what it was sent. */
bool attnd_conns_unparsed(attnd_conns *c, attnd_conn *k, double now);
/* Unregisters and frees k; call before its socket is closed. */
void attnd_conns_close(attnd_conns *c, attnd_conn *k);

/* Closes the connections past their deadline, and cuts the uploads that
 * are late, too slow, or whose client is gone; returns how many. */
int attnd_conns_sweep(attnd_conns *c, double now);

/* A peek at a client's socket: 1 data waiting or nothing yet, 0 end of
 * file, -1 an error (a reset). */
int attnd_peek(int fd);

/* Counters for /metrics, copied under the lock. */
void attnd_conns_counts(attnd_conns *c, uint64_t out[ATTND_CLOSE_REASONS]);

#endif
