/*
 * body.h — a computing request's body intake (body.c): the checks before
 * its first byte, the buffer it grows into, and the cuts of an upload
 * refused in mid-body, written straight to the socket since libmicrohttpd
 * takes a reply only before the body or after all of it. HTTP thread,
 * except attnd_body_cut (the registry's hook, on whichever thread cuts).
 */
#ifndef ATTND_BODY_H
#define ATTND_BODY_H

#include "errors.h"
#include "request.h"

#include <microhttpd.h>

/* The first callback of a computing request: refuses what can be refused
 * before the body (draining, Content-Type, Content-Encoding, the /v2
 * framing, Content-Length over --max-body, the memory budget) and sets up
 * its buffer; false when r already has its reply. */
bool attnd_body_begin(attnd_req *r);

/* A piece of body. One refused in mid-way (past --max-body or the memory
 * budget) is answered and cut; once r's reply is decided before its body
 * (404, 405) the body is dropped, up to a point. false: close the
 * connection. */
bool attnd_body_add(attnd_req *r, const char *data, size_t n);

/* The body is whole: the registry no longer holds it as an upload. */
void attnd_body_done(attnd_req *r);

/* The registry's hook for an upload cut short (attnd_conns_uploads): the
 * JSON error to the client. A client that is gone gets nothing; over TLS
 * nothing can be written from here, and the connection only closes. */
void attnd_body_cut(void *ctx, attnd_conn *k, attnd_conn_reason why, const void *arg);

/* A refusal of libmicrohttpd's in mid-body, through the registry, which
 * may be cutting the same upload on the loop thread: one reply, never two.
 * Returns the body bytes sent. */
size_t attnd_body_refuse(attnd_server *s, attnd_conn *k, const attnd_refusal *f);

/* A refusal written straight to fd as the JSON error of its status, id
 * (or NULL) as its request id; the body bytes sent. */
size_t attnd_body_send_refusal(int fd, const attnd_refusal *f, const char *id);

#endif
