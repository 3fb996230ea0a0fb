/*
 * harness_http.h — requests to the server under test with libcurl, their
 * replies, and the checks every test makes of an error reply.
 */
#ifndef ATTND_TEST_HARNESS_HTTP_H
#define ATTND_TEST_HARNESS_HTTP_H

#include "harness_proc.h"

#include <stdbool.h>
#include <stddef.h>

typedef struct http_res {
  long status;     /* 0: no response (curl error) */
  int curl_rc;     /* CURLcode */
  char error[256]; /* curl's error text */
  char *body;      /* NUL-terminated */
  size_t len;
  char *hdrs; /* the final response's header block, NUL-terminated */
  size_t hlen;
  double secs; /* total time */
} http_res;

typedef struct http_req {
  const char *method;         /* default GET, or POST when a body is given */
  const char *path;           /* "/attention?causal=true" */
  const char *const *headers; /* NULL-terminated; "Name:" removes curl's own */
  const void *body;           /* NULL: none */
  size_t len;
  bool chunked;    /* Transfer-Encoding: chunked, 64 KiB pieces */
  long timeout_ms; /* default 30000 */
} http_req;

/* Once per process, before any thread makes a request: libcurl's global
 * state, and SIGPIPE ignored (a server that closes mid-body must not kill the
 * test). http_handle and srv_start call it. */
void http_global_init(void);

/* One request on a fresh connection; returns 0, or -1 with rs->error set. */
int http_do(const srv *s, const http_req *rq, http_res *rs);
/* The same on handle h (void * to keep curl.h out; from http_handle), whose
 * connection is reused across calls. */
void *http_handle(void);
void http_handle_free(void *h);
int http_do_h(void *h, const srv *s, const http_req *rq, http_res *rs);

/* One request from its parts, returning the status: what most checks of a
 * header or a status need, in one line. */
long http_call(const srv *s, const char *method, const char *path, const char *const *headers,
               const void *body, size_t len, http_res *rs);
int http_get(const srv *s, const char *path, http_res *rs);
/* POST with a Content-Type (NULL: none at all). */
int http_post(const srv *s, const char *path, const char *ctype, const void *body, size_t len,
              http_res *rs);
/* The value of a header of the response (case-insensitive name), trimmed,
 * into buf; false when absent. */
bool http_header(const http_res *rs, const char *name, char *buf, size_t cap);
void http_res_free(http_res *rs);

/* Checks with cr_expect that rs is an error reply: the status, Content-Type
 * application/json and {"error": {"code": code, "message": non-empty}}.
 * Returns whether everything held. what names the request in messages. */
bool expect_error(const http_res *rs, long status, const char *code, const char *what);

/* Checks (cr_expect) that header name is there with exactly want, the
 * operations suites' CORS and request-id headers; returns whether it was. */
bool expect_header(const http_res *rs, const char *name, const char *want);
/* Whether v is an id attnd made (32 lowercase hex digits), as replies
 * carry when the client sent none or one unfit for a log line. */
bool made_id(const char *v);

/* GET /healthz answers 200 (cr_expect); returns whether it did. */
bool expect_healthy(const srv *s, const char *after);

#endif
