/*
 * load_conn.h — one keep-alive HTTP/1.1 client connection of `attn load`
 * on a libuv loop: it connects, writes the same prebuilt request (a header
 * block and one shared body) each time it is started, and parses the
 * replies itself (http_reply.h: status line, headers, a Content-Length,
 * chunked or read-until-close body; `Connection: close` closes it, and the
 * next start reconnects).
 *
 * What to send, and when, is its owner's (load_sched.h): the connection
 * reports each event through the owner's tool_load_conn_ops, in the order
 * the events happen, and keeps no counts but its bytes.
 */
#ifndef TOOL_LOAD_CONN_H
#define TOOL_LOAD_CONN_H

#include "http_reply.h"

#include <netinet/in.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#define TOOL_LOAD_RETRY_MS 100 /* wait before reconnecting after a failed connect */

typedef struct tool_load_conn tool_load_conn;

/* What a connection tells its owner. */
typedef struct tool_load_conn_ops {
  /* c connected and reads; busy: its request goes out right after this
   * (else it is idle, and may be started). */
  void (*connected)(tool_load_conn *c, bool busy);
  /* The reply to c's request ended with HTTP status (c is idle again);
   * false when the run has stopped, and c then does nothing more. */
  bool (*answered)(tool_load_conn *c, int status);
  /* c can take its next request: its reply is in and its write done, or
   * it has closed. */
  void (*ready)(tool_load_conn *c);
  /* c is closing after a transport error of kind (TOOL_TERR_*; err: the
   * libuv error of a failed connect, else 0); busy: a request was in
   * flight on it, which has ended. */
  void (*failed)(tool_load_conn *c, int kind, int err, bool busy);
  /* c's connect failed on the loop (err): true when the owner stops the
   * run for it, else c goes on to report it as failed. */
  bool (*unreachable)(tool_load_conn *c, int err);
} tool_load_conn_ops;

/* What every connection of a run shares: the loop, the server, the request
 * bytes and the owner. */
typedef struct tool_load_wire {
  uv_loop_t *loop;
  struct sockaddr_in addr;
  const char *head;
  size_t head_len;
  const char *body;
  size_t body_len;
  const tool_load_conn_ops *ops;
  void *owner;
} tool_load_wire;

enum { TOOL_LOAD_FREE, TOOL_LOAD_CONNECTING, TOOL_LOAD_OPEN, TOOL_LOAD_CLOSING };

/* The owner reads these fields; only load_conn.c writes them. */
struct tool_load_conn {
  uv_tcp_t tcp;
  uv_connect_t creq;
  uv_write_t wreq;
  const tool_load_wire *w;
  int state;          /* TOOL_LOAD_* */
  bool active;        /* a request is in flight on it */
  bool write_pending; /* its request is still being written */
  bool want_next;     /* answered while its write was pending */
  bool connect_failed;
  uint64_t start_ns;  /* latency origin: the intended start */
  uint64_t sent_ns;   /* when it was handed to the connection */
  uint64_t retry_ns;  /* no reconnect before this */
  attn_http_reply rp; /* the reply parser */
  char *rbuf;
  uint64_t bytes_sent, bytes_recv;
};

uint64_t tool_load_now_ns(void);

/* A free connection of w; NULL when out of memory. */
tool_load_conn *tool_load_conn_new(const tool_load_wire *w);
/* Frees c (its handle must be closed). */
void tool_load_conn_free(tool_load_conn *c);

/* Starts the request on c, idle and open or free (it connects first),
 * whose latency counts from start. */
void tool_load_conn_start(tool_load_conn *c, uint64_t start);
/* Ends c's request with a transport error of kind: c closes and reports it
 * (ops->failed). */
void tool_load_conn_fail(tool_load_conn *c, int kind);
/* Ends c's request without a word: whether one was in flight. */
bool tool_load_conn_drop(tool_load_conn *c);
/* Closes c (nothing when free or closing); it reports ready once closed. */
void tool_load_conn_close(tool_load_conn *c);

#endif
