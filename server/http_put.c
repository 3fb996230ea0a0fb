/*
 * http_put.c — the blocking PUT of http_put.h: a non-blocking socket whose
 * every wait is a poll() bounded by the request's idle time and deadline,
 * so that neither a connect to an address nobody answers nor a peer that
 * stops reading can hold the caller past them.
 */
#include "http_put.h"
#include "http_reply.h"

#include "engine.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* Milliseconds until t, 0 once it has passed. */
static int ms_until(double t) {
  double ms = (t - attn_now()) * 1e3;
  return ms <= 0 ? 0 : ms > 1e9 ? 1000000000 : (int)ms + 1;
}

/* Waits until fd is ready for events; 0, or -1 with why when q's idle time
 * or deadline comes first. */
static int wait_fd(int fd, short events, const attnd_put *q, const char *doing, char *why,
                   size_t cap) {
  double idle_end = attn_now() + q->idle_s;
  double until = idle_end < q->deadline ? idle_end : q->deadline;
  for (;;) {
    struct pollfd p = {.fd = fd, .events = events};
    int n = poll(&p, 1, ms_until(until));
    if (n > 0)
      return 0;
    if (n == 0) {
      snprintf(why, cap, "%s while %s",
               until < q->deadline ? "no byte moved in its idle time" : "no answer by the deadline",
               doing);
      return -1;
    }
    if (errno != EINTR) {
      snprintf(why, cap, "%s: %s", doing, strerror(errno));
      return -1;
    }
  }
}

/* A socket connected to a, or -1 with why. */
static int dial_one(const struct addrinfo *a, const attnd_put *q, char *why, size_t cap) {
  int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
  if (fd < 0) {
    snprintf(why, cap, "socket: %s", strerror(errno));
    return -1;
  }
  int err = 0;
  socklen_t len = sizeof err;
  if (connect(fd, a->ai_addr, a->ai_addrlen) < 0 && errno != EINPROGRESS)
    err = errno;
  else if (wait_fd(fd, POLLOUT, q, "connecting", why, cap) < 0)
    err = -1;
  else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
    err = errno;
  if (err > 0)
    snprintf(why, cap, "connecting: %s", strerror(err));
  if (err) {
    close(fd);
    return -1;
  }
  return fd;
}

/* A socket connected to u's host and port (its addresses in turn), or -1. */
static int dial(const attn_url *u, const attnd_put *q, char *why, size_t cap) {
  char port[8];
  snprintf(port, sizeof port, "%d", u->port);
  struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai;
  int rc = getaddrinfo(u->host, port, &hints, &ai);
  if (rc) {
    snprintf(why, cap, "cannot resolve %s: %s", u->host, gai_strerror(rc));
    return -1;
  }
  int fd = -1;
  for (const struct addrinfo *a = ai; a && fd < 0; a = a->ai_next)
    fd = dial_one(a, q, why, cap);
  freeaddrinfo(ai);
  return fd;
}

static int send_all(int fd, const char *p, size_t n, const attnd_put *q, char *why, size_t cap) {
  while (n > 0) {
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w > 0) {
      p += w;
      n -= (size_t)w;
    } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (wait_fd(fd, POLLOUT, q, "sending", why, cap) < 0)
        return -1;
    } else if (w < 0 && errno != EINTR) {
      snprintf(why, cap, "sending: %s", strerror(errno));
      return -1;
    }
  }
  return 0;
}

/* Reads bytes into the parser until its reply ends; 0, or -1 with why. */
static int read_until_done(int fd, attn_http_reply *p, const attnd_put *q, char *why, size_t cap) {
  char buf[16384];
  for (;;) {
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    size_t used;
    if (n > 0) {
      int rc = attn_http_reply_feed(p, buf, (size_t)n, &used);
      if (rc == ATTN_HTTP_DONE)
        return 0;
      if (rc == ATTN_HTTP_ERROR) {
        snprintf(why, cap, "the reply is not HTTP/1.1 attnd can read");
        return -1;
      }
    } else if (n == 0) {
      if (attn_http_reply_until_close(p))
        return 0;
      snprintf(why, cap, "the connection closed before the reply ended");
      return -1;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (wait_fd(fd, POLLIN, q, "waiting for the reply", why, cap) < 0)
        return -1;
    } else if (errno != EINTR) {
      snprintf(why, cap, "reading the reply: %s", strerror(errno));
      return -1;
    }
  }
}

static int read_reply(int fd, const attnd_put *q, attnd_put_reply *out, char *why, size_t cap) {
  attn_http_reply p;
  if (attn_http_reply_init(&p) < 0) {
    snprintf(why, cap, "out of memory for the reply");
    return -1;
  }
  p.keep = out->body;
  p.keep_cap = sizeof out->body - 1;
  attn_http_reply_start(&p);
  int rc = read_until_done(fd, &p, q, why, cap);
  out->status = p.status;
  out->len = p.kept;
  out->body[p.kept] = 0;
  attn_http_reply_free(&p);
  return rc;
}

/* The request's head: one connection per request, closed after it. */
static int head_of(const attnd_put *p, char *h, size_t cap) {
  const attn_url *u = p->base;
  int n =
      snprintf(h, cap,
               "PUT %s%s HTTP/1.1\r\nHost: %s%s%s:%d\r\nContent-Type: "
               "application/octet-stream\r\nContent-Length: %zu\r\nConnection: close\r\n",
               u->path, p->path, u->ipv6 ? "[" : "", u->host, u->ipv6 ? "]" : "", u->port, p->len);
  if (n > 0 && (size_t)n < cap && p->key)
    n += snprintf(h + n, cap - (size_t)n, "Authorization: Bearer %s\r\n", p->key);
  if (n > 0 && (size_t)n < cap)
    n += snprintf(h + n, cap - (size_t)n, "\r\n");
  return n > 0 && (size_t)n < cap ? n : -1;
}

int attnd_http_put(const attnd_put *p, attnd_put_reply *out, char *why, size_t cap) {
  char head[2048], send_why[256] = "";
  memset(out, 0, sizeof *out);
  int hl = head_of(p, head, sizeof head);
  if (hl < 0) {
    snprintf(why, cap, "the request's head is too long");
    return -1;
  }
  int fd = dial(p->base, p, why, cap);
  if (fd < 0)
    return -1;
  /* A server may answer before the body is in (a 413 from Content-Length)
   * and close: its reply is still the answer. */
  bool sent = send_all(fd, head, (size_t)hl, p, send_why, sizeof send_why) == 0 &&
              send_all(fd, p->body, p->len, p, send_why, sizeof send_why) == 0;
  int rc = read_reply(fd, p, out, why, cap);
  close(fd);
  if (rc < 0 && !sent)
    snprintf(why, cap, "%s", send_why);
  return rc;
}
