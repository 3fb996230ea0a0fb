/*
 * server.h — what the parts of attnd share (internal to server/).
 *
 * Threads: libmicrohttpd's polling thread runs http.c (parsing, the cheap
 * GET endpoints, body accumulation) and never computes; the libuv loop on
 * the main thread runs loop.c (admission, the bounded queue, dispatch,
 * completion, signals) and deadline.c, which reach the connection only
 * through the transport (request.c holds what both threads do to a
 * request); libuv's threadpool decodes and submits to the
 * engine, and later encodes; the engine computes on its own threads (CPU
 * workers, or CUDA streams) and reports back through uv_async_send. A POST
 * /attention connection is suspended from its last body byte until its
 * reply is ready; so is a POST /attention/backward, which takes the same
 * path with the backward pass's codecs.
 */
#ifndef ATTND_SERVER_H
#define ATTND_SERVER_H

#include "config.h"
#include "conns.h"
#include "console.h"
#include "engine.h"
#include "errors.h"
#include "inflate.h"
#include "log.h"
#include "metrics.h"
#include "proto.h"
#include "reqid.h"

#include <pthread.h>
#include <stdatomic.h>
#include <uv.h>

/* The HTTP library's types, opaque here: only http.c (and mhd_shim.c) know
 * libmicrohttpd; the loop and the deadlines reach a connection through the
 * transport below. */
struct MHD_Connection;
struct MHD_Daemon;
struct attnd_req;
struct attnd_server;

/* What the loop needs of the HTTP front. http.c fills it with
 * libmicrohttpd's calls; tests/unit/test_loop.c with fakes. */
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
} attnd_transport;

#define ATTND_JSON_TYPE "application/json"
/* Backends an engine lists at most (attn_engine_backends). */
#define ATTND_MAX_BACKENDS 8

typedef enum attnd_route {
  ATTND_R_ATTENTION,
  ATTND_R_BACKWARD, /* POST /attention/backward: like ATTND_R_ATTENTION, the other pass */
  ATTND_R_PLAN,
  ATTND_R_HEALTHZ,
  ATTND_R_READYZ,
  ATTND_R_METRICS,
  ATTND_R_INFO,
  ATTND_R_CONSOLE, /* GET / and the console's files (console.h) */
  /* the Open Inference Protocol (v2.c) */
  ATTND_R_V2_SERVER,      /* GET /v2 */
  ATTND_R_V2_LIVE,        /* GET /v2/health/live */
  ATTND_R_V2_READY,       /* GET /v2/health/ready */
  ATTND_R_V2_MODEL,       /* GET /v2/models/{model}[/versions/1] */
  ATTND_R_V2_MODEL_READY, /* GET .../ready */
  ATTND_R_V2_CONFIG,      /* GET .../config */
  ATTND_R_V2_INFER,       /* POST .../infer: computed like POST /attention */
  ATTND_R_NONE
} attnd_route;

/* A client address with jobs admitted: its share of the running slots
 * (loop.c). Loop only. */
typedef struct attnd_client {
  char addr[48];
  int jobs;    /* admitted and not ended; the record is freed at 0 */
  int running; /* of those, dispatched and not ended */
  struct attnd_client *next;
} attnd_client;

