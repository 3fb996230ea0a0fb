/*
 * errors.h — every error attnd answers on its own account, in one list.
 *
 * Each entry is (name, HTTP status, reason phrase, code, message): the code
 * is the stable "code" string of the JSON error body; the message is what a
 * refusal of libmicrohttpd's own (a request it cannot parse) says, or NULL
 * where the server always words its own. Engine and wire-format errors keep
 * their list in engine.h and proto.h; attnd_err_status() and
 * attnd_err_code() read all three, so a code is a code whichever list it
 * comes from. client_closed is only ever logged and counted: nobody is left
 * to send it to.
 */
#ifndef ATTND_ERRORS_H
#define ATTND_ERRORS_H

#define ATTND_ERRNO_MAP(XX)                                                                        \
  XX(BAD_REQUEST, 400, "Bad Request", "bad_request",                                               \
     "malformed HTTP request: the request line, a header, Content-Length or the chunked "          \
     "framing cannot be parsed")                                                                   \
  XX(UNAUTHORIZED, 401, "Unauthorized", "unauthorized", NULL)                                      \
  XX(FORBIDDEN, 403, "Forbidden", "forbidden", NULL)                                               \
  XX(NOT_FOUND, 404, "Not Found", "not_found", NULL)                                               \
  XX(METHOD_NOT_ALLOWED, 405, "Method Not Allowed", "method_not_allowed", NULL)                    \
  XX(REQUEST_TIMEOUT, 408, "Request Timeout", "request_timeout", NULL)                             \
  XX(TOO_LARGE, 413, "Content Too Large", "too_large",                                             \
     "Content-Length or a chunk size is too large")                                                \
  XX(URI_TOO_LONG, 414, "URI Too Long", "uri_too_long",                                            \
     "the request line is too long: the target may be at most 8192 bytes")                         \
  XX(UNSUPPORTED_MEDIA_TYPE, 415, "Unsupported Media Type", "unsupported_media_type", NULL)        \
  XX(TOO_MUCH_WORK, 422, "Unprocessable Content", "too_much_work", NULL)                           \
  XX(HEADERS_TOO_LARGE, 431, "Request Header Fields Too Large", "headers_too_large",               \
     "the request line and headers are too large: this server takes at most 16384 bytes (16 "      \
     "KiB) in at most 100 header fields; send fewer or shorter headers")                           \
  XX(CLIENT_CLOSED, 499, "Client Closed Request", "client_closed", NULL)                           \
  XX(INTERNAL, 500, "Internal Server Error", "internal", "the server cannot process this request") \
  XX(NOT_IMPLEMENTED, 501, "Not Implemented", "not_implemented", NULL)                             \
  XX(QUEUE_FULL, 503, "Service Unavailable", "queue_full", NULL)                                   \
  XX(CONNECTIONS_FULL, 503, "Service Unavailable", "connections_full", NULL)                       \
  XX(SHUTTING_DOWN, 503, "Service Unavailable", "shutting_down", NULL)                             \
  XX(OUT_OF_MEMORY, 503, "Service Unavailable", "out_of_memory", NULL)                             \
  XX(BACKEND_UNAVAILABLE, 503, "Service Unavailable", "backend_unavailable", NULL)                 \
  XX(TIMEOUT, 504, "Gateway Timeout", "timeout", NULL)                                             \
  XX(HTTP_VERSION, 505, "HTTP Version Not Supported", "http_version_not_supported",                \
     "this HTTP version is not supported; use HTTP/1.1 or HTTP/1.0")

/* Below the engine's (-1000) and the codecs' (-2000) ranges. */
typedef enum attnd_errno {
  ATTND__ERRNO_BASE = -3000,
#define ATTND_ERRNO_DEF(name, status, reason, code, refusal) ATTND_E##name,
  ATTND_ERRNO_MAP(ATTND_ERRNO_DEF)
#undef ATTND_ERRNO_DEF
      ATTND__ERRNO_END
} attnd_errno;

/* HTTP status of a server, engine or codec error code (500 unknown). */
int attnd_err_status(int code);
/* The JSON body's "code" string of any such code ("internal_error" unknown);
 * always a static string, so it can label a metric. */
const char *attnd_err_code(int code);

/* A refusal of libmicrohttpd's own: the entry of its status, or internal's
 * when the list has none. */
typedef struct attnd_refusal {
  int status;
  const char *reason, *code, *message;
} attnd_refusal;
const attnd_refusal *attnd_err_refusal(int status);
/* The reason phrase of an HTTP status the list holds ("Error" otherwise). */
const char *attnd_err_reason(int status);

#endif
