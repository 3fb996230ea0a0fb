/* harness_raw.c — see harness_raw.h. */
#define _GNU_SOURCE
#include "harness_raw.h"

#include "harness_buf.h"
#include "harness_util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

int raw_connect(int port) { return raw_connect_from(port, NULL); }

int raw_connect_from(int port, const char *source) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -1;
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  struct sockaddr_in from = {.sin_family = AF_INET};
  if ((source && (inet_pton(AF_INET, source, &from.sin_addr) != 1 ||
                  bind(fd, (struct sockaddr *)&from, sizeof from) < 0)) ||
      connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
    int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

int raw_send(int fd, const void *b, size_t len) {
  const char *p = b;
  while (len) {
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return -1;
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

int raw_sends(int fd, const char *s) { return raw_send(fd, s, strlen(s)); }

/* recv with a deadline: >0 bytes, 0 closed, -1 error/reset, -2 timeout. */
static ssize_t recv_until(int fd, char *b, size_t cap, double deadline) {
  for (;;) {
    double left = deadline - now_s();
    if (left <= 0)
      return -2;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int r = poll(&p, 1, (int)(left * 1000) + 1);
    if (r < 0 && errno == EINTR)
      continue;
    if (r == 0)
      continue;
    ssize_t n = recv(fd, b, cap, 0);
    if (n < 0 && errno == EINTR)
      continue;
    return n < 0 ? -1 : n;
  }
}

int raw_response(int fd, int timeout_ms, http_res *rs) {
  memset(rs, 0, sizeof *rs);
  double deadline = now_s() + timeout_ms / 1000.0, t0 = now_s();
  buf b = {0};
  size_t hend = 0;
  long clen = -1;
  char tmp[65536];
  for (;;) {
    if (!hend && b.p) {
      char *e = strstr(b.p, "\r\n\r\n");
      if (e) {
        hend = (size_t)(e - b.p) + 4;
        rs->hdrs = strndup(b.p, hend);
        rs->hlen = hend;
        sscanf(b.p, "HTTP/%*d.%*d %ld", &rs->status);
        char v[64];
        if (http_header(rs, "Content-Length", v, sizeof v))
          clen = atol(v);
        if (rs->status == 204 || rs->status == 304 || (rs->status >= 100 && rs->status < 200))
          clen = 0;
      }
    }
    if (hend && clen >= 0 && b.n >= hend + (size_t)clen)
      break;
    ssize_t n = recv_until(fd, tmp, sizeof tmp, deadline);
    if (n == -2) {
      snprintf(rs->error, sizeof rs->error, "timeout after %d ms", timeout_ms);
      break;
    }
    if (n <= 0) {
      snprintf(rs->error, sizeof rs->error, n == 0 ? "connection closed" : "connection reset");
      if (hend && clen < 0) /* body until close */
        clen = (long)(b.n - hend);
      break;
    }
    buf_add(&b, tmp, (size_t)n);
  }
  rs->secs = now_s() - t0;
  if (!hend) {
    free(b.p);
    free(rs->hdrs);
    rs->hdrs = strdup("");
    rs->body = strdup("");
    rs->status = 0;
    return -1;
  }
  size_t bl = clen >= 0 && b.n >= hend + (size_t)clen ? (size_t)clen : b.n - hend;
  rs->body = malloc(bl + 1);
  memcpy(rs->body, b.p + hend, bl);
  rs->body[bl] = 0;
  rs->len = bl;
  free(b.p);
  return (int)rs->status;
}

double raw_wait_close(int fd, int timeout_ms) {
  double t0 = now_s(), deadline = t0 + timeout_ms / 1000.0;
  char tmp[4096];
  for (;;) {
    ssize_t n = recv_until(fd, tmp, sizeof tmp, deadline);
    if (n == -2)
      return -1;
    if (n <= 0)
      return now_s() - t0;
  }
}

void raw_reset(int fd) {
  struct linger lg = {.l_onoff = 1, .l_linger = 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
  close(fd);
}

int raw_post(int port, const char *ctype, const void *body, size_t len) {
  int fd = raw_connect(port);
  if (fd < 0)
    return -1;
  char h[256];
  snprintf(h, sizeof h,
           "POST /attention HTTP/1.1\r\nHost: localhost\r\nContent-Type: %s\r\nContent-Length: "
           "%zu\r\n\r\n",
           ctype, len);
  if (raw_sends(fd, h) < 0 || raw_send(fd, body, len) < 0) {
    close(fd);
    return -1;
  }
  return fd;
}
