/*
 * http_put.h — one blocking HTTP/1.1 PUT to another server: connect, send
 * the headers and the body, read the reply's status line, headers and body
 * (a Content-Length, chunked or read-to-the-close body: proto's
 * http_reply.h parses it), then close. The session handover (handover.h)
 * sends each session with it at shutdown.
 *
 * It blocks the calling thread, so it never runs on the loop's. Every wait
 * on the socket (connect, each send, each read) ends after the request's
 * idle time without progress, and at its deadline whatever the progress,
 * so a target that is down, stuck or silent costs at most that long; only
 * the name's lookup (getaddrinfo) is the resolver's to bound.
 */
#ifndef ATTND_HTTP_PUT_H
#define ATTND_HTTP_PUT_H

#include "url.h"

#include <stddef.h>

typedef struct attnd_put {
  const attn_url *base; /* http://HOST[:PORT][/PATH], PATH without a trailing '/' */
  const char *path;     /* added to base's path: "/v1/sessions/ID/import" */
  const char *key;      /* sent as "Authorization: Bearer <key>"; NULL: none */
  const void *body;
  size_t len;
  double idle_s;   /* the most one wait on the socket may take: a peer that
                      moves no byte that long is given up on */
  double deadline; /* attn_now() seconds: the request ends by then */
} attnd_put;

typedef struct attnd_put_reply {
  int status;
  char body[1024]; /* the body's first bytes, NUL-terminated: an error's message */
  size_t len;
} attnd_put_reply;

/* Sends p; 0 with *out the reply (whatever its status; one that came while
 * the body was still going out counts), or -1 with why (a sentence: the
 * name, the connection, the deadline) when no reply was read. */
int attnd_http_put(const attnd_put *p, attnd_put_reply *out, char *why, size_t cap);

#endif
