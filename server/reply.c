/*
 * reply.c — an answer's way out to libmicrohttpd (reply.h): the body set
 * on the request, and the headers every reply or some routes carry: the
 * request id, CORS, Server-Timing, the console's, Allow, Retry-After.
 */
#include "reply.h"
#include "kind.h"
#include "route.h"
#include "errors.h"
#include "work.h"
#include "log.h"
#include "routes.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What a browser may send and read beyond the CORS-safelisted headers. */
#define CORS_ALLOW_HEADERS                                                \
  "Authorization, Content-Type, Content-Encoding, Accept, X-Request-Id, " \
  "Inference-Header-Content-Length"
#define CORS_EXPOSE_HEADERS \
  "X-Request-Id, Retry-After, Inference-Header-Content-Length, Server-Timing, X-Session-Length"
/* Seconds a browser may cache a preflight's answer. */
#define CORS_MAX_AGE "600"

/* --cors-origin's headers on every reply: the origin allowed, and Vary:
 * Origin when it is one origin, so that caches do not serve one origin's
 * reply to another. */
static void add_cors(const attnd_req *r, struct MHD_Response *resp) {
  const char *origin = r->srv->cfg->cors_origin;
  if (!*origin)
    return;
  MHD_add_response_header(resp, "Access-Control-Allow-Origin", origin);
  MHD_add_response_header(resp, "Access-Control-Expose-Headers", CORS_EXPOSE_HEADERS);
  if (strcmp(origin, "*"))
    MHD_add_response_header(resp, MHD_HTTP_HEADER_VARY, "Origin");
  if (r->status == MHD_HTTP_NO_CONTENT && !strcmp(r->method, MHD_HTTP_METHOD_OPTIONS)) {
    MHD_add_response_header(resp, "Access-Control-Allow-Methods", "GET, HEAD, POST, OPTIONS");
    MHD_add_response_header(resp, "Access-Control-Allow-Headers", CORS_ALLOW_HEADERS);
    MHD_add_response_header(resp, "Access-Control-Max-Age", CORS_MAX_AGE);
  }
}

/* A computed request's time in the server (RFC's Server-Timing, which a
 * browser's fetch can read): queued, decoding + engine + encoding, and
 * from its first byte until now, in milliseconds. */
static void add_server_timing(const attnd_req *r, struct MHD_Response *resp) {
  if (!attnd_req_computes(r) || r->t_started <= 0 || r->t_done <= 0)
    return;
  char v[200], *p = v, *end = v + sizeof v;
  static const char *const names[3] = {"queue;dur=", ", compute;dur=", ", total;dur="};
  double parts[3] = {r->t_started - r->t_admitted, r->t_done - r->t_started,
                     attn_now() - r->t_received};
  for (int i = 0; i < 3; i++) {
    size_t n = strlen(names[i]);
    memcpy(p, names[i], n);
    p += n;
    /* milliseconds to the microsecond */
    p += attnd_fmt_fixed(p, (size_t)(end - p), parts[i] * 1e3, 3);
  }
  *p = 0;
  MHD_add_response_header(resp, "Server-Timing", v);
}

/* The console's security and caching headers, and its ETag. */
static void add_console_headers(const attnd_req *r, struct MHD_Response *resp) {
  if (!r->asset || (r->status != 200 && r->status != MHD_HTTP_NOT_MODIFIED))
    return;
  for (const attnd_console_header *h = attnd_console_headers; h->name; h++)
    MHD_add_response_header(resp, h->name, h->value);
  MHD_add_response_header(resp, MHD_HTTP_HEADER_ETAG, r->asset->etag);
}

/* What a reply in parts holds until libmicrohttpd has sent it. */
typedef struct held {
  void *head, *buf;
  attnd_server *srv;
} held;

static void free_held(void *cls) {
  held *h = cls;
  free(h->head);
  attnd_outbuf_free(h->srv, h->buf);
  free(h);
}

/* Replies in parts at most this large are joined into one buffer:
 * libmicrohttpd 0.9.75 sends the headers of an iovec response with a
 * send() of their own, and a second segment costs a small reply (a decode
 * step's) more than the copy; larger ones are sent from where they lie. */
#define JOIN_BELOW ((size_t)16 * 1024)

/* The head and parts of a small reply in parts as one buffer (r->resp);
 * false, changing nothing, when it is larger or out of memory. */
static bool join_parts(attnd_req *r) {
  size_t n = r->resp_len;
  for (int i = 0; i < r->nparts; i++)
    n += r->parts[i].len;
  char *buf = n <= JOIN_BELOW ? malloc(n + 1) : NULL;
  if (!buf)
    return false;
  memcpy(buf, r->resp, r->resp_len);
  for (size_t i = 0, at = r->resp_len; i < (size_t)r->nparts; at += r->parts[i++].len)
    memcpy(buf + at, r->parts[i].data, r->parts[i].len);
  free(r->resp);
  attnd_outbuf_free(r->srv, r->parts_buf);
  r->parts_buf = NULL;
  r->resp = buf;
  r->resp_len = n;
  r->nparts = 0;
  return true;
}

