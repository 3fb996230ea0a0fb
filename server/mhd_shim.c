/*
 * mhd_shim.c — attnd's stand-in for MHD_queue_response().
 *
 * libmicrohttpd 0.9.75 (Debian 12's) answers malformed requests itself —
 * a bad request line, Content-Length or chunk, an HTTP version it does not
 * speak, headers or a target too large for its memory pool — with fixed
 * HTML pages that carry no Content-Type, and after some of them its state
 * machine sends the header block twice. It offers no hook for those pages,
 * but it queues each through the exported MHD_queue_response(), which a
 * definition in the executable takes over (ELF symbol interposition). Every
 * response attnd itself builds has X-Request-Id (and all but a 204 a
 * Content-Type); one with neither is libmicrohttpd's own refusal, answered
 * instead by refuse() with the documented JSON error, after
 * which libmicrohttpd closes the connection. Everything else goes on to the library's function.
 */
#define _GNU_SOURCE
#include "mhd_shim.h"
#include "body.h"
#include "errors.h"
#include "log.h"

#include <dlfcn.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

void attnd_mhd_unanswered(attnd_server *s, attnd_req *r, enum MHD_RequestTerminationCode why) {
  int status = 0;
  size_t bytes = 0;
  if (r->link && attnd_conns_was_cut(&s->conns, r->link, &status, &bytes)) {
    r->status = status ? status : 499;
    r->bytes_out = bytes;
    return;
  }
  r->status = why == MHD_REQUEST_TERMINATED_TIMEOUT_REACHED ? 408 : 499;
}

/* libmicrohttpd's only 500 of its own: a body's chunk-size line (with its
 * extensions) that does not fit the connection's buffer — the client's
 * doing, not the server's. */
static const attnd_refusal long_chunk_line = {
    400, "Bad Request", "bad_request",
    "a chunk-size line (with its extensions) is longer than the connection's buffer (under 32 "
    "KiB); send chunk sizes without long extensions or leading zeros"};

/* The log line and metrics of a refusal no request was made for (method
 * "-"; path names what was refused). */
static void account_without_request(attnd_server *s, int status, size_t out, const char *path) {
  attnd_req line = {.t_received = attn_now(), .status = status, .bytes_out = out};
  snprintf(line.method, sizeof line.method, "-");
  snprintf(line.path, sizeof line.path, "%s", path);
  attnd_log_ended(s, &line);
}

static enum MHD_Result refuse(struct MHD_Connection *conn, unsigned status) {
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  attnd_conn *k = ci ? ci->socket_context : NULL;
  if (!k)
    return MHD_NO;
  attnd_server *s = k->owner;
  const attnd_refusal *f =
      status == MHD_HTTP_INTERNAL_SERVER_ERROR ? &long_chunk_line : attnd_err_refusal((int)status);
  attnd_req *r = k->req;
  attnd_metrics_error(s->metrics, f->code);
  /* Over TLS the socket carries records, not text: libmicrohttpd closes
   * the connection unanswered instead. */
  size_t out = r && r->has_body  ? attnd_body_refuse(s, k, f)
               : s->tls_cert_pem ? 0
                                 : attnd_body_send_refusal(k->fd, f, r ? r->id : NULL);
  if (r) { /* on_completed logs it */
    r->status = f->status;
    r->queued = true;
    r->bytes_out = out;
    return MHD_NO;
  }
  /* a refusal before any request: not a connection left waiting */
  attnd_conns_set(&s->conns, k, ATTND_CONN_BUSY, attn_now());
  account_without_request(s, f->status, out, "-");
  return MHD_NO;
}

/* libmicrohttpd's notes that attnd logs better itself: each refused
 * request has its request line, and a connection closed on purpose (a client
 * that reset during its job) has its cancel line. */
static bool said_already(const char *msg) {
  static const char *const notes[] = {"Error processing request", "Closing connection (",
                                      "Application reported internal error",
                                      "Connection socket is closed when reading request"};
  for (size_t i = 0; i < sizeof notes / sizeof *notes; i++)
    if (!strncmp(msg, notes[i], strlen(notes[i])))
      return true;
  return false;
}

void attnd_mhd_log(void *cls, const char *fmt, va_list ap) {
  attnd_server *s = cls;
  char msg[512], esc[600];
  vsnprintf(msg, sizeof msg, fmt, ap);
  msg[strcspn(msg, "\n")] = 0;
  if (said_already(msg))
    return;
  attn_quote(esc, sizeof esc, msg, strlen(msg));
  attnd_log_note(s, ATTND_WARN, "libmicrohttpd", NULL, "%s", esc);
}

void attnd_mhd_unparsed(attnd_server *s, attnd_conn *k) {
  if (atomic_load(&s->stopping) || s->tls_cert_pem ||
      !attnd_conns_unparsed(&s->conns, k, attn_now()))
    return;
  attnd_metrics_error(s->metrics, attnd_err_code(ATTND_EBAD_REQUEST));
  account_without_request(s, 400, 0, "(a request line libmicrohttpd could not parse)");
}

typedef enum MHD_Result (*queue_fn)(struct MHD_Connection *, unsigned int, struct MHD_Response *);

/* The library's function, found once: dlsym() walks the symbol tables
 * (some 1,000 instructions, more than the rest of the shim), and every
 * reply comes through here. Threads that race store the same pointer. */
static queue_fn library_queue(void) {
  static void *_Atomic found;
  void *f = atomic_load_explicit(&found, memory_order_acquire);
  if (!f) {
    f = dlsym(RTLD_NEXT, "MHD_queue_response");
    atomic_store_explicit(&found, f, memory_order_release);
  }
  queue_fn next;
  *(void **)&next = f;
  return next;
}

enum MHD_Result MHD_queue_response(struct MHD_Connection *connection, unsigned int status_code,
                                   struct MHD_Response *response) {
  if (response && !MHD_get_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE) &&
      !MHD_get_response_header(response, ATTND_REQID_HEADER))
    return refuse(connection, status_code);
  queue_fn next = library_queue();
  return next ? next(connection, status_code, response) : MHD_NO;
}
