/*
 * body.c — a computing request's body intake (body.h).
 *
 * 415 on a content type no codec reads and 413 when Content-Length is over
 * --max-body are answered before a byte of the body is read (libmicrohttpd
 * then skips "100 Continue" and closes). The body is read into one buffer
 * that grows as bytes arrive (doubling, up to Content-Length, or to
 * --max-body for a chunked body); a body of ATTND_BODYBUF_MIN or more whose
 * Content-Length is known is read into one mapping of that size
 * (bodybuf.h), whose pages are only filled as bytes arrive. Either way the
 * budget is drawn for what came, never for what a client declares. A body
 * is an upload in the connection registry (conns.h) until its last byte:
 * late, too slow, or abandoned, it is cut there (attnd_body_cut answers
 * it) whatever libmicrohttpd notices; past --max-body or the memory budget
 * it is cut here at once.
 */
#include "body.h"
#include "errors.h"
#include "parse.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

/* The first buffer of a body, doubled as bytes arrive. */
#define BODY_START ((size_t)64 * 1024)

/* A reply this layer made for an upload it refuses in mid-body, for the
 * registry's cut (attnd_conns_cut's arg). */
typedef struct cut_reply {
  int status;
  const char *body;
  size_t len;
} cut_reply;

/* Refuses r for a header's value: 'header "value" why', the value quoted
 * (attn_quote) and cut short. Returns false, for the callers' returns. */
static bool refuse_header(attnd_req *r, int code, const char *header, const char *value,
                          const char *why) {
  char msg[240], what[72];
  attn_quote(what, sizeof what, value, strlen(value));
  snprintf(msg, sizeof msg, "%s \"%s\" %s", header, what, why);
  attnd_req_fail(r, code, msg);
  return false;
}

/*
 * A /v2 infer request: JSON, optionally followed by binary tensors whose
 * start Inference-Header-Content-Length gives. tritonclient sends no
 * Content-Type, so none is needed; one that names neither JSON nor binary
 * data is refused. false when r has its reply.
 */
static bool v2_framing(attnd_req *r, const char *ct) {
  if (ct && !attnd_parse_media_is(ct, "application/json") &&
      !attnd_parse_media_is(ct, "application/octet-stream"))
    return refuse_header(r, ATTND_EUNSUPPORTED_MEDIA_TYPE, "Content-Type", ct,
                         "is not one the inference protocol reads; send application/json, "
                         "application/octet-stream or none");
  const char *h =
      MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Inference-Header-Content-Length");
  if (h && !attnd_parse_json_length(h, &r->v2_json_len))
    return refuse_header(r, ATTN_PROTO_EFRAMING, "Inference-Header-Content-Length", h,
                         "is not a byte count (the JSON's length)");
  return true;
}

/* Content-Encoding: gzip and deflate bodies are decoded before the codec
 * (loop.c), others are refused with 415 (RFC 9110 15.5.16). false when r
 * has its reply. */
static bool accept_encoding(attnd_req *r) {
  const char *ce =
      MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_ENCODING);
  r->encoding = attnd_encoding_of(ce);
  if (r->encoding != ATTND_ENC_UNKNOWN)
    return true;
  return refuse_header(r, ATTND_EUNSUPPORTED_MEDIA_TYPE, "Content-Encoding", ce,
                       "is not one this server reads; send gzip, deflate or none");
}

/* What r's Content-Type says its body and reply are: false when r has its
 * reply. */
static bool read_media(attnd_req *r) {
  const char *ct =
      MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
  if (r->v2) /* the inference protocol's codec reads the body whatever it is called */
    return v2_framing(r, ct);
  if (attnd_parse_media_is(ct, "application/json")) {
    r->json_in = true;
    r->binary_out = attnd_parse_accepts_binary(
        MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_ACCEPT));
    return true;
  }
  if (attnd_parse_media_is(ct, "application/octet-stream")) {
    r->binary_out = true;
    return true;
  }
  return refuse_header(r, ATTND_EUNSUPPORTED_MEDIA_TYPE, "Content-Type", ct ? ct : "(none)",
                       "is not one this server reads; send application/json or "
                       "application/octet-stream (safetensors)");
}

/* A large body's one buffer, of its Content-Length: the budget is drawn as
 * its bytes arrive (take_body). */
static bool map_body(attnd_req *r, size_t len) {
  r->body = attnd_bodybuf_get(&r->srv->bufs, len);
  if (!r->body) {
    attnd_req_fail(r, ATTND_EOUT_OF_MEMORY, "out of memory for the request body");
    return false;
  }
  r->cap = len;
  r->body_mapped = true;
  return true;
}

