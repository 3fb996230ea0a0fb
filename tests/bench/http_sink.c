/*
 * http_sink.c — `make bench-http`'s floor for an upload: the least a server can do
 * with a request body, so that attnd's receive time has a number to be measured
 * against on the same machine, in the same run.
 *
 *   bench-http-sink PORT [MAX_BODY_MB]     (PORT 0: the kernel picks one)
 *
 * It prints "listening on 127.0.0.1:PORT" and serves one connection at a time,
 * forever: reads the head, then recv()s the body straight into one buffer that was
 * allocated and touched before the first request (so no page fault or allocation is
 * timed, and each byte is copied once, kernel to user), until Content-Length bytes
 * after the head have arrived; then it answers `200` with `Connection: close` and
 * closes. It parses nothing else and looks at no byte of the body: no HTTP server
 * that reads the body can be faster on this socket. SIGTERM ends it.
 */
#define _GNU_SOURCE /* memmem */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

static const char REPLY[] = "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n";

/* The value of the Content-Length header in head[0, len), or -1. */
static long long content_length(const char *head, size_t len) {
  static const char name[] = "\r\ncontent-length:";
  for (size_t i = 0; i + sizeof name - 1 <= len; i++)
    if (strncasecmp(head + i, name, sizeof name - 1) == 0)
      return strtoll(head + i + sizeof name - 1, NULL, 10);
  return -1;
}

/* Reads one request on fd into buf[0, cap) and answers it; 0 on success. */
static int serve(int fd, char *buf, size_t cap) {
  size_t got = 0, head_len = 0;
  long long body = -1;
  for (;;) {
    if (got == cap)
      return -1; /* larger than MAX_BODY_MB: drop it */
    ssize_t n = recv(fd, buf + got, cap - got, 0);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return -1;
    got += (size_t)n;
    if (!head_len) {
      char *end = memmem(buf, got, "\r\n\r\n", 4);
      if (!end)
        continue;
      head_len = (size_t)(end - buf) + 4;
      body = content_length(buf, head_len);
      if (body < 0)
        body = 0;
      if ((unsigned long long)body > cap - head_len)
        return -1;
    }
    if (got >= head_len + (size_t)body)
      break;
  }
  size_t off = 0;
  while (off < sizeof REPLY - 1) {
    ssize_t n = send(fd, REPLY + off, sizeof REPLY - 1 - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return -1;
    off += (size_t)n;
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 2 || argc > 3) {
    fprintf(stderr, "usage: bench-http-sink PORT [MAX_BODY_MB]\n");
    return 2;
  }
  int port = atoi(argv[1]);
  size_t cap = (size_t)(argc == 3 ? atol(argv[2]) : 512) << 20;
  cap += 1 << 16; /* the head */
  char *buf = malloc(cap);
  if (!buf) {
    fprintf(stderr, "bench-http-sink: cannot allocate %zu bytes\n", cap);
    return 1;
  }
  memset(buf, 0, cap); /* touch every page now, not while a request is timed */

  int ls = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_port = htons((uint16_t)port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t alen = sizeof a;
  if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof a) < 0 || listen(ls, 16) < 0 ||
      getsockname(ls, (struct sockaddr *)&a, &alen) < 0) {
    fprintf(stderr, "bench-http-sink: cannot listen on 127.0.0.1:%d: %s\n", port, strerror(errno));
    return 1;
  }
  printf("listening on 127.0.0.1:%d\n", ntohs(a.sin_port));
  fflush(stdout);
  for (;;) {
    int fd = accept(ls, NULL, NULL);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED)
        continue;
      fprintf(stderr, "bench-http-sink: accept: %s\n", strerror(errno));
      return 1;
    }
    serve(fd, buf, cap);
    close(fd);
  }
}
