/*
 * harness_raw.h — raw TCP to the server under test, for what libcurl will
 * not do: partial or malformed requests, other source addresses, resets,
 * waiting for the server to close.
 */
#ifndef ATTND_TEST_HARNESS_RAW_H
#define ATTND_TEST_HARNESS_RAW_H

#include "harness_http.h"

#include <stddef.h>

/* Connected TCP socket to 127.0.0.1:port, or -1 (errno set). */
int raw_connect(int port);
/* The same from a source address of the loopback net (127.0.0.2, ...), so
 * that the server sees another client; NULL: the default. */
int raw_connect_from(int port, const char *source);
/* Sends everything (MSG_NOSIGNAL); 0 or -1. */
int raw_send(int fd, const void *buf, size_t len);
int raw_sends(int fd, const char *s);
/* Reads one response (headers, then Content-Length bytes of body, or until
 * close) within timeout_ms. Returns the status, or -1 on timeout or when the
 * peer closed before a status line; rs is filled as by http_do. */
int raw_response(int fd, int timeout_ms, http_res *rs);
/* Waits for the peer to close (recv() == 0 or a reset), discarding any data.
 * Returns the seconds it took, or -1 when still open after timeout_ms. */
double raw_wait_close(int fd, int timeout_ms);

/* Closes fd with a reset (SO_LINGER 0): the server cancels its job. */
void raw_reset(int fd);
/* A raw connection that has sent a whole POST /attention, or -1. */
int raw_post(int port, const char *ctype, const void *body, size_t len);

#endif