/* One HTTP request from its first callback to its completion notice. */
typedef struct attnd_req {
  struct attnd_server *srv;
  struct MHD_Connection *conn;
  attnd_conn *link;                /* the connection's registry record */
  char client[48];                 /* its address (link's), the key of its fair share */
  bool started;                    /* the first request callback has run */
  const char *bad_target;          /* why the request target is refused, or NULL */
  int bad_target_code;             /* its error: 414 too long, 400 malformed */
  const char *target, *target_end; /* where libmicrohttpd holds the target, its string end */
  const char *host;                /* its Host header, or NULL (valid until it ends) */
  bool close;                      /* its reply ends the connection (a refused head) */
  attnd_route route;
  const attnd_console_asset *asset; /* ATTND_R_CONSOLE: the file served */
  /* Its id: the client's X-Request-Id when valid (reqid.h), else one made
   * when the request began. Echoed in every reply and log line; routes that
   * carry an id of their own (the /v2 "id") may read it. */
  char id[ATTND_REQID_MAX + 1];
  /* The model a route served ("" for /attention): a label of the metrics
   * and the log line. Set by the route, before the request ends. */
  char model[64];
  char method[16];
  char path[128];
  char *query;  /* re-encoded query string, for the proto parsers */
  bool json_in; /* Content-Type application/json (else safetensors) */
  /* /v2: errors in the protocol's shape {"error": message} */
  bool v2;
  int v2_model;         /* attn_proto_v2_model() of the path, or -1 */
  size_t v2_json_len;   /* Inference-Header-Content-Length; SIZE_MAX: the whole body */
  attn_v2_info v2_info; /* what the request asks of its reply */
  bool binary_out;      /* reply as safetensors */
  char *body;           /* the whole body, one buffer, as received */
  size_t len, cap;
  uint64_t declared;       /* its Content-Length; UINT64_MAX for a chunked body */
  bool has_body;           /* it declared one: an upload in the registry until it is whole */
  attnd_encoding encoding; /* its Content-Encoding */
  /* A gzip or deflate body decoded (by the threadpool, before the codec);
   * NULL for identity. len stays the bytes received, for the logs. */
  char *plain;
  size_t plain_len;
  size_t discarded; /* body bytes dropped after an early reply */
  size_t reserved;  /* of the server's body budget */
  double t_received, t_admitted, t_started, t_done;
  bool submitted; /* handed to the loop, connection suspended */
  /* the reply, set once; the HTTP thread queues it */
  int status;
  char *resp; /* malloc'd; ownership passes to libmicrohttpd */
  size_t resp_len;
  const char *ctype;
  size_t resp_json_len; /* /v2: JSON bytes before binary outputs (0: none) */
  bool retry_after;
  bool queued; /* the reply was queued to libmicrohttpd */
  uint64_t bytes_out;
  /* Lifetime: the connection holds a reference from the first callback to
   * on_completed(), the loop another from the handoff to the job's end; the
   * last one frees r (attnd_req_unref). A reply sent early (deadline, reset,
   * shutdown) ends the connection while the engine may still be finishing
   * its current work item on r's tensors. */
  atomic_int refs;
  bool uploading;                      /* on s->up_head's list; HTTP thread only */
  int fd;                              /* its socket, for the drain's peek */
  struct attnd_req *up_prev, *up_next; /* s->up_head's list, under s->mu */
  bool gone;                           /* set by the loop: the client reset, close unanswered */
  /* the job, while the loop owns it */
  attn_proto_req pr;
  attn_result res;
  uv_work_t work;  /* decode and submit */
  uv_work_t work2; /* encode */
  bool in_engine;  /* submitted: the engine will report back */
  int stages_left; /* loop callbacks still due before it completes */
  int cancel;      /* the engine's cancel flag (attn_cancel_set) */
  /* What the threadpool and engine produce; the loop turns it into the
   * reply unless one was already sent (the reply fields then belong to the
   * HTTP thread). */
  attn_status job_st; /* a decode, submit, engine or encode failure */
  char *out;          /* the encoded reply body */
  size_t out_len;
  const char *out_ctype;
  size_t out_json_len; /* /v2: as resp_json_len */
  double t_engine;     /* when decoding failed or the engine completed */
  /* loop only */
  bool dispatched; /* left the queue for decode and the engine */
  bool answered;   /* the reply is set and the connection resumed */
  bool canceled;
  attnd_cancel_reason cancel_why;
  attnd_client *who; /* its client's record, from admission to its end */
  struct attnd_req *next;
  struct attnd_req *act_prev, *act_next; /* the loop's admitted jobs */
} attnd_req;

typedef struct attnd_server {
  const attnd_config *cfg;
  attn_engine *engine;
  attnd_metrics *metrics;
  char engine_detail[160];  /* the backend in use, for logs and /v1/info */
  const char *backend;      /* the name requests ask the engine for */
  const char *backend_note; /* why, when auto chose; "" otherwise */
  const attnd_transport *transport;
  struct MHD_Daemon *mhd;
  attnd_conns conns;      /* open connections, their deadlines and eviction */
  int max_connections;    /* --max-connections, lowered to fit the open-file limit */
  uv_timer_t sweep_timer; /* closes connections past their deadlines */
  int listen_fd;
  int port; /* the bound port (--listen ...:0 picks one) */
  uv_loop_t loop;
  uv_async_t incoming; /* the HTTP thread's handoff */
  pthread_mutex_t mu;
  attnd_req *in_head, *in_tail;     /* under mu */
  uv_async_t completed;             /* the engine's handoff */
  attnd_req *done_head, *done_tail; /* under mu */
  int max_running;                  /* jobs between dispatch and reply at once */
  int client_cap;                   /* of those, one client's (INT_MAX: no own limit) */
  attnd_client *clients;            /* clients with jobs admitted; loop only */
  attnd_req *pend_head, *pend_tail; /* loop only */
  attnd_req *act_head;              /* every admitted job, queued or running; loop only */
  uv_timer_t tick;                  /* deadlines and client resets (deadline.c) */
  int admitted;                     /* pending + running; loop only */
  int running;                      /* loop only */
  atomic_bool draining;
  atomic_bool stopping; /* the HTTP daemon is closing every connection */
  atomic_int replying;  /* requests handed to the loop, not yet completed */
  /* POST /attention requests whose headers arrived and whose body is still
   * being read, under mu: the drain waits for them too. */
  attnd_req *up_head;
  /* Bytes of request bodies held (allocated capacity), bounded by
   * max_queue x max_body whatever mix of uploads and queued jobs. */
  _Atomic uint64_t body_bytes;
  uv_signal_t sigterm, sigint;
  uv_signal_t sighup, sigusr1; /* ignored, with a log line (nothing reloads) */
  uv_timer_t drain_timer;
  double drain_deadline;
  bool drain_expired;  /* past --drain-timeout: stop waiting for jobs */
  double jobs_done_at; /* when the drain first found no job left */
  pthread_mutex_t log_mu;
  attnd_reqid_gen ids; /* made request ids */
  /* HTTPS: the PEM texts libmicrohttpd serves with (tls.c), or NULL. */
  char *tls_cert_pem, *tls_key_pem;
} attnd_server;

