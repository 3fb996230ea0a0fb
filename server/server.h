/*
 * server.h — the state one attnd process serves from, and its readiness
 * (server.c).
 *
 * Threads: libmicrohttpd's polling threads (--http-threads; a connection
 * stays on the one that accepted it) run the HTTP front (http.c and the
 * files beside it: parsing, the cheap GET endpoints, body intake) and
 * never compute; what they share below locks itself or is atomic. The
 * libuv loop on the main thread runs loop.c
 * (admission, the bounded queue, dispatch, completion, signals), which
 * reaches a connection only through the transport below; libuv's
 * threadpool decodes and submits to the engine, and later encodes; the
 * engine computes on its own threads (CPU workers, or CUDA streams) and
 * reports back through uv_async_send. A computing request's connection is
 * suspended from its last body byte until its reply is ready. Each field
 * below says who may touch it.
 */
#ifndef ATTND_SERVER_H
#define ATTND_SERVER_H

#include "bodybuf.h"
#include "config.h"
#include "conns.h"
#include "engine.h"
#include "kv/kv.h"
#include "metrics.h"
#include "reqid.h"

#include <pthread.h>
#include <stdatomic.h>
#include <uv.h>

/* The HTTP library's types, opaque here: only the HTTP front's files know
 * libmicrohttpd. */
struct MHD_Daemon;
struct attnd_req;
struct attnd_client;
struct attnd_server;

/* Backends an engine lists at most (attn_engine_backends). */
#define ATTND_MAX_BACKENDS 8

/* What the rest of the server needs of the HTTP front. listen.c fills it
 * with libmicrohttpd's calls; tests/unit/test_loop.c with fakes. */
typedef struct attnd_transport {
  /* r's reply is set, or the close decided (r->gone): give its connection
   * back to the HTTP thread. Loop thread; once per request. */
  void (*resume)(struct attnd_req *r);
  /* Whether r's client is gone: it reset its connection, or closed (or
   * half-closed) it before the reply, which abandons the job. Loop
   * thread. */
  bool (*client_gone)(struct attnd_req *r);
  /* A drain began: stop accepting connections. Loop thread. */
  void (*quiesce)(struct attnd_server *s);
  /* The value of r's request header name, or NULL. HTTP thread, while
   * the request is being answered. */
  const char *(*header)(struct attnd_req *r, const char *name);
} attnd_transport;

typedef struct attnd_server {
  /* Set before the threads start, read-only after. */
  const attnd_config *cfg;
  attn_engine *engine;
  attn_kv_store *kv;        /* the sessions (locks itself), or NULL: --session-memory 0 */
  attnd_metrics *metrics;   /* locks itself */
  char engine_detail[160];  /* the backend in use, for logs and /v1/info */
  const char *backend;      /* the name requests ask the engine for */
  const char *backend_note; /* why, when auto chose; "" otherwise */
  const attnd_transport *transport;
  int max_connections; /* --max-connections, lowered to fit the open-file limit */
  int listen_fd;
  int port;        /* the bound port (--listen ...:0 picks one) */
  int max_running; /* jobs between dispatch and reply at once */
  int client_cap;  /* of those, one client's (INT_MAX: no own limit) */
  /* HTTPS: the PEM texts libmicrohttpd serves with (tls.c), or NULL. */
  char *tls_cert_pem, *tls_key_pem;

  /* The HTTP front's. */
  struct MHD_Daemon *mhd;
  bool quiesced;       /* a drain took listen_fd back from libmicrohttpd (loop thread) */
  attnd_conns conns;   /* open connections, their deadlines and eviction; locks itself */
  attnd_reqid_gen ids; /* made request ids (an atomic counter: any HTTP thread) */

  /* The loop thread's. */
  uv_loop_t loop;
  uv_async_t incoming;                     /* the HTTP thread's handoff */
  uv_async_t completed;                    /* the engine's handoff */
  uv_timer_t sweep_timer;                  /* closes connections past their deadlines */
  uv_timer_t tick;                         /* deadlines and client resets (deadline.h) */
  struct attnd_client *clients;            /* clients with jobs admitted */
  struct attnd_req *pend_head, *pend_tail; /* queued, not dispatched */
  struct attnd_req *act_head;              /* every admitted job, queued or running */
  int running;
  uv_signal_t sigterm, sigint;
  uv_signal_t sighup, sigusr1; /* ignored, with a log line (nothing reloads) */
  uv_timer_t drain_timer;
  double drain_deadline;
  bool drain_expired;  /* past --drain-timeout: stop waiting for jobs */
  double jobs_done_at; /* when the drain first found no job left */

  /* Shared under mu. */
  pthread_mutex_t mu;
  struct attnd_req *in_head, *in_tail;     /* handed over by the HTTP thread */
  struct attnd_req *done_head, *done_tail; /* completed by the engine */
  /* Computing requests whose headers arrived and whose body is still
   * being read: the drain waits for them too. */
  struct attnd_req *up_head;

  /* Shared, atomic. */
  atomic_bool unready; /* signalled: /readyz 503, replies close; draining is next */
  atomic_bool draining;
  atomic_bool stopping; /* the HTTP daemon is closing every connection */
  atomic_int replying;  /* requests handed to the loop, not yet completed */
  /* Jobs holding a place of --max-queue: the loop's, queued or running,
   * and tiny ones computing on an HTTP thread (tiny.h). */
  atomic_int admitted;
  /* Bytes of request bodies held (allocated capacity; for a mapped body,
   * the bytes received), bounded by
   * max_queue x max_body whatever mix of uploads and queued jobs. */
  _Atomic uint64_t body_bytes;
  attnd_bodybufs bufs;    /* large bodies' buffers; locks itself */
  pthread_mutex_t log_mu; /* one log line at a time */
} attnd_server;

/* The server's readiness, for GET /readyz and /v2/health/ready: 0, or
 * ATTND_ESHUTTING_DOWN (draining) or ATTND_EBACKEND_UNAVAILABLE with why.
 * Any thread. */
int attnd_server_ready(attnd_server *s, char *why, size_t cap);

/* What the start-up self-check disabled in the backend requests run on,
 * as one line in out; false when nothing. */
bool attnd_server_disabled_kernels(attnd_server *s, char *out, size_t cap);

#endif
