/*
 * http_send.c — `make bench-http`'s upload client: times one large POST from first
 * byte to last reply byte, the same way for attnd and for its baselines (a plain
 * socket sink, nginx), so that their times can be divided.
 *
 *   bench-http-send PORT PATH FILE CONTENT_TYPE RUNS
 *
 * FILE is mapped with MAP_POPULATE before the first run, so reading it costs the
 * sender nothing while it is timed. Each run opens a fresh connection to
 * 127.0.0.1:PORT, writes the head (Content-Length, `Connection: close`, no
 * `Expect: 100-continue`: no round trip before the body), the whole body, then reads
 * the whole reply (Content-Length bytes after its head, or until the server closes).
 * A run's wall time spans connect() to the reply's last byte. When the reply carries
 * `Server-Timing: ... compute;dur=MS` (attnd's decode + engine + encode), that is
 * reported too and subtracted: net = wall − compute, the part of the time that is
 * HTTP. Prints one line per run, then
 *
 *   RESULT runs=R wall_s=W compute_ms=C net_s=N       (medians over the runs)
 *
 * and exits 1 when a reply's status is not 200 (with its status line).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAX_RUNS 100

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int send_all(int fd, const char *p, size_t n) {
  while (n) {
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      return -1;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

/* A header's value in head (NUL-terminated), or NULL. */
static const char *header(const char *head, const char *name) {
  size_t n = strlen(name);
  for (const char *p = strstr(head, "\r\n"); p; p = strstr(p + 2, "\r\n"))
    if (strncasecmp(p + 2, name, n) == 0 && p[2 + n] == ':')
      return p + 3 + n;
  return NULL;
}

typedef struct run {
  double wall_s, compute_ms;
  int status;
  char status_line[128];
} run;

/* One POST of body[0, len); 0 when a whole reply came back. */
static int post(int port, const char *path, const char *type, const char *body, size_t len,
                run *r) {
  static char reply[1 << 20];
  char head[512];
  int hn = snprintf(head, sizeof head,
                    "POST %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: %s\r\n"
                    "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                    path, port, type, len);
  memset(r, 0, sizeof *r);
  double t0 = now_s();
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_port = htons((uint16_t)port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  int one = 1;
  if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
    fprintf(stderr, "bench-http-send: cannot connect to 127.0.0.1:%d: %s\n", port, strerror(errno));
    return -1;
  }
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  /* A server that refuses the body early (413) closes while we write: its reply
   * is still read below. */
  if (send_all(fd, head, (size_t)hn) == 0)
    send_all(fd, body, len);
  size_t got = 0, head_len = 0;
  long long want = -1;
  for (;;) {
    ssize_t n = recv(fd, reply + got, sizeof reply - 1 - got, 0);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      break;
    got += (size_t)n;
    reply[got] = 0;
    if (!head_len) {
      char *end = strstr(reply, "\r\n\r\n");
      if (!end)
        continue;
      head_len = (size_t)(end - reply) + 4;
      *end = 0; /* the head is a string from here on */
      const char *cl = header(reply, "Content-Length");
      want = cl ? strtoll(cl, NULL, 10) : -1;
      const char *st = header(reply, "Server-Timing");
      const char *c = st ? strstr(st, "compute;dur=") : NULL;
      if (c)
        r->compute_ms = strtod(c + strlen("compute;dur="), NULL);
      sscanf(reply, "HTTP/%*s %d", &r->status);
      snprintf(r->status_line, sizeof r->status_line, "%.*s", (int)strcspn(reply, "\r"), reply);
    }
    if (want >= 0 && got >= head_len + (size_t)want)
      break;
    if (got == sizeof reply - 1) /* a large reply body: keep only its head */
      got = head_len;
  }
  r->wall_s = now_s() - t0;
  close(fd);
  if (!head_len) {
    fprintf(stderr, "bench-http-send: no reply from 127.0.0.1:%d%s\n", port, path);
    return -1;
  }
  return 0;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int main(int argc, char **argv) {
  if (argc != 6) {
    fprintf(stderr, "usage: bench-http-send PORT PATH FILE CONTENT_TYPE RUNS\n");
    return 2;
  }
  int port = atoi(argv[1]), runs = atoi(argv[5]);
  const char *path = argv[2], *file = argv[3], *type = argv[4];
  if (runs < 1 || runs > MAX_RUNS) {
    fprintf(stderr, "bench-http-send: RUNS must be 1 to %d\n", MAX_RUNS);
    return 2;
  }
  int fd = open(file, O_RDONLY);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) < 0 || st.st_size == 0) {
    fprintf(stderr, "bench-http-send: cannot read %s: %s\n", file,
            fd < 0 ? strerror(errno) : "empty");
    return 1;
  }
  size_t len = (size_t)st.st_size;
  const char *body = mmap(NULL, len, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
  if (body == MAP_FAILED) {
    fprintf(stderr, "bench-http-send: cannot map %s: %s\n", file, strerror(errno));
    return 1;
  }
  close(fd);

  double wall[MAX_RUNS], compute[MAX_RUNS], net[MAX_RUNS];
  for (int i = 0; i < runs; i++) {
    run r;
    if (post(port, path, type, body, len, &r) < 0)
      return 1;
    if (r.status != 200) {
      fprintf(stderr, "bench-http-send: 127.0.0.1:%d%s answered \"%s\", not 200\n", port, path,
              r.status_line);
      return 1;
    }
    printf("run %d: %d in %.4f s, compute %.2f ms\n", i + 1, r.status, r.wall_s, r.compute_ms);
    wall[i] = r.wall_s;
    compute[i] = r.compute_ms;
    net[i] = r.wall_s - r.compute_ms * 1e-3;
  }
  printf("RESULT runs=%d wall_s=%.4f compute_ms=%.2f net_s=%.4f\n", runs, median(wall, runs),
         median(compute, runs), median(net, runs));
  return 0;
}