/* libmicrohttpd's reader over a stream's (request.h). */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
  const attnd_stream *s = cls;
  int64_t n = s->read(s->arg, pos, buf, max);
  return n > 0 ? (ssize_t)n : MHD_CONTENT_READER_END_WITH_ERROR;
}

static void stream_free(void *cls) {
  attnd_stream *s = cls;
  s->end(s->arg);
  free(s);
}

/* r's stream as libmicrohttpd's response, which then owns it. */
static struct MHD_Response *stream_response(attnd_req *r) {
  attnd_stream *s = malloc(sizeof *s);
  /* a read of this many bytes a call: the pages' rows go out in large writes */
  struct MHD_Response *resp = s ? MHD_create_response_from_callback(
                                      r->stream.len, (size_t)256 << 10, stream_read, s, stream_free)
                                : NULL;
  if (!resp) {
    free(s);
    return NULL;
  }
  *s = r->stream;
  r->stream = (attnd_stream){0};
  r->bytes_out = s->len;
  return resp;
}

/* r's body as libmicrohttpd's response, which then owns its buffers: one
 * buffer (headers and body then go in one sendmsg), or the head and the
 * parts after it, sent from where they lie (no copy of the tensors into a
 * reply buffer). */
static struct MHD_Response *body_response(attnd_req *r) {
  if (r->stream.read)
    return stream_response(r);
  if (r->nparts)
    join_parts(r);
  r->bytes_out = r->resp_len;
  if (!r->nparts)
    return MHD_create_response_from_buffer_with_free_callback(
        r->resp_len, r->resp ? r->resp : (char *)"", r->resp ? free : NULL);
  struct MHD_IoVec iov[1 + ATTN_PROTO_MAX_PARTS];
  iov[0] = (struct MHD_IoVec){r->resp, r->resp_len};
  for (int i = 0; i < r->nparts; i++) {
    iov[1 + i] = (struct MHD_IoVec){r->parts[i].data, r->parts[i].len};
    r->bytes_out += r->parts[i].len;
  }
  held *h = malloc(sizeof *h);
  struct MHD_Response *resp =
      h ? MHD_create_response_from_iovec(iov, (unsigned)(1 + r->nparts), free_held, h) : NULL;
  if (!resp) {
    free(h);
    return NULL;
  }
  *h = (held){r->resp, r->parts_buf, r->srv};
  r->parts_buf = NULL;
  r->nparts = 0;
  return resp;
}

enum MHD_Result attnd_reply_queue(attnd_req *r) {
  if (!r->resp && !r->stream.read) /* out of memory for the error body itself */
    attnd_req_fail(r, ATTND_EOUT_OF_MEMORY, "out of memory");
  struct MHD_Response *resp = body_response(r);
  if (!resp)
    return MHD_NO;
  r->resp = NULL; /* libmicrohttpd frees it with the response */
  /* mhd_shim.c tells attnd's replies from libmicrohttpd's own by these */
  if (r->status != MHD_HTTP_NO_CONTENT)
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE,
                            r->ctype ? r->ctype : ATTND_JSON_TYPE);
  MHD_add_response_header(resp, ATTND_REQID_HEADER, r->id);
  add_cors(r, resp);
  add_server_timing(r, resp);
  add_console_headers(r, resp);
  const attnd_kind *kind = attnd_req_computes(r) ? r->route->kind : NULL;
  const char *value = kind && kind->reply_header ? kind->reply_value(r) : NULL;
  if (r->status == 200 && value) /* a header of the kind's own */
    MHD_add_response_header(resp, kind->reply_header, value);
  if (r->status == MHD_HTTP_UNAUTHORIZED)
    MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer realm=\"attnd\"");
  if (r->retry_after)
    MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, "1");
  /* a stopping server's clients reconnect, and their balancer then picks
   * a server that stays */
  if (r->close || atomic_load(&r->srv->unready))
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
  if (r->resp_json_len) {
    char n[24];
    snprintf(n, sizeof n, "%zu", r->resp_json_len);
    MHD_add_response_header(resp, "Inference-Header-Content-Length", n);
  }
  if (r->status == MHD_HTTP_METHOD_NOT_ALLOWED)
    MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, attnd_route_allow(r->route));
  enum MHD_Result ok = MHD_queue_response(r->conn, (unsigned)r->status, resp);
  MHD_destroy_response(resp);
  r->queued = true;
  return ok;
}
