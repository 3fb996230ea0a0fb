/*
 * http_reply.h — an incremental HTTP/1.1 reply parser, for `attn load`
 * and for the server's session handover (server/handover.c).
 *
 * It finds where each reply ends on a keep-alive connection, fed whatever
 * bytes a read brings (any split, down to one byte at a time): the status
 * line, the headers it needs (Content-Length, Transfer-Encoding: chunked,
 * Connection), then a Content-Length body, a chunked body (sizes,
 * extensions and trailers read and skipped) or, with neither, a body that
 * runs to the close. Interim 1xx replies are skipped; 204 and 304 have no
 * body. Bodies are counted; the first keep_cap bytes of each are kept in
 * the caller's keep buffer when it sets one (an error reply's message),
 * the rest are not: the load generator needs the status and the boundary,
 * not the bytes.
 *
 *   attn_http_reply p;  attn_http_reply_init(&p);
 *   attn_http_reply_start(&p);                 // a request went out
 *   rc = attn_http_reply_feed(&p, buf, n, &used);
 *   // rc ATTN_HTTP_DONE: p.status, p.close_after; buf + used is what follows
 *
 * Not thread-safe; one parser per connection.
 */
#ifndef ATTN_HTTP_REPLY_H
#define ATTN_HTTP_REPLY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ATTN_HTTP_MAX_HEAD 65536 /* status line and headers, bytes */

enum {
  ATTN_HTTP_ERROR = -1, /* malformed, over a limit, or bytes nobody asked for */
  ATTN_HTTP_MORE = 0,   /* every byte used; the reply goes on */
  ATTN_HTTP_DONE = 1,   /* a reply ended after *used bytes */
};

typedef struct attn_http_reply {
  int state;          /* where in a reply (http_reply.c); idle between replies */
  int status;         /* of the last reply head read */
  bool close_after;   /* the reply said Connection: close, is HTTP/1.0 without
                         keep-alive, or runs to the close */
  uint64_t remaining; /* bytes left of a Content-Length body or a chunk */
  char *head;         /* ATTN_HTTP_MAX_HEAD bytes */
  size_t head_len;
  char line[64]; /* a chunk-size or trailer line */
  size_t line_len;
  /* The caller's: where the body's first keep_cap bytes go (NULL, 0: none
   * kept), and how many a reply's body put there (from its start). */
  char *keep;
  size_t keep_cap, kept;
} attn_http_reply;

/* 0, or -1 when out of memory. The parser starts idle. */
int attn_http_reply_init(attn_http_reply *p);
void attn_http_reply_free(attn_http_reply *p);

/* A request was sent: the next bytes are its reply. */
void attn_http_reply_start(attn_http_reply *p);
/* Back to idle (the connection closed or opened). */
void attn_http_reply_reset(attn_http_reply *p);
bool attn_http_reply_idle(const attn_http_reply *p);
/* The body runs to the close: the connection's end ends the reply. */
bool attn_http_reply_until_close(const attn_http_reply *p);

/* Feeds data[0..n). ATTN_HTTP_DONE after *used bytes: the parser is idle
 * and the rest belongs to whatever comes next; ATTN_HTTP_MORE: all n used;
 * ATTN_HTTP_ERROR: the connection cannot be trusted any more. */
int attn_http_reply_feed(attn_http_reply *p, const char *data, size_t n, size_t *used);

#endif
