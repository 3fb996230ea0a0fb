/*
 * request.h — one HTTP request's state from its first callback to its
 * completion notice, and what every thread does to it (request.c): its
 * references, its reply (attnd_req_fail is the only way to set an error),
 * the body budget it draws on, the uploads a drain waits for, and its
 * metrics label (log.h accounts for it once it ends).
 *
 * Its fields are grouped by the thread that owns them, as the lifetime
 * passes a request along: the HTTP thread until the handoff to the loop,
 * the loop while it is admitted, libuv's threadpool and the engine while
 * it computes, the HTTP thread again once its reply is set.
 */
#ifndef ATTND_REQUEST_H
#define ATTND_REQUEST_H

#include "conns.h"
#include "console.h"
#include "inflate.h"
#include "proto.h"
#include "reqid.h"
#include "server.h"

#include <stdatomic.h>
#include <string.h>
#include <uv.h>

struct MHD_Connection;
struct attnd_route;

#define ATTND_JSON_TYPE "application/json"

/* A reply body of len bytes read as it is sent: read writes the bytes
 * from pos into buf, up to max (the count, above 0; -1 cuts the
 * connection), on the HTTP thread; end runs once, when it is done with. */
typedef struct attnd_stream {
  uint64_t len;
  int64_t (*read)(void *arg, uint64_t pos, char *buf, size_t max);
  void (*end)(void *arg);
  void *arg;
} attnd_stream;

typedef struct attnd_req {
  /* Set when it is made; read by every thread. */
  struct attnd_server *srv;
  /* Its id: the client's X-Request-Id when valid (reqid.h), else one made
   * when the request began. Echoed in every reply and log line; routes that
   * carry an id of their own (the /v2 "id") may read it. */
  char id[ATTND_REQID_MAX + 1];
  double t_received;
  /* Lifetime: the connection holds a reference from the first callback to
   * on_completed(), the loop another from the handoff to the job's end; the
   * last one frees r (attnd_req_unref). A reply sent early (deadline, reset,
   * shutdown) ends the connection while the engine may still be finishing
   * its current work item on r's tensors. */
  atomic_int refs;

  /* The HTTP thread's: the request as it arrives (fixed before the
   * handoff; the loop and the engine read them after). */
  struct MHD_Connection *conn;
  attnd_conn *link;                 /* the connection's registry record */
  char client[ATTND_ADDR_MAX];      /* the link's address, or whom a trusted proxy names */
  bool started;                     /* the first request callback has run */
  const char *bad_target;           /* why the request target is refused, or NULL */
  int bad_target_code;              /* its error: 414 too long, 400 malformed */
  const char *target, *target_end;  /* where libmicrohttpd holds the target, its string end */
  bool path_escaped;                /* the target's path, as sent, held a '%' */
  const char *host;                 /* its Host header, or NULL (valid until it ends) */
  bool close;                       /* its reply ends the connection (a refused head) */
  const struct attnd_route *route;  /* its row of the route table (routes.h), or NULL */
  int series;                       /* its route's metrics series (attnd_route_series), or -1 */
  const attnd_console_asset *asset; /* the console's file served, or NULL */
  /* The model a route served ("" for /attention): a label of the metrics
   * and the log line. Set by the route, before the request ends. */
  char model[64];
  /* The name of the API key r authenticated with (auth.h), its tenant: the
   * namespace of its sessions, a label of the metrics and the log line. ""
   * when the server has no keys, and on the open routes. */
  char tenant[64];
  char method[16];
  char path[192]; /* room for /v1/sessions/ and a 128-byte id and /attention */
  char *query;    /* re-encoded query string, for the proto parsers */
  bool json_in;   /* Content-Type application/json (else safetensors) */
  /* /v2: errors in the protocol's shape {"error": message} */
  bool v2;
  int v2_model;       /* attn_proto_v2_model() of the path, or -1 */
  size_t v2_json_len; /* Inference-Header-Content-Length; SIZE_MAX: the whole body */
  bool binary_out;    /* reply as safetensors */
  bool decoded;       /* pr holds the decoded body (a tiny job's try, tiny.h) */
  char *body;         /* the whole body, one buffer, as received */
  bool body_mapped;   /* body is a bodybuf.h mapping (else the heap's) */
  size_t len, cap;
  uint64_t declared;       /* its Content-Length; UINT64_MAX for a chunked body */
  bool has_body;           /* it declared one: an upload in the registry until it is whole */
  attnd_encoding encoding; /* its Content-Encoding */
  size_t discarded;        /* body bytes dropped after an early reply */
  bool submitted;          /* handed to the loop, connection suspended */
  bool uploading;          /* on s->up_head's list */
  int fd;                  /* its socket, for the drain's peek */
  bool queued;             /* the reply was queued to libmicrohttpd */
  uint64_t bytes_out;

  /* The reply, set once: by the HTTP thread for what it answers, by the
   * loop for a computed one (then handed back with the connection). */
  int status;
  char *resp; /* malloc'd; ownership passes to libmicrohttpd */
  size_t resp_len;
  const char *ctype;
  size_t resp_json_len; /* /v2: JSON bytes before binary outputs (0: none) */
  /* A body sent in pieces after resp (a safetensors reply's tensors, where
   * the engine wrote them), and the buffer that holds them (malloc'd). */
  attn_proto_part parts[ATTN_PROTO_MAX_PARTS];
  int nparts;
  void *parts_buf;
  attnd_stream stream; /* a body read as it is sent instead (stream.read set) */
  bool retry_after;
  bool gone; /* the client reset: close unanswered */

  /* Shared under s->mu. */
  struct attnd_req *up_prev, *up_next; /* s->up_head's list */
  struct attnd_req *next;              /* a handoff list, or the loop's queue */

  /* Whichever thread holds the request: the body budget it holds (of
   * s->body_bytes), taken by the HTTP thread, the loop and the
   * threadpool in turn. */
  size_t reserved;

  /* The loop thread's, from admission to the job's end. */
  double t_admitted, t_started, t_done;
  bool dispatched; /* left the queue for decode and the engine */
  bool answered;   /* the reply is set and the connection resumed */
  bool canceled;
  attnd_cancel_reason cancel_why;
  struct attnd_client *who;              /* its client's record (loop.h) */
  struct attnd_req *act_prev, *act_next; /* the loop's admitted jobs */
  int stages_left;                       /* loop callbacks still due before it completes */
  uv_work_t work;                        /* decode and submit */
  uv_work_t work2;                       /* encode */

  /* The threadpool's and the engine's, while it computes: what they
   * produce, which the loop turns into the reply unless one was already
   * sent (the reply fields then belong to the HTTP thread). */
  attn_v2_info v2_info; /* what the request asks of its reply */
  /* A gzip or deflate body decoded (before the codec); NULL for identity.
   * len stays the bytes received, for the logs. */
  char *plain;
  size_t plain_len;
  attn_proto_req pr;
  void *state; /* its kind's own (kind.h), freed by the kind's free; or NULL */
  attn_result res;
  bool in_engine;     /* submitted: the engine will report back */
  int cancel;         /* the engine's cancel flag (attn_cancel_set), any thread */
  attn_status job_st; /* a decode, submit, engine or encode failure */
  char *out;          /* the encoded reply body (a safetensors one's head) */
  size_t out_len;
  attn_proto_part out_parts[ATTN_PROTO_MAX_PARTS]; /* then these, as parts above */
  int out_nparts;
  void *out_parts_buf;
  const char *out_ctype;
  size_t out_json_len; /* /v2: as resp_json_len */
  double t_engine;     /* when decoding failed or the engine completed */
} attnd_req;