/* Content-Length against --max-body, and the body's first buffer: false
 * when r has its reply. */
static bool open_buffer(attnd_req *r) {
  uint64_t max = r->srv->cfg->max_body;
  const char *cl =
      MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
  uint64_t want = cl ? attnd_parse_content_length(cl) : 0;
  if (want > max) {
    char msg[200], what[40];
    attn_quote(what, sizeof what, cl, strlen(cl));
    snprintf(msg, sizeof msg, "Content-Length %s is over the limit of %llu bytes (--max-body)",
             what, (unsigned long long)max);
    attnd_req_fail(r, ATTND_ETOO_LARGE, msg);
    return false;
  }
  r->declared = cl ? want : UINT64_MAX;
  if (cl && want >= ATTND_BODYBUF_MIN)
    return map_body(r, (size_t)want);
  r->cap = cl && want < BODY_START ? (size_t)want : BODY_START;
  if (!attnd_body_reserve(r, r->cap)) {
    attnd_body_over_budget(r);
    return false;
  }
  r->body = malloc(r->cap ? r->cap : 1);
  if (!r->body) {
    attnd_req_fail(r, ATTND_EOUT_OF_MEMORY, "out of memory for the request body");
    return false;
  }
  return true;
}

bool attnd_body_begin(attnd_req *r) {
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
  r->fd = ci ? ci->connect_fd : -1;
  attnd_upload_begin(r);
  if (atomic_load(&r->srv->draining)) {
    attnd_req_fail(r, ATTND_ESHUTTING_DOWN, "the server is draining and takes no new work");
    return false;
  }
  return read_media(r) && accept_encoding(r) && open_buffer(r);
}

/* r's body buffer grown to hold need bytes: doubled, up to what the body
 * can be (its Content-Length, or --max-body); false with r's reply set. */
static bool grow_body(attnd_req *r, size_t need) {
  uint64_t limit = r->declared != UINT64_MAX ? r->declared : r->srv->cfg->max_body;
  size_t cap = r->cap * 2 > need ? r->cap * 2 : need;
  if (cap > limit)
    cap = (size_t)limit;
  if (!attnd_body_reserve(r, cap - r->cap)) {
    attnd_body_over_budget(r);
    return false;
  }
  /* glibc moves a block this large by remapping its pages, not copying */
  char *b = realloc(r->body, cap);
  if (!b) {
    attnd_req_fail(r, ATTND_EOUT_OF_MEMORY, "out of memory for the request body");
    return false;
  }
  r->body = b;
  r->cap = cap;
  return true;
}

/* Appends a piece of body; false when r has its error reply. */
static bool take_body(attnd_req *r, const char *data, size_t n) {
  uint64_t max = r->srv->cfg->max_body;
  if (r->len + n > max) {
    char msg[160];
    snprintf(msg, sizeof msg, "the body grew past the limit of %llu bytes (--max-body)",
             (unsigned long long)max);
    attnd_req_fail(r, ATTND_ETOO_LARGE, msg);
    return false;
  }
  if (r->body_mapped) {
    /* libmicrohttpd passes no byte past Content-Length, the mapping's size */
    if (r->len + n > r->cap || !attnd_body_reserve(r, n)) {
      attnd_body_over_budget(r);
      return false;
    }
    attnd_bodybuf_fill(r->body, r->len, data, n);
    r->len += n;
    return true;
  }
  if (r->len + n > r->cap && !grow_body(r, r->len + n))
    return false;
  memcpy(r->body + r->len, data, n);
  r->len += n;
  return true;
}

/* Bytes of body read and dropped after a reply was decided (413 on a
 * chunked body, 404 or 405 with a body) before the connection is cut
 * instead: libmicrohttpd takes a reply only before the body or after all
 * of it. */
#define DISCARD_LIMIT ((size_t)64 << 20)

void attnd_body_done(attnd_req *r) {
  if (!r->has_body)
    return;
  r->has_body = false;
  if (r->link)
    attnd_conns_set(&r->srv->conns, r->link, ATTND_CONN_BUSY, attn_now());
}

bool attnd_body_add(attnd_req *r, const char *data, size_t n) {
  if (r->link)
    attnd_conns_upload_add(&r->srv->conns, r->link, n);
  if (r->status) { /* the reply is decided (404, 405); drop the body, up to a point */
    r->discarded += n;
    return r->discarded <= DISCARD_LIMIT;
  }
  if (take_body(r, data, n))
    return true;
  cut_reply c = {r->status, r->resp, r->resp_len};
  if (r->link)
    attnd_conns_cut(&r->srv->conns, r->link, ATTND_CLOSE_BODY_REFUSED, &c);
  return false;
}