/* http.c: the HTTP front on libmicrohttpd, and its transport. */
extern const attnd_transport attnd_http_transport;
int attnd_http_start(attnd_server *s); /* 0, or -1 after one line */
void attnd_http_stop(attnd_server *s);

/* The server's readiness, for GET /readyz and /v2/health/ready: 0, or
 * ATTND_ESHUTTING_DOWN (draining) or ATTND_EBACKEND_UNAVAILABLE with why. */
int attnd_server_ready(attnd_server *s, char *why, size_t cap);

/* v2.c: the Open Inference Protocol's routes (KServe v2, Triton). */
/* r's route for a path under /v2 (r->v2 set); false for any other path. A
 * model or version that does not exist leaves ATTND_R_NONE, and
 * attnd_v2_not_found() words the 404. */
bool attnd_v2_route(attnd_req *r, const char *path);
void attnd_v2_not_found(attnd_req *r);
/* Answers r's GET route (metadata, health, readiness). */
void attnd_v2_answer_get(attnd_req *r);

/* request.c */
/* A request as its first callback finds it, holding the connection's
 * reference; NULL when out of memory. */
attnd_req *attnd_req_new(attnd_server *s);
/* Drops a reference to r; the last one frees it (any thread). */
void attnd_req_unref(attnd_req *r);
/* Sets r's reply; buf (malloc'd) becomes r's. */
void attnd_req_reply(attnd_req *r, int status, char *buf, size_t len, const char *ctype);
/* The only way to set an error reply: r's reply becomes the JSON error of
 * code (a server code of errors.h, or an engine or codec code) with this
 * message, and the error is counted by code. ATTND_ECLIENT_CLOSED sets no
 * reply: the connection is closed unanswered. */
void attnd_req_fail(attnd_req *r, int code, const char *message);
/* Takes n bytes of the body budget for r (false: over budget), or gives
 * back all r holds. */
bool attnd_body_reserve(attnd_req *r, size_t n);
void attnd_body_release(attnd_req *r);
/* Sets r's reply to 503 queue_full: a reservation did not fit. */
void attnd_body_over_budget(attnd_req *r);
/* Whether r is a POST of a pass (/attention or /attention/backward), which
 * the loop computes; every other route is answered on the HTTP thread. */
bool attnd_req_computes(const attnd_req *r);
/* The pass r asks for: backward for /attention/backward. */
attn_pass attnd_req_pass(const attnd_req *r);
/* HTTP thread: r's headers arrived and its body is being read (r->fd set),
 * which a drain waits for; or that ended (a no-op when it never began). */
void attnd_upload_begin(attnd_req *r);
void attnd_upload_end(attnd_req *r);
/* The metrics' label of r's path: a /v2 path is labeled by its route, never
 * by the client's bytes (model names would make labels without bound). */
const char *attnd_req_route_label(const attnd_req *r);
/* r has ended: its metrics and its log line. */
void attnd_req_account(attnd_server *s, const attnd_req *r);

/* loop.c */
/* 0, or -1 after one line to stderr. */
int attnd_loop_init(attnd_server *s);
/* From the HTTP thread: hand a complete POST /attention (or
 * /attention/backward) to the loop. */
void attnd_loop_submit(attnd_server *s, attnd_req *r);
/* Runs until a drain completes. */
void attnd_loop_run(attnd_server *s);
void attnd_loop_close(attnd_server *s);
/* Answers an admitted job now (504 timeout, 503 shutting_down, or for a
 * client that reset, no reply) and cancels its engine work; the job's end
 * is still awaited. Loop only. */
void attnd_loop_cancel(attnd_server *s, attnd_req *r, attnd_cancel_reason why);

/* deadline.c: one timer for every admitted job, due at the earliest
 * --timeout deadline and at least every ATTND_POLL_MS to look for clients
 * that reset their connection. */
#define ATTND_POLL_MS 100
/* 0, or a libuv error code. */
int attnd_deadline_init(attnd_server *s);
/* (Re)arms the timer after jobs were admitted or ended. Loop only. */
void attnd_deadline_arm(attnd_server *s);

#endif
