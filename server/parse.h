/*
 * parse.h — the rules a request's head must meet, without I/O: one reading
 * of where a request ends and who it is for, so that a proxy in front and
 * attnd cannot see two different requests in the same bytes.
 *
 * RFC 9112 §5.1 forbids whitespace between a field name and its colon
 * (libmicrohttpd 0.9.75 stores "Content-Length " as another field and
 * frames the body as a second request); RFC 9112 §6.3 forbids framing
 * headers that disagree; RFC 9110 §5.3 lets a field that is one value (Host,
 * Authorization, ...) appear once. A target or header holding a NUL is
 * read up to it by C code and whole by others. A keyless server answers
 * only to the hosts it is reached by (DNS rebinding), and computes only for
 * pages of its own origin or the CORS one.
 *
 * The HTTP layer feeds each header to attnd_head_add() in order and asks
 * attnd_head_check() for the verdict; none of it keeps state beyond the
 * attnd_head it is given, and every function is safe on any thread.
 */
#ifndef ATTND_PARSE_H
#define ATTND_PARSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The most a request's head may hold: its request line and header lines
 * together, in bytes (counting each header as "Name: value" and CRLF, and
 * the blank line), and its header fields. Past either it gets 431; the
 * connection's memory (listen.c) holds a head at both limits with room for
 * the reply's headers and the body's reads. */
#define ATTND_MAX_HEAD 16384
#define ATTND_MAX_HEADERS 100

/* What one pass over a request's headers found. */
typedef struct attnd_head {
  /* The head's bytes so far: the caller sets the request line's
   * (attnd_head_line), attnd_head_add() adds each header's. */
  size_t bytes;
  int n_fields;
  int n_cl, n_te, n_host;
  const char *cl, *te, *host;
  bool cl_differ;
  const char *dup;      /* a one-value field given twice, or NULL */
  const char *bad_name; /* a field name that is not a token, or NULL */
  unsigned seen;        /* the one-value fields seen, a bit each */
} attnd_head;

/* The request line's bytes ("METHOD target VERSION" and CRLF), counted
 * before its headers. */
void attnd_head_line(attnd_head *h, const char *method, size_t target_len, const char *version);

/* One header of the request, in the order it came. */
void attnd_head_add(attnd_head *h, const char *name, const char *value);

/* The verdict on the headers of a request of this HTTP version: 0 to go
 * on, or an attnd error code (errors.h) with its message in msg. */
int attnd_head_check(const attnd_head *h, const char *version, char *msg, size_t cap);

/* Whether the request has a body to read (Content-Length over 0, or
 * chunked), once attnd_head_check() passed. */
bool attnd_head_has_body(const attnd_head *h);

/*
 * A target's percent-escapes decoded in place, as libmicrohttpd's own
 * unescaper does, except that in a path (path true) "%2F" stays as it is,
 * so that it never becomes a separator; *nul is set when an escape stands
 * for a NUL byte. Returns the new length.
 */
size_t attnd_parse_unescape(char *s, bool path, bool *nul);

/*
 * Whether a keyless server answers to this Host header value: an IP
 * address (DNS rebinding needs a name), localhost or a name under
 * .localhost, or a name of allowed (comma-separated, "*" for any); the port
 * is not compared. NULL (HTTP/1.0 without Host) is allowed.
 */
bool attnd_parse_host_allowed(const char *host, const char *allowed);

/* Whether a browser page of origin may make this request: the origin is
 * the CORS one (cors, "*" for any), or the page's own host and port are the
 * Host the request was sent to. */
bool attnd_parse_origin_allowed(const char *origin, const char *host, const char *cors);

/* ---- the target, the body's framing, what a reply may be ------------------ */

/* A request target longer than this, or with more query parameters, is
 * refused with 414: libmicrohttpd keeps each parameter in the connection's
 * fixed memory pool, and one that runs out there leaves the connection
 * without a reply. */
#define ATTND_MAX_TARGET 8192
#define ATTND_MAX_QUERY_PARAMS 100

/* Why a request target (as libmicrohttpd first sees it, query included) is
 * refused, or NULL: *code is ATTND_EURI_TOO_LONG past the limits above,
 * else ATTND_EBAD_REQUEST for a space or tab in it. */
const char *attnd_parse_target(const char *uri, int *code);

/* The path of a target in absolute form ("http://host:8080/healthz", which
 * HTTP/1.1 servers must accept), or the target itself. */
const char *attnd_parse_origin_path(const char *url);

/* Whether a header value's media type is type, ignoring case, parameters
 * and surrounding blanks: "Application/JSON; charset=utf-8" is
 * application/json. NULL (no header) is no type. */
bool attnd_parse_media_is(const char *value, const char *type);

/* Whether an Accept header value (NULL when absent) asks for binary
 * tensors: application/octet-stream listed, and not after
 * application/json. */
bool attnd_parse_accepts_binary(const char *accept);

/* A Content-Length value read strictly: its number, or UINT64_MAX when it
 * is not one (empty, a sign, trailing bytes, out of range). */
uint64_t attnd_parse_content_length(const char *value);

/* An Inference-Header-Content-Length value (the JSON part's length of a
 * /v2 body): true with *len, or false when it is not a plain byte count. */
bool attnd_parse_json_length(const char *value, size_t *len);

#endif
