/*
 * server.h — what the parts of attnd share (internal to server/).
 *
 * Threads: libmicrohttpd's polling thread runs http.c (parsing, the cheap
 * GET endpoints, body accumulation) and never computes; the libuv loop on
 * the main thread runs loop.c (admission, the bounded queue, dispatch,
 * completion, signals); libuv's threadpool decodes and submits to the
 * engine, and later encodes; the engine computes on its own threads (CPU
 * workers, or CUDA streams) and reports back through uv_async_send. A POST
 * /attention connection is suspended from its last body byte until its
 * reply is ready.
 */
#ifndef ATTND_SERVER_H
#define ATTND_SERVER_H

#include "config.h"
#include "engine.h"
#include "metrics.h"
#include "proto.h"

#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <uv.h>

typedef enum attnd_route {
  ATTND_R_ATTENTION,
  ATTND_R_PLAN,
  ATTND_R_HEALTHZ,
  ATTND_R_READYZ,
  ATTND_R_METRICS,
  ATTND_R_INFO,
  ATTND_R_NONE
} attnd_route;

/* One HTTP request from its first callback to its completion notice. */
typedef struct attnd_req {
  struct attnd_server *srv;
  struct MHD_Connection *conn;
  attnd_route route;
  char method[16];
  char path[128];
  char *query;          /* re-encoded query string, for the proto parsers */
  bool json_in;         /* Content-Type application/json (else safetensors) */
  bool binary_out;      /* reply as safetensors */
  char *body;           /* the whole body, one buffer */
  size_t len, cap;
  size_t discarded;     /* body bytes dropped after an early reply */
  size_t reserved;      /* of the server's body budget */
  double t_received, t_admitted, t_started, t_done;
  bool submitted;       /* handed to the loop, connection suspended */
  /* the reply, set once; the HTTP thread queues it */
  int status;
  char *resp;           /* malloc'd; ownership passes to libmicrohttpd */
  size_t resp_len;
  const char *ctype;
  bool retry_after;
  bool queued;          /* the reply was queued to libmicrohttpd */
  uint64_t bytes_out;
  /* the job, while the loop owns it */
  attn_proto_req pr;
  attn_result res;
  uv_work_t work;       /* decode and submit */
  uv_work_t work2;      /* encode */
  bool in_engine;       /* submitted: the engine will report back */
  int stages_left;      /* loop callbacks still due before it completes */
  struct attnd_req *next;
} attnd_req;

typedef struct attnd_server {
  const attnd_config *cfg;
  attn_engine *engine;
  attnd_metrics *metrics;
  char engine_detail[160]; /* the backend in use, for logs and /v1/info */
  const char *backend;     /* the name requests ask the engine for */
  const char *backend_note; /* why, when auto chose; "" otherwise */
  struct MHD_Daemon *mhd;
  int listen_fd;
  int port;                /* the bound port (--listen ...:0 picks one) */
  uv_loop_t loop;
  uv_async_t incoming;     /* the HTTP thread's handoff */
  pthread_mutex_t mu;
  attnd_req *in_head, *in_tail; /* under mu */
  uv_async_t completed;    /* the engine's handoff */
  attnd_req *done_head, *done_tail; /* under mu */
  int max_running;         /* jobs between dispatch and reply at once */
  attnd_req *pend_head, *pend_tail; /* loop only */
  int admitted;            /* pending + running; loop only */
  int running;             /* loop only */
  atomic_bool draining;
  atomic_int replying;     /* requests handed to the loop, not yet completed */
  /* Bytes of request bodies held (allocated capacity), bounded by
   * max_queue x max_body whatever mix of uploads and queued jobs. */
  _Atomic uint64_t body_bytes;
  uv_signal_t sigterm, sigint;
  uv_timer_t drain_timer;
  double drain_deadline;
  bool drain_expired;      /* past --drain-timeout: stop waiting for jobs */
  double jobs_done_at;     /* when the drain first found no job left */
  pthread_mutex_t log_mu;
} attnd_server;

/* Monotonic seconds. */
double attnd_now(void);

/* http.c */
int attnd_http_start(attnd_server *s);         /* 0, or -1 after one line */
void attnd_http_quiesce(attnd_server *s);      /* stop accepting connections */
void attnd_http_stop(attnd_server *s);
/* Sets r's reply to an error body. */
void attnd_req_error(attnd_req *r, int status, const char *code, const char *message);
/* Sets r's reply to the error of an engine or proto code. */
void attnd_req_fail(attnd_req *r, const attn_status *st);

/* Takes n bytes of the body budget for r (false: over budget), or gives
 * back all r holds. */
bool attnd_body_reserve(attnd_req *r, size_t n);
void attnd_body_release(attnd_req *r);
/* Sets r's reply to 503 queue_full: a reservation did not fit. */
void attnd_body_over_budget(attnd_req *r);

/* loop.c */
int attnd_loop_init(attnd_server *s);
/* From the HTTP thread: hand a complete POST /attention to the loop. */
void attnd_loop_submit(attnd_server *s, attnd_req *r);
/* Runs until a drain completes. */
void attnd_loop_run(attnd_server *s);
void attnd_loop_close(attnd_server *s);

#endif