/* src copied into dst[cap] and cut to fit, as snprintf(dst, cap, "%s", src)
 * does, without printf's cost (some 600 instructions a call, several a
 * request). */
static inline void attnd_copy_str(char *dst, size_t cap, const char *src) {
  if (!cap)
    return;
  size_t n = strnlen(src, cap - 1);
  memcpy(dst, src, n);
  dst[n] = 0;
}

/* A request as its first callback finds it, holding the connection's
 * reference; NULL when out of memory. */
attnd_req *attnd_req_new(attnd_server *s);
/* Drops a reference to r; the last one frees it (any thread). */
void attnd_req_unref(attnd_req *r);
/* Sets r's reply; buf (malloc'd) becomes r's. */
void attnd_req_reply(attnd_req *r, int status, char *buf, size_t len, const char *ctype);
/* Sets r's reply to a body of s->len bytes read as they are sent; s->end
 * runs once either way (sent, cut, or never queued). */
void attnd_req_reply_stream(attnd_req *r, int status, const attnd_stream *s, const char *ctype);
/* Sets r's reply to the JSON document built in b, or, when building it ran
 * out of memory, to that error. */
void attnd_req_reply_json(attnd_req *r, int status, attn_sbuf *b);
/* The only way to set an error reply: r's reply becomes the JSON error of
 * code (a server code of errors.h, or an engine or codec code) with this
 * message, and the error is counted by code. ATTND_ECLIENT_CLOSED sets no
 * reply: the connection is closed unanswered. */
void attnd_req_fail(attnd_req *r, int code, const char *message);
/* A reply's tensor buffer freed: the engine's when it lent it, else free(). */
void attnd_outbuf_free(attnd_server *s, void *p);
/* Gives r's body buffer back (the heap's, or a mapping to keep warm). */
void attnd_req_drop_body(attnd_req *r);
/* Takes n bytes of the body budget for r (false: over budget), or gives
 * back all r holds. */
bool attnd_body_reserve(attnd_req *r, size_t n);
void attnd_body_release(attnd_req *r);
/* Sets r's reply to 503 queue_full: a reservation did not fit. */
void attnd_body_over_budget(attnd_req *r);
/* Whether r's route computes (has a kind, kind.h: it queues engine work,
 * which the loop answers); every other route is answered on the HTTP
 * thread. */
bool attnd_req_computes(const attnd_req *r);
/* HTTP thread: r's headers arrived and its body is being read (r->fd set),
 * which a drain waits for; or that ended (a no-op when it never began). */
void attnd_upload_begin(attnd_req *r);
void attnd_upload_end(attnd_req *r);
/* The metrics' label of r's path: its route's (a /v2 path is labeled by
 * its route, never by the client's bytes: model names would make labels
 * without bound), else the path. */
const char *attnd_req_route_label(const attnd_req *r);
/* The metrics' series of r's route label (attnd_route_series), or -1 when
 * the label is not its route's (attnd_req_route_label's path then). */
int attnd_req_series(const attnd_req *r);

#endif