/* Writes a JSON error reply straight to the socket and ends the
 * connection's sending side; what the client sent after it is read and
 * dropped first where it is already there, so that closing does not reset
 * the connection before the client reads the reply. Returns the body bytes
 * sent. */
static size_t send_error_reply(int fd, int status, const char *body, size_t blen, const char *id) {
  char msg[2048];
  int n =
      snprintf(msg, sizeof msg,
               "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
               "%s%s%s%sConnection: close\r\n\r\n%.*s",
               status, attnd_err_reason(status), body ? blen : 0, id ? ATTND_REQID_HEADER ": " : "",
               id ? id : "", id ? "\r\n" : "", status == 503 ? "Retry-After: 1\r\n" : "",
               body ? (int)blen : 0, body ? body : "");
  size_t len = n > 0 && (size_t)n < sizeof msg ? (size_t)n : 0;
  ssize_t sent = send(fd, msg, len, MSG_NOSIGNAL | MSG_DONTWAIT);
  sent = sent == (ssize_t)len ? (ssize_t)blen : 0; /* bytes_out counts the body */
  shutdown(fd, SHUT_WR);
  char sink[4096];
  for (int i = 0; i < 16 && recv(fd, sink, sizeof sink, MSG_DONTWAIT) > 0; i++)
    ;
  return sent > 0 ? (size_t)sent : 0;
}

size_t attnd_body_send_refusal(int fd, const attnd_refusal *f, const char *id) {
  size_t blen = 0;
  char *body = attn_proto_error_body(f->code, f->message, &blen);
  size_t sent = send_error_reply(fd, f->status, body, blen, id);
  free(body);
  return sent;
}

/* Why the registry cut an upload, as the error code and message its reply
 * carries. */
static int cut_message(const attnd_server *s, const attnd_conn *k, attnd_conn_reason why, char *msg,
                       size_t cap) {
  double now = attn_now(), took = now - k->up_started;
  if (why == ATTND_CLOSE_BODY_TIMEOUT) {
    snprintf(msg, cap,
             "the body did not arrive whole within the %g s deadline (--timeout): %llu bytes "
             "came in %.1f s",
             s->cfg->timeout, (unsigned long long)k->up_bytes, took);
    return ATTND_EREQUEST_TIMEOUT;
  }
  if (why == ATTND_CLOSE_BODY_TOO_SLOW) {
    snprintf(msg, cap,
             "the body arrived at %.0f bytes/s over the last %g s, below --min-upload-rate "
             "(%.0f bytes/s)",
             k->up_window_rate, ATTND_RATE_WINDOW, s->cfg->min_upload_rate);
    return ATTND_EREQUEST_TIMEOUT;
  }
  snprintf(msg, cap,
           "every connection was busy and this was the slowest upload of the client holding "
           "the most: it was closed to let another client in; retry");
  return ATTND_ECONNECTIONS_FULL;
}

/* The JSON error written straight to the socket, since libmicrohttpd
 * takes no reply in mid-body. arg is this layer's own reply (a cut_reply);
 * without one the registry's reason words it. */
void attnd_body_cut(void *ctx, attnd_conn *k, attnd_conn_reason why, const void *arg) {
  attnd_server *s = ctx;
  if (why == ATTND_CLOSE_CLIENT_GONE)
    return;
  cut_reply own = {0};
  const cut_reply *c = arg;
  char msg[400];
  if (!c) {
    int code = cut_message(s, k, why, msg, sizeof msg);
    attnd_metrics_error(s->metrics, attnd_err_code(code));
    own.status = attnd_err_status(code);
    own.body = attn_proto_error_body(attnd_err_code(code), msg, &own.len);
    c = &own;
  }
  k->cut_status = c->status;
  if (!s->tls_cert_pem)
    k->cut_bytes = send_error_reply(k->fd, c->status, c->body, c->len, k->id);
  free((char *)(uintptr_t)own.body);
}

size_t attnd_body_refuse(attnd_server *s, attnd_conn *k, const attnd_refusal *f) {
  cut_reply c = {f->status, NULL, 0};
  char *body = attn_proto_error_body(f->code, f->message, &c.len);
  int status = 0;
  size_t out = 0;
  c.body = body;
  attnd_conns_cut(&s->conns, k, ATTND_CLOSE_BODY_REFUSED, &c);
  attnd_conns_was_cut(&s->conns, k, &status, &out);
  free(body);
  return out;
}
