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
 * instead by attnd_http_refuse() with the documented JSON error, after
 * which libmicrohttpd closes the connection. Everything else goes on to the library's function.
 */
#define _GNU_SOURCE
#include "http.h"

#include <dlfcn.h>

typedef enum MHD_Result (*queue_fn)(struct MHD_Connection *, unsigned int, struct MHD_Response *);

enum MHD_Result MHD_queue_response(struct MHD_Connection *connection, unsigned int status_code,
                                   struct MHD_Response *response) {
  if (response && !MHD_get_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE) &&
      !MHD_get_response_header(response, ATTND_REQID_HEADER))
    return attnd_http_refuse(connection, status_code);
  /* Looked up on every call rather than cached in a global: dlsym() costs
   * about a microsecond, nothing beside a request. */
  queue_fn next;
  *(void **)&next = dlsym(RTLD_NEXT, "MHD_queue_response");
  return next ? next(connection, status_code, response) : MHD_NO;
}
